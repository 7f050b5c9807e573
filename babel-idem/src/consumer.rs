//! [`Consumer`]: moves messages from a broker through a [`Router`] (feature
//! `consumer`).
//!
//! The consumer reserves deliveries from a [`Transport`], runs
//! [`Router::dispatch`] on each with bounded concurrency and settles each by
//! its [`Disposition`](crate::router::Disposition):
//!
//! | disposition | settlement |
//! |---|---|
//! | `Ack`, `Delete` | ack |
//! | `Retry` | wait the router's backoff, then requeue the body with `attempts + 1` |
//! | `DeadLetter` | the record to `<queue>.dlq`: the envelope with its `dead_letter` block, or for poison the ADR-0035 record that keeps the body byte for byte |
//! | `Release` | requeue the body unchanged, no attempt counted |
//!
//! Deduplication is the handler's guard's (`#[idempotent]`); the consumer
//! and its transport never decide it.
//!
//! The loop:
//! - [`run_until`](Consumer::run_until) stops on a future: no new
//!   reservations, in-flight deliveries get [`shutdown_timeout`](ConsumerBuilder::shutdown_timeout)
//!   to finish, and the ones still running are dropped unsettled, left to the
//!   broker's recovery (the Redis sweep), never lost.
//! - A broker that fails (a restart, a network cut) is retried with backoff,
//!   for reservations and settlements alike; a settlement is never skipped.
//! - Transport headers reach the handler through [`Delivery`](crate::router::Delivery);
//!   `bq-replay-bypass` turns [`is_replay`] on for that delivery.

mod poison;
mod replay;
mod run;
mod settle;

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::router::Router;
use crate::transport::{Transport, TransportError};

pub use replay::{HEADER_REPLAY_BYPASS, bypass_external_effects, is_replay};

use settle::Counters;

/// Reserves, dispatches and settles the deliveries of one queue.
///
/// Each delivery runs on a task of its own (`tokio::spawn`), so the consumer
/// runs on whatever Tokio runtime polls it. A worker that mostly waits on
/// its broker and store goes fastest on a current-thread runtime
/// (`#[tokio::main(flavor = "current_thread")]`), one per core if it needs
/// more: on the multi-threaded one the same deliveries pay for wakeups
/// between scheduler threads (the README's "Performance" has the figures).
///
/// ```no_run
/// use babel_idem::transport::RedisTransport;
/// use babel_idem::{Consumer, Envelope, Router, urn};
/// use std::time::Duration;
///
/// async fn on_order_created(env: Envelope) -> Result<(), anyhow::Error> {
///     println!("order {}", env.data["order_id"]);
///     Ok(())
/// }
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let router = Router::builder()
///     .route(urn!("urn:babel:orders:created"), on_order_created)
///     .build()?;
/// let transport = RedisTransport::connect("redis://127.0.0.1:6379/0").await?;
/// let consumer = Consumer::builder(router, transport, "orders")
///     .concurrency(64)
///     .shutdown_timeout(Duration::from_secs(10))
///     .build()?;
/// // Stop after an hour; any future works (a signal, a channel).
/// let report = consumer
///     .run_until(tokio::time::sleep(Duration::from_secs(3600)))
///     .await;
/// println!("{report:?}");
/// # Ok(())
/// # }
/// ```
pub struct Consumer<T: Transport> {
    router: Arc<Router>,
    transport: Arc<T>,
    queue: Arc<str>,
    dead_letter_queue: Arc<str>,
    concurrency: usize,
    shutdown_timeout: Duration,
    max_body_bytes: Option<usize>,
    idle_poll: (Duration, Duration),
    counters: Arc<Counters>,
}

/// Configures a [`Consumer`]; made by [`Consumer::builder`].
#[must_use = "call .build() to get a Consumer"]
pub struct ConsumerBuilder<T: Transport> {
    router: Arc<Router>,
    transport: Arc<T>,
    queue: String,
    dead_letter_queue: Option<String>,
    concurrency: usize,
    shutdown_timeout: Duration,
    max_body_bytes: Option<usize>,
    idle_poll: (Duration, Duration),
}

/// The default bound on deliveries handled at once.
pub const DEFAULT_CONCURRENCY: usize = 32;

/// The largest batch one reservation asks for.
const MAX_BATCH: usize = 256;

impl<T: Transport> Consumer<T> {
    /// Starts a consumer of `queue` on `transport`, dispatching through
    /// `router` (a `Router` or an `Arc<Router>`).
    pub fn builder(
        router: impl Into<Arc<Router>>,
        transport: T,
        queue: impl Into<String>,
    ) -> ConsumerBuilder<T> {
        ConsumerBuilder {
            router: router.into(),
            transport: Arc::new(transport),
            queue: queue.into(),
            dead_letter_queue: None,
            concurrency: DEFAULT_CONCURRENCY,
            shutdown_timeout: Duration::from_secs(30),
            max_body_bytes: None,
            idle_poll: (Duration::from_millis(10), Duration::from_millis(500)),
        }
    }

    /// The queue consumed.
    pub fn queue(&self) -> &str {
        &self.queue
    }

    /// The queue dead-letter records go to.
    pub fn dead_letter_queue(&self) -> &str {
        &self.dead_letter_queue
    }

    /// The transport, for publishing beside the consumer.
    pub fn transport(&self) -> &T {
        &self.transport
    }

    /// A handle that reads this consumer's running totals, from any task.
    pub fn progress(&self) -> Progress {
        Progress {
            counters: Arc::clone(&self.counters),
        }
    }
}

impl<T: Transport> ConsumerBuilder<T> {
    /// How many deliveries are handled at once (default
    /// [`DEFAULT_CONCURRENCY`]); also the most that are reserved at once.
    pub fn concurrency(mut self, concurrency: usize) -> Self {
        self.concurrency = concurrency;
        self
    }

    /// How long a graceful stop waits for in-flight deliveries (default 30 s).
    pub fn shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.shutdown_timeout = timeout;
        self
    }

    /// Bodies longer than `bytes` are dead-lettered as poison without being
    /// decoded (default: no limit).
    pub fn max_body_bytes(mut self, bytes: usize) -> Self {
        self.max_body_bytes = Some(bytes);
        self
    }

    /// The dead-letter queue (default `<queue>.dlq`, the BabelQueue convention).
    pub fn dead_letter_queue(mut self, queue: impl Into<String>) -> Self {
        self.dead_letter_queue = Some(queue.into());
        self
    }

    /// How long to wait before asking an empty queue again: `first`, doubling
    /// on every further empty answer up to `max` (default 10 ms to 500 ms).
    pub fn idle_poll(mut self, first: Duration, max: Duration) -> Self {
        self.idle_poll = (first, max.max(first));
        self
    }

    /// Checks the settings, and the queue and dead-letter queue names
    /// against the transport ([`Transport::check_queue`]): a name the
    /// transport's layout cannot hold is an error here, before anything runs.
    pub fn build(self) -> Result<Consumer<T>, ConsumerError> {
        if self.concurrency == 0 {
            return Err(ConsumerError::ZeroConcurrency);
        }
        self.transport.check_queue(&self.queue)?;
        let dead_letter_queue = self
            .dead_letter_queue
            .unwrap_or_else(|| format!("{}.dlq", self.queue));
        self.transport.check_queue(&dead_letter_queue)?;
        if dead_letter_queue == self.queue {
            return Err(ConsumerError::DeadLetterQueueIsTheQueue);
        }
        // A retry waits its backoff while its reservation is held: one that
        // lapsed meanwhile is swept back with its old `attempts`, the retry's
        // settle then touches nothing, and the message would never reach
        // the dead-letter queue.
        if let (Some(backoff), Some(reservation)) = (
            self.router.longest_backoff(),
            self.transport.reservation_lifetime(),
        ) && backoff >= reservation
        {
            return Err(ConsumerError::BackoffOutlivesReservation {
                backoff,
                reservation,
            });
        }
        Ok(Consumer {
            router: self.router,
            transport: self.transport,
            queue: self.queue.into(),
            dead_letter_queue: dead_letter_queue.into(),
            concurrency: self.concurrency,
            shutdown_timeout: self.shutdown_timeout,
            max_body_bytes: self.max_body_bytes,
            idle_poll: self.idle_poll,
            counters: Arc::default(),
        })
    }
}

/// Why a [`Consumer`] could not be built.
#[derive(Debug)]
#[non_exhaustive]
pub enum ConsumerError {
    /// `concurrency(0)`: nothing could ever be handled.
    ZeroConcurrency,
    /// The dead-letter queue is the consumed queue: failures would loop.
    DeadLetterQueueIsTheQueue,
    /// The transport refused a queue name.
    Transport(TransportError),
    /// The router's longest retry backoff is not shorter than a reservation
    /// on the transport: the reservation would lapse while the retry waits,
    /// the broker would redeliver the message with its old `attempts`, and
    /// it would never be dead-lettered.
    BackoffOutlivesReservation {
        /// The longest delay the router's retries ask for.
        backoff: Duration,
        /// How long a reservation lasts ([`Transport::reservation_lifetime`]).
        reservation: Duration,
    },
}

impl fmt::Display for ConsumerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConsumerError::ZeroConcurrency => f.write_str("concurrency must be at least 1"),
            ConsumerError::DeadLetterQueueIsTheQueue => {
                f.write_str("the dead-letter queue must differ from the consumed queue")
            }
            ConsumerError::Transport(error) => error.fmt(f),
            ConsumerError::BackoffOutlivesReservation {
                backoff,
                reservation,
            } => write!(
                f,
                "the router's longest retry backoff ({backoff:?}) must be shorter than a \
                 reservation on the transport ({reservation:?}): a retry waits with its \
                 delivery reserved, so it would lapse and come back without counting the \
                 attempt; shorten the backoff or lengthen the reservation"
            ),
        }
    }
}

impl std::error::Error for ConsumerError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ConsumerError::Transport(error) => Some(error),
            _ => None,
        }
    }
}

impl From<TransportError> for ConsumerError {
    fn from(error: TransportError) -> Self {
        ConsumerError::Transport(error)
    }
}

/// Reads a [`Consumer`]'s running totals; made by [`Consumer::progress`].
#[derive(Debug, Clone)]
pub struct Progress {
    counters: Arc<Counters>,
}

impl Progress {
    /// The totals so far.
    pub fn report(&self) -> ConsumerReport {
        let read = |counter: &std::sync::atomic::AtomicU64| counter.load(Ordering::Relaxed);
        let c = &*self.counters;
        ConsumerReport {
            delivered: read(&c.delivered),
            reserve_calls: read(&c.reserve_calls),
            in_flight: read(&c.in_flight),
            acked: read(&c.acked),
            deleted: read(&c.deleted),
            retried: read(&c.retried),
            released: read(&c.released),
            dead_lettered: read(&c.dead_lettered),
            lapsed: read(&c.lapsed),
            unfinished: read(&c.unfinished),
            broker_errors: read(&c.broker_errors),
        }
    }

    /// Completes once the consumer has reserved nothing new and had nothing
    /// in flight for `quiet` (checked every 50 ms or `quiet`, whichever is
    /// shorter): a shutdown future for "stop when the queue is drained".
    ///
    /// ```no_run
    /// # async fn run(consumer: babel_idem::Consumer<babel_idem::transport::RedisTransport>) {
    /// use std::time::Duration;
    ///
    /// let idle = consumer.progress();
    /// let report = consumer.run_until(idle.idle_for(Duration::from_secs(2))).await;
    /// # }
    /// ```
    pub async fn idle_for(&self, quiet: Duration) {
        let tick = quiet.min(Duration::from_millis(50));
        let mut last = self.report().delivered;
        let mut quiet_since = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(tick).await;
            let now = self.report();
            if now.delivered != last || now.in_flight > 0 {
                last = now.delivered;
                quiet_since = tokio::time::Instant::now();
            } else if quiet_since.elapsed() >= quiet {
                return;
            }
        }
    }
}

/// What a [`Consumer`] did, counted since it was built.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConsumerReport {
    /// Deliveries reserved.
    pub delivered: u64,
    /// Calls to [`Transport::reserve`] (each one round trip for a batch,
    /// with the Redis transport), empty answers included.
    pub reserve_calls: u64,
    /// Deliveries reserved and not settled yet.
    pub in_flight: u64,
    /// Acked: handled, or skipped by the guard as duplicates.
    pub acked: u64,
    /// Acked and dropped by the unknown-URN strategy `Delete`.
    pub deleted: u64,
    /// Requeued with `attempts + 1`.
    pub retried: u64,
    /// Requeued unchanged (`Release`).
    pub released: u64,
    /// Written to the dead-letter queue.
    pub dead_lettered: u64,
    /// Settled too late: the reservation had lapsed and was recovered, so
    /// nothing was touched and the delivery will come again.
    pub lapsed: u64,
    /// Still running when a graceful stop timed out: dropped unsettled, left
    /// to the broker's recovery.
    pub unfinished: u64,
    /// Broker operations that failed and were retried.
    pub broker_errors: u64,
}
