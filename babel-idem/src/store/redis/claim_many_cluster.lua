-- RedisStore claim_many on a Redis Cluster: claim_cluster.lua for each
-- entry of one slot's share of a batch, in order, in one atomic script.
-- KEYS[1] the slot's fence counter; per entry i, KEYS[2i] its done marker
-- and KEYS[2i+1] its claim: all in one slot.
-- ARGV[1] lease in ms; ARGV[i+1] entry i's owner hex
-- Returns one integer per entry, as claim_cluster.lua.
local replies = {}
local floor = nil
for i = 1, #ARGV - 1 do
  local done, claim = KEYS[2 * i], KEYS[2 * i + 1]
  if redis.call('EXISTS', done) == 1 then
    replies[i] = -1
  elseif redis.call('SET', claim, ARGV[i + 1], 'NX', 'PX', ARGV[1]) then
    local fence = redis.call('INCR', KEYS[1])
    if floor == nil then
      local now = redis.call('TIME')
      floor = tonumber(now[1]) * 1000000 + tonumber(now[2])
    end
    if fence < floor then
      fence = floor
      redis.call('SET', KEYS[1], string.format('%.0f', floor))
    end
    replies[i] = fence
  else
    replies[i] = held(claim)
  end
end
return replies
