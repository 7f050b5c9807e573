-- RedisStore claim, PHP SDK layout: one key <prefix><id>, '1' claimed (with
-- a TTL), '2' done. No owner is recorded: the PHP SDK has none.
-- KEYS[1] the id's key; ARGV[1] lease in ms
-- Returns claim.lua's integers: -1 done, 0 won (unfenced), -2 held with no
-- expiry, -3 - ms left held.
local state = redis.call('GET', KEYS[1])
if state == '2' then
  return -1
end
if state then
  local left = redis.call('PTTL', KEYS[1])
  if left < 0 then
    return -2
  end
  return -3 - left
end
redis.call('SET', KEYS[1], '1', 'PX', ARGV[1])
return 0
