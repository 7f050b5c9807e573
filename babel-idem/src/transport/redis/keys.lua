-- Prepended to every script of both layouts (BabelQueue Redis binding): the legacy layout's
-- scripts, and the Laravel-compatible layout's behind it and laravel_keys.lua.
-- Redis does not undo a script's earlier writes when a later command fails, so no script writes
-- before every key it writes has shown its type: a key of another type (a list's key holding a
-- string, say) fails the script with an error reply that names the key, and nothing changed,
-- never half-way. Where a command the script needs anyway checks a key's type before it
-- writes (a read of the key, LMOVE's check of both lists before it pops), that command is the
-- check, run with pcall so the error can name the key; elsewhere wrong_type asks TYPE first.

-- An error message when `key` exists with a type other than `expected`, else nil.
local function wrong_type(key, expected)
    local kind = redis.call('TYPE', key)['ok']
    if kind == 'none' or kind == expected then
        return nil
    end
    return 'WRONGTYPE ' .. key .. ' holds a ' .. kind .. ', not a ' .. expected
        .. '; nothing was changed'
end

-- Whether a redis.pcall reply is an error.
local function failed(reply)
    return type(reply) == 'table' and reply['err'] ~= nil
end

-- An error reply naming the first of `keys` (each {key, expected type}) of another type, or nil.
local function refused_types(keys)
    for _, key in ipairs(keys) do
        local refused = wrong_type(key[1], key[2])
        if refused then
            return redis.error_reply(refused)
        end
    end
    return nil
end

-- The error reply for a pcall that failed on `keys` (each {key, expected type}): the first key
-- of the wrong type by name, else the server's own error.
local function refusal(reply, keys)
    return refused_types(keys) or reply
end

-- The server's clock `time` (TIME's reply) in whole seconds, rounded up.
local function seconds_up(time)
    local seconds = tonumber(time[1])
    if tonumber(time[2]) > 0 then
        seconds = seconds + 1
    end
    return seconds
end

-- The deadline score of a reservation made at the server's clock `time` that lasts `lifetime`
-- whole seconds ('+inf': it never lapses): `time` rounded up to the whole second plus
-- `lifetime`, so it lasts at least that long by the clock the sweep reads.
local function deadline_at(time, lifetime)
    if lifetime == '+inf' then
        return '+inf'
    end
    return string.format('%.17g', seconds_up(time) + tonumber(lifetime))
end

-- Keeps one reservation alive: moves the score of `member` in the deadline set `key` to the
-- server's now, rounded up, plus `seconds`; never earlier than it was. Gated on the member: a
-- reservation the sweep took back stays taken back. Returns 1, 0 when the member is gone, or
-- an error reply (nothing changed).
local function extend(key, member, seconds)
    local score = redis.pcall('ZSCORE', key, member)
    if failed(score) then
        return refusal(score, {{key, 'zset'}})
    end
    if not score then
        return 0
    end
    local deadline = seconds_up(redis.call('TIME')) + tonumber(seconds)
    if deadline > tonumber(score) then
        redis.call('ZADD', key, 'XX', deadline, member)
    end
    return 1
end

-- Returns the reservations of the queue KEYS[1] (processing list KEYS[2], deadline set KEYS[3])
-- whose deadline lapsed by the server's clock `now` (whole seconds) to the END of KEYS[1],
-- unchanged, at most `limit` of them (-1: all): a recovery is not an attempt. Every lapsed member
-- "<token>:<raw>" leaves the deadline set, also a malformed one (no ':' after 32 bytes) or an
-- orphan. Returns how many values moved, or an error reply (nothing changed).
local function sweep(now, limit)
    -- The read checks the deadline set's type.
    local lapsed = redis.pcall('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0, limit)
    if failed(lapsed) then
        return refusal(lapsed, {{KEYS[3], 'zset'}})
    end
    if #lapsed == 0 then
        return 0
    end
    -- The lists are written below in an order (LREM, then RPUSH) that a late type error would
    -- leave half-way: both are checked first.
    local refused = wrong_type(KEYS[1], 'list') or wrong_type(KEYS[2], 'list')
    if refused then
        return redis.error_reply(refused)
    end
    local moved = 0
    for _, member in ipairs(lapsed) do
        if #member >= 34 and string.byte(member, 33) == 58 then
            local raw = string.sub(member, 34)
            if redis.call('LREM', KEYS[2], 1, raw) == 1 then
                redis.call('RPUSH', KEYS[1], raw)
                moved = moved + 1
            end
        end
        redis.call('ZREM', KEYS[3], member)
    end
    return moved
end
