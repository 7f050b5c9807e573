-- RedisStore renew: extend the claim only if this owner still holds it.
-- KEYS[1] claim; ARGV[1] owner hex, ARGV[2] lease in ms.
-- Returns 1 renewed, 0 lost.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
return redis.call('PEXPIRE', KEYS[1], ARGV[2])
