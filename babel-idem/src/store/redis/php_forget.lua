-- RedisStore forget of many ids, PHP SDK layout: delete each key that holds
-- '2' (done); a key holding anything else is a claim, left to its holder.
-- KEYS the ids' keys. Returns how many keys were deleted.
local removed = 0
for _, key in ipairs(KEYS) do
  if redis.call('GET', key) == '2' then
    removed = removed + redis.call('DEL', key)
  end
end
return removed
