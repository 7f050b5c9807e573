//! `Consumer` + `RedisTransport` against a real Redis, with the BabelQueue
//! Python SDK (pinned by `.ci/python.sh`) as the peer producer, consumer and
//! dead-letter reader.
//!
//! Environment: `BABEL_IDEM_REDIS_URL` (the shared server), `BABEL_IDEM_PYTHON`
//! (the peer's virtualenv python); without them a test prints `skipped:`, and
//! with `BABEL_IDEM_REQUIRE_SERVERS=1` it fails instead. The crash and restart
//! tests start servers and processes of their own.
#![cfg(all(feature = "redis-transport", feature = "redis", feature = "sqlite"))]

mod consumer_support;
mod store_contract;

use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use babel_idem::consumer::ConsumerError;
use babel_idem::envelope::DeadLetter;
use babel_idem::router::Backoff;
use babel_idem::store::{RedisStore, SqliteStore};
use babel_idem::transport::{RedisTransport, Settlement, Transport};
use babel_idem::{Consumer, Delivery, Envelope, Router, run_once, urn};
use redis::AsyncCommands;
use serde_json::{Value, json};
use store_contract::servers::{REDIS_URL, server_url, unique_suffix};
use store_contract::spawned::OwnRedis;

use consumer_support::redis_queue::{Queue, publish_numbered};
use consumer_support::{
    PATIENCE, QUIET, SeenLog, SharedSeenSet, URN, assert_cannot_connect, assert_invalid_url,
    assert_poison_records_as_python_writes, assert_queue_names_refused, closed_port, effect_router,
    envelope_with_id, eventually, python, python_consumes, python_publishes, python_received,
    recording_router, run_until_idle, seen_as_python_sent,
};

/// The Python peer of these tests: `tests/python/consumer_peer.py`.
const PEER: &str = "consumer_peer.py";

/// Runs one subcommand of the Python peer; its JSON answer.
async fn peer(python: &Path, args: Vec<String>, stdin: Option<Value>) -> Value {
    consumer_support::peer(python, PEER, args, stdin).await
}

// ---------------------------------------------------------------- fixtures

/// A transport whose reservations lapse after `seconds`.
async fn lapsing_transport(url: &str, seconds: u64) -> RedisTransport {
    RedisTransport::builder()
        .retry_after(Duration::from_secs(seconds))
        .connect(url)
        .await
        .unwrap()
}

async fn effect_counts(queue: &Queue, effects: &str) -> HashMap<String, i64> {
    queue.raw().await.hgetall(effects).await.unwrap()
}

// ---------------------------------------------------------------- interop

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_publishes_and_babel_idem_consumes_ids_urns_data_and_headers() {
    const TEST: &str = "python_publishes_and_babel_idem_consumes";
    let (Some(url), Some(python)) = (server_url(REDIS_URL, TEST), python(TEST)) else {
        return;
    };
    let queue = Queue::new(&url);
    let sent = python_publishes(&python, PEER, &url, &queue.name, 25).await;

    let log = SeenLog::default();
    let consumer = Consumer::builder(
        recording_router(Arc::clone(&log), false),
        queue.transport().await,
        &queue.name,
    )
    .concurrency(8)
    .build()
    .unwrap();
    let report = run_until_idle(&consumer, QUIET).await;

    assert_eq!(report.acked, 25, "{report:?}");
    seen_as_python_sent(&sent, &log.lock().unwrap());
    assert!(queue.drained().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn babel_idem_publishes_and_python_consumes_with_headers_and_the_replay_marker() {
    const TEST: &str = "babel_idem_publishes_and_python_consumes";
    let (Some(url), Some(python)) = (server_url(REDIS_URL, TEST), python(TEST)) else {
        return;
    };
    let queue = Queue::new(&url);
    let transport = queue.transport().await;
    let mut sent = Vec::new();
    for n in 0..20 {
        let envelope = Envelope::new(URN, json!({"n": n, "text": "héllo \u{2028} \"q\""}))
            .with_queue(&queue.name);
        transport
            .publish(&queue.name, &envelope.to_vec())
            .await
            .unwrap();
        sent.push(envelope);
    }
    let replayed = Envelope::new(URN, json!({"n": 99})).with_queue(&queue.name);
    let body = String::from_utf8(replayed.to_vec()).unwrap();
    let headers = [
        ("bq-replay-bypass".to_owned(), "1".to_owned()),
        ("traceparent".to_owned(), "00-ab".to_owned()),
    ];
    transport
        .publish_with_headers(&queue.name, &body, &headers)
        .await
        .unwrap();
    sent.push(replayed);

    let out = python_consumes(&python, PEER, &url, &queue.name).await;
    let by_id = python_received(&out, &sent.iter().collect::<Vec<_>>());
    let framed = by_id[sent.last().unwrap().meta.id.as_deref().unwrap()];
    assert_eq!(framed["replay"], true);
    assert_eq!(
        framed["headers"],
        json!({"bq-replay-bypass": "1", "traceparent": "00-ab"})
    );
    assert!(queue.drained().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_marker_reaches_the_handler_as_is_replay() {
    const TEST: &str = "a_replay_marker_reaches_the_handler";
    let Some(url) = server_url(REDIS_URL, TEST) else {
        return;
    };
    let queue = Queue::new(&url);
    let transport = queue.transport().await;
    let plain = Envelope::new(URN, json!({"n": 1}));
    let replay = Envelope::new(URN, json!({"n": 2}));
    transport
        .publish(&queue.name, &plain.to_vec())
        .await
        .unwrap();
    let body = String::from_utf8(replay.to_vec()).unwrap();
    transport
        .publish_with_headers(
            &queue.name,
            &body,
            &[("bq-replay-bypass".into(), "yes".into())],
        )
        .await
        .unwrap();

    let log = SeenLog::default();
    let consumer = Consumer::builder(
        recording_router(Arc::clone(&log), false),
        transport,
        &queue.name,
    )
    .build()
    .unwrap();
    run_until_idle(&consumer, QUIET).await;
    let seen = log.lock().unwrap().clone();
    let replay_of = |id: &Option<String>| {
        seen.iter()
            .find(|s| Some(&s.id) == id.as_ref())
            .unwrap()
            .replay
    };
    assert!(!replay_of(&plain.meta.id));
    assert!(replay_of(&replay.meta.id));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_is_read_back_by_pythons_dead_letter_helpers() {
    const TEST: &str = "a_dead_letter_is_read_back_by_python";
    let (Some(url), Some(python)) = (server_url(REDIS_URL, TEST), python(TEST)) else {
        return;
    };
    let queue = Queue::new(&url);
    let transport = queue.transport().await;
    let mut ids = Vec::new();
    for n in 0..3 {
        let envelope = Envelope::new(URN, json!({"n": n})).with_queue(&queue.name);
        ids.push(envelope.meta.id.clone().unwrap());
        transport
            .publish(&queue.name, &envelope.to_vec())
            .await
            .unwrap();
    }
    let attempts_seen = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&attempts_seen);
    let router = Router::builder()
        .route(
            urn!("urn:babel:interop:created"),
            move |_: Envelope, delivery: Delivery| {
                seen.lock().unwrap().push(delivery.attempts());
                async { Err::<(), _>(std::io::Error::other("payment gateway timeout")) }
            },
        )
        .max_attempts(3)
        .build()
        .unwrap();
    let consumer = Consumer::builder(router, transport, &queue.name)
        .build()
        .unwrap();
    let report = run_until_idle(&consumer, QUIET).await;
    assert_eq!((report.retried, report.dead_lettered), (6, 3), "{report:?}");
    let mut attempts = attempts_seen.lock().unwrap().clone();
    attempts.sort_unstable();
    assert_eq!(attempts, [0, 0, 0, 1, 1, 1, 2, 2, 2]);

    let out = peer(&python, vec!["dlq".into(), url.clone(), queue.dlq()], None).await;
    let items = out["items"].as_array().unwrap();
    assert_eq!(items.len(), 3, "{out}");
    for item in items {
        assert!(ids.contains(&item["message_id"].as_str().unwrap().to_owned()));
        assert_eq!(item["reason"], "failed");
        assert_eq!(item["urn"], URN);
        assert_eq!(item["to"], queue.name.as_str());
    }
    for record in out["records"].as_array().unwrap() {
        let block = &record["dead_letter"];
        assert_eq!(block["reason"], "failed");
        assert_eq!(block["error"], "payment gateway timeout");
        assert_eq!(block["original_queue"], queue.name.as_str());
        assert_eq!(block["attempts"], 3);
        assert_eq!(block["lang"], "rust");
        assert!(block["exception"].as_str().is_some_and(|e| !e.is_empty()));
        assert!(
            block["failed_at"]
                .as_u64()
                .is_some_and(|t| t > 1_700_000_000_000)
        );
    }
    // The dry run put every record back.
    assert_eq!(out["left"], 3);
    assert!(queue.drained().await);
}

/// Bodies no envelope can be made of. Each ends in the DLQ as the Python SDK
/// writes a poison record, byte for byte, and the worker keeps going.
fn poison_bodies(queue: &str) -> Vec<Vec<u8>> {
    let envelope = |attempts: &str| {
        format!(
            r#"{{"job":"{URN}","trace_id":"t-1","data":{{}},"meta":{{"id":"p-1","queue":"{queue}","lang":"go","schema_version":1,"created_at":0}},"attempts":{attempts}}}"#
        )
        .into_bytes()
    };
    vec![
        b"not json at all".to_vec(),
        b"\xff\xfe{\"job\": \"urn:babel:interop:created\"}".to_vec(),
        b"[1, 2, 3]".to_vec(),
        b"\"a JSON string\"".to_vec(),
        b"  { }  ".to_vec(),
        envelope("\"two\""),
        envelope("-1"),
        br#"{"job":"urn:babel:interop:created","big":1e400,"nested":{"a":[1,2,{"b":null}]}}"#
            .to_vec(),
        br#"{"job":"urn:babel:interop:created","dead_letter":{"reason":"failed"}}"#.to_vec(),
        "{\"job\":\"urn:babel:x:y\",\"text\":\"caf\u{e9} \\ud83d\\ude00\"}"
            .as_bytes()
            .to_vec(),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_claim_goes_back_unchanged_and_runs_once_its_holder_gives_up() {
    const TEST: &str = "redis_a_parked_claim_goes_back_unchanged";
    let Some(url) = server_url(REDIS_URL, TEST) else {
        return;
    };
    let queue = Queue::new(&url);
    let transport = queue.transport().await;
    let id = format!("parked-{}", unique_suffix());
    let body = String::from_utf8(envelope_with_id(&id, &queue.name, 0).to_vec()).unwrap();
    transport
        .publish_with_headers(
            &queue.name,
            &body,
            &[("traceparent".into(), "00-parked".into())],
        )
        .await
        .unwrap();
    consumer_support::a_parked_delivery_goes_back_unchanged_and_runs_once_freed(
        transport,
        &queue.name,
        &id,
    )
    .await;
    assert!(queue.drained().await);
    assert_eq!(queue.len(&queue.dlq()).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_read_ahead_waits_for_the_handler_slot_in_order() {
    const TEST: &str = "redis_a_delivery_read_ahead_waits";
    let Some(url) = server_url(REDIS_URL, TEST) else {
        return;
    };
    let queue = Queue::new(&url);
    let transport = queue.transport().await;
    let publisher = transport.clone();
    consumer_support::a_delivery_read_ahead_waits_for_the_handler_slot_in_order(
        transport,
        &queue.name,
        4,
        |bodies| {
            let (publisher, name) = (publisher.clone(), queue.name.clone());
            async move {
                for body in bodies {
                    publisher.publish(&name, &body).await.unwrap();
                }
            }
        },
    )
    .await;
    assert!(queue.drained().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_ends_in_the_dlq_byte_for_byte_as_python_writes_it_and_the_worker_goes_on() {
    const TEST: &str = "poison_ends_in_the_dlq_byte_for_byte";
    let (Some(url), Some(python)) = (server_url(REDIS_URL, TEST), python(TEST)) else {
        return;
    };
    let queue = Queue::new(&url);
    let transport = queue.transport().await;
    let mut raw = queue.raw().await;
    let bodies = poison_bodies(&queue.name);
    let mut oversized = envelope_with_id("big-1", &queue.name, 0);
    oversized
        .data
        .insert("padding".into(), json!("x".repeat(10_000)));
    let good = envelope_with_id("good-1", &queue.name, 1);
    for body in &bodies {
        let _: () = raw.rpush(&queue.name, body).await.unwrap();
    }
    let _: () = raw.rpush(&queue.name, oversized.to_vec()).await.unwrap();
    let unknown = Envelope::new("urn:babel:nobody:home", json!({})).with_queue(&queue.name);
    let _: () = raw.rpush(&queue.name, unknown.to_vec()).await.unwrap();
    let _: () = raw.rpush(&queue.name, good.to_vec()).await.unwrap();

    let log = SeenLog::default();
    // One at a time, so the DLQ holds the records in the order of the bodies.
    let consumer = Consumer::builder(
        recording_router(Arc::clone(&log), false),
        transport,
        &queue.name,
    )
    .concurrency(1)
    .max_body_bytes(4096)
    .build()
    .unwrap();
    let report = run_until_idle(&consumer, QUIET).await;
    assert_eq!(
        log.lock().unwrap().len(),
        1,
        "the valid message after the poison was handled"
    );
    assert_eq!(
        report.dead_lettered as usize,
        bodies.len() + 2,
        "{report:?}"
    );

    let records: Vec<Vec<u8>> = raw.lrange(queue.dlq(), 0, -1).await.unwrap();
    assert_eq!(records.len(), bodies.len() + 2);
    let mut originals = bodies.clone();
    originals.push(oversized.to_vec());
    let (poison, _) = records.split_at(originals.len());
    assert_poison_records_as_python_writes(&python, PEER, &queue.name, &originals, poison).await;
    for record in poison {
        let block: Value =
            serde_json::from_str(&consumer_support::dead_letter_block(record)).unwrap();
        assert_eq!(block["attempts"], 0, "{}", String::from_utf8_lossy(record));
    }
    // The unknown URN took the failure path: retried, then dead-lettered as unknown_urn.
    let last: Envelope = Envelope::from_slice(records.last().unwrap()).unwrap();
    let block: DeadLetter = last.dead_letter.unwrap();
    assert_eq!(block.reason.as_str(), "unknown_urn");
    assert_eq!(last.meta.id, unknown.meta.id);
    assert!(queue.drained().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_and_babel_idem_workers_share_one_seen_set_and_run_each_message_once() {
    const TEST: &str = "python_and_babel_idem_workers_share_one_seen_set";
    let (Some(url), Some(python)) = (server_url(REDIS_URL, TEST), python(TEST)) else {
        return;
    };
    let queue = Queue::new(&url);
    let transport = queue.transport().await;
    let scenario = SharedSeenSet::new(&queue.name, &url);
    for body in scenario.bodies(&queue.name) {
        transport.publish(&queue.name, &body).await.unwrap();
    }
    let redeliveries = async {
        for body in scenario.redeliveries(&queue.name).await {
            transport.publish(&queue.name, &body).await.unwrap();
        }
    };
    let python_worker = scenario.python_worker(&python, PEER, &url, &queue.name, &[]);
    let consumer = scenario.consumer(transport.clone(), &queue.name);
    let rust_worker = scenario.run_after_python(&consumer);
    let (python_out, report, ()) = tokio::join!(python_worker, rust_worker, redeliveries);

    scenario.assert_each_id_ran_once(&python_out, &report).await;
    assert!(queue.drained().await);
}

// ---------------------------------------------------------------- crash and outage

/// The env var that turns [`crash_worker_process`] into a worker.
const CHILD: &str = "BABEL_IDEM_CONSUMER_CRASH_CHILD";

/// How long the crashed worker's reservations last: long enough for it to
/// take all 150 before the kill even under load (the sweep in a later
/// reserve would otherwise hand some back while their handlers still hold
/// them), and what the restarted worker waits (up to two seconds more:
/// deadlines are whole seconds) before its sweep.
const CRASHED_WORKER_RESERVATION: Duration = Duration::from_secs(8);

/// Not a test of its own: the worker process `kill_9_with_100_in_flight...`
/// starts (this test binary, re-run with `CHILD` set) and kills.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the worker process of kill_9_with_100_in_flight_loses_nothing, started by that test"]
async fn crash_worker_process() {
    let Ok(config) = std::env::var(CHILD) else {
        return;
    };
    let config: Value = serde_json::from_str(&config).unwrap();
    let (url, queue, effects, sqlite) = (
        config["url"].as_str().unwrap(),
        config["queue"].as_str().unwrap(),
        config["effects"].as_str().unwrap().to_owned(),
        config["sqlite"].as_str().unwrap(),
    );
    let store = Arc::new(SqliteStore::open(sqlite).await.unwrap());
    let client = redis::Client::open(url).unwrap();
    let router = Router::builder()
        .route(urn!("urn:babel:interop:created"), move |env: Envelope| {
            let (store, client, effects) = (Arc::clone(&store), client.clone(), effects.clone());
            async move {
                run_once(store, &env, async {
                    if env.data.get("slow") == Some(&Value::Bool(true)) {
                        // Holds its reservation until the process is killed.
                        tokio::time::sleep(Duration::from_secs(3600)).await;
                    }
                    let mut raw = client.get_multiplexed_async_connection().await?;
                    let _: i64 = raw.hincr(&effects, env.meta.id.clone().unwrap(), 1).await?;
                    Ok::<(), anyhow::Error>(())
                })
                .await
            }
        })
        .build()
        .unwrap();
    let transport = RedisTransport::builder()
        .retry_after(CRASHED_WORKER_RESERVATION)
        .connect(url)
        .await
        .unwrap();
    Consumer::builder(router, transport, queue)
        .concurrency(100)
        .build()
        .unwrap()
        .run()
        .await;
}

/// A child process killed when the test ends, also when it fails.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_with_100_in_flight_loses_nothing_and_a_restarted_worker_runs_each_effect_once() {
    const TEST: &str = "kill_9_with_100_in_flight";
    let Some(url) = server_url(REDIS_URL, TEST) else {
        return;
    };
    let queue = Queue::new(&url);
    let effects = queue.key("effects");
    let sqlite = std::env::temp_dir().join(format!("{}.sqlite", queue.name));
    let transport = queue.transport().await;
    let fast: Vec<Envelope> = (0..50)
        .map(|n| envelope_with_id(&format!("fast-{n}"), &queue.name, n))
        .collect();
    for envelope in &fast {
        transport
            .publish(&queue.name, &envelope.to_vec())
            .await
            .unwrap();
    }
    for n in 0..100 {
        let mut slow = envelope_with_id(&format!("slow-{n}"), &queue.name, n);
        slow.data.insert("slow".into(), json!(true));
        transport
            .publish(&queue.name, &slow.to_vec())
            .await
            .unwrap();
    }

    let config = json!({"url": url, "queue": queue.name, "effects": effects, "sqlite": sqlite});
    let mut child = KillOnDrop(
        Command::new(std::env::current_exe().unwrap())
            .args([
                "--ignored",
                "--exact",
                "crash_worker_process",
                "--nocapture",
            ])
            .env(CHILD, config.to_string())
            .stdout(Stdio::null())
            .spawn()
            .expect("start the worker process"),
    );
    eventually(
        "the worker holds 100 reservations and ran the 50 fast ones",
        || async {
            queue.len(&queue.processing()).await == 100
                && queue.len(&queue.deadlines()).await == 100
                && queue.len(&queue.name).await == 0
                && queue.len(&effects).await == 50
        },
    )
    .await;
    child.0.kill().expect("kill -9 the worker"); // SIGKILL on Unix
    child.0.wait().unwrap();
    assert_eq!(queue.len(&queue.processing()).await, 100);
    assert_eq!(
        queue.len(&queue.deadlines()).await,
        100,
        "a reservation lapsed before the kill: the worker took longer than {CRASHED_WORKER_RESERVATION:?} to take the 150"
    );
    assert_eq!(queue.len(&queue.name).await, 0);

    // The fast ones come again (a producer's retry): the persistent
    // seen-set, not the broker, keeps them from running twice.
    for envelope in &fast {
        transport
            .publish(&queue.name, &envelope.to_vec())
            .await
            .unwrap();
    }
    let store = SqliteStore::open(&sqlite).await.unwrap();
    let restarted = Consumer::builder(
        effect_router(Arc::new(store), &url, effects.clone()),
        transport,
        &queue.name,
    )
    .concurrency(16)
    .build()
    .unwrap();
    let report = tokio::time::timeout(
        PATIENCE,
        restarted.run_until(async {
            eventually(
                "the sweep returned the 100 and the restarted worker finished them",
                || async { queue.drained().await && queue.len(&effects).await == 150 },
            )
            .await
        }),
    )
    .await
    .expect("the restarted worker finishes");

    let counts = effect_counts(&queue, &effects).await;
    assert_eq!(counts.len(), 150);
    assert!(counts.values().all(|&n| n == 1), "{counts:?}");
    assert_eq!(report.acked, 150, "{report:?}");
    let _ = std::fs::remove_file(&sqlite);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restarted_mid_run_the_consumer_reconnects_and_finishes_with_each_effect_once() {
    const TEST: &str = "redis_restarted_mid_run";
    let Some(mut server) = OwnRedis::reserve(TEST) else {
        return;
    };
    server.start();
    let url = server.url();
    let queue = Queue::new(&url);
    // The deliveries whose settles the outage refused come back once their
    // reservations lapse. Not sooner than a pause under load in a running
    // handler: a reservation swept while its handler still runs would run a
    // second time.
    let transport = RedisTransport::builder()
        .retry_after(Duration::from_secs(5))
        .timeout(Duration::from_secs(1))
        .connect(&url)
        .await
        .unwrap();
    publish_numbered(&transport, &queue.name, "r", 1000).await;
    let effects: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    let counted = Arc::clone(&effects);
    let store = Arc::new(SqliteStore::in_memory().await.unwrap());
    let router = Router::builder()
        .route(urn!("urn:babel:interop:created"), move |env: Envelope| {
            let (store, counted) = (Arc::clone(&store), Arc::clone(&counted));
            async move {
                run_once(store, &env, async {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    *counted
                        .lock()
                        .unwrap()
                        .entry(env.meta.id.clone().unwrap())
                        .or_default() += 1;
                    Ok::<(), anyhow::Error>(())
                })
                .await
            }
        })
        .build()
        .unwrap();
    let consumer = Consumer::builder(router, transport, &queue.name)
        .concurrency(8)
        .build()
        .unwrap();
    let progress = consumer.progress();
    let done = Arc::clone(&effects);
    let run = tokio::time::timeout(
        PATIENCE,
        consumer.run_until(async move {
            eventually("every message ran", || async {
                done.lock().unwrap().len() == 1000
            })
            .await;
            // Let the last settlements land.
            eventually("nothing in flight", || async {
                progress.report().in_flight == 0
            })
            .await;
        }),
    );
    let outage = async {
        eventually("a third of the queue is done", || async {
            effects.lock().unwrap().len() >= 300
        })
        .await;
        server.kill();
        // Longer than the client's own reconnect attempts (3, backing off
        // from 50 ms), so the outage reaches the consumer as broker errors.
        tokio::time::sleep(Duration::from_secs(2)).await;
        server.start();
    };
    let (report, ()) = tokio::join!(run, outage);
    let report = report.expect("the consumer finishes after the restart");

    let effects = effects.lock().unwrap().clone();
    assert_eq!(effects.len(), 1000);
    assert!(effects.values().all(|&n| n == 1), "an effect ran twice");
    assert!(report.broker_errors > 0, "the outage was seen: {report:?}");
    eventually("the queue is empty on the restarted server", || {
        queue.drained()
    })
    .await;
}

// ---------------------------------------------------------------- graceful stop

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_stop_takes_nothing_new_and_lets_in_flight_deliveries_finish() {
    const TEST: &str = "a_graceful_stop_lets_in_flight_finish";
    let Some(url) = server_url(REDIS_URL, TEST) else {
        return;
    };
    let queue = Queue::new(&url);
    let transport = queue.transport().await;
    publish_numbered(&transport, &queue.name, "g", 20).await;
    let release = Arc::new(tokio::sync::Semaphore::new(0));
    let gate = Arc::clone(&release);
    let router = Router::builder()
        .route(urn!("urn:babel:interop:created"), move |_: Envelope| {
            let gate = Arc::clone(&gate);
            async move {
                gate.acquire().await?.forget();
                Ok::<(), anyhow::Error>(())
            }
        })
        .build()
        .unwrap();
    // 5 handled at once and 5 read ahead: 10 held.
    let consumer = Consumer::builder(router, transport, &queue.name)
        .concurrency(5)
        .build()
        .unwrap();
    let progress = consumer.progress();
    let report = consumer
        .run_until(async {
            eventually("10 in flight", || async {
                progress.report().in_flight == 10
            })
            .await;
            // The stop is asked while the 5 still run and 5 wait for a slot;
            // all 10 finish after it.
            release.add_permits(10);
        })
        .await;
    assert_eq!(
        (report.delivered, report.acked, report.unfinished),
        (10, 10, 0),
        "{report:?}"
    );
    assert_eq!(queue.len(&queue.name).await, 10, "nothing new was reserved");
    assert_eq!(queue.len(&queue.processing()).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_still_running_at_the_shutdown_timeout_are_left_for_the_sweep() {
    const TEST: &str = "deliveries_still_running_at_the_shutdown_timeout";
    let Some(url) = server_url(REDIS_URL, TEST) else {
        return;
    };
    let queue = Queue::new(&url);
    // The consumer's own reserve calls sweep too: the reservations must not
    // lapse before the stop has run, even with the pauses of a run under load.
    let transport = lapsing_transport(&url, 5).await;
    publish_numbered(&transport, &queue.name, "s", 3).await;
    let router = Router::builder()
        .route(urn!("urn:babel:interop:created"), |_: Envelope| async {
            std::future::pending::<()>().await;
            Ok::<(), anyhow::Error>(())
        })
        .build()
        .unwrap();
    let consumer = Consumer::builder(router, transport.clone(), &queue.name)
        .shutdown_timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    let progress = consumer.progress();
    let report = consumer
        .run_until(async {
            eventually("3 in flight", || async { progress.report().in_flight == 3 }).await
        })
        .await;
    assert_eq!((report.unfinished, report.acked), (3, 0), "{report:?}");
    assert_eq!(
        queue.len(&queue.processing()).await,
        3,
        "left reserved, not lost"
    );
    let mut returned = 0;
    eventually("the sweep returns them once their deadline lapses", || {
        let transport = transport.clone();
        let queue_name = queue.name.clone();
        async move {
            returned += transport.sweep(&queue_name).await.unwrap();
            returned == 3
        }
    })
    .await;
    assert_eq!(queue.len(&queue.name).await, 3);
    assert_eq!(queue.len(&queue.processing()).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_is_never_swept_before_its_retry_after() {
    const TEST: &str = "a_reservation_is_never_swept_before_its_retry_after";
    let Some(url) = server_url(REDIS_URL, TEST) else {
        return;
    };
    let queue = Queue::new(&url);
    let transport = lapsing_transport(&url, 1).await;
    assert_eq!(
        transport.reservation_lifetime(),
        Some(Duration::from_secs(1))
    );
    let body = envelope_with_id("early-1", &queue.name, 0).to_vec();
    transport.publish(&queue.name, &body).await.unwrap();
    let reserved_from = Instant::now();
    let reserved = transport.reserve(&queue.name, 1).await.unwrap();
    assert_eq!(reserved.len(), 1);
    // Deadlines are whole seconds: written as `floor(now) + 1`, this one
    // would lapse within the second it was made in.
    eventually("the reservation lapses and is swept", || async {
        transport.sweep(&queue.name).await.unwrap() == 1
    })
    .await;
    let lasted = reserved_from.elapsed();
    assert!(
        lasted >= Duration::from_secs(1),
        "swept after {lasted:?}, before the 1 s the transport promised"
    );
    assert_eq!(queue.len(&queue.name).await, 1, "back in the queue");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_settle_of_a_swept_reservation_touches_nothing() {
    const TEST: &str = "a_late_settle_of_a_swept_reservation";
    let Some(url) = server_url(REDIS_URL, TEST) else {
        return;
    };
    let queue = Queue::new(&url);
    let transport = lapsing_transport(&url, 1).await;
    let body = envelope_with_id("late-1", &queue.name, 0).to_vec();
    transport.publish(&queue.name, &body).await.unwrap();
    let first = transport
        .reserve(&queue.name, 10)
        .await
        .unwrap()
        .pop()
        .unwrap();
    assert_eq!(first.body, body);
    assert_eq!(first.handle.token().len(), 32);
    eventually("the reservation lapses and is swept", || async {
        transport.sweep(&queue.name).await.unwrap() == 1
    })
    .await;
    let second = transport
        .reserve(&queue.name, 10)
        .await
        .unwrap()
        .pop()
        .unwrap();
    assert_eq!(second.body, body, "the same bytes, delivered again");

    // The first worker's late ack finds its own deadline member gone.
    assert!(
        !transport
            .settle(&first.handle, &Settlement::Ack)
            .await
            .unwrap()
    );
    assert_eq!(
        queue.len(&queue.processing()).await,
        1,
        "the newer reservation is untouched"
    );
    assert!(
        transport
            .settle(&second.handle, &Settlement::Ack)
            .await
            .unwrap()
    );
    assert!(queue.drained().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_forgotten_by_the_server_are_loaded_again() {
    const TEST: &str = "scripts_forgotten_by_the_server";
    let Some(url) = server_url(REDIS_URL, TEST) else {
        return;
    };
    let queue = Queue::new(&url);
    let transport = queue.transport().await;
    transport.publish(&queue.name, b"{}").await.unwrap();
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut queue.raw().await)
        .await
        .unwrap();
    let reserved = transport.reserve(&queue.name, 1).await.unwrap();
    assert_eq!(reserved.len(), 1);
    assert!(
        transport
            .settle(&reserved[0].handle, &Settlement::Ack)
            .await
            .unwrap()
    );
}

// ---------------------------------------------------------------- bad input

#[tokio::test]
async fn bad_urls_queue_names_and_refused_connections_are_clear_errors_at_start() {
    for url in [
        "not a url",
        "http://127.0.0.1:6379/",
        "redis://127.0.0.1:6379/0?retry_after=soon",
        "redis://127.0.0.1:6379/0?laravel=1&retry_after=soon",
        "redis://127.0.0.1:notaport/?laravel=1",
    ] {
        assert_invalid_url(url, RedisTransport::connect(url).await);
    }

    let refused = RedisTransport::builder()
        .reconnect_attempts(0)
        .connect(&format!("redis://127.0.0.1:{}/", closed_port()))
        .await;
    assert_cannot_connect(refused);
}

/// A retry waits with its delivery reserved; the Redis transport keeps the
/// reservation alive meanwhile (`Transport::extend`), so a backoff as long
/// as the reservation, or longer, is accepted when the consumer is built
/// (what it does at run time: `consumer_reliability.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_backoff_as_long_as_a_reservation_is_accepted_as_the_reservation_is_kept_alive() {
    const TEST: &str = "a_retry_backoff_as_long_as_a_reservation";
    let Some(url) = server_url(REDIS_URL, TEST) else {
        return;
    };
    let lapsing = lapsing_transport(&url, 30).await;
    assert_eq!(
        lapsing.reservation_lifetime(),
        Some(Duration::from_secs(30))
    );
    assert!(lapsing.extends_reservations());
    let from_url = format!("{}?retry_after=30", url.trim_end_matches('/'));
    let from_url = RedisTransport::connect(&from_url).await.unwrap();
    assert_eq!(
        from_url.reservation_lifetime(),
        Some(Duration::from_secs(30))
    );
    let router = |backoff: Backoff, max_attempts: u64| {
        Router::builder()
            .backoff(backoff)
            .max_attempts(max_attempts)
            .build()
            .unwrap()
    };
    let exponential = Backoff::exponential(Duration::from_secs(1), Duration::from_secs(600));
    for (backoff, max_attempts) in [
        (Backoff::fixed(Duration::from_secs(30)), 3),
        (exponential, 8),
        (Backoff::fixed(Duration::from_secs(3600)), 3),
    ] {
        let built =
            Consumer::builder(router(backoff, max_attempts), lapsing.clone(), "orders").build();
        assert!(
            built.is_ok(),
            "{backoff:?}, {max_attempts}: {:?}",
            built.err()
        );
    }
    let zero = Consumer::builder(router(Backoff::None, 3), lapsing, "orders")
        .delivery_timeout(Duration::ZERO)
        .build();
    assert!(
        matches!(zero, Err(ConsumerError::ZeroDeliveryTimeout)),
        "{:?}",
        zero.err()
    );
}

#[tokio::test]
async fn a_queue_name_the_layout_cannot_hold_is_refused_when_the_consumer_is_built() {
    const TEST: &str = "a_queue_name_the_layout_cannot_hold";
    let Some(url) = server_url(REDIS_URL, TEST) else {
        return;
    };
    let transport = RedisTransport::connect(&url).await.unwrap();
    assert_queue_names_refused(&transport, &["", "two words", "orders:processing"]);
    let zero = Consumer::builder(Router::builder().build().unwrap(), transport, "orders")
        .concurrency(0)
        .build();
    assert!(zero.is_err());
}

/// With its one handler busy, a consumer of concurrency 1 and the default
/// read-ahead (4) reserves again only once half its places ahead are
/// free: each reservation fetches two deliveries or more, not one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_consumer_reserves_for_half_its_places_ahead_at_once() {
    const TEST: &str = "redis_a_busy_consumer_reserves_for_half_its_places_ahead";
    let Some(url) = server_url(REDIS_URL, TEST) else {
        return;
    };
    const MESSAGES: u64 = 40;
    let queue = Queue::new(&url);
    let transport = queue.transport().await;
    for n in 0..MESSAGES {
        let body = consumer_support::envelope_with_id(&format!("refill-{n}"), &queue.name, n);
        transport
            .publish(&queue.name, &body.to_vec())
            .await
            .unwrap();
    }
    let router = Router::builder()
        .route(urn!("urn:babel:interop:created"), |_: Envelope| async {
            tokio::time::sleep(Duration::from_millis(2)).await;
            Ok::<(), anyhow::Error>(())
        })
        .build()
        .unwrap();
    let consumer = Consumer::builder(router, transport, &queue.name)
        .concurrency(1)
        .build()
        .unwrap();
    assert_eq!(consumer.read_ahead(), 4);
    let progress = consumer.progress();
    let all_acked = async {
        while progress.report().acked < MESSAGES {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    let report = tokio::time::timeout(PATIENCE, consumer.run_until(all_acked))
        .await
        .expect("the consumer drains the queue");
    assert_eq!(report.acked, MESSAGES, "{report:?}");
    // The first reservation fills the slot and four places; each after it
    // waits for two places. A few more may find the queue empty at the end;
    // one delivery a reservation would be about forty.
    assert!(
        report.reserve_calls <= 1 + (MESSAGES - 5).div_ceil(2) + 3,
        "{} reservations for {MESSAGES} deliveries: {report:?}",
        report.reserve_calls
    );
    assert!(queue.drained().await);
}

/// 500 deliveries of one id ahead of 200 other ids, at concurrency 64 with
/// the default read-ahead: more copies than the consumer holds in its
/// slots and places ahead. The copies never hold the slots or places the
/// other ids need: every id runs once, every delivery is acked, none waits
/// out a timeout or a reservation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_one_id_never_wedges_the_consumer() {
    a_burst_of_one_id(
        "redis_a_burst_of_one_id_never_wedges_the_consumer",
        64,
        false,
    )
    .await;
}

/// The same burst at concurrency 4: more copies than the places for
/// deliveries held back (16 a slot). Those beyond go back to the queue
/// unattempted, behind the other ids, and are skipped when they come again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_of_one_id_beyond_their_places_go_back_unattempted_and_are_skipped_later() {
    a_burst_of_one_id(
        "redis_copies_of_one_id_beyond_their_places_go_back_unattempted",
        4,
        true,
    )
    .await;
}

/// 500 copies of one id, then 200 other ids, through a consumer of
/// `concurrency`; `beyond`: more copies than it has places for.
async fn a_burst_of_one_id(test: &str, concurrency: usize, beyond: bool) {
    let Some(url) = server_url(REDIS_URL, test) else {
        return;
    };
    let queue = Queue::new(&url);
    let transport = queue.transport().await;
    for body in consumer_support::burst_of_one_id(&queue.name, "burst", 500, 200) {
        transport.publish(&queue.name, &body).await.unwrap();
    }
    // The seen-set's keys are under the queue's name: deleted with it.
    let store = RedisStore::builder()
        .prefix(queue.key("seen:"))
        .connect(&url)
        .await
        .unwrap();
    let report = consumer_support::a_burst_of_one_id_never_wedges_the_consumer(
        transport,
        store,
        &queue.name,
        concurrency,
        (500, 200),
    )
    .await;
    assert_eq!(report.id_busy > 0, beyond, "{report:?}");
    assert_eq!(report.released, report.id_busy, "{report:?}");
    assert!(queue.drained().await);
    assert_eq!(queue.len(&queue.dlq()).await, 0);
}
