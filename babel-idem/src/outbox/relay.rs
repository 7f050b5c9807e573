//! [`Relay`]: drains an outbox's pending rows to a broker.
//!
//! The relay holds its outbox and its broker as trait objects
//! ([`OutboxSource`], [`Publisher`]) rather than as type parameters: the
//! programs that run one (the CLI, a worker configured by URL) pick the
//! database and the broker at run time, and one compiled relay serves every
//! pair; what the indirection costs is a virtual call per batch, beside a
//! database and a broker round trip.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{
    Backoff, Batch, Marks, OutboxError, OutboxSource, OutboxStats, PendingRow, PollOnly, Wakeup,
};
use crate::broker::{BatchOutcome, Outgoing, Publisher, TransportError};

/// The family's batch: rows taken, published and marked at a time.
pub const DEFAULT_BATCH: u32 = 100;
/// How many refusals turn a row `'failed'` by default.
pub const DEFAULT_MAX_PUBLISH_ATTEMPTS: u32 = 10;
/// The largest body the relay publishes by default: RabbitMQ's default
/// `max_message_size` (16 MiB).
pub const DEFAULT_MAX_BODY: usize = 16 * 1024 * 1024;

/// The outbox a [`Relay`] drains: any [`OutboxSource`], made by `From` of
/// one (or by [`shared`](RelaySource::shared) of an `Arc<dyn OutboxSource>`
/// chosen at run time); it derefs to the outbox.
///
/// ```
/// use babel_idem::outbox::{RelaySource, SqliteOutbox};
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let pool = sqlx::sqlite::SqlitePoolOptions::new().connect_lazy("sqlite::memory:").unwrap();
/// let source = RelaySource::from(SqliteOutbox::new(pool));
/// assert_eq!(source.table(), "babelqueue_outbox");
/// # });
/// ```
#[derive(Clone)]
pub struct RelaySource(Arc<dyn OutboxSource>);

impl<S: OutboxSource> From<S> for RelaySource {
    fn from(outbox: S) -> Self {
        RelaySource(Arc::new(outbox))
    }
}

impl RelaySource {
    /// The source for an outbox already shared, chosen at run time.
    pub fn shared(outbox: Arc<dyn OutboxSource>) -> Self {
        RelaySource(outbox)
    }
}

impl std::ops::Deref for RelaySource {
    type Target = dyn OutboxSource;

    fn deref(&self) -> &Self::Target {
        &*self.0
    }
}

impl std::fmt::Debug for RelaySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("RelaySource").field(&self.0.table()).finish()
    }
}

/// The broker a [`Relay`] publishes to: any [`Publisher`], made by `From`
/// of one (or of an `Arc<dyn Publisher>` chosen at run time).
///
/// ```no_run
/// use babel_idem::outbox::RelaySink;
/// use babel_idem::transport::RedisTransport;
///
/// # async fn run() -> Result<(), babel_idem::transport::TransportError> {
/// let sink = RelaySink::from(RedisTransport::connect("redis://127.0.0.1:6379/0").await?);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RelaySink(Arc<dyn Publisher>);

impl<P: Publisher> From<P> for RelaySink {
    fn from(publisher: P) -> Self {
        RelaySink(Arc::new(publisher))
    }
}

impl From<Arc<dyn Publisher>> for RelaySink {
    fn from(publisher: Arc<dyn Publisher>) -> Self {
        RelaySink(publisher)
    }
}

impl std::fmt::Debug for RelaySink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RelaySink")
    }
}

impl RelaySink {
    /// Publishes `messages`; when the batch fails as a whole with a
    /// refusal while the broker still answers (RabbitMQ closes the channel
    /// over one message, such as a body over its `max_message_size`),
    /// publishes each half again, down to the message the broker refuses,
    /// whose outcome is the error. `Err` when the broker cannot be reached
    /// or cannot take the batch now (it did not answer in time): no message
    /// is blamed for that.
    async fn publish_isolating(
        &self,
        messages: &[Outgoing<'_>],
    ) -> Result<BatchOutcome, TransportError> {
        let error = match self.0.publish_batch(messages).await {
            Ok(outcome) => return Ok(outcome),
            Err(error) => error,
        };
        if !error.is_refusal() || !self.0.refused_while_reachable().await {
            return Err(error);
        }
        if messages.len() == 1 {
            return Ok(vec![Err(error)]);
        }
        let (left, right) = messages.split_at(messages.len() / 2);
        let mut outcome = Box::pin(self.publish_isolating(left)).await?;
        outcome.extend(Box::pin(self.publish_isolating(right)).await?);
        Ok(outcome)
    }
}

/// Why the relay stopped or a pass failed.
///
/// [`run`](Relay::run) and [`drain`](Relay::drain) stop only on an error
/// that waiting cannot cure (a missing table, bad credentials, a closed
/// pool, a statement the database refuses); a database or broker that is
/// down, busy or cut off is waited out. [`run_once`](Relay::run_once)
/// returns every error.
///
/// ```
/// use babel_idem::outbox::{OutboxError, RelayError};
///
/// let error = RelayError::from(OutboxError::MissingTable { table: "babelqueue_outbox".into() });
/// assert!(error.to_string().contains("babel-idem migrate URL --outbox"));
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RelayError {
    /// The outbox failed (a missing table names `babel-idem migrate`); from
    /// `run` and `drain`, never a database outage, which they wait out.
    #[error("{0}")]
    Outbox(#[from] OutboxError),
    /// The broker could not be reached, or took none of the batch's rows
    /// through no fault of theirs (each returned or held back): no row was
    /// marked, and no row spent an attempt.
    #[error("{0} (the rows stay pending; no attempt was counted)")]
    Broker(#[source] TransportError),
}

/// What a relay did: rows published, refused (an attempt recorded) and
/// turned `'failed'`, rows the broker did not take through no fault of
/// theirs, and how many times the broker was unreachable.
///
/// ```
/// let report = babel_idem::outbox::RelayReport::default();
/// assert_eq!((report.published, report.waiting), (0, 0));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RelayReport {
    /// Rows the broker accepted and the relay marked published.
    pub published: u64,
    /// Refusals recorded on rows (each an attempt).
    pub refused: u64,
    /// Rows now `'failed'`: refused for the last of their maximum
    /// attempts, or unreadable as they stand (a body that is not UTF-8
    /// text, headers that do not parse).
    pub failed: u64,
    /// Passes that found the broker unreachable, or in which it took none
    /// of the rows and refused none (each returned or held back; such rows
    /// are not counted in `waiting`).
    pub outages: u64,
    /// Rows the broker did not take through no fault of theirs, in passes
    /// where it took or refused others: returned (no queue took them; the
    /// queue was deleted since it was declared, and is declared again) or
    /// held back (a nack from a full `x-overflow: reject-publish` queue).
    /// They stay pending with no attempt spent, and are published again by
    /// a later pass.
    pub waiting: u64,
}

impl RelayReport {
    fn add(&mut self, other: RelayReport) {
        self.published += other.published;
        self.refused += other.refused;
        self.failed += other.failed;
        self.outages += other.outages;
        self.waiting += other.waiting;
    }
}

/// Configures a [`Relay`]; made by [`Relay::builder`].
///
/// ```no_run
/// use babel_idem::outbox::{Relay, SqliteOutbox};
/// use babel_idem::transport::AmqpTransport;
/// use std::time::Duration;
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let pool = sqlx::SqlitePool::connect("sqlite://app.db").await?;
/// let transport = AmqpTransport::connect("amqp://guest:guest@127.0.0.1:5672/%2f").await?;
/// let relay = Relay::builder(SqliteOutbox::new(pool), transport)
///     .batch_size(200)
///     .max_attempts(5)
///     .backoff(Duration::from_millis(100), Duration::from_secs(10))
///     .poll_interval(Duration::from_millis(250))
///     .build()
///     .await?;
/// relay.drain().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct RelayBuilder {
    source: RelaySource,
    sink: RelaySink,
    batch: u32,
    backoff: Backoff,
    max_attempts: u32,
    max_body: usize,
    poll: Duration,
    notifications: bool,
}

impl RelayBuilder {
    /// Rows taken, published and marked at a time (default 100, the
    /// family's; at least 1).
    pub fn batch_size(self, batch: u32) -> Self {
        self.with(|relay| relay.batch = batch.max(1))
    }

    /// The wait after a refusal, per attempt so far (default 50 ms), and
    /// its cap (default 5 s): the family's backoff. The same steps pace the
    /// relay while the broker or the database is out: the step times the
    /// outages in a row, at most the cap.
    pub fn backoff(self, step: Duration, cap: Duration) -> Self {
        self.with(|relay| relay.backoff = Backoff { step, cap })
    }

    /// After how many refusals a row is set `'failed'` (default 10; at
    /// least 1). `babel-idem outbox retry-failed` makes such rows pending.
    pub fn max_attempts(self, attempts: u32) -> Self {
        self.with(|relay| relay.max_attempts = attempts.max(1))
    }

    /// The largest body the relay publishes, in bytes (default 16 MiB); a
    /// larger one is refused like a row the broker refused.
    pub fn max_body_bytes(self, bytes: usize) -> Self {
        self.with(|relay| relay.max_body = bytes)
    }

    /// How long [`run`](Relay::run) waits for a wake-up before it looks
    /// again (default 1 s): the latency for rows other processes write.
    pub fn poll_interval(self, poll: Duration) -> Self {
        self.with(|relay| relay.poll = poll)
    }

    /// Whether an idle relay waits for `save`'s wake-up (PostgreSQL's
    /// `LISTEN`, SQLite's in-process signal) or only polls (default `true`).
    pub fn notifications(self, on: bool) -> Self {
        self.with(|relay| relay.notifications = on)
    }

    /// This builder with `change` made to it.
    fn with(mut self, change: impl FnOnce(&mut Self)) -> Self {
        change(&mut self);
        self
    }

    /// Checks that the outbox table exists (and whether it has the
    /// `headers` column), and makes the relay.
    pub async fn build(self) -> Result<Relay, RelayError> {
        let headers = self.source.has_headers().await?;
        Ok(Relay {
            settings: self,
            headers,
        })
    }
}

/// Drains an outbox: takes pending rows oldest first, publishes each body
/// byte for byte to its row's queue (with the row's `headers` as transport
/// headers), and marks each published once the broker accepted it (a
/// confirm, on RabbitMQ).
///
/// - One batch is one round trip to the broker: one pipeline on Redis, one
///   confirm round on RabbitMQ; one statement takes it and one marks it.
///   While a batch's mark commits, [`run`](Relay::run) and
///   [`drain`](Relay::drain) take and publish the next batch (never a row
///   of the batch being marked), so the database and the broker work at
///   the same time. A larger [`batch_size`](RelayBuilder::batch_size)
///   spreads each round trip over more rows.
/// - A row the broker refuses for what it is (a queue name the transport
///   cannot hold, a key of the wrong type, a body RabbitMQ closes the
///   channel over, a body over
///   [`max_body_bytes`](RelayBuilder::max_body_bytes):
///   [`TransportError::is_refusal`]) gets `attempts + 1`, `last_error` (at
///   most 500 characters) and `failed_at`, and waits 50 ms per attempt (at
///   most 5 s) before it is tried again; after
///   [`max_attempts`](RelayBuilder::max_attempts) it is `'failed'`. The
///   other rows go on.
/// - A row the broker did not take through no fault of its own stays
///   pending with no attempt spent, and a later pass publishes it again
///   (counted in [`RelayReport::waiting`]): on RabbitMQ every publish is
///   mandatory, so a row no queue took (its queue deleted while the relay
///   runs) comes back instead of being confirmed, and its queue is declared
///   again on the next pass; a nack (a full `x-overflow: reject-publish`
///   queue) is back-pressure. A row is marked published only once a queue
///   holds it.
/// - A broker that cannot be reached, or that answers for its own state
///   rather than for a row (Redis busy running a script, loading, read-only,
///   out of memory), is nobody's fault: no row is marked and none spends an
///   attempt; the relay waits (the same steps) and tries again. A pass in
///   which the broker took none of the rows and refused none (each returned
///   or held back) is paced the same way.
/// - So is a database outage met while taking or marking a batch: the
///   connection lost or ended by the server (PostgreSQL's `57P01
///   admin_shutdown`, a `08` connection exception), the server down,
///   starting, out of connections or disk, SQLite's file locked past its
///   busy timeout. The relay logs it, drops the batch unmarked (its rows
///   stay pending; a batch already published is published again: at least
///   once), and tries again on a fresh connection after the backoff's step
///   times the outages in a row, at most its cap. [`run`](Relay::run) and
///   [`drain`](Relay::drain) wait as long as the outage lasts (the
///   shutdown of `run` or [`drain_until`](Relay::drain_until) ends the
///   wait); a missing table, bad credentials or a closed pool stop them.
/// - A row the relay cannot read as it stands (another writer's: a body
///   or queue that is not UTF-8 text, a SQLite BLOB, headers that are not a
///   JSON object of strings) is set `'failed'` at once with the reason as
///   `last_error`, counted in [`RelayReport::failed`] and logged; the rows
///   around it go on.
/// - RabbitMQ closes the channel over some messages (a body over its
///   `max_message_size`), failing the whole batch while it still answers:
///   the relay then publishes each half of the batch again, down to the
///   row the broker refuses, which is refused as above with the broker's
///   reason; the others are published. The rows the broker took before it
///   closed the channel are published again (at least once).
/// - On PostgreSQL the rows a relay took stay locked (`FOR UPDATE SKIP
///   LOCKED`) until it marked them, so several relays share an outbox,
///   each row taken by one at a time; `LISTEN`/`NOTIFY` wakes them. On
///   SQLite run one relay per database; a `save` in the same process wakes
///   it.
/// - Order: with one relay and no refused or held back row, each queue
///   receives its rows in id order, among the rows committed when the
///   relay read. With several relays, a refused row waiting its backoff, or
///   a row a full queue held back, it is not promised.
/// - Give the relay its own pool (on SQLite `synchronous = NORMAL` in WAL
///   mode, as `babel-idem relay` opens it): its marks need no flush to
///   disk, since a lost mark only publishes its row again.
/// - Delivery is at least once: a relay that dies after the broker
///   accepted a batch and before it marked it publishes that batch again,
///   with the same `meta.id`s, which consumers deduplicate; with the next
///   batch published while the previous one's mark commits, that is at
///   most the two batches in flight.
/// - The [`RelayReport`] that `run`, `drain` and `drain_until` return
///   counts a batch once its mark committed: its totals are the rows the
///   relay recorded in the table.
///
/// ```no_run
/// use babel_idem::outbox::{Relay, SqliteOutbox};
/// use babel_idem::transport::RedisTransport;
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let pool = sqlx::SqlitePool::connect("sqlite://app.db").await?;
/// let outbox = SqliteOutbox::new(pool);
/// let transport = RedisTransport::connect("redis://127.0.0.1:6379/0").await?;
/// let relay = Relay::builder(outbox, transport).build().await?;
/// let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
/// // ... `stop.send(())` from a signal handler ...
/// # drop(stop);
/// relay.run(stopped).await?; // until `stop`, after the current batch
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Relay {
    settings: RelayBuilder,
    headers: bool,
}

/// A settled batch whose mark is still to commit, and what it did: the
/// report counts only once the mark committed, so the totals a relay
/// returns are the rows its marks recorded.
struct InFlight {
    settled: Settled,
    report: RelayReport,
}

/// A batch the broker settled: what it accepted and what it refused.
struct Settled {
    taken: Batch,
    published: Vec<i64>,
    refused: Vec<(i64, String)>,
}

/// What taking and publishing a batch came to.
enum Step {
    /// No row was ready.
    Empty,
    /// The broker settled the batch; it remains to mark it.
    Settled(Settled),
    /// The broker could not be reached; nothing is to be marked.
    Outage(TransportError),
}

/// What one pass did with the batch it took.
enum Pass {
    /// Rows were taken and settled.
    Done(RelayReport),
    /// The broker could not be reached; nothing was marked.
    Outage(TransportError),
}

impl Relay {
    /// Configures a relay from `source` to `sink`: any [`OutboxSource`]
    /// (`SqliteOutbox`, `PostgresOutbox`) and any [`Publisher`]
    /// (`RedisTransport`, `AmqpTransport`).
    pub fn builder(source: impl Into<RelaySource>, sink: impl Into<RelaySink>) -> RelayBuilder {
        RelayBuilder {
            source: source.into(),
            sink: sink.into(),
            batch: DEFAULT_BATCH,
            backoff: Backoff::default(),
            max_attempts: DEFAULT_MAX_PUBLISH_ATTEMPTS,
            max_body: DEFAULT_MAX_BODY,
            poll: Duration::from_secs(1),
            notifications: true,
        }
    }

    /// One batch: take, publish, mark. A broker that cannot be reached is
    /// [`RelayError::Broker`], with nothing marked.
    pub async fn run_once(&self) -> Result<RelayReport, RelayError> {
        match self.pass().await? {
            Pass::Done(report) => Ok(report),
            Pass::Outage(error) => Err(RelayError::Broker(error)),
        }
    }

    /// Runs batches until the outbox holds no pending row (each one
    /// published, or `'failed'` after its last refusal), waiting out
    /// backoffs and outages of the broker and of the database, however
    /// long they last; what it did.
    pub async fn drain(&self) -> Result<RelayReport, RelayError> {
        self.run_until(std::future::pending::<()>(), true).await
    }

    /// [`drain`](Relay::drain), unless `shutdown` completes first: then it
    /// returns after the current batch is published and marked, with what
    /// it did so far (rows still pending stay for the next run).
    ///
    /// ```no_run
    /// use babel_idem::outbox::{Relay, SqliteOutbox};
    /// use babel_idem::transport::RedisTransport;
    ///
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let pool = sqlx::SqlitePool::connect("sqlite://app.db").await?;
    /// let transport = RedisTransport::connect("redis://127.0.0.1:6379/0").await?;
    /// let relay = Relay::builder(SqliteOutbox::new(pool), transport).build().await?;
    /// let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    /// // ... `stop.send(())` from a signal handler ...
    /// # drop(stop);
    /// let report = relay.drain_until(stopped).await?;
    /// println!("published {}", report.published); // the rows marked published
    /// # Ok(())
    /// # }
    /// ```
    pub async fn drain_until(&self, shutdown: impl Future) -> Result<RelayReport, RelayError> {
        self.run_until(shutdown, true).await
    }

    /// Runs until `shutdown` completes, then returns after the current
    /// batch: publishes what is pending, then waits for a wake-up (a
    /// `NOTIFY` on PostgreSQL, a `save` of this process on SQLite) or the
    /// poll interval. Outages of the broker and of the database are waited
    /// out, however long they last.
    pub async fn run(&self, shutdown: impl Future) -> Result<RelayReport, RelayError> {
        self.run_until(shutdown, false).await
    }

    async fn run_until(
        &self,
        shutdown: impl Future,
        until_empty: bool,
    ) -> Result<RelayReport, RelayError> {
        let mut shutdown = std::pin::pin!(shutdown);
        let mut wake: Box<dyn Wakeup> = if self.settings.notifications {
            self.settings.source.wakeup().await
        } else {
            Box::new(PollOnly)
        };
        let mut total = RelayReport::default();
        let mut outages = 0u32;
        let mut last_metrics: Option<Instant> = None;
        // The batch published whose mark commits while the next batch is
        // taken and published: a crash repeats at most these two batches.
        let mut in_flight: Option<InFlight> = None;
        loop {
            let marking = in_flight.take();
            let skip = marking
                .as_ref()
                .map(|batch| batch.settled.taken.ids())
                .unwrap_or_default();
            let (marked, stepped) = tokio::join!(self.mark_counted(marking), self.step(&skip));
            // Whether the broker or the database was out this pass: the
            // rows concerned stay pending, none spends an attempt.
            let mut out = false;
            // Whether the outbox looked drained.
            let mut drained = false;
            match marked {
                Ok(report) => total.add(report),
                Err(error) => out |= self.outage(error)?,
            }
            match stepped {
                Ok(Step::Outage(error)) => {
                    out = true;
                    total.outages += 1;
                    tracing::warn!(%error, "babel-idem relay: the broker is unreachable; no row spent an attempt");
                }
                Ok(Step::Empty) => drained = true,
                Ok(Step::Settled(settled)) => {
                    drained = settled.taken.len() < self.settings.batch as usize;
                    let report = self.counted(&settled);
                    in_flight = Some(InFlight { settled, report });
                }
                Err(error) => out |= self.outage(error)?,
            }
            let mut pause = None;
            if drained && !out {
                // The outbox looked drained: mark before looking again.
                match self.settle(&mut in_flight).await {
                    Ok(report) => total.add(report),
                    Err(error) => out |= self.outage(error)?,
                }
            }
            if drained && !out {
                if !until_empty {
                    self.record_metrics(&mut last_metrics).await;
                    outages = 0;
                    let wait = wake.wait(self.settings.poll);
                    tokio::select! {
                        biased;
                        _ = &mut shutdown => return Ok(total),
                        _ = wait => {}
                    }
                    continue;
                }
                match self.stats().await {
                    Ok(stats) if stats.pending == 0 => {
                        // The last figures, whenever the previous ones were taken.
                        self.record_metrics(&mut None).await;
                        return Ok(total);
                    }
                    // Rows waiting out a backoff.
                    Ok(_) => pause = Some(self.settings.backoff.step),
                    Err(error) => out |= self.outage(error)?,
                }
            }
            if out {
                outages += 1;
                pause = Some(self.step_backoff(outages));
            } else {
                outages = 0;
            }
            self.record_metrics(&mut last_metrics).await;
            let stop = match pause {
                Some(pause) => tokio::select! {
                    biased;
                    _ = &mut shutdown => true,
                    _ = tokio::time::sleep(pause) => false,
                },
                None => poll_now(&mut shutdown),
            };
            if stop {
                // The batch published is marked before the relay returns;
                // a mark the database cannot take now publishes its rows
                // again on the next run (at least once).
                match self.settle(&mut in_flight).await {
                    Ok(report) => total.add(report),
                    Err(error) => {
                        self.outage(error)?;
                    }
                }
                return Ok(total);
            }
        }
    }

    /// Sorts an error met while running: an outage of the database (the
    /// connection lost, the server down, busy or full) is logged and
    /// `Ok(true)`, to be waited out with its rows still pending; any other
    /// error stops the relay.
    fn outage(&self, error: RelayError) -> Result<bool, RelayError> {
        match &error {
            RelayError::Outbox(outbox) if outbox.is_outage() => {
                tracing::warn!(%error, "babel-idem relay: the database is unreachable or busy; the rows stay pending and no row spent an attempt");
                Ok(true)
            }
            _ => Err(error),
        }
    }

    /// The wait after the `n`th pass in a row that found the broker or the
    /// database down: the backoff's step times `n`, at most its cap.
    fn step_backoff(&self, n: u32) -> Duration {
        self.settings
            .backoff
            .step
            .saturating_mul(n)
            .min(self.settings.backoff.cap)
    }

    /// The outbox's counts by status and its lag.
    pub async fn stats(&self) -> Result<OutboxStats, RelayError> {
        Ok(self.settings.source.stats().await?)
    }

    /// One batch, taken, published and marked before it returns.
    async fn pass(&self) -> Result<Pass, RelayError> {
        match self.step(&[]).await? {
            Step::Empty => Ok(Pass::Done(RelayReport::default())),
            Step::Outage(error) => Ok(Pass::Outage(error)),
            Step::Settled(settled) => {
                let report = self.counted(&settled);
                self.mark(settled).await?;
                Ok(Pass::Done(report))
            }
        }
    }

    /// Takes a batch, skipping `in_flight` (the previous batch, whose mark
    /// may still be committing), and publishes it.
    async fn step(&self, in_flight: &[i64]) -> Result<Step, RelayError> {
        let settings = &self.settings;
        // On PostgreSQL the rows of `in_flight` stay locked until their
        // mark commits, and the take passes them by.
        let taken = settings
            .source
            .take(settings.batch, settings.backoff, self.headers, in_flight)
            .await?;
        if taken.is_empty() {
            return Ok(Step::Empty);
        }
        for (id, reason) in &taken.unreadable {
            tracing::warn!(row = id, %reason, "babel-idem relay: a row cannot be read; it is set 'failed'");
        }
        match self.publish(&taken.rows).await {
            Ok((published, refused)) => Ok(Step::Settled(Settled {
                taken,
                published,
                refused,
            })),
            // Dropping the rows unmarked (on PostgreSQL, rolling back the
            // transaction) leaves them pending.
            Err(error) => Ok(Step::Outage(error)),
        }
    }

    /// Records what the broker did with a batch: each row it accepted
    /// published, each refusal an attempt, each unreadable row `'failed'`.
    async fn mark(&self, settled: Settled) -> Result<(), RelayError> {
        let settings = &self.settings;
        let marks = Marks {
            published: &settled.published,
            refused: &settled.refused,
            unreadable: &settled.taken.unreadable,
            max_attempts: settings.max_attempts,
        };
        Ok(settings.source.mark(settled.taken.lease, marks).await?)
    }

    /// Marks `batch`, if any; what it did, once the mark committed (a mark
    /// that failed leaves its rows pending, and counts nothing).
    async fn mark_counted(&self, batch: Option<InFlight>) -> Result<RelayReport, RelayError> {
        match batch {
            Some(InFlight { settled, report }) => {
                self.mark(settled).await?;
                Ok(report)
            }
            None => Ok(RelayReport::default()),
        }
    }

    /// Marks the batch in flight, if any; what it did.
    async fn settle(&self, in_flight: &mut Option<InFlight>) -> Result<RelayReport, RelayError> {
        self.mark_counted(in_flight.take()).await
    }

    /// What a settled batch does once marked: the broker's outcome, and
    /// the rows that cannot be read, each `'failed'`.
    fn counted(&self, settled: &Settled) -> RelayReport {
        let mut report = self.done(settled);
        report.failed += settled.taken.unreadable.len() as u64;
        report
    }

    /// Counts, logs and records a settled batch.
    fn done(&self, settled: &Settled) -> RelayReport {
        let (rows, published, refused) =
            (&settled.taken.rows, &settled.published, &settled.refused);
        let max_attempts = i64::from(self.settings.max_attempts);
        let mut failed = 0;
        for (id, error) in refused {
            let attempts = rows
                .iter()
                .find(|row| row.id == *id)
                .map_or(0, |row| row.attempts)
                + 1;
            if attempts >= max_attempts {
                failed += 1;
                tracing::error!(
                    row = id,
                    attempts,
                    %error,
                    "babel-idem relay: the broker refused a row for its last attempt; it is 'failed' (babel-idem outbox retry-failed makes it pending again)"
                );
            } else {
                tracing::warn!(row = id, attempts, %error, "babel-idem relay: the broker refused a row");
            }
        }
        #[cfg(feature = "metrics")]
        {
            ::metrics::counter!(crate::telemetry::metrics::OUTBOX_PUBLISHED_TOTAL)
                .increment(published.len() as u64);
            ::metrics::counter!(crate::telemetry::metrics::OUTBOX_REFUSED_TOTAL)
                .increment(refused.len() as u64);
        }
        // The rows neither published nor refused wait: the broker did not
        // take them through no fault of theirs (see `publish`).
        let waiting = rows.len().saturating_sub(published.len() + refused.len()) as u64;
        RelayReport {
            published: published.len() as u64,
            refused: refused.len() as u64,
            failed,
            outages: 0,
            waiting,
        }
    }

    /// Publishes `rows` in one round trip; the ids the broker accepted and
    /// the refusals (each an attempt: [`TransportError::is_refusal`]). A
    /// row the broker did not take through no fault of its own (returned,
    /// held back) is in neither list: it stays pending with no attempt.
    /// The broker's error when it could not be reached, or when it took
    /// none of the rows and refused none (every one waits): such a pass is
    /// paced as an outage.
    async fn publish(
        &self,
        rows: &[PendingRow],
    ) -> Result<(Vec<i64>, Vec<(i64, String)>), TransportError> {
        let mut refused = Vec::new();
        let mut sent = Vec::with_capacity(rows.len());
        let mut messages = Vec::with_capacity(rows.len());
        for row in rows {
            if row.body.len() > self.settings.max_body {
                refused.push((
                    row.id,
                    format!(
                        "the body is {} bytes, over the relay's maximum of {} bytes",
                        row.body.len(),
                        self.settings.max_body
                    ),
                ));
                continue;
            }
            sent.push(row.id);
            messages
                .push(Outgoing::new(&row.queue, row.body.as_bytes()).with_headers(&row.headers));
        }
        let mut published = Vec::with_capacity(sent.len());
        let mut waiting: Vec<(i64, TransportError)> = Vec::new();
        if !messages.is_empty() {
            let outcome = self.settings.sink.publish_isolating(&messages).await?;
            for (id, result) in sent.into_iter().zip(outcome) {
                match result {
                    Ok(()) => published.push(id),
                    Err(error) if error.is_refusal() => refused.push((id, error.to_string())),
                    Err(error) => waiting.push((id, error)),
                }
            }
        }
        if let Some((_, first)) = waiting.first() {
            tracing::warn!(
                rows = waiting.len(),
                error = %first,
                "babel-idem relay: the broker did not take some rows through no fault of theirs; they stay pending and no attempt was spent"
            );
        }
        if published.is_empty()
            && refused.is_empty()
            && let Some((_, error)) = waiting.into_iter().next()
        {
            return Err(error);
        }
        Ok((published, refused))
    }

    /// Records the outbox's lag and counts by status through the metrics
    /// facade, at most once a second.
    async fn record_metrics(&self, last: &mut Option<Instant>) {
        #[cfg(feature = "metrics")]
        {
            if last.is_some_and(|at| at.elapsed() < Duration::from_secs(1)) {
                return;
            }
            *last = Some(Instant::now());
            if let Ok(stats) = self.stats().await {
                crate::telemetry::metrics::record_outbox(
                    stats.oldest_pending_age,
                    stats.pending,
                    stats.published,
                    stats.failed,
                );
            }
        }
        #[cfg(not(feature = "metrics"))]
        let _ = last;
    }
}

/// Whether `shutdown` has completed, without waiting.
fn poll_now<F: Future + ?Sized>(shutdown: &mut std::pin::Pin<&mut F>) -> bool {
    let waker = std::task::Waker::noop();
    let mut context = std::task::Context::from_waker(waker);
    shutdown.as_mut().poll(&mut context).is_ready()
}
