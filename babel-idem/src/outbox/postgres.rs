//! [`PostgresOutbox`]: the outbox table in a PostgreSQL database (feature
//! `postgres`). Every statement it runs is on this page.

use std::time::Duration;

use sqlx::postgres::{PgListener, PgPool};
use sqlx::{PgConnection, Postgres, Transaction};

use super::{
    Backoff, DEFAULT_TABLE, OutboxError, OutboxStats, TakenRows, checked_table, database,
    headers_json, read_row, truncated,
};
use crate::envelope::Envelope;
use crate::store::AsConnection;
use crate::telemetry::carrier;

/// The DDL, shipped as `postgres.sql` for users who run their own migrations.
const DDL: &str = include_str!("postgres.sql");

/// Now, as the table writes times: UTC, without a time zone (the family's
/// `TIMESTAMP`).
const NOW: &str = "(now() AT TIME ZONE 'UTC')";

/// An outbox in a PostgreSQL database: `save` writes a message inside the
/// caller's transaction; a `Relay` publishes it once that commits.
///
/// The table (`postgres.sql`, which [`migrate`](PostgresOutbox::migrate) runs):
///
/// ```sql
#[doc = include_str!("postgres.sql")]
/// ```
///
/// The statements, with `t` for the table:
///
/// | operation | statement |
/// |---|---|
/// | `save` | `WITH saved AS (INSERT INTO t (queue, body, headers, created_at) VALUES ($1, $2, $3, now) RETURNING id) SELECT id, pg_notify('t', '')::text FROM saved` |
/// | the relay takes, in its transaction | `SELECT id, queue, body, attempts, headers FROM t WHERE status = 'pending' AND (failed_at IS NULL OR failed_at <= now - backoff) ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED` |
/// | the relay marks the batch, same transaction (`$1` ids, `$2` their errors, `NULL` for the rows the broker accepted, `$4` whether the relay could not read the row) | `UPDATE t AS o SET status = CASE WHEN r.error IS NULL THEN 'published' WHEN r.unreadable OR o.attempts + 1 >= $3 THEN 'failed' ELSE o.status END, published_at = CASE WHEN r.error IS NULL THEN now ELSE o.published_at END, attempts = o.attempts + CASE WHEN r.error IS NULL THEN 0 ELSE 1 END, last_error = COALESCE(r.error, o.last_error), failed_at = CASE WHEN r.error IS NULL THEN o.failed_at ELSE now END FROM unnest($1::int8[], $2::text[], $4::bool[]) AS r(id, error, unreadable) WHERE o.id = r.id`, then `COMMIT` |
/// | `retry_failed` | `UPDATE t SET status = 'pending', attempts = 0, failed_at = NULL WHERE status = 'failed'` |
/// | `purge_published` | `DELETE FROM t WHERE id IN (SELECT id FROM t WHERE status = 'published' AND published_at < now - age ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED)`, batch after batch |
///
/// A row whose `headers` are not a JSON object of strings (or, in a table
/// of another DDL, whose queue or body is `NULL`) cannot be published as it
/// stands: the relay sets it `'failed'` with the reason as `last_error`,
/// and the rows around it go on.
///
/// The relay's transaction commits with `synchronous_commit = off`: a mark
/// a server crash loses publishes its row again, which at-least-once
/// delivery allows, and the relay never waits for the disk.
///
/// The relay holds the rows it took locked until it marked them, so
/// several relays drain one outbox at once, each row taken by one relay at
/// a time; a relay that dies releases its rows (still pending) with its
/// connection. A relay takes its next batch, in a second transaction,
/// while the previous batch's mark commits: the rows still locked are
/// skipped, and a row whose mark committed meanwhile is no longer pending. `save`'s `NOTIFY` on the channel named like the table is
/// delivered when the transaction commits, and wakes the relays that
/// `LISTEN` there; rows other producers insert are found by the poll.
///
/// ```no_run
/// use babel_idem::Envelope;
/// use babel_idem::outbox::PostgresOutbox;
/// use serde_json::json;
///
/// # async fn run() -> Result<(), anyhow::Error> {
/// let pool = sqlx::PgPool::connect("postgres://postgres:postgres@127.0.0.1/app").await?;
/// let outbox = PostgresOutbox::new(pool.clone());
/// outbox.migrate().await?;
///
/// let mut tx = pool.begin().await?;
/// // ... the business write on `tx` ...
/// let env = Envelope::new("urn:babel:orders:created", json!({"order_id": 7})).with_queue("orders");
/// outbox.save(&mut tx, &env).await?;
/// tx.commit().await?; // the order and its message, together
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct PostgresOutbox {
    pool: PgPool,
    table: String,
    headers: bool,
}

impl std::fmt::Debug for PostgresOutbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresOutbox")
            .field("table", &self.table)
            .field("headers", &self.headers)
            .finish_non_exhaustive()
    }
}

impl PostgresOutbox {
    /// The outbox table `babelqueue_outbox` on `pool`.
    pub fn new(pool: PgPool) -> Self {
        PostgresOutbox {
            pool,
            table: DEFAULT_TABLE.to_owned(),
            headers: true,
        }
    }

    /// Another table name; a plain identifier of at most 48 characters.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// let pool = sqlx::PgPool::connect_lazy("postgres://localhost/app").unwrap();
    /// let outbox = babel_idem::outbox::PostgresOutbox::new(pool);
    /// assert!(outbox.clone().with_table("orders_outbox").is_ok());
    /// assert!(outbox.with_table("orders-outbox").is_err());
    /// # });
    /// ```
    pub fn with_table(mut self, table: &str) -> Result<Self, OutboxError> {
        self.table = checked_table(table)?;
        Ok(self)
    }

    /// For a table made with the family's DDL alone: `save` writes no
    /// `headers` column (the producer's `traceparent` is not kept).
    pub fn without_headers(mut self) -> Self {
        self.headers = false;
        self
    }

    /// The pool the outbox runs on.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The table the outbox uses.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// Creates the table and its index if they are missing (`postgres.sql`
    /// for this outbox's table), and nothing else. Safe when a fleet runs
    /// it at once: it runs in a transaction that first takes an advisory
    /// lock named after the table, so migrations run one after another.
    pub async fn migrate(&self) -> Result<(), OutboxError> {
        let ddl = DDL.replace(DEFAULT_TABLE, &self.table);
        let lock = format!("babel-idem migrate outbox {}", self.table);
        self.run_ddl(&lock, &ddl).await
    }

    /// Runs `ddl` in a transaction holding the advisory lock named `lock`.
    async fn run_ddl(&self, lock: &str, ddl: &str) -> Result<(), OutboxError> {
        let mut tx = self.pool.begin().await.map_err(database("migrate"))?;
        sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
            .bind(lock)
            .execute(&mut *tx)
            .await
            .map_err(database("migrate"))?;
        sqlx::Executor::execute(&mut *tx, ddl)
            .await
            .map_err(database("migrate"))?;
        tx.commit().await.map_err(database("migrate"))
    }

    /// Writes `envelope` to the outbox on `connection`, inside whatever
    /// transaction is open there, so it commits or rolls back with the
    /// caller's other writes; returns the row's id. The row's queue is
    /// `meta.queue`, else `default`; its body the envelope's encoding
    /// ([`Envelope::encode_for_publish`]), which the relay publishes byte
    /// for byte; its `headers` the W3C `traceparent` of the current span
    /// (feature `opentelemetry`). The same statement notifies the relays,
    /// which PostgreSQL delivers at commit. An envelope that does not
    /// encode is refused before anything is written.
    pub async fn save<C>(&self, connection: &mut C, envelope: &Envelope) -> Result<i64, OutboxError>
    where
        C: AsConnection<PgConnection> + ?Sized,
    {
        let body = envelope.encode_for_publish()?;
        let body = String::from_utf8_lossy(&body);
        let queue = envelope.destination();
        let t = &self.table;
        let connection = connection.as_connection();
        if self.headers {
            let headers = headers_json(&carrier::trace_headers(&tracing::Span::current()));
            let insert = format!(
                "WITH saved AS (
                     INSERT INTO {t} (queue, body, headers, created_at)
                     VALUES ($1, $2, $3::jsonb, {NOW}) RETURNING id)
                 SELECT id, pg_notify('{t}', '')::text FROM saved"
            );
            sqlx::query_scalar::<_, i64>(&insert)
                .bind(queue)
                .bind(&*body)
                .bind(headers)
                .fetch_one(&mut *connection)
                .await
        } else {
            let insert = format!(
                "WITH saved AS (
                     INSERT INTO {t} (queue, body, created_at)
                     VALUES ($1, $2, {NOW}) RETURNING id)
                 SELECT id, pg_notify('{t}', '')::text FROM saved"
            );
            sqlx::query_scalar::<_, i64>(&insert)
                .bind(queue)
                .bind(&*body)
                .fetch_one(&mut *connection)
                .await
        }
        .map_err(|error| self.missing_or(error, "save"))
    }

    /// How many rows each status holds, and the age of the oldest pending row.
    pub async fn stats(&self) -> Result<OutboxStats, OutboxError> {
        let t = &self.table;
        let query = format!(
            "SELECT
                 (SELECT count(*) FROM {t} WHERE status = 'pending'),
                 (SELECT count(*) FROM {t} WHERE status = 'published'),
                 (SELECT count(*) FROM {t} WHERE status = 'failed'),
                 (SELECT EXTRACT(EPOCH FROM {NOW} - created_at)::float8
                    FROM {t} WHERE status = 'pending' ORDER BY id LIMIT 1)"
        );
        let (pending, published, failed, age): (i64, i64, i64, Option<f64>) =
            sqlx::query_as(&query)
                .fetch_one(&self.pool)
                .await
                .map_err(|error| self.missing_or(error, "stats"))?;
        Ok(OutboxStats {
            pending: pending as u64,
            published: published as u64,
            failed: failed as u64,
            oldest_pending_age: age.map(|age| Duration::from_secs_f64(age.max(0.0))),
        })
    }

    /// Makes every `'failed'` row pending again, with its attempts back to
    /// 0 (its `last_error` stays); how many. With `dry_run`, only counts them.
    pub async fn retry_failed(&self, dry_run: bool) -> Result<u64, OutboxError> {
        let t = &self.table;
        let result = if dry_run {
            let count = format!("SELECT count(*) FROM {t} WHERE status = 'failed'");
            sqlx::query_scalar::<_, i64>(&count)
                .fetch_one(&self.pool)
                .await
                .map(|n| n as u64)
        } else {
            let retry = format!(
                "UPDATE {t} SET status = 'pending', attempts = 0, failed_at = NULL
                 WHERE status = 'failed'"
            );
            sqlx::query(&retry)
                .execute(&self.pool)
                .await
                .map(|done| done.rows_affected())
        };
        result.map_err(|error| self.missing_or(error, "retry-failed"))
    }

    /// Deletes the rows published longer than `older_than` ago, `batch`
    /// rows per statement (each its own short transaction, skipping rows
    /// another transaction holds), until none is left; how many. Pending
    /// and failed rows are never touched. With `dry_run`, only counts them.
    pub async fn purge_published(
        &self,
        older_than: Duration,
        batch: u32,
        dry_run: bool,
    ) -> Result<u64, OutboxError> {
        let t = &self.table;
        let old =
            format!("status = 'published' AND published_at < {NOW} - make_interval(secs => $1)");
        let seconds = older_than.as_secs_f64();
        if dry_run {
            let count = format!("SELECT count(*) FROM {t} WHERE {old}");
            return sqlx::query_scalar::<_, i64>(&count)
                .bind(seconds)
                .fetch_one(&self.pool)
                .await
                .map(|n| n as u64)
                .map_err(|error| self.missing_or(error, "purge-published"));
        }
        let delete = format!(
            "DELETE FROM {t} WHERE id IN (
                 SELECT id FROM {t} WHERE {old} ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED)"
        );
        let batch = batch.max(1);
        let mut deleted = 0;
        loop {
            let done = sqlx::query(&delete)
                .bind(seconds)
                .bind(i64::from(batch))
                .execute(&self.pool)
                .await
                .map_err(|error| self.missing_or(error, "purge-published"))?
                .rows_affected();
            deleted += done;
            if done < u64::from(batch) {
                return Ok(deleted);
            }
        }
    }

    /// `error`, or [`OutboxError::MissingTable`] when it says the table is missing.
    fn missing_or(&self, error: sqlx::Error, operation: &'static str) -> OutboxError {
        let missing = error
            .as_database_error()
            .and_then(|error| error.code())
            .is_some_and(|code| code == "42P01");
        if missing {
            OutboxError::MissingTable {
                table: self.table.clone(),
            }
        } else {
            database(operation)(error)
        }
    }
}

/// What the relay does on a PostgreSQL outbox.
#[cfg_attr(
    not(any(feature = "redis-transport", feature = "amqp-transport")),
    allow(dead_code, reason = "only the relay takes rows")
)]
impl PostgresOutbox {
    /// Whether the table exists and has the `headers` column.
    pub(super) async fn probe(&self) -> Result<bool, OutboxError> {
        let columns: Vec<String> = sqlx::query_scalar(
            "SELECT column_name::text FROM information_schema.columns
             WHERE table_schema = current_schema() AND table_name = $1",
        )
        .bind(&self.table)
        .fetch_all(&self.pool)
        .await
        .map_err(database("open"))?;
        if columns.is_empty() {
            return Err(OutboxError::MissingTable {
                table: self.table.clone(),
            });
        }
        Ok(columns.iter().any(|column| column == "headers"))
    }

    /// A listener on the channel `save` notifies.
    pub(super) async fn listen(&self) -> Result<PgListener, OutboxError> {
        let mut listener = PgListener::connect_with(&self.pool)
            .await
            .map_err(database("listen"))?;
        listener
            .listen(&self.table)
            .await
            .map_err(database("listen"))?;
        Ok(listener)
    }

    /// Begins the relay's transaction and takes up to `limit` pending rows
    /// past their backoff, oldest first, locked against the other relays.
    pub(super) async fn take(
        &self,
        limit: u32,
        backoff: Backoff,
        with_headers: bool,
    ) -> Result<(Transaction<'static, Postgres>, TakenRows), OutboxError> {
        let headers = if with_headers {
            "headers::text"
        } else {
            "NULL::text"
        };
        let take = format!(
            "SELECT id, queue::text, body, attempts::int8, {headers} FROM {t}
             WHERE status = 'pending'
               AND (failed_at IS NULL
                    OR failed_at <= {NOW} - make_interval(secs => LEAST(attempts * $2, $3)))
             ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED",
            t = self.table
        );
        // The transaction only marks rows: a mark lost to a server crash
        // publishes its row again (at least once, as always), so its commit
        // need not wait for the disk.
        let mut tx = self
            .pool
            .begin_with("BEGIN; SET LOCAL synchronous_commit = off")
            .await
            .map_err(database("take"))?;
        type Columns = (i64, Option<String>, Option<String>, i64, Option<String>);
        let rows: Vec<Columns> = sqlx::query_as(&take)
            .bind(i64::from(limit))
            .bind(backoff.step.as_secs_f64())
            .bind(backoff.cap.as_secs_f64())
            .fetch_all(&mut *tx)
            .await
            .map_err(|error| self.missing_or(error, "take"))?;
        let rows = rows
            .into_iter()
            .map(|(id, queue, body, attempts, headers)| {
                read_row(
                    id,
                    queue.map(String::into_bytes),
                    body.map(String::into_bytes),
                    attempts,
                    headers.map(String::into_bytes),
                )
            })
            .collect();
        Ok((tx, rows))
    }

    /// Records the relay's outcome in the transaction that took the rows,
    /// and commits it: `published` rows marked published, each of
    /// `refused` with its attempt, error and failure time (and `'failed'`
    /// once it reached `max_attempts`), each of `unreadable` likewise and
    /// `'failed'` at once.
    pub(super) async fn finish(
        &self,
        mut tx: Transaction<'static, Postgres>,
        published: &[i64],
        refused: &[(i64, String)],
        unreadable: &[(i64, String)],
        max_attempts: u32,
    ) -> Result<(), OutboxError> {
        let t = &self.table;
        // One statement for the whole batch: each id with no error is
        // published; each id with its error spends an attempt, and one the
        // relay could not read is failed at once (trying it again cannot
        // help).
        let failures = refused.len() + unreadable.len();
        let mut ids = Vec::with_capacity(published.len() + failures);
        let mut errors: Vec<Option<String>> = Vec::with_capacity(ids.capacity());
        let mut unreadables: Vec<bool> = Vec::with_capacity(ids.capacity());
        ids.extend_from_slice(published);
        errors.resize(published.len(), None);
        unreadables.resize(published.len(), false);
        let failed = refused
            .iter()
            .map(|failure| (failure, false))
            .chain(unreadable.iter().map(|failure| (failure, true)));
        for ((id, error), unreadable) in failed {
            ids.push(*id);
            errors.push(Some(truncated(error)));
            unreadables.push(unreadable);
        }
        if !ids.is_empty() {
            let mark = format!(
                "UPDATE {t} AS o SET
                     status = CASE WHEN r.error IS NULL THEN 'published'
                                   WHEN r.unreadable OR o.attempts + 1 >= $3 THEN 'failed'
                                   ELSE o.status END,
                     published_at = CASE WHEN r.error IS NULL THEN {NOW} ELSE o.published_at END,
                     attempts = o.attempts + CASE WHEN r.error IS NULL THEN 0 ELSE 1 END,
                     last_error = COALESCE(r.error, o.last_error),
                     failed_at = CASE WHEN r.error IS NULL THEN o.failed_at ELSE {NOW} END
                 FROM unnest($1::int8[], $2::text[], $4::bool[]) AS r(id, error, unreadable)
                 WHERE o.id = r.id"
            );
            sqlx::query(&mark)
                .bind(&ids)
                .bind(&errors)
                .bind(i64::from(max_attempts))
                .bind(&unreadables)
                .execute(&mut *tx)
                .await
                .map_err(database("mark"))?;
        }
        tx.commit().await.map_err(database("mark"))
    }
}
