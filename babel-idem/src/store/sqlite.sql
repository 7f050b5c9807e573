-- The seen-set table of SqliteStore: the PostgreSQL table's shape, with
-- times as Unix milliseconds by the database clock.
-- SqliteStore::migrate() (and opening a file or an in-memory database) runs
-- exactly this file; run it yourself if your migrations are managed
-- elsewhere. With a table name other than the default, replace every
-- `babelqueue_idempotency` below by that name.
CREATE TABLE IF NOT EXISTS babelqueue_idempotency (
    message_id TEXT PRIMARY KEY NOT NULL,
    created_at INTEGER NOT NULL,
    -- NULL: remembered until forgotten. Otherwise the id is seen while
    -- expires_at is later than now.
    expires_at INTEGER NULL
) WITHOUT ROWID;

CREATE INDEX IF NOT EXISTS babelqueue_idempotency_expires_at_idx
    ON babelqueue_idempotency (expires_at);
