-- The claims of PostgresStore's claim mode, beside its seen-set table.
-- PostgresStore::migrate_claims() runs this file (migrate() runs postgres.sql). With a table
-- name other than the default, replace every `babelqueue_idempotency` below
-- by that name (the claims table is `<table>_claims`).
--
-- A Go consumer reads only babelqueue_idempotency, so a claim never looks
-- done to it; commit writes the done row there.
--
-- Logged, like the seen-set table: a claim survives a server crash and a
-- failover, so the id stays held until its lease lapses. The price is a WAL
-- flush per claim (a first delivery flushes twice: claim, commit). Where
-- losing every live claim at a crash or failover is acceptable (fenced
-- writes stay safe; an unfenced effect of a handler still running may then
-- happen twice), skip that flush with
--     ALTER TABLE babelqueue_idempotency_claims SET UNLOGGED;
-- The fence sequence stays logged, so fences keep growing either way.
CREATE TABLE IF NOT EXISTS babelqueue_idempotency_claims (
    message_id TEXT PRIMARY KEY,
    -- The owner's token, 32 hex digits. NULL once committed: the row is then
    -- a tombstone that keeps a claim racing the commit from winning.
    owner TEXT NULL,
    -- The claim's fencing token, from the sequence below.
    fence BIGINT NOT NULL,
    -- While owned: when the lease ends. Once committed: when it was.
    lease_until TIMESTAMPTZ NOT NULL
);

-- One counter for the whole store: it outlives every claim row, so the
-- fences of one id strictly grow even after its rows are gone.
CREATE SEQUENCE IF NOT EXISTS babelqueue_idempotency_claims_fence AS BIGINT;
