-- Settle one reservation (BabelQueue Redis binding, legacy layout): ack, requeue or dead-letter.
-- KEYS[1] <queue>:processing, KEYS[2] <queue>:processing:deadlines, KEYS[3] (optional) the list
-- that receives ARGV[3]. ARGV[1] the reservation's token, ARGV[2] its raw value.
-- Gated on the reservation's own deadline member: once the sweep has taken the reservation back,
-- a late settle touches nothing, not even an identical copy reserved since. Returns 1 or 0.
if redis.call('ZREM', KEYS[2], ARGV[1] .. ':' .. ARGV[2]) == 0 then
    return 0
end
redis.call('LREM', KEYS[1], 1, ARGV[2])
if KEYS[3] then
    redis.call('RPUSH', KEYS[3], ARGV[3])
end
return 1
