-- RedisStore commit and remember, PHP SDK layout: mark the id done ('2'),
-- over a claim ('1') or nothing, unless it already is done (which keeps its
-- first expiry). Without an owner token a lapsed claim cannot be told from
-- a live one; only an id already done shows another worker committed first.
-- KEYS[1] the id's key; ARGV[1] the store's TTL in ms ("0": none, as PHP)
-- Returns 1 marked, 0 already done.
if redis.call('GET', KEYS[1]) == '2' then
  return 0
end
if ARGV[1] == '0' then
  redis.call('SET', KEYS[1], '2')
else
  redis.call('SET', KEYS[1], '2', 'PX', ARGV[1])
end
return 1
