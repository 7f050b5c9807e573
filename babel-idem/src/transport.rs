//! Transports: how a [`Consumer`](crate::consumer::Consumer) reserves deliveries from a
//! broker and settles them (feature `consumer`; each broker binding behind its
//! own feature).
//!
//! A transport only moves bytes: it reserves, and it carries out the
//! [`Settlement`] the consumer chose. It never decides idempotency (that is
//! the guard's) nor what a failure means (that is the router's).
//!
//! - [`Transport`]: the trait a broker binding implements.
//! - [`TransportBuilder`]: configures a binding before it connects; the
//!   settings every binding shares (timeouts, reconnects) live there, the
//!   binding's own beside them.
//! - `RedisTransport` (feature `redis-transport`): the BabelQueue Redis
//!   binding, legacy layout, byte-compatible with the Python SDK.
//! - `AmqpTransport` (feature `amqp-transport`): the BabelQueue RabbitMQ
//!   (AMQP 0-9-1) binding, byte-compatible with the Python SDK.

use std::error::Error as StdError;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

#[cfg(feature = "redis-transport")]
mod redis;

#[cfg(feature = "redis-transport")]
pub use self::redis::{RedisHandle, RedisOptions, RedisTransport, RedisTransportBuilder};

#[cfg(feature = "amqp-transport")]
mod amqp;

#[cfg(feature = "amqp-transport")]
pub use self::amqp::{AmqpHandle, AmqpOptions, AmqpTransport, AmqpTransportBuilder};

/// The future a [`Transport`] operation returns.
pub type TransportFuture<'a, T> =
    Pin<Box<dyn Future<Output = Result<T, TransportError>> + Send + 'a>>;

/// A broker binding: reserves deliveries from a queue and settles them.
///
/// A reservation is *not* an ack: until [`settle`](Transport::settle) runs,
/// the delivery stays with the broker, so a worker that dies leaves it for
/// the broker's recovery (a sweep, a visibility timeout, a lost channel).
pub trait Transport: Send + Sync + 'static {
    /// What the transport needs to settle one reservation later.
    type Handle: Send + Sync + 'static;

    /// Checks that `queue` is a name this transport's layout can hold.
    fn check_queue(&self, queue: &str) -> Result<(), TransportError>;

    /// Reserves up to `max` deliveries from `queue` (fewer, or none, when the
    /// queue has fewer). Returns at once when the queue is empty: the
    /// consumer decides how long to wait before it asks again.
    fn reserve<'a>(
        &'a self,
        queue: &'a str,
        max: usize,
    ) -> TransportFuture<'a, Vec<Reserved<Self::Handle>>>;

    /// Settles one reservation. `Ok(true)` when it settled; `Ok(false)` when
    /// the reservation had already lapsed (the broker took it back for
    /// redelivery), in which case nothing was touched.
    fn settle<'a>(
        &'a self,
        handle: &'a Self::Handle,
        settlement: &'a Settlement,
    ) -> TransportFuture<'a, bool>;

    /// How long a reservation lasts at least before the broker takes it
    /// back for redelivery, or `None` (the default) when it does not lapse
    /// on its own. The consumer holds a delivery through its retry backoff, so
    /// [`ConsumerBuilder::build`](crate::consumer::ConsumerBuilder::build)
    /// refuses a router whose longest backoff is as long.
    fn reservation_lifetime(&self) -> Option<Duration> {
        None
    }
}

/// Configures a transport before it connects: the settings every broker
/// binding shares, and the binding's own (`O`: `RedisOptions` for
/// `RedisTransportBuilder`, `AmqpOptions` for `AmqpTransportBuilder`, whose
/// setters are methods of this type too).
///
/// Made by `RedisTransport::builder()` or `AmqpTransport::builder()`; the
/// shared setters and the binding's own chain in any order.
///
/// ```no_run
/// # #[cfg(feature = "redis-transport")]
/// # async fn run() -> Result<(), babel_idem::transport::TransportError> {
/// use babel_idem::transport::RedisTransport;
/// use std::time::Duration;
///
/// let transport = RedisTransport::builder()
///     .timeout(Duration::from_secs(2)) // shared by every binding
///     .reconnect_attempts(5) // shared by every binding
///     .retry_after(Duration::from_secs(30)) // the Redis binding's own
///     .connect("redis://127.0.0.1:6379/0")
///     .await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
#[cfg_attr(
    not(any(feature = "redis-transport", feature = "amqp-transport")),
    allow(dead_code, reason = "only a broker binding reads its settings")
)]
pub struct TransportBuilder<O> {
    timeout: Duration,
    reconnect_attempts: usize,
    options: O,
}

impl<O: Default> Default for TransportBuilder<O> {
    /// A 5 s timeout, 3 reconnect attempts, the binding's own defaults.
    fn default() -> Self {
        TransportBuilder {
            timeout: Duration::from_secs(5),
            reconnect_attempts: 3,
            options: O::default(),
        }
    }
}

impl<O> TransportBuilder<O> {
    /// How long connecting, and then each broker operation, may take
    /// (default 5 s).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// How many times a lost connection is re-opened, with backoff, before an
    /// operation fails (default 3). The next operation tries again.
    pub fn reconnect_attempts(mut self, attempts: usize) -> Self {
        self.reconnect_attempts = attempts;
        self
    }
}

/// One reserved delivery.
#[derive(Debug)]
pub struct Reserved<H> {
    /// The message body as the producer wrote it (unframed when the transport
    /// carries headers beside it).
    pub body: Vec<u8>,
    /// The transport headers that came with it, in the order given.
    pub headers: Vec<(String, String)>,
    /// The transport's handle, for [`Transport::settle`].
    pub handle: H,
}

/// What a transport does with a reservation once the consumer is done with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settlement {
    /// Remove it: handled, skipped as a duplicate, or dropped on purpose.
    Ack,
    /// Remove it and append `body` to the end of the queue it came from, as
    /// one step (a retry with its new `attempts`, or a release unchanged).
    /// The transport headers of the delivery travel with it.
    Requeue(Vec<u8>),
    /// Remove it and append `body` to the queue `queue`, as one step.
    DeadLetter {
        /// The dead-letter queue (`<queue>.dlq` by convention).
        queue: String,
        /// The dead-letter record.
        body: Vec<u8>,
    },
}

impl Settlement {
    /// Where the settlement appends a body, and which: `None` for an ack,
    /// `origin` (the queue the delivery came from) for a requeue, the
    /// dead-letter queue for a dead-letter record.
    #[cfg_attr(
        not(any(feature = "redis-transport", feature = "amqp-transport")),
        allow(dead_code)
    )]
    fn destination<'a>(&'a self, origin: &'a str) -> Option<(&'a str, &'a [u8])> {
        match self {
            Settlement::Ack => None,
            Settlement::Requeue(body) => Some((origin, body)),
            Settlement::DeadLetter { queue, body } => Some((queue, body)),
        }
    }

    /// A short name for logs: `ack`, `requeue` or `dead_letter`.
    ///
    /// ```
    /// assert_eq!(babel_idem::transport::Settlement::Ack.kind(), "ack");
    /// ```
    pub fn kind(&self) -> &'static str {
        match self {
            Settlement::Ack => "ack",
            Settlement::Requeue(_) => "requeue",
            Settlement::DeadLetter { .. } => "dead_letter",
        }
    }
}

/// Why a transport operation failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum TransportError {
    /// The broker URL cannot be used; says what is wrong with it.
    InvalidUrl {
        /// The URL, without its password.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The queue name cannot be held by the transport's layout.
    InvalidQueue {
        /// The name given.
        queue: String,
        /// Why it cannot be used.
        reason: &'static str,
    },
    /// The broker could not be reached, or refused the connection.
    Connect(Box<dyn StdError + Send + Sync>),
    /// The broker failed one operation (a lost connection, a timeout, an
    /// error reply); the operation may be tried again.
    Broker(Box<dyn StdError + Send + Sync>),
}

impl fmt::Display for TransportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TransportError::InvalidUrl { url, reason } => {
                write!(f, "invalid broker URL {url:?}: {reason}")
            }
            TransportError::InvalidQueue { queue, reason } => {
                write!(f, "invalid queue name {queue:?}: {reason}")
            }
            TransportError::Connect(error) => write!(f, "cannot connect to the broker: {error}"),
            TransportError::Broker(error) => write!(f, "broker operation failed: {error}"),
        }
    }
}

impl StdError for TransportError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match self {
            TransportError::Connect(error) | TransportError::Broker(error) => Some(&**error),
            TransportError::InvalidUrl { .. } | TransportError::InvalidQueue { .. } => None,
        }
    }
}

impl TransportError {
    /// [`TransportError::InvalidUrl`] for `url`, without its password.
    #[cfg_attr(
        not(any(feature = "redis-transport", feature = "amqp-transport")),
        allow(dead_code)
    )]
    fn invalid_url(url: &str, reason: impl Into<String>) -> Self {
        TransportError::InvalidUrl {
            url: redact(url),
            reason: reason.into(),
        }
    }
}

/// The queue names a binding's layout can hold: never empty, at most
/// `max_len` bytes, no character `refused` matches, and whatever the
/// binding's `own_rule` adds. Each refusal says which rule the name broke.
#[cfg_attr(
    not(any(feature = "redis-transport", feature = "amqp-transport")),
    allow(dead_code)
)]
struct QueueNames {
    /// The longest name, in bytes.
    max_len: usize,
    /// The reason given for a longer name.
    too_long: &'static str,
    /// The characters a name cannot hold.
    refused: fn(char) -> bool,
    /// The reason given for a name holding one.
    refused_reason: &'static str,
    /// The binding's own rule: why `queue` breaks it, if it does.
    own_rule: fn(&str) -> Option<&'static str>,
}

#[cfg_attr(
    not(any(feature = "redis-transport", feature = "amqp-transport")),
    allow(dead_code)
)]
impl QueueNames {
    /// `Ok` when `queue` follows every rule, else the first it breaks.
    fn check(&self, queue: &str) -> Result<(), TransportError> {
        let broken = if queue.is_empty() {
            Some("a queue name cannot be empty")
        } else if queue.len() > self.max_len {
            Some(self.too_long)
        } else if queue.chars().any(self.refused) {
            Some(self.refused_reason)
        } else {
            (self.own_rule)(queue)
        };
        match broken {
            None => Ok(()),
            Some(reason) => Err(TransportError::InvalidQueue {
                queue: queue.to_owned(),
                reason,
            }),
        }
    }
}

/// `url` with its password replaced, for error messages.
#[cfg_attr(
    not(any(feature = "redis-transport", feature = "amqp-transport")),
    allow(dead_code)
)]
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let credentials = &url[scheme + 3..at];
            match credentials.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..scheme + 3], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::{QueueNames, Settlement, TransportError, redact};

    #[test]
    fn a_refused_queue_name_says_which_rule_it_broke() {
        let names = QueueNames {
            max_len: 3,
            too_long: "too long",
            refused: char::is_whitespace,
            refused_reason: "whitespace",
            own_rule: |queue| queue.starts_with('x').then_some("the binding's own"),
        };
        for (queue, reason) in [
            ("", "a queue name cannot be empty"),
            ("abcd", "too long"),
            ("a b", "whitespace"),
            ("xy", "the binding's own"),
        ] {
            match names.check(queue) {
                Err(TransportError::InvalidQueue {
                    queue: name,
                    reason: got,
                }) => {
                    assert_eq!((name.as_str(), got), (queue, reason));
                }
                other => panic!("{queue:?} refused: {other:?}"),
            }
        }
        names.check("abc").unwrap();
    }

    #[test]
    fn a_settlement_appends_its_body_to_the_queue_it_names() {
        let body = b"{}".to_vec();
        assert_eq!(Settlement::Ack.destination("orders"), None);
        assert_eq!(
            Settlement::Requeue(body.clone()).destination("orders"),
            Some(("orders", &body[..]))
        );
        let dead_letter = Settlement::DeadLetter {
            queue: "orders.dlq".to_owned(),
            body: body.clone(),
        };
        assert_eq!(
            dead_letter.destination("orders"),
            Some(("orders.dlq", &body[..]))
        );
    }

    #[test]
    fn passwords_never_reach_error_messages() {
        assert_eq!(
            redact("redis://user:secret@h:6379/0"),
            "redis://user:***@h:6379/0"
        );
        assert_eq!(
            redact("amqp://guest:guest@h:5672/%2f"),
            "amqp://guest:***@h:5672/%2f"
        );
        assert_eq!(redact("redis://h:6379/0"), "redis://h:6379/0");
    }
}
