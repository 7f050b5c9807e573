-- Prepended to the claim scripts (claim.lua, claim_many.lua and their
-- cluster forms): the answer for a claim that another owner holds,
-- -2 held with no expiry, -3 - ms left held.
local function held(claim)
  local left = redis.call('PTTL', claim)
  if left < 0 then
    return -2
  end
  return -3 - left
end
