-- Sweep, then reserve up to #ARGV - 1 deliveries (BabelQueue Redis binding, legacy layout).
-- KEYS[1] ready list, KEYS[2] <queue>:processing, KEYS[3] <queue>:processing:deadlines.
-- ARGV[1] how long a reservation lasts, whole seconds, or '+inf' (it never lapses);
-- ARGV[2..] one 32-hex token per delivery.
-- First the lapsed reservations go back to the end of the ready list (the sweep), so a worker
-- killed with deliveries in flight loses none. Then each delivery moves from the head of the
-- ready list to the tail of :processing, and its deadline member "<token>:<raw>" goes into the
-- deadline set. Returns the raw values reserved.
-- The deadline is the server's clock (TIME) rounded up to the whole second, plus ARGV[1]: the
-- sweep reads the same clock, so a worker whose own clock runs ahead cannot take another's
-- reservation back early, and a reservation lasts at least ARGV[1] seconds. Scores stay whole
-- Unix seconds, the unit the Python SDK writes and sweeps.
-- Types: the sweep's read has checked the deadline set, and LMOVE checks both lists before it
-- pops, so a ZADD never fails after its LMOVE (which would leave a value in :processing that no
-- sweep ever returns).
local now = redis.call('TIME')
local swept = sweep(now[1], -1)
if failed(swept) then
    return swept
end
local deadline = deadline_at(now, ARGV[1])
local reserved = {}
for i = 2, #ARGV do
    local raw = redis.pcall('LMOVE', KEYS[1], KEYS[2], 'LEFT', 'RIGHT')
    if failed(raw) then
        return refusal(raw, {{KEYS[1], 'list'}, {KEYS[2], 'list'}})
    end
    if not raw then
        break
    end
    redis.call('ZADD', KEYS[3], deadline, ARGV[i] .. ':' .. raw)
    reserved[#reserved + 1] = raw
end
return reserved
