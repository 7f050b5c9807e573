-- Prepended, after keys.lua, to the scripts of the Laravel-compatible layout (BabelQueue Redis
-- binding, the Python SDK's laravel_compat=True): queues:<q> ready list, :reserved and :delayed
-- sorted sets, :notify wake-up list. Every script of the layout checks its keys' types
-- (keys.lua's refused_types) before it writes anything: a key of the wrong type changes nothing.

-- Laravel's migrateExpiredJobs: the members of the sorted set `from` whose score is at most `now`
-- (whole seconds), at most `limit` of them (-1: all), move to the END of the ready list, byte for
-- byte, each with one wake-up token on `notify`. Returns how many moved. The keys' types are
-- checked by the caller.
local function migrate(from, ready, notify, now, limit)
    local due = redis.call('ZRANGEBYSCORE', from, '-inf', now, 'LIMIT', 0, limit)
    if #due == 0 then
        return 0
    end
    redis.call('ZREMRANGEBYRANK', from, 0, #due - 1)
    for i = 1, #due, 100 do
        local last = math.min(i + 99, #due)
        redis.call('RPUSH', ready, unpack(due, i, last))
        for _ = i, last do
            redis.call('RPUSH', notify, 1)
        end
    end
    return #due
end
