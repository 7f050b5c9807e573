//! Kafka test helpers: a test's own topics (made through rdkafka's
//! `AdminClient`, deleted on drop), raw records written and read back, and
//! a group's committed offsets, all on the broker in `BABEL_IDEM_KAFKA_URL`.
#![allow(dead_code, unreachable_pub)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders, OwnedMessage};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;
use rdkafka::{Offset, TopicPartitionList};
use serde_json::Value;

pub const KAFKA_URL: &str = "BABEL_IDEM_KAFKA_URL";
const REQUIRE_SERVERS: &str = "BABEL_IDEM_REQUIRE_SERVERS";

/// How long a helper waits for the broker (a guard against hanging).
const PATIENCE: Duration = Duration::from_secs(30);

fn required() -> bool {
    std::env::var(REQUIRE_SERVERS).is_ok_and(|value| value == "1")
}

fn skip(test: &str, reason: &str) {
    if required() {
        panic!("{test}: {reason}, and {REQUIRE_SERVERS}=1 requires it");
    }
    let _ = std::io::Write::write_fmt(
        &mut std::io::stderr(),
        format_args!("skipped: {test}: {reason}\n"),
    );
}

/// The broker URL, or `None` after a visible skip line.
pub fn kafka_url(test: &str) -> Option<String> {
    match std::env::var(KAFKA_URL) {
        Ok(url) if !url.trim().is_empty() => Some(url),
        _ => {
            skip(test, &format!("{KAFKA_URL} is not set"));
            None
        }
    }
}

/// The Python interpreter of the peer, or `None` after a visible skip line.
pub fn python(test: &str) -> Option<PathBuf> {
    match std::env::var("BABEL_IDEM_PYTHON") {
        Ok(path) if !path.trim().is_empty() => Some(PathBuf::from(path)),
        _ => {
            skip(test, "BABEL_IDEM_PYTHON is not set");
            None
        }
    }
}

/// Runs `tests/python/<script>` with `args` (and `stdin`) on a blocking
/// thread; its JSON answer.
pub async fn python_peer(python: &Path, script: &str, args: Vec<String>, stdin: Value) -> Value {
    let python = python.to_path_buf();
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/python")
        .join(script);
    tokio::task::spawn_blocking(move || {
        let mut child = Command::new(&python)
            .arg(script)
            .args(&args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("start {python:?}: {e}"));
        std::io::Write::write_all(
            &mut child.stdin.take().unwrap(),
            stdin.to_string().as_bytes(),
        )
        .unwrap();
        let output = child.wait_with_output().unwrap();
        assert!(
            output.status.success(),
            "python peer {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
            panic!(
                "python peer {args:?} printed no JSON ({e}): {}",
                String::from_utf8_lossy(&output.stdout)
            )
        })
    })
    .await
    .unwrap()
}

/// `host:port,...` of a `kafka://` URL.
pub fn bootstrap(url: &str) -> String {
    url.trim_start_matches("kafka://").to_owned()
}

/// A short random name part, one per test run.
pub fn unique(prefix: &str) -> String {
    format!(
        "{prefix}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
}

/// A test's topics on the broker; deleted on drop.
pub struct Topics {
    bootstrap: String,
    names: Vec<String>,
}

fn admin(bootstrap: &str) -> AdminClient<DefaultClientContext> {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("an admin client")
}

impl Topics {
    /// Creates `names`, each with `partitions` partitions.
    pub async fn create(url: &str, names: &[String], partitions: i32) -> Topics {
        let bootstrap = bootstrap(url);
        let admin = admin(&bootstrap);
        let new: Vec<NewTopic<'_>> = names
            .iter()
            .map(|name| NewTopic::new(name, partitions, TopicReplication::Fixed(1)))
            .collect();
        let options = AdminOptions::new().operation_timeout(Some(Timeout::After(PATIENCE)));
        let results = admin
            .create_topics(&new, &options)
            .await
            .expect("CreateTopics answered");
        for result in results {
            if let Err((name, code)) = result {
                panic!("creating topic {name} failed: {code}");
            }
        }
        Topics {
            bootstrap,
            names: names.to_vec(),
        }
    }

    pub fn bootstrap(&self) -> &str {
        &self.bootstrap
    }
}

impl Drop for Topics {
    fn drop(&mut self) {
        let bootstrap = self.bootstrap.clone();
        let names = std::mem::take(&mut self.names);
        // Off the test's runtime: a drop cannot await.
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async {
                let admin = admin(&bootstrap);
                let names: Vec<&str> = names.iter().map(String::as_str).collect();
                let _ = admin.delete_topics(&names, &AdminOptions::new()).await;
            });
        })
        .join();
    }
}

/// One record to write raw.
#[derive(Debug, Clone, Default)]
pub struct Raw<'a> {
    pub key: Option<&'a [u8]>,
    pub value: &'a [u8],
    pub headers: Vec<(&'a str, Option<&'a [u8]>)>,
    pub timestamp: Option<i64>,
    pub partition: Option<i32>,
}

/// Writes `record` to `topic` and waits for the broker's confirmation.
pub async fn produce(bootstrap: &str, topic: &str, record: Raw<'_>) -> (i32, i64) {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("a producer");
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
        .unwrap_or_else(|(e, _)| panic!("producing to {topic}: {e}"));
    (delivery.partition, delivery.offset)
}

/// How long a read waits for one more record once it reached every
/// partition's high watermark (tansu reports the high watermark as the last
/// batch's base offset + 1, short of a batch of several records).
const SETTLE: Duration = Duration::from_millis(1000);

/// Every record of `topic` now, partition by partition, in offset order.
pub async fn read_all(bootstrap: &str, topic: &str) -> Vec<OwnedMessage> {
    let bootstrap = bootstrap.to_owned();
    let topic = topic.to_owned();
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &bootstrap)
            .set("group.id", unique("bi-kafka-reader"))
            .set("enable.auto.commit", "false")
            .create()
            .expect("a consumer");
        let metadata = consumer
            .fetch_metadata(Some(&topic), Timeout::After(PATIENCE))
            .expect("metadata");
        let mut list = TopicPartitionList::new();
        let mut ends = BTreeMap::new();
        for partition in metadata.topics()[0].partitions() {
            let (low, high) = consumer
                .fetch_watermarks(&topic, partition.id(), Timeout::After(PATIENCE))
                .expect("watermarks");
            list.add_partition_offset(&topic, partition.id(), Offset::Offset(low))
                .unwrap();
            ends.insert(partition.id(), (low, high));
        }
        consumer.assign(&list).unwrap();
        let mut by_partition: BTreeMap<i32, Vec<OwnedMessage>> = BTreeMap::new();
        let deadline = std::time::Instant::now() + PATIENCE;
        let mut last_record = std::time::Instant::now();
        loop {
            let reached = ends.iter().all(|(partition, (low, high))| {
                let next = by_partition
                    .get(partition)
                    .and_then(|records| records.last())
                    .map_or(*low, |record| record.offset() + 1);
                next >= *high
            });
            if reached && last_record.elapsed() >= SETTLE {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{topic}: read {by_partition:?} of {ends:?}"
            );
            match consumer.poll(Duration::from_millis(100)) {
                Some(Ok(message)) => {
                    last_record = std::time::Instant::now();
                    let records = by_partition.entry(message.partition()).or_default();
                    if records
                        .last()
                        .is_none_or(|last| last.offset() < message.offset())
                    {
                        records.push(message.detach());
                    }
                }
                Some(Err(e)) => panic!("reading {topic}: {e}"),
                None => {}
            }
        }
        by_partition.into_values().flatten().collect()
    })
    .await
    .unwrap()
}

/// `group`'s committed offsets on `topic`'s partitions `0..partitions`
/// (`None`: nothing committed).
pub async fn committed(
    bootstrap: &str,
    group: &str,
    topic: &str,
    partitions: i32,
) -> BTreeMap<i32, Option<i64>> {
    let (bootstrap, group, topic) = (bootstrap.to_owned(), group.to_owned(), topic.to_owned());
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &bootstrap)
            .set("group.id", &group)
            .set("enable.auto.commit", "false")
            .create()
            .expect("a consumer");
        let mut list = TopicPartitionList::new();
        for partition in 0..partitions {
            list.add_partition(&topic, partition);
        }
        let committed = consumer
            .committed_offsets(list, Timeout::After(PATIENCE))
            .expect("committed offsets");
        (0..partitions)
            .map(|partition| {
                let offset =
                    committed
                        .find_partition(&topic, partition)
                        .and_then(|e| match e.offset() {
                            Offset::Offset(offset) => Some(offset),
                            _ => None,
                        });
                (partition, offset)
            })
            .collect()
    })
    .await
    .unwrap()
}

/// A record's headers, in order (a null value as `None`).
pub fn headers_of(record: &OwnedMessage) -> Vec<(String, Option<Vec<u8>>)> {
    record
        .headers()
        .map(|headers| {
            headers
                .iter()
                .map(|h| (h.key.to_owned(), h.value.map(<[u8]>::to_vec)))
                .collect()
        })
        .unwrap_or_default()
}

/// The value of header `name`, as text.
pub fn header(record: &OwnedMessage, name: &str) -> Option<String> {
    headers_of(record)
        .into_iter()
        .find(|(key, _)| key == name)
        .and_then(|(_, value)| value)
        .map(|value| String::from_utf8(value).unwrap())
}

/// Unix milliseconds now.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}
