//! The transactional outbox of the BabelQueue family (feature `outbox`;
//! its tables with `sqlite`, `postgres`): outgoing messages written in the
//! caller's own database transaction, published afterwards by a relay. The
//! guide page is [`guide::outbox`](crate::guide::outbox).
//!
//! A producer that commits a business row and then publishes can crash in
//! between, or publish a message whose transaction rolls back. With the
//! outbox, `save` inserts the encoded envelope into
//! the table `babelqueue_outbox` on the caller's connection, inside its
//! transaction, so the message commits or rolls back with the business
//! write; a relay then publishes every committed row, byte for byte, and
//! marks it published once the broker accepted it. The handoff is at least
//! once: a relay that dies between the publish and the mark publishes the
//! row again, with the same `meta.id`, which consumers deduplicate.
//!
//! - `SqliteOutbox` (feature `sqlite`) and `PostgresOutbox` (feature
//!   `postgres`): the table, its migration, `save`, and the operator's
//!   counts and clean-ups.
//! - [`OutboxSource`]: what the relay and the operator call on an outbox,
//!   whatever database holds it; both outboxes implement it.
//! - [`Relay`]: drains pending rows to any [`broker::Publisher`](crate::broker::Publisher)
//!   (Redis and RabbitMQ with `redis-transport`, `amqp-transport`).
//!
//! The table is the family's (the Go, Python and PHP SDKs' relays drain a
//! babel-idem outbox, and babel-idem's relay drains theirs), plus a nullable
//! `headers` column that carries the producer's W3C `traceparent` and a
//! `'failed'` status for rows the broker kept refusing or the relay cannot
//! read; the family's relays ignore both, and babel-idem's relay drains a
//! table without them.

use std::any::Any;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use crate::envelope::ProduceError;

#[cfg(feature = "postgres")]
mod postgres;
mod relay;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod sql;
#[cfg(feature = "sqlite")]
mod sqlite;

#[cfg(feature = "postgres")]
pub use postgres::PostgresOutbox;
pub use relay::{
    DEFAULT_BATCH, DEFAULT_MAX_BODY, DEFAULT_MAX_PUBLISH_ATTEMPTS, Relay, RelayBuilder, RelayError,
    RelayReport, RelaySink, RelaySource,
};
#[cfg(feature = "sqlite")]
pub use sqlite::SqliteOutbox;

/// The family's outbox table.
pub const DEFAULT_TABLE: &str = "babelqueue_outbox";

/// The longest `last_error` the table keeps, in characters (the family's
/// `VARCHAR(500)`).
pub const MAX_ERROR_CHARS: usize = 500;

/// The longest table name: the seen-set's rule, so the index name built on
/// it stays within PostgreSQL's 63 bytes.
const MAX_TABLE_LEN: usize = 48;

/// Why an outbox operation failed.
///
/// ```
/// use babel_idem::outbox::OutboxError;
///
/// let error = OutboxError::MissingTable { table: "babelqueue_outbox".into() };
/// assert!(error.to_string().contains("babel-idem migrate"));
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OutboxError {
    /// The envelope does not encode; nothing was written.
    #[error("outbox: {0}")]
    Envelope(#[from] ProduceError),
    /// The table name is not a plain SQL identifier of at most 48 characters.
    #[error(
        "outbox table name {table:?} is not a plain identifier of at most \
         {max} characters: letters, digits and _, not starting with a digit",
        max = MAX_TABLE_LEN
    )]
    InvalidTable {
        /// The name given.
        table: String,
    },
    /// The outbox table does not exist in the database.
    #[error(
        "the outbox table {table:?} does not exist: create it with \
         `babel-idem migrate URL --outbox` (or the outbox's `migrate()`)"
    )]
    MissingTable {
        /// The table looked for.
        table: String,
    },
    /// The database failed the operation.
    #[error("outbox {operation} failed: {source}")]
    Database {
        /// What was being done (`save`, `migrate`, `stats`, ...).
        operation: &'static str,
        /// The database's error.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl OutboxError {
    /// Whether the database could not do the operation for a reason of
    /// its own, not the operation's: the connection lost, refused or timed
    /// out, the connection ended by the server (`57P01 admin_shutdown`, a `08` connection
    /// exception), the server starting, shutting down, read-only, out of
    /// connections, memory or disk, a lock or a conflict it gave up on
    /// (SQLite's `BUSY`, `LOCKED`, `FULL`, `IOERR`). The same operation can
    /// succeed once the database is back; a missing table, bad credentials
    /// or a closed pool are not outages.
    pub(crate) fn is_outage(&self) -> bool {
        match self {
            OutboxError::Database { source, .. } => source
                .downcast_ref::<sqlx::Error>()
                .is_some_and(is_database_outage),
            _ => false,
        }
    }
}

/// Whether `error` is the database's state rather than the statement's
/// fault; see [`OutboxError::is_outage`].
fn is_database_outage(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut => true,
        sqlx::Error::Database(error) => {
            let Some(code) = error.code() else {
                return false;
            };
            // SQLite's result codes are numbers (the primary code in the
            // low byte); PostgreSQL's are five-character SQLSTATEs.
            if let Ok(code) = code.parse::<i32>() {
                return matches!(
                    code & 0xff,
                    SQLITE_BUSY | SQLITE_LOCKED | SQLITE_IOERR | SQLITE_FULL
                );
            }
            code.starts_with("08")
                || code.starts_with("53")
                || matches!(
                    &*code,
                    "57P01" | "57P02" | "57P03" | "57014" | "25006" | "40001" | "40P01"
                )
        }
        _ => false,
    }
}

/// SQLite's primary result codes for a database busy, locked by another
/// connection, failing to read or write its file, or full.
const SQLITE_BUSY: i32 = 5;
const SQLITE_LOCKED: i32 = 6;
const SQLITE_IOERR: i32 = 10;
const SQLITE_FULL: i32 = 13;

/// `map_err` for a database call made while doing `operation`.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
fn database(operation: &'static str) -> impl FnOnce(sqlx::Error) -> OutboxError {
    move |error| OutboxError::Database {
        operation,
        source: Box::new(error),
    }
}

/// How many rows an outbox holds in each status, and how long the oldest
/// pending one has waited (the outbox's lag).
///
/// ```
/// let stats = babel_idem::outbox::OutboxStats::default();
/// assert_eq!(stats.pending, 0);
/// assert!(stats.oldest_pending_age.is_none());
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct OutboxStats {
    /// Rows waiting for the relay.
    pub pending: u64,
    /// Rows the broker accepted, not yet purged.
    pub published: u64,
    /// Rows the broker refused too often; `retry-failed` makes them pending.
    pub failed: u64,
    /// How long the oldest pending row has waited since it was saved.
    pub oldest_pending_age: Option<Duration>,
}

/// The future an [`OutboxSource`] operation returns.
pub type OutboxFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, OutboxError>> + Send + 'a>>;

/// An outbox as its operator and its [`Relay`] see it, whatever database
/// holds it: [`SqliteOutbox`] and `PostgresOutbox` implement it, and a
/// `Box`/`Arc` of `dyn OutboxSource` is how a program that picks the
/// database at run time holds one.
///
/// The relay's side is a lease protocol: [`take`](Self::take) hands out a
/// [`Batch`] of due rows with the [`Lease`] that holds them (on PostgreSQL
/// the transaction whose row locks keep other relays off them);
/// [`mark`](Self::mark) records what the broker did with them and ends the
/// lease; dropping a lease unmarked gives its rows back, still pending,
/// with no attempt spent.
///
/// ```
/// use babel_idem::outbox::{OutboxSource, SqliteOutbox};
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let pool = sqlx::sqlite::SqlitePoolOptions::new().max_connections(1).connect("sqlite::memory:").await?;
/// let outbox: Box<dyn OutboxSource> = Box::new(SqliteOutbox::new(pool));
/// outbox.migrate().await?;
/// assert_eq!(outbox.stats().await?.pending, 0);
/// assert_eq!(outbox.table(), "babelqueue_outbox");
/// # Ok::<(), anyhow::Error>(())
/// # }).unwrap();
/// ```
pub trait OutboxSource: Send + Sync + 'static {
    /// The table the outbox uses.
    fn table(&self) -> &str;

    /// Creates the table and its index if they are missing, and nothing
    /// else; safe when many processes run it at once.
    fn migrate(&self) -> OutboxFuture<'_, ()>;

    /// How many rows each status holds, and the age of the oldest pending row.
    fn stats(&self) -> OutboxFuture<'_, OutboxStats>;

    /// Makes every `'failed'` row pending again, with its attempts back to
    /// 0 (its `last_error` stays); how many. With `dry_run`, only counts them.
    fn retry_failed(&self, dry_run: bool) -> OutboxFuture<'_, u64>;

    /// Deletes the rows published longer than `older_than` ago, `batch`
    /// rows per statement, until none is left; how many. Pending and failed
    /// rows are never touched. With `dry_run`, only counts them.
    fn purge_published(
        &self,
        older_than: Duration,
        batch: u32,
        dry_run: bool,
    ) -> OutboxFuture<'_, u64>;

    /// Whether the table exists ([`OutboxError::MissingTable`] if not) and
    /// has the `headers` column.
    fn has_headers(&self) -> OutboxFuture<'_, bool>;

    /// Up to `limit` pending rows, oldest first, past their `backoff`,
    /// held by the batch's [`Lease`]; never one of `in_flight` (rows
    /// published whose mark may still be committing). With `headers`, each
    /// row's `headers` column is read. A row that cannot be published as
    /// it stands comes back among the batch's unreadable rows instead of
    /// failing the read.
    fn take<'a>(
        &'a self,
        limit: u32,
        backoff: Backoff,
        headers: bool,
        in_flight: &'a [i64],
    ) -> OutboxFuture<'a, Batch>;

    /// Records what became of a batch, in one transaction, and ends its
    /// `lease`: see [`Marks`].
    fn mark<'a>(&'a self, lease: Lease, marks: Marks<'a>) -> OutboxFuture<'a, ()>;

    /// How an idle relay learns that rows were written; by default, the
    /// poll alone.
    fn wakeup(&self) -> Pin<Box<dyn Future<Output = Box<dyn Wakeup>> + Send + '_>> {
        Box::pin(std::future::ready(Box::new(PollOnly) as Box<dyn Wakeup>))
    }
}

/// Waits until rows may have been written: a relay's idle wait.
///
/// ```
/// use babel_idem::outbox::Wakeup;
/// use std::future::Future;
/// use std::pin::Pin;
/// use std::time::Duration;
///
/// /// Looks again at every poll, and nothing else.
/// struct Sleep;
///
/// impl Wakeup for Sleep {
///     fn wait(&mut self, poll: Duration) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
///         Box::pin(tokio::time::sleep(poll))
///     }
/// }
/// ```
pub trait Wakeup: Send {
    /// Completes on a wake-up or after `poll`, whichever comes first.
    fn wait(&mut self, poll: Duration) -> Pin<Box<dyn Future<Output = ()> + Send + '_>>;
}

/// The poll alone: an idle relay with notifications off, or on an outbox
/// nothing wakes.
struct PollOnly;

impl Wakeup for PollOnly {
    fn wait(&mut self, poll: Duration) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(tokio::time::sleep(poll))
    }
}

/// What holds the rows of a [`Batch`] until they are marked: on
/// PostgreSQL the transaction that took them, locked against the other
/// relays; nothing on SQLite, whose single relay skips the rows in flight.
/// Dropping it unmarked gives the rows back, still pending.
///
/// ```
/// use babel_idem::outbox::Lease;
///
/// let lease = Lease::new(7_u32);
/// assert_eq!(lease.into_held::<u32>(), Some(7));
/// assert_eq!(Lease::none().into_held::<u32>(), None);
/// ```
pub struct Lease(Option<Box<dyn Any + Send>>);

impl Lease {
    /// A lease that holds nothing.
    pub fn none() -> Self {
        Lease(None)
    }

    /// A lease holding `held` until the batch is marked or dropped.
    pub fn new<T: Any + Send>(held: T) -> Self {
        Lease(Some(Box::new(held)))
    }

    /// What the lease holds, if it is a `T`.
    pub fn into_held<T: Any>(self) -> Option<T> {
        self.0?.downcast().ok().map(|held| *held)
    }
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Lease(held)"
        } else {
            "Lease(none)"
        })
    }
}

/// The rows one [`OutboxSource::take`] handed out: those to publish, those
/// it cannot read (each id with why; the relay sets them `'failed'`), and
/// the [`Lease`] that holds them.
///
/// ```
/// use babel_idem::outbox::{Batch, Lease};
///
/// let batch = Batch::new(Vec::new(), vec![(3, "the body is NULL".to_owned())], Lease::none());
/// assert_eq!(batch.len(), 1);
/// assert_eq!(batch.ids(), [3]);
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub struct Batch {
    /// The rows to publish, oldest first.
    pub rows: Vec<PendingRow>,
    /// The rows that cannot be published as they stand, each id with why.
    pub unreadable: Vec<(i64, String)>,
    /// What holds the rows until they are marked.
    pub lease: Lease,
}

impl Batch {
    /// A batch of `rows` and `unreadable` rows held by `lease`.
    pub fn new(rows: Vec<PendingRow>, unreadable: Vec<(i64, String)>, lease: Lease) -> Self {
        Batch {
            rows,
            unreadable,
            lease,
        }
    }

    /// Every row taken, readable or not.
    pub fn len(&self) -> usize {
        self.rows.len() + self.unreadable.len()
    }

    /// Whether no row was taken.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The ids of every row taken.
    pub fn ids(&self) -> Vec<i64> {
        let readable = self.rows.iter().map(|row| row.id);
        readable
            .chain(self.unreadable.iter().map(|(id, _)| *id))
            .collect()
    }

    /// The batch of rows read by [`PendingRow::read`], held by `lease`.
    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    fn read(
        rows: impl IntoIterator<Item = Result<PendingRow, (i64, String)>>,
        lease: Lease,
    ) -> Self {
        let mut batch = Batch::new(Vec::new(), Vec::new(), lease);
        for row in rows {
            match row {
                Ok(row) => batch.rows.push(row),
                Err(unreadable) => batch.unreadable.push(unreadable),
            }
        }
        batch
    }
}

/// What became of a [`Batch`], for [`OutboxSource::mark`]: each of
/// `published` is marked published; each of `refused` gets an attempt, its
/// error (at most [`MAX_ERROR_CHARS`]) and its failure time, and is
/// `'failed'` once it reached `max_attempts`; each of `unreadable` likewise
/// and `'failed'` at once (trying it again cannot help).
///
/// ```
/// use babel_idem::outbox::Marks;
///
/// let refused = [(2, "refused".to_owned())];
/// let marks = Marks { published: &[1], refused: &refused, unreadable: &[], max_attempts: 10 };
/// assert_eq!(marks.failures().count(), 1);
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Marks<'a> {
    /// The rows the broker accepted.
    pub published: &'a [i64],
    /// The rows the broker refused, each with its error.
    pub refused: &'a [(i64, String)],
    /// The rows that cannot be read, each with why.
    pub unreadable: &'a [(i64, String)],
    /// The refusals after which a row is `'failed'`.
    pub max_attempts: u32,
}

impl<'a> Marks<'a> {
    /// Every failure: each id with its error (cut to [`MAX_ERROR_CHARS`])
    /// and whether the row is unreadable.
    pub fn failures(&self) -> impl Iterator<Item = (i64, String, bool)> + 'a {
        let refused = self.refused.iter().map(|failure| (failure, false));
        let unreadable = self.unreadable.iter().map(|failure| (failure, true));
        refused
            .chain(unreadable)
            .map(|((id, error), unreadable)| (*id, truncated(error), unreadable))
    }
}

/// Checks a table name: a plain identifier, so it can be written into the
/// statements as text.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
fn checked_table(table: &str) -> Result<String, OutboxError> {
    let mut chars = table.chars();
    let plain = matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && table.len() <= MAX_TABLE_LEN;
    if plain {
        Ok(table.to_owned())
    } else {
        Err(OutboxError::InvalidTable {
            table: table.to_owned(),
        })
    }
}

/// `error` cut to [`MAX_ERROR_CHARS`] characters.
fn truncated(error: &str) -> String {
    error.chars().take(MAX_ERROR_CHARS).collect()
}

/// The headers a row carries, as the `headers` column holds them: a JSON
/// object of strings, or `NULL` when there are none.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
fn headers_json(headers: &[(String, String)]) -> Option<String> {
    if headers.is_empty() {
        return None;
    }
    let object: serde_json::Map<String, serde_json::Value> = headers
        .iter()
        .map(|(name, value)| (name.clone(), serde_json::Value::from(value.as_str())))
        .collect();
    Some(serde_json::Value::Object(object).to_string())
}

/// The `headers` column read back: `NULL` (or JSON `null`) is no header;
/// anything but a JSON object of strings is why the row cannot be read.
fn headers_from_json(json: Option<&str>) -> Result<Vec<(String, String)>, String> {
    const NOT_AN_OBJECT: &str = "the headers column is not a JSON object of strings";
    let object = match json.map(serde_json::from_str) {
        None | Some(Ok(serde_json::Value::Null)) => return Ok(Vec::new()),
        Some(Ok(serde_json::Value::Object(object))) => object,
        Some(_) => return Err(NOT_AN_OBJECT.to_owned()),
    };
    object
        .into_iter()
        .map(|(name, value)| match value {
            serde_json::Value::String(value) => Ok((name, value)),
            _ => Err(format!("{NOT_AN_OBJECT}: {name:?} is not a string")),
        })
        .collect()
}

/// One pending row as the relay takes it.
///
/// ```
/// use babel_idem::outbox::PendingRow;
///
/// let row = PendingRow::read(7, Some(b"orders".to_vec()), Some(b"{}".to_vec()), 0, None).unwrap();
/// assert_eq!((row.queue.as_str(), row.body.as_str()), ("orders", "{}"));
/// let (id, reason) = PendingRow::read(7, None, Some(b"{}".to_vec()), 0, None).unwrap_err();
/// assert_eq!((id, reason.as_str()), (7, "the queue is NULL"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PendingRow {
    /// The row's id.
    pub id: i64,
    /// The queue it goes to.
    pub queue: String,
    /// The body, published byte for byte.
    pub body: String,
    /// The refusals it met so far.
    pub attempts: i64,
    /// The transport headers published beside the body.
    pub headers: Vec<(String, String)>,
}

impl PendingRow {
    /// The columns of a row, as the database gave them, made a
    /// [`PendingRow`]; or, for a row the relay cannot publish as it stands
    /// (a queue or body that is `NULL` or not UTF-8 text, headers that do
    /// not parse), its id and why. Such a row is the row's own fault: it
    /// is set `'failed'` with that reason, and the rows around it go on.
    pub fn read(
        id: i64,
        queue: Option<Vec<u8>>,
        body: Option<Vec<u8>>,
        attempts: i64,
        headers: Option<Vec<u8>>,
    ) -> Result<PendingRow, (i64, String)> {
        let text = |column: &str, bytes: Option<Vec<u8>>| match bytes {
            None => Err(format!("the {column} is NULL")),
            Some(bytes) => String::from_utf8(bytes).map_err(|error| {
                format!(
                    "the {column} is not UTF-8 text (an invalid byte at offset {})",
                    error.utf8_error().valid_up_to()
                )
            }),
        };
        let read = || {
            let queue = text("queue", queue)?;
            let body = text("body", body)?;
            let headers = match headers {
                None => Vec::new(),
                Some(bytes) => {
                    let json = String::from_utf8(bytes)
                        .map_err(|_| "the headers column is not UTF-8 text".to_owned())?;
                    headers_from_json(Some(&json))?
                }
            };
            Ok(PendingRow {
                id,
                queue,
                body,
                attempts,
                headers,
            })
        };
        read().map_err(|reason: String| (id, reason))
    }
}

/// The relay's per-row backoff: a row that failed `attempts` times waits
/// `step * attempts`, at most `cap`, after its last failure (the family's
/// 50 ms per prior attempt, capped at 5 s).
///
/// ```
/// use babel_idem::outbox::Backoff;
/// use std::time::Duration;
///
/// let backoff = Backoff::default();
/// assert_eq!((backoff.step, backoff.cap), (Duration::from_millis(50), Duration::from_secs(5)));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    /// The wait per attempt so far.
    pub step: Duration,
    /// The longest wait.
    pub cap: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            step: Duration::from_millis(50),
            cap: Duration::from_secs(5),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_cut_to_five_hundred_characters() {
        let long = "é".repeat(800);
        assert_eq!(truncated(&long).chars().count(), MAX_ERROR_CHARS);
        assert_eq!(truncated("short"), "short");
    }

    #[test]
    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    fn only_plain_identifiers_name_a_table() {
        assert!(checked_table("babelqueue_outbox").is_ok());
        assert!(checked_table("x; DROP TABLE y").is_err());
        assert!(checked_table("1outbox").is_err());
        assert!(checked_table(&"a".repeat(49)).is_err());
    }

    #[test]
    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    fn headers_round_trip_through_their_column() {
        {
            let headers = vec![("traceparent".to_owned(), "00-a-b-01".to_owned())];
            let json = headers_json(&headers);
            assert_eq!(headers_from_json(json.as_deref()), Ok(headers));
            assert_eq!(headers_json(&[]), None);
        }
        assert!(headers_from_json(Some("[1]")).is_err());
        assert!(headers_from_json(Some(r#"{"a":1}"#)).is_err());
        assert!(headers_from_json(Some("not json")).is_err());
        assert_eq!(headers_from_json(None), Ok(Vec::new()));
        assert_eq!(headers_from_json(Some("null")), Ok(Vec::new()));
    }

    #[test]
    fn a_row_that_is_not_text_is_unreadable_with_its_reason() {
        let row = |body: &[u8], headers: Option<&[u8]>| {
            PendingRow::read(
                7,
                Some(b"orders".to_vec()),
                Some(body.to_vec()),
                0,
                headers.map(<[u8]>::to_vec),
            )
        };
        let read = row(b"{}", Some(br#"{"traceparent":"00-a-b-01"}"#)).unwrap();
        assert_eq!((read.body.as_str(), read.headers.len()), ("{}", 1));
        let (id, reason) = row(b"{\"a\":\"\xff\"}", None).unwrap_err();
        assert_eq!(id, 7);
        assert!(reason.starts_with("the body is not UTF-8 text"), "{reason}");
        assert!(reason.contains("offset 6"), "{reason}");
        let (_, reason) = row(b"{}", Some(b"\xc3\x28")).unwrap_err();
        assert_eq!(reason, "the headers column is not UTF-8 text");
        let (_, reason) = PendingRow::read(7, None, Some(b"{}".to_vec()), 0, None).unwrap_err();
        assert_eq!(reason, "the queue is NULL");
    }

    #[test]
    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    fn only_the_databases_own_state_is_an_outage() {
        let outage = |error: sqlx::Error| database("take")(error).is_outage();
        assert!(outage(sqlx::Error::PoolTimedOut));
        assert!(outage(sqlx::Error::Io(
            std::io::ErrorKind::ConnectionReset.into()
        )));
        assert!(!outage(sqlx::Error::PoolClosed));
        assert!(!outage(sqlx::Error::RowNotFound));
        assert!(
            !OutboxError::MissingTable {
                table: "t".to_owned()
            }
            .is_outage()
        );
    }
}
