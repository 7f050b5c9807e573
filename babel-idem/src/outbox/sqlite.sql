-- The outbox table of SqliteOutbox: the BabelQueue family's
-- `babelqueue_outbox` (the Go, Python and PHP SDKs' relays drain it), with
-- times as UTC text `YYYY-MM-DD HH:MM:SS.SSS`, plus two additions the
-- family's relays ignore: the nullable `headers` column (a JSON object of
-- transport headers, the producer's W3C `traceparent`) and the status
-- 'failed'. SqliteOutbox::migrate() runs exactly this file; run it yourself
-- if your migrations are managed elsewhere. With a table name other than
-- the default, replace every `babelqueue_outbox` below by that name.
CREATE TABLE IF NOT EXISTS babelqueue_outbox (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    queue        TEXT    NOT NULL,
    -- The encoded envelope, verbatim: the relay publishes these bytes.
    body         TEXT    NOT NULL,
    -- 'pending' | 'published' | 'failed'
    status       TEXT    NOT NULL DEFAULT 'pending',
    attempts     INTEGER NOT NULL DEFAULT 0,
    last_error   TEXT,
    created_at   TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),
    published_at TEXT,
    failed_at    TEXT,
    headers      TEXT
);

-- The relay's query: pending rows, oldest first.
CREATE INDEX IF NOT EXISTS babelqueue_outbox_pending_idx
    ON babelqueue_outbox (status, id);
