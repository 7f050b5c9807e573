//! [`Reinjector`]: moves the records parked on the retry tiers back to
//! their work topic once due, as the Python SDK's
//! `kafka_retry.RetryReinjector` does.

use std::collections::{BTreeMap, VecDeque};
use std::error::Error as StdError;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, StreamConsumer,
};
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::producer::FutureProducer;
use rdkafka::util::Timeout;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use tokio::time::Instant;

use super::headers::{self, DELAY, ORIGINAL_TOPIC, Stored};
use super::tiers::millis;
use super::{KafkaTransport, RetryTiers, produce};
use crate::broker::TransportError;
use crate::builders::setters;

/// The consumer group the re-injectors share, as in the Python SDK.
pub const DEFAULT_REINJECT_GROUP: &str = "babelqueue-retry-reinject";

/// How long one [`Reinjector::run_once`] waits for a record at most
/// (default; never past the next due record).
const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(1);

/// Why the re-injector could not start, or what one step met. A step's
/// error leaves every record it concerns on its tier, uncommitted: the
/// next step (or the next run) takes it again.
///
/// ```
/// use babel_idem::transport::kafka::ReinjectError;
///
/// let error = ReinjectError::NoTopics;
/// assert_eq!(error.to_string(), "the re-injector needs at least one work topic");
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReinjectError {
    /// No work topic was given.
    #[error("the re-injector needs at least one work topic")]
    NoTopics,
    /// No retry tiers: there is nothing to consume.
    #[error("the re-injector needs the producers' retry tiers, and none are configured")]
    NoTiers,
    /// The cluster could not be reached, or a client could not be made.
    #[error("the re-injector cannot start: {0}")]
    Start(#[source] TransportError),
    /// Reading the tier topics failed (a broker error, a tier topic that
    /// does not exist).
    #[error("reading the retry tiers failed: {0}")]
    Consume(#[source] Box<dyn StdError + Send + Sync>),
    /// A record could not be written to its work topic; the partition was
    /// sought back to it, and it is tried again.
    #[error(
        "re-injecting {topic}[{partition}]@{offset} into {target:?} failed, it stays on its tier: {source}"
    )]
    Write {
        /// The tier topic.
        topic: String,
        /// The partition.
        partition: i32,
        /// The record's offset.
        offset: i64,
        /// The work topic it was written to.
        target: String,
        /// The broker's failure.
        #[source]
        source: TransportError,
    },
    /// A record was written, but its offset could not be committed: the
    /// next run may write it again.
    #[error("committing {topic}[{partition}]@{offset} after its re-injection failed: {source}")]
    Commit {
        /// The tier topic.
        topic: String,
        /// The partition.
        partition: i32,
        /// The record's offset.
        offset: i64,
        /// The broker's failure.
        #[source]
        source: Box<dyn StdError + Send + Sync>,
    },
}

/// Configures a [`Reinjector`]; made by [`Reinjector::builder`].
///
/// ```no_run
/// use babel_idem::transport::kafka::{Reinjector, RetryTiers};
/// use std::time::Duration;
///
/// # async fn run() -> Result<(), babel_idem::transport::kafka::ReinjectError> {
/// let reinjector = Reinjector::builder()
///     .topic("orders")
///     .topic("billing")
///     .retry_tiers(RetryTiers::recommended())
///     .poll_interval(Duration::from_millis(500))
///     .connect("kafka://127.0.0.1:9092")
///     .await?;
/// # let _ = reinjector;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct ReinjectorBuilder {
    topics: Vec<String>,
    group: String,
    tiers: Option<RetryTiers>,
    poll_interval: Duration,
    timeout: Option<Duration>,
    client: Vec<(String, String)>,
}

impl Default for ReinjectorBuilder {
    fn default() -> Self {
        ReinjectorBuilder {
            topics: Vec::new(),
            group: DEFAULT_REINJECT_GROUP.to_owned(),
            tiers: None,
            poll_interval: DEFAULT_POLL_INTERVAL,
            timeout: None,
            client: Vec::new(),
        }
    }
}

impl ReinjectorBuilder {
    /// A work topic whose tier topics (`<topic>.retry.<n>`) are consumed;
    /// give it once per work topic.
    pub fn topic(mut self, work_topic: impl Into<String>) -> Self {
        self.topics.push(work_topic.into());
        self
    }

    setters! {
        /// The consumer group (default [`DEFAULT_REINJECT_GROUP`],
        /// `babelqueue-retry-reinject`): re-injectors of one group share the
        /// tier partitions.
        pub fn group(group: impl Into<String>) => self.group = group.into();

        /// The retry tiers: the producers' list (tier `n`'s delay is the
        /// `n`-th). Default: the transport's, with [`build`](Self::build).
        pub fn retry_tiers(tiers: RetryTiers) => self.tiers = Some(tiers);

        /// How long one [`Reinjector::run_once`] waits for a record at most
        /// (default 1 s); it never waits past the next due record.
        pub fn poll_interval(interval: Duration) => self.poll_interval;

        /// How long connecting, a commit or a seek may take (default: the
        /// transport's timeout, 5 s).
        pub fn timeout(timeout: Duration) => self.timeout = Some(timeout);
    }

    /// A librdkafka setting for the re-injector's clients (SASL, TLS,
    /// `client.id`), over the transport's; with [`connect`](Self::connect)
    /// the only ones.
    pub fn client_setting(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.client.push((name.into(), value.into()));
        self
    }

    /// The re-injector on `transport`'s cluster: its brokers, client
    /// settings and producer, and its retry tiers unless
    /// [`retry_tiers`](Self::retry_tiers) gave others. Subscribes to the
    /// tier topics; the group is joined on the first step.
    pub fn build(self, transport: &KafkaTransport) -> Result<Reinjector, ReinjectError> {
        let inner = &transport.inner;
        let tiers = self
            .tiers
            .unwrap_or_else(|| inner.settings.options.tiers.clone());
        if self.topics.is_empty() {
            return Err(ReinjectError::NoTopics);
        }
        if tiers.is_empty() {
            return Err(ReinjectError::NoTiers);
        }
        let topics: Vec<String> = self
            .topics
            .iter()
            .flat_map(|topic| tiers.topics(topic))
            .collect();
        let mut config = inner.settings.consumer_config(&self.group);
        for (name, value) in &self.client {
            config.set(name, value);
        }
        let consumer: StreamConsumer<Rebalances> = config
            .create_with_context(Rebalances::default())
            .map_err(|error| ReinjectError::Start(TransportError::Connect(Box::new(error))))?;
        let names: Vec<&str> = topics.iter().map(String::as_str).collect();
        consumer
            .subscribe(&names)
            .map_err(|error| ReinjectError::Start(TransportError::Broker(Box::new(error))))?;
        Ok(Reinjector {
            consumer: Arc::new(consumer),
            producer: inner.producer.clone(),
            tiers,
            topics,
            poll_interval: self.poll_interval,
            timeout: self.timeout.unwrap_or(inner.settings.timeout),
            held: BTreeMap::new(),
        })
    }

    /// Connects to the cluster `url` (`kafka://host:port[,host:port]`) with
    /// the [`retry_tiers`](Self::retry_tiers) given (required) and the
    /// client settings, then [`build`](Self::build)s.
    pub async fn connect(self, url: &str) -> Result<Reinjector, ReinjectError> {
        let tiers = self.tiers.clone().ok_or(ReinjectError::NoTiers)?;
        if self.topics.is_empty() {
            return Err(ReinjectError::NoTopics);
        }
        let mut transport = KafkaTransport::builder().retry_tiers(tiers);
        if let Some(timeout) = self.timeout {
            transport = transport.timeout(timeout);
        }
        for (name, value) in &self.client {
            transport = transport.client_setting(name, value);
        }
        let transport = transport.connect(url).await.map_err(ReinjectError::Start)?;
        self.build(&transport)
    }
}

/// The retry tiers' re-injector: consumes every `<work>.retry.<n>` of its
/// work topics in its own group and writes each record back to its work
/// topic once due, byte for byte.
///
/// # What it does to a record
///
/// - The value and the key are copied byte for byte (a null key stays
///   null, an empty one empty); the value is never decoded, and
///   `attempts` is not touched (the retry that parked it advanced it).
/// - `bq-delay` and `bq-original-topic` are dropped; every other header is
///   kept, in order.
/// - It goes to the topic `bq-original-topic` names, or, without the
///   header, to the work part of the tier topic's name.
/// - It is due at `record timestamp + tier delay`, clamped to `[now, now +
///   tier delay]` (a producer clock running ahead cannot park it for longer
///   than one tier, one running behind cannot release it early); a record
///   with no timestamp is due one full tier from when it is read.
///
/// # Delivery
///
/// - The poll loop never blocks on a record that is not due: the partition
///   holding it is paused, and resumed once its held records are written.
/// - Records of one partition are written in order: only a partition's
///   head waits for its due time, and nothing overtakes it.
/// - A record's offset is committed only after the broker confirmed its
///   write to the work topic. A process killed in between writes it again
///   on its next run (at least once: the consumer's idempotency absorbs the
///   duplicate); nothing is lost.
/// - A failed write seeks the partition back to the record, which is read
///   and tried again; no commit passes it.
///
/// Run one beside the workers of a transport with retry tiers: without it
/// a parked record is never delivered.
///
/// ```no_run
/// use babel_idem::transport::KafkaTransport;
/// use babel_idem::transport::kafka::{Reinjector, RetryTiers};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let transport = KafkaTransport::builder()
///     .retry_tiers(RetryTiers::recommended())
///     .connect("kafka://127.0.0.1:9092")
///     .await?;
/// let reinjector = Reinjector::builder().topic("orders").build(&transport)?;
/// let written = reinjector
///     .run(async {
///         let _ = tokio::signal::ctrl_c().await;
///     })
///     .await;
/// println!("re-injected {written} records");
/// # Ok(())
/// # }
/// ```
pub struct Reinjector {
    consumer: Arc<StreamConsumer<Rebalances>>,
    producer: FutureProducer,
    tiers: RetryTiers,
    topics: Vec<String>,
    poll_interval: Duration,
    timeout: Duration,
    /// Per tier partition, the records read and not yet written, oldest
    /// first. Normally one (its partition is paused); records a pause did
    /// not stop in time queue behind it, in order.
    held: BTreeMap<(String, i32), VecDeque<Held>>,
}

/// A record waiting for its due time.
struct Held {
    record: OwnedMessage,
    due: Instant,
}

impl std::fmt::Debug for Reinjector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reinjector")
            .field("topics", &self.topics)
            .field("tiers", &self.tiers)
            .field("held", &self.held_count())
            .finish_non_exhaustive()
    }
}

impl Reinjector {
    /// A builder with the defaults: no topic yet, the group
    /// [`DEFAULT_REINJECT_GROUP`].
    pub fn builder() -> ReinjectorBuilder {
        ReinjectorBuilder::default()
    }

    /// The tier topics consumed, tier 1 of each work topic first.
    pub fn topics(&self) -> &[String] {
        &self.topics
    }

    /// How many records are read and waiting for their due time.
    pub fn held_count(&self) -> usize {
        self.held.values().map(VecDeque::len).sum()
    }

    /// One step: waits for a record at most the poll interval (never past
    /// the next due record), holds it until due, then writes every due
    /// record and commits each once its write is confirmed. Returns how
    /// many records were written.
    ///
    /// On an error, the records concerned stay on their tier and are taken
    /// again by a later step; the due records of other partitions are still
    /// written first.
    pub async fn run_once(&mut self) -> Result<usize, ReinjectError> {
        let polled = self.poll().await;
        let released = self.release_due().await;
        match (polled, released) {
            (Ok(()), released) => released,
            (Err(error), Ok(0)) => Err(error),
            // What was written counts; the poll's error shows on the next step.
            (Err(_), released) => released,
        }
    }

    /// Steps until `shutdown` completes, then returns how many records it
    /// wrote. A step's error is logged and the loop goes on after a pause
    /// of one poll interval (a broker outage, a missing work topic: the
    /// records wait on their tier). A write under way when `shutdown`
    /// completes finishes first; what is held and not written stays
    /// uncommitted, for the next run.
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) -> u64 {
        let mut shutdown = std::pin::pin!(shutdown);
        let mut written: u64 = 0;
        loop {
            let polled = tokio::select! {
                biased;
                () = &mut shutdown => break,
                polled = self.poll() => polled,
            };
            let released = self.release_due().await;
            if let Ok(count) = &released {
                written += *count as u64;
            }
            let failed = polled.err().or(released.err());
            if let Some(error) = failed {
                tracing::warn!(error = %error, "kafka re-injector step failed");
                tokio::select! {
                    biased;
                    () = &mut shutdown => break,
                    () = tokio::time::sleep(self.poll_interval) => {}
                }
            }
        }
        written
    }

    /// Waits for one record, at most the poll interval and never past the
    /// next due record, and holds it.
    async fn poll(&mut self) -> Result<(), ReinjectError> {
        self.forget_revoked();
        let mut wait = self.poll_interval;
        if let Some(nearest) = self
            .held
            .values()
            .filter_map(VecDeque::front)
            .map(|h| h.due)
            .min()
        {
            wait = wait.min(nearest.saturating_duration_since(Instant::now()));
        }
        let consumer = Arc::clone(&self.consumer);
        let received = match tokio::time::timeout(wait, consumer.recv()).await {
            Err(_) => return Ok(()),
            Ok(received) => received.map(|message| message.detach()),
        };
        // A rebalance served by this poll drops what the lost partitions
        // held before the record is filed under its partition.
        self.forget_revoked();
        match received {
            Ok(record) => {
                self.hold(record);
                Ok(())
            }
            Err(error) => Err(ReinjectError::Consume(Box::new(error))),
        }
    }

    /// Files `record` under its partition, due by its tier, and pauses the
    /// partition so the poll loop goes on without reading past it.
    fn hold(&mut self, record: OwnedMessage) {
        let topic = record.topic().to_owned();
        let partition = record.partition();
        let Some((_, tier)) = self.tiers.parse_topic(&topic) else {
            // Unreachable through the subscription; never loop on it.
            tracing::error!(
                topic,
                partition,
                offset = record.offset(),
                "record on a topic that is no configured retry tier: left uncommitted"
            );
            return;
        };
        let record_ms = record.timestamp().to_millis().filter(|ms| *ms >= 0);
        let due = Instant::now() + due_in(record_ms, tier, now_ms());
        let queue = self.held.entry((topic.clone(), partition)).or_default();
        // A record at or before one already held is a redelivery of it.
        if queue
            .back()
            .is_some_and(|last| last.record.offset() >= record.offset())
        {
            return;
        }
        queue.push_back(Held { record, due });
        let mut list = TopicPartitionList::new();
        list.add_partition(&topic, partition);
        if let Err(error) = self.consumer.pause(&list) {
            // The due time still gates the write; records read meanwhile queue in order.
            tracing::warn!(%error, topic, partition, "could not pause a retry tier partition");
        }
    }

    /// Drops what the partitions the group took away held: their next
    /// owner reads them again from the committed offset.
    fn forget_revoked(&mut self) {
        let revoked = std::mem::take(
            &mut *self
                .consumer
                .context()
                .revoked
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        for (topic, partition) in revoked {
            if self.held.remove(&(topic.clone(), partition)).is_some() {
                let mut list = TopicPartitionList::new();
                list.add_partition(&topic, partition);
                let _ = self.consumer.resume(&list);
            }
        }
    }

    /// Writes every due record, partition by partition, oldest first, each
    /// committed once confirmed; resumes a partition once it holds nothing.
    async fn release_due(&mut self) -> Result<usize, ReinjectError> {
        let now = Instant::now();
        let mut written = 0;
        let mut first_error = None;
        let partitions: Vec<(String, i32)> = self.held.keys().cloned().collect();
        for key in partitions {
            while let Some(head) = self.held.get(&key).and_then(VecDeque::front) {
                if head.due > now {
                    break;
                }
                let record = head.record.clone();
                match self.write(&record).await {
                    Ok(()) => {
                        if let Some(queue) = self.held.get_mut(&key) {
                            queue.pop_front();
                        }
                        written += 1;
                        if let Err(error) = self.commit(&record).await {
                            // Written: a later commit of this partition covers it.
                            first_error.get_or_insert(error);
                        }
                    }
                    Err(error) => {
                        // The partition goes back to the record: it and
                        // everything after it are read again.
                        self.held.remove(&key);
                        if let Err(seek) = self.seek_back(&record).await {
                            tracing::error!(error = %seek, topic = record.topic(), partition = record.partition(), offset = record.offset(), "seeking back to a record whose re-injection failed failed; it is read again after a restart");
                        }
                        first_error.get_or_insert(error);
                        break;
                    }
                }
            }
            if self.held.get(&key).is_some_and(VecDeque::is_empty) {
                self.held.remove(&key);
                self.resume(&key.0, key.1);
            } else if !self.held.contains_key(&key) {
                self.resume(&key.0, key.1);
            }
        }
        match first_error {
            Some(error) if written == 0 => Err(error),
            Some(error) => {
                tracing::warn!(%error, "kafka re-injector step failed after writing some records");
                Ok(written)
            }
            None => Ok(written),
        }
    }

    fn resume(&self, topic: &str, partition: i32) {
        let mut list = TopicPartitionList::new();
        list.add_partition(topic, partition);
        if let Err(error) = self.consumer.resume(&list) {
            tracing::warn!(%error, topic, partition, "could not resume a retry tier partition");
        }
    }

    /// Writes `record` to its work topic, value and key byte for byte, its
    /// headers but the two tier headers, and waits for the delivery report.
    async fn write(&self, record: &OwnedMessage) -> Result<(), ReinjectError> {
        let mut headers = headers::stored(record);
        let target = target_topic(record, &headers);
        headers.retain(|(name, _)| name != DELAY && name != ORIGINAL_TOPIC);
        let stored = produce::Stored {
            key: record.key(),
            value: record.payload(),
            headers: produce::stored_headers(&headers),
            timestamp: None,
        };
        let written = produce::send(&self.producer, &target, stored).await;
        match written {
            Ok(_) => {
                tracing::debug!(from = record.topic(), partition = record.partition(), offset = record.offset(), to = %target, "re-injected a retry record");
                Ok(())
            }
            Err(source) => Err(ReinjectError::Write {
                topic: record.topic().to_owned(),
                partition: record.partition(),
                offset: record.offset(),
                target,
                source,
            }),
        }
    }

    /// Commits the position after `record`, synchronously, off the runtime.
    async fn commit(&self, record: &OwnedMessage) -> Result<(), ReinjectError> {
        let failed = |source: Box<dyn StdError + Send + Sync>| ReinjectError::Commit {
            topic: record.topic().to_owned(),
            partition: record.partition(),
            offset: record.offset(),
            source,
        };
        let mut list = TopicPartitionList::new();
        list.add_partition_offset(
            record.topic(),
            record.partition(),
            Offset::Offset(record.offset() + 1),
        )
        .map_err(|error| failed(Box::new(error)))?;
        let consumer = Arc::clone(&self.consumer);
        tokio::task::spawn_blocking(move || consumer.commit(&list, CommitMode::Sync))
            .await
            .map_err(|error| failed(Box::new(error)))?
            .map_err(|error| failed(Box::new(error)))
    }

    /// Seeks `record`'s partition back to it, so the next poll reads it.
    async fn seek_back(&self, record: &OwnedMessage) -> Result<(), ReinjectError> {
        let consumer = Arc::clone(&self.consumer);
        let (topic, partition, offset) = (
            record.topic().to_owned(),
            record.partition(),
            record.offset(),
        );
        let timeout = self.timeout;
        tokio::task::spawn_blocking(move || {
            consumer.seek(
                &topic,
                partition,
                Offset::Offset(offset),
                Timeout::After(timeout),
            )
        })
        .await
        .map_err(|error| ReinjectError::Consume(Box::new(error)))?
        .map_err(|error| ReinjectError::Consume(Box::new(error)))
    }
}

/// The work topic a parked record goes back to: `bq-original-topic`, else
/// the work part of its tier topic's name (never stranded on a missing
/// header).
fn target_topic(record: &OwnedMessage, headers: &[Stored]) -> String {
    let named = headers
        .iter()
        .find(|(name, _)| name == ORIGINAL_TOPIC)
        .and_then(|(_, value)| value.as_deref())
        .and_then(|value| std::str::from_utf8(value).ok())
        .filter(|topic| !topic.is_empty())
        .map(str::to_owned);
    named.unwrap_or_else(|| match record.topic().rsplit_once(".retry.") {
        Some((work, _)) if !work.is_empty() => work.to_owned(),
        _ => record.topic().to_owned(),
    })
}

/// How long from now a record is due: `record_ms + tier` clamped to
/// `[now, now + tier]`; a whole tier without a timestamp.
fn due_in(record_ms: Option<i64>, tier: Duration, now_ms: i64) -> Duration {
    let tier_ms = i64::try_from(millis(tier)).unwrap_or(i64::MAX);
    let Some(record_ms) = record_ms else {
        return tier;
    };
    let target = record_ms
        .saturating_add(tier_ms)
        .clamp(now_ms, now_ms.saturating_add(tier_ms));
    Duration::from_millis(u64::try_from(target - now_ms).unwrap_or(0))
}

/// The wall clock in Unix milliseconds, as record timestamps are.
fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| {
            i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
        })
}

/// The consumer's context: notes the partitions a rebalance takes away,
/// for the re-injector to drop what it holds of them.
#[derive(Default)]
struct Rebalances {
    revoked: Mutex<Vec<(String, i32)>>,
}

impl ClientContext for Rebalances {}

impl ConsumerContext for Rebalances {
    fn pre_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(list) = rebalance {
            let mut revoked = self.revoked.lock().unwrap_or_else(PoisonError::into_inner);
            revoked.extend(
                list.elements()
                    .iter()
                    .map(|element| (element.topic().to_owned(), element.partition())),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    #[test]
    fn a_record_is_due_one_tier_after_its_timestamp() {
        assert_eq!(due_in(Some(10_000), 5 * SECOND, 12_000), 3 * SECOND);
    }

    #[test]
    fn a_clock_running_behind_never_releases_a_record_before_now() {
        assert_eq!(due_in(Some(1_000), 5 * SECOND, 60_000), Duration::ZERO);
    }

    #[test]
    fn a_clock_running_ahead_never_parks_a_record_longer_than_its_tier() {
        assert_eq!(due_in(Some(90_000), 5 * SECOND, 60_000), 5 * SECOND);
    }

    #[test]
    fn a_record_without_a_timestamp_waits_a_whole_tier() {
        assert_eq!(due_in(None, 30 * SECOND, 60_000), 30 * SECOND);
    }

    /// A process spawns its re-injector on a multi-threaded runtime.
    #[allow(dead_code, reason = "checked at compile time only")]
    fn the_loop_can_be_spawned(reinjector: Reinjector) {
        fn send<T: Send + 'static>(_: T) {}
        send(reinjector.run(std::future::pending()));
    }

    #[test]
    fn extreme_timestamps_do_not_overflow() {
        assert_eq!(due_in(Some(i64::MAX), 5 * SECOND, 0), 5 * SECOND);
        assert_eq!(due_in(Some(i64::MIN), 5 * SECOND, 0), Duration::ZERO);
    }
}
