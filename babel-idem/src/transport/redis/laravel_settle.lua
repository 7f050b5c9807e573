-- Settle one reservation (BabelQueue Redis binding, Laravel-compatible layout).
-- KEYS[1] queues:<q>:reserved. ARGV[1] the reserved member.
-- Ack: no other key. ZREM the member.
-- Release (a retry, or a delivery handed back unchanged): KEYS[2] queues:<q>:delayed, ARGV[2]
-- the body. ZREM the member, ZADD the body to :delayed due at the server's whole seconds now
-- (Laravel's release with no delay: the next migration returns it to the ready list).
-- Dead-letter: KEYS[2] the dead-letter queue's ready list, KEYS[3] its :notify list, ARGV[2] the
-- record. ZREM the member, RPUSH the record and one wake-up token.
-- Gated on the member: once a migration has taken the reservation back, a late settle touches
-- nothing and returns 0; else 1. Every key's type is checked before anything is written.
local refused
if #KEYS == 1 then
    refused = refused_types({{KEYS[1], 'zset'}})
elseif #KEYS == 2 then
    refused = refused_types({{KEYS[1], 'zset'}, {KEYS[2], 'zset'}})
else
    refused = refused_types({{KEYS[1], 'zset'}, {KEYS[2], 'list'}, {KEYS[3], 'list'}})
end
if refused then
    return refused
end
if redis.call('ZREM', KEYS[1], ARGV[1]) == 0 then
    return 0
end
if #KEYS == 2 then
    redis.call('ZADD', KEYS[2], redis.call('TIME')[1], ARGV[2])
elseif #KEYS == 3 then
    redis.call('RPUSH', KEYS[2], ARGV[2])
    redis.call('RPUSH', KEYS[3], 1)
end
return 1
