//! One test's topics on the Kafka-protocol broker, for the tests that run a
//! consumer on Kafka: the work topic, its `.dlq` and its retry tiers, made
//! with a raw admin client (the binding never creates topics) and deleted
//! on drop; and what reached them, read without committing.

use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use crate::store_contract::servers::unique_suffix;

/// The variable that names the shared broker.
pub const KAFKA_URL: &str = "BABEL_IDEM_KAFKA_URL";

/// One record as it sits in a topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub value: Vec<u8>,
    pub headers: Vec<(String, Vec<u8>)>,
    pub timestamp: Option<i64>,
}

impl Record {
    /// The first value of the header `name`, as text.
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| String::from_utf8_lossy(value).into_owned())
    }
}

/// A test's work topic `name` with `partitions`, its `.dlq`, and `tiers`
/// retry topics `<name>.retry.<n>`; all deleted on drop.
pub struct Topic {
    pub url: String,
    pub name: String,
    pub partitions: i32,
    made: Vec<String>,
}

/// `host:port,...` of a `kafka://` URL.
pub fn brokers(url: &str) -> String {
    url.trim_start_matches("kafka://").to_owned()
}

fn admin(url: &str) -> AdminClient<DefaultClientContext> {
    ClientConfig::new()
        .set("bootstrap.servers", brokers(url))
        .create()
        .expect("an admin client")
}

impl Topic {
    /// Makes the topics and waits until the broker knows them.
    pub async fn new(url: &str, partitions: i32, tiers: usize) -> Self {
        let name = format!("bi-kafka-{}", unique_suffix());
        let mut made = vec![name.clone(), format!("{name}.dlq")];
        made.extend((1..=tiers).map(|n| format!("{name}.retry.{n}")));
        let specs: Vec<NewTopic> = made
            .iter()
            .enumerate()
            .map(|(i, topic)| {
                // The work topic has the partitions asked for; the others one each.
                let count = if i == 0 { partitions } else { 1 };
                NewTopic::new(topic, count, TopicReplication::Fixed(1))
            })
            .collect();
        let results = admin(url)
            .create_topics(&specs, &AdminOptions::new())
            .await
            .expect("create the test's topics");
        for result in results {
            result.unwrap_or_else(|(topic, error)| panic!("create {topic}: {error}"));
        }
        Topic {
            url: url.to_owned(),
            name,
            partitions,
            made,
        }
    }

    pub fn dlq(&self) -> String {
        format!("{}.dlq", self.name)
    }

    pub fn tier(&self, n: usize) -> String {
        format!("{}.retry.{n}", self.name)
    }

    /// Writes `value` with `key` and `headers` to `topic` as a foreign
    /// producer would; its partition and offset.
    pub async fn produce(
        &self,
        topic: &str,
        key: Option<&[u8]>,
        value: &[u8],
        headers: &[(&str, &[u8])],
    ) -> (i32, i64) {
        let producer: FutureProducer = ClientConfig::new()
            .set("bootstrap.servers", brokers(&self.url))
            .create()
            .unwrap();
        let owned = headers.iter().fold(
            rdkafka::message::OwnedHeaders::new(),
            |all, (name, value)| {
                all.insert(rdkafka::message::Header {
                    key: name,
                    value: Some(*value),
                })
            },
        );
        let mut record = FutureRecord::<[u8], [u8]>::to(topic)
            .payload(value)
            .headers(owned);
        if let Some(key) = key {
            record = record.key(key);
        }
        let delivery = producer
            .send(record, Timeout::After(Duration::from_secs(30)))
            .await
            .unwrap_or_else(|(error, _)| panic!("produce to {topic}: {error}"));
        (delivery.partition, delivery.offset)
    }

    /// Writes each `(key, value)` of `records` to the work topic, all sent
    /// before any delivery report is awaited; their partitions and offsets,
    /// in order.
    pub async fn produce_many(&self, records: &[(Vec<u8>, Vec<u8>)]) -> Vec<(i32, i64)> {
        let producer: FutureProducer = ClientConfig::new()
            .set("bootstrap.servers", brokers(&self.url))
            .set("queue.buffering.max.messages", "1000000")
            .create()
            .unwrap();
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
        let mut written = Vec::with_capacity(pending.len());
        for delivery in pending {
            let delivery = delivery
                .await
                .expect("the producer is alive")
                .unwrap_or_else(|(error, _)| panic!("produce: {error}"));
            written.push((delivery.partition, delivery.offset));
        }
        written
    }

    /// Every record of `topic`, by partition and offset, read by a
    /// throwaway group that commits nothing.
    pub async fn records(&self, topic: &str) -> Vec<Record> {
        let url = self.url.clone();
        let topic = topic.to_owned();
        tokio::task::spawn_blocking(move || read_all(&url, &topic))
            .await
            .unwrap()
    }

    /// The offsets `group` committed on the work topic, by partition
    /// (`None`: nothing committed), and each partition's end.
    pub async fn committed_and_ends(&self, group: &str) -> Vec<(Option<i64>, i64)> {
        let (url, topic, group) = (self.url.clone(), self.name.clone(), group.to_owned());
        let partitions = self.partitions;
        tokio::task::spawn_blocking(move || {
            let consumer = reader(&url, &group);
            let mut list = TopicPartitionList::new();
            for partition in 0..partitions {
                list.add_partition(&topic, partition);
            }
            let committed = consumer
                .committed_offsets(list, Duration::from_secs(10))
                .expect("the group's committed offsets");
            (0..partitions)
                .map(|partition| {
                    let offset = match committed.find_partition(&topic, partition).map(|p| p.offset()) {
                        Some(Offset::Offset(offset)) => Some(offset),
                        _ => None,
                    };
                    let (_, high) = consumer
                        .fetch_watermarks(&topic, partition, Duration::from_secs(10))
                        .expect("the partition's watermarks");
                    (offset, high)
                })
                .collect()
        })
        .await
        .unwrap()
    }
}

fn reader(url: &str, group: &str) -> BaseConsumer {
    ClientConfig::new()
        .set("bootstrap.servers", brokers(url))
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .create()
        .expect("a reading consumer")
}

fn read_all(url: &str, topic: &str) -> Vec<Record> {
    let consumer = reader(url, &format!("bi-reader-{}", unique_suffix()));
    let metadata = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .expect("the topic's metadata");
    let mut list = TopicPartitionList::new();
    let mut ends = Vec::new();
    for partition in metadata.topics()[0].partitions() {
        let (low, high) = consumer
            .fetch_watermarks(topic, partition.id(), Duration::from_secs(10))
            .unwrap();
        if high > low {
            list.add_partition_offset(topic, partition.id(), Offset::Offset(low))
                .unwrap();
            ends.push((partition.id(), high));
        }
    }
    let mut records = Vec::new();
    if ends.is_empty() {
        return records;
    }
    consumer.assign(&list).unwrap();
    let give_up = std::time::Instant::now() + Duration::from_secs(30);
    let mut seen_ends = std::collections::HashMap::new();
    while std::time::Instant::now() < give_up {
        let done = ends
            .iter()
            .all(|(partition, high)| seen_ends.get(partition).is_some_and(|seen| seen + 1 >= *high));
        if done {
            break;
        }
        let Some(message) = consumer.poll(Duration::from_millis(100)) else {
            continue;
        };
        let message = message.expect("read a record");
        seen_ends.insert(message.partition(), message.offset());
        records.push(Record {
            partition: message.partition(),
            offset: message.offset(),
            key: message.key().map(<[u8]>::to_vec),
            value: message.payload().map(<[u8]>::to_vec).unwrap_or_default(),
            headers: message
                .headers()
                .map(|headers| {
                    headers
                        .iter()
                        .map(|h| (h.key.to_owned(), h.value.map(<[u8]>::to_vec).unwrap_or_default()))
                        .collect()
                })
                .unwrap_or_default(),
            timestamp: message.timestamp().to_millis(),
        });
    }
    records.sort_by_key(|record| (record.partition, record.offset));
    records
}

impl Drop for Topic {
    fn drop(&mut self) {
        let (url, made) = (self.url.clone(), std::mem::take(&mut self.made));
        // A runtime of its own: a drop may run outside of one, or inside one
        // that cannot block.
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async {
                let names: Vec<&str> = made.iter().map(String::as_str).collect();
                let _ = admin(&url).delete_topics(&names, &AdminOptions::new()).await;
            });
        })
        .join();
    }
}
