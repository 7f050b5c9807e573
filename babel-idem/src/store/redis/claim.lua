-- RedisStore claim: done, won with a fence, or held (one atomic script).
-- KEYS[1] done marker <prefix><id>, KEYS[2] claim, KEYS[3] the store's fence counter
-- ARGV[1] owner hex, ARGV[2] lease in ms
-- Returns one integer (a table costs the server more to build and send):
-- -1 done, a fence (>= 1) won, -2 held with no expiry, -3 - ms left held.
-- Each redis.call costs about as much as a plain command, so every outcome
-- makes at most three.
if redis.call('EXISTS', KEYS[1]) == 1 then
  return -1
end
if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then
  -- The counter outlives every claim record, so fences never repeat for an id.
  return redis.call('INCR', KEYS[3])
end
return held(KEYS[2])
