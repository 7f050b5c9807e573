//! Kafka helpers for the integration tests: the server URL or a skip line,
//! unique topics made and deleted through the admin API (on drop too), raw
//! produce ([`Raw`]), and reading a topic or a group's committed offsets
//! back; [`WorkTopic`], one consumer test's work topic with its `.dlq` and
//! retry tiers. Self-contained (rdkafka, tokio, uuid only), so the CLI's
//! tests include it by path as well.
#![allow(dead_code, unreachable_pub)]

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use rdkafka::util::Timeout;

/// The longest a helper waits for the broker before it fails the test (a
/// guard against hanging, never a timing assertion).
pub const PATIENCE: Duration = Duration::from_secs(60);

/// `BABEL_IDEM_KAFKA_URL`, or `None` after a visible skip line; with
/// `BABEL_IDEM_REQUIRE_SERVERS=1` a missing URL fails the test instead.
pub fn kafka_url(test: &str) -> Option<String> {
    match std::env::var("BABEL_IDEM_KAFKA_URL") {
        Ok(url) if !url.trim().is_empty() => Some(url),
        _ => {
            let required = std::env::var("BABEL_IDEM_REQUIRE_SERVERS").is_ok_and(|v| v == "1");
            assert!(
                !required,
                "{test}: BABEL_IDEM_KAFKA_URL is not set and BABEL_IDEM_REQUIRE_SERVERS=1"
            );
            eprintln!("skipped: {test}: BABEL_IDEM_KAFKA_URL is not set");
            None
        }
    }
}

/// The `bootstrap.servers` of a `kafka://host:port[,host:port]` URL.
pub fn bootstrap(url: &str) -> String {
    url.trim_start_matches("kafka://").to_owned()
}

/// A name no other test run uses: `<prefix>-<uuid>`.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

fn admin(url: &str) -> AdminClient<DefaultClientContext> {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap(url))
        .create()
        .expect("an admin client")
}

/// Topics made for one test, and the consumer groups it names through
/// [`Topics::group`]; [`Topics::delete`] removes them all, and a drop
/// removes what no `delete` did.
pub struct Topics {
    url: String,
    names: Vec<String>,
    groups: std::sync::Mutex<Vec<String>>,
}

impl Topics {
    /// Creates each of `names` with `partitions` partitions (replication 1)
    /// and waits until the broker lists them.
    pub async fn create(url: &str, names: &[String], partitions: i32) -> Topics {
        let admin = admin(url);
        let new: Vec<NewTopic<'_>> = names
            .iter()
            .map(|name| NewTopic::new(name, partitions, TopicReplication::Fixed(1)))
            .collect();
        let options = AdminOptions::new().operation_timeout(Some(Timeout::After(PATIENCE)));
        let results = admin
            .create_topics(&new, &options)
            .await
            .expect("CreateTopics answers");
        for result in results {
            if let Err((name, code)) = result {
                panic!("creating topic {name} failed: {code:?}");
            }
        }
        let topics = Topics {
            url: url.to_owned(),
            names: names.to_vec(),
            groups: std::sync::Mutex::default(),
        };
        topics.await_metadata(partitions).await;
        topics
    }

    /// Waits until every topic shows its partitions in the metadata.
    async fn await_metadata(&self, partitions: i32) {
        let url = self.url.clone();
        let names = self.names.clone();
        tokio::task::spawn_blocking(move || {
            let consumer: BaseConsumer = ClientConfig::new()
                .set("bootstrap.servers", bootstrap(&url))
                .create()
                .unwrap();
            let deadline = Instant::now() + PATIENCE;
            for name in names {
                loop {
                    let known = consumer
                        .fetch_metadata(Some(&name), Duration::from_secs(5))
                        .ok()
                        .and_then(|metadata| {
                            metadata
                                .topics()
                                .iter()
                                .find(|topic| topic.name() == name && topic.error().is_none())
                                .map(|topic| topic.partitions().len() as i32)
                        });
                    if known == Some(partitions) {
                        break;
                    }
                    assert!(Instant::now() < deadline, "topic {name} never showed up");
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        })
        .await
        .unwrap();
    }

    /// The broker URL the topics were made on.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The topic names, in the order given.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// A consumer group name no other test uses, deleted with the topics.
    pub fn group(&self) -> String {
        let group = unique("bi-group");
        self.groups.lock().unwrap().push(group.clone());
        group
    }

    /// Deletes the topics and the groups (best effort: a broker that
    /// cannot is reported, not failed on). Call it once every client of
    /// the groups is closed.
    pub async fn delete(mut self) {
        // Taken out, so the drop that follows has nothing left to delete.
        let names = std::mem::take(&mut self.names);
        let groups = std::mem::take(&mut *self.groups.lock().unwrap());
        let admin = admin(&self.url);
        delete_groups(&admin, &groups).await;
        if names.is_empty() {
            return;
        }
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        match admin.delete_topics(&names, &AdminOptions::new()).await {
            Ok(results) => {
                for result in results {
                    if let Err((name, code)) = result {
                        eprintln!("note: deleting topic {name} failed: {code:?}");
                    }
                }
            }
            Err(error) => eprintln!("note: DeleteTopics failed: {error}"),
        }
    }
}

impl Drop for Topics {
    fn drop(&mut self) {
        let groups = std::mem::take(&mut *self.groups.lock().unwrap());
        // Checked before a `Topics` of what is left is made: its own drop
        // then finds nothing, and stops here.
        if self.names.is_empty() && groups.is_empty() {
            return;
        }
        let left = Topics {
            url: self.url.clone(),
            names: std::mem::take(&mut self.names),
            groups: std::sync::Mutex::new(groups),
        };
        // A runtime of its own, on a thread of its own: a drop cannot await,
        // and may run inside a runtime that cannot block.
        let _ = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(left.delete());
        })
        .join();
    }
}

/// Deletes `groups` (best effort, reported).
async fn delete_groups(admin: &AdminClient<DefaultClientContext>, groups: &[String]) {
    if groups.is_empty() {
        return;
    }
    let names: Vec<&str> = groups.iter().map(String::as_str).collect();
    match admin.delete_groups(&names, &AdminOptions::new()).await {
        Ok(results) => {
            for result in results {
                if let Err((name, code)) = result {
                    eprintln!("note: deleting group {name} failed: {code:?}");
                }
            }
        }
        Err(error) => eprintln!("note: DeleteGroups failed: {error}"),
    }
}

/// The producer setting every test's writes use: one record per batch.
/// tansu (0.6) cannot fetch from an offset inside a record batch (it
/// answers with the next batch), so a consumer that resumes, seeks or takes
/// over a partition mid-batch would skip records there; one record per
/// batch keeps every offset a batch boundary. Kafka itself needs none of it.
pub const ONE_RECORD_PER_BATCH: (&str, &str) = ("batch.num.messages", "1");

/// A plain producer (not the transport's), for records a test shapes itself.
pub fn producer(url: &str) -> FutureProducer {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap(url))
        .set(ONE_RECORD_PER_BATCH.0, ONE_RECORD_PER_BATCH.1)
        .set("message.timeout.ms", "30000")
        .create()
        .expect("a producer")
}

/// One record to write as a foreign producer would: [`Raw::value`], then
/// what else it carries.
#[derive(Debug, Clone, Default)]
pub struct Raw<'a> {
    pub key: Option<&'a [u8]>,
    pub value: &'a [u8],
    /// In order; a `None` value is a header with a null value.
    pub headers: Vec<(&'a str, Option<&'a [u8]>)>,
    /// The record's timestamp (the producer's clock when `None`).
    pub timestamp: Option<i64>,
    /// The partition (the partitioner's choice when `None`).
    pub partition: Option<i32>,
}

impl<'a> Raw<'a> {
    /// A record of `value` alone.
    pub fn value(value: &'a (impl AsRef<[u8]> + ?Sized)) -> Self {
        Raw {
            value: value.as_ref(),
            ..Raw::default()
        }
    }

    pub fn key(mut self, key: &'a (impl AsRef<[u8]> + ?Sized)) -> Self {
        self.key = Some(key.as_ref());
        self
    }

    /// One more header, after those already given.
    pub fn header(mut self, name: &'a str, value: &'a (impl AsRef<[u8]> + ?Sized)) -> Self {
        self.headers.push((name, Some(value.as_ref())));
        self
    }

    pub fn partition(mut self, partition: i32) -> Self {
        self.partition = Some(partition);
        self
    }
}

/// Writes `record` to `topic` and waits for its delivery report; where it
/// landed (partition, offset).
pub async fn produce(producer: &FutureProducer, topic: &str, record: Raw<'_>) -> (i32, i64) {
    let headers = record
        .headers
        .iter()
        .fold(OwnedHeaders::new(), |all, (key, value)| {
            all.insert(Header { key, value: *value })
        });
    let mut future = FutureRecord::<[u8], [u8]>::to(topic)
        .payload(record.value)
        .headers(headers);
    if let Some(key) = record.key {
        future = future.key(key);
    }
    if let Some(timestamp) = record.timestamp {
        future = future.timestamp(timestamp);
    }
    if let Some(partition) = record.partition {
        future = future.partition(partition);
    }
    let delivery = producer
        .send(future, Timeout::After(PATIENCE))
        .await
        .unwrap_or_else(|(error, _)| panic!("producing to {topic}: {error}"));
    (delivery.partition, delivery.offset)
}

/// One record read back.
#[derive(Debug, Clone)]
pub struct Read {
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub value: Vec<u8>,
    /// In order; a `None` value is a header with a null value.
    pub headers: Vec<(String, Option<Vec<u8>>)>,
    pub timestamp: Option<i64>,
}

impl Read {
    /// The value of header `name` as text (`None` for a null value too).
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .and_then(|(_, value)| value.as_deref())
            .map(|value| String::from_utf8_lossy(value).into_owned())
    }

    /// The header names, in order.
    pub fn header_names(&self) -> Vec<&str> {
        self.headers.iter().map(|(name, _)| name.as_str()).collect()
    }
}

/// Reads `topic` from the start with a throwaway group (never committing)
/// until `expected` records came, or until nothing more comes for `quiet`
/// once `expected` is `None`; in (partition, offset) order.
pub async fn read_all(
    url: &str,
    topic: &str,
    expected: Option<usize>,
    quiet: Duration,
) -> Vec<Read> {
    let reader_group = unique("bi-reader");
    let (url_owned, group) = (url.to_owned(), reader_group.clone());
    let topic = topic.to_owned();
    let read = tokio::task::spawn_blocking(move || {
        let url = url_owned;
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap(&url))
            .set("group.id", &group)
            .set("enable.auto.commit", "false")
            .set("auto.offset.reset", "earliest")
            .create()
            .unwrap();
        consumer.subscribe(&[&topic]).unwrap();
        let deadline = Instant::now() + PATIENCE;
        let mut last_seen = Instant::now();
        let mut assigned = false;
        let mut out = Vec::new();
        loop {
            if expected.is_some_and(|expected| out.len() >= expected) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "reading {topic}: {} of {expected:?} records",
                out.len()
            );
            match consumer.poll(Duration::from_millis(200)) {
                Some(Ok(message)) => {
                    last_seen = Instant::now();
                    out.push(Read {
                        partition: message.partition(),
                        offset: message.offset(),
                        key: message.key().map(<[u8]>::to_vec),
                        value: message.payload().map(<[u8]>::to_vec).unwrap_or_default(),
                        headers: message
                            .headers()
                            .map(|headers| {
                                headers
                                    .iter()
                                    .map(|h| (h.key.to_owned(), h.value.map(<[u8]>::to_vec)))
                                    .collect()
                            })
                            .unwrap_or_default(),
                        timestamp: message.timestamp().to_millis(),
                    });
                }
                Some(Err(error)) => panic!("reading {topic}: {error}"),
                None => {
                    if !assigned {
                        assigned = consumer
                            .assignment()
                            .is_ok_and(|assignment| assignment.count() > 0);
                        if assigned {
                            last_seen = Instant::now();
                        }
                    }
                    if expected.is_none() && assigned && last_seen.elapsed() >= quiet {
                        break;
                    }
                }
            }
        }
        out.sort_by_key(|read| (read.partition, read.offset));
        // Leaves the group before it is deleted.
        drop(consumer);
        out
    })
    .await
    .unwrap();
    delete_groups(&admin(url), &[reader_group]).await;
    read
}

/// The offsets `group` committed on the partitions `0..partitions` of
/// `topic` (`None` for a partition without a commit).
pub async fn committed(
    url: &str,
    group: &str,
    topic: &str,
    partitions: i32,
) -> HashMap<i32, Option<i64>> {
    let url = url.to_owned();
    let group = group.to_owned();
    let topic = topic.to_owned();
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap(&url))
            .set("group.id", &group)
            .set("enable.auto.commit", "false")
            .create()
            .unwrap();
        let mut list = TopicPartitionList::new();
        for partition in 0..partitions {
            list.add_partition(&topic, partition);
        }
        let committed = consumer
            .committed_offsets(list, Timeout::After(PATIENCE))
            .expect("OffsetFetch answers");
        committed
            .elements_for_topic(&topic)
            .iter()
            .map(|element| {
                let offset = match element.offset() {
                    Offset::Offset(offset) => Some(offset),
                    _ => None,
                };
                (element.partition(), offset)
            })
            .collect()
    })
    .await
    .unwrap()
}

/// The end offset (one past the last record) of each partition of `topic`
/// that holds records, read back record by record: `expected` records in
/// all. (Not the broker's high watermark: tansu answers ListOffsets
/// `latest` with one past the *first* offset of the last record batch.)
pub async fn end_offsets(url: &str, topic: &str, expected: usize) -> HashMap<i32, i64> {
    let mut ends = HashMap::new();
    for read in read_all(url, topic, Some(expected), Duration::ZERO).await {
        let end = ends.entry(read.partition).or_insert(0);
        *end = (*end).max(read.offset + 1);
    }
    ends
}

// ---------------------------------------------------------------- a work topic

/// How long a read waits with nothing new before it takes a topic as read.
pub const READ_QUIET: Duration = Duration::from_secs(2);

/// A test's work topic `name` with `partitions`, its `.dlq` and `tiers`
/// retry topics `<name>.retry.<n>`, and the groups it named; all deleted on
/// drop (by its [`Topics`]).
pub struct WorkTopic {
    pub url: String,
    pub name: String,
    pub partitions: i32,
    topics: Topics,
}

impl WorkTopic {
    /// Makes the topics (each with `partitions`).
    pub async fn new(url: &str, partitions: i32, tiers: usize) -> Self {
        let name = unique("bi-kafka");
        let mut names = vec![name.clone(), format!("{name}.dlq")];
        names.extend((1..=tiers).map(|n| format!("{name}.retry.{n}")));
        let topics = Topics::create(url, &names, partitions).await;
        WorkTopic {
            url: url.to_owned(),
            name,
            partitions,
            topics,
        }
    }

    pub fn dlq(&self) -> String {
        format!("{}.dlq", self.name)
    }

    pub fn tier(&self, n: usize) -> String {
        format!("{}.retry.{n}", self.name)
    }

    /// A consumer group no other test uses, deleted with the topics.
    pub fn group(&self) -> String {
        self.topics.group()
    }

    /// Writes one record to `topic` as a foreign producer would.
    pub async fn produce(
        &self,
        topic: &str,
        key: Option<&[u8]>,
        value: &[u8],
        headers: &[(&str, &[u8])],
    ) {
        let record = Raw {
            key,
            value,
            headers: headers
                .iter()
                .map(|(name, value)| (*name, Some(*value)))
                .collect(),
            ..Raw::default()
        };
        produce(&producer(&self.url), topic, record).await;
    }

    /// Writes each `(key, value)` of `records` to the work topic, all sent
    /// before any delivery report is awaited.
    pub async fn produce_many(&self, records: &[(Vec<u8>, Vec<u8>)]) {
        let producer = producer(&self.url);
        let mut pending = Vec::with_capacity(records.len());
        for (key, value) in records {
            let record = FutureRecord::<[u8], [u8]>::to(&self.name)
                .key(key)
                .payload(value);
            pending.push(
                producer
                    .send_result(record)
                    .unwrap_or_else(|(error, _)| panic!("enqueue: {error}")),
            );
        }
        for delivery in pending {
            delivery
                .await
                .expect("the producer is alive")
                .unwrap_or_else(|(error, _)| panic!("produce: {error}"));
        }
    }

    /// Every record of `topic`, by partition and offset (read until
    /// nothing new comes for a while, by a group that commits nothing).
    pub async fn records(&self, topic: &str) -> Vec<Read> {
        read_all(&self.url, topic, None, READ_QUIET).await
    }

    /// Whether `group` committed every partition of the work topic to its
    /// end (one past its last record); the positions when not.
    pub async fn all_committed(&self, group: &str) -> Result<(), String> {
        let mut ends: HashMap<i32, i64> = HashMap::new();
        for record in self.records(&self.name).await {
            let end = ends.entry(record.partition).or_insert(0);
            *end = (*end).max(record.offset + 1);
        }
        let committed = committed(&self.url, group, &self.name, self.partitions).await;
        let behind: Vec<String> = ends
            .iter()
            .filter(|(partition, end)| committed.get(partition).copied().flatten() != Some(**end))
            .map(|(partition, end)| {
                format!(
                    "partition {partition}: end {end}, committed {:?}",
                    committed.get(partition)
                )
            })
            .collect();
        if behind.is_empty() {
            Ok(())
        } else {
            Err(behind.join("; "))
        }
    }
}

/// Unix milliseconds now.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}
