//! `Consumer` + `AmqpTransport` against a real RabbitMQ, with the BabelQueue
//! Python SDK (pinned by `.ci/python.sh`, `amqp` extra) as the peer producer
//! and consumer.
//!
//! Environment: `BABEL_IDEM_AMQP_URL` (the shared broker), `BABEL_IDEM_PYTHON`
//! (the peer's virtualenv python), `BABEL_IDEM_REDIS_URL` for the shared
//! seen-set; without them a test prints `skipped:`, and with
//! `BABEL_IDEM_REQUIRE_SERVERS=1` it fails instead. Every test uses queues of
//! its own (a unique name), deleted when it ends; the outage test cuts
//! connections through a TCP proxy of its own, never the shared broker's.
#![cfg(all(feature = "amqp-transport", feature = "redis", feature = "sqlite"))]

mod consumer_support;
mod store_contract;

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use babel_idem::consumer::{ConsumerError, ConsumerReport};
use babel_idem::router::Backoff;
use babel_idem::store::RedisStore;
use babel_idem::transport::{AmqpTransport, Transport};
use babel_idem::{Consumer, Envelope, InMemoryStore, Router, run_once, urn};
use consumer_support::amqp_queue::{AMQP_URL, Queue, raw_connection};
use consumer_support::{
    PATIENCE, QUIET, SeenLog, SharedSeenSet, URN, assert_cannot_connect, assert_invalid_url,
    assert_poison_records_as_python_writes, assert_queue_names_refused, closed_port,
    envelope_with_id, eventually, python, python_consumes, python_publishes, python_received,
    recording_router, run_until_idle, seen_as_python_sent,
};
use lapin::BasicProperties;
use lapin::options::QueueDeclareOptions;
use lapin::types::{AMQPValue, FieldTable};
use serde_json::{Value, json};
use store_contract::servers::{REDIS_URL, server_url, unique_suffix};

/// The Python peer of these tests: `tests/python/amqp_peer.py`.
const PEER: &str = "amqp_peer.py";

/// Runs one subcommand of the Python peer; its JSON answer.
async fn peer(python: &Path, args: Vec<String>, stdin: Option<Value>) -> Value {
    consumer_support::peer(python, PEER, args, stdin).await
}

// ---------------------------------------------------------------- fixtures

fn header<'p>(properties: &'p BasicProperties, name: &str) -> Option<&'p AMQPValue> {
    properties.headers().as_ref()?.inner().get(name)
}

// ---------------------------------------------------------------- interop

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_publishes_and_babel_idem_consumes_ids_urns_data_and_headers() {
    const TEST: &str = "amqp_python_publishes_and_babel_idem_consumes";
    let (Some(url), Some(python)) = (server_url(AMQP_URL, TEST), python(TEST)) else {
        return;
    };
    let queue = Queue::new(&url);
    let sent = python_publishes(&python, PEER, &url, &queue.name, 25).await;

    let log = SeenLog::default();
    let transport = queue.transport(8).await;
    let consumer = Consumer::builder(
        recording_router(Arc::clone(&log), false),
        transport.clone(),
        &queue.name,
    )
    .concurrency(8)
    .build()
    .unwrap();
    let report = run_until_idle(&consumer, QUIET).await;
    transport.close().await;

    assert_eq!(report.acked, 25, "{report:?}");
    for got in seen_as_python_sent(&sent, &log.lock().unwrap()) {
        let header = |name: &str| got.headers.get(name).map(String::as_str);
        // The contract headers reach the handler too, as Python's pop maps them.
        assert_eq!(header("x-attempts"), Some("0"));
        assert_eq!(header("x-schema-version"), Some("1"));
        assert_eq!(header("x-source-lang"), Some("python"));
    }
    assert_eq!(queue.ready(&queue.name).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn babel_idem_publishes_and_python_consumes_with_headers_and_the_replay_marker() {
    const TEST: &str = "amqp_babel_idem_publishes_and_python_consumes";
    let (Some(url), Some(python)) = (server_url(AMQP_URL, TEST), python(TEST)) else {
        return;
    };
    let queue = Queue::new(&url);
    let transport = queue.transport(8).await;
    let sent: Vec<Envelope> = (0..20)
        .map(|n| {
            Envelope::new(URN, json!({"n": n, "text": "héllo \u{2028} \"q\""}))
                .with_queue(&queue.name)
        })
        .collect();
    let bodies: Vec<Vec<u8>> = sent.iter().map(Envelope::to_vec).collect();
    transport.publish_many(&queue.name, &bodies).await.unwrap();
    let replayed = Envelope::new(URN, json!({"n": 99})).with_queue(&queue.name);
    let headers = [
        ("bq-replay-bypass".to_owned(), "1".to_owned()),
        ("traceparent".to_owned(), "00-ab".to_owned()),
    ];
    transport
        .publish_with_headers(&queue.name, &replayed.to_vec(), &headers)
        .await
        .unwrap();
    transport.close().await;

    let out = python_consumes(&python, PEER, &url, &queue.name).await;
    let by_id = python_received(&out, &sent.iter().chain([&replayed]).collect::<Vec<_>>());
    for got in by_id.values() {
        assert_eq!(got["headers"]["x-source-lang"], "rust");
    }
    let marked = by_id[replayed.meta.id.as_deref().unwrap()];
    assert_eq!(marked["replay"], true);
    assert_eq!(marked["headers"]["bq-replay-bypass"], "1");
    assert_eq!(marked["headers"]["traceparent"], "00-ab");
    assert_eq!(queue.ready(&queue.name).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_body_gets_the_same_properties_headers_and_bytes_from_python_and_babel_idem() {
    const TEST: &str = "amqp_the_same_body_gets_the_same_properties";
    let (Some(url), Some(python)) = (server_url(AMQP_URL, TEST), python(TEST)) else {
        return;
    };
    let ours = Queue::new(&url);
    let theirs = Queue::new(&url);
    let mut retried = envelope_with_id("same-2", &ours.name, 2);
    retried.attempts = 4;
    let bodies: Vec<String> = [
        envelope_with_id("same-1", &ours.name, 1),
        retried,
        Envelope::new(URN, json!({"text": "héllo \u{2028}"})),
    ]
    .iter()
    .map(|e| String::from_utf8(e.to_vec()).unwrap())
    .chain(["not json".to_owned()])
    .collect();
    let headers = [
        ("traceparent".to_owned(), "00-ab".to_owned()),
        // The contract header wins a collision, on both sides.
        ("x-attempts".to_owned(), "99".to_owned()),
    ];
    peer(
        &python,
        vec!["publish-raw".into(), url.clone(), theirs.name.clone()],
        Some(json!({"bodies": bodies, "headers": {"traceparent": "00-ab", "x-attempts": "99"}})),
    )
    .await;
    let transport = ours.transport(1).await;
    for body in &bodies {
        transport
            .publish_with_headers(&ours.name, body.as_bytes(), &headers)
            .await
            .unwrap();
    }
    transport.close().await;

    let (python_side, rust_side) = (
        theirs.drain(&theirs.name).await,
        ours.drain(&ours.name).await,
    );
    assert_eq!(python_side.len(), bodies.len());
    assert_eq!(rust_side.len(), bodies.len());
    for ((their_props, their_body), (our_props, our_body)) in python_side.iter().zip(&rust_side) {
        assert_eq!(our_body, their_body, "the bytes");
        assert_eq!(
            our_props, their_props,
            "the properties and the typed header table"
        );
    }
    // And they are the contract's.
    let (props, _) = &rust_side[1];
    assert_eq!(props.kind().as_ref().unwrap().as_str(), URN);
    assert_eq!(props.message_id().as_ref().unwrap().as_str(), "same-2");
    assert_eq!(*props.delivery_mode(), Some(2));
    assert_eq!(header(props, "x-attempts"), Some(&AMQPValue::LongInt(4)));
    assert!(props.correlation_id().is_some());
}

// ---------------------------------------------------------------- settlements

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_republish_with_x_attempts_and_the_dead_letter_keeps_the_headers() {
    const TEST: &str = "amqp_retries_republish_with_x_attempts";
    let Some(url) = server_url(AMQP_URL, TEST) else {
        return;
    };
    let queue = Queue::new(&url);
    let transport = queue.transport(16).await;
    let ids = ["r-0", "r-1"];
    for (n, id) in ids.iter().enumerate() {
        let body = envelope_with_id(id, &queue.name, n as u64).to_vec();
        transport
            .publish_with_headers(&queue.name, &body, &[("traceparent".into(), "00-r".into())])
            .await
            .unwrap();
    }
    let log = SeenLog::default();
    let consumer = Consumer::builder(
        recording_router(Arc::clone(&log), true),
        transport.clone(),
        &queue.name,
    )
    .build()
    .unwrap();
    let report = run_until_idle(&consumer, QUIET).await;
    transport.close().await;
    assert_eq!((report.retried, report.dead_lettered), (4, 2), "{report:?}");

    let seen = log.lock().unwrap().clone();
    let mut attempts: Vec<(u64, String)> = seen
        .iter()
        .map(|s| (s.attempts, s.headers["x-attempts"].clone()))
        .collect();
    attempts.sort_unstable();
    let expected: Vec<(u64, String)> = [0, 0, 1, 1, 2, 2]
        .into_iter()
        .map(|n| (n, n.to_string()))
        .collect();
    assert_eq!(attempts, expected, "x-attempts follows the body's attempts");
    assert!(seen.iter().all(|s| s.headers["traceparent"] == "00-r"));

    let records = queue.drain(&queue.dlq()).await;
    assert_eq!(records.len(), 2);
    for (props, body) in &records {
        let record = Envelope::from_slice(body).unwrap();
        let block = record.dead_letter.as_ref().unwrap();
        assert_eq!(block.reason.as_str(), "failed");
        assert_eq!(block.original_queue, queue.name);
        assert!(ids.contains(&record.meta.id.as_deref().unwrap()));
        assert_eq!(
            props.message_id().as_ref().map(|id| id.as_str()),
            record.meta.id.as_deref()
        );
        assert_eq!(
            header(props, "traceparent"),
            Some(&AMQPValue::LongString("00-r".into()))
        );
    }
    assert_eq!(queue.ready(&queue.name).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_claim_goes_back_unchanged_and_runs_once_its_holder_gives_up() {
    const TEST: &str = "amqp_a_parked_claim_goes_back_unchanged";
    let Some(url) = server_url(AMQP_URL, TEST) else {
        return;
    };
    let queue = Queue::new(&url);
    let transport = queue.transport(16).await;
    let id = format!("parked-{}", unique_suffix());
    let body = envelope_with_id(&id, &queue.name, 0).to_vec();
    transport
        .publish_with_headers(
            &queue.name,
            &body,
            &[("traceparent".into(), "00-parked".into())],
        )
        .await
        .unwrap();
    consumer_support::a_parked_delivery_goes_back_unchanged_and_runs_once_freed(
        transport.clone(),
        &queue.name,
        &id,
    )
    .await;
    transport.close().await;
    assert_eq!(queue.ready(&queue.name).await, 0);
    assert_eq!(queue.ready(&queue.dlq()).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_read_ahead_waits_for_the_handler_slot_in_order() {
    const TEST: &str = "amqp_a_delivery_read_ahead_waits";
    let Some(url) = server_url(AMQP_URL, TEST) else {
        return;
    };
    let queue = Queue::new(&url);
    // An unacked delivery lapses at the broker's consumer timeout, and a
    // delivery cannot be kept alive: nothing is read ahead unless the
    // broker has no such timeout (the prefetch reads ahead instead).
    let transport = queue.transport(2).await;
    let publisher = transport.clone();
    consumer_support::a_delivery_read_ahead_waits_for_the_handler_slot_in_order(
        transport.clone(),
        &queue.name,
        0,
        |bodies| {
            let (publisher, name) = (publisher.clone(), queue.name.clone());
            async move { publisher.publish_many(&name, &bodies).await.unwrap() }
        },
    )
    .await;
    transport.close().await;
    // The prefetch holds the concurrency plus the default read-ahead.
    let transport = AmqpTransport::builder()
        .prefetch(5)
        .no_consumer_timeout()
        .reserve_wait(Duration::from_millis(50))
        .connect(&url)
        .await
        .expect("connect the transport");
    let publisher = transport.clone();
    consumer_support::a_delivery_read_ahead_waits_for_the_handler_slot_in_order(
        transport.clone(),
        &queue.name,
        4,
        |bodies| {
            let (publisher, name) = (publisher.clone(), queue.name.clone());
            async move { publisher.publish_many(&name, &bodies).await.unwrap() }
        },
    )
    .await;
    transport.close().await;
    assert_eq!(queue.ready(&queue.name).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_bodies_end_in_the_dlq_byte_for_byte_as_python_writes_them() {
    const TEST: &str = "amqp_poison_bodies_end_in_the_dlq";
    let (Some(url), Some(python)) = (server_url(AMQP_URL, TEST), python(TEST)) else {
        return;
    };
    let queue = Queue::new(&url);
    let transport = queue.transport(1).await;
    let mut oversized = envelope_with_id("big-1", &queue.name, 0);
    oversized
        .data
        .insert("padding".into(), json!("x".repeat(10_000)));
    let bodies: Vec<Vec<u8>> = vec![
        b"plain text, no JSON".to_vec(),
        b"\xfe\xff binary {".to_vec(),
        b"[\"an\", \"array\"]".to_vec(),
        b" {  } ".to_vec(),
        br#"{"job":"urn:babel:interop:created","attempts":"three","x":1e400}"#.to_vec(),
        br#"{"job":"urn:babel:interop:created","dead_letter":{"reason":"failed"}}"#.to_vec(),
        oversized.to_vec(),
    ];
    for body in &bodies {
        transport.publish(&queue.name, body).await.unwrap();
    }
    let good = envelope_with_id("good-1", &queue.name, 1);
    transport
        .publish(&queue.name, &good.to_vec())
        .await
        .unwrap();

    let log = SeenLog::default();
    // One at a time, so the DLQ holds the records in the order of the bodies.
    let consumer = Consumer::builder(
        recording_router(Arc::clone(&log), false),
        transport.clone(),
        &queue.name,
    )
    .concurrency(1)
    .max_body_bytes(4096)
    .build()
    .unwrap();
    let report = run_until_idle(&consumer, QUIET).await;
    transport.close().await;
    assert_eq!(
        log.lock().unwrap().len(),
        1,
        "the valid message after the poison ran"
    );
    assert_eq!(report.dead_lettered as usize, bodies.len(), "{report:?}");

    let records: Vec<Vec<u8>> = queue
        .drain(&queue.dlq())
        .await
        .into_iter()
        .map(|(_, record)| record)
        .collect();
    assert_poison_records_as_python_writes(&python, PEER, &queue.name, &bodies, &records).await;
    assert_eq!(queue.ready(&queue.name).await, 0);
}

// ---------------------------------------------------------------- one seen-set

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_and_babel_idem_workers_share_one_seen_set_and_run_each_message_once() {
    const TEST: &str = "amqp_python_and_babel_idem_workers_share_one_seen_set";
    let (Some(url), Some(redis_url), Some(python)) = (
        server_url(AMQP_URL, TEST),
        server_url(REDIS_URL, TEST),
        python(TEST),
    ) else {
        return;
    };
    let queue = Queue::new(&url);
    let transport = queue.transport(8).await;
    let scenario = SharedSeenSet::new(&queue.name, &redis_url);
    transport
        .publish_many(&queue.name, &scenario.bodies(&queue.name))
        .await
        .unwrap();
    let redeliveries = async {
        let again = scenario.redeliveries(&queue.name).await;
        transport.publish_many(&queue.name, &again).await.unwrap();
    };
    let seen_set_server = ["--redis", redis_url.as_str()];
    let python_worker = scenario.python_worker(&python, PEER, &url, &queue.name, &seen_set_server);
    let consumer = scenario.consumer(transport.clone(), &queue.name);
    let rust_worker = async {
        let report = scenario.run_after_python(&consumer).await;
        // Anything pushed to us and not reserved goes back for Python.
        transport.close().await;
        report
    };
    let (python_out, report, ()) = tokio::join!(python_worker, rust_worker, redeliveries);

    scenario.assert_each_id_ran_once(&python_out, &report).await;
    assert_eq!(queue.ready(&queue.name).await, 0);
}

// ---------------------------------------------------------------- a dropped connection

/// A TCP proxy to the broker, owned by one test: `cut` drops every
/// connection through it at once (both sides see the socket close, as when
/// the broker closes connections), and new ones are accepted again.
struct Proxy {
    port: u16,
    connections: Arc<Mutex<Vec<tokio::task::AbortHandle>>>,
    accept: tokio::task::JoinHandle<()>,
}

impl Proxy {
    async fn start(upstream: String) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let connections: Arc<Mutex<Vec<tokio::task::AbortHandle>>> = Arc::default();
        let registry = Arc::clone(&connections);
        let accept = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let upstream = upstream.clone();
                let task = tokio::spawn(async move {
                    if let Ok(mut server) = tokio::net::TcpStream::connect(upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
                registry.lock().unwrap().push(task.abort_handle());
            }
        });
        Proxy {
            port,
            connections,
            accept,
        }
    }

    fn cut(&self) -> usize {
        let cut: Vec<_> = self.connections.lock().unwrap().drain(..).collect();
        cut.iter().for_each(tokio::task::AbortHandle::abort);
        cut.len()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_dropped_mid_run_is_reopened_and_every_effect_runs_once() {
    const TEST: &str = "amqp_a_connection_dropped_mid_run";
    let Some(url) = server_url(AMQP_URL, TEST) else {
        return;
    };
    let uri: lapin::uri::AMQPUri = url.parse().unwrap();
    let proxy = Proxy::start(format!("{}:{}", uri.authority.host, uri.authority.port)).await;
    let through_proxy = format!(
        "amqp://{}:{}@127.0.0.1:{}/{}",
        uri.authority.userinfo.username,
        uri.authority.userinfo.password,
        proxy.port,
        uri.vhost.replace('%', "%25").replace('/', "%2f")
    );
    let queue = Queue::new(&url);
    let publisher = queue.transport(1).await;
    let bodies: Vec<Vec<u8>> = (0..1000)
        .map(|n| envelope_with_id(&format!("d-{n}"), &queue.name, n).to_vec())
        .collect();
    publisher.publish_many(&queue.name, &bodies).await.unwrap();
    publisher.close().await;

    let proxy = Arc::new(proxy);
    let effects: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    let deliveries: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    let store = Arc::new(InMemoryStore::new());
    let cut_once = Arc::new(AtomicBool::new(false));
    let transport = AmqpTransport::builder()
        .prefetch(32)
        .reserve_wait(Duration::from_millis(50))
        .connect(&through_proxy)
        .await
        .unwrap();
    // Never declared: only a round trip that the cut connection cannot answer.
    let probe = format!("{}-probe", queue.name);
    let router = {
        let (effects, deliveries, proxy, transport) = (
            Arc::clone(&effects),
            Arc::clone(&deliveries),
            Arc::clone(&proxy),
            transport.clone(),
        );
        Router::builder()
            .route(urn!("urn:babel:interop:created"), move |env: Envelope| {
                let id = env.meta.id.clone().unwrap();
                *deliveries.lock().unwrap().entry(id.clone()).or_default() += 1;
                // The connection is cut while this delivery runs: its ack
                // cannot land, so the broker must deliver it again.
                let cut = id == "d-300" && !cut_once.swap(true, Ordering::Relaxed);
                if cut {
                    assert!(
                        proxy.cut() > 0,
                        "the consumer's connection goes through the proxy"
                    );
                }
                let (store, effects) = (Arc::clone(&store), Arc::clone(&effects));
                let (transport, probe) = (transport.clone(), probe.clone());
                async move {
                    if cut {
                        // The transport learns of the cut before this
                        // delivery settles (AMQP does not answer an ack, so
                        // one written before the client sees the socket
                        // close counts as sent): a round trip on the cut
                        // connection fails, or the transport has already
                        // noticed and answers on a new one.
                        let _ = transport.delete_queue(&probe).await;
                    }
                    run_once(store, &env, async {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        *effects.lock().unwrap().entry(id).or_default() += 1;
                        Ok::<(), anyhow::Error>(())
                    })
                    .await
                }
            })
            .build()
            .unwrap()
    };
    let consumer = Consumer::builder(router, transport.clone(), &queue.name)
        .concurrency(8)
        .build()
        .unwrap();
    let progress = consumer.progress();
    let done = Arc::clone(&effects);
    let queue = &queue;
    let report = tokio::time::timeout(
        PATIENCE,
        consumer.run_until(async move {
            eventually("every message ran", || async {
                done.lock().unwrap().len() == 1000
            })
            .await;
            eventually("the queue is drained", || async {
                progress.report().in_flight == 0 && queue.ready(&queue.name).await == 0
            })
            .await;
        }),
    )
    .await
    .expect("the consumer finishes after the cut");
    transport.close().await;

    let effects = effects.lock().unwrap().clone();
    assert_eq!(effects.len(), 1000);
    assert!(effects.values().all(|&n| n == 1), "an effect ran twice");
    assert!(
        deliveries.lock().unwrap()["d-300"] >= 2,
        "the delivery in flight at the cut was delivered again"
    );
    assert!(
        report.lapsed >= 1,
        "its late settlement touched nothing: {report:?}"
    );
    assert!(
        report.delivered > 1000,
        "the unacked deliveries came back: {report:?}"
    );
}

// ---------------------------------------------------------------- nothing stalls a queue

/// Declares `name` on the broker as another client would, durable with
/// `arguments` (a quorum queue, a TTL, a length limit).
async fn declare_elsewhere(url: &str, name: &str, arguments: &[(&str, AMQPValue)]) {
    let connection = raw_connection(url).await;
    let channel = connection.create_channel().await.unwrap();
    let mut table = FieldTable::default();
    for (key, value) in arguments {
        table.insert((*key).into(), value.clone());
    }
    channel
        .queue_declare(name.into(), QueueDeclareOptions::durable(), table)
        .await
        .expect("declare the queue with its arguments");
    let _ = connection.close(200, "declared".into()).await;
}

fn quorum() -> (&'static str, AMQPValue) {
    ("x-queue-type", AMQPValue::LongString("quorum".into()))
}

/// A consumer of `queue` whose handler records what it ran.
fn recording_consumer(
    transport: &AmqpTransport,
    queue: &Queue,
    log: &SeenLog,
    concurrency: usize,
) -> Consumer<AmqpTransport> {
    Consumer::builder(
        recording_router(Arc::clone(log), false),
        transport.clone(),
        &queue.name,
    )
    .concurrency(concurrency)
    .shutdown_timeout(Duration::from_millis(500))
    .build()
    .unwrap()
}

/// Publishes `count` envelopes (ids `<prefix>-1`...) behind what `queue`
/// holds, runs a recording consumer until idle, and closes the transport:
/// the report, the ids that ran (once each), the connections opened.
async fn publish_and_run(
    transport: AmqpTransport,
    queue: &Queue,
    prefix: &str,
    count: u64,
) -> (ConsumerReport, Vec<String>, u64) {
    let bodies: Vec<Vec<u8>> = (1..=count)
        .map(|n| envelope_with_id(&format!("{prefix}-{n}"), &queue.name, n).to_vec())
        .collect();
    transport.publish_many(&queue.name, &bodies).await.unwrap();
    let log = SeenLog::default();
    let consumer = recording_consumer(&transport, queue, &log, 4);
    let report = run_until_idle(&consumer, QUIET).await;
    let connections = transport.connections_opened();
    transport.close().await;
    let mut ran: Vec<String> = log.lock().unwrap().iter().map(|s| s.id.clone()).collect();
    ran.sort();
    ran.dedup();
    (report, ran, connections)
}

/// The DLQ holds one message: `body` byte for byte, with the headers that
/// name `queue` and say why.
async fn assert_copied_to_dlq(queue: &Queue, body: &[u8]) -> BasicProperties {
    let mut dead = queue.drain(&queue.dlq()).await;
    assert_eq!(dead.len(), 1);
    let (properties, copied) = dead.remove(0);
    assert_eq!(copied, body, "the body reaches the DLQ byte for byte");
    assert_eq!(
        header(&properties, "x-babel-idem-original-queue"),
        Some(&AMQPValue::LongString(queue.name.as_str().into()))
    );
    assert!(header(&properties, "x-babel-idem-dead-letter-reason").is_some());
    properties
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quorum_work_queue_and_quorum_dlq_declared_elsewhere_run_and_dead_letter_without_reconnecting()
 {
    const TEST: &str = "amqp_quorum_queues_declared_elsewhere";
    let Some(url) = server_url(AMQP_URL, TEST) else {
        return;
    };
    let queue = Queue::new(&url);
    declare_elsewhere(&url, &queue.name, &[quorum()]).await;
    declare_elsewhere(&url, &queue.dlq(), &[quorum()]).await;
    let transport = queue.transport(32).await;
    // Every 20th is poison: 950 envelopes and 50 bodies that are no JSON.
    let bodies: Vec<Vec<u8>> = (0..1000u64)
        .map(|n| match n % 20 {
            7 => format!("poison {n}").into_bytes(),
            _ => envelope_with_id(&format!("q-{n}"), &queue.name, n).to_vec(),
        })
        .collect();
    transport.publish_many(&queue.name, &bodies).await.unwrap();

    let log = SeenLog::default();
    let consumer = recording_consumer(&transport, &queue, &log, 16);
    let report = run_until_idle(&consumer, QUIET).await;
    let connections = transport.connections_opened();
    transport.close().await;

    assert_eq!(log.lock().unwrap().len(), 950, "{report:?}");
    assert_eq!(
        (report.acked, report.dead_lettered),
        (950, 50),
        "{report:?}"
    );
    assert_eq!(
        report.delivered,
        report.acked + report.dead_lettered,
        "every delivery settled once: {report:?}"
    );
    assert_eq!((report.lapsed, report.broker_errors), (0, 0), "{report:?}");
    assert_eq!(connections, 1, "never reconnected");
    assert_eq!(queue.ready(&queue.name).await, 0);
    assert_eq!(queue.drain(&queue.dlq()).await.len(), 50);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dlq_with_a_ttl_and_a_length_limit_takes_dead_letters_and_its_refusal_is_a_broker_error()
{
    const TEST: &str = "amqp_a_dlq_with_a_ttl_and_a_length_limit";
    let Some(url) = server_url(AMQP_URL, TEST) else {
        return;
    };
    let queue = Queue::new(&url);
    declare_elsewhere(
        &url,
        &queue.dlq(),
        &[
            ("x-message-ttl", AMQPValue::LongInt(600_000)),
            ("x-max-length", AMQPValue::LongInt(1)),
            ("x-overflow", AMQPValue::LongString("reject-publish".into())),
        ],
    )
    .await;
    let transport = queue.transport(8).await;
    transport
        .publish(&queue.name, b"first poison")
        .await
        .unwrap();
    let log = SeenLog::default();
    let consumer = recording_consumer(&transport, &queue, &log, 4);
    let report = run_until_idle(&consumer, QUIET).await;
    assert_eq!(report.dead_lettered, 1, "{report:?}");
    assert_eq!(queue.ready(&queue.dlq()).await, 1);

    // The DLQ is full and refuses the next record: a broker error, retried,
    // and the delivery stays in its queue.
    transport
        .publish(&queue.name, b"second poison")
        .await
        .unwrap();
    let consumer = recording_consumer(&transport, &queue, &log, 4);
    let progress = consumer.progress();
    let report = tokio::time::timeout(
        PATIENCE,
        consumer.run_until(eventually("the refusal is counted", move || {
            let errors = progress.report().broker_errors;
            async move { errors >= 2 }
        })),
    )
    .await
    .unwrap();
    let connections = transport.connections_opened();
    transport.close().await;
    assert!(report.broker_errors >= 2, "{report:?}");
    assert_eq!((report.dead_lettered, report.lapsed), (0, 0), "{report:?}");
    assert_eq!(connections, 1, "the refusal kept the connection");
    assert_eq!(queue.ready(&queue.name).await, 1, "the message is not lost");
    let dead = queue.drain(&queue.dlq()).await;
    assert_eq!(dead.len(), 1);
    assert!(String::from_utf8_lossy(&dead[0].1).contains("first poison"));
    assert_eq!(queue.drain(&queue.name).await[0].1, b"second poison");
}

/// A queue whose first message lapin cannot parse (`field` of it is not
/// UTF-8), and 20 messages behind it: the 20 run, the first reaches the DLQ
/// byte for byte, and the consumer reconnects once, not in a loop.
async fn an_unreadable_first_message_goes_to_the_dlq(test: &str, field: &str) {
    let (Some(url), Some(python)) = (server_url(AMQP_URL, test), python(test)) else {
        return;
    };
    let queue = Queue::new(&url);
    let unreadable = envelope_with_id("unreadable", &queue.name, 0).to_vec();
    let body = String::from_utf8(unreadable.clone()).unwrap();
    let args = vec!["publish-unreadable".into(), url.clone(), queue.name.clone()];
    peer(&python, args, Some(json!({"body": body, "field": field}))).await;
    let transport = queue.transport(8).await;
    let (report, ran, connections) = publish_and_run(transport, &queue, "r", 20).await;

    assert_eq!(ran.len(), 20, "the 20 behind it ran: {report:?}");
    assert!(!ran.contains(&"unreadable".to_owned()));
    assert!(
        connections <= 3,
        "{connections} connections: the consumer reconnected in a loop"
    );
    assert_eq!(queue.ready(&queue.name).await, 0, "{report:?}");
    assert_copied_to_dlq(&queue, &unreadable).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_whose_header_name_is_not_utf8_goes_to_the_dlq_and_the_20_behind_it_run() {
    an_unreadable_first_message_goes_to_the_dlq("amqp_a_header_name_not_utf8", "header").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_whose_message_id_is_not_utf8_goes_to_the_dlq_and_the_20_behind_it_run() {
    an_unreadable_first_message_goes_to_the_dlq("amqp_a_message_id_not_utf8", "message_id").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_whose_headers_nest_too_deep_goes_to_the_dlq_with_its_body() {
    const TEST: &str = "amqp_headers_nested_too_deep";
    let Some(url) = server_url(AMQP_URL, TEST) else {
        return;
    };
    let queue = Queue::new(&url);
    let transport = queue.transport(8).await;
    let deep_body = envelope_with_id("deep", &queue.name, 0).to_vec();
    let mut nested = AMQPValue::LongString("bottom".into());
    for _ in 0..100 {
        let mut table = FieldTable::default();
        table.insert("n".into(), nested);
        nested = AMQPValue::FieldTable(table);
    }
    let mut headers = FieldTable::default();
    headers.insert("deep".into(), nested);
    let connection = raw_connection(&url).await;
    let channel = connection.create_channel().await.unwrap();
    channel
        .queue_declare(
            queue.name.as_str().into(),
            QueueDeclareOptions::durable(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    channel
        .basic_publish(
            "".into(),
            queue.name.as_str().into(),
            lapin::options::BasicPublishOptions::default(),
            &deep_body,
            BasicProperties::default().with_headers(headers),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    let _ = connection.close(200, "published".into()).await;
    let (report, ran, connections) = publish_and_run(transport, &queue, "s", 5).await;

    assert_eq!((report.acked, ran.len()), (5, 5), "{report:?}");
    assert_eq!((report.lapsed, report.broker_errors), (0, 0), "{report:?}");
    assert_eq!(connections, 1);
    assert_eq!(queue.ready(&queue.name).await, 0);
    let copied = assert_copied_to_dlq(&queue, &deep_body).await;
    assert!(header(&copied, "deep").is_none(), "without the deep header");
}

/// Headers nested 15,000 tables deep (a frame of about 100 KiB, within the
/// broker's frame size): lapin's recursive parser would exhaust its I/O
/// thread's stack and abort the process. The delivery reaches the
/// transport with one header saying why, goes to the DLQ with its body,
/// and the 20 behind it run on the same connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_nested_thousands_deep_go_to_the_dlq_without_taking_the_process_down() {
    const TEST: &str = "amqp_headers_nested_thousands_deep";
    let (Some(url), Some(python)) = (server_url(AMQP_URL, TEST), python(TEST)) else {
        return;
    };
    let queue = Queue::new(&url);
    let deep_body = envelope_with_id("deep", &queue.name, 0).to_vec();
    let body = String::from_utf8(deep_body.clone()).unwrap();
    let args = vec!["publish-unreadable".into(), url.clone(), queue.name.clone()];
    let request = json!({"body": body, "field": "deep", "depth": 15_000});
    peer(&python, args, Some(request)).await;
    let transport = queue.transport(8).await;
    let (report, ran, connections) = publish_and_run(transport, &queue, "d", 20).await;

    assert_eq!((report.acked, ran.len()), (20, 20), "{report:?}");
    assert!(!ran.contains(&"deep".to_owned()));
    assert_eq!((report.lapsed, report.broker_errors), (0, 0), "{report:?}");
    assert_eq!(connections, 1, "one connection: nothing failed it");
    assert_eq!(queue.ready(&queue.name).await, 0);
    let copied = assert_copied_to_dlq(&queue, &deep_body).await;
    assert!(header(&copied, "deep").is_none(), "without the deep header");
}

// ---------------------------------------------------------------- bad input

#[tokio::test]
async fn bad_urls_queue_names_and_refused_connections_are_clear_errors_at_start() {
    for url in [
        "not a url",
        "redis://127.0.0.1:6379/",
        "amqp://127.0.0.1:notaport/%2f",
        "amqps://guest:guest@127.0.0.1:5671/%2f",
    ] {
        assert_invalid_url(url, AmqpTransport::connect(url).await);
    }

    let refused = AmqpTransport::builder()
        .reconnect_attempts(0)
        .connect(&format!(
            "amqp://guest:guest@127.0.0.1:{}/%2f",
            closed_port()
        ))
        .await;
    assert_cannot_connect(refused);
}

#[tokio::test]
async fn a_wrong_password_and_a_bad_queue_name_are_refused_at_start() {
    const TEST: &str = "amqp_a_wrong_password_and_a_bad_queue_name";
    let Some(url) = server_url(AMQP_URL, TEST) else {
        return;
    };
    let uri: lapin::uri::AMQPUri = url.parse().unwrap();
    let wrong = format!(
        "amqp://{}:not-the-password@{}:{}/%2f",
        uri.authority.userinfo.username, uri.authority.host, uri.authority.port
    );
    assert_cannot_connect(AmqpTransport::connect(&wrong).await);

    let transport = AmqpTransport::connect(&url).await.unwrap();
    assert_queue_names_refused(&transport, &["", "amq.reserved", "line\nbreak"]);
    transport.close().await;
}

/// The worker example's scenario at concurrency 64 (prefetch 64): 1,000
/// ids, 100 of them published twice in a row. In seen-set mode the second
/// copy waits for its original and is then skipped: 1,000 ran, 100 skipped,
/// none twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_copies_of_one_id_never_run_at_once_in_one_consumer() {
    const TEST: &str = "amqp_two_copies_of_one_id_never_run_at_once";
    let Some(url) = server_url(AMQP_URL, TEST) else {
        return;
    };
    let queue = Queue::new(&url);
    let transport = queue.transport(64).await;
    let bodies = consumer_support::twice_in_a_row(&queue.name, "twice", 1000, 100);
    transport.publish_many(&queue.name, &bodies).await.unwrap();
    consumer_support::assert_each_id_runs_once_in_one_process(
        transport.clone(),
        &queue.name,
        1000,
        100,
    )
    .await;
    assert_eq!(queue.ready(&queue.name).await, 0);
    transport.close().await;
}

/// An unacked delivery lives until the broker's `consumer_timeout` (30
/// minutes by default) closes its channel; a retry waits with its delivery
/// unacked, so a backoff that long, or a per-delivery timeout that with
/// the backoff outlives it, is refused when the consumer is built.
#[tokio::test]
async fn a_retry_backoff_as_long_as_the_consumer_timeout_is_refused_at_start() {
    const TEST: &str = "amqp_a_retry_backoff_as_long_as_the_consumer_timeout";
    let Some(url) = server_url(AMQP_URL, TEST) else {
        return;
    };
    let minutes = |n: u64| Duration::from_secs(60 * n);
    let router = |backoff: Duration| {
        Router::builder()
            .backoff(Backoff::fixed(backoff))
            .build()
            .unwrap()
    };
    let build = |transport: &AmqpTransport, backoff: Duration| {
        Consumer::builder(router(backoff), transport.clone(), "orders").build()
    };

    let default = AmqpTransport::connect(&url).await.unwrap();
    assert_eq!(default.reservation_lifetime(), Some(minutes(30)));
    assert!(!default.extends_reservations());
    let within = build(&default, minutes(29)).unwrap();
    // The default timeout takes 90 % of what the wait leaves.
    assert_eq!(within.delivery_timeout(), Some(Duration::from_secs(54)));
    let error = build(&default, minutes(30)).err().expect("refused");
    assert!(
        matches!(
            error,
            ConsumerError::OutlivesReservation { longest_wait, reservation, .. }
                if longest_wait == minutes(30) && reservation == minutes(30)
        ),
        "{error:?}"
    );
    // A timeout that with the backoff outlives the consumer timeout is
    // refused, with the sum in the error.
    let error = Consumer::builder(router(minutes(20)), default.clone(), "orders")
        .delivery_timeout(minutes(10))
        .build()
        .err()
        .expect("refused");
    assert!(
        matches!(
            error,
            ConsumerError::OutlivesReservation { delivery_timeout: Some(timeout), .. }
                if timeout == minutes(10)
        ),
        "{error:?}"
    );
    assert!(error.to_string().contains("= 1800s"), "{error}");

    let short = AmqpTransport::builder()
        .consumer_timeout(Duration::from_secs(10))
        .connect(&url)
        .await
        .unwrap();
    assert!(build(&short, Duration::from_secs(9)).is_ok());
    assert!(build(&short, Duration::from_secs(10)).is_err());

    let unbounded = AmqpTransport::builder()
        .no_consumer_timeout()
        .connect(&url)
        .await
        .unwrap();
    assert_eq!(unbounded.reservation_lifetime(), None);
    assert!(build(&unbounded, minutes(600)).is_ok());
    for transport in [default, short, unbounded] {
        transport.close().await;
    }
}

/// 500 deliveries of one id ahead of 200 other ids, at concurrency 64 with
/// the worker example's prefetch (128): every id runs once, every delivery
/// is acked, none waits out a timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_one_id_never_wedges_the_consumer() {
    const TEST: &str = "amqp_a_burst_of_one_id_never_wedges_the_consumer";
    let (Some(url), Some(redis_url)) = (server_url(AMQP_URL, TEST), server_url(REDIS_URL, TEST))
    else {
        return;
    };
    let queue = Queue::new(&url);
    let transport = queue.transport(128).await;
    let bodies = consumer_support::burst_of_one_id(&queue.name, "burst", 500, 200);
    transport.publish_many(&queue.name, &bodies).await.unwrap();
    let seen_prefix = format!("{}:seen:", queue.name);
    let _seen_keys = DeleteOnDrop(redis_url.clone(), format!("{seen_prefix}*"));
    let store = RedisStore::builder()
        .prefix(&seen_prefix)
        .connect(&redis_url)
        .await
        .unwrap();
    consumer_support::a_burst_of_one_id_never_wedges_the_consumer(
        transport.clone(),
        store,
        &queue.name,
        64,
        (500, 200),
    )
    .await;
    assert_eq!(queue.ready(&queue.name).await, 0);
    assert_eq!(queue.ready(&queue.dlq()).await, 0);
    transport.close().await;
}

/// Deletes the keys matching a pattern from a Redis server when dropped.
struct DeleteOnDrop(String, String);

impl Drop for DeleteOnDrop {
    fn drop(&mut self) {
        consumer_support::delete_keys(&self.0, &[&self.1]);
    }
}
