-- RedisStore renew, PHP SDK layout: extend a claim ('1'). Unfenced: it may
-- extend a claim another worker took after this one's lapsed.
-- KEYS[1] the id's key; ARGV[1] lease in ms. Returns 1 renewed, 0 not claimed.
if redis.call('GET', KEYS[1]) == '1' then
  return redis.call('PEXPIRE', KEYS[1], ARGV[1])
end
return 0
