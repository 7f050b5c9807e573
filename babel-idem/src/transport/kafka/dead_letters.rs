//! The dead-letter topic operations of [`KafkaTransport`]
//! ([`DeadLetters`]); what each does is on the impl.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::producer::FutureProducer;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::util::Timeout;
use rdkafka::{Offset, TopicPartitionList};

use super::KafkaTransport;
use super::check_topic;
use super::headers;
use super::produce::{self, Record};
use crate::broker::{
    BoxedRun, DeadLetterMessage, DeadLetterRun, DeadLetters, Outgoing, TransportError,
    TransportFuture,
};

/// A dead-letter record a run looked at: where it is in the topic, and
/// what putting it back appends again. The run's
/// [`DeadLetterRun::Handle`].
///
/// ```no_run
/// use babel_idem::broker::{DeadLetterRun, DeadLetters};
/// use babel_idem::transport::KafkaTransport;
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let transport = KafkaTransport::connect("kafka://127.0.0.1:9092").await?;
/// if let Some(mut run) = transport.open_dead_letters("orders.dlq").await? {
///     for message in run.look(10).await? {
///         println!("partition {} offset {}", message.handle.partition(), message.handle.offset());
///         run.put_back(message);
///     }
///     run.close().await?; // a run that only looked commits nothing
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct DeadLetterHandle {
    partition: i32,
    offset: i64,
    key: Option<Vec<u8>>,
    headers: Vec<(String, Option<Vec<u8>>)>,
    timestamp: Option<i64>,
    null_value: bool,
}

impl DeadLetterHandle {
    /// The record's partition.
    pub fn partition(&self) -> i32 {
        self.partition
    }

    /// The record's offset in its partition.
    pub fn offset(&self) -> i64 {
        self.offset
    }

    /// The record's key as stored (`None`: a null key).
    pub fn key(&self) -> Option<&[u8]> {
        self.key.as_deref()
    }

    /// The record's headers as stored, in order (a `None` value is a null
    /// header value).
    pub fn headers(&self) -> &[(String, Option<Vec<u8>>)] {
        &self.headers
    }
}

/// The dead-letter topic operations of [`KafkaTransport`]
/// ([`DeadLetters`]): a Kafka topic is a log, read from a consumer group's
/// committed position and never shortened, so a run takes a record by
/// moving its group's position past it.
///
/// | operation | what it does |
/// |---|---|
/// | open | topic metadata (a topic that does not exist opens no run, and is not created); the run's group's committed offsets; a consumer assigned to every partition from there (no group join) |
/// | depth | the sum over partitions of the high watermark minus the run's start (the committed offset, or the low watermark without one) |
/// | look | polls records from the start, in each partition's order; reads, takes nothing |
/// | republish | the redriven body to the target topic with the record's key kept, the envelope's `bq-` headers and the copy's own, broker-confirmed; the record is then done |
/// | put back | when the run moved a later record of the same partition, the record is appended again to the dead-letter topic as stored (value, key, headers, timestamp) at close, confirmed; else it stays where it is |
/// | close | commits each partition's position up to its lowest record neither republished nor appended again; a run that moved nothing commits nothing |
///
/// The run's consumer group is `<transport group>-redrive`
/// (`babelqueue-redrive` by default): the workers' group never reads a
/// dead-letter topic, and its offsets are not touched.
///
/// A run killed before its close commits nothing: every record stays in
/// the dead-letter topic, and the records it republished are there and on
/// their target, with the same `meta.id`. One killed between appending a
/// record again and the commit leaves that record twice in the topic.
impl DeadLetters for KafkaTransport {
    type Handle = DeadLetterHandle;

    fn open_dead_letters<'a>(
        &'a self,
        dlq: &'a str,
    ) -> TransportFuture<'a, Option<BoxedRun<DeadLetterHandle>>> {
        Box::pin(async move {
            check_topic(dlq)?;
            let settings = &self.inner.settings;
            let group = format!("{}-redrive", settings.options.group);
            let consumer: StreamConsumer = settings
                .consumer_config(&group)
                .create()
                .map_err(|error| TransportError::Connect(Box::new(error)))?;
            let consumer = Arc::new(consumer);
            let timeout = settings.timeout;
            let opened = blocking({
                let (consumer, dlq) = (Arc::clone(&consumer), dlq.to_owned());
                move || starts(&consumer, &dlq, timeout)
            })
            .await?;
            let Some(partitions) = opened else {
                return Ok(None);
            };
            let mut assignment = TopicPartitionList::new();
            for (partition, state) in &partitions {
                assignment
                    .add_partition_offset(dlq, *partition, Offset::Offset(state.start))
                    .map_err(broker)?;
            }
            consumer.assign(&assignment).map_err(broker)?;
            let run: BoxedRun<DeadLetterHandle> = Box::new(KafkaDlq {
                dlq: dlq.to_owned(),
                consumer,
                producer: self.inner.producer.clone(),
                timeout,
                partitions,
                moved_any: false,
            });
            Ok(Some(run))
        })
    }
}

/// Each partition of `dlq` with where a run starts (the group's committed
/// offset, else the low watermark) and its high watermark; `None` when the
/// topic does not exist.
fn starts(
    consumer: &StreamConsumer,
    dlq: &str,
    timeout: Duration,
) -> Result<Option<BTreeMap<i32, Partition>>, TransportError> {
    let metadata = consumer
        .fetch_metadata(Some(dlq), Timeout::After(timeout))
        .map_err(broker)?;
    let Some(topic) = metadata.topics().iter().find(|topic| topic.name() == dlq) else {
        return Ok(None);
    };
    match topic.error().map(RDKafkaErrorCode::from) {
        None => {}
        Some(RDKafkaErrorCode::UnknownTopicOrPartition | RDKafkaErrorCode::UnknownTopic) => {
            return Ok(None);
        }
        Some(code) => return Err(broker(KafkaError::MetadataFetch(code))),
    }
    if topic.partitions().is_empty() {
        return Ok(None);
    }
    let mut list = TopicPartitionList::new();
    for partition in topic.partitions() {
        list.add_partition(dlq, partition.id());
    }
    let committed = consumer
        .committed_offsets(list, Timeout::After(timeout))
        .map_err(broker)?;
    let mut partitions = BTreeMap::new();
    for partition in topic.partitions() {
        let id = partition.id();
        let (low, high) = consumer
            .fetch_watermarks(dlq, id, Timeout::After(timeout))
            .map_err(broker)?;
        let committed =
            committed
                .find_partition(dlq, id)
                .and_then(|element| match element.offset() {
                    Offset::Offset(offset) => Some(offset),
                    _ => None,
                });
        // A committed offset the retention has passed starts at the log's start.
        let start = committed.map_or(low, |committed| committed.clamp(low, high.max(low)));
        partitions.insert(
            id,
            Partition {
                start,
                next: start,
                high,
                looked: BTreeMap::new(),
            },
        );
    }
    Ok(Some(partitions))
}

/// Runs `work` (librdkafka calls that block) off the async runtime.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, TransportError> + Send + 'static,
) -> Result<T, TransportError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|error| TransportError::Broker(Box::new(error)))?
}

fn broker(error: KafkaError) -> TransportError {
    TransportError::Broker(Box::new(error))
}

/// One run over a dead-letter topic.
struct KafkaDlq {
    dlq: String,
    consumer: Arc<StreamConsumer>,
    producer: FutureProducer,
    timeout: Duration,
    partitions: BTreeMap<i32, Partition>,
    /// Whether a record was republished: only then does closing write.
    moved_any: bool,
}

/// A partition of the dead-letter topic, as the run reads it.
struct Partition {
    /// The run's start: the group's committed position when it opened.
    start: i64,
    /// The offset after the last record looked at.
    next: i64,
    /// The high watermark, as the last depth read it.
    high: i64,
    /// Every record looked at, by offset, and what became of it.
    looked: BTreeMap<i64, Fate>,
}

/// What became of a record looked at.
enum Fate {
    /// Neither republished nor put back: the commit never passes it.
    Open,
    /// Its copy is on its target: the commit may pass it.
    Republished,
    /// To stay in the dead-letter topic: appended again at close when a
    /// later record of its partition moved.
    PutBack(Box<Kept>),
    /// Appended again to the dead-letter topic: the commit may pass it.
    Appended,
}

/// A put-back record, as stored.
struct Kept {
    value: Option<Vec<u8>>,
    handle: DeadLetterHandle,
}

impl Fate {
    fn done(&self) -> bool {
        matches!(self, Fate::Republished | Fate::Appended)
    }
}

impl KafkaDlq {
    /// The fate of the record `handle` names, when this run looked at it.
    fn fate(&mut self, handle: &DeadLetterHandle) -> Option<&mut Fate> {
        self.partitions
            .get_mut(&handle.partition)?
            .looked
            .get_mut(&handle.offset)
    }

    /// Appends the put-back records that lie before a republished one of
    /// their partition again, in order, confirmed; stops at the first
    /// failure.
    async fn append_again(&mut self) -> Result<(), TransportError> {
        for partition in self.partitions.values_mut() {
            let last_moved = partition
                .looked
                .iter()
                .rev()
                .find(|(_, fate)| matches!(fate, Fate::Republished))
                .map(|(offset, _)| *offset);
            let Some(last_moved) = last_moved else {
                continue;
            };
            for fate in partition
                .looked
                .range_mut(..last_moved)
                .map(|(_, fate)| fate)
            {
                let Fate::PutBack(kept) = fate else {
                    continue;
                };
                let handle = &kept.handle;
                let stored = produce::Stored {
                    key: handle.key.as_deref(),
                    value: kept.value.as_deref(),
                    headers: produce::stored_headers(&handle.headers),
                    timestamp: handle.timestamp,
                };
                produce::send(&self.producer, &self.dlq, stored).await?;
                *fate = Fate::Appended;
            }
        }
        Ok(())
    }

    /// Each partition's position past its records done, up to the lowest
    /// one that is not; partitions the run did not move are left out.
    fn positions(&self) -> Result<TopicPartitionList, TransportError> {
        let mut list = TopicPartitionList::new();
        for (id, partition) in &self.partitions {
            let position = partition
                .looked
                .iter()
                .find(|(_, fate)| !fate.done())
                .map_or(partition.next, |(offset, _)| *offset);
            if position > partition.start {
                list.add_partition_offset(&self.dlq, *id, Offset::Offset(position))
                    .map_err(broker)?;
            }
        }
        Ok(list)
    }
}

impl DeadLetterRun for KafkaDlq {
    type Handle = DeadLetterHandle;

    fn depth(&mut self) -> TransportFuture<'_, usize> {
        Box::pin(async move {
            let consumer = Arc::clone(&self.consumer);
            let dlq = self.dlq.clone();
            let ids: Vec<i32> = self.partitions.keys().copied().collect();
            let timeout = self.timeout;
            let highs = blocking(move || {
                ids.into_iter()
                    .map(|id| {
                        consumer
                            .fetch_watermarks(&dlq, id, Timeout::After(timeout))
                            .map(|(_, high)| (id, high))
                            .map_err(broker)
                    })
                    .collect::<Result<Vec<_>, _>>()
            })
            .await?;
            let mut depth: i64 = 0;
            for (id, high) in highs {
                if let Some(partition) = self.partitions.get_mut(&id) {
                    partition.high = high;
                    depth += (high - partition.start).max(0);
                }
            }
            Ok(usize::try_from(depth).unwrap_or(usize::MAX))
        })
    }

    fn look(
        &mut self,
        max: usize,
    ) -> TransportFuture<'_, Vec<DeadLetterMessage<DeadLetterHandle>>> {
        Box::pin(async move {
            let mut page = Vec::new();
            let consumer = Arc::clone(&self.consumer);
            while page.len() < max
                && self
                    .partitions
                    .values()
                    .any(|partition| partition.next < partition.high)
            {
                let received = match tokio::time::timeout(self.timeout, consumer.recv()).await {
                    Ok(received) => received.map_err(broker)?,
                    Err(_) if !page.is_empty() => break,
                    Err(_) => {
                        return Err(TransportError::Broker(
                            format!(
                                "no record of {} arrived within {:?}, though its watermarks say it holds more",
                                self.dlq, self.timeout
                            )
                            .into(),
                        ));
                    }
                };
                let (id, offset) = (received.partition(), received.offset());
                let Some(partition) = self.partitions.get_mut(&id) else {
                    continue;
                };
                // Before the cursor: read already. At or past the high
                // watermark: appended since the depth was read, for a later run.
                if offset < partition.next || offset >= partition.high {
                    continue;
                }
                partition.next = offset + 1;
                partition.looked.insert(offset, Fate::Open);
                let stored = headers::stored(&received);
                let text = stored
                    .iter()
                    .map(|(name, value)| {
                        let value = value.as_deref().unwrap_or_default();
                        (name.clone(), String::from_utf8_lossy(value).into_owned())
                    })
                    .collect();
                let handle = DeadLetterHandle {
                    partition: id,
                    offset,
                    key: received.key().map(<[u8]>::to_vec),
                    headers: stored,
                    timestamp: received.timestamp().to_millis(),
                    null_value: received.payload().is_none(),
                };
                let body = received.payload().map(<[u8]>::to_vec).unwrap_or_default();
                page.push(DeadLetterMessage::new(body, text, handle));
            }
            Ok(page)
        })
    }

    fn republish<'a>(
        &'a mut self,
        message: DeadLetterMessage<DeadLetterHandle>,
        copy: Outgoing<'a>,
    ) -> TransportFuture<'a, bool> {
        Box::pin(async move {
            check_topic(copy.queue)?;
            let handle = message.handle;
            if !matches!(self.fate(&handle), Some(Fate::Open)) {
                // Not a record this run holds undecided.
                return Ok(false);
            }
            let outgoing = produce::envelope_headers(copy.body, copy.headers);
            let outgoing: Vec<(&str, &[u8])> = outgoing
                .iter()
                .map(|(name, value)| (name.as_str(), value.as_slice()))
                .collect();
            produce::confirmed(
                &self.producer,
                Record {
                    topic: copy.queue,
                    key: handle.key.as_deref(),
                    value: copy.body,
                    headers: &outgoing,
                    timestamp: headers::timestamp(copy.body),
                },
            )
            .await?;
            if let Some(fate) = self.fate(&handle) {
                *fate = Fate::Republished;
            }
            self.moved_any = true;
            Ok(true)
        })
    }

    fn put_back(&mut self, message: DeadLetterMessage<DeadLetterHandle>) {
        let handle = message.handle;
        let value = (!handle.null_value).then_some(message.body);
        if let Some(fate) = self.fate(&handle)
            && matches!(fate, Fate::Open)
        {
            *fate = Fate::PutBack(Box::new(Kept { value, handle }));
        }
    }

    fn close(&mut self) -> TransportFuture<'_, ()> {
        Box::pin(async move {
            // A run that moved nothing changes nothing: no append, no commit.
            if !std::mem::take(&mut self.moved_any) {
                return Ok(());
            }
            let appended = self.append_again().await;
            // What is done is committed even when an append failed: the
            // positions stop at the record that was not appended.
            let positions = self.positions()?;
            // Closed: a second close finds nothing to do.
            self.partitions.clear();
            if positions.count() > 0 {
                let consumer = Arc::clone(&self.consumer);
                blocking(move || {
                    consumer
                        .commit(&positions, CommitMode::Sync)
                        .map_err(broker)
                })
                .await?;
            }
            appended
        })
    }

    fn check_queue(&self, queue: &str) -> Result<(), TransportError> {
        check_topic(queue)
    }
}
