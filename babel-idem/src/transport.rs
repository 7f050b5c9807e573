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
//!   binding, legacy or Laravel-compatible layout, byte-compatible with the
//!   Python SDK.
//! - `AmqpTransport` (feature `amqp-transport`): the BabelQueue RabbitMQ
//!   (AMQP 0-9-1) binding, byte-compatible with the Python SDK.
//! - `KafkaTransport` (feature `kafka-transport`, module `kafka`): the
//!   BabelQueue Apache Kafka binding, byte-compatible with the Python SDK,
//!   with its retry tiers and their re-injector.

use std::time::Duration;

#[cfg(any(
    feature = "redis-transport",
    feature = "amqp-transport",
    feature = "kafka-transport"
))]
mod binding;

// The broker contract's types, where a transport's user looks for them.
#[doc(no_inline)]
pub use crate::broker::{
    BatchOutcome, Outgoing, PublishError, Reserved, Settlement, Transport, TransportError,
    TransportFuture,
};

#[cfg(feature = "redis-transport")]
pub(crate) mod redis;

#[cfg(feature = "redis-transport")]
pub use self::redis::{RedisHandle, RedisOptions, RedisTransport, RedisTransportBuilder};

#[cfg(feature = "amqp-transport")]
pub(crate) mod amqp;

#[cfg(feature = "amqp-transport")]
pub use self::amqp::{AmqpHandle, AmqpOptions, AmqpTransport, AmqpTransportBuilder};

#[cfg(feature = "kafka-transport")]
pub mod kafka;

#[cfg(feature = "kafka-transport")]
pub use self::kafka::{KafkaHandle, KafkaOptions, KafkaTransport, KafkaTransportBuilder};

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
    not(any(
        feature = "redis-transport",
        feature = "amqp-transport",
        feature = "kafka-transport"
    )),
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
    #[cfg(any(
        feature = "redis-transport",
        feature = "amqp-transport",
        feature = "kafka-transport"
    ))]
    fn with_options(mut self, change: impl FnOnce(&mut O)) -> Self {
        change(&mut self.options);
        self
    }
}
