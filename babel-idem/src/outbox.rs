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
//! `'failed'` status for rows the broker kept refusing; the family's relays
//! ignore both, and babel-idem's relay drains a table without them.

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

/// The `headers` column read back; a value that is not a JSON object of
/// strings carries no header.
#[cfg_attr(
    not(any(feature = "redis-transport", feature = "amqp-transport")),
    allow(dead_code, reason = "only the relay reads headers")
)]
fn headers_from_json(json: Option<&str>) -> Vec<(String, String)> {
    let Some(Ok(serde_json::Value::Object(object))) = json.map(serde_json::from_str) else {
        return Vec::new();
    };
    object
        .into_iter()
        .filter_map(|(name, value)| match value {
            serde_json::Value::String(value) => Some((name, value)),
            _ => None,
        })
        .collect()
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
            assert_eq!(headers_from_json(json.as_deref()), headers);
            assert_eq!(headers_json(&[]), None);
        }
        assert!(headers_from_json(Some("[1]")).is_empty());
        assert!(headers_from_json(None).is_empty());
    }
}
