-- RedisStore release, PHP SDK layout: the PHP SDK's compare-and-delete of a
-- claim ('1'), which never deletes a done id ('2'). Unfenced: it may drop a
-- claim another worker took after this one's lapsed.
-- KEYS[1] the id's key. Returns 1 released, 0 not claimed.
if redis.call('GET', KEYS[1]) == '1' then
  return redis.call('DEL', KEYS[1])
end
return 0
