-- The claims of SqliteStore's claim mode, beside its seen-set table.
-- SqliteStore::migrate_claims() runs this file, after migrate(). With a table name
-- other than the default, replace every `babelqueue_idempotency` below by
-- that name. Times are Unix milliseconds, by the database clock.
CREATE TABLE IF NOT EXISTS babelqueue_idempotency_claims (
    message_id TEXT PRIMARY KEY NOT NULL,
    owner TEXT NOT NULL,          -- the owner's token, 32 hex digits
    fence INTEGER NOT NULL,       -- the claim's fencing token
    lease_until INTEGER NOT NULL  -- when the lease ends, Unix ms
) WITHOUT ROWID;

-- One counter for the whole store: it outlives every claim row, so the
-- fences of one id strictly grow even after its rows are gone.
CREATE TABLE IF NOT EXISTS babelqueue_idempotency_claims_fence (
    counter INTEGER PRIMARY KEY CHECK (counter = 1),
    last INTEGER NOT NULL
);
INSERT OR IGNORE INTO babelqueue_idempotency_claims_fence (counter, last) VALUES (1, 0);

-- Every fence a claim row takes becomes the counter's last value.
CREATE TRIGGER IF NOT EXISTS babelqueue_idempotency_claims_fence_on_insert
    AFTER INSERT ON babelqueue_idempotency_claims
BEGIN
    UPDATE babelqueue_idempotency_claims_fence SET last = NEW.fence WHERE counter = 1;
END;
CREATE TRIGGER IF NOT EXISTS babelqueue_idempotency_claims_fence_on_update
    AFTER UPDATE OF fence ON babelqueue_idempotency_claims
BEGIN
    UPDATE babelqueue_idempotency_claims_fence SET last = NEW.fence WHERE counter = 1;
END;

-- Marking an id done (commit, or remember in seen-set mode) drops its claim
-- row in the same statement: a done id is never claimed again, and commit
-- is then one write, not a write and a clean-up.
CREATE TRIGGER IF NOT EXISTS babelqueue_idempotency_claims_done_on_insert
    AFTER INSERT ON babelqueue_idempotency
BEGIN
    DELETE FROM babelqueue_idempotency_claims WHERE message_id = NEW.message_id;
END;
CREATE TRIGGER IF NOT EXISTS babelqueue_idempotency_claims_done_on_update
    AFTER UPDATE ON babelqueue_idempotency
BEGIN
    DELETE FROM babelqueue_idempotency_claims WHERE message_id = NEW.message_id;
END;
