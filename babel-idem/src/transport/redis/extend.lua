-- Keep one reservation alive (BabelQueue Redis binding, legacy layout).
-- KEYS[1] <queue>:processing:deadlines. ARGV[1] the reservation's token, ARGV[2] its raw value,
-- ARGV[3] how long it lasts from now (whole seconds).
-- Moves the reservation's deadline member to the server's now, rounded up, plus ARGV[3]; never
-- earlier than it was. Gated on the member: a reservation the sweep took back stays taken back.
-- Returns 1, or 0 when the reservation had lapsed.
local member = ARGV[1] .. ':' .. ARGV[2]
local score = redis.call('ZSCORE', KEYS[1], member)
if not score then
    return 0
end
local time = redis.call('TIME')
local now = tonumber(time[1])
if tonumber(time[2]) > 0 then
    now = now + 1
end
local deadline = now + tonumber(ARGV[3])
if deadline > tonumber(score) then
    redis.call('ZADD', KEYS[1], 'XX', deadline, member)
end
return 1
