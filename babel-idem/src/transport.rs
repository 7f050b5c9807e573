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

#[cfg(any(feature = "redis-transport", feature = "amqp-transport"))]
mod binding;
mod outgoing;

pub use self::outgoing::{BatchOutcome, Outgoing, PublishError};

#[cfg(feature = "redis-transport")]
pub(crate) mod redis;

#[cfg(feature = "redis-transport")]
pub use self::redis::{RedisHandle, RedisOptions, RedisTransport, RedisTransportBuilder};

#[cfg(feature = "amqp-transport")]
pub(crate) mod amqp;

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
    /// on its own. The consumer's default per-delivery timeout is taken from
    /// it; on a transport that cannot [`extend`](Transport::extend) a
    /// reservation,
    /// [`ConsumerBuilder::build`](crate::consumer::ConsumerBuilder::build)
    /// refuses a timeout and a longest wait (retry backoff, release delay)
    /// that together do not fit in it.
    fn reservation_lifetime(&self) -> Option<Duration> {
        None
    }

    /// Whether [`extend`](Transport::extend) can keep a reservation alive
    /// (default `false`). A consumer on a transport that cannot refuses, at
    /// build, a configuration under which it could hold a delivery longer
    /// than [`reservation_lifetime`](Transport::reservation_lifetime).
    fn extends_reservations(&self) -> bool {
        false
    }

    /// Moves a reservation's deadline a whole
    /// [`reservation_lifetime`](Transport::reservation_lifetime) past now,
    /// never earlier than it was. `Ok(true)` when it did; `Ok(false)` when
    /// the reservation had already lapsed. The consumer calls it while a
    /// handler runs and while a delivery waits out a delay. The default
    /// fails with [`TransportError::Unsupported`].
    fn extend<'a>(&'a self, handle: &'a Self::Handle) -> TransportFuture<'a, bool> {
        let _ = handle;
        Box::pin(async {
            Err(TransportError::Unsupported {
                operation: "extend",
            })
        })
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
    /// The broker failed one operation (a lost connection, an error reply,
    /// a channel closed over one message); the operation may be tried
    /// again. As one message's outcome in a [`BatchOutcome`], the broker's
    /// refusal of that message (see [`is_refusal`](Self::is_refusal)).
    Broker(Box<dyn StdError + Send + Sync>),
    /// The transport cannot carry out this operation (see
    /// [`Transport::extends_reservations`]).
    Unsupported {
        /// The operation asked for.
        operation: &'static str,
    },
    /// The broker gave the message back: no queue took it (RabbitMQ's
    /// `basic.return` of a mandatory publish, such as one to a queue deleted
    /// since the connection declared it). Nothing was published; the queue
    /// is declared again on the next publish to it.
    Unroutable {
        /// The queue the message was published to.
        queue: String,
    },
    /// The broker cannot take the message now: a full queue under
    /// `x-overflow: reject-publish` nacks it, a busy broker does not answer
    /// in time. Not the message's fault: publishing it again later may
    /// succeed (after a timeout it may also have been taken: at least once).
    Backpressure(Box<dyn StdError + Send + Sync>),
}

impl TransportError {
    /// Whether this error, as one message's outcome in a
    /// [`BatchOutcome`], refuses that message for what it is: a queue name
    /// the layout cannot hold ([`InvalidQueue`](Self::InvalidQueue)), or
    /// the broker's refusal of that one message
    /// ([`Broker`](Self::Broker): a Redis key of the wrong type, a body
    /// RabbitMQ closes the channel over). Anything else is not the
    /// message's fault (a message no queue took, back-pressure, a broker
    /// that cannot be reached), and the same message may be taken later.
    /// The outbox relay counts an attempt against a row for a refusal only.
    ///
    /// ```
    /// use babel_idem::transport::TransportError;
    ///
    /// let full = TransportError::Backpressure("the queue is full".into());
    /// assert!(!full.is_refusal());
    /// let returned = TransportError::Unroutable { queue: "orders".into() };
    /// assert!(!returned.is_refusal());
    /// let reserved = TransportError::InvalidQueue { queue: "amq.x".into(), reason: "reserved" };
    /// assert!(reserved.is_refusal());
    /// ```
    pub fn is_refusal(&self) -> bool {
        match self {
            TransportError::InvalidQueue { .. } | TransportError::Broker(_) => true,
            TransportError::InvalidUrl { .. }
            | TransportError::Connect(_)
            | TransportError::Unsupported { .. }
            | TransportError::Unroutable { .. }
            | TransportError::Backpressure(_) => false,
        }
    }
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
            TransportError::Unsupported { operation } => {
                write!(f, "this transport does not support {operation}")
            }
            TransportError::Unroutable { queue } => write!(
                f,
                "the broker returned the message: no queue took it (does {queue:?} exist?)"
            ),
            TransportError::Backpressure(error) => {
                write!(f, "the broker cannot take the message now: {error}")
            }
        }
    }
}

impl StdError for TransportError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match self {
            TransportError::Connect(error)
            | TransportError::Broker(error)
            | TransportError::Backpressure(error) => Some(&**error),
            TransportError::InvalidUrl { .. }
            | TransportError::InvalidQueue { .. }
            | TransportError::Unsupported { .. }
            | TransportError::Unroutable { .. } => None,
        }
    }
}
