-- RedisStore claim: done, won with a fence, or held (one atomic script).
-- KEYS[1] done marker <prefix><id>, KEYS[2] claim, KEYS[3] the store's fence counter
-- ARGV[1] "<owner hex>:", ARGV[2] lease in ms
-- Returns {0} done, {1, fence} won, {2, ms left (-1: no expiry)} held.
if redis.call('EXISTS', KEYS[1]) == 1 then
  return {0}
end
local left = redis.call('PTTL', KEYS[2])
if left ~= -2 then
  return {2, left}
end
-- The counter outlives every claim record, so fences never repeat for an id.
local fence = redis.call('INCR', KEYS[3])
redis.call('SET', KEYS[2], ARGV[1] .. fence, 'PX', ARGV[2])
return {1, fence}
