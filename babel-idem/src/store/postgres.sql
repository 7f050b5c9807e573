-- The seen-set table of PostgresStore, the same as the Go SDK's.
-- PostgresStore::migrate() runs exactly this file; run it yourself if your
-- migrations are managed elsewhere. With a table name other than the default,
-- replace every `babelqueue_idempotency` below by that name.
CREATE TABLE IF NOT EXISTS babelqueue_idempotency (
    message_id TEXT PRIMARY KEY,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- NULL: remembered until forgotten. Otherwise the id is seen while
    -- expires_at > now(), by the database clock.
    expires_at TIMESTAMPTZ NULL
);

CREATE INDEX IF NOT EXISTS babelqueue_idempotency_expires_at_idx
    ON babelqueue_idempotency (expires_at);
