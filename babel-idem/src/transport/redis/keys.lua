-- Prepended to every script of the layout (BabelQueue Redis binding, legacy layout).
-- Redis does not undo a script's earlier writes when a later command fails, so each script
-- checks its keys' types before it writes anything: a key of another type (a list's key holding
-- a string, say) fails the script with an error reply and nothing changed, never half-way.

-- An error message when `key` exists with a type other than `expected`, else nil.
local function wrong_type(key, expected)
    local kind = redis.call('TYPE', key)['ok']
    if kind == 'none' or kind == expected then
        return nil
    end
    return 'WRONGTYPE ' .. key .. ' holds a ' .. kind .. ', not a ' .. expected
        .. '; nothing was changed'
end
