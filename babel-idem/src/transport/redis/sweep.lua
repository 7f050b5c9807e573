-- Return lapsed reservations to the queue (BabelQueue Redis binding, legacy layout).
-- KEYS[1] ready list, KEYS[2] <queue>:processing, KEYS[3] <queue>:processing:deadlines.
-- ARGV[1] how many members at most (-1: all).
-- A reservation lapses once the server's clock (TIME, whole seconds) reaches its deadline: the
-- clock the reserve script wrote it by, whatever the calling worker's own clock says.
-- A lapsed member "<token>:<raw>" whose raw value is still in :processing moves that value,
-- unchanged, to the END of the ready list (a recovery is not an attempt). Every lapsed member
-- leaves the deadline set, also a malformed one (no ':' after 32 bytes) or an orphan.
-- The keys' types are checked first: a ready list of another type would otherwise fail the
-- RPUSH after the LREM had taken the value out of :processing.
local refused = wrong_type(KEYS[1], 'list') or wrong_type(KEYS[2], 'list')
    or wrong_type(KEYS[3], 'zset')
if refused then
    return redis.error_reply(refused)
end
local now = redis.call('TIME')[1]
local lapsed = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0, ARGV[1])
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
