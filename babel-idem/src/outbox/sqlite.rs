//! [`SqliteOutbox`]: the outbox table in a SQLite database (feature
//! `sqlite`). Every statement it runs is on this page.

use std::sync::Arc;
use std::time::Duration;

use sqlx::SqliteConnection;
use sqlx::sqlite::SqlitePool;
use tokio::sync::Notify;

use super::{
    Backoff, DEFAULT_TABLE, OutboxError, OutboxStats, PendingRow, checked_table, database,
    headers_from_json, headers_json, truncated,
};
use crate::envelope::Envelope;
use crate::router::span;
use crate::store::AsConnection;

/// The DDL, shipped as `sqlite.sql` for users who run their own migrations.
const DDL: &str = include_str!("sqlite.sql");

/// Now, as the table writes times: UTC text with milliseconds, which sorts
/// with the family's `YYYY-MM-DD HH:MM:SS`.
const NOW: &str = "strftime('%Y-%m-%d %H:%M:%f', 'now')";

/// An outbox in a SQLite database: `save` writes a message inside the
/// caller's transaction; a `Relay` publishes it once that commits.
///
/// The table (`sqlite.sql`, which [`migrate`](SqliteOutbox::migrate) runs):
///
/// ```sql
#[doc = include_str!("sqlite.sql")]
/// ```
///
/// The statements, with `t` for the table:
///
/// | operation | statement |
/// |---|---|
/// | `save` | `INSERT INTO t (queue, body, headers, created_at) VALUES (?1, ?2, ?3, now) RETURNING id` |
/// | the relay takes | `SELECT id, queue, body, attempts, headers FROM t WHERE status = 'pending' AND (failed_at IS NULL OR failed_at <= now - backoff) AND id NOT IN (SELECT value FROM json_each(?4)) ORDER BY id LIMIT ?1`, `?4` the previous batch's ids, whose mark may still be committing |
/// | the broker accepted | `UPDATE t SET status = 'published', published_at = now WHERE id IN (SELECT value FROM json_each(?1)) AND status = 'pending'`, alone, or with the refusals in one `BEGIN IMMEDIATE` transaction |
/// | the broker refused | `UPDATE t SET attempts = attempts + 1, last_error = ?2, failed_at = now, status = CASE WHEN attempts + 1 >= ?3 THEN 'failed' ELSE status END WHERE id = ?1` |
/// | `retry_failed` | `UPDATE t SET status = 'pending', attempts = 0, failed_at = NULL WHERE status = 'failed'` |
/// | `purge_published` | `DELETE FROM t WHERE id IN (SELECT id FROM t WHERE status = 'published' AND published_at < now - age ORDER BY id LIMIT ?2)`, batch after batch |
///
/// SQLite has one writer at a time, so a single relay drains a SQLite
/// outbox (a second one would publish the same rows). A `save` in this
/// process wakes the relay built on a clone of this outbox once the
/// transaction had time to commit; other writers are found by the poll.
///
/// ```
/// use babel_idem::Envelope;
/// use babel_idem::outbox::SqliteOutbox;
/// use serde_json::json;
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let pool = sqlx::sqlite::SqlitePoolOptions::new().max_connections(1).connect("sqlite::memory:").await?;
/// let outbox = SqliteOutbox::new(pool.clone());
/// outbox.migrate().await?;
///
/// let mut tx = pool.begin().await?;
/// // ... the business write on `tx` ...
/// let env = Envelope::new("urn:babel:orders:created", json!({"order_id": 7})).with_queue("orders");
/// outbox.save(&mut tx, &env).await?;
/// tx.commit().await?; // the order and its message, together
///
/// assert_eq!(outbox.stats().await?.pending, 1);
/// # Ok::<(), anyhow::Error>(())
/// # }).unwrap();
/// ```
#[derive(Clone)]
pub struct SqliteOutbox {
    pool: SqlitePool,
    table: String,
    headers: bool,
    wake: Arc<Notify>,
}

impl std::fmt::Debug for SqliteOutbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteOutbox")
            .field("table", &self.table)
            .field("headers", &self.headers)
            .finish_non_exhaustive()
    }
}

impl SqliteOutbox {
    /// The outbox table `babelqueue_outbox` on `pool`.
    pub fn new(pool: SqlitePool) -> Self {
        SqliteOutbox {
            pool,
            table: DEFAULT_TABLE.to_owned(),
            headers: true,
            wake: Arc::new(Notify::new()),
        }
    }

    /// Another table name; a plain identifier of at most 48 characters.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// let pool = sqlx::sqlite::SqlitePoolOptions::new().connect_lazy("sqlite::memory:").unwrap();
    /// let outbox = babel_idem::outbox::SqliteOutbox::new(pool);
    /// assert!(outbox.clone().with_table("orders_outbox").is_ok());
    /// assert!(outbox.with_table("no spaces").is_err());
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
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// The table the outbox uses.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// Creates the table and its index if they are missing (`sqlite.sql`
    /// for this outbox's table), and nothing else. Safe when many processes
    /// run it at once: it runs in a `BEGIN IMMEDIATE` transaction, so each
    /// waits for the write lock and then finds the table made or makes it.
    pub async fn migrate(&self) -> Result<(), OutboxError> {
        let ddl = DDL.replace(DEFAULT_TABLE, &self.table);
        self.run_ddl(&ddl).await
    }

    /// Runs `ddl` under the write lock: `BEGIN IMMEDIATE` takes it before
    /// the first statement, so concurrent migrations run one after another.
    async fn run_ddl(&self, ddl: &str) -> Result<(), OutboxError> {
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
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
    /// (feature `opentelemetry`). An envelope that does not encode is
    /// refused before anything is written.
    pub async fn save<C>(&self, connection: &mut C, envelope: &Envelope) -> Result<i64, OutboxError>
    where
        C: AsConnection<SqliteConnection> + ?Sized,
    {
        let body = envelope.encode_for_publish()?;
        let body = String::from_utf8_lossy(&body);
        let queue = envelope.destination();
        let connection = connection.as_connection();
        let id = if self.headers {
            let headers = headers_json(&span::trace_headers(&tracing::Span::current()));
            let insert = format!(
                "INSERT INTO {} (queue, body, headers, created_at) VALUES (?1, ?2, ?3, {NOW}) RETURNING id",
                self.table
            );
            sqlx::query_scalar::<_, i64>(&insert)
                .bind(queue)
                .bind(&*body)
                .bind(headers)
                .fetch_one(&mut *connection)
                .await
        } else {
            let insert = format!(
                "INSERT INTO {} (queue, body, created_at) VALUES (?1, ?2, {NOW}) RETURNING id",
                self.table
            );
            sqlx::query_scalar::<_, i64>(&insert)
                .bind(queue)
                .bind(&*body)
                .fetch_one(&mut *connection)
                .await
        }
        .map_err(|error| self.missing_or(error, "save"))?;
        self.wake.notify_one();
        Ok(id)
    }

    /// How many rows each status holds, and the age of the oldest pending row.
    pub async fn stats(&self) -> Result<OutboxStats, OutboxError> {
        let t = &self.table;
        let query = format!(
            "SELECT
                 (SELECT count(*) FROM {t} WHERE status = 'pending'),
                 (SELECT count(*) FROM {t} WHERE status = 'published'),
                 (SELECT count(*) FROM {t} WHERE status = 'failed'),
                 (SELECT (julianday('now') - julianday(created_at)) * 86400.0
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
    /// rows per statement (each its own short write), until none is left;
    /// how many. Pending and failed rows are never touched. With
    /// `dry_run`, only counts them.
    pub async fn purge_published(
        &self,
        older_than: Duration,
        batch: u32,
        dry_run: bool,
    ) -> Result<u64, OutboxError> {
        let t = &self.table;
        let old = "status = 'published' AND published_at < \
                   strftime('%Y-%m-%d %H:%M:%f', 'now', printf('-%.3f seconds', ?1))";
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
            "DELETE FROM {t} WHERE id IN (SELECT id FROM {t} WHERE {old} ORDER BY id LIMIT ?2)"
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

    /// The table's columns; empty when it does not exist.
    async fn columns(&self) -> Result<Vec<String>, OutboxError> {
        sqlx::query_scalar("SELECT name FROM pragma_table_info(?1)")
            .bind(&self.table)
            .fetch_all(&self.pool)
            .await
            .map_err(database("open"))
    }

    /// `error`, or [`OutboxError::MissingTable`] when it says the table is missing.
    fn missing_or(&self, error: sqlx::Error, operation: &'static str) -> OutboxError {
        if error.to_string().contains("no such table") {
            OutboxError::MissingTable {
                table: self.table.clone(),
            }
        } else {
            database(operation)(error)
        }
    }
}

/// What the relay does on a SQLite outbox.
#[cfg_attr(
    not(any(feature = "redis-transport", feature = "amqp-transport")),
    allow(dead_code, reason = "only the relay takes rows")
)]
impl SqliteOutbox {
    /// Whether the table exists and has the `headers` column.
    pub(super) async fn probe(&self) -> Result<bool, OutboxError> {
        let columns = self.columns().await?;
        if columns.is_empty() {
            return Err(OutboxError::MissingTable {
                table: self.table.clone(),
            });
        }
        Ok(columns.iter().any(|column| column == "headers"))
    }

    /// Wakes when a `save` of this process wrote a row.
    pub(super) fn wake(&self) -> Arc<Notify> {
        Arc::clone(&self.wake)
    }

    /// Up to `limit` pending rows, oldest first, past their backoff, but
    /// none of `in_flight` (rows published whose mark may not have
    /// committed yet).
    pub(super) async fn take(
        &self,
        limit: u32,
        backoff: Backoff,
        with_headers: bool,
        in_flight: &[i64],
    ) -> Result<Vec<PendingRow>, OutboxError> {
        let headers = if with_headers { "headers" } else { "NULL" };
        let take = format!(
            "SELECT id, queue, body, attempts, {headers} FROM {}
             WHERE status = 'pending'
               AND (failed_at IS NULL OR failed_at <= strftime('%Y-%m-%d %H:%M:%f', 'now',
                    printf('-%.3f seconds', min(attempts * ?2, ?3))))
               AND id NOT IN (SELECT value FROM json_each(?4))
             ORDER BY id LIMIT ?1",
            self.table
        );
        let in_flight = serde_json::Value::from(in_flight.to_vec()).to_string();
        let rows: Vec<(i64, String, String, i64, Option<String>)> = sqlx::query_as(&take)
            .bind(i64::from(limit))
            .bind(backoff.step.as_secs_f64())
            .bind(backoff.cap.as_secs_f64())
            .bind(in_flight)
            .fetch_all(&self.pool)
            .await
            .map_err(|error| self.missing_or(error, "take"))?;
        Ok(rows
            .into_iter()
            .map(|(id, queue, body, attempts, headers)| PendingRow {
                id,
                queue,
                body,
                attempts,
                headers: headers_from_json(headers.as_deref()),
            })
            .collect())
    }

    /// Records the relay's outcome: `published` rows marked published,
    /// each of `refused` with its attempt, error and failure time (and
    /// `'failed'` once it reached `max_attempts`), in one transaction.
    pub(super) async fn finish(
        &self,
        published: &[i64],
        refused: &[(i64, String)],
        max_attempts: u32,
    ) -> Result<(), OutboxError> {
        let t = &self.table;
        let mark = format!(
            "UPDATE {t} SET status = 'published', published_at = {NOW}
             WHERE id IN (SELECT value FROM json_each(?1)) AND status = 'pending'"
        );
        let ids = serde_json::Value::from(published.to_vec()).to_string();
        if refused.is_empty() {
            // One statement is its own transaction.
            sqlx::query(&mark)
                .bind(ids)
                .execute(&self.pool)
                .await
                .map_err(database("mark published"))?;
            return Ok(());
        }
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(database("mark"))?;
        if !published.is_empty() {
            sqlx::query(&mark)
                .bind(ids)
                .execute(&mut *tx)
                .await
                .map_err(database("mark published"))?;
        }
        let refuse = format!(
            "UPDATE {t} SET attempts = attempts + 1, last_error = ?2, failed_at = {NOW},
                 status = CASE WHEN attempts + 1 >= ?3 THEN 'failed' ELSE status END
             WHERE id = ?1"
        );
        for (id, error) in refused {
            sqlx::query(&refuse)
                .bind(id)
                .bind(truncated(error))
                .bind(i64::from(max_attempts))
                .execute(&mut *tx)
                .await
                .map_err(database("mark failed"))?;
        }
        tx.commit().await.map_err(database("mark"))
    }
}
