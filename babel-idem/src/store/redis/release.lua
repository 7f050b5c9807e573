-- RedisStore release: drop the claim only if this owner holds it.
-- KEYS[1] claim; ARGV[1] owner hex. Returns 1 released, 0 not ours.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
return redis.call('DEL', KEYS[1])
