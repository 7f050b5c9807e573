-- Publish one job (BabelQueue Redis binding, Laravel-compatible layout): Laravel's push.
-- KEYS[1] queues:<q>, KEYS[2] queues:<q>:notify. ARGV[1] the job.
-- RPUSH the job to the ready list and one wake-up token to :notify; both keys' types are checked
-- first, so a refused push writes nothing.
local refused = refused_types({{KEYS[1], 'list'}, {KEYS[2], 'list'}})
if refused then
    return refused
end
redis.call('RPUSH', KEYS[1], ARGV[1])
redis.call('RPUSH', KEYS[2], 1)
return 1
