-- Settle one reservation (BabelQueue Redis binding, legacy layout): ack, requeue or dead-letter.
-- KEYS[1] <queue>:processing, KEYS[2] <queue>:processing:deadlines, KEYS[3] (optional) the list
-- that receives ARGV[3]. ARGV[1] the reservation's token, ARGV[2] its raw value.
-- Gated on the reservation's own deadline member: once the sweep has taken the reservation back,
-- a late settle touches nothing, not even an identical copy reserved since. Returns 1 or 0.
-- A settle that cannot finish changes nothing: the gate's read checks the deadline set's type,
-- and the value reaches its destination before it leaves the reservation, so a failed step
-- leaves the reservation as it was, for a retry or the sweep.
local member = ARGV[1] .. ':' .. ARGV[2]
local score = redis.pcall('ZSCORE', KEYS[2], member)
if failed(score) then
    return refusal(score, {{KEYS[2], 'zset'}})
end
if not score then
    return 0
end
if KEYS[3] then
    -- RPUSH then LREM: the two lists are checked before either is written.
    local refused = wrong_type(KEYS[1], 'list') or wrong_type(KEYS[3], 'list')
    if refused then
        return redis.error_reply(refused)
    end
    redis.call('RPUSH', KEYS[3], ARGV[3])
    redis.call('LREM', KEYS[1], 1, ARGV[2])
else
    -- An ack's only list write is this LREM, which checks the list's type before it removes.
    local removed = redis.pcall('LREM', KEYS[1], 1, ARGV[2])
    if failed(removed) then
        return refusal(removed, {{KEYS[1], 'list'}})
    end
end
redis.call('ZREM', KEYS[2], member)
return 1
