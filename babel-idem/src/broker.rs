//! The contracts a broker binding implements, and the types they share:
//! what the consumer, the outbox relay, the consumer's retries and
//! dead-lettering, and redrive call, whatever broker is underneath.
//!
//! - [`Transport`]: reserves deliveries from a queue and carries out the
//!   [`Settlement`] the consumer chose for each.
//! - [`Publisher`]: publishes one [`Envelope`], one value of a
//!   [`Message`] type, or a batch of [`Outgoing`] messages; the envelope's
//!   encoding and producer span are written once, here, over the broker's
//!   own write of one body.
//! - [`DeadLetters`]: looks at, republishes and puts back the messages of
//!   a dead-letter queue, one [`DeadLetterRun`] at a time; what `redrive`
//!   decides over. [`ErasedDeadLetters`] is its object-safe form, for a
//!   tool that picks the broker at run time (`Box<dyn ErasedDeadLetters>`).
//! - [`TransportError`]: why a broker operation failed.
//!
//! A broker binding (`transport::RedisTransport`, `transport::AmqpTransport`)
//! implements these traits; nothing here names a broker.

use std::error::Error as StdError;
use std::future::Future;
use std::pin::Pin;

use tracing::Instrument;

use crate::envelope::{Envelope, ProduceError, typed};
use crate::message::Message;
use crate::telemetry::{carrier, span};

mod consume;
mod dead_letters;
pub(crate) mod outgoing;

pub use self::consume::{Reserved, Settlement, Transport};
pub use self::dead_letters::{
    BoxedRun, DeadLetterMessage, DeadLetterRun, DeadLetters, Death, ErasedDeadLetters,
    ErasedHandle, ErasedRun,
};
pub use self::outgoing::{BatchOutcome, Outgoing, PublishError};

/// The future a broker operation returns.
pub type TransportFuture<'a, T> =
    Pin<Box<dyn Future<Output = Result<T, TransportError>> + Send + 'a>>;

/// The future [`Publisher::publish_envelope`] and
/// [`Publisher::publish_message`] return.
pub type PublishFuture<'a> = Pin<Box<dyn Future<Output = Result<(), PublishError>> + Send + 'a>>;

/// Publishes to a broker: one envelope with its producer span, or a batch
/// of messages in one round trip. What the outbox relay, the consumer's
/// dead-lettering and redrive call. A broker binding implements the
/// broker's own writes ([`publish_body`](Self::publish_body),
/// [`publish_batch`](Self::publish_batch)) and the name check; what every
/// broker does the same ([`publish_envelope`](Self::publish_envelope): the
/// encoding, the producer span and its trace headers;
/// [`publish_message`](Self::publish_message): the envelope of a typed
/// value) is provided.
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

    /// Publishes `body` to `queue` with out-of-band `headers` (a W3C
    /// `traceparent`) beside it, in the broker's own way of carrying them;
    /// blank names and values are dropped. Returns once the broker holds
    /// the message (on RabbitMQ: confirmed, and not returned).
    fn publish_body<'a>(
        &'a self,
        queue: &'a str,
        body: &'a [u8],
        headers: &'a [(String, String)],
    ) -> TransportFuture<'a, ()>;

    /// Publishes every message of `messages` in one round trip; see
    /// [`BatchOutcome`] for what the answer says. A broker that cannot be
    /// reached fails the whole call.
    fn publish_batch<'a>(
        &'a self,
        messages: &'a [Outgoing<'a>],
    ) -> TransportFuture<'a, BatchOutcome>;

    /// Publishes `envelope` to its queue (`meta.queue`, else the publisher's
    /// default) in the canonical encoding
    /// ([`Envelope::encode_for_publish`]), inside a PRODUCER span `publish
    /// <urn>` whose W3C `traceparent` (feature `opentelemetry`) travels
    /// beside the body through [`publish_body`](Self::publish_body). An
    /// envelope that does not encode is refused before anything is sent.
    fn publish_envelope<'a>(&'a self, envelope: &'a Envelope) -> PublishFuture<'a> {
        Box::pin(async move {
            let body = envelope.encode_for_publish()?;
            let queue = envelope.destination();
            let span = span::producer(envelope, queue);
            let headers = carrier::trace_headers(&span);
            self.publish_body(queue, &body, &headers)
                .instrument(span)
                .await?;
            Ok(())
        })
    }

    /// Publishes `message`, a value of a [`Message`] type, to `queue` as a
    /// new envelope ([`Envelope::from_message`]: the type's URN, the value
    /// as `data`, a fresh `meta.id` and `trace_id`) through
    /// [`publish_envelope`](Self::publish_envelope), so in the same
    /// encoding and producer span as any envelope, on every broker.
    ///
    /// The queue is the `queue` argument, written to `meta.queue` (an
    /// empty name is `default`, as for any envelope): a message type names
    /// what a message is, not where it goes, so the producer chooses the
    /// queue at each publish. To choose more (a `trace_id` that continues
    /// a causal chain, a `meta.id` of your own, a schema check first), build
    /// the envelope with [`Envelope::from_message`] and publish it with
    /// [`publish_envelope`](Self::publish_envelope).
    ///
    /// A value that does not serialize to a JSON object is refused before
    /// anything is sent: [`PublishError::Envelope`] with
    /// [`ProduceError::Data`].
    ///
    /// ```
    /// use babel_idem::Message;
    /// use babel_idem::broker::{PublishError, Publisher};
    /// use serde::{Deserialize, Serialize};
    ///
    /// #[derive(Serialize, Deserialize, Message)]
    /// #[message(urn = "urn:babel:orders:created")]
    /// struct OrderCreated {
    ///     order_id: u64,
    /// }
    ///
    /// // Any broker's publisher: `RedisTransport`, `AmqpTransport`, `KafkaTransport`.
    /// async fn announce(publisher: &impl Publisher, order_id: u64) -> Result<(), PublishError> {
    ///     publisher.publish_message("orders", &OrderCreated { order_id }).await
    /// }
    /// ```
    fn publish_message<'a, M>(&'a self, queue: &str, message: &M) -> PublishFuture<'a>
    where
        Self: Sized,
        M: Message,
    {
        // Built before the future, which then holds no borrow of `message`
        // (a `Message` is `Send`, not necessarily `Sync`) nor of `queue`.
        let envelope = typed::on_queue(queue, message);
        Box::pin(async move {
            let envelope = envelope.map_err(ProduceError::from)?;
            self.publish_envelope(&envelope).await
        })
    }

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
///
/// ```
/// use babel_idem::broker::TransportError;
///
/// let error = TransportError::Unsupported { operation: "extend" };
/// assert_eq!(error.to_string(), "this transport does not support extend");
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TransportError {
    /// The broker URL cannot be used; says what is wrong with it.
    #[error("invalid broker URL {url:?}: {reason}")]
    InvalidUrl {
        /// The URL, without its password.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The queue name cannot be held by the transport's layout.
    #[error("invalid queue name {queue:?}: {reason}")]
    InvalidQueue {
        /// The name given.
        queue: String,
        /// Why it cannot be used.
        reason: &'static str,
    },
    /// The broker could not be reached, or refused the connection.
    #[error("cannot connect to the broker: {0}")]
    Connect(#[source] Box<dyn StdError + Send + Sync>),
    /// The broker failed one operation (a lost connection, an error reply,
    /// a channel closed over one message); the operation may be tried
    /// again. As one message's outcome in a [`BatchOutcome`], the broker's
    /// refusal of that message (see [`is_refusal`](Self::is_refusal)).
    #[error("broker operation failed: {0}")]
    Broker(#[source] Box<dyn StdError + Send + Sync>),
    /// The transport cannot carry out this operation (see
    /// `Transport::extends_reservations`).
    #[error("this transport does not support {operation}")]
    Unsupported {
        /// The operation asked for.
        operation: &'static str,
    },
    /// The broker gave the message back: no queue took it (RabbitMQ's
    /// `basic.return` of a mandatory publish, such as one to a queue deleted
    /// since the connection declared it). Nothing was published; the queue
    /// is declared again on the next publish to it.
    #[error("the broker returned the message: no queue took it (does {queue:?} exist?)")]
    Unroutable {
        /// The queue the message was published to.
        queue: String,
    },
    /// The broker cannot take the message now: a full queue under
    /// `x-overflow: reject-publish` nacks it, a busy broker does not answer
    /// in time. Not the message's fault: publishing it again later may
    /// succeed (after a timeout it may also have been taken: at least once).
    #[error("the broker cannot take the message now: {0}")]
    Backpressure(#[source] Box<dyn StdError + Send + Sync>),
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
