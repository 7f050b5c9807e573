-- RedisStore commit: while the owner holds the claim, write the Go SDK's
-- done marker and drop the claim (one atomic script).
-- KEYS[1] done marker <prefix><id>, KEYS[2] claim
-- ARGV[1] owner hex, ARGV[2] the store's TTL in ms ("0": none)
-- Returns 1 committed or already done, 0 the claim was lost.
if redis.call('GET', KEYS[2]) ~= ARGV[1] then
  -- A commit retried after its first attempt took effect (the reply was
  -- lost, or its WAIT failed) finds the id done: the effect is recorded.
  return redis.call('EXISTS', KEYS[1])
end
-- NX: like `remember`, an existing marker keeps its first expiry.
if ARGV[2] == '0' then
  redis.call('SET', KEYS[1], '1', 'NX')
else
  redis.call('SET', KEYS[1], '1', 'NX', 'PX', ARGV[2])
end
redis.call('DEL', KEYS[2])
return 1
