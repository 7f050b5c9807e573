-- Redrive one dead-letter record (BabelQueue Redis binding, both layouts).
-- KEYS[1] the dead-letter list, KEYS[2] the list that receives the redriven value. In the
-- Laravel-compatible layout also KEYS[3], KEYS[2]'s :notify list, which receives one wake-up
-- token, and KEYS[4], KEYS[1]'s :notify list, which gives one up (as a pop of the record would).
-- ARGV[1] the record as stored in the dead-letter list, ARGV[2] the value to append to KEYS[2].
-- One step: the value reaches KEYS[2] and the record leaves KEYS[1] together, or neither happens.
-- The record is found before anything is written, and appended before it is removed, so a
-- failure part way (a key of the wrong type, a refused write) never loses it. Returns 1, or 0
-- when the record is no longer in KEYS[1] (another tool took it): nothing was written.
local refused = wrong_type(KEYS[1], 'list') or wrong_type(KEYS[2], 'list')
    or (KEYS[3] and (wrong_type(KEYS[3], 'list') or wrong_type(KEYS[4], 'list')))
if refused then
    return redis.error_reply(refused)
end
if not redis.call('LPOS', KEYS[1], ARGV[1]) then
    return 0
end
redis.call('RPUSH', KEYS[2], ARGV[2])
redis.call('LREM', KEYS[1], 1, ARGV[1])
if KEYS[3] then
    redis.call('RPUSH', KEYS[3], 1)
    redis.call('LPOP', KEYS[4])
end
return 1
