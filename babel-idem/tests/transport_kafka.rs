//! `KafkaTransport` against a Kafka-protocol broker: what it publishes,
//! how a `Consumer` runs over it, where retries and dead letters land, the
//! per-key order and the committed offsets.
//!
//! Environment: `BABEL_IDEM_KAFKA_URL` (e.g. `kafka://127.0.0.1:9092`);
//! without it each test prints `skipped:`, and with
//! `BABEL_IDEM_REQUIRE_SERVERS=1` it fails instead. Every test makes its
//! own topics and group, and deletes its topics at the end.
#![cfg(feature = "kafka-transport")]

#[path = "support/python.rs"]
mod python;
mod support;

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use babel_idem::broker::Publisher;
use babel_idem::transport::kafka::RetryTiers;
use babel_idem::transport::{
    KafkaHandle, KafkaTransport, Outgoing, Reserved, Settlement, Transport, TransportError,
};
use babel_idem::{Consumer, Delivery, Envelope, Router, urn};
use serde_json::{Value, json};
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

use python::{peer, python};
use support::kafka::{
    PATIENCE, Raw, Read, Topics, committed, end_offsets, kafka_url, produce, producer, read_all,
    unique,
};

const URN: &str = "urn:babel:interop:created";

/// How long a consumer or a reader must see nothing before a test takes
/// the topic as drained (never a timing assertion).
const QUIET: Duration = Duration::from_secs(3);

// ---------------------------------------------------------------- fixtures

/// The broker URL, or `None` after a skip line; first installs the
/// process-wide subscriber that collects commit events, before any test
/// makes a client (so every callsite registers with it in place).
fn url_for(test: &str) -> Option<String> {
    commit_log();
    kafka_url(test)
}

/// The commit events of every test in this binary, by topic.
fn commit_log() -> &'static Commits {
    static LOG: OnceLock<Commits> = OnceLock::new();
    LOG.get_or_init(|| {
        let commits = Commits::default();
        let subscriber = tracing_subscriber::registry().with(commits.clone());
        tracing::subscriber::set_global_default(subscriber)
            .expect("no other subscriber in this test binary");
        commits
    })
}

/// A transport in its own consumer group.
async fn transport(url: &str, group: &str) -> KafkaTransport {
    KafkaTransport::builder()
        .group(group)
        .connect(url)
        .await
        .expect("the broker answers")
}

/// Runs `consumer` until `done` holds (checked every 50 ms), then until it
/// is idle.
async fn run_until(consumer: &Consumer<KafkaTransport>, done: impl Fn() -> bool) {
    let progress = consumer.progress();
    let stop = async {
        while !done() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        progress.idle_for(QUIET).await;
    };
    tokio::time::timeout(PATIENCE * 2, consumer.run_until(stop))
        .await
        .expect("the consumer finishes");
}

fn envelope(n: u64) -> Envelope {
    Envelope::new(URN, json!({ "n": n }))
}

fn id_of(envelope: &Envelope) -> String {
    envelope
        .meta
        .id
        .clone()
        .expect("a fresh envelope has an id")
}

/// A router whose one handler records each envelope's id and its
/// `Delivery::attempts`, and fails when `fail` says so.
fn recording_router(seen: Arc<Mutex<Vec<(String, u64)>>>, fail: bool, max_attempts: u64) -> Router {
    Router::builder()
        .route(
            urn!("urn:babel:interop:created"),
            move |env: Envelope, delivery: Delivery| {
                seen.lock()
                    .unwrap()
                    .push((env.meta.id.clone().unwrap_or_default(), delivery.attempts()));
                async move {
                    if fail {
                        return Err(std::io::Error::other("payment gateway timeout"));
                    }
                    Ok(())
                }
            },
        )
        .max_attempts(max_attempts)
        .build()
        .unwrap()
}

/// Reserves from `queue` until `count` records came (the first reserves
/// find nothing while the group assigns partitions).
async fn reserve_exactly(
    transport: &KafkaTransport,
    queue: &str,
    count: usize,
) -> Vec<Reserved<KafkaHandle>> {
    let mut out = Vec::new();
    tokio::time::timeout(PATIENCE, async {
        while out.len() < count {
            out.extend(transport.reserve(queue, count - out.len()).await.unwrap());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{} of {count} records reserved from {queue}", out.len()));
    out
}

/// The commit events the transport emits (`topic`, `partition`, `offset`),
/// collected by a subscriber layer.
#[derive(Clone, Default)]
struct Commits(Arc<Mutex<Vec<(String, i64, i64)>>>);

#[derive(Default)]
struct CommitFields {
    message: Option<String>,
    topic: Option<String>,
    partition: Option<i64>,
    offset: Option<i64>,
}

impl Visit for CommitFields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        match field.name() {
            "message" => self.message = Some(format!("{value:?}")),
            "topic" => self.topic = Some(format!("{value:?}").trim_matches('"').to_owned()),
            _ => {}
        }
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "topic" {
            self.topic = Some(value.to_owned());
        }
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        match field.name() {
            "partition" => self.partition = Some(value),
            "offset" => self.offset = Some(value),
            _ => {}
        }
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.record_i64(field, value as i64);
    }
}

impl<S: tracing::Subscriber> Layer<S> for Commits {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        if event.metadata().target() != "babel_idem::transport::kafka" {
            return;
        }
        let mut fields = CommitFields::default();
        event.record(&mut fields);
        if let (Some("commit"), Some(topic), Some(partition), Some(offset)) = (
            fields.message.as_deref(),
            fields.topic,
            fields.partition,
            fields.offset,
        ) {
            self.0.lock().unwrap().push((topic, partition, offset));
        }
    }
}

// ---------------------------------------------------------------- publishing

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_body_writes_the_value_byte_for_byte_with_the_projection_and_created_at() {
    const TEST: &str = "kafka_publish_body_writes_the_value_byte_for_byte";
    let Some(url) = url_for(TEST) else {
        return;
    };
    let topic = unique("bi-publish");
    let topics = Topics::create(&url, std::slice::from_ref(&topic), 1).await;
    let transport = transport(&url, &topics.group()).await;

    let sent = envelope(7).with_attempts(2).with_queue(&topic);
    let body = sent.to_vec();
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    transport
        .publish_body(
            &topic,
            &body,
            &[("traceparent".to_owned(), traceparent.to_owned())],
        )
        .await
        .unwrap();

    let read = read_all(&url, &topic, Some(1), QUIET).await;
    let record = &read[0];
    assert_eq!(record.value, body, "the value is the body byte for byte");
    assert_eq!(record.key, None, "a published record has a null key");
    assert_eq!(
        record.header_names(),
        [
            "bq-job",
            "bq-trace-id",
            "bq-message-id",
            "bq-schema-version",
            "bq-source-lang",
            "bq-attempts",
            "traceparent"
        ]
    );
    assert_eq!(record.header("bq-job").as_deref(), Some(URN));
    assert_eq!(record.header("bq-trace-id"), Some(sent.trace_id.clone()));
    assert_eq!(record.header("bq-message-id"), sent.meta.id.clone());
    assert_eq!(record.header("bq-schema-version").as_deref(), Some("1"));
    assert_eq!(record.header("bq-attempts").as_deref(), Some("2"));
    assert_eq!(record.header("traceparent").as_deref(), Some(traceparent));
    let created_at = serde_json::from_slice::<Value>(&body).unwrap()["meta"]["created_at"]
        .as_i64()
        .expect("created_at in ms");
    assert_eq!(record.timestamp, Some(created_at));
    topics.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_batch_reports_each_message_in_order() {
    const TEST: &str = "kafka_publish_batch_reports_each_message_in_order";
    let Some(url) = url_for(TEST) else {
        return;
    };
    let (first, second) = (unique("bi-batch-a"), unique("bi-batch-b"));
    let topics = Topics::create(&url, &[first.clone(), second.clone()], 2).await;
    let transport = transport(&url, &topics.group()).await;

    let bodies: Vec<Vec<u8>> = (0..4).map(|n| envelope(n).to_vec()).collect();
    let messages = [
        Outgoing::new(&first, &bodies[0]),
        Outgoing::new("not/a topic", &bodies[1]),
        Outgoing::new(&second, &bodies[2]),
        Outgoing::new(&first, &bodies[3]),
    ];
    let outcome = Publisher::publish_batch(&transport, &messages)
        .await
        .unwrap();
    assert_eq!(outcome.len(), 4);
    assert!(
        outcome[0].is_ok() && outcome[2].is_ok() && outcome[3].is_ok(),
        "{outcome:?}"
    );
    assert!(
        matches!(&outcome[1], Err(TransportError::InvalidQueue { .. })),
        "{outcome:?}"
    );

    let values =
        |read: Vec<Read>| -> BTreeSet<Vec<u8>> { read.into_iter().map(|r| r.value).collect() };
    assert_eq!(
        values(read_all(&url, &first, Some(2), QUIET).await),
        BTreeSet::from([bodies[0].clone(), bodies[3].clone()])
    );
    assert_eq!(
        values(read_all(&url, &second, Some(1), QUIET).await),
        BTreeSet::from([bodies[2].clone()])
    );
    topics.delete().await;
}

// ---------------------------------------------------------------- consuming

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_runs_the_handler_once_per_id_and_commits_every_record() {
    const TEST: &str = "kafka_a_consumer_runs_the_handler_once_per_id";
    let Some(url) = url_for(TEST) else {
        return;
    };
    const PARTITIONS: i32 = 3;
    let topic = unique("bi-work");
    let topics = Topics::create(&url, std::slice::from_ref(&topic), PARTITIONS).await;
    let group = topics.group();
    let transport = transport(&url, &group).await;
    let sent: Vec<Envelope> = (0..60).map(envelope).collect();
    let bodies: Vec<Vec<u8>> = sent.iter().map(Envelope::to_vec).collect();
    let messages: Vec<Outgoing<'_>> = bodies.iter().map(|b| Outgoing::new(&topic, b)).collect();
    let outcome = Publisher::publish_batch(&transport, &messages)
        .await
        .unwrap();
    assert!(outcome.iter().all(Result::is_ok), "{outcome:?}");

    let seen = Arc::new(Mutex::new(Vec::new()));
    let consumer = Consumer::builder(
        recording_router(Arc::clone(&seen), false, 3),
        transport.clone(),
        &topic,
    )
    .concurrency(8)
    .build()
    .unwrap();
    let counted = Arc::clone(&seen);
    run_until(&consumer, || counted.lock().unwrap().len() >= sent.len()).await;

    let mut runs: HashMap<String, usize> = HashMap::new();
    for (id, _) in seen.lock().unwrap().iter() {
        *runs.entry(id.clone()).or_default() += 1;
    }
    assert_eq!(runs.len(), sent.len(), "every id ran");
    assert!(runs.values().all(|n| *n == 1), "each id ran once: {runs:?}");
    assert_eq!(transport.unsettled(&topic), 0);

    transport.close().await;
    let ends = end_offsets(&url, &topic, sent.len()).await;
    let commits = committed(&url, &group, &topic, PARTITIONS).await;
    for (partition, end) in ends {
        let committed = commits.get(&partition).copied().flatten();
        assert_eq!(
            committed,
            Some(end),
            "partition {partition} is committed to its end"
        );
    }
    topics.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_with_tiers_lands_on_the_first_tier_with_delay_original_topic_and_key() {
    const TEST: &str = "kafka_a_retry_with_tiers_lands_on_the_first_tier";
    let Some(url) = url_for(TEST) else {
        return;
    };
    let topic = unique("bi-retry");
    let tier_topic = format!("{topic}.retry.1");
    let names = [topic.clone(), tier_topic.clone(), format!("{topic}.dlq")];
    let topics = Topics::create(&url, &names, 1).await;
    let tiers = RetryTiers::new([Duration::from_millis(1500), Duration::from_secs(30)]).unwrap();
    let transport = KafkaTransport::builder()
        .group(topics.group())
        .retry_tiers(tiers)
        .connect(&url)
        .await
        .unwrap();

    let sent = envelope(1).with_queue(&topic);
    let traceparent = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    produce(
        &producer(&url),
        &topic,
        Raw::value(&sent.to_vec())
            .key(b"customer-42")
            .header("bq-attempts", b"0")
            .header("traceparent", traceparent),
    )
    .await;

    let seen = Arc::new(Mutex::new(Vec::new()));
    let consumer = Consumer::builder(
        recording_router(Arc::clone(&seen), true, 3),
        transport.clone(),
        &topic,
    )
    .build()
    .unwrap();
    let report = {
        let counted = Arc::clone(&seen);
        run_until(&consumer, || !counted.lock().unwrap().is_empty()).await;
        consumer.progress().report()
    };
    assert_eq!(report.retried, 1, "{report:?}");

    let parked = read_all(&url, &tier_topic, Some(1), QUIET).await;
    let record = &parked[0];
    assert_eq!(
        record.key.as_deref(),
        Some(&b"customer-42"[..]),
        "the key is kept"
    );
    assert_eq!(record.header("bq-delay").as_deref(), Some("1500"));
    assert_eq!(
        record.header("bq-original-topic").as_deref(),
        Some(topic.as_str())
    );
    assert_eq!(record.header("bq-attempts").as_deref(), Some("1"));
    assert_eq!(
        record.header("traceparent").as_deref(),
        Some(&*String::from_utf8_lossy(traceparent))
    );
    let body: Value = serde_json::from_slice(&record.value).unwrap();
    assert_eq!(body["attempts"], 1);
    assert_eq!(body["meta"]["id"], json!(id_of(&sent)));
    assert!(
        read_all(&url, &topic, None, QUIET).await.len() == 1,
        "nothing went back to the work topic"
    );
    transport.close().await;
    topics.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_lands_on_the_dlq_with_the_key_kept() {
    const TEST: &str = "kafka_a_dead_letter_lands_on_the_dlq";
    let Some(url) = url_for(TEST) else {
        return;
    };
    let topic = unique("bi-dead");
    let dlq = format!("{topic}.dlq");
    let topics = Topics::create(&url, &[topic.clone(), dlq.clone()], 1).await;
    let transport = transport(&url, &topics.group()).await;

    let sent = envelope(1).with_queue(&topic);
    produce(
        &producer(&url),
        &topic,
        Raw::value(&sent.to_vec()).key(b"order-9"),
    )
    .await;

    let seen = Arc::new(Mutex::new(Vec::new()));
    // One attempt: the first failure dead-letters.
    let consumer = Consumer::builder(
        recording_router(Arc::clone(&seen), true, 1),
        transport.clone(),
        &topic,
    )
    .build()
    .unwrap();
    let counted = Arc::clone(&seen);
    run_until(&consumer, || !counted.lock().unwrap().is_empty()).await;
    assert_eq!(consumer.progress().report().dead_lettered, 1);

    let dead = read_all(&url, &dlq, Some(1), QUIET).await;
    let record = &dead[0];
    assert_eq!(
        record.key.as_deref(),
        Some(&b"order-9"[..]),
        "the key is kept"
    );
    let body: Value = serde_json::from_slice(&record.value).unwrap();
    assert_eq!(body["meta"]["id"], json!(id_of(&sent)));
    assert_eq!(body["dead_letter"]["reason"], "failed");
    assert_eq!(record.header("bq-job").as_deref(), Some(URN));
    transport.close().await;
    topics.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_record_goes_to_the_dlq_and_the_others_run() {
    const TEST: &str = "kafka_a_poison_record_goes_to_the_dlq";
    let Some(url) = url_for(TEST) else {
        return;
    };
    let topic = unique("bi-poison");
    let dlq = format!("{topic}.dlq");
    let topics = Topics::create(&url, &[topic.clone(), dlq.clone()], 1).await;
    let transport = transport(&url, &topics.group()).await;

    let raw = producer(&url);
    let good: Vec<Envelope> = (0..3).map(envelope).collect();
    produce(&raw, &topic, Raw::value(&good[0].to_vec())).await;
    produce(
        &raw,
        &topic,
        Raw::value(b"not json")
            .key(b"k")
            .header("traceparent", b"00-ab"),
    )
    .await;
    for envelope in &good[1..] {
        produce(&raw, &topic, Raw::value(&envelope.to_vec())).await;
    }

    let seen = Arc::new(Mutex::new(Vec::new()));
    let consumer = Consumer::builder(
        recording_router(Arc::clone(&seen), false, 3),
        transport.clone(),
        &topic,
    )
    .build()
    .unwrap();
    let counted = Arc::clone(&seen);
    run_until(&consumer, || counted.lock().unwrap().len() >= good.len()).await;

    let ran: BTreeSet<String> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|(id, _)| id.clone())
        .collect();
    assert_eq!(ran, good.iter().map(id_of).collect());
    let dead = read_all(&url, &dlq, Some(1), QUIET).await;
    assert_eq!(dead.len(), 1);
    let record = &dead[0];
    assert_eq!(record.key.as_deref(), Some(&b"k"[..]), "the key is kept");
    let body: Value = serde_json::from_slice(&record.value).unwrap();
    assert_eq!(body["raw"], "not json", "the poison body is kept: {body}");
    assert_eq!(body["dead_letter"]["reason"], "poison");
    assert_eq!(record.header("traceparent").as_deref(), Some("00-ab"));
    assert_eq!(transport.unsettled(&topic), 0);
    transport.close().await;
    topics.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_of_one_key_run_in_order_one_at_a_time_while_other_keys_run_concurrently() {
    const TEST: &str = "kafka_records_of_one_key_run_in_order";
    let Some(url) = url_for(TEST) else {
        return;
    };
    let topic = unique("bi-keys");
    let topics = Topics::create(&url, std::slice::from_ref(&topic), 1).await;
    let transport = transport(&url, &topics.group()).await;

    const KEYS: [&str; 3] = ["alpha", "beta", "gamma"];
    const PER_KEY: u64 = 6;
    let raw = producer(&url);
    // Interleaved on one partition: a0 b0 g0 a1 b1 g1 ...
    for seq in 0..PER_KEY {
        for key in KEYS {
            let body = Envelope::new(URN, json!({ "key": key, "seq": seq })).to_vec();
            produce(
                &raw,
                &topic,
                Raw::value(&body).key(key.as_bytes()).partition(0),
            )
            .await;
        }
    }

    #[derive(Default)]
    struct Log {
        /// Per key: the `seq`s in the order their handlers started.
        order: HashMap<String, Vec<u64>>,
        /// Per key: handlers running now, and the most ever at once.
        running: HashMap<String, usize>,
        most_per_key: usize,
        /// Handlers of any key running now, and the most ever at once.
        all_running: usize,
        most_overall: usize,
    }
    let log = Arc::new(Mutex::new(Log::default()));
    let handled = Arc::new(AtomicUsize::new(0));
    let router = {
        let (log, handled) = (Arc::clone(&log), Arc::clone(&handled));
        Router::builder()
            .route(urn!("urn:babel:interop:created"), move |env: Envelope| {
                let (log, handled) = (Arc::clone(&log), Arc::clone(&handled));
                async move {
                    let key = env.data["key"].as_str().unwrap_or_default().to_owned();
                    let seq = env.data["seq"].as_u64().unwrap_or_default();
                    {
                        let mut log = log.lock().unwrap();
                        log.order.entry(key.clone()).or_default().push(seq);
                        let running = log.running.entry(key.clone()).or_default();
                        *running += 1;
                        let running = *running;
                        log.most_per_key = log.most_per_key.max(running);
                        log.all_running += 1;
                        log.most_overall = log.most_overall.max(log.all_running);
                    }
                    // Long enough for the other keys' records to start
                    // meanwhile; the assertion is on overlap, not speed.
                    tokio::time::sleep(Duration::from_millis(150)).await;
                    {
                        let mut log = log.lock().unwrap();
                        *log.running.get_mut(&key).unwrap() -= 1;
                        log.all_running -= 1;
                    }
                    handled.fetch_add(1, Ordering::SeqCst);
                    Ok::<(), std::io::Error>(())
                }
            })
            .build()
            .unwrap()
    };
    let consumer = Consumer::builder(router, transport.clone(), &topic)
        .concurrency(8)
        .build()
        .unwrap();
    let total = KEYS.len() * PER_KEY as usize;
    let done = Arc::clone(&handled);
    run_until(&consumer, || done.load(Ordering::SeqCst) >= total).await;

    let log = std::mem::take(&mut *log.lock().unwrap());
    for key in KEYS {
        assert_eq!(
            log.order[key],
            (0..PER_KEY).collect::<Vec<_>>(),
            "key {key} ran in offset order"
        );
    }
    assert_eq!(
        log.most_per_key, 1,
        "a key's records never ran side by side"
    );
    assert!(log.most_overall > 1, "different keys ran side by side");
    transport.close().await;
    topics.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bq_attempts_header_overrides_the_bodys_attempts_as_the_handler_sees_them() {
    const TEST: &str = "kafka_the_bq_attempts_header_overrides_the_body";
    let Some(url) = url_for(TEST) else {
        return;
    };
    let topic = unique("bi-attempts");
    let topics = Topics::create(&url, std::slice::from_ref(&topic), 1).await;
    let transport = transport(&url, &topics.group()).await;

    let raw = producer(&url);
    let higher = envelope(1).with_attempts(0);
    let lower = envelope(2).with_attempts(2);
    let absent = envelope(3).with_attempts(1);
    produce(
        &raw,
        &topic,
        Raw::value(&higher.to_vec()).header("bq-attempts", b"2"),
    )
    .await;
    produce(
        &raw,
        &topic,
        Raw::value(&lower.to_vec()).header("bq-attempts", b"0"),
    )
    .await;
    produce(&raw, &topic, Raw::value(&absent.to_vec())).await;

    let seen = Arc::new(Mutex::new(Vec::new()));
    let consumer = Consumer::builder(
        recording_router(Arc::clone(&seen), false, 5),
        transport.clone(),
        &topic,
    )
    .build()
    .unwrap();
    let counted = Arc::clone(&seen);
    run_until(&consumer, || counted.lock().unwrap().len() >= 3).await;

    let attempts: HashMap<String, u64> = seen.lock().unwrap().iter().cloned().collect();
    assert_eq!(
        attempts[&id_of(&higher)],
        2,
        "the header over a lower body count"
    );
    assert_eq!(
        attempts[&id_of(&lower)],
        0,
        "the header over a higher body count"
    );
    assert_eq!(
        attempts[&id_of(&absent)],
        1,
        "the body's count without the header"
    );
    transport.close().await;
    topics.delete().await;
}

// ---------------------------------------------------------------- offsets

/// Drives the transport by hand: records settle out of order, and every
/// commit the transport makes is checked against the records still
/// unsettled at that moment.
#[tokio::test(flavor = "current_thread")]
async fn the_committed_offset_never_passes_an_unsettled_record() {
    const TEST: &str = "kafka_the_committed_offset_never_passes_an_unsettled_record";
    let Some(url) = url_for(TEST) else {
        return;
    };
    const PARTITIONS: i32 = 2;
    let topic = unique("bi-offsets");
    let topics = Topics::create(&url, std::slice::from_ref(&topic), PARTITIONS).await;
    let group = topics.group();
    let transport = transport(&url, &group).await;
    let raw = producer(&url);
    for n in 0..10 {
        let partition = (n % 2) as i32;
        produce(
            &raw,
            &topic,
            Raw::value(&envelope(n).to_vec()).partition(partition),
        )
        .await;
    }

    let commits = commit_log();
    let of_topic = || -> Vec<(i64, i64)> {
        commits
            .0
            .lock()
            .unwrap()
            .iter()
            .filter(|(t, _, _)| *t == topic)
            .map(|(_, partition, offset)| (*partition, *offset))
            .collect()
    };

    let mut reserved = reserve_exactly(&transport, &topic, 10).await;
    // Settle from the highest offset down, interleaving the partitions: a
    // commit may only come once the lowest record of a partition settles.
    reserved.sort_by_key(|r| std::cmp::Reverse((r.handle.offset(), r.handle.partition())));
    let mut unsettled: Vec<(i32, i64)> = reserved
        .iter()
        .map(|r| (r.handle.partition(), r.handle.offset()))
        .collect();
    // Keep the lowest of partition 0 for last.
    let lowest_p0 = reserved
        .iter()
        .filter(|r| r.handle.partition() == 0)
        .map(|r| r.handle.offset())
        .min()
        .unwrap();
    let (last, rest): (Vec<_>, Vec<_>) = reserved
        .into_iter()
        .partition(|r| r.handle.partition() == 0 && r.handle.offset() == lowest_p0);
    for record in rest.iter().chain(&last) {
        let before = of_topic().len();
        assert!(
            transport
                .settle(&record.handle, &Settlement::Ack)
                .await
                .unwrap()
        );
        unsettled.retain(|at| *at != (record.handle.partition(), record.handle.offset()));
        // The next reserve commits what the settles moved (nothing is left
        // to reserve: it commits and hands out nothing).
        assert!(transport.reserve(&topic, 1).await.unwrap().is_empty());
        for (partition, offset) in of_topic()[before..].iter() {
            let lowest = unsettled
                .iter()
                .filter(|(p, _)| i64::from(*p) == *partition)
                .map(|(_, o)| *o)
                .min();
            if let Some(lowest) = lowest {
                assert!(
                    *offset <= lowest,
                    "commit {partition}@{offset} passes unsettled offset {lowest}"
                );
            }
        }
        if record.handle.partition() == 0 && record.handle.offset() != lowest_p0 {
            assert!(
                of_topic().iter().all(|(p, _)| *p != 0),
                "nothing of partition 0 is committed while its lowest record is unsettled"
            );
        }
    }
    assert_eq!(transport.unsettled(&topic), 0);
    transport.close().await;
    let all_commits = of_topic();
    let mut last_commit = HashMap::new();
    for (partition, offset) in &all_commits {
        last_commit.insert(*partition as i32, *offset);
    }

    let ends = end_offsets(&url, &topic, 10).await;
    assert_eq!(
        last_commit, ends,
        "the last commit of each partition is its end: {all_commits:?}"
    );
    let group_commits = committed(&url, &group, &topic, PARTITIONS).await;
    for (partition, end) in ends {
        assert_eq!(
            group_commits.get(&partition).copied().flatten(),
            Some(end),
            "nothing is left uncommitted on partition {partition}"
        );
    }
    topics.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_settle_write_leaves_the_record_unsettled_and_uncommitted() {
    const TEST: &str = "kafka_a_failed_settle_write_leaves_the_record_unsettled";
    let Some(url) = url_for(TEST) else {
        return;
    };
    let topic = unique("bi-failwrite");
    let topics = Topics::create(&url, std::slice::from_ref(&topic), 1).await;
    let group = topics.group();
    let transport = KafkaTransport::builder()
        .group(&group)
        .delivery_timeout(Duration::from_secs(3))
        .connect(&url)
        .await
        .unwrap();
    produce(&producer(&url), &topic, Raw::value(&envelope(1).to_vec())).await;

    let reserved = reserve_exactly(&transport, &topic, 1).await;
    // A dead-letter queue that does not exist: the write is never confirmed.
    let missing = unique("bi-missing");
    let settlement = Settlement::DeadLetter {
        queue: missing,
        body: reserved[0].body.clone(),
    };
    let error = transport
        .settle(&reserved[0].handle, &settlement)
        .await
        .expect_err("an unconfirmed write fails the settle");
    assert!(
        !matches!(error, TransportError::InvalidQueue { .. }),
        "{error}"
    );
    assert_eq!(transport.unsettled(&topic), 1, "the record stays unsettled");
    transport.close().await;
    let commits = committed(&url, &group, &topic, 1).await;
    assert_eq!(
        commits.get(&0).copied().flatten(),
        None,
        "nothing was committed"
    );
    topics.delete().await;
}

// ---------------------------------------------------------------- rebalance

/// A second worker joins the group: the first gives up its partitions, and
/// settling a record it reserved before settles and writes nothing; the
/// record is consumed again, under the new assignment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handle_from_a_revoked_assignment_settles_nothing_and_writes_nothing() {
    const TEST: &str = "kafka_a_handle_from_a_revoked_assignment_settles_nothing";
    let Some(url) = url_for(TEST) else {
        return;
    };
    let topic = unique("bi-rebalance");
    let dlq = format!("{topic}.dlq");
    let topics = Topics::create(&url, &[topic.clone(), dlq.clone()], 2).await;
    let group = topics.group();
    let first = transport(&url, &group).await;
    let raw = producer(&url);
    for partition in 0..2 {
        produce(
            &raw,
            &topic,
            Raw::value(&envelope(partition as u64).to_vec()).partition(partition),
        )
        .await;
    }
    let before = reserve_exactly(&first, &topic, 2).await;
    let old_generations: BTreeSet<u64> = before.iter().map(|r| r.handle.generation()).collect();

    // Both poll until each holds a record under the new assignment (the
    // first one's records come back to whoever owns their partition now).
    let second = transport(&url, &group).await;
    let mut after = Vec::new();
    tokio::time::timeout(PATIENCE * 2, async {
        loop {
            for worker in [&first, &second] {
                after.extend(worker.reserve(&topic, 10).await.unwrap());
            }
            let fresh = after
                .iter()
                .filter(|r: &&Reserved<KafkaHandle>| {
                    !old_generations.contains(&r.handle.generation())
                })
                .count();
            if fresh >= 2 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the group hands the partitions out again");

    for record in &before {
        let settlement = Settlement::DeadLetter {
            queue: dlq.clone(),
            body: record.body.clone(),
        };
        assert!(
            !first.settle(&record.handle, &settlement).await.unwrap(),
            "a revoked handle settles nothing"
        );
    }
    assert!(
        read_all(&url, &dlq, None, QUIET).await.is_empty(),
        "a revoked handle writes nothing"
    );
    first.close().await;
    second.close().await;
    topics.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_tiers_a_retry_goes_back_to_the_work_topic_with_its_key_and_next_attempt() {
    const TEST: &str = "kafka_without_tiers_a_retry_goes_back_to_the_work_topic";
    let Some(url) = url_for(TEST) else {
        return;
    };
    let topic = unique("bi-requeue");
    let topics = Topics::create(&url, std::slice::from_ref(&topic), 1).await;
    let transport = transport(&url, &topics.group()).await;
    let sent = envelope(1).with_queue(&topic);
    produce(
        &producer(&url),
        &topic,
        Raw::value(&sent.to_vec())
            .key(b"k-1")
            .header("traceparent", b"00-cd"),
    )
    .await;

    // Fails on its first attempt, succeeds on the second.
    let seen = Arc::new(Mutex::new(Vec::new()));
    let router = {
        let seen = Arc::clone(&seen);
        Router::builder()
            .route(
                urn!("urn:babel:interop:created"),
                move |_: Envelope, delivery: Delivery| {
                    seen.lock().unwrap().push(delivery.attempts());
                    let first = delivery.attempts() == 0;
                    async move {
                        if first {
                            return Err(std::io::Error::other("try again"));
                        }
                        Ok(())
                    }
                },
            )
            .build()
            .unwrap()
    };
    let consumer = Consumer::builder(router, transport.clone(), &topic)
        .build()
        .unwrap();
    let counted = Arc::clone(&seen);
    run_until(&consumer, || counted.lock().unwrap().len() >= 2).await;
    assert_eq!(
        *seen.lock().unwrap(),
        vec![0, 1],
        "the copy runs as the next attempt"
    );

    let records = read_all(&url, &topic, Some(2), QUIET).await;
    let copy = &records[1];
    assert_eq!(copy.key.as_deref(), Some(&b"k-1"[..]), "the key is kept");
    assert_eq!(copy.header("bq-attempts").as_deref(), Some("1"));
    assert_eq!(copy.header("traceparent").as_deref(), Some("00-cd"));
    assert_eq!(copy.header("bq-delay"), None);
    transport.close().await;
    let commits = committed(&url, transport.group(), &topic, 1).await;
    assert_eq!(
        commits.get(&0).copied().flatten(),
        Some(2),
        "both records are committed"
    );
    topics.delete().await;
}

// ---------------------------------------------------------------- Python SDK

/// The Python peer of these tests: `tests/python/kafka_peer.py`.
const PEER: &str = "kafka_peer.py";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_publishes_and_a_babel_idem_consumer_runs_each_once_with_its_headers() {
    const TEST: &str = "kafka_python_publishes_and_babel_idem_consumes";
    let (Some(url), Some(python)) = (url_for(TEST), python(TEST)) else {
        return;
    };
    let topic = unique("bi-py-in");
    let topics = Topics::create(&url, std::slice::from_ref(&topic), 2).await;
    let transport = transport(&url, &topics.group()).await;
    let sent = peer(
        &python,
        PEER,
        vec!["publish".into(), url.clone(), topic.clone(), "12".into()],
        None,
    )
    .await;
    let sent: BTreeSet<String> = sent
        .as_array()
        .unwrap()
        .iter()
        .map(|message| message["id"].as_str().unwrap().to_owned())
        .collect();

    let headers = Arc::new(Mutex::new(Vec::new()));
    let router = {
        let headers = Arc::clone(&headers);
        Router::builder()
            .route(
                urn!("urn:babel:interop:created"),
                move |env: Envelope, delivery: Delivery| {
                    let job = delivery
                        .headers()
                        .find(|(name, _)| *name == "bq-job")
                        .map(|(_, value)| value.to_owned());
                    let id = env.meta.id.clone().unwrap_or_default();
                    headers.lock().unwrap().push((id, job, delivery.attempts()));
                    async { Ok::<(), std::io::Error>(()) }
                },
            )
            .build()
            .unwrap()
    };
    let consumer = Consumer::builder(router, transport.clone(), &topic)
        .concurrency(4)
        .build()
        .unwrap();
    let counted = Arc::clone(&headers);
    run_until(&consumer, || counted.lock().unwrap().len() >= sent.len()).await;

    let seen = std::mem::take(&mut *headers.lock().unwrap());
    assert_eq!(seen.len(), sent.len(), "each ran once: {seen:?}");
    assert_eq!(
        seen.iter()
            .map(|(id, _, _)| id.clone())
            .collect::<BTreeSet<_>>(),
        sent
    );
    for (_, job, attempts) in &seen {
        assert_eq!(
            job.as_deref(),
            Some(URN),
            "the SDK's bq-job reaches the handler"
        );
        assert_eq!(*attempts, 0);
    }
    transport.close().await;
    topics.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn babel_idem_publishes_and_the_python_sdk_pops_each_body_as_written() {
    const TEST: &str = "kafka_babel_idem_publishes_and_python_pops";
    let (Some(url), Some(python)) = (url_for(TEST), python(TEST)) else {
        return;
    };
    let topic = unique("bi-py-out");
    let topics = Topics::create(&url, std::slice::from_ref(&topic), 1).await;
    let transport = transport(&url, &topics.group()).await;
    let bodies: Vec<Vec<u8>> = (0..5)
        .map(|n| {
            Envelope::new(URN, json!({ "n": n, "text": "héllo \u{2028} \"q\"" }))
                .with_queue(&topic)
                .to_vec()
        })
        .collect();
    for body in &bodies {
        transport.publish_body(&topic, body, &[]).await.unwrap();
    }

    let group = topics.group();
    let popped = peer(
        &python,
        PEER,
        vec![
            "pop".into(),
            url.clone(),
            topic.clone(),
            group,
            bodies.len().to_string(),
        ],
        None,
    )
    .await;
    let popped: Vec<String> = popped["bodies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|body| body.as_str().unwrap().to_owned())
        .collect();
    let written: Vec<String> = bodies
        .iter()
        .map(|body| String::from_utf8(body.clone()).unwrap())
        .collect();
    assert_eq!(
        popped, written,
        "the SDK pops each body as written, in order"
    );
    topics.delete().await;
}
