-- Keep one reservation alive (BabelQueue Redis binding, legacy layout).
-- KEYS[1] <queue>:processing:deadlines. ARGV[1] the reservation's token, ARGV[2] its raw value,
-- ARGV[3] how long it lasts from now (whole seconds).
-- Moves the reservation's deadline member "<token>:<raw>" as keys.lua's `extend` does.
-- Returns 1, or 0 when the reservation had lapsed.
return extend(KEYS[1], ARGV[1] .. ':' .. ARGV[2], ARGV[3])
