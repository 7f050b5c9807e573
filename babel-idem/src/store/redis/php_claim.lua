-- RedisStore claim, PHP SDK layout: one key <prefix><id>, '1' claimed (with
-- a TTL), '2' done. No owner is recorded: the PHP SDK has none.
-- KEYS[1] the id's key; ARGV[1] lease in ms
-- Returns {0} done, {1, 0} won (unfenced), {2, ms left (-1: no expiry)} held.
local state = redis.call('GET', KEYS[1])
if state == '2' then
  return {0}
end
if state then
  return {2, redis.call('PTTL', KEYS[1])}
end
redis.call('SET', KEYS[1], '1', 'PX', ARGV[1])
return {1, 0}
