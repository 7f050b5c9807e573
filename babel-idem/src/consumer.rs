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
//! | `Release` | wait its delay (the [`release_delay`](ConsumerBuilder::release_delay) when it has none; for a store outage none, or a hold while only a part of the store is down), then requeue the body unchanged, no attempt counted |
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
//! - A store that fails (the guard could not ask whether an id ran) is an
//!   outage, not a failed attempt: the delivery goes back unchanged, never
//!   dead-lettered. When the store is down (no delivery got an answer from
//!   it for a second) the consumer stops reserving, backs off and resumes
//!   by itself once a probe delivery gets past its guard
//!   ([`ConsumerReport::store_outages`]). When only a part of it is down
//!   (other deliveries get answers, or the store says so: a cluster master
//!   short of replicas, [`ShortOfReplicas`](crate::store::ShortOfReplicas)),
//!   the consumer goes on at full width and holds the failed delivery back
//!   alone, without a handler slot, before it goes back: those ids are
//!   paused, the others flow.
//! - It reserves [`read_ahead`](ConsumerBuilder::read_ahead) deliveries
//!   beyond its free handler slots (as many as its concurrency by default,
//!   at least 4; again once half of those places are free),
//!   and acks a delivery without its slot: the next handler starts while
//!   the last one's ack and the next reservation are on their way (requeues
//!   and dead-letter records keep the slot, so at concurrency 1 they reach
//!   their lists in the order handled).
//! - A delivery whose handler succeeded hands its slot on as its guard
//!   sends the mark (or the claim's commit): the next delivery's guard
//!   asks its store while that mark is on its way, so at concurrency 1 a
//!   message's path holds one store round trip, not two. Handler bodies
//!   still never outnumber the slots: a handler that goes on into a second
//!   guard after its first marked takes a slot back before that body runs,
//!   and the delivery keeps its id's turn until its mark is answered.
//! - One delivery per `meta.id` runs at a time: a second delivery of an id
//!   being run waits for the first to end, in the order the copies came,
//!   and its guard then skips it or runs it. A copy waiting holds no
//!   handler slot and no place ahead, only a place for deliveries held
//!   back (16 per slot, shared with those of a store partly down); a copy
//!   beyond them goes back to the broker unchanged, no attempt spent
//!   ([`ConsumerReport::id_busy`]), and is skipped when it comes again. A
//!   burst of one id, of any size, never holds the room the other ids
//!   need: they keep running at full concurrency meanwhile.
//! - Each handler gets a [`delivery_timeout`](ConsumerBuilder::delivery_timeout);
//!   one that runs longer is dropped, its id left unmarked, and retried.
//! - While a handler runs and while a delivery waits out a retry backoff or
//!   a release delay, a transport that can ([`Transport::extends_reservations`])
//!   keeps the reservation alive; a waiting delivery takes no handler slot.
//! - Transport headers reach the handler through [`Delivery`](crate::router::Delivery);
//!   `bq-replay-bypass` turns [`is_replay`] on for that delivery.
//! - With more than one delivery held (concurrency above 1), the `seen`
//!   and `remember` calls the guards make to a store that answers a batch
//!   in one round trip (Redis, PostgreSQL, SQLite:
//!   `Store::batch_target`) go out
//!   together, as through [`Batched`](crate::store::Batched): every answer,
//!   and every decision, is the one a single call gives.
//!   [`batch_store_calls(false)`](ConsumerBuilder::batch_store_calls) keeps
//!   one call per message.

mod handoff;
mod outage;
mod poison;
mod replay;
mod run;
mod settle;

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::broker::Transport;
use crate::broker::TransportError;
use crate::builders::setters;
use crate::router::Router;

pub use replay::{HEADER_REPLAY_BYPASS, bypass_external_effects, is_replay};

use outage::Outage;

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
    read_ahead: usize,
    shutdown_timeout: Duration,
    max_body_bytes: Option<usize>,
    idle_poll: (Duration, Duration),
    delivery_timeout: Option<Duration>,
    release_delay: Duration,
    keep_alive: Option<Duration>,
    max_waiting: usize,
    max_held_back: usize,
    batch_store_calls: bool,
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
    read_ahead: Option<usize>,
    shutdown_timeout: Duration,
    max_body_bytes: Option<usize>,
    idle_poll: (Duration, Duration),
    delivery_timeout: Timeout,
    release_delay: Duration,
    batch_store_calls: bool,
}

/// A [`ConsumerBuilder`]'s per-delivery timeout setting.
#[derive(Debug, Clone, Copy)]
enum Timeout {
    /// The transport's default: [`DEFAULT_DELIVERY_TIMEOUT`] where
    /// reservations are kept alive, [`fitted_delivery_timeout`] where they
    /// cannot be, none where they never lapse.
    Default,
    /// Set by the caller.
    Set(Duration),
    /// None: a handler may run for ever.
    Never,
}

/// The default pause before a released delivery goes back (an unknown URN
/// under [`UnknownUrnStrategy::Release`](crate::router::UnknownUrnStrategy::Release)).
pub const DEFAULT_RELEASE_DELAY: Duration = Duration::from_secs(1);

/// The default bound on deliveries handled at once.
pub const DEFAULT_CONCURRENCY: usize = 32;

/// The least read-ahead by default: the consumer reserves again once half
/// its places ahead are free, so with four even a consumer of concurrency 1
/// fetches two deliveries a reservation.
const LEAST_DEFAULT_READ_AHEAD: usize = 4;

/// The largest batch one reservation asks for.
const MAX_BATCH: usize = 256;

/// Deliveries that may wait without a handler slot (a backoff, a release
/// delay, an ack or a mark on its way), per slot; past that a waiting
/// delivery keeps its slot, so the consumer reserves no more.
const WAITING_PER_SLOT: usize = 4;

/// Deliveries that may be held back unattempted, per slot, holding no slot
/// and no place ahead: copies of an id waiting for its run to end, and
/// deliveries whose part of the store is down waiting to go back. Past
/// that such a delivery goes back to the broker at once. These places are
/// apart from [`WAITING_PER_SLOT`]'s: neither a burst of one id nor a
/// shard's outage takes the places the other ids' waits need.
const HELD_BACK_PER_SLOT: usize = 16;

/// The default per-delivery timeout on a transport that keeps
/// reservations alive while a handler runs (Redis): 15 minutes.
///
/// There a reservation never lapses under a running handler, so the
/// timeout has nothing to fit in: it only catches a handler that hangs,
/// which would otherwise hold its slot and its message for ever. It is
/// fixed, never derived from the reservation's lifetime: a short
/// `retry_after` (so that a crashed worker's deliveries come back soon)
/// must not cut short a handler that takes longer than it. Set
/// [`delivery_timeout`](ConsumerBuilder::delivery_timeout) to your
/// longest handler's time when it runs longer, or
/// [`no_delivery_timeout`](ConsumerBuilder::no_delivery_timeout).
///
/// ```no_run
/// # async fn run(router: babel_idem::Router) -> Result<(), Box<dyn std::error::Error>> {
/// use babel_idem::consumer::DEFAULT_DELIVERY_TIMEOUT;
/// use babel_idem::transport::RedisTransport;
/// use babel_idem::Consumer;
/// use std::time::Duration;
///
/// // Reservations of 2 s, kept alive while the handler runs: a handler
/// // may take minutes.
/// let transport = RedisTransport::builder()
///     .retry_after(Duration::from_secs(2))
///     .connect("redis://127.0.0.1:6379/0")
///     .await?;
/// let consumer = Consumer::builder(router, transport, "orders").build()?;
/// assert_eq!(consumer.delivery_timeout(), Some(DEFAULT_DELIVERY_TIMEOUT));
/// # Ok(())
/// # }
/// ```
pub const DEFAULT_DELIVERY_TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// The default per-delivery timeout on a transport that cannot extend a
/// reservation, when a handler has `lifetime` of one to run in: 90 % of
/// it, leaving the rest to settle in.
fn fitted_delivery_timeout(lifetime: Duration) -> Duration {
    lifetime.mul_f64(0.9)
}

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
            read_ahead: None,
            shutdown_timeout: Duration::from_secs(30),
            max_body_bytes: None,
            idle_poll: (Duration::from_millis(10), Duration::from_millis(500)),
            delivery_timeout: Timeout::Default,
            release_delay: DEFAULT_RELEASE_DELAY,
            batch_store_calls: true,
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

    /// The per-delivery timeout in force
    /// ([`delivery_timeout`](ConsumerBuilder::delivery_timeout)).
    pub fn delivery_timeout(&self) -> Option<Duration> {
        self.delivery_timeout
    }

    /// How many deliveries it reserves ahead of a free handler slot
    /// ([`read_ahead`](ConsumerBuilder::read_ahead)): the default is its
    /// concurrency and at least 4, and `0` on a transport whose
    /// reservations lapse and cannot be extended.
    pub fn read_ahead(&self) -> usize {
        self.read_ahead
    }

    /// The transport, for publishing beside the consumer.
    pub fn transport(&self) -> &T {
        &self.transport
    }

    /// Whether the guards' store calls are batched: more than one delivery
    /// held, and [`batch_store_calls`](ConsumerBuilder::batch_store_calls)
    /// not turned off.
    ///
    /// ```no_run
    /// # async fn run(router: babel_idem::Router) -> Result<(), Box<dyn std::error::Error>> {
    /// use babel_idem::Consumer;
    /// use babel_idem::transport::RedisTransport;
    ///
    /// let transport = RedisTransport::connect("redis://127.0.0.1:6379/0").await?;
    /// let consumer = Consumer::builder(router, transport, "orders").concurrency(1).build()?;
    /// // One delivery at a time: nothing to meet.
    /// assert!(!consumer.batches_store_calls());
    /// # Ok(())
    /// # }
    /// ```
    pub fn batches_store_calls(&self) -> bool {
        self.batch_store_calls && self.concurrency > 1
    }

    /// A handle that reads this consumer's running totals, from any task.
    pub fn progress(&self) -> Progress {
        Progress {
            counters: Arc::clone(&self.counters),
        }
    }
}

impl<T: Transport> ConsumerBuilder<T> {
    setters! {
        /// How many deliveries are handled at once (default
        /// [`DEFAULT_CONCURRENCY`]): handler bodies never run more at a time.
        /// The consumer holds at most this many plus its
        /// [`read_ahead`](Self::read_ahead) reservations, besides those waiting
        /// out a backoff or a delay (at most 4 per slot), deliveries held back
        /// unattempted (copies of an id waiting for its run, deliveries whose
        /// part of the store is down: at most 16 per slot), or a mark on its
        /// way: a delivery whose
        /// guard is marking its run done hands its slot to the next one, whose
        /// guard then asks its store while that mark is on its way (a handler
        /// that goes on into a second guard takes a slot back first).
        pub fn concurrency(concurrency: usize) => self.concurrency;

        /// How many deliveries the consumer reserves ahead of a free handler
        /// slot (default: as many as its [`concurrency`](Self::concurrency),
        /// and at least 4), so the next one is at hand when a handler finishes
        /// and its reservation's round trip overlaps the handlers running. With
        /// every slot busy it reserves again once half its places ahead are
        /// free, so a reservation fetches several deliveries while the rest
        /// ahead keep the handlers busy. A delivery reserved ahead waits for a
        /// slot, in the order reserved, and its reservation is kept alive
        /// meanwhile; a graceful stop handles it like the others held. `0`
        /// reserves only for free slots.
        ///
        /// On a transport whose reservations lapse and cannot be extended
        /// ([`Transport::extends_reservations`]), nothing is read ahead: a
        /// delivery waiting for a slot could outlive its reservation. RabbitMQ
        /// with a `consumer_timeout` is one: there the channel's
        /// [`prefetch`](crate::transport::TransportBuilder::prefetch) reads
        /// ahead instead (deliveries wait in the client, and reserving one takes
        /// no round trip), so set it above the concurrency. Without a consumer
        /// timeout the prefetch bounds what the consumer holds: set it to at
        /// least the concurrency plus the read-ahead.
        ///
        /// ```no_run
        /// # async fn run(router: babel_idem::Router) -> Result<(), Box<dyn std::error::Error>> {
        /// use babel_idem::Consumer;
        /// use babel_idem::transport::RedisTransport;
        ///
        /// let transport = RedisTransport::connect("redis://127.0.0.1:6379/0").await?;
        /// let consumer = Consumer::builder(router, transport, "orders")
        ///     .concurrency(1)
        ///     .read_ahead(0) // reserve only when the handler is free
        ///     .build()?;
        /// assert_eq!(consumer.read_ahead(), 0);
        /// # Ok(())
        /// # }
        /// ```
        pub fn read_ahead(deliveries: usize) => self.read_ahead = Some(deliveries);

        /// How long a graceful stop waits for in-flight deliveries (default 30 s).
        pub fn shutdown_timeout(timeout: Duration) => self.shutdown_timeout;

        /// Bodies longer than `bytes` are dead-lettered as poison without being
        /// decoded (default: no limit).
        pub fn max_body_bytes(bytes: usize) => self.max_body_bytes = Some(bytes);

        /// The dead-letter queue (default `<queue>.dlq`, the BabelQueue convention).
        pub fn dead_letter_queue(queue: impl Into<String>) => self.dead_letter_queue = Some(queue.into());
    }

    /// How long to wait before asking an empty queue again: `first`, doubling
    /// on every further empty answer up to `max` (default 10 ms to 500 ms).
    pub fn idle_poll(mut self, first: Duration, max: Duration) -> Self {
        self.idle_poll = (first, max.max(first));
        self
    }

    setters! {
        /// How long one handler may run. A handler that runs longer is dropped
        /// (its guard leaves the id unmarked) and the delivery is retried as a
        /// failed attempt, so a hung handler cannot keep a handler slot, or the
        /// message, for ever.
        ///
        /// The default depends on the transport's reservations:
        /// - kept alive while the handler runs
        ///   ([`Transport::extends_reservations`], Redis):
        ///   [`DEFAULT_DELIVERY_TIMEOUT`], 15 minutes, whatever the
        ///   reservation's lifetime: a handler may outlive any number of
        ///   reservations, and `retry_after` only says how soon a crashed
        ///   worker's deliveries come back;
        /// - lapsing and never extended (RabbitMQ's `consumer_timeout`): 90 %
        ///   of the [`reservation_lifetime`](Transport::reservation_lifetime)
        ///   less the longest retry backoff or release delay, so the handler
        ///   and the wait after it fit in one reservation;
        /// - never lapsing: none.
        ///
        /// ```no_run
        /// # async fn run(router: babel_idem::Router) -> Result<(), Box<dyn std::error::Error>> {
        /// use babel_idem::Consumer;
        /// use babel_idem::transport::RedisTransport;
        /// use std::time::Duration;
        ///
        /// let transport = RedisTransport::connect("redis://127.0.0.1:6379/0").await?;
        /// // Reports that take up to half an hour.
        /// let consumer = Consumer::builder(router, transport, "reports")
        ///     .delivery_timeout(Duration::from_secs(45 * 60))
        ///     .build()?;
        /// # Ok(())
        /// # }
        /// ```
        pub fn delivery_timeout(timeout: Duration) => self.delivery_timeout = Timeout::Set(timeout);
    }

    /// No per-delivery timeout: a handler may run for ever.
    pub fn no_delivery_timeout(mut self) -> Self {
        self.delivery_timeout = Timeout::Never;
        self
    }

    setters! {
        /// How long a released delivery with no delay of its own (an unknown
        /// URN under [`UnknownUrnStrategy::Release`](crate::router::UnknownUrnStrategy::Release))
        /// waits before it goes back (default [`DEFAULT_RELEASE_DELAY`]), without
        /// a handler slot: a message no consumer knows is not reserved in a loop.
        pub fn release_delay(delay: Duration) => self.release_delay;

        /// Whether the `seen` and `remember` calls of the deliveries held
        /// together go to the store together (default `true`; it takes effect
        /// with a [`concurrency`](Self::concurrency) above 1).
        ///
        /// While on, a guard (`#[idempotent]`, [`run_once`](crate::guard::run_once),
        /// [`Guard`](crate::guard::Guard) in seen-set mode) running in one of
        /// this consumer's deliveries sends its call to a store that answers a
        /// batch in one round trip (`Store::batch_target`:
        /// Redis, PostgreSQL, SQLite) through a meeting point shared by the
        /// consumer's deliveries, as [`Batched`](crate::store::Batched) does:
        /// a lone call goes out at once as the single call; calls that meet go
        /// out as one `seen_many` / `remember_many`; a batch that fails leaves
        /// each call to ask alone. Answers and decisions are those of single
        /// calls. Calls to other stores (in memory, a store of your own that
        /// does not override `batch_target`, a store already in `Batched`),
        /// claim mode's calls and transactional mode's marks stay one per
        /// message. `false` keeps every call one per message.
        ///
        /// ```no_run
        /// # async fn run(router: babel_idem::Router) -> Result<(), Box<dyn std::error::Error>> {
        /// use babel_idem::Consumer;
        /// use babel_idem::transport::RedisTransport;
        ///
        /// let transport = RedisTransport::connect("redis://127.0.0.1:6379/0").await?;
        /// let consumer = Consumer::builder(router, transport, "orders")
        ///     .concurrency(64)
        ///     .batch_store_calls(false) // one store call per message
        ///     .build()?;
        /// assert!(!consumer.batches_store_calls());
        /// # Ok(())
        /// # }
        /// ```
        pub fn batch_store_calls(batch: bool) => self.batch_store_calls;
    }

    /// Checks the settings, and the queue and dead-letter queue names
    /// against the transport ([`Transport::check_queue`]): a name the
    /// transport's layout cannot hold is an error here, before anything runs.
    ///
    /// On a transport that cannot extend a reservation
    /// ([`Transport::extends_reservations`]), the per-delivery timeout plus
    /// the longest wait after it (retry backoff, release delay) must fit in
    /// a reservation: a configuration under which the consumer could hold
    /// a delivery past its lifetime is refused, with the arithmetic in the
    /// error.
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
        let lifetime = self.transport.reservation_lifetime();
        let extends = self.transport.extends_reservations();
        // A delivery is held while its handler runs and while it waits its
        // backoff or release delay. Where the transport cannot extend the
        // reservation, the two together must fit in it: one that lapsed is
        // redelivered with its old `attempts`, the settle touches nothing,
        // and the message would never reach the dead-letter queue.
        let longest_wait = self
            .router
            .longest_backoff()
            .unwrap_or_default()
            .max(self.release_delay);
        let delivery_timeout = match self.delivery_timeout {
            Timeout::Set(timeout) => Some(timeout),
            Timeout::Never => None,
            Timeout::Default => lifetime.map(|lifetime| match extends {
                // Kept alive while the handler runs: the reservation's
                // lifetime bounds nothing, so it sets nothing.
                true => DEFAULT_DELIVERY_TIMEOUT,
                false => fitted_delivery_timeout(lifetime.saturating_sub(longest_wait)),
            }),
        };
        if let (Some(reservation), false) = (lifetime, extends) {
            let handler = delivery_timeout.unwrap_or_default();
            if longest_wait >= reservation
                || handler + longest_wait >= reservation
                || delivery_timeout == Some(Duration::ZERO)
            {
                return Err(ConsumerError::OutlivesReservation {
                    delivery_timeout,
                    longest_wait,
                    reservation,
                });
            }
        }
        if delivery_timeout == Some(Duration::ZERO) {
            return Err(ConsumerError::ZeroDeliveryTimeout);
        }
        // Extended at a third of its lifetime: two extensions can fail
        // before the reservation lapses.
        let keep_alive = lifetime.filter(|_| extends).map(|lifetime| lifetime / 3);
        // A delivery reserved ahead waits for a slot for as long as the
        // handlers before it take: only a reservation that cannot lapse
        // while it waits may be read ahead.
        let read_ahead = match lifetime.is_none() || extends {
            true => self
                .read_ahead
                .unwrap_or(self.concurrency.max(LEAST_DEFAULT_READ_AHEAD)),
            false => 0,
        };
        Ok(Consumer {
            router: self.router,
            transport: self.transport,
            queue: self.queue.into(),
            dead_letter_queue: dead_letter_queue.into(),
            concurrency: self.concurrency,
            read_ahead,
            shutdown_timeout: self.shutdown_timeout,
            max_body_bytes: self.max_body_bytes,
            idle_poll: self.idle_poll,
            delivery_timeout,
            release_delay: self.release_delay,
            keep_alive,
            max_waiting: self.concurrency.saturating_mul(WAITING_PER_SLOT),
            max_held_back: self.concurrency.saturating_mul(HELD_BACK_PER_SLOT),
            batch_store_calls: self.batch_store_calls,
            counters: Arc::default(),
        })
    }
}

/// Why a [`Consumer`] could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConsumerError {
    /// `concurrency(0)`: nothing could ever be handled.
    #[error("concurrency must be at least 1")]
    ZeroConcurrency,
    /// The dead-letter queue is the consumed queue: failures would loop.
    #[error("the dead-letter queue must differ from the consumed queue")]
    DeadLetterQueueIsTheQueue,
    /// The transport refused a queue name.
    #[error("{0}")]
    Transport(#[from] TransportError),
    /// `delivery_timeout(Duration::ZERO)`: no handler could ever finish.
    #[error("the per-delivery timeout must be longer than zero")]
    ZeroDeliveryTimeout,
    /// On a transport that cannot extend a reservation, the per-delivery
    /// timeout plus the longest wait after it (retry backoff, release
    /// delay) does not fit in a reservation: it would lapse while the
    /// consumer holds it, the broker would redeliver the message with its
    /// old `attempts`, and it would never be dead-lettered.
    #[error(
        "{handler} + the longest retry backoff or release delay ({longest_wait:?}) \
         = {total:?}, which must be shorter than a reservation on the transport \
         ({reservation:?}), as the transport cannot extend one: the delivery is \
         held through both, so it would lapse and come back without counting the \
         attempt; shorten the timeout or the waits, or lengthen the reservation",
        handler = timeout_text(*.delivery_timeout),
        total = .delivery_timeout.unwrap_or_default() + *.longest_wait,
    )]
    OutlivesReservation {
        /// The per-delivery timeout (`None`: no timeout left once the wait
        /// is taken out of the reservation, or none set).
        delivery_timeout: Option<Duration>,
        /// The longest retry backoff or release delay.
        longest_wait: Duration,
        /// How long a reservation lasts ([`Transport::reservation_lifetime`]).
        reservation: Duration,
    },
}

/// How [`ConsumerError::OutlivesReservation`] names the handler's time.
fn timeout_text(delivery_timeout: Option<Duration>) -> String {
    match delivery_timeout {
        Some(timeout) => format!("the per-delivery timeout ({timeout:?})"),
        None => "a handler with no time left to run".to_owned(),
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
        let c = &*self.counters;
        let failing = if c.reserve_failing.load(Ordering::Relaxed) {
            Some(Failing::Broker)
        } else if c.outage.is_down() {
            Some(Failing::Store)
        } else {
            None
        };
        c.counts(failing)
    }

    /// The last reservation error, while reservations fail; `None` once
    /// one succeeds.
    pub fn reserve_error(&self) -> Option<String> {
        self.counters
            .reserve_error
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Completes once the consumer has reserved nothing new and had nothing
    /// in flight for `quiet`, while its reservations succeeded (at least one
    /// came back empty in that time, none failed) and its store was up
    /// (checked every 50 ms or `quiet`, whichever is shorter): a shutdown
    /// future for "stop when the queue is drained". A consumer whose broker
    /// or store fails is not idle: pair this with
    /// [`failing_for`](Self::failing_for) to stop on either.
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
        let c = &*self.counters;
        let busy = || {
            let now = self.report();
            (
                now.delivered,
                now.broker_errors,
                now.in_flight > 0 || now.failing.is_some(),
            )
        };
        let mut last = busy();
        let mut quiet_since = tokio::time::Instant::now();
        let mut empties = c.empty_reserves.load(Ordering::Relaxed);
        loop {
            tokio::time::sleep(tick).await;
            let now = busy();
            if now.0 != last.0 || now.1 != last.1 || now.2 {
                last = now;
                quiet_since = tokio::time::Instant::now();
                empties = c.empty_reserves.load(Ordering::Relaxed);
            } else if quiet_since.elapsed() >= quiet
                && c.empty_reserves.load(Ordering::Relaxed) > empties
            {
                return;
            }
        }
    }

    /// Completes once the consumer has been failing (its reservations, or
    /// its store: [`ConsumerReport::failing`]) for `patience` without a
    /// break (checked every 50 ms or `patience`, whichever is shorter): a
    /// shutdown future for a run that should end rather than wait out an
    /// outage. The report then says what was failing.
    ///
    /// ```no_run
    /// # async fn run(consumer: babel_idem::Consumer<babel_idem::transport::RedisTransport>) {
    /// use std::time::Duration;
    ///
    /// let (idle, failing) = (consumer.progress(), consumer.progress());
    /// let report = consumer
    ///     .run_until(async {
    ///         tokio::select! {
    ///             () = idle.idle_for(Duration::from_secs(2)) => {}
    ///             () = failing.failing_for(Duration::from_secs(30)) => {}
    ///         }
    ///     })
    ///     .await;
    /// if let Some(failing) = report.failing {
    ///     eprintln!("stopped while the {failing} was failing");
    /// }
    /// # }
    /// ```
    pub async fn failing_for(&self, patience: Duration) {
        let tick = patience.min(Duration::from_millis(50));
        let mut failing_since = None;
        loop {
            tokio::time::sleep(tick).await;
            match (self.report().failing, failing_since) {
                (None, _) => failing_since = None,
                (Some(_), None) => failing_since = Some(tokio::time::Instant::now()),
                (Some(_), Some(since)) if since.elapsed() >= patience => return,
                (Some(_), Some(_)) => {}
            }
        }
    }
}

/// What a [`Consumer`] was failing on ([`ConsumerReport::failing`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Failing {
    /// Its last reservation failed (the broker is down, out of memory,
    /// refusing); [`Progress::reserve_error`] says how.
    Broker,
    /// Its guards' store could not answer: reservations are paused.
    Store,
}

impl fmt::Display for Failing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Failing::Broker => "broker",
            Failing::Store => "store",
        })
    }
}

/// Declares the counts of a [`ConsumerReport`] once: its `u64` fields, the
/// [`Counters`] that count them while the consumer runs (with the `state`
/// kept beside them), and the read of one into the other.
macro_rules! totals {
    (
        counts { $($(#[$doc:meta])* $name:ident,)+ }
        state { $($(#[$state_doc:meta])* $state:ident: $state_ty:ty,)+ }
    ) => {
        /// What a [`Consumer`] did, counted since it was built.
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        #[non_exhaustive]
        pub struct ConsumerReport {
            $($(#[$doc])* pub $name: u64,)+
            /// What the consumer was failing on when this was read (`None`: its
            /// last reservation succeeded and its store answers).
            pub failing: Option<Failing>,
        }

        /// Running totals, shared by the consumer loop and its [`Progress`]
        /// handles: the counts of a [`ConsumerReport`] and the state beside them.
        #[derive(Debug, Default)]
        struct Counters {
            $($name: AtomicU64,)+
            $($(#[$state_doc])* $state: $state_ty,)+
        }

        impl Counters {
            /// The counts so far, with what the consumer is `failing` on.
            fn counts(&self, failing: Option<Failing>) -> ConsumerReport {
                ConsumerReport {
                    $($name: self.$name.load(Ordering::Relaxed),)+
                    failing,
                }
            }
        }
    };
}

totals! {
    counts {
        /// Deliveries reserved.
        delivered,
        /// Calls to [`Transport::reserve`] (each one round trip for a batch,
        /// with the Redis transport), empty answers included.
        reserve_calls,
        /// Deliveries reserved and not settled yet.
        in_flight,
        /// Acked: handled, or skipped by the guard as duplicates.
        acked,
        /// Acked and dropped by the unknown-URN strategy `Delete`.
        deleted,
        /// Requeued with `attempts + 1`.
        retried,
        /// Requeued unchanged (`Release`).
        released,
        /// Written to the dead-letter queue.
        dead_lettered,
        /// Taken back by the transport's recovery (the Redis sweep) before they
        /// were settled: the reservation had lapsed, so the settle touched
        /// nothing and the delivery will come again.
        lapsed,
        /// Still running when a graceful stop timed out: dropped unsettled, left
        /// to the broker's recovery.
        unfinished,
        /// Broker operations that failed and were retried.
        broker_errors,
        /// Handlers dropped at the per-delivery timeout (each retried as a
        /// failed attempt).
        timed_out,
        /// Deliveries handed back unchanged because their guard's store could
        /// not answer (counted in `released` too; no attempt spent).
        store_unavailable,
        /// Store outages: each paused reservations until the store answered.
        store_outages,
        /// Deliveries that met another delivery of the same id being run (and
        /// waited for it to end, or went back as `id_busy` counts).
        waited_for_id,
        /// Deliveries handed back unchanged, unattempted, because another
        /// delivery of their id was being run: every place for copies waiting
        /// was taken (a burst of one id), or that run went on past the
        /// per-delivery timeout. Counted in `released` too; no attempt spent.
        id_busy,
    }
    state {
        /// Reservations that succeeded with nothing to hand out.
        empty_reserves: AtomicU64,
        /// Whether the last reservation failed.
        reserve_failing: AtomicBool,
        /// The last reservation error, while reservations fail.
        reserve_error: Mutex<Option<String>>,
        /// Whether the store is down, and the pause it imposes.
        outage: Outage,
    }
}
