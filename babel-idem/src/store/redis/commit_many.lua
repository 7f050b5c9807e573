-- RedisStore commit_many: commit.lua for each entry of a batch, in order, in
-- one atomic script.
-- Per entry i, KEYS[2i-1] its done marker <prefix><id> and KEYS[2i] its claim
-- ARGV[1] the store's TTL in ms ("0": none); ARGV[i+1] entry i's owner hex
-- Returns one integer per entry: 1 committed or already done, 0 the claim
-- was lost.
local replies = {}
for i = 1, #ARGV - 1 do
  local done, claim = KEYS[2 * i - 1], KEYS[2 * i]
  if redis.call('GET', claim) ~= ARGV[i + 1] then
    -- A retried commit finds the id done: its effect is recorded.
    replies[i] = redis.call('EXISTS', done)
  else
    -- NX: like `remember`, an existing marker keeps its first expiry.
    if ARGV[1] == '0' then
      redis.call('SET', done, '1', 'NX')
    else
      redis.call('SET', done, '1', 'NX', 'PX', ARGV[1])
    end
    redis.call('DEL', claim)
    replies[i] = 1
  end
end
return replies
