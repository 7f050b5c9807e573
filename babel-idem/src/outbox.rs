//! The transactional outbox of the BabelQueue family (features `sqlite`,
//! `postgres`): outgoing messages written in the caller's own database
//! transaction, published afterwards by a relay. The guide page is
//! [`guide::outbox`](crate::guide::outbox).
//!
//! A producer that commits a business row and then publishes can crash in
//! between, or publish a message whose transaction rolls back. With the
//! outbox, [`save`](SqliteOutbox::save) inserts the encoded envelope into
//! the table `babelqueue_outbox` on the caller's connection, inside its
//! transaction, so the message commits or rolls back with the business
//! write; a relay then publishes every committed row, byte for byte, and
//! marks it published once the broker accepted it. The handoff is at least
//! once: a relay that dies between the publish and the mark publishes the
//! row again, with the same `meta.id`, which consumers deduplicate.
//!
//! - [`SqliteOutbox`] and `PostgresOutbox`: the table, its migration,
//!   `save`, and the operator's counts and clean-ups.
//! - `Relay` (with `redis-transport` or `amqp-transport`): drains pending
//!   rows to Redis or RabbitMQ.
//!
//! The table is the family's (the Go, Python and PHP SDKs' relays drain a
//! babel-idem outbox, and babel-idem's relay drains theirs), plus a nullable
//! `headers` column that carries the producer's W3C `traceparent` and a
//! `'failed'` status for rows the broker kept refusing or the relay cannot
//! read; the family's relays ignore both, and babel-idem's relay drains a
//! table without them.

use std::fmt;
use std::time::Duration;

use crate::envelope::ProduceError;

#[cfg(feature = "postgres")]
mod postgres;
#[cfg(any(feature = "redis-transport", feature = "amqp-transport"))]
mod relay;
#[cfg(feature = "sqlite")]
mod sqlite;

#[cfg(feature = "postgres")]
pub use postgres::PostgresOutbox;
#[cfg(any(feature = "redis-transport", feature = "amqp-transport"))]
pub use relay::{
    DEFAULT_BATCH, DEFAULT_MAX_ATTEMPTS, DEFAULT_MAX_BODY, Relay, RelayBuilder, RelayError,
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
#[derive(Debug)]
#[non_exhaustive]
pub enum OutboxError {
    /// The envelope does not encode; nothing was written.
    Envelope(ProduceError),
    /// The table name is not a plain SQL identifier of at most 48 characters.
    InvalidTable {
        /// The name given.
        table: String,
    },
    /// The outbox table does not exist in the database.
    MissingTable {
        /// The table looked for.
        table: String,
    },
    /// The database failed the operation.
    Database {
        /// What was being done (`save`, `migrate`, `stats`, ...).
        operation: &'static str,
        /// The database's error.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl fmt::Display for OutboxError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OutboxError::Envelope(error) => write!(f, "outbox: {error}"),
            OutboxError::InvalidTable { table } => write!(
                f,
                "outbox table name {table:?} is not a plain identifier of at most \
                 {MAX_TABLE_LEN} characters: letters, digits and _, not starting with a digit"
            ),
            OutboxError::MissingTable { table } => write!(
                f,
                "the outbox table {table:?} does not exist: create it with \
                 `babel-idem migrate URL --outbox` (or the outbox's `migrate()`)"
            ),
            OutboxError::Database { operation, source } => {
                write!(f, "outbox {operation} failed: {source}")
            }
        }
    }
}

impl std::error::Error for OutboxError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            OutboxError::Envelope(error) => Some(error),
            OutboxError::Database { source, .. } => Some(&**source),
            OutboxError::InvalidTable { .. } | OutboxError::MissingTable { .. } => None,
        }
    }
}

impl From<ProduceError> for OutboxError {
    fn from(error: ProduceError) -> Self {
        OutboxError::Envelope(error)
    }
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
    #[cfg_attr(
        not(any(feature = "redis-transport", feature = "amqp-transport")),
        allow(dead_code, reason = "only the relay waits out outages")
    )]
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
#[cfg_attr(
    not(any(feature = "redis-transport", feature = "amqp-transport")),
    allow(dead_code, reason = "only the relay waits out outages")
)]
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

/// Checks a table name: a plain identifier, so it can be written into the
/// statements as text.
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
#[cfg_attr(
    not(any(feature = "redis-transport", feature = "amqp-transport")),
    allow(dead_code, reason = "only the relay records errors")
)]
fn truncated(error: &str) -> String {
    error.chars().take(MAX_ERROR_CHARS).collect()
}

/// The headers a row carries, as the `headers` column holds them: a JSON
/// object of strings, or `NULL` when there are none.
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
#[cfg_attr(
    not(any(feature = "redis-transport", feature = "amqp-transport")),
    allow(dead_code, reason = "only the relay reads headers")
)]
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

/// The columns of a row the relay took, as the database gave them, made a
/// [`PendingRow`]; or, for a row the relay cannot publish as it stands
/// (a queue or body that is `NULL` or not UTF-8 text, headers that do not
/// parse), its id and why. Such a row is the row's own fault: it is set
/// `'failed'` with that reason, and the rows around it go on.
#[cfg_attr(
    not(any(feature = "redis-transport", feature = "amqp-transport")),
    allow(dead_code, reason = "only the relay takes rows")
)]
fn read_row(
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

/// The rows a relay took: those it publishes, and those it cannot read
/// (each id with why), which it sets `'failed'`.
#[cfg_attr(
    not(any(feature = "redis-transport", feature = "amqp-transport")),
    allow(dead_code, reason = "only the relay takes rows")
)]
#[derive(Debug, Default)]
struct TakenRows {
    rows: Vec<PendingRow>,
    unreadable: Vec<(i64, String)>,
}

#[cfg_attr(
    not(any(feature = "redis-transport", feature = "amqp-transport")),
    allow(dead_code, reason = "only the relay takes rows")
)]
impl FromIterator<Result<PendingRow, (i64, String)>> for TakenRows {
    fn from_iter<I: IntoIterator<Item = Result<PendingRow, (i64, String)>>>(rows: I) -> Self {
        let mut taken = TakenRows::default();
        for row in rows {
            match row {
                Ok(row) => taken.rows.push(row),
                Err(unreadable) => taken.unreadable.push(unreadable),
            }
        }
        taken
    }
}

/// One pending row as the relay takes it.
#[cfg_attr(
    not(any(feature = "redis-transport", feature = "amqp-transport")),
    allow(dead_code, reason = "only the relay takes rows")
)]
#[derive(Debug, Clone)]
struct PendingRow {
    id: i64,
    queue: String,
    body: String,
    attempts: i64,
    headers: Vec<(String, String)>,
}

/// The relay's per-row backoff: a row that failed `attempts` times waits
/// `step * attempts`, at most `cap`, after its last failure (the family's
/// 50 ms per prior attempt, capped at 5 s).
#[derive(Debug, Clone, Copy, PartialEq)]
#[cfg_attr(
    not(any(feature = "redis-transport", feature = "amqp-transport")),
    allow(dead_code, reason = "only the relay backs off")
)]
struct Backoff {
    step: Duration,
    cap: Duration,
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
    fn only_plain_identifiers_name_a_table() {
        assert!(checked_table("babelqueue_outbox").is_ok());
        assert!(checked_table("x; DROP TABLE y").is_err());
        assert!(checked_table("1outbox").is_err());
        assert!(checked_table(&"a".repeat(49)).is_err());
    }

    #[test]
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
            read_row(
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
        let (_, reason) = read_row(7, None, Some(b"{}".to_vec()), 0, None).unwrap_err();
        assert_eq!(reason, "the queue is NULL");
    }

    #[test]
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
