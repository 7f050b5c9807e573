-- Prepended to every script of the layout (BabelQueue Redis binding, legacy layout).
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

-- The error reply for a pcall that failed on `keys` (each {key, expected type}): the first key
-- of the wrong type by name, else the server's own error.
local function refusal(reply, keys)
    for _, key in ipairs(keys) do
        local refused = wrong_type(key[1], key[2])
        if refused then
            return redis.error_reply(refused)
        end
    end
    return reply
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
