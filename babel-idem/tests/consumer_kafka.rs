//! `Consumer` + `KafkaTransport` against a real Kafka-protocol broker, with
//! the BabelQueue Python SDK (pinned by `.ci/python.sh`, `kafka` extra:
//! confluent-kafka, the same librdkafka) as the peer producer and poison
//! record writer.
//!
//! Environment: `BABEL_IDEM_KAFKA_URL` (the shared broker),
//! `BABEL_IDEM_PYTHON` (the peer's virtualenv python),
//! `BABEL_IDEM_REDIS_URL` for the effects; without them a test prints
//! `skipped:`, and with `BABEL_IDEM_REQUIRE_SERVERS=1` it fails instead.
//! Every test makes topics and a consumer group of its own (unique names);
//! the topics are deleted when it ends. The outage test stops a Redis of its
//! own, never the shared one.
#![cfg(all(feature = "kafka-transport", feature = "redis", feature = "sqlite"))]

mod consumer_support;
mod store_contract;
mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use babel_idem::broker::Publisher;
use babel_idem::store::RedisStore;
use babel_idem::transport::KafkaTransport;
use babel_idem::transport::kafka::{Reinjector, RetryTiers};
use babel_idem::{Consumer, Delivery, Envelope, InMemoryStore, Router, run_once, urn};
use consumer_support::{
    QUIET, assert_poison_records_as_python_writes, effect_router, envelope_with_id, eventually,
    peer, python, run_until_idle,
};
use redis::AsyncCommands;
use serde_json::json;
use store_contract::servers::{REDIS_URL, server_url};
use store_contract::spawned::OwnRedis;
use support::kafka::{ONE_RECORD_PER_BATCH, Read, WorkTopic as Topic, kafka_url};

/// The Python peer of these tests: `tests/python/kafka_peer.py`.
const PEER: &str = "kafka_peer.py";

/// The broker, or `None` after a `skipped:` line.
fn broker(test: &str) -> Option<String> {
    kafka_url(test)
}

/// A transport in a consumer group of `topic`'s own (deleted with it).
async fn transport(url: &str, topic: &Topic, tiers: RetryTiers) -> (KafkaTransport, String) {
    let group = topic.group();
    let transport = KafkaTransport::builder()
        .group(&group)
        .retry_tiers(tiers)
        .client_setting(ONE_RECORD_PER_BATCH.0, ONE_RECORD_PER_BATCH.1)
        .connect(url)
        .await
        .expect("connect the transport");
    (transport, group)
}

/// Checks that `group` committed every partition of `topic` to its end.
async fn assert_all_committed(topic: &Topic, group: &str) {
    if let Err(behind) = topic.all_committed(group).await {
        panic!("not everything is committed: {behind}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_body_gets_the_same_value_headers_and_timestamp_from_python_and_babel_idem() {
    let test = "the_same_body_gets_the_same_value_headers_and_timestamp_from_python_and_babel_idem";
    let (Some(url), Some(python)) = (broker(test), python(test)) else {
        return;
    };
    let ours = Topic::new(&url, 1, 0).await;
    let theirs = Topic::new(&url, 1, 0).await;
    let bodies: Vec<String> = (0..5)
        .map(|n| {
            let mut envelope = envelope_with_id(&format!("same-{n}"), &ours.name, n);
            envelope.attempts = n;
            String::from_utf8(envelope.to_vec()).unwrap()
        })
        .chain([
            // A foreign producer's attempts that is no count: no bq-attempts.
            r#"{"job":"urn:babel:interop:created","trace_id":"t","data":{},"attempts":"x","meta":{"id":"f-1","schema_version":1,"created_at":1796000000000}}"#.to_owned(),
        ])
        .collect();
    let (transport, _) = transport(&url, &ours, RetryTiers::none()).await;
    for body in &bodies {
        transport
            .publish_body(&ours.name, body.as_bytes(), &[])
            .await
            .unwrap();
    }
    peer(
        &python,
        PEER,
        vec!["publish-body".into(), url.clone(), theirs.name.clone()],
        Some(json!({ "bodies": bodies })),
    )
    .await;
    let ours = ours.records(&ours.name).await;
    let theirs = theirs.records(&theirs.name).await;
    assert_eq!(ours.len(), bodies.len());
    assert_eq!(theirs.len(), bodies.len());
    for (ours, theirs) in ours.iter().zip(&theirs) {
        assert_eq!(
            ours.value, theirs.value,
            "the value is the body byte for byte"
        );
        assert_eq!(
            ours.headers, theirs.headers,
            "the same headers, in the same order"
        );
        assert_eq!(
            ours.timestamp, theirs.timestamp,
            "the timestamp is meta.created_at"
        );
        assert_eq!((&ours.key, &theirs.key), (&None, &None));
    }
}

/// A router whose handler fails the first attempt of every id and succeeds
/// the second; what each run saw (`id`, `Delivery::attempts`).
fn fails_once_router(runs: Arc<Mutex<Vec<(String, u64)>>>) -> Router {
    Router::builder()
        .route(
            urn!("urn:babel:interop:created"),
            move |env: Envelope, delivery: Delivery| {
                let attempts = delivery.attempts();
                runs.lock()
                    .unwrap()
                    .push((env.meta.id.clone().unwrap_or_default(), attempts));
                async move {
                    if attempts == 0 {
                        return Err(std::io::Error::other("the first attempt fails"));
                    }
                    Ok(())
                }
            },
        )
        .max_attempts(3)
        .build()
        .unwrap()
}

/// The whole retry path on one broker: the consumer parks a failed
/// delivery on its tier topic (key, `bq-delay`, `bq-original-topic`,
/// `bq-attempts` = 1), the re-injector writes it back to the work topic once
/// due (value and key byte for byte, the tier headers gone), and the
/// consumer runs it again with the attempts counted from `bq-attempts`.
/// (The tier records cross with the Python SDK's re-injector in
/// `kafka_reinject.rs`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_waits_on_its_tier_topic_and_the_reinjector_brings_it_back() {
    let test = "a_retry_waits_on_its_tier_topic_and_the_reinjector_brings_it_back";
    let Some(url) = broker(test) else {
        return;
    };
    let topic = Topic::new(&url, 1, 1).await;
    let tiers = RetryTiers::new([Duration::from_millis(500)]).unwrap();
    let (transport, group) = transport(&url, &topic, tiers).await;
    for n in 0..5 {
        let key = format!("key-{n}");
        let body = envelope_with_id(&format!("retried-{n}"), &topic.name, n).to_vec();
        topic
            .produce(&topic.name, Some(key.as_bytes()), &body, &[])
            .await;
    }
    let mut reinjector = Reinjector::builder()
        .topic(&topic.name)
        .group(topic.group())
        .poll_interval(Duration::from_millis(100))
        .build(&transport)
        .unwrap();
    let runs = Arc::new(Mutex::new(Vec::new()));
    let consumer = Consumer::builder(fails_once_router(Arc::clone(&runs)), transport, &topic.name)
        .concurrency(4)
        .build()
        .unwrap();
    let all_ran_twice = eventually("every id ran its second attempt", || async {
        runs.lock().unwrap().iter().filter(|(_, a)| *a == 1).count() == 5
    });
    let reinjecting = async {
        let mut written = 0;
        while written < 5 {
            written += reinjector.run_once().await.expect("the re-injector runs");
        }
        written
    };
    let (report, written) = tokio::join!(consumer.run_until(all_ran_twice), reinjecting);
    assert_eq!(report.retried, 5, "{report:?}");
    assert_eq!(written, 5);

    let parked = topic.records(&topic.tier(1)).await;
    assert_eq!(parked.len(), 5);
    for record in &parked {
        assert_eq!(record.header("bq-delay").as_deref(), Some("500"));
        assert_eq!(record.header("bq-original-topic"), Some(topic.name.clone()));
        assert_eq!(record.header("bq-attempts").as_deref(), Some("1"));
        let id = record.header("bq-message-id").unwrap();
        let n = id.trim_start_matches("retried-");
        assert_eq!(
            record.key.as_deref(),
            Some(format!("key-{n}").as_bytes()),
            "the key is kept"
        );
    }
    // Back on the work topic: the same value and key, without the tier headers.
    let work = topic.records(&topic.name).await;
    let back: Vec<&Read> = work.iter().filter(|r| r.offset >= 5).collect();
    assert_eq!(back.len(), 5);
    for record in back {
        assert!(record.header("bq-delay").is_none());
        assert!(record.header("bq-original-topic").is_none());
        let parked = parked.iter().find(|p| p.value == record.value).unwrap();
        assert_eq!(parked.key, record.key);
    }
    let runs = runs.lock().unwrap().clone();
    assert_eq!(runs.len(), 10, "{runs:?}");
    consumer.transport().close().await;
    assert_all_committed(&topic, &group).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_record_among_1000_is_dead_lettered_as_python_writes_it_and_the_rest_run() {
    let test = "a_poison_record_among_1000_is_dead_lettered_as_python_writes_it_and_the_rest_run";
    let (Some(url), Some(python)) = (broker(test), python(test)) else {
        return;
    };
    let topic = Topic::new(&url, 3, 0).await;
    let poison = b"{\"job\": \"urn:babel:interop:created\", \"data\": [not json".to_vec();
    let records: Vec<(Vec<u8>, Vec<u8>)> = (0..1000u64)
        .map(|n| {
            let key = format!("key-{}", n % 7).into_bytes();
            if n == 500 {
                return (key, poison.clone());
            }
            (
                key,
                envelope_with_id(&format!("bulk-{n}"), &topic.name, n).to_vec(),
            )
        })
        .collect();
    topic.produce_many(&records).await;
    let (transport, group) = transport(&url, &topic, RetryTiers::none()).await;
    let store = Arc::new(InMemoryStore::new());
    let effects = Arc::new(Mutex::new(HashMap::<String, u32>::new()));
    let router = {
        let effects = Arc::clone(&effects);
        Router::builder()
            .route(urn!("urn:babel:interop:created"), move |env: Envelope| {
                let (store, effects) = (Arc::clone(&store), Arc::clone(&effects));
                async move {
                    run_once(&*store, &env, async {
                        let id = env.meta.id.clone().unwrap_or_default();
                        *effects.lock().unwrap().entry(id).or_default() += 1;
                        Ok::<(), babel_idem::StoreError>(())
                    })
                    .await
                }
            })
            .build()
            .unwrap()
    };
    let consumer = Consumer::builder(router, transport, &topic.name)
        .concurrency(8)
        .build()
        .unwrap();
    let report = run_until_idle(&consumer, QUIET).await;
    assert_eq!(report.dead_lettered, 1, "{report:?}");
    let effects = effects.lock().unwrap().clone();
    assert_eq!(effects.len(), 999);
    assert!(effects.values().all(|runs| *runs == 1));

    let dead = topic.records(&topic.dlq()).await;
    assert_eq!(dead.len(), 1);
    assert_eq!(
        dead[0].key.as_deref(),
        Some(&b"key-3"[..]),
        "the key is kept"
    );
    assert_poison_records_as_python_writes(
        &python,
        PEER,
        &topic.name,
        &[poison],
        &[dead[0].value.clone()],
    )
    .await;
    consumer.transport().close().await;
    assert_all_committed(&topic, &group).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_down_for_10_s_under_load_dead_letters_nothing_and_skips_nothing() {
    let test = "the_store_down_for_10_s_under_load_dead_letters_nothing_and_skips_nothing";
    let (Some(url), Some(effects_url)) = (broker(test), server_url(REDIS_URL, test)) else {
        return;
    };
    let Some(mut store_server) = OwnRedis::reserve(test) else {
        return;
    };
    store_server.start();
    let topic = Topic::new(&url, 3, 0).await;
    let ids: Vec<String> = (0..600).map(|n| format!("outage-{n}")).collect();
    let records: Vec<(Vec<u8>, Vec<u8>)> = ids
        .iter()
        .enumerate()
        .map(|(n, id)| {
            let key = format!("key-{}", n % 11).into_bytes();
            (key, envelope_with_id(id, &topic.name, n as u64).to_vec())
        })
        .collect();
    topic.produce_many(&records).await;
    let store = RedisStore::builder()
        .prefix(format!("{}:seen:", topic.name))
        .connect_lazy(&store_server.url())
        .unwrap();
    let effects = format!("{}:effects", topic.name);
    let (transport, group) = transport(&url, &topic, RetryTiers::none()).await;
    let consumer = Consumer::builder(
        effect_router(store, &effects_url, effects.clone()),
        transport,
        &topic.name,
    )
    .concurrency(8)
    .build()
    .unwrap();
    let client = redis::Client::open(effects_url.as_str()).unwrap();
    let counts = || async {
        let mut connection = client.get_multiplexed_async_connection().await.unwrap();
        connection
            .hgetall::<_, HashMap<String, i64>>(&effects)
            .await
            .unwrap()
    };
    let outage = async {
        eventually("a first 100 effects", || async {
            counts().await.len() >= 100
        })
        .await;
        store_server.kill();
        tokio::time::sleep(Duration::from_secs(10)).await;
        store_server.start();
        eventually("every id ran", || async {
            counts().await.len() == ids.len()
        })
        .await;
    };
    let report = consumer.run_until(outage).await;
    // What was given back during the outage went to the end of the topic:
    // drained too before the counts.
    let drained = run_until_idle(&consumer, QUIET).await;
    let counts = counts().await;
    assert_eq!(
        report.dead_lettered + drained.dead_lettered,
        0,
        "{report:?} {drained:?}"
    );
    assert!(
        report.store_unavailable > 0,
        "the outage was seen: {report:?}"
    );
    // Nothing skipped: every id had its effect; twice at most for a run the
    // kill cut between its effect and its mark (one a handler slot).
    assert!(ids.iter().all(|id| counts.get(id).is_some_and(|n| *n >= 1)));
    let twice = counts.values().filter(|n| **n > 1).count();
    assert!(twice <= 8, "{twice} ids ran twice");
    assert!(topic.records(&topic.dlq()).await.is_empty());
    let _: () = redis::cmd("DEL")
        .arg(&effects)
        .query_async(&mut client.get_multiplexed_async_connection().await.unwrap())
        .await
        .unwrap();
    consumer.transport().close().await;
    assert_all_committed(&topic, &group).await;
}

// ---------------------------------------------------------------- redrive interop

/// Dead letters cross between this crate and the Python SDK both ways on a
/// real topic: what one side dead-letters the other redrives, and both
/// redrives write the same record.
#[cfg(feature = "redrive")]
mod redrive_interop {
    use std::path::Path;

    use babel_idem::redrive::{Redrive, RedriveOptions};
    use serde_json::Value;

    use super::*;
    use crate::support::kafka::{Raw, produce, producer};

    /// A router whose handler fails every run, with one attempt allowed:
    /// every delivery is dead-lettered at once.
    fn always_fails_router() -> Router {
        Router::builder()
            .route(urn!("urn:babel:interop:created"), |_env: Envelope| async {
                Err::<(), _>(std::io::Error::other("the handler fails on purpose"))
            })
            .max_attempts(1)
            .build()
            .unwrap()
    }

    /// Writes `records` to `to` as they are (value, key, headers): a copy of
    /// dead letters for the other side's redrive to read.
    async fn copy_to(url: &str, to: &str, records: &[Read]) {
        let producer = producer(url);
        for record in records {
            let raw = Raw {
                key: record.key.as_deref(),
                value: &record.value,
                headers: record
                    .headers
                    .iter()
                    .map(|(name, value)| (name.as_str(), value.as_deref()))
                    .collect(),
                ..Raw::default()
            };
            produce(&producer, to, raw).await;
        }
    }

    /// Redrives `dlq` with this crate's `Redrive` over a `KafkaTransport` of
    /// `topic`'s own group; how many records it moved.
    async fn ours_redrives(url: &str, topic: &Topic, dlq: &str) -> usize {
        let (transport, _) = transport(url, topic, RetryTiers::none()).await;
        let report = transport
            .redrive(dlq, &RedriveOptions::new())
            .await
            .expect("the redrive runs");
        transport.close().await;
        report.moved
    }

    /// Redrives `dlq` with the Python SDK's `redrive` (kafka_peer.py) in a
    /// group of `topic`'s own; how many records it moved.
    async fn python_redrives(python: &Path, url: &str, topic: &Topic, dlq: &str) -> u64 {
        let out = peer(
            python,
            PEER,
            vec![
                "redrive".into(),
                url.to_owned(),
                dlq.to_owned(),
                "--group".into(),
                topic.group(),
                // The first pop joins the group: longer than the peer's
                // default wait on this broker.
                "--timeout".into(),
                "10".into(),
            ],
            None,
        )
        .await;
        out["redriven"].as_u64().unwrap_or_else(|| panic!("{out}"))
    }

    fn body(record: &Read) -> Value {
        serde_json::from_slice(&record.value).expect("a JSON envelope")
    }

    /// Checks that `redriven` is `dead` reset: the same id and key, no
    /// `dead_letter` block, attempts 0.
    fn assert_reset(dead: &Read, redriven: &Read) {
        let (dead_body, redriven_body) = (body(dead), body(redriven));
        assert!(dead_body.get("dead_letter").is_some(), "{dead_body}");
        assert!(
            redriven_body.get("dead_letter").is_none(),
            "{redriven_body}"
        );
        assert_eq!(redriven_body["attempts"], 0, "{redriven_body}");
        assert_eq!(redriven_body["meta"]["id"], dead_body["meta"]["id"]);
        assert_eq!(redriven.key, dead.key, "the key is kept");
    }

    /// Checks that two redriven records are the same record: value and
    /// key byte for byte, and the same headers in the same order.
    fn assert_same_record(ours: &Read, theirs: &Read) {
        assert_eq!(
            String::from_utf8_lossy(&ours.value),
            String::from_utf8_lossy(&theirs.value),
            "the value is the same byte for byte"
        );
        assert_eq!(ours.key, theirs.key, "the same key");
        assert_eq!(ours.headers, theirs.headers, "the same headers, in order");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dead_letter_of_ours_is_redriven_by_python_as_our_redrive_writes_it() {
        let test = "a_dead_letter_of_ours_is_redriven_by_python_as_our_redrive_writes_it";
        let (Some(url), Some(python)) = (broker(test), python(test)) else {
            return;
        };
        let topic = Topic::new(&url, 1, 0).await;
        let copy = Topic::new(&url, 1, 0).await;
        for n in 0..2 {
            let key = format!("customer-{n}");
            let body = envelope_with_id(&format!("ours-dead-{n}"), &topic.name, n).to_vec();
            topic
                .produce(&topic.name, Some(key.as_bytes()), &body, &[])
                .await;
        }
        let (transport, group) = transport(&url, &topic, RetryTiers::none()).await;
        let consumer = Consumer::builder(always_fails_router(), transport, &topic.name)
            .build()
            .unwrap();
        let report = run_until_idle(&consumer, QUIET).await;
        assert_eq!(report.dead_lettered, 2, "{report:?}");
        consumer.transport().close().await;
        assert_all_committed(&topic, &group).await;
        let dead = topic.records(&topic.dlq()).await;
        assert_eq!(dead.len(), 2);
        copy_to(&url, &copy.dlq(), &dead).await;

        // Python first: both land on the work topic after the two originals.
        assert_eq!(
            python_redrives(&python, &url, &topic, &topic.dlq()).await,
            2
        );
        let work = topic.records(&topic.name).await;
        assert_eq!(work.len(), 4);
        let theirs = work[2..].to_vec();
        for (dead, redriven) in dead.iter().zip(&theirs) {
            assert_reset(dead, redriven);
        }

        // Ours, from the copy, to the same work topic (the dead letters'
        // original queue), after Python's.
        assert_eq!(ours_redrives(&url, &copy, &copy.dlq()).await, 2);
        let work = topic.records(&topic.name).await;
        assert_eq!(work.len(), 6);
        for (ours, theirs) in work[4..].iter().zip(&theirs) {
            assert_same_record(ours, theirs);
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dead_letter_of_python_is_redriven_by_ours_as_python_redrive_writes_it() {
        let test = "a_dead_letter_of_python_is_redriven_by_ours_as_python_redrive_writes_it";
        let (Some(url), Some(python)) = (broker(test), python(test)) else {
            return;
        };
        let topic = Topic::new(&url, 1, 0).await;
        let copy = Topic::new(&url, 1, 0).await;
        for n in 0..2 {
            let key = format!("customer-{n}");
            let body = envelope_with_id(&format!("python-dead-{n}"), &topic.name, n).to_vec();
            topic
                .produce(&topic.name, Some(key.as_bytes()), &body, &[])
                .await;
        }
        // The SDK's worker fails every run, with one attempt allowed: its
        // Kafka transport retries only through tiers, so without them a
        // failure is dead-lettered at once (as ours with `max_attempts(1)`).
        let out = peer(
            &python,
            PEER,
            vec![
                "consume".into(),
                url.clone(),
                topic.name.clone(),
                "5".into(),
                "--group".into(),
                topic.group(),
                "--fail".into(),
                "1".into(),
                "--max-attempts".into(),
                "1".into(),
            ],
            None,
        )
        .await;
        assert!(out["received"].as_array().unwrap().is_empty(), "{out}");
        let dead = topic.records(&topic.dlq()).await;
        assert_eq!(dead.len(), 2, "Python dead-lettered both: {out}");
        for (n, record) in dead.iter().enumerate() {
            let body = body(record);
            assert_eq!(body["dead_letter"]["reason"], "failed", "{body}");
            assert_eq!(body["meta"]["id"], format!("python-dead-{n}"));
        }
        copy_to(&url, &copy.dlq(), &dead).await;
        let before = topic.records(&topic.name).await.len();

        // Ours first, then Python's from the copy, to the same work topic.
        assert_eq!(ours_redrives(&url, &topic, &topic.dlq()).await, 2);
        let work = topic.records(&topic.name).await;
        assert_eq!(work.len(), before + 2);
        let ours = work[before..].to_vec();
        for (dead, redriven) in dead.iter().zip(&ours) {
            assert_reset(dead, redriven);
        }
        assert_eq!(python_redrives(&python, &url, &copy, &copy.dlq()).await, 2);
        let work = topic.records(&topic.name).await;
        assert_eq!(work.len(), before + 4);
        for (ours, theirs) in ours.iter().zip(&work[before + 2..]) {
            assert_same_record(ours, theirs);
        }
    }
}
