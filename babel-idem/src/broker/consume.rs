//! The consuming side of the broker contract: what a consumer calls to
//! reserve deliveries and settle them, whatever broker is underneath.

use std::time::Duration;

use super::{TransportError, TransportFuture};

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
    /// `ConsumerBuilder::build`
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

/// One reserved delivery.
#[derive(Debug)]
pub struct Reserved<H> {
    /// The message body as the producer wrote it (unframed when the transport
    /// carries headers beside it).
    pub body: Vec<u8>,
    /// The transport headers that came with it, in the order given.
    pub headers: Vec<(String, String)>,
    /// The attempts made before this delivery, when the broker counts them
    /// itself (Kafka's `bq-attempts` header): dispatch counts with them
    /// instead of the body's `attempts`. `None` when the body's count is
    /// the only one (Redis, RabbitMQ).
    pub attempts: Option<u64>,
    /// Whether the broker found the body undecodable as it reserved it (the
    /// Redis Laravel-compatible layout's pop reserves a job with no numeric
    /// `attempts` as it is): the consumer dead-letters it as poison without
    /// decoding it, as the Python SDK does. `false` elsewhere: the consumer
    /// decides from the body.
    pub poison: bool,
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
    /// assert_eq!(babel_idem::broker::Settlement::Ack.kind(), "ack");
    /// ```
    pub fn kind(&self) -> &'static str {
        match self {
            Settlement::Ack => "ack",
            Settlement::Requeue(_) => "requeue",
            Settlement::DeadLetter { .. } => "dead_letter",
        }
    }
}
