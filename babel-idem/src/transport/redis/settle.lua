-- Settle one reservation (BabelQueue Redis binding, legacy layout): ack, requeue or dead-letter.
-- KEYS[1] <queue>:processing, KEYS[2] <queue>:processing:deadlines, KEYS[3] (optional) the list
-- that receives ARGV[3]. ARGV[1] the reservation's token, ARGV[2] its raw value.
-- Gated on the reservation's own deadline member: once the sweep has taken the reservation back,
-- a late settle touches nothing, not even an identical copy reserved since. Returns 1 or 0.
-- A settle that cannot finish changes nothing: the keys' types are checked first (an error
-- reply), and the value reaches its destination before it leaves the reservation, so a failed
-- step leaves the reservation as it was, for a retry or the sweep.
local refused = wrong_type(KEYS[1], 'list') or wrong_type(KEYS[2], 'zset')
    or (KEYS[3] and wrong_type(KEYS[3], 'list'))
if refused then
    return redis.error_reply(refused)
end
local member = ARGV[1] .. ':' .. ARGV[2]
if not redis.call('ZSCORE', KEYS[2], member) then
    return 0
end
if KEYS[3] then
    redis.call('RPUSH', KEYS[3], ARGV[3])
end
redis.call('ZREM', KEYS[2], member)
redis.call('LREM', KEYS[1], 1, ARGV[2])
return 1
