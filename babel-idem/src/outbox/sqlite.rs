//! [`SqliteOutbox`]: the outbox table in a SQLite database (feature
//! `sqlite`). Every statement it runs is on this page.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use sqlx::sqlite::{SqlitePool, SqliteQueryResult};
use sqlx::{Sqlite, SqliteConnection};
use tokio::sync::Notify;

use super::sql::{Dialect, RowsAffected, SqlOutbox, SqlTable, Take, operator_methods};
use super::{Batch, Lease, Marks, OutboxError, OutboxStats, PendingRow, Wakeup, database};
use crate::envelope::{Envelope, ProduceError, typed};
use crate::message::Message;
use crate::store::AsConnection;

/// The DDL, shipped as `sqlite.sql` for users who run their own migrations.
const DDL: &str = include_str!("sqlite.sql");

/// Now, as the table writes times: UTC text with milliseconds, which sorts
/// with the family's `YYYY-MM-DD HH:MM:SS`.
const NOW: &str = "strftime('%Y-%m-%d %H:%M:%f', 'now')";

/// Now, as the family's SDKs write times into their own table (made by the
/// family's DDL, without `headers`): UTC text in whole seconds,
/// `YYYY-MM-DD HH:MM:SS`, so a row this crate writes reads like theirs.
const FAMILY_NOW: &str = "strftime('%Y-%m-%d %H:%M:%S', 'now')";

/// SQLite's statements where they differ from PostgreSQL's.
static SQLITE: Dialect = Dialect {
    age_seconds: "(julianday('now') - julianday(created_at)) * 86400.0",
    published_before: "published_at < \
                       strftime('%Y-%m-%d %H:%M:%f', 'now', printf('-%.3f seconds', ?1))",
    second: "?2",
    skip_locked: "",
    insert: |table, headers| match headers {
        true => format!(
            "INSERT INTO {table} (queue, body, headers, created_at) VALUES (?1, ?2, ?3, {NOW}) RETURNING id"
        ),
        // No `headers`: the family's table, and its time format.
        false => format!(
            "INSERT INTO {table} (queue, body, created_at) VALUES (?1, ?2, {FAMILY_NOW}) RETURNING id"
        ),
    },
    columns: "SELECT name FROM pragma_table_info(?1)",
    missing_table: |error| error.to_string().contains("no such table"),
};

impl RowsAffected for SqliteQueryResult {
    fn rows(&self) -> u64 {
        self.rows_affected()
    }
}

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
/// | `save` | `INSERT INTO t (queue, body, headers, created_at) VALUES (?1, ?2, ?3, now) RETURNING id` (on the family's table, [`without_headers`](Self::without_headers): no `headers`, and `now` in whole seconds) |
/// | the relay takes | `SELECT id, CAST(queue AS BLOB), CAST(body AS BLOB), ifnull(CAST(attempts AS INTEGER), 0), CAST(headers AS BLOB) FROM t WHERE status = 'pending' AND (failed_at IS NULL OR failed_at <= now - backoff) AND id NOT IN (SELECT value FROM json_each(?4)) ORDER BY id LIMIT ?1`, `?4` the previous batch's ids, whose mark may still be committing |
/// | the broker accepted | `UPDATE t SET status = 'published', published_at = now WHERE id IN (SELECT value FROM json_each(?1)) AND status = 'pending'`, alone, or with the refusals in one `BEGIN IMMEDIATE` transaction; on the family's table `now` in whole seconds |
/// | the broker refused, or the row cannot be read (`?4`) | `UPDATE t SET attempts = attempts + 1, last_error = ?2, failed_at = now, status = CASE WHEN ?4 OR attempts + 1 >= ?3 THEN 'failed' ELSE status END WHERE id = ?1` |
/// | `retry_failed` | `UPDATE t SET status = 'pending', attempts = 0, failed_at = NULL WHERE status = 'failed'` |
/// | `purge_published` | `DELETE FROM t WHERE id IN (SELECT id FROM t WHERE status = 'published' AND published_at < now - age ORDER BY id LIMIT ?2)`, batch after batch |
///
/// `now` is UTC text with milliseconds (`YYYY-MM-DD HH:MM:SS.SSS`), except
/// on a table made by the family's DDL alone (no `headers` column, which
/// the relay finds when it is built, or [`without_headers`](Self::without_headers)):
/// there `created_at` and `published_at` are written as the family's SDKs
/// write them, in whole seconds (`YYYY-MM-DD HH:MM:SS`). `failed_at` keeps
/// its milliseconds everywhere: the relay's backoff between two tries of a
/// row is measured from it.
///
/// The relay reads each column as bytes, so a row another writer left
/// unreadable (a body or queue that is not UTF-8 text, a BLOB, headers that
/// are not a JSON object of strings) fails alone, `'failed'` with the
/// reason as `last_error`, instead of failing every read of its batch.
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
#[derive(Clone, Debug)]
pub struct SqliteOutbox {
    table: SqlTable<Sqlite>,
    wake: Arc<Notify>,
}

impl SqliteOutbox {
    /// The outbox table `babelqueue_outbox` on `pool`.
    pub fn new(pool: SqlitePool) -> Self {
        SqliteOutbox {
            table: SqlTable::new(pool, &SQLITE),
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
    pub fn with_table(self, table: &str) -> Result<Self, OutboxError> {
        Ok(SqliteOutbox {
            table: self.table.renamed(table)?,
            ..self
        })
    }

    /// For a table made with the family's DDL alone: `save` writes no
    /// `headers` column (the producer's `traceparent` is not kept), and
    /// times in the family's whole seconds.
    pub fn without_headers(mut self) -> Self {
        self.table = self.table.without_headers();
        self
    }

    /// The pool the outbox runs on.
    pub fn pool(&self) -> &SqlitePool {
        &self.table.pool
    }

    /// The table the outbox uses.
    pub fn table(&self) -> &str {
        &self.table.name
    }

    /// Creates the table and its index if they are missing (`sqlite.sql`
    /// for this outbox's table), and nothing else. Safe when many processes
    /// run it at once: it runs in a `BEGIN IMMEDIATE` transaction, so each
    /// waits for the write lock and then finds the table made or makes it.
    pub async fn migrate(&self) -> Result<(), OutboxError> {
        let tx = self.pool().begin_with("BEGIN IMMEDIATE").await;
        self.table
            .create_in(tx.map_err(database("migrate"))?, DDL)
            .await
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
        let id = self
            .table
            .save(connection.as_connection(), envelope)
            .await?;
        self.wake.notify_one();
        Ok(id)
    }

    /// Writes `message`, a value of a [`Message`] type, to the outbox as
    /// a new envelope on `queue` ([`Envelope::from_message`]: the type's
    /// URN, the value as `data`, a fresh `meta.id`), as
    /// [`save`](SqliteOutbox::save) writes any envelope; returns the row's id.
    /// The queue is the `queue` argument, written to `meta.queue` (an
    /// empty name is `default`). A value that does not serialize to a JSON
    /// object is refused before anything is written
    /// ([`OutboxError::Envelope`] with
    /// [`ProduceError::Data`](crate::envelope::ProduceError::Data)).
    ///
    /// ```
    /// use babel_idem::Message;
    /// use babel_idem::outbox::SqliteOutbox;
    /// use serde::{Deserialize, Serialize};
    ///
    /// #[derive(Serialize, Deserialize, Message)]
    /// #[message(urn = "urn:babel:orders:created")]
    /// struct OrderCreated {
    ///     order_id: u64,
    /// }
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// let pool = sqlx::sqlite::SqlitePoolOptions::new().max_connections(1).connect("sqlite::memory:").await?;
    /// let outbox = SqliteOutbox::new(pool.clone());
    /// outbox.migrate().await?;
    ///
    /// let mut tx = pool.begin().await?;
    /// outbox.save_message(&mut tx, "orders", &OrderCreated { order_id: 7 }).await?;
    /// tx.commit().await?;
    /// assert_eq!(outbox.stats().await?.pending, 1);
    /// # Ok::<(), anyhow::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn save_message<'a, C, M>(
        &'a self,
        connection: &'a mut C,
        queue: &str,
        message: &M,
    ) -> impl Future<Output = Result<i64, OutboxError>> + use<'a, C, M>
    where
        C: AsConnection<SqliteConnection> + ?Sized,
        M: Message,
    {
        // Built before the future, which then holds no borrow of `message`
        // (a `Message` is `Send`, not necessarily `Sync`) nor of `queue`.
        let envelope = typed::on_queue(queue, message);
        async move {
            let envelope = envelope.map_err(ProduceError::from)?;
            self.save(connection, &envelope).await
        }
    }

    operator_methods!();
}

/// What SQLite does its own way.
impl SqlOutbox for SqliteOutbox {
    type Db = Sqlite;

    fn sql(&self) -> &SqlTable<Sqlite> {
        &self.table
    }

    /// Up to `limit` pending rows, oldest first, past their backoff, but
    /// none of `in_flight` (rows published whose mark may not have
    /// committed yet). Each column is read as SQLite holds it (bytes, any
    /// type), so one row that is not text cannot fail the whole read: it
    /// comes back among the unreadable rows. A single relay drains a SQLite
    /// outbox, so the batch's lease holds nothing.
    async fn take_batch(&self, take: Take<'_>) -> Result<Batch, OutboxError> {
        let headers = take.headers.then_some("CAST(headers AS BLOB)");
        let headers = headers.unwrap_or("NULL");
        let select = format!(
            "SELECT id, CAST(queue AS BLOB), CAST(body AS BLOB),
                    ifnull(CAST(attempts AS INTEGER), 0), {headers} FROM {}
             WHERE status = 'pending'
               AND (failed_at IS NULL OR failed_at <= strftime('%Y-%m-%d %H:%M:%f', 'now',
                    printf('-%.3f seconds', min(attempts * ?2, ?3))))
               AND id NOT IN (SELECT value FROM json_each(?4))
             ORDER BY id LIMIT ?1",
            self.table()
        );
        let in_flight = serde_json::Value::from(take.in_flight.to_vec()).to_string();
        type Columns = (i64, Option<Vec<u8>>, Option<Vec<u8>>, i64, Option<Vec<u8>>);
        let rows: Vec<Columns> = sqlx::query_as(&select)
            .bind(take.limit)
            .bind(take.step)
            .bind(take.cap)
            .bind(in_flight)
            .fetch_all(self.pool())
            .await
            .map_err(|error| self.table.missing_or(error, "take"))?;
        let rows = rows
            .into_iter()
            .map(|row| PendingRow::read(row.0, row.1, row.2, row.3, row.4));
        Ok(Batch::read(rows, Lease::none()))
    }

    /// Records the relay's outcome (see [`Marks`]): the published rows
    /// alone in one statement, with failures in one `BEGIN IMMEDIATE`
    /// transaction.
    async fn finish(&self, _lease: Lease, marks: Marks<'_>) -> Result<(), OutboxError> {
        let t = self.table();
        let published_at = if self.table.is_family() {
            FAMILY_NOW
        } else {
            NOW
        };
        let mark = format!(
            "UPDATE {t} SET status = 'published', published_at = {published_at}
             WHERE id IN (SELECT value FROM json_each(?1)) AND status = 'pending'"
        );
        let ids = serde_json::Value::from(marks.published.to_vec()).to_string();
        if marks.refused.is_empty() && marks.unreadable.is_empty() {
            // One statement is its own transaction.
            sqlx::query(&mark)
                .bind(ids)
                .execute(self.pool())
                .await
                .map_err(database("mark published"))?;
            return Ok(());
        }
        let mut tx = self
            .pool()
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(database("mark"))?;
        if !marks.published.is_empty() {
            sqlx::query(&mark)
                .bind(ids)
                .execute(&mut *tx)
                .await
                .map_err(database("mark published"))?;
        }
        // `?4`: the row cannot be read, so trying it again cannot help.
        let refuse = format!(
            "UPDATE {t} SET attempts = attempts + 1, last_error = ?2, failed_at = {NOW},
                 status = CASE WHEN ?4 OR attempts + 1 >= ?3 THEN 'failed' ELSE status END
             WHERE id = ?1"
        );
        for (id, error, unreadable) in marks.failures() {
            sqlx::query(&refuse)
                .bind(id)
                .bind(error)
                .bind(i64::from(marks.max_attempts))
                .bind(unreadable)
                .execute(&mut *tx)
                .await
                .map_err(database("mark failed"))?;
        }
        tx.commit().await.map_err(database("mark"))
    }

    /// A `save` of this process wakes the relay.
    async fn wake(&self) -> Box<dyn Wakeup> {
        Box::new(LocalWake {
            notify: Arc::clone(&self.wake),
            burst: 0,
        })
    }

    async fn create(&self) -> Result<(), OutboxError> {
        self.migrate().await
    }
}

/// How many short looks follow a local wake-up (1, 2, 4, ... 64 ms apart).
const LOCAL_BURST: u32 = 6;

/// Wakes on a `save` of this process, then looks again at short, growing
/// intervals: `save` runs inside a transaction that commits after it.
struct LocalWake {
    notify: Arc<Notify>,
    /// Short looks left after the last wake-up.
    burst: u32,
}

impl Wakeup for LocalWake {
    fn wait(&mut self, poll: Duration) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(async move {
            if self.burst > 0 {
                self.burst -= 1;
                let delay = Duration::from_millis(1 << (LOCAL_BURST - self.burst));
                tokio::time::sleep(delay.min(poll)).await;
            } else if tokio::time::timeout(poll, self.notify.notified())
                .await
                .is_ok()
            {
                self.burst = LOCAL_BURST;
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};

    /// A SQLite file of the test's own, with no busy wait.
    async fn outbox(name: &str) -> (SqliteOutbox, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!(
            "bi-outbox-{name}-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let options = SqliteConnectOptions::new()
            .filename(dir.join("outbox.db"))
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(Duration::ZERO);
        let pool = SqlitePoolOptions::new()
            .max_connections(2)
            .connect_with(options)
            .await
            .unwrap();
        let outbox = SqliteOutbox::new(pool);
        outbox.migrate().await.unwrap();
        (outbox, dir)
    }

    #[tokio::test]
    async fn a_mark_another_writer_locks_out_is_an_outage_and_a_missing_table_is_not() {
        let (outbox, dir) = outbox("locked").await;
        let writer = outbox.pool().begin_with("BEGIN IMMEDIATE").await.unwrap();
        let error = outbox
            .finish(
                Lease::none(),
                marks(&[1], &[(2, "refused".to_owned())], &[], 3),
            )
            .await
            .unwrap_err();
        assert!(error.is_outage(), "{error}");
        writer.rollback().await.unwrap();
        outbox
            .finish(
                Lease::none(),
                marks(&[1], &[(2, "refused".to_owned())], &[], 3),
            )
            .await
            .expect("the lock is gone");

        let missing = outbox.clone().with_table("not_there").unwrap();
        let error = missing.take_batch(test_take()).await.unwrap_err();
        assert!(matches!(error, OutboxError::MissingTable { .. }), "{error}");
        assert!(!error.is_outage(), "{error}");
        outbox.pool().close().await;
        let _ = std::fs::remove_dir_all(dir);
    }

    #[tokio::test]
    async fn an_unreadable_row_is_taken_apart_from_the_rows_around_it_and_failed_at_once() {
        let (outbox, dir) = outbox("unreadable").await;
        let t = outbox.table().to_owned();
        let insert = format!("INSERT INTO {t} (queue, body, headers) VALUES (?1, ?2, ?3)");
        for (body, headers) in [
            (b"{}".to_vec(), None),
            (b"\xff".to_vec(), None),
            (b"{}".to_vec(), Some(b"{\"a\":\"b\"}".to_vec())),
        ] {
            sqlx::query(&insert)
                .bind("orders")
                .bind(body)
                .bind(headers)
                .execute(outbox.pool())
                .await
                .unwrap();
        }
        let taken = outbox.take_batch(test_take()).await.unwrap();
        let ids: Vec<i64> = taken.rows.iter().map(|row| row.id).collect();
        assert_eq!(ids, [1, 3]);
        assert_eq!(taken.rows[1].headers, [("a".to_owned(), "b".to_owned())]);
        assert_eq!(taken.unreadable.len(), 1);
        assert_eq!(taken.unreadable[0].0, 2);

        // Failed at once, whatever the attempts left.
        outbox
            .finish(Lease::none(), marks(&[1, 3], &[], &taken.unreadable, 10))
            .await
            .unwrap();
        let stats = outbox.stats().await.unwrap();
        assert_eq!((stats.published, stats.failed, stats.pending), (2, 1, 0));
        outbox.pool().close().await;
        let _ = std::fs::remove_dir_all(dir);
    }

    fn test_take() -> Take<'static> {
        Take {
            limit: 10,
            step: 0.05,
            cap: 5.0,
            headers: true,
            in_flight: &[],
        }
    }

    fn marks<'a>(
        published: &'a [i64],
        refused: &'a [(i64, String)],
        unreadable: &'a [(i64, String)],
        max_attempts: u32,
    ) -> Marks<'a> {
        Marks {
            published,
            refused,
            unreadable,
            max_attempts,
        }
    }
}
