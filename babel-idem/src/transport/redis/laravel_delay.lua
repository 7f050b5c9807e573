-- Publish one job for later (BabelQueue Redis binding, Laravel-compatible layout): the Python
-- SDK's publish_delayed. KEYS[1] queues:<q>:delayed. ARGV[1] the job, ARGV[2] the delay in whole
-- seconds. ZADD the job to :delayed scored the server's whole seconds now plus ARGV[2] (no wake-up
-- token: the migration before a pop moves it to the ready list once due). Returns the score.
local refused = refused_types({{KEYS[1], 'zset'}})
if refused then
    return refused
end
local due = tonumber(redis.call('TIME')[1]) + tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], string.format('%.17g', due), ARGV[1])
return due
