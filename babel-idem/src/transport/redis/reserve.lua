-- Reserve up to #ARGV - 1 deliveries (BabelQueue Redis binding, legacy layout).
-- KEYS[1] ready list, KEYS[2] <queue>:processing, KEYS[3] <queue>:processing:deadlines.
-- ARGV[1] the deadline score (whole seconds, or +inf); ARGV[2..] one 32-hex token per delivery.
-- Each delivery moves from the head of the ready list to the tail of :processing, and its
-- deadline member "<token>:<raw>" goes into the deadline set. Returns the raw values reserved.
local reserved = {}
for i = 2, #ARGV do
    local raw = redis.call('LMOVE', KEYS[1], KEYS[2], 'LEFT', 'RIGHT')
    if not raw then
        break
    end
    redis.call('ZADD', KEYS[3], ARGV[1], ARGV[i] .. ':' .. raw)
    reserved[#reserved + 1] = raw
end
return reserved
