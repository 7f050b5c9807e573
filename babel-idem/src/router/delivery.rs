//! [`Delivery`]: what the transport knows about one delivery, beside the body,
//! and for a typed handler what the envelope said beside its `data`.

use serde_json::{Map, Value};

use crate::builders::setters;
use crate::envelope::{Envelope, Meta};
use crate::message::MessageId;

/// The transport header a redrive tool stamps on a deliberate replay (any
/// non-empty value), as in the other BabelQueue SDKs. [`Delivery::is_replay`]
/// reads it.
///
/// ```
/// assert_eq!(babel_idem::router::HEADER_REPLAY_BYPASS, "bq-replay-bypass");
/// ```
pub const HEADER_REPLAY_BYPASS: &str = "bq-replay-bypass";

/// The facts a broker loop knows about one delivery: the queue it came from,
/// the attempts made before it and the transport headers. A handler of the
/// shape `async fn(Envelope, Delivery)` receives it.
///
/// A typed handler, `async fn(OrderCreated, Delivery)`, gets only the
/// envelope's `data`, decoded; dispatch moves the rest of the envelope (its
/// URN, `trace_id` and `meta`) into the delivery, where [`urn`](Self::urn),
/// [`trace_id`](Self::trace_id) and [`meta`](Self::meta) read it. The
/// delivery is then the message's [`MessageId`] (`meta.id`), so
/// `#[idempotent]` on a typed handler dedupes on it.
///
/// ```
/// use babel_idem::Delivery;
///
/// let delivery = Delivery::new()
///     .with_queue("orders")
///     .with_attempts(2)
///     .with_header("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
/// assert_eq!(delivery.queue(), Some("orders"));
/// assert_eq!(delivery.attempts(), 2);
/// assert!(delivery.header("traceparent").is_some());
/// assert_eq!(delivery.header("missing"), None);
/// // Built by a transport, it holds nothing of the envelope yet.
/// assert_eq!(delivery.meta(), None);
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Delivery {
    queue: Option<String>,
    attempts: Option<u64>,
    headers: Vec<(String, String)>,
    /// The envelope's members beside `data`, once a typed handler's dispatch
    /// has moved them here.
    envelope: Option<EnvelopeFacts>,
}

/// What a typed handler would have read on the envelope, besides `data`.
#[derive(Debug, Clone, PartialEq)]
struct EnvelopeFacts {
    urn: String,
    trace_id: String,
    meta: Meta,
}

// Every member compares as a total equivalence: strings, numbers, and
// `serde_json` maps, whose values are `Eq`.
impl Eq for Delivery {}

impl Delivery {
    /// A delivery with no queue, no headers, and the attempts read from the
    /// envelope's own `attempts` field.
    pub fn new() -> Self {
        Delivery::default()
    }

    setters! {
        /// The queue the message was consumed from. Dispatch writes it as the
        /// dead-letter block's `original_queue` when the envelope's `meta.queue`
        /// is empty, and for bytes that are not an envelope at all.
        pub fn with_queue(queue: impl Into<String>) => self.queue = Some(queue.into());

        /// The attempts made before this delivery (0 on a first delivery), as the
        /// transport binding reconciles them: for example `max(body attempts,
        /// ApproximateReceiveCount - 1)` on SQS, the `bq-attempts` header on
        /// Kafka. Without it dispatch uses the envelope's `attempts` field, which
        /// is what the Redis binding carries.
        pub fn with_attempts(attempts: u64) => self.attempts = Some(attempts);
    }

    /// Adds one transport header (a W3C `traceparent`, a broker's native
    /// property). A header given twice keeps both values; [`header`](Self::header)
    /// returns the first.
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Moves `envelope`'s URN, `trace_id` and `meta` into this delivery and
    /// returns its `data`: what dispatch does before it decodes the data for
    /// a typed handler. Also the way to call a typed handler by hand, as a
    /// test does.
    ///
    /// ```
    /// use babel_idem::{Delivery, Envelope, MessageId};
    /// use serde_json::json;
    ///
    /// let envelope = Envelope::new("urn:babel:orders:created", json!({"order_id": 7}))
    ///     .with_id("m-1")
    ///     .with_trace_id("t-1");
    /// let (data, delivery) = Delivery::new().take_envelope(envelope);
    /// assert_eq!(data["order_id"], 7);
    /// assert_eq!(delivery.urn(), Some("urn:babel:orders:created"));
    /// assert_eq!(delivery.trace_id(), Some("t-1"));
    /// assert_eq!(delivery.message_id(), Some("m-1"));
    /// ```
    pub fn take_envelope(mut self, envelope: Envelope) -> (Map<String, Value>, Self) {
        let Envelope {
            job,
            trace_id,
            data,
            meta,
            ..
        } = envelope;
        self.envelope = Some(EnvelopeFacts {
            urn: job,
            trace_id,
            meta,
        });
        (data, self)
    }

    /// The queue the message was consumed from, if the transport said.
    pub fn queue(&self) -> Option<&str> {
        self.queue.as_deref()
    }

    /// The attempts made before this delivery. Inside a handler this is the
    /// number dispatch counted with (the transport's, else the envelope's);
    /// before dispatch it is the transport's, or 0 when it gave none.
    pub fn attempts(&self) -> u64 {
        self.attempts.unwrap_or(0)
    }

    /// The first value of the header `name` (compared ASCII
    /// case-insensitively, as transport header names are).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }

    /// Every header, in the order given.
    pub fn headers(&self) -> impl Iterator<Item = (&str, &str)> {
        self.headers
            .iter()
            .map(|(name, value)| (name.as_str(), value.as_str()))
    }

    /// Whether the delivery is an intended replay: it carries the
    /// [`HEADER_REPLAY_BYPASS`] header with a non-empty value, as a redrive
    /// stamps it. The consumer reads the same header for its
    /// `consumer::is_replay` (feature `consumer`).
    ///
    /// ```
    /// use babel_idem::Delivery;
    /// use babel_idem::router::HEADER_REPLAY_BYPASS;
    ///
    /// assert!(Delivery::new().with_header(HEADER_REPLAY_BYPASS, "1").is_replay());
    /// assert!(Delivery::new().with_header("BQ-Replay-Bypass", "yes").is_replay());
    /// assert!(!Delivery::new().with_header(HEADER_REPLAY_BYPASS, "").is_replay());
    /// assert!(!Delivery::new().is_replay());
    /// ```
    pub fn is_replay(&self) -> bool {
        self.headers().any(|(name, value)| {
            name.eq_ignore_ascii_case(HEADER_REPLAY_BYPASS) && !value.is_empty()
        })
    }

    /// The envelope's URN (its `job`), once dispatch has given this delivery
    /// to a typed handler; `None` before, and for a handler that takes the
    /// [`Envelope`] itself.
    ///
    /// ```
    /// use babel_idem::{Delivery, Envelope};
    /// use serde_json::json;
    ///
    /// assert_eq!(Delivery::new().urn(), None);
    /// let envelope = Envelope::new("urn:babel:orders:created", json!({})).with_trace_id("t-1");
    /// let (_, delivery) = Delivery::new().take_envelope(envelope);
    /// assert_eq!(delivery.urn(), Some("urn:babel:orders:created"));
    /// assert_eq!(delivery.trace_id(), Some("t-1"));
    /// ```
    pub fn urn(&self) -> Option<&str> {
        self.envelope.as_ref().map(|facts| facts.urn.as_str())
    }

    /// The envelope's `trace_id`, the causal chain the message belongs to;
    /// set as [`urn`](Self::urn) is (whose example reads both).
    pub fn trace_id(&self) -> Option<&str> {
        self.envelope.as_ref().map(|facts| facts.trace_id.as_str())
    }

    /// The envelope's `meta` block (its `id`, `queue`, `lang`, `created_at`
    /// and the fields this crate does not know); set as [`urn`](Self::urn) is.
    ///
    /// ```
    /// use babel_idem::{Delivery, Envelope};
    /// use serde_json::json;
    ///
    /// let envelope = Envelope::new("urn:babel:orders:created", json!({})).with_queue("orders");
    /// let (_, delivery) = Delivery::new().take_envelope(envelope);
    /// let meta = delivery.meta().expect("taken from the envelope");
    /// assert_eq!(meta.queue, "orders");
    /// assert_eq!(meta.lang, "rust");
    /// ```
    pub fn meta(&self) -> Option<&Meta> {
        self.envelope.as_ref().map(|facts| &facts.meta)
    }

    /// The transport's attempts, if it gave any.
    pub(crate) fn transport_attempts(&self) -> Option<u64> {
        self.attempts
    }

    /// Records the attempts dispatch counted with, so the handler sees them.
    pub(crate) fn set_attempts(&mut self, attempts: u64) {
        self.attempts = Some(attempts);
    }
}

/// A typed handler's delivery carries the message id: the envelope's
/// `meta.id` (`None` when absent or empty, and before dispatch has moved the
/// envelope's `meta` in). So `#[idempotent]` dedupes a typed handler on its
/// `Delivery` parameter.
///
/// ```
/// use babel_idem::{Delivery, Envelope, MessageId};
/// use serde_json::json;
///
/// let envelope = Envelope::new("urn:babel:orders:created", json!({})).with_id("m-7");
/// let (_, delivery) = Delivery::new().take_envelope(envelope);
/// assert_eq!(delivery.message_id(), Some("m-7"));
/// assert_eq!(Delivery::new().message_id(), None);
/// ```
impl MessageId for Delivery {
    #[inline]
    fn message_id(&self) -> Option<&str> {
        self.meta().and_then(MessageId::message_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_typed_handlers_delivery_holds_what_the_envelope_said_beside_data() {
        let envelope = Envelope::new("urn:babel:orders:created", serde_json::json!({"a": 1}))
            .with_id("")
            .with_trace_id("t-9")
            .with_queue("orders");
        let (data, delivery) = Delivery::new().with_attempts(2).take_envelope(envelope);
        assert_eq!(data.len(), 1);
        assert_eq!(delivery.urn(), Some("urn:babel:orders:created"));
        assert_eq!(delivery.trace_id(), Some("t-9"));
        assert_eq!(
            delivery.meta().map(|meta| meta.queue.as_str()),
            Some("orders")
        );
        // An empty id cannot be deduplicated, as on the envelope.
        assert_eq!(delivery.message_id(), None);
        // The transport's facts are kept.
        assert_eq!(delivery.attempts(), 2);
    }
}
