-- Migrate, then reserve up to ARGV[3] jobs (BabelQueue Redis binding, Laravel-compatible layout).
-- KEYS[1] queues:<q>, KEYS[2] queues:<q>:reserved, KEYS[3] queues:<q>:delayed,
-- KEYS[4] queues:<q>:notify. ARGV[1] how long a reservation lasts, whole seconds, or '+inf' (it
-- never lapses, and lapsed reservations are not migrated); ARGV[2] how many members one
-- migration moves at most (-1: all); ARGV[3] how many jobs at most.
-- First the due :delayed members, then (unless ARGV[1] is '+inf') the lapsed :reserved members
-- go back to the end of the ready list, as the Python SDK does before each pop. Then Laravel's
-- pop, once a job: LPOP the job; its reserved member is the job with `attempts` advanced by one,
-- re-encoded by cjson, or, for a job that does not decode, is not an object, has no numeric
-- `attempts` or does not encode again, the job itself (the Python SDK's pcall guard: never
-- popped and lost); ZADD the member to :reserved at the deadline; LPOP one wake-up token.
-- Returns {job, member, job, member, ...}: a member equal to its job marks a job the pop could
-- not decode.
-- The deadline is the server's clock (TIME) rounded up to the whole second, plus ARGV[1], and
-- the migration reads the same clock: a worker whose clock runs ahead cannot take another's
-- reservation back early.
local refused = refused_types({{KEYS[1], 'list'}, {KEYS[2], 'zset'}, {KEYS[3], 'zset'},
    {KEYS[4], 'list'}})
if refused then
    return refused
end
local now = redis.call('TIME')
migrate(KEYS[3], KEYS[1], KEYS[4], now[1], ARGV[2])
if ARGV[1] ~= '+inf' then
    migrate(KEYS[2], KEYS[1], KEYS[4], now[1], ARGV[2])
end
local deadline = deadline_at(now, ARGV[1])
local reserved = {}
for _ = 1, tonumber(ARGV[3]) do
    local job = redis.call('LPOP', KEYS[1])
    if not job then
        break
    end
    local member = job
    local ok, decoded = pcall(cjson.decode, job)
    if ok and type(decoded) == 'table' and type(decoded['attempts']) == 'number' then
        decoded['attempts'] = decoded['attempts'] + 1
        local encoded_ok, encoded = pcall(cjson.encode, decoded)
        if encoded_ok then
            member = encoded
        end
    end
    redis.call('ZADD', KEYS[2], deadline, member)
    redis.call('LPOP', KEYS[4])
    reserved[#reserved + 1] = job
    reserved[#reserved + 1] = member
end
return reserved
