-- RedisStore claim_many: claim.lua for each entry of a batch, in order, in
-- one atomic script (one call's fixed cost for the whole batch).
-- KEYS[1] the store's fence counter; per entry i, KEYS[2i] its done marker
-- <prefix><id> and KEYS[2i+1] its claim
-- ARGV[1] lease in ms; ARGV[i+1] entry i's owner hex
-- Returns one integer per entry, as claim.lua: -1 done, a fence (>= 1) won,
-- -2 held with no expiry, -3 - ms left held.
local replies = {}
for i = 1, #ARGV - 1 do
  local done, claim = KEYS[2 * i], KEYS[2 * i + 1]
  if redis.call('EXISTS', done) == 1 then
    replies[i] = -1
  elseif redis.call('SET', claim, ARGV[i + 1], 'NX', 'PX', ARGV[1]) then
    replies[i] = redis.call('INCR', KEYS[1])
  else
    replies[i] = held(claim)
  end
end
return replies
