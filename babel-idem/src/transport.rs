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

use std::time::Duration;

#[cfg(any(feature = "redis-transport", feature = "amqp-transport"))]
mod binding;

// The broker contract's types, where a transport's user looks for them.
#[doc(no_inline)]
pub use crate::broker::{BatchOutcome, Outgoing, PublishError, TransportError, TransportFuture};

#[cfg(feature = "redis-transport")]
pub(crate) mod redis;

#[cfg(feature = "redis-transport")]
pub use self::redis::{RedisHandle, RedisOptions, RedisTransport, RedisTransportBuilder};

#[cfg(feature = "amqp-transport")]
pub(crate) mod amqp;

#[cfg(feature = "amqp-transport")]
pub use self::amqp::{AmqpHandle, AmqpOptions, AmqpTransport, AmqpTransportBuilder};

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
    pub fn timeout(self, timeout: Duration) -> Self {
        TransportBuilder { timeout, ..self }
    }

    /// How many times a lost connection is re-opened, with backoff, before an
    /// operation fails (default 3). The next operation tries again.
    pub fn reconnect_attempts(self, attempts: usize) -> Self {
        TransportBuilder {
            reconnect_attempts: attempts,
            ..self
        }
    }

    /// The builder with the binding's own options changed by `change`: what
    /// each binding's setters are written with.
    #[cfg(any(feature = "redis-transport", feature = "amqp-transport"))]
    fn with_options(mut self, change: impl FnOnce(&mut O)) -> Self {
        change(&mut self.options);
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
