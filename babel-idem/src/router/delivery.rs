//! [`Delivery`]: what the transport knows about one delivery, beside the body.

use crate::builders::setters;

/// The facts a broker loop knows about one delivery: the queue it came from,
/// the attempts made before it and the transport headers. A handler of the
/// shape `async fn(Envelope, Delivery)` receives it.
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
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Delivery {
    queue: Option<String>,
    attempts: Option<u64>,
    headers: Vec<(String, String)>,
}

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

    /// The transport's attempts, if it gave any.
    pub(crate) fn transport_attempts(&self) -> Option<u64> {
        self.attempts
    }

    /// Records the attempts dispatch counted with, so the handler sees them.
    pub(crate) fn set_attempts(&mut self, attempts: u64) {
        self.attempts = Some(attempts);
    }
}
