-- Keep one reservation alive (BabelQueue Redis binding, Laravel-compatible layout).
-- KEYS[1] queues:<q>:reserved. ARGV[1] the reserved member, ARGV[2] how long it lasts from now
-- (whole seconds).
-- Moves the member's score as keys.lua's `extend` does: a reservation a migration took back
-- stays taken back. Returns 1, or 0 when the reservation had lapsed.
return extend(KEYS[1], ARGV[1], ARGV[2])
