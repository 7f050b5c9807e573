-- Return lapsed reservations to the queue (BabelQueue Redis binding, legacy layout).
-- KEYS[1] ready list, KEYS[2] <queue>:processing, KEYS[3] <queue>:processing:deadlines.
-- ARGV[1] how many members at most (-1: all).
-- A reservation lapses once the server's clock (TIME, whole seconds) reaches its deadline: the
-- clock the reserve script wrote it by, whatever the calling worker's own clock says.
return sweep(redis.call('TIME')[1], ARGV[1])
