-- RedisStore claim on a Redis Cluster: claim.lua, with the fence counter of
-- the id's own slot, floored at the server's clock in microseconds.
-- KEYS[1] done marker <prefix><id>, KEYS[2] claim <claim prefix>{...},
-- KEYS[3] the slot's fence counter <fence>{<slot tag>}: all in one slot.
-- ARGV[1] owner hex, ARGV[2] lease in ms
-- Returns claim.lua's integers: -1 done, a fence (>= 1) won, -2 held with
-- no expiry, -3 - ms left held.
if redis.call('EXISTS', KEYS[1]) == 1 then
  return -1
end
if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then
  -- The counter only grows, so the fences of one id (one slot) do. A
  -- promoted replica that missed the last increments starts again from
  -- its clock, which is past every fence the lost master gave, as long as
  -- the two clocks differ by less than the failover took.
  local fence = redis.call('INCR', KEYS[3])
  local now = redis.call('TIME')
  local floor = tonumber(now[1]) * 1000000 + tonumber(now[2])
  if fence < floor then
    fence = floor
    redis.call('SET', KEYS[3], string.format('%.0f', floor))
  end
  return fence
end
return held(KEYS[2])
