//! The BabelQueue wire envelope, `schema_version` 1.
//!
//! Decoding checks the consumer's rejection rules (an unknown
//! `meta.schema_version`, no `job`/`urn`, a blank `trace_id`, `data` that is
//! not an object) and reports which one failed as an [`EnvelopeError`].
//! Fields this crate does not know are kept, so a decoded envelope encodes
//! back without losing anything.
//!
//! Re-encoding is faithful: [`Envelope::to_vec`] writes a decoded envelope
//! back as the bytes it came from (in compact form), except for the members
//! the code changed. Key order, number spelling (`1e-07`), `null` members
//! and unknown fields all survive; setting `attempts` or adding a
//! `dead_letter` block changes only those members.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::de::Error as _;
use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value};

use crate::builders::setters;
use crate::message::MessageId;

mod decode;
mod encode;
mod error;
mod integer;
mod members;
mod produce;
pub(crate) mod raw;
#[cfg(feature = "schema")]
mod schema;
pub(crate) mod typed;

pub use error::EnvelopeError;
pub use integer::{IntegerProblem, MAX_INTEGER};
pub use produce::ProduceError;
pub use typed::DataError;

/// The only `meta.schema_version` this crate reads and writes.
pub const SCHEMA_VERSION: u64 = 1;

/// The `meta.lang` this crate writes on the envelopes it produces.
pub const LANG: &str = "rust";

/// One BabelQueue message: the URN that routes it, its payload and its metadata.
///
/// ```
/// use babel_idem::{Envelope, MessageId};
///
/// let bytes = br#"{
///     "job": "urn:babel:orders:created",
///     "trace_id": "7b3f9c2a-e41d-4f88-9b2a-1c0d5e6f7a8b",
///     "data": {"order_id": 1042},
///     "meta": {"id": "f1e2d3c4-b5a6-4789-90ab-cdef01234567", "queue": "orders",
///              "lang": "php", "schema_version": 1, "created_at": 1749132727000},
///     "attempts": 0
/// }"#;
/// let env = Envelope::from_slice(bytes)?;
/// assert_eq!(env.urn(), "urn:babel:orders:created");
/// assert_eq!(env.data["order_id"], 1042);
/// assert_eq!(env.message_id(), Some("f1e2d3c4-b5a6-4789-90ab-cdef01234567"));
/// # Ok::<(), babel_idem::EnvelopeError>(())
/// ```
///
/// Two envelopes are equal when their fields are; the text an envelope was
/// decoded from (kept for faithful re-encoding) takes no part.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Envelope {
    /// The message URN (`job` on the wire; `urn` is accepted as an alias).
    pub job: String,
    /// The causal chain this message belongs to. Never the dedupe key.
    pub trace_id: String,
    /// The business payload, always a JSON object.
    pub data: Map<String, Value>,
    /// Producer-set metadata, including the message id.
    pub meta: Meta,
    /// How many times the message was delivered and failed before.
    pub attempts: u64,
    /// Present only on a message that sits on a dead-letter queue.
    pub dead_letter: Option<DeadLetter>,
    /// Top-level fields this crate does not know, kept for re-encoding.
    pub extra: Map<String, Value>,
    /// The text this envelope was decoded from.
    source: Source,
}

/// The JSON text a decoded envelope came from, if it was decoded from text:
/// re-encoding writes every member the code did not change as this text
/// spells it. It is no part of the envelope's value: any two are equal.
#[derive(Clone, Default)]
struct Source(Option<Arc<str>>);

impl PartialEq for Source {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl fmt::Debug for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Some(text) => write!(f, "Some(Source({} bytes))", text.len()),
            None => f.write_str("None"),
        }
    }
}

/// The envelope's `meta` block.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Meta {
    /// The identity of this one message; `None` when absent or `null`.
    pub id: Option<String>,
    /// The logical queue name.
    pub queue: String,
    /// The producer's language tag (`php`, `go`, `python`, ...).
    pub lang: String,
    /// Always [`SCHEMA_VERSION`] on a decoded envelope.
    pub schema_version: u64,
    /// Production time, Unix epoch milliseconds.
    pub created_at: u64,
    /// `meta` fields this crate does not know, kept for re-encoding.
    pub extra: Map<String, Value>,
}

/// The `dead_letter` block a message carries on a dead-letter queue.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct DeadLetter {
    /// Why the message was dead-lettered.
    pub reason: DeadLetterReason,
    /// A human-readable error, if any.
    pub error: Option<String>,
    /// The failing SDK's exception or error type name, if any.
    pub exception: Option<String>,
    /// Dead-letter time, Unix epoch milliseconds.
    pub failed_at: u64,
    /// The queue the message was consumed from.
    pub original_queue: String,
    /// Delivery attempts made before dead-lettering.
    pub attempts: u64,
    /// The language of the SDK that dead-lettered the message, if given.
    pub lang: Option<String>,
    /// `dead_letter` fields this crate does not know, kept for re-encoding.
    pub extra: Map<String, Value>,
}

/// The contract's reasons for dead-lettering a message.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DeadLetterReason {
    /// The handler kept failing until the attempts ran out.
    Failed,
    /// No handler is registered for the message's URN.
    UnknownUrn,
    /// The bytes are not a valid envelope.
    Poison,
    /// A reason a newer SDK wrote; kept verbatim.
    Other(String),
}

impl DeadLetterReason {
    /// The reason as the wire spells it.
    ///
    /// ```
    /// assert_eq!(babel_idem::envelope::DeadLetterReason::UnknownUrn.as_str(), "unknown_urn");
    /// ```
    pub fn as_str(&self) -> &str {
        match self {
            DeadLetterReason::Failed => "failed",
            DeadLetterReason::UnknownUrn => "unknown_urn",
            DeadLetterReason::Poison => "poison",
            DeadLetterReason::Other(other) => other,
        }
    }

    fn from_wire(reason: &str) -> Self {
        match reason {
            "failed" => DeadLetterReason::Failed,
            "unknown_urn" => DeadLetterReason::UnknownUrn,
            "poison" => DeadLetterReason::Poison,
            other => DeadLetterReason::Other(other.to_owned()),
        }
    }
}

impl fmt::Display for DeadLetterReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Envelope {
    /// Mints a producer envelope: fresh UUID v4 `meta.id` and `trace_id`,
    /// `created_at` now, `attempts` 0, `meta.lang` [`LANG`].
    ///
    /// ```
    /// use babel_idem::{Envelope, MessageId};
    /// use serde_json::json;
    ///
    /// let env = Envelope::new("urn:babel:orders:created", json!({"order_id": 7}))
    ///     .with_queue("orders");
    /// assert_eq!(env.urn(), "urn:babel:orders:created");
    /// assert_eq!(env.message_id().map(str::len), Some(36));
    /// ```
    ///
    /// `data` that is not a JSON object is kept under the key `value`, so the
    /// envelope stays valid; pass an object to control the payload's shape.
    pub fn new(urn: impl Into<String>, data: Value) -> Self {
        let data = match data {
            Value::Object(map) => map,
            other => Map::from_iter([("value".to_owned(), other)]),
        };
        Envelope {
            job: urn.into(),
            trace_id: uuid::Uuid::new_v4().to_string(),
            data,
            meta: Meta {
                id: Some(uuid::Uuid::new_v4().to_string()),
                queue: "default".to_owned(),
                lang: LANG.to_owned(),
                schema_version: SCHEMA_VERSION,
                created_at: now_millis(),
                extra: Map::new(),
            },
            attempts: 0,
            dead_letter: None,
            extra: Map::new(),
            source: Source::default(),
        }
    }

    /// Sets `meta.id` (an empty id makes the message impossible to dedupe).
    pub fn with_id(mut self, id: impl Into<String>) -> Self {
        self.meta.id = Some(id.into());
        self
    }

    /// Removes `meta.id`, as a producer that sets none would.
    pub fn without_id(mut self) -> Self {
        self.meta.id = None;
        self
    }

    setters! {
        /// Sets `trace_id`, to continue an existing causal chain.
        pub fn with_trace_id(trace_id: impl Into<String>) => self.trace_id = trace_id.into();
    }

    /// Sets `meta.queue`.
    pub fn with_queue(mut self, queue: impl Into<String>) -> Self {
        self.meta.queue = queue.into();
        self
    }

    setters! {
        /// Sets `attempts`.
        pub fn with_attempts(attempts: u64) => self.attempts;
    }

    /// Decodes and checks an envelope from JSON bytes.
    ///
    /// The envelope keeps a copy of `bytes`, so that [`Envelope::to_vec`]
    /// writes back what it did not change exactly as it came.
    ///
    /// ```
    /// use babel_idem::{Envelope, EnvelopeError};
    ///
    /// let err = Envelope::from_slice(br#"{"trace_id": "t", "data": {}, "meta": {"schema_version": 1}}"#)
    ///     .unwrap_err();
    /// assert!(matches!(err, EnvelopeError::MissingUrn));
    /// ```
    pub fn from_slice(bytes: &[u8]) -> Result<Self, EnvelopeError> {
        match std::str::from_utf8(bytes) {
            Ok(text) => Self::from_text(text),
            // Not UTF-8, so not JSON: the parser says where and why.
            Err(_) => match serde_json::from_slice::<Value>(bytes) {
                Err(error) => Err(EnvelopeError::NotJson(error)),
                Ok(value) => Self::from_value(value),
            },
        }
    }

    /// Checks and takes apart an already parsed JSON value.
    ///
    /// A [`Value`] no longer knows how its text was spelled (key order,
    /// `1e-07`, `-0`), so the envelope re-encodes in the canonical layout;
    /// decode from bytes to re-encode faithfully.
    pub fn from_value(value: Value) -> Result<Self, EnvelopeError> {
        decode::envelope(value, None)
    }

    fn from_text(text: &str) -> Result<Self, EnvelopeError> {
        let mut envelope = decode::text(text)?;
        envelope.source = Source(Some(Arc::from(text)));
        Ok(envelope)
    }

    /// The message URN, whichever of `job` or `urn` carried it.
    pub fn urn(&self) -> &str {
        &self.job
    }

    /// Encodes the envelope as compact JSON bytes (`job`, never the `urn`
    /// alias).
    ///
    /// An envelope decoded from bytes comes back as those bytes, in compact
    /// form, apart from the members the code changed: each changed member is
    /// written in its old place, a new one is appended, a removed one is left
    /// out. Every other envelope, and the [`Serialize`](serde::Serialize)
    /// impl, write the canonical layout (`job`, `trace_id`, `data`, `meta`,
    /// `attempts`, `dead_letter`, then unknown fields).
    ///
    /// ```
    /// use babel_idem::Envelope;
    ///
    /// let python = r#"{"job":"urn:babel:orders:created","trace_id":"t","data":{"z":1e-07,"a":null},"meta":{"id":null,"queue":"orders","lang":"python","schema_version":1,"created_at":1749132727000},"attempts":0}"#;
    /// let mut envelope: Envelope = python.parse()?;
    /// assert_eq!(envelope.to_vec(), python.as_bytes());
    ///
    /// envelope.attempts += 1;
    /// assert_eq!(envelope.to_vec(), python.replace(r#""attempts":0"#, r#""attempts":1"#).as_bytes());
    /// # Ok::<(), babel_idem::EnvelopeError>(())
    /// ```
    pub fn to_vec(&self) -> Vec<u8> {
        encode::envelope(self)
    }

    /// Encodes the envelope as a JSON value.
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

impl FromStr for Envelope {
    type Err = EnvelopeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::from_text(s)
    }
}

impl TryFrom<&[u8]> for Envelope {
    type Error = EnvelopeError;

    fn try_from(bytes: &[u8]) -> Result<Self, Self::Error> {
        Self::from_slice(bytes)
    }
}

impl MessageId for Envelope {
    #[inline]
    fn message_id(&self) -> Option<&str> {
        self.meta.message_id()
    }
}

impl MessageId for Meta {
    #[inline]
    fn message_id(&self) -> Option<&str> {
        self.id.as_deref().filter(|id| !id.is_empty())
    }
}

impl DeadLetter {
    /// A dead-letter block stamped now.
    ///
    /// ```
    /// use babel_idem::envelope::DeadLetter;
    /// use babel_idem::envelope::DeadLetterReason;
    ///
    /// let block = DeadLetter::new(DeadLetterReason::Failed, "orders", 3)
    ///     .with_error("payment gateway timeout");
    /// assert_eq!(block.reason.as_str(), "failed");
    /// ```
    pub fn new(reason: DeadLetterReason, original_queue: impl Into<String>, attempts: u64) -> Self {
        DeadLetter {
            reason,
            error: None,
            exception: None,
            failed_at: now_millis(),
            original_queue: original_queue.into(),
            attempts,
            lang: Some(LANG.to_owned()),
            extra: Map::new(),
        }
    }

    setters! {
        /// Sets the human-readable error.
        pub fn with_error(error: impl Into<String>) => self.error = Some(error.into());

        /// Sets the error type name.
        pub fn with_exception(exception: impl Into<String>) => self.exception = Some(exception.into());
    }
}

fn now_millis() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| elapsed.as_millis() as u64)
        .unwrap_or(0)
}

/// Applies the same rules as [`Envelope::from_value`]; like it, the result
/// re-encodes in the canonical layout (a deserializer hands over values, not
/// their text).
impl<'de> Deserialize<'de> for Envelope {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(deserializer)?;
        Envelope::from_value(value).map_err(D::Error::custom)
    }
}
