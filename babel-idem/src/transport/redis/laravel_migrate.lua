-- Return due delayed jobs and lapsed reservations to the queue (BabelQueue Redis binding,
-- Laravel-compatible layout).
-- KEYS[1] queues:<q>, KEYS[2] queues:<q>:reserved, KEYS[3] queues:<q>:delayed,
-- KEYS[4] queues:<q>:notify. ARGV[1] '+inf' when reservations never lapse (only :delayed
-- migrates), anything else otherwise; ARGV[2] how many members one migration moves at most (-1:
-- all). By the server's clock (TIME, whole seconds). Returns how many jobs moved.
local refused = refused_types({{KEYS[1], 'list'}, {KEYS[2], 'zset'}, {KEYS[3], 'zset'},
    {KEYS[4], 'list'}})
if refused then
    return refused
end
local now = redis.call('TIME')[1]
local moved = migrate(KEYS[3], KEYS[1], KEYS[4], now, ARGV[2])
if ARGV[1] ~= '+inf' then
    moved = moved + migrate(KEYS[2], KEYS[1], KEYS[4], now, ARGV[2])
end
return moved
