-- Return lapsed reservations to the queue (BabelQueue Redis binding, legacy layout).
-- KEYS[1] ready list, KEYS[2] <queue>:processing, KEYS[3] <queue>:processing:deadlines.
-- ARGV[1] now (whole seconds), ARGV[2] how many members at most (-1: all).
-- A lapsed member "<token>:<raw>" whose raw value is still in :processing moves that value,
-- unchanged, to the END of the ready list (a recovery is not an attempt). Every lapsed member
-- leaves the deadline set, also a malformed one (no ':' after 32 bytes) or an orphan.
local lapsed = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])
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
