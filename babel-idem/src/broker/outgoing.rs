//! What a producer hands a transport: a message for a queue, and the
//! outcome of publishing a batch of them.

use crate::envelope::ProduceError;

use super::TransportError;

/// One message to publish: the queue, the body as it goes on the wire, and
/// out-of-band transport headers (a W3C `traceparent`) beside it.
///
/// ```
/// use babel_idem::broker::Outgoing;
///
/// let message = Outgoing::new("orders", br#"{"job":"urn:babel:orders:created"}"#);
/// assert_eq!(message.queue, "orders");
/// assert!(message.headers.is_empty());
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Outgoing<'a> {
    /// The queue the message goes to.
    pub queue: &'a str,
    /// The body, published byte for byte.
    pub body: &'a [u8],
    /// Out-of-band headers; blank names and values are dropped.
    pub headers: &'a [(String, String)],
}

impl<'a> Outgoing<'a> {
    /// A message for `queue` without headers.
    pub fn new(queue: &'a str, body: &'a [u8]) -> Self {
        Outgoing {
            queue,
            body,
            headers: &[],
        }
    }

    /// The same message with `headers` beside its body.
    pub fn with_headers(mut self, headers: &'a [(String, String)]) -> Self {
        self.headers = headers;
        self
    }
}

/// The outcome of publishing a batch of [`Outgoing`] messages in one round
/// trip: one entry per message, in order. `Ok` once a queue holds the
/// message (on RabbitMQ: confirmed, and not returned). An error says that
/// one message was not taken, and nothing about the others; it is one of
/// two kinds ([`TransportError::is_refusal`]):
///
/// - a refusal of the message for what it is: a queue name the layout
///   cannot hold, a key of the wrong type, a body the broker closes the
///   channel over;
/// - not the message's fault: no queue took it
///   ([`TransportError::Unroutable`], a queue deleted since it was
///   declared, declared again on the next publish), or the broker cannot
///   take it now ([`TransportError::Backpressure`], a nack from a full
///   `x-overflow: reject-publish` queue). The same message may be taken
///   later.
///
/// A broker that cannot be reached fails the whole call instead, and then
/// nothing is known of any message.
///
/// ```
/// use babel_idem::broker::{BatchOutcome, TransportError};
///
/// let outcome: BatchOutcome = vec![
///     Ok(()),
///     Err(TransportError::Unroutable { queue: "orders".into() }),
///     Err(TransportError::InvalidQueue { queue: "amq.x".into(), reason: "reserved" }),
/// ];
/// let accepted = outcome.iter().filter(|result| result.is_ok()).count();
/// let refused = outcome.iter().filter(|r| r.as_ref().is_err_and(|e| e.is_refusal())).count();
/// assert_eq!((accepted, refused), (1, 1));
/// ```
pub type BatchOutcome = Vec<Result<(), TransportError>>;

/// Why publishing an [`Envelope`](crate::Envelope) failed: it does not encode (nothing was
/// sent), or the broker failed.
///
/// ```
/// use babel_idem::envelope::ProduceError;
/// use babel_idem::broker::PublishError;
///
/// let error = PublishError::from(ProduceError::MissingId);
/// assert!(error.to_string().contains("meta.id"));
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PublishError {
    /// The envelope does not encode; nothing was sent.
    #[error("{0}")]
    Envelope(#[from] ProduceError),
    /// The transport failed.
    #[error("{0}")]
    Transport(#[from] TransportError),
}

/// A batch's outcome in the messages' order: each message whose queue
/// `check` refuses fails alone, before anything is sent; `send` publishes
/// the others in one round trip and answers for each of them in order (a
/// missing answer counts as taken). A `send` that fails fails the batch.
#[cfg(any(
    feature = "redis-transport",
    feature = "amqp-transport",
    feature = "kafka-transport"
))]
pub(crate) async fn publish_checked<'m, 'o, F>(
    messages: &'m [Outgoing<'o>],
    check: impl Fn(&str) -> Result<(), TransportError>,
    send: impl FnOnce(Vec<&'m Outgoing<'o>>) -> F,
) -> Result<BatchOutcome, TransportError>
where
    F: Future<Output = Result<BatchOutcome, TransportError>>,
{
    let mut outcomes: Vec<Option<Result<(), TransportError>>> = Vec::new();
    let mut sendable = Vec::new();
    for message in messages {
        match check(message.queue) {
            Err(error) => outcomes.push(Some(Err(error))),
            Ok(()) => {
                sendable.push(message);
                outcomes.push(None);
            }
        }
    }
    if !sendable.is_empty() {
        let mut answers = send(sendable).await?.into_iter();
        for outcome in outcomes.iter_mut().filter(|outcome| outcome.is_none()) {
            *outcome = answers.next();
        }
    }
    Ok(outcomes
        .into_iter()
        .map(|outcome| outcome.unwrap_or(Ok(())))
        .collect())
}

/// Implements a broker binding's batch publish, as an inherent
/// `publish_batch` (with the doc comment given first) and as its
/// [`Publisher`](super::Publisher), over the binding's own writes:
///
/// - `check`: the queue-name check, a `Fn(&Self, &str) -> Result<(), TransportError>`;
/// - `one`: the method that publishes one body with its headers;
/// - `send`: the method that publishes the messages whose names passed
///   `check` in one round trip, answering for each in order
///   ([`publish_checked`]'s `send`).
///
/// Doc comments before `check` and `one` document the trait's
/// `check_queue` and `publish_body`; any further tokens are more items of
/// the [`Publisher`](super::Publisher) impl.
#[cfg(any(feature = "amqp-transport", feature = "kafka-transport"))]
macro_rules! batch_publisher {
    (
        $(#[$doc:meta])*
        $binding:ident {
            $(#[$check_doc:meta])*
            check: $check:expr,
            $(#[$one_doc:meta])*
            one: $one:ident,
            send: $send:ident,
        }
        $($more:tt)*
    ) => {
        impl $binding {
            $(#[$doc])*
            pub async fn publish_batch(
                &self,
                messages: &[$crate::broker::Outgoing<'_>],
            ) -> Result<$crate::broker::BatchOutcome, $crate::broker::TransportError> {
                let check = |queue: &str| $check(self, queue);
                $crate::broker::outgoing::publish_checked(messages, check, |sendable| {
                    self.$send(sendable)
                })
                .await
            }
        }

        impl $crate::broker::Publisher for $binding {
            $(#[$check_doc])*
            fn check_queue(&self, queue: &str) -> Result<(), $crate::broker::TransportError> {
                $check(self, queue)
            }

            $(#[$one_doc])*
            fn publish_body<'a>(
                &'a self,
                queue: &'a str,
                body: &'a [u8],
                headers: &'a [(String, String)],
            ) -> $crate::broker::TransportFuture<'a, ()> {
                Box::pin(self.$one(queue, body, headers))
            }

            fn publish_batch<'a>(
                &'a self,
                messages: &'a [$crate::broker::Outgoing<'a>],
            ) -> $crate::broker::TransportFuture<'a, $crate::broker::BatchOutcome> {
                Box::pin($binding::publish_batch(self, messages))
            }

            $($more)*
        }
    };
}
#[cfg(any(feature = "amqp-transport", feature = "kafka-transport"))]
pub(crate) use batch_publisher;
