//! One test's topics on the Kafka-protocol broker, for the tests that run a
//! consumer on Kafka: the work topic, its `.dlq` and its retry tiers, made
//! through `support::kafka` (the binding never creates topics) and deleted
//! on drop; bulk writes, and what reached them.

use std::collections::HashMap;
use std::time::Duration;

use rdkafka::producer::FutureRecord;

use crate::support::kafka::{self as raw, Read, Topics, unique};

/// How long a read waits with nothing new before it takes a topic as read.
const QUIET: Duration = Duration::from_secs(2);

/// A test's work topic `name` with `partitions`, its `.dlq` and `tiers`
/// retry topics `<name>.retry.<n>`, and the groups it named; all deleted on
/// drop.
pub struct Topic {
    pub url: String,
    pub name: String,
    pub partitions: i32,
    topics: Option<Topics>,
}

impl Topic {
    /// Makes the topics (each with `partitions`).
    pub async fn new(url: &str, partitions: i32, tiers: usize) -> Self {
        let name = unique("bi-kafka");
        let mut names = vec![name.clone(), format!("{name}.dlq")];
        names.extend((1..=tiers).map(|n| format!("{name}.retry.{n}")));
        let topics = Topics::create(url, &names, partitions).await;
        Topic {
            url: url.to_owned(),
            name,
            partitions,
            topics: Some(topics),
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
        self.topics.as_ref().expect("the topics").group()
    }

    /// Writes one record to `topic` as a foreign producer would.
    pub async fn produce(
        &self,
        topic: &str,
        key: Option<&[u8]>,
        value: &[u8],
        headers: &[(&str, &[u8])],
    ) {
        raw::produce(&raw::producer(&self.url), topic, None, key, value, headers).await;
    }

    /// Writes each `(key, value)` of `records` to the work topic, all sent
    /// before any delivery report is awaited.
    pub async fn produce_many(&self, records: &[(Vec<u8>, Vec<u8>)]) {
        let producer = raw::producer(&self.url);
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
        raw::read_all(&self.url, topic, None, QUIET).await
    }

    /// Whether `group` committed every partition of the work topic to its
    /// end (one past its last record); the positions when not.
    pub async fn all_committed(&self, group: &str) -> Result<(), String> {
        let mut ends: HashMap<i32, i64> = HashMap::new();
        for record in self.records(&self.name).await {
            let end = ends.entry(record.partition).or_insert(0);
            *end = (*end).max(record.offset + 1);
        }
        let committed = raw::committed(&self.url, group, &self.name, self.partitions).await;
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

impl Drop for Topic {
    fn drop(&mut self) {
        let Some(topics) = self.topics.take() else {
            return;
        };
        // A runtime of its own: a drop may run inside a runtime that
        // cannot block.
        let _ = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(topics.delete());
        })
        .join();
    }
}
