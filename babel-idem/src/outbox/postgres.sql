-- The outbox table of PostgresOutbox: the BabelQueue family's
-- `babelqueue_outbox` (the Go, Python and PHP SDKs' relays drain it), times
-- as UTC `TIMESTAMP`, plus two additions the family's relays ignore: the
-- nullable `headers` column (a JSON object of transport headers, the
-- producer's W3C `traceparent`) and the status 'failed'.
-- PostgresOutbox::migrate() runs exactly this file; run it yourself if your
-- migrations are managed elsewhere. With a table name other than the
-- default, replace every `babelqueue_outbox` below by that name.
CREATE TABLE IF NOT EXISTS babelqueue_outbox (
    id           BIGSERIAL    PRIMARY KEY,
    queue        VARCHAR(255) NOT NULL,
    -- The encoded envelope, verbatim: the relay publishes these bytes.
    body         TEXT         NOT NULL,
    -- 'pending' | 'published' | 'failed'
    status       VARCHAR(16)  NOT NULL DEFAULT 'pending',
    attempts     INTEGER      NOT NULL DEFAULT 0,
    last_error   VARCHAR(500),
    created_at   TIMESTAMP    NOT NULL DEFAULT (now() AT TIME ZONE 'UTC'),
    published_at TIMESTAMP,
    failed_at    TIMESTAMP,
    headers      JSONB
);

-- The relay's query: pending rows, oldest first.
CREATE INDEX IF NOT EXISTS babelqueue_outbox_pending_idx
    ON babelqueue_outbox (status, id);
