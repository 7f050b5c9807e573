//! The contracts a broker binding implements besides consuming, and the
//! types they share: what the outbox relay, the consumer's retries and
//! dead-lettering, and redrive call, whatever broker is underneath.
//!
//! - [`Publisher`]: publishes one [`Envelope`] or a batch of [`Outgoing`]
//!   messages.
//! - [`TransportError`]: why a broker operation failed.
//!
//! A broker binding (`transport::RedisTransport`, `transport::AmqpTransport`)
//! implements these traits; nothing here names a broker.

use std::error::Error as StdError;
use std::fmt;
use std::future::Future;
use std::pin::Pin;

use crate::envelope::Envelope;

mod outgoing;

pub use self::outgoing::{BatchOutcome, Outgoing, PublishError};

/// The future a broker operation returns.
pub type TransportFuture<'a, T> =
    Pin<Box<dyn Future<Output = Result<T, TransportError>> + Send + 'a>>;

/// The future a [`Publisher::publish_envelope`] returns.
pub type PublishFuture<'a> = Pin<Box<dyn Future<Output = Result<(), PublishError>> + Send + 'a>>;

/// Publishes to a broker: one envelope with its producer span, or a batch
/// of messages in one round trip. What the outbox relay, the consumer's
/// dead-lettering and redrive call; a broker binding implements it by
/// translating into its own commands.
///
/// ```
/// use babel_idem::broker::Publisher;
///
/// // A relay, a redriver or a test takes any publisher, as a trait object too.
/// fn takes(_: &dyn Publisher) {}
/// ```
pub trait Publisher: Send + Sync + 'static {
    /// Checks that `queue` is a name this broker's layout can hold.
    fn check_queue(&self, queue: &str) -> Result<(), TransportError>;

    /// Publishes `envelope` to its queue (`meta.queue`, else the publisher's
    /// default) in the canonical encoding, inside a PRODUCER span `publish
    /// <urn>` whose W3C `traceparent` travels beside the body. An envelope
    /// that does not encode is refused before anything is sent.
    fn publish_envelope<'a>(&'a self, envelope: &'a Envelope) -> PublishFuture<'a>;

    /// Publishes every message of `messages` in one round trip; see
    /// [`BatchOutcome`] for what the answer says. A broker that cannot be
    /// reached fails the whole call.
    fn publish_batch<'a>(
        &'a self,
        messages: &'a [Outgoing<'a>],
    ) -> TransportFuture<'a, BatchOutcome>;

    /// After [`publish_batch`](Self::publish_batch) failed as a whole with
    /// a refusal ([`TransportError::is_refusal`]): whether the broker still
    /// answers, so that it refused one message of the batch (RabbitMQ
    /// closes the channel over one message) and publishing parts of the
    /// batch again finds which. The default, `false`, is for a broker whose
    /// [`BatchOutcome`] reports each refusal on its own (a Redis pipeline):
    /// a whole batch failing there is an outage, and no message is blamed.
    fn refused_while_reachable(&self) -> Pin<Box<dyn Future<Output = bool> + Send + '_>> {
        Box::pin(std::future::ready(false))
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
    /// `Transport::extends_reservations`).
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
    /// use babel_idem::broker::TransportError;
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
