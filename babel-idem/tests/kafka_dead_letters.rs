//! Dead-letter topics on a real Kafka broker (`BABEL_IDEM_KAFKA_URL`):
//! `KafkaTransport`'s `DeadLetters` runs, directly and through `redrive`.
//! Without the broker a test prints `skipped:`; with
//! `BABEL_IDEM_REQUIRE_SERVERS=1` it fails instead.
#![cfg(all(feature = "kafka-transport", feature = "redrive"))]

mod support;

use babel_idem::Envelope;
use babel_idem::broker::DeadLetters;
use babel_idem::envelope::{DeadLetter, DeadLetterReason};
use babel_idem::redrive::{Redrive, RedriveError, RedriveOptions, Selection};
use babel_idem::transport::KafkaTransport;
use serde_json::{Value, json};
use support::kafka::{
    READ_QUIET, Raw, Topics, committed, kafka_url, produce, producer, read_all, unique,
};

const URN: &str = "urn:babel:orders:created";

/// The group a run of the default transport reads the DLQ with.
const REDRIVE_GROUP: &str = "babelqueue-redrive";

/// A test's work topic and its dead-letter topic (`partitions` each).
struct Queue {
    name: String,
    topics: Topics,
    partitions: i32,
}

impl Queue {
    async fn new(url: &str, partitions: i32) -> Queue {
        let name = unique("bi-kafka-dlq");
        let names = [name.clone(), format!("{name}.dlq")];
        let topics = Topics::create(url, &names, partitions).await;
        Queue {
            name,
            topics,
            partitions,
        }
    }

    fn dlq(&self) -> String {
        format!("{}.dlq", self.name)
    }

    /// A dead-letter record for this queue, written to partition 0 with `key`.
    async fn dead_letter(&self, id: &str, key: &[u8]) -> Vec<u8> {
        let mut envelope = Envelope::new(URN, json!({"order": id}))
            .with_id(id)
            .with_queue(&self.name)
            .with_attempts(3);
        envelope.dead_letter =
            Some(DeadLetter::new(DeadLetterReason::Failed, &self.name, 3).with_error("timeout"));
        let body = envelope.to_vec();
        produce(
            &producer(self.topics.url()),
            &self.dlq(),
            Raw {
                key: Some(key),
                value: &body,
                headers: vec![("bq-message-id", Some(id.as_bytes())), ("x-null", None)],
                timestamp: Some(1_796_000_000_000),
                partition: Some(0),
            },
        )
        .await;
        body
    }

    async fn committed(&self) -> Option<i64> {
        committed(self.topics.url(), REDRIVE_GROUP, &self.dlq(), 1).await[&0]
    }
}

fn id_of(body: &[u8]) -> String {
    let value: Value = serde_json::from_slice(body).unwrap();
    value["meta"]["id"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn looking_reads_every_record_in_order_takes_none_and_commits_nothing() {
    let test = "looking_reads_every_record_in_order_takes_none_and_commits_nothing";
    let Some(url) = kafka_url(test) else { return };
    let queue = Queue::new(&url, 1).await;
    for id in ["l-1", "l-2", "l-3"] {
        queue.dead_letter(id, id.as_bytes()).await;
    }
    let transport = KafkaTransport::connect(&url).await.unwrap();

    for _ in 0..2 {
        let records = transport.dead_letters(&queue.dlq(), None).await.unwrap();
        let ids: Vec<Option<&str>> = records.iter().map(|r| r.id.as_deref()).collect();
        assert_eq!(ids, [Some("l-1"), Some("l-2"), Some("l-3")]);
        assert_eq!(records[0].reason, "failed");
        assert_eq!(
            records[0].original_queue.as_deref(),
            Some(queue.name.as_str())
        );
    }
    let records = transport.dead_letters(&queue.dlq(), Some(2)).await.unwrap();
    assert_eq!(records.len(), 2);
    assert_eq!(queue.committed().await, None, "a look commits nothing");
    assert_eq!(
        read_all(queue.topics.url(), &queue.dlq(), None, READ_QUIET)
            .await
            .len(),
        3
    );
}

#[tokio::test]
async fn a_run_that_only_looked_and_put_back_commits_nothing() {
    let test = "a_run_that_only_looked_and_put_back_commits_nothing";
    let Some(url) = kafka_url(test) else { return };
    let queue = Queue::new(&url, 1).await;
    queue.dead_letter("p-1", b"k1").await;
    queue.dead_letter("p-2", b"k2").await;
    let transport = KafkaTransport::connect(&url).await.unwrap();

    let mut run = transport
        .open_dead_letters(&queue.dlq())
        .await
        .unwrap()
        .expect("the topic exists");
    assert_eq!(run.depth().await.unwrap(), 2);
    let page = run.look(10).await.unwrap();
    assert_eq!(page.len(), 2);
    let handle = &page[0].handle;
    assert_eq!((handle.partition(), handle.offset()), (0, 0));
    assert_eq!(handle.key(), Some(&b"k1"[..]));
    assert_eq!(
        handle.headers(),
        [
            ("bq-message-id".to_owned(), Some(b"p-1".to_vec())),
            ("x-null".to_owned(), None)
        ]
    );
    for message in page {
        run.put_back(message);
    }
    run.close().await.unwrap();

    assert_eq!(queue.committed().await, None);
    assert_eq!(
        read_all(queue.topics.url(), &queue.dlq(), None, READ_QUIET)
            .await
            .len(),
        2
    );
    let mut again = transport
        .open_dead_letters(&queue.dlq())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(again.depth().await.unwrap(), 2);
    again.close().await.unwrap();
}

#[tokio::test]
async fn redrive_republishes_a_record_with_its_key_and_takes_it_off_the_dlq() {
    let test = "redrive_republishes_a_record_with_its_key_and_takes_it_off_the_dlq";
    let Some(url) = kafka_url(test) else { return };
    let queue = Queue::new(&url, 1).await;
    queue.dead_letter("r-1", b"customer-7").await;
    queue.dead_letter("r-2", b"customer-8").await;
    let transport = KafkaTransport::connect(&url).await.unwrap();

    let options = RedriveOptions::new().select(Selection::new().id("r-1"));
    let report = transport.redrive(&queue.dlq(), &options).await.unwrap();
    assert_eq!((report.moved, report.skipped), (1, 1));

    let work = read_all(queue.topics.url(), &queue.name, None, READ_QUIET).await;
    assert_eq!(work.len(), 1);
    let moved = &work[0];
    assert_eq!(moved.key.as_deref(), Some(&b"customer-7"[..]));
    let body: Value = serde_json::from_slice(&moved.value).unwrap();
    assert_eq!(body["meta"]["id"], "r-1");
    assert_eq!(body["attempts"], 0);
    assert!(body.get("dead_letter").is_none(), "{body}");
    assert_eq!(moved.header("bq-attempts").as_deref(), Some("0"));
    assert_eq!(moved.header("bq-message-id").as_deref(), Some("r-1"));

    // r-2 comes after the moved record and is not written again: the
    // commit stops at it, and it is where it was.
    assert_eq!(queue.committed().await, Some(1));
    let left = transport.dead_letters(&queue.dlq(), None).await.unwrap();
    let ids: Vec<Option<&str>> = left.iter().map(|r| r.id.as_deref()).collect();
    assert_eq!(ids, [Some("r-2")]);
    assert_eq!(
        read_all(queue.topics.url(), &queue.dlq(), None, READ_QUIET)
            .await
            .len(),
        2
    );
}

#[tokio::test]
async fn a_record_put_back_before_a_moved_one_stays_in_the_dlq_as_it_was() {
    let test = "a_record_put_back_before_a_moved_one_stays_in_the_dlq_as_it_was";
    let Some(url) = kafka_url(test) else { return };
    let queue = Queue::new(&url, 1).await;
    let kept = queue.dead_letter("k-1", b"customer-1").await;
    queue.dead_letter("k-2", b"customer-2").await;
    let transport = KafkaTransport::connect(&url).await.unwrap();

    let options = RedriveOptions::new().select(Selection::new().id("k-2"));
    let report = transport.redrive(&queue.dlq(), &options).await.unwrap();
    assert_eq!((report.moved, report.skipped), (1, 1));

    // Both offsets are passed; k-1 was appended again, as it was stored.
    assert_eq!(queue.committed().await, Some(2));
    let all = read_all(queue.topics.url(), &queue.dlq(), None, READ_QUIET).await;
    assert_eq!(all.len(), 3);
    let again = &all[2];
    assert_eq!(again.value, kept);
    assert_eq!(again.key.as_deref(), Some(&b"customer-1"[..]));
    assert_eq!(again.headers, all[0].headers);
    assert_eq!(again.timestamp, Some(1_796_000_000_000));
    let left = transport.dead_letters(&queue.dlq(), None).await.unwrap();
    let ids: Vec<String> = left.iter().map(|r| id_of(&r.body)).collect();
    assert_eq!(ids, ["k-1"]);
    let work = read_all(queue.topics.url(), &queue.name, None, READ_QUIET).await;
    assert_eq!(work.len(), 1);
    assert_eq!(work[0].key.as_deref(), Some(&b"customer-2"[..]));
}

#[tokio::test]
async fn a_dry_run_moves_nothing_and_commits_nothing() {
    let test = "a_dry_run_moves_nothing_and_commits_nothing";
    let Some(url) = kafka_url(test) else { return };
    let queue = Queue::new(&url, 1).await;
    queue.dead_letter("d-1", b"a").await;
    let transport = KafkaTransport::connect(&url).await.unwrap();

    let report = transport
        .redrive(&queue.dlq(), &RedriveOptions::new().dry_run(true))
        .await
        .unwrap();
    assert_eq!((report.moved, report.would_move), (0, 1));
    assert_eq!(queue.committed().await, None);
    assert!(
        read_all(queue.topics.url(), &queue.name, None, READ_QUIET)
            .await
            .is_empty()
    );
    assert_eq!(
        read_all(queue.topics.url(), &queue.dlq(), None, READ_QUIET)
            .await
            .len(),
        1
    );
}

#[tokio::test]
async fn a_dlq_topic_that_does_not_exist_opens_no_run_and_is_not_created() {
    let test = "a_dlq_topic_that_does_not_exist_opens_no_run_and_is_not_created";
    let Some(url) = kafka_url(test) else { return };
    let transport = KafkaTransport::connect(&url).await.unwrap();
    let missing = unique("bi-kafka-missing");

    assert!(
        transport
            .open_dead_letters(&missing)
            .await
            .unwrap()
            .is_none()
    );
    let error = transport
        .redrive(&missing, &RedriveOptions::new())
        .await
        .unwrap_err();
    assert!(matches!(error, RedriveError::MissingQueue(_)), "{error}");
    assert!(
        transport
            .open_dead_letters(&missing)
            .await
            .unwrap()
            .is_none()
    );
    let Err(refused) = transport.open_dead_letters("no spaces").await else {
        panic!("a topic name with spaces was taken");
    };
    assert!(refused.to_string().contains("no spaces"), "{refused}");
}

#[tokio::test]
async fn depth_counts_every_partition_from_the_runs_start() {
    let test = "depth_counts_every_partition_from_the_runs_start";
    let Some(url) = kafka_url(test) else { return };
    let queue = Queue::new(&url, 3).await;
    for partition in 0..queue.partitions {
        produce(
            &producer(queue.topics.url()),
            &queue.dlq(),
            Raw {
                value: b"not an envelope",
                partition: Some(partition),
                ..Raw::default()
            },
        )
        .await;
    }
    let transport = KafkaTransport::connect(&url).await.unwrap();
    let mut run = transport
        .open_dead_letters(&queue.dlq())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(run.depth().await.unwrap(), 3);
    let page = run.look(10).await.unwrap();
    let mut partitions: Vec<i32> = page.iter().map(|m| m.handle.partition()).collect();
    partitions.sort_unstable();
    assert_eq!(partitions, [0, 1, 2]);
    assert!(page.iter().all(|m| m.handle.key().is_none()));
    run.close().await.unwrap();
}
