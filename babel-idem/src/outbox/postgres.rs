//! [`PostgresOutbox`]: the outbox table in a PostgreSQL database (feature
//! `postgres`). Every statement it runs is on this page.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use sqlx::postgres::{PgListener, PgPool, PgQueryResult};
use sqlx::{PgConnection, Postgres, Transaction};

use super::sql::{Dialect, RowsAffected, SqlOutbox, SqlTable, Take, operator_methods};
use super::{Batch, Lease, Marks, OutboxError, OutboxStats, PendingRow, Wakeup, database};
use crate::envelope::{Envelope, ProduceError, typed};
use crate::message::Message;
use crate::store::AsConnection;

/// The DDL, shipped as `postgres.sql` for users who run their own migrations.
const DDL: &str = include_str!("postgres.sql");

/// Now, as the table writes times: UTC, without a time zone (the family's
/// `TIMESTAMP`).
const NOW: &str = "(now() AT TIME ZONE 'UTC')";

/// PostgreSQL's statements where they differ from SQLite's.
static POSTGRES: Dialect = Dialect {
    age_seconds: "EXTRACT(EPOCH FROM (now() AT TIME ZONE 'UTC') - created_at)::float8",
    published_before: "published_at < (now() AT TIME ZONE 'UTC') - make_interval(secs => $1)",
    second: "$2",
    skip_locked: " FOR UPDATE SKIP LOCKED",
    // The same statement notifies the relays, which PostgreSQL delivers at
    // commit.
    insert: |t, headers| {
        let (columns, values) = match headers {
            true => ("queue, body, headers", "$1, $2, $3::jsonb"),
            false => ("queue, body", "$1, $2"),
        };
        format!(
            "WITH saved AS (
                 INSERT INTO {t} ({columns}, created_at)
                 VALUES ({values}, {NOW}) RETURNING id)
             SELECT id, pg_notify('{t}', '')::text FROM saved"
        )
    },
    columns: "SELECT column_name::text FROM information_schema.columns
              WHERE table_schema = current_schema() AND table_name = $1",
    missing_table: |error| {
        error
            .as_database_error()
            .and_then(|error| error.code())
            .is_some_and(|code| code == "42P01")
    },
};

impl RowsAffected for PgQueryResult {
    fn rows(&self) -> u64 {
        self.rows_affected()
    }
}

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
#[derive(Clone, Debug)]
pub struct PostgresOutbox {
    table: SqlTable<Postgres>,
}

impl PostgresOutbox {
    /// The outbox table `babelqueue_outbox` on `pool`.
    pub fn new(pool: PgPool) -> Self {
        PostgresOutbox {
            table: SqlTable::new(pool, &POSTGRES),
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
    pub fn with_table(self, table: &str) -> Result<Self, OutboxError> {
        let table = self.table.renamed(table)?;
        Ok(PostgresOutbox { table })
    }

    /// For a table made with the family's DDL alone: `save` writes no
    /// `headers` column (the producer's `traceparent` is not kept).
    pub fn without_headers(self) -> Self {
        let mut table = self.table;
        table.headers = false;
        PostgresOutbox { table }
    }

    /// The pool the outbox runs on.
    pub fn pool(&self) -> &PgPool {
        &self.table.pool
    }

    /// The table the outbox uses.
    pub fn table(&self) -> &str {
        &self.table.name
    }

    /// Creates the table and its index if they are missing (`postgres.sql`
    /// for this outbox's table), and nothing else. Safe when a fleet runs
    /// it at once: it runs in a transaction that first takes an advisory
    /// lock named after the table, so migrations run one after another.
    pub async fn migrate(&self) -> Result<(), OutboxError> {
        let lock = format!("babel-idem migrate outbox {}", self.table());
        let mut tx = self.pool().begin().await.map_err(database("migrate"))?;
        sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
            .bind(lock)
            .execute(&mut *tx)
            .await
            .map_err(database("migrate"))?;
        self.table.create_in(tx, DDL).await
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
        self.table.save(connection.as_connection(), envelope).await
    }

    /// Writes `message`, a value of a [`Message`] type, to the outbox as
    /// a new envelope on `queue` ([`Envelope::from_message`]: the type's
    /// URN, the value as `data`, a fresh `meta.id`), as
    /// [`save`](PostgresOutbox::save) writes any envelope; returns the row's id.
    /// The queue is the `queue` argument, written to `meta.queue` (an
    /// empty name is `default`). A value that does not serialize to a JSON
    /// object is refused before anything is written
    /// ([`OutboxError::Envelope`] with
    /// [`ProduceError::Data`](crate::envelope::ProduceError::Data)).
    ///
    /// ```no_run
    /// use babel_idem::Message;
    /// use babel_idem::outbox::PostgresOutbox;
    /// use serde::{Deserialize, Serialize};
    ///
    /// #[derive(Serialize, Deserialize, Message)]
    /// #[message(urn = "urn:babel:orders:created")]
    /// struct OrderCreated {
    ///     order_id: u64,
    /// }
    ///
    /// # async fn run(pool: sqlx::PgPool) -> Result<(), anyhow::Error> {
    /// let outbox = PostgresOutbox::new(pool.clone());
    /// let mut tx = pool.begin().await?;
    /// // ... the business write on `tx` ...
    /// outbox.save_message(&mut tx, "orders", &OrderCreated { order_id: 7 }).await?;
    /// tx.commit().await?; // the order and its message, together
    /// # Ok(())
    /// # }
    /// ```
    pub fn save_message<'a, C, M>(
        &'a self,
        connection: &'a mut C,
        queue: &str,
        message: &M,
    ) -> impl Future<Output = Result<i64, OutboxError>> + use<'a, C, M>
    where
        C: AsConnection<PgConnection> + ?Sized,
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

    /// A listener on the channel `save` notifies.
    async fn listen(&self) -> Result<PgListener, OutboxError> {
        let mut listener = PgListener::connect_with(self.pool())
            .await
            .map_err(database("listen"))?;
        listener
            .listen(self.table())
            .await
            .map_err(database("listen"))?;
        Ok(listener)
    }
}

/// What PostgreSQL does its own way.
impl SqlOutbox for PostgresOutbox {
    type Db = Postgres;

    fn sql(&self) -> &SqlTable<Postgres> {
        &self.table
    }

    async fn create(&self) -> Result<(), OutboxError> {
        self.migrate().await
    }

    /// Begins the relay's transaction and takes up to `limit` pending rows
    /// past their backoff, oldest first, locked against the other relays;
    /// the batch's lease is the transaction. The rows of a batch still
    /// being marked stay locked until their mark commits, and `SKIP LOCKED`
    /// passes them by.
    async fn take_batch(&self, take: Take<'_>) -> Result<Batch, OutboxError> {
        let headers = take.headers.then_some("headers::text");
        let select = format!(
            "SELECT id, queue::text, body, attempts::int8, {headers} FROM {t}
             WHERE status = 'pending'
               AND (failed_at IS NULL
                    OR failed_at <= {NOW} - make_interval(secs => LEAST(attempts * $2, $3)))
             ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED",
            headers = headers.unwrap_or("NULL::text"),
            t = self.table()
        );
        // The transaction only marks rows: a mark lost to a server crash
        // publishes its row again (at least once, as always), so its commit
        // need not wait for the disk.
        let mut tx = self
            .pool()
            .begin_with("BEGIN; SET LOCAL synchronous_commit = off")
            .await
            .map_err(database("take"))?;
        type Columns = (i64, Option<String>, Option<String>, i64, Option<String>);
        let rows: Vec<Columns> = sqlx::query_as(&select)
            .bind(take.limit)
            .bind(take.step)
            .bind(take.cap)
            .fetch_all(&mut *tx)
            .await
            .map_err(|error| self.table.missing_or(error, "take"))?;
        let rows = rows
            .into_iter()
            .map(|(id, queue, body, attempts, headers)| {
                PendingRow::read(
                    id,
                    queue.map(String::into_bytes),
                    body.map(String::into_bytes),
                    attempts,
                    headers.map(String::into_bytes),
                )
            });
        Ok(Batch::read(rows, Lease::new(tx)))
    }

    /// Records the relay's outcome (see [`Marks`]) in the transaction that
    /// took the rows (the lease), and commits it.
    async fn finish(&self, lease: Lease, marks: Marks<'_>) -> Result<(), OutboxError> {
        let Some(mut tx) = lease.into_held::<Transaction<'static, Postgres>>() else {
            return Ok(());
        };
        let t = self.table();
        // One statement for the whole batch: each id with no error is
        // published; each id with its error spends an attempt, and one the
        // relay could not read is failed at once (trying it again cannot
        // help).
        let published = marks.published;
        let failures = marks.refused.len() + marks.unreadable.len();
        let mut ids = Vec::with_capacity(published.len() + failures);
        let mut errors: Vec<Option<String>> = Vec::with_capacity(ids.capacity());
        let mut unreadables: Vec<bool> = Vec::with_capacity(ids.capacity());
        ids.extend_from_slice(published);
        errors.resize(published.len(), None);
        unreadables.resize(published.len(), false);
        for (id, error, unreadable) in marks.failures() {
            ids.push(id);
            errors.push(Some(error));
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
                .bind(i64::from(marks.max_attempts))
                .bind(&unreadables)
                .execute(&mut *tx)
                .await
                .map_err(database("mark"))?;
        }
        tx.commit().await.map_err(database("mark"))
    }

    /// `LISTEN` on the channel `save` notifies; the poll alone while the
    /// listener cannot be opened.
    async fn wake(&self) -> Box<dyn Wakeup> {
        match self.listen().await {
            Ok(listener) => Box::new(Listen::Listening(Box::new(listener))),
            Err(_) => Box::new(Listen::Polling(self.clone())),
        }
    }
}

/// A relay's idle wait on PostgreSQL.
enum Listen {
    /// Woken by `save`'s `NOTIFY`.
    Listening(Box<PgListener>),
    /// The listener was lost: the poll alone, until it is opened again.
    Polling(PostgresOutbox),
}

impl Wakeup for Listen {
    fn wait(&mut self, poll: Duration) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(async move {
            match self {
                Listen::Listening(listener) => {
                    if let Ok(Err(_)) = tokio::time::timeout(poll, listener.recv()).await {
                        // The listener reconnects on its next `recv`; poll meanwhile.
                        tokio::time::sleep(poll.min(Duration::from_millis(100))).await;
                    }
                }
                Listen::Polling(outbox) => {
                    tokio::time::sleep(poll).await;
                    if let Ok(listener) = outbox.listen().await {
                        *self = Listen::Listening(Box::new(listener));
                    }
                }
            }
        })
    }
}
