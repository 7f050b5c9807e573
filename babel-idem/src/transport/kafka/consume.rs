//! Consuming on the Kafka binding: its [`Transport`] operations, one group
//! consumer per work topic, the per-key order and the offset ledger.
//!
//! A record is taken from the broker by polling (never waiting), entered in
//! the topic's [`Ledger`] as unsettled, and handed out at once unless
//! another record of its key (on its partition) is still out: then it is
//! held here, in offset order, and handed out by a later reserve once the
//! one before it settles. A settle that writes waits for the broker's
//! delivery report; only then is the record marked settled. The positions
//! settles moved are committed together by the next reserve (once per
//! batch, not once per record), and at a rebalance or a close.
//!
//! Each partition assignment has a generation. A handle remembers the
//! generation it was reserved under; once its partition is revoked, the
//! handle settles nothing (the record is its next owner's).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use rdkafka::ClientContext;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::KafkaResult;
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};

use super::ledger::Ledger;
use super::produce::{self, Record};
use super::{KafkaTransport, QUEUE_NAMES, headers};
use crate::broker::{Reserved, Settlement, Transport, TransportError, TransportFuture};

/// The target of the binding's events, a commit's among them.
const TARGET: &str = "babel_idem::transport::kafka";

/// How many records a topic's consumer holds back for their keys before it
/// pauses fetching: a key whose records pile up behind a slow one must not
/// fill the worker's memory. Fetching resumes once half are handed out.
const HOLD_LIMIT: usize = 1024;

/// The generations of partition assignments, unique in the process: a
/// handle of a partition revoked and assigned again, even to a consumer
/// made since, never matches the new assignment's.
static GENERATIONS: AtomicU64 = AtomicU64::new(1);

/// What [`KafkaTransport`] needs to settle one record: where it is, its
/// key and headers (kept on every settle write), and the assignment it was
/// reserved under.
///
/// ```no_run
/// use babel_idem::transport::{KafkaTransport, Transport};
///
/// # async fn run() -> Result<(), babel_idem::transport::TransportError> {
/// let transport = KafkaTransport::connect("kafka://127.0.0.1:9092").await?;
/// for reserved in transport.reserve("orders", 10).await? {
///     let handle = &reserved.handle;
///     println!("{}[{}]@{}", handle.topic(), handle.partition(), handle.offset());
/// }
/// # Ok(())
/// # }
/// ```
pub struct KafkaHandle {
    topic: Arc<str>,
    partition: i32,
    offset: i64,
    key: Option<Vec<u8>>,
    headers: Vec<(String, Vec<u8>)>,
    generation: u64,
}

impl KafkaHandle {
    /// The topic the record was consumed from.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// Its partition.
    pub fn partition(&self) -> i32 {
        self.partition
    }

    /// Its offset in the partition.
    pub fn offset(&self) -> i64 {
        self.offset
    }

    /// Its key as written (`None`: a null key); every settle write keeps it.
    pub fn key(&self) -> Option<&[u8]> {
        self.key.as_deref()
    }

    /// Its headers as consumed, values as written, in order.
    pub fn headers(&self) -> impl Iterator<Item = (&str, &[u8])> {
        self.headers
            .iter()
            .map(|(name, value)| (name.as_str(), value.as_slice()))
    }

    /// The partition assignment it was reserved under: settling it once
    /// that assignment is revoked touches nothing.
    pub fn generation(&self) -> u64 {
        self.generation
    }
}

impl fmt::Debug for KafkaHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaHandle")
            .field("topic", &self.topic)
            .field("partition", &self.partition)
            .field("offset", &self.offset)
            .field("generation", &self.generation)
            .finish_non_exhaustive()
    }
}

/// A record taken from the broker, owned: handed out, or held for its key.
struct Taken {
    partition: i32,
    offset: i64,
    key: Option<Vec<u8>>,
    value: Vec<u8>,
    headers: Vec<(String, Vec<u8>)>,
    generation: u64,
}

impl Taken {
    fn from_message(message: &BorrowedMessage<'_>, generation: u64) -> Self {
        let headers = headers::stored(message)
            .into_iter()
            .map(|(name, value)| (name, value.unwrap_or_default()))
            .collect();
        Taken {
            partition: message.partition(),
            offset: message.offset(),
            key: message.key().map(<[u8]>::to_vec),
            value: message.payload().map(<[u8]>::to_vec).unwrap_or_default(),
            headers,
            generation,
        }
    }

    fn into_reserved(self, topic: &Arc<str>) -> Reserved<KafkaHandle> {
        let attempts = headers::attempts(
            self.headers
                .iter()
                .map(|(name, value)| (name.as_str(), value.as_slice())),
        );
        let text_headers = self
            .headers
            .iter()
            .map(|(name, value)| (name.clone(), String::from_utf8_lossy(value).into_owned()))
            .collect();
        Reserved {
            body: self.value,
            headers: text_headers,
            attempts,
            poison: false,
            handle: KafkaHandle {
                topic: Arc::clone(topic),
                partition: self.partition,
                offset: self.offset,
                key: self.key,
                headers: self.headers,
                generation: self.generation,
            },
        }
    }
}

/// What one topic's consumer knows of its records. Locked briefly, never
/// across an await; the rebalance callback takes it on the polling thread.
#[derive(Default)]
struct State {
    ledger: Ledger,
    /// Per partition, the position settled records moved it to since the
    /// last commit: committed together on the next reserve, so a partition
    /// is committed once per batch of settles, never per record.
    unflushed: BTreeMap<i32, i64>,
    /// The generation of each assigned partition. A partition not here is
    /// not assigned: its handles settle nothing.
    generations: HashMap<i32, u64>,
    /// Per (partition, key) with a record out: the records of that key
    /// taken after it, in offset order, held until it settles.
    busy: HashMap<(i32, Vec<u8>), VecDeque<Taken>>,
    /// Records whose key came free, to hand out first.
    ready: VecDeque<Taken>,
    /// How many records `busy` holds.
    held: usize,
    /// Whether fetching may be paused because too many were held: set by
    /// a pause, cleared only by a resume of the whole assignment that
    /// succeeded (never by a rebalance, which may leave partitions paused).
    paused: bool,
}

impl State {
    /// The generation `partition` is assigned under, assigning it one if
    /// the rebalance callback has not (a record always comes after its
    /// assignment, so this is a safety net).
    fn generation(&mut self, partition: i32) -> u64 {
        *self
            .generations
            .entry(partition)
            .or_insert_with(|| GENERATIONS.fetch_add(1, Ordering::Relaxed))
    }

    /// Takes a record: in the ledger as unsettled, then handed out
    /// (`Some`) or held behind an earlier record of its key (`None`).
    fn take(&mut self, taken: Taken) -> Option<Taken> {
        self.ledger.take(taken.partition, taken.offset);
        tracing::trace!(target: TARGET, partition = taken.partition, offset = taken.offset, "reserved");
        let Some(key) = &taken.key else {
            return Some(taken);
        };
        match self.busy.get_mut(&(taken.partition, key.clone())) {
            Some(waiting) => {
                waiting.push_back(taken);
                self.held += 1;
                None
            }
            None => {
                self.busy
                    .insert((taken.partition, key.clone()), VecDeque::new());
                Some(taken)
            }
        }
    }

    /// The record of `key` on `partition` settled: the next one held for
    /// the key, if any, becomes ready (the key stays busy with it), else
    /// the key is free.
    fn release_key(&mut self, partition: i32, key: &[u8]) {
        let slot = (partition, key.to_vec());
        let next = self.busy.get_mut(&slot).and_then(VecDeque::pop_front);
        match next {
            Some(next) => {
                self.held = self.held.saturating_sub(1);
                self.ready.push_back(next);
            }
            None => {
                self.busy.remove(&slot);
            }
        }
    }

    /// Drops everything of `partition` (revoked): its ledger, its held and
    /// ready records, its busy keys, its generation.
    fn give_up(&mut self, partition: i32) {
        self.ledger.forget(partition);
        // The revoke committed it; a later flush must not commit it again
        // over its next owner's.
        self.unflushed.remove(&partition);
        self.generations.remove(&partition);
        self.ready.retain(|taken| taken.partition != partition);
        let held = &mut self.held;
        self.busy.retain(|(p, _), waiting| {
            if *p == partition {
                *held = held.saturating_sub(waiting.len());
                false
            } else {
                true
            }
        });
    }
}

/// The consumer's context: commits what is settled before a partition is
/// given up, and starts each assigned partition afresh.
struct Rebalancer {
    topic: Arc<str>,
    state: Arc<Mutex<State>>,
}

impl ClientContext for Rebalancer {}

impl ConsumerContext for Rebalancer {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let Rebalance::Revoke(revoked) = rebalance else {
            return;
        };
        // Under the lock for the whole hand-over: a settle cannot mark a
        // record settled between the commit and the forgetting, so what is
        // committed is exactly what was settled, and nothing unsettled.
        let mut state = lock(&self.state);
        let partitions: Vec<i32> = revoked
            .elements_for_topic(&self.topic)
            .iter()
            .map(|element| element.partition())
            .collect();
        let positions: Vec<(i32, i64)> = partitions
            .iter()
            .filter_map(|partition| Some((*partition, state.ledger.position(*partition)?)))
            .collect();
        commit(consumer, &self.topic, &positions, CommitMode::Sync);
        for partition in partitions {
            let offset = state.ledger.position(partition).unwrap_or(-1);
            tracing::debug!(target: TARGET, topic = &*self.topic, partition, offset, "revoked");
            state.give_up(partition);
        }
    }

    fn post_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(assigned) => {
                let mut state = lock(&self.state);
                for element in assigned.elements_for_topic(&self.topic) {
                    let generation = GENERATIONS.fetch_add(1, Ordering::Relaxed);
                    let partition = element.partition();
                    tracing::debug!(target: TARGET, topic = &*self.topic, partition, generation, "assigned");
                    state.generations.insert(partition, generation);
                }
            }
            Rebalance::Revoke(_) => {}
            Rebalance::Error(error) => {
                tracing::warn!(target: TARGET, topic = &*self.topic, %error, "babel-idem: a Kafka rebalance failed");
            }
        }
    }

    fn commit_callback(&self, result: KafkaResult<()>, offsets: &TopicPartitionList) {
        if let Err(error) = result {
            // The next commit of a partition carries a position at least as
            // far: a failed one delays, never loses, and never passes an
            // unsettled record.
            tracing::warn!(target: TARGET, topic = &*self.topic, %error, partitions = offsets.count(), "babel-idem: a Kafka offset commit failed; the next one carries it");
        }
    }
}

/// Commits `positions` of `topic`'s partitions, each with its event.
fn commit(
    consumer: &BaseConsumer<Rebalancer>,
    topic: &str,
    positions: &[(i32, i64)],
    mode: CommitMode,
) {
    if positions.is_empty() {
        return;
    }
    let mut list = TopicPartitionList::with_capacity(positions.len());
    for (partition, offset) in positions {
        if let Err(error) = list.add_partition_offset(topic, *partition, Offset::Offset(*offset)) {
            tracing::warn!(target: TARGET, topic, partition, offset, %error, "babel-idem: an offset the commit list refused");
            return;
        }
    }
    for (partition, offset) in positions {
        tracing::debug!(target: TARGET, topic, partition, offset, "commit");
    }
    if let Err(error) = consumer.commit(&list, mode) {
        tracing::warn!(target: TARGET, topic, %error, "babel-idem: a Kafka offset commit failed; the next one carries it");
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    // The state's invariants hold between statements that cannot panic;
    // a panic elsewhere while it was held leaves it usable.
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One work topic's group consumer.
struct TopicConsumer {
    topic: Arc<str>,
    consumer: BaseConsumer<Rebalancer>,
    state: Arc<Mutex<State>>,
    /// One poller at a time: the rebalance callbacks run inside a poll.
    polling: Mutex<()>,
}

impl TopicConsumer {
    /// Up to `max` records: the ones whose key came free first, then new
    /// ones polled without waiting.
    fn reserve(&self, max: usize) -> Result<Vec<Reserved<KafkaHandle>>, TransportError> {
        let _polling = self.polling.lock().unwrap_or_else(PoisonError::into_inner);
        self.flush();
        let mut out = Vec::new();
        {
            let mut state = lock(&self.state);
            while out.len() < max {
                let Some(taken) = state.ready.pop_front() else {
                    break;
                };
                out.push(taken.into_reserved(&self.topic));
            }
        }
        self.pace_fetching();
        while out.len() < max {
            // A poll of zero never waits for the broker; a rebalance
            // callback may run inside it, taking the state lock itself.
            let message = match self.consumer.poll(Duration::ZERO) {
                None => break,
                Some(Ok(message)) => message,
                Some(Err(error)) if out.is_empty() => {
                    return Err(TransportError::Broker(Box::new(error)));
                }
                Some(Err(error)) => {
                    tracing::warn!(target: TARGET, topic = &*self.topic, %error, "babel-idem: a Kafka poll failed");
                    break;
                }
            };
            let mut state = lock(&self.state);
            let generation = state.generation(message.partition());
            let taken = Taken::from_message(&message, generation);
            drop(message);
            if let Some(taken) = state.take(taken) {
                out.push(taken.into_reserved(&self.topic));
            }
            if state.held >= HOLD_LIMIT {
                break;
            }
        }
        self.pace_fetching();
        Ok(out)
    }

    /// Pauses fetching while too many records are held for their keys;
    /// resumes it once half of them went out. While over the limit every
    /// call pauses the whole assignment again (a partition assigned since
    /// is paused too). Polling goes on while paused
    /// (the group's heartbeat and rebalances need it).
    fn pace_fetching(&self) {
        let mut state = lock(&self.state);
        let pause = state.held >= HOLD_LIMIT;
        let resume = state.paused && state.held <= HOLD_LIMIT / 2;
        if !pause && !resume {
            return;
        }
        let assignment = match self.consumer.assignment() {
            Ok(assignment) => assignment,
            Err(error) => {
                tracing::warn!(target: TARGET, topic = &*self.topic, %error, "babel-idem: cannot read the Kafka assignment to pace fetching");
                return;
            }
        };
        let result = if resume {
            self.consumer.resume(&assignment)
        } else {
            self.consumer.pause(&assignment)
        };
        match result {
            Ok(()) => state.paused = !resume,
            Err(error) => {
                tracing::warn!(target: TARGET, topic = &*self.topic, %error, "babel-idem: cannot pace Kafka fetching")
            }
        }
    }

    /// Whether `handle`'s partition is still assigned under its generation.
    fn current(&self, handle: &KafkaHandle) -> bool {
        lock(&self.state).generations.get(&handle.partition) == Some(&handle.generation)
    }

    /// Marks `handle`'s record settled, commits the partition's position
    /// when it moved, and frees its key. `false` when its partition was
    /// revoked meanwhile: nothing is marked.
    fn mark_settled(&self, handle: &KafkaHandle) -> bool {
        let mut state = lock(&self.state);
        if state.generations.get(&handle.partition) != Some(&handle.generation) {
            return false;
        }
        if let Some(key) = &handle.key {
            state.release_key(handle.partition, key);
        }
        tracing::trace!(target: TARGET, topic = &*self.topic, partition = handle.partition, offset = handle.offset, "settled");
        if let Some(position) = state.ledger.settle(handle.partition, handle.offset) {
            state.unflushed.insert(handle.partition, position);
        }
        true
    }

    /// Commits the positions settles moved since the last flush, in one
    /// asynchronous commit: answered through the commit callback, and a
    /// later position supersedes a failed one.
    fn flush(&self) {
        let mut state = lock(&self.state);
        if state.unflushed.is_empty() {
            return;
        }
        let positions: Vec<(i32, i64)> = std::mem::take(&mut state.unflushed).into_iter().collect();
        commit(&self.consumer, &self.topic, &positions, CommitMode::Async);
    }

    /// Commits every settled position, waiting for the broker.
    fn commit_settled(&self) {
        let mut state = lock(&self.state);
        state.unflushed.clear();
        let positions = state.ledger.positions();
        commit(&self.consumer, &self.topic, &positions, CommitMode::Sync);
    }
}

/// The transport's topic consumers, made on the first reserve of each.
#[derive(Default)]
pub(super) struct Consumers {
    by_topic: Mutex<HashMap<String, Arc<TopicConsumer>>>,
}

impl Consumers {
    fn get(&self, topic: &str) -> Option<Arc<TopicConsumer>> {
        self.by_topic
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(topic)
            .cloned()
    }

    fn take_all(&self) -> Vec<Arc<TopicConsumer>> {
        self.by_topic
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain()
            .map(|(_, consumer)| consumer)
            .collect()
    }
}

impl Drop for Consumers {
    /// Commits what is settled on every topic before its consumer leaves
    /// the group (librdkafka's close runs the revoke callback, which
    /// commits again and forgets the rest, uncommitted).
    fn drop(&mut self) {
        for consumer in self.take_all() {
            consumer.commit_settled();
        }
    }
}

impl KafkaTransport {
    /// The consumer of `topic`, made and subscribed on first use.
    fn topic_consumer(&self, topic: &str) -> Result<Arc<TopicConsumer>, TransportError> {
        let mut by_topic = self
            .inner
            .consumers
            .by_topic
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(consumer) = by_topic.get(topic) {
            return Ok(Arc::clone(consumer));
        }
        let topic_name: Arc<str> = Arc::from(topic);
        let state = Arc::new(Mutex::new(State::default()));
        let context = Rebalancer {
            topic: Arc::clone(&topic_name),
            state: Arc::clone(&state),
        };
        let consumer: BaseConsumer<Rebalancer> = self
            .inner
            .settings
            .consumer_config(&self.inner.settings.options.group)
            .create_with_context(context)
            .map_err(|error| TransportError::Connect(Box::new(error)))?;
        consumer
            .subscribe(&[topic])
            .map_err(|error| TransportError::Broker(Box::new(error)))?;
        let consumer = Arc::new(TopicConsumer {
            topic: topic_name,
            consumer,
            state,
            polling: Mutex::new(()),
        });
        by_topic.insert(topic.to_owned(), Arc::clone(&consumer));
        Ok(consumer)
    }

    /// Commits what is settled on every topic this transport consumes,
    /// waiting for the broker, then leaves the group: records reserved and
    /// not settled are left uncommitted, for the group's next owner of
    /// their partitions (a reservation the consumer gave up without
    /// settling holds its key and its partition's commit until then). The
    /// next reserve joins again. Dropping the transport's last clone does
    /// the same, blocking the thread it runs on: in async code, prefer
    /// this.
    ///
    /// ```no_run
    /// use babel_idem::transport::KafkaTransport;
    ///
    /// # async fn run() -> Result<(), babel_idem::transport::TransportError> {
    /// let transport = KafkaTransport::connect("kafka://127.0.0.1:9092").await?;
    /// // ... consume ...
    /// transport.close().await;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn close(&self) {
        let consumers = self.inner.consumers.take_all();
        if consumers.is_empty() {
            return;
        }
        // Committing and leaving the group wait for the broker: off the
        // async runtime's threads.
        let closing = tokio::task::spawn_blocking(move || {
            for consumer in consumers {
                consumer.commit_settled();
                // The last reference leaves the group here (a handle holds
                // none); the revoke callback commits once more.
                drop(consumer);
            }
        });
        if let Err(error) = closing.await {
            tracing::warn!(target: TARGET, %error, "babel-idem: closing the Kafka consumers failed");
        }
    }

    /// The records of `queue` reserved or held and not yet settled (for
    /// tests and tools): 0 for a queue not consumed.
    ///
    /// ```no_run
    /// use babel_idem::transport::{KafkaTransport, Settlement, Transport};
    ///
    /// # async fn run() -> Result<(), babel_idem::transport::TransportError> {
    /// let transport = KafkaTransport::connect("kafka://127.0.0.1:9092").await?;
    /// let reserved = transport.reserve("orders", 10).await?;
    /// assert_eq!(transport.unsettled("orders"), reserved.len());
    /// for record in &reserved {
    ///     transport.settle(&record.handle, &Settlement::Ack).await?;
    /// }
    /// assert_eq!(transport.unsettled("orders"), 0);
    /// # Ok(())
    /// # }
    /// ```
    pub fn unsettled(&self, queue: &str) -> usize {
        self.inner
            .consumers
            .get(queue)
            .map_or(0, |consumer| lock(&consumer.state).ledger.unsettled())
    }

    async fn settle_record(
        &self,
        handle: &KafkaHandle,
        settlement: &Settlement,
    ) -> Result<bool, TransportError> {
        let Some(consumer) = self.inner.consumers.get(&handle.topic) else {
            // Closed since: the record is uncommitted, its partition's
            // next owner takes it.
            return Ok(false);
        };
        if !consumer.current(handle) {
            lapsed(handle);
            return Ok(false);
        }
        if let Some(write) = self.settle_write(handle, settlement) {
            let headers: Vec<(&str, &[u8])> = write
                .headers
                .iter()
                .map(|(name, value)| (name.as_str(), value.as_slice()))
                .collect();
            let record = Record {
                topic: &write.topic,
                key: handle.key.as_deref(),
                value: write.value,
                headers: &headers,
                timestamp: headers::timestamp(write.value),
            };
            // Confirmed before the record counts as settled: a failed
            // write leaves it unsettled, for the consumer to try again.
            produce::confirmed(&self.inner.producer, record).await?;
        }
        if consumer.mark_settled(handle) {
            Ok(true)
        } else {
            // Revoked while the copy was written: the copy stands, the
            // original is its next owner's (at least once).
            lapsed(handle);
            Ok(false)
        }
    }

    /// The record a settlement writes, if any: a retry to its tier (or
    /// back to the work topic without tiers), a dead letter to its queue.
    fn settle_write<'s>(
        &self,
        handle: &'s KafkaHandle,
        settlement: &'s Settlement,
    ) -> Option<SettleWrite<'s>> {
        let (target, value) = settlement.destination(&handle.topic)?;
        let tiers = &self.inner.settings.options.tiers;
        let (topic, tier) = match settlement {
            // With tiers, a retry or a release waits on the tier its
            // attempts pick, and the re-injector brings it back.
            Settlement::Requeue(body) if !tiers.is_empty() => {
                let attempts = projected_attempts(body).unwrap_or(0);
                let (n, delay) = tiers.for_retry(attempts.saturating_sub(1));
                (tiers.topic(&handle.topic, n), Some(delay))
            }
            _ => (target.to_owned(), None),
        };
        let mut out: Vec<(String, Vec<u8>)> = headers::projection(value)
            .into_iter()
            .map(|(name, value)| (name.to_owned(), value.into_bytes()))
            .collect();
        if let Some(delay) = tier {
            out.push((
                headers::DELAY.to_owned(),
                super::tiers::millis(delay).to_string().into_bytes(),
            ));
            out.push((
                headers::ORIGINAL_TOPIC.to_owned(),
                handle.topic.as_bytes().to_vec(),
            ));
        }
        // The delivery's own headers travel with it (a `traceparent`, a
        // replay marker), the binding's contract headers excepted: those
        // are recomputed from the new body above.
        out.extend(
            handle
                .headers
                .iter()
                .filter(|(name, _)| !CONTRACT_HEADERS.contains(&name.as_str()))
                .cloned(),
        );
        Some(SettleWrite {
            topic,
            value,
            headers: out,
        })
    }
}

/// A settle's write: where, what, with which headers (the key is the
/// handle's).
struct SettleWrite<'s> {
    topic: String,
    value: &'s [u8],
    headers: Vec<(String, Vec<u8>)>,
}

/// The headers the binding writes itself, from the body or the tier.
const CONTRACT_HEADERS: [&str; 8] = [
    headers::JOB,
    headers::TRACE_ID,
    headers::MESSAGE_ID,
    headers::SCHEMA_VERSION,
    headers::SOURCE_LANG,
    headers::ATTEMPTS,
    headers::DELAY,
    headers::ORIGINAL_TOPIC,
];

/// The body's `attempts` as its `bq-attempts` projection reads it (never
/// below 0); `None` for a body with no count.
fn projected_attempts(body: &[u8]) -> Option<u64> {
    headers::projection(body)
        .into_iter()
        .find(|(name, _)| *name == headers::ATTEMPTS)
        .and_then(|(_, value)| value.parse::<i64>().ok())
        .map(|attempts| u64::try_from(attempts).unwrap_or(0))
}

fn lapsed(handle: &KafkaHandle) {
    tracing::warn!(
        target: TARGET,
        topic = &*handle.topic,
        partition = handle.partition,
        offset = handle.offset,
        "babel-idem: the record's partition was revoked before it was settled; its next owner consumes it again"
    );
}

impl Transport for KafkaTransport {
    type Handle = KafkaHandle;

    /// A Kafka topic name: 1 to 249 characters of `a-z A-Z 0-9 . _ -`, and
    /// not `.` or `..`.
    fn check_queue(&self, queue: &str) -> Result<(), TransportError> {
        QUEUE_NAMES.check(queue)
    }

    /// Up to `max` records of the topic `queue`, without waiting: the
    /// topic's consumer joins the group on the first call, so the first
    /// reserves find nothing until the group assigns it partitions.
    fn reserve<'a>(
        &'a self,
        queue: &'a str,
        max: usize,
    ) -> TransportFuture<'a, Vec<Reserved<KafkaHandle>>> {
        Box::pin(async move {
            self.check_queue(queue)?;
            let consumer = self.topic_consumer(queue)?;
            if max == 0 {
                return Ok(Vec::new());
            }
            consumer.reserve(max)
        })
    }

    fn settle<'a>(
        &'a self,
        handle: &'a KafkaHandle,
        settlement: &'a Settlement,
    ) -> TransportFuture<'a, bool> {
        Box::pin(self.settle_record(handle, settlement))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taken(partition: i32, offset: i64, key: Option<&str>) -> Taken {
        Taken {
            partition,
            offset,
            key: key.map(|key| key.as_bytes().to_vec()),
            value: Vec::new(),
            headers: Vec::new(),
            generation: 1,
        }
    }

    #[test]
    fn a_busy_keys_later_records_are_held_in_order_and_released_one_at_a_time() {
        let mut state = State::default();
        assert!(state.take(taken(0, 0, Some("a"))).is_some());
        assert!(state.take(taken(0, 1, Some("a"))).is_none());
        assert!(state.take(taken(0, 2, Some("b"))).is_some());
        assert!(state.take(taken(0, 3, Some("a"))).is_none());
        assert!(state.take(taken(0, 4, None)).is_some());
        assert_eq!(state.held, 2);
        state.release_key(0, b"a");
        let next: Vec<i64> = state.ready.drain(..).map(|t| t.offset).collect();
        assert_eq!(next, vec![1]);
        state.release_key(0, b"a");
        let next: Vec<i64> = state.ready.drain(..).map(|t| t.offset).collect();
        assert_eq!(next, vec![3]);
        state.release_key(0, b"a");
        assert!(state.ready.is_empty() && state.held == 0);
        // The key is free: its next record goes out at once.
        assert!(state.take(taken(0, 5, Some("a"))).is_some());
    }

    #[test]
    fn a_revoked_partition_drops_its_held_records_and_keys() {
        let mut state = State::default();
        state.generations.insert(0, 7);
        state.generations.insert(1, 8);
        assert!(state.take(taken(0, 0, Some("a"))).is_some());
        assert!(state.take(taken(0, 1, Some("a"))).is_none());
        assert!(state.take(taken(1, 0, Some("a"))).is_some());
        assert!(state.take(taken(1, 1, Some("a"))).is_none());
        state.give_up(0);
        assert_eq!(state.held, 1);
        assert!(!state.generations.contains_key(&0));
        assert_eq!(state.ledger.unsettled(), 2);
        state.release_key(1, b"a");
        assert_eq!(state.ready.len(), 1);
    }

    #[test]
    fn a_retry_counts_the_attempts_before_it_from_the_new_body() {
        assert_eq!(
            projected_attempts(br#"{"job":"urn:babel:a:b","attempts":3}"#),
            Some(3)
        );
        assert_eq!(
            projected_attempts(br#"{"job":"urn:babel:a:b","attempts":-2}"#),
            Some(0)
        );
        assert_eq!(projected_attempts(br#"{"job":"urn:babel:a:b"}"#), Some(0));
        assert_eq!(projected_attempts(b"not json"), None);
    }
}
