//! Dead-letter redrive on a real RabbitMQ (`Redrive::redrive` on an `AmqpTransport`), with
//! the BabelQueue Python SDK (pinned by `.ci/python.sh`, `amqp` extra) as
//! the peer that dead-letters, redrives and consumes.
//!
//! Environment: `BABEL_IDEM_AMQP_URL` (the shared broker), `BABEL_IDEM_PYTHON`;
//! without them a test prints `skipped:`, and with
//! `BABEL_IDEM_REQUIRE_SERVERS=1` it fails instead.
#![cfg(all(
    feature = "amqp-transport",
    feature = "redrive",
    feature = "redis",
    feature = "sqlite"
))]

mod consumer_support;
mod store_contract;

use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;

use babel_idem::Envelope;
use babel_idem::envelope::{DeadLetter, DeadLetterReason};
use babel_idem::redrive::{RecordKind, Redrive, RedriveError, RedriveOptions, Selection};
use babel_idem::transport::AmqpTransport;
use lapin::options::{
    BasicGetOptions, BasicRejectOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Connection, ConnectionProperties};
use serde_json::{Value, json};
use store_contract::servers::{server_url, unique_suffix};

use babel_idem::Consumer;
use consumer_support::{
    QUIET, SeenLog, URN, eventually, python, python_consumes, python_publishes, recording_router,
    run_until_idle,
};

const AMQP_URL: &str = "BABEL_IDEM_AMQP_URL";

/// The Python peer of these tests: `tests/python/amqp_peer.py`.
const PEER: &str = "amqp_peer.py";

async fn peer(python: &Path, args: &[&str]) -> Value {
    let args = args.iter().map(|a| (*a).to_owned()).collect();
    consumer_support::peer(python, PEER, args, None).await
}

/// One test's queues on the broker, deleted on drop.
struct Queues {
    url: String,
    name: String,
}

impl Queues {
    fn new(url: &str) -> Self {
        Queues {
            url: url.to_owned(),
            name: format!("bi-redrive-{}", unique_suffix()),
        }
    }

    /// A queue of this test's own.
    fn named(&self, what: &str) -> String {
        format!("{}.{what}", self.name)
    }

    fn dlq(&self) -> String {
        self.named("dlq")
    }

    async fn transport(&self) -> AmqpTransport {
        AmqpTransport::connect(&self.url).await.unwrap()
    }

    /// Every message of `queue`, taken off it.
    async fn drain(&self, queue: &str) -> Vec<(BasicProperties, Vec<u8>)> {
        let connection = raw_connection(&self.url).await;
        let channel = connection.create_channel().await.unwrap();
        let mut messages = Vec::new();
        while let Ok(Some(message)) = channel
            .basic_get(queue.into(), BasicGetOptions { no_ack: true })
            .await
        {
            messages.push((message.delivery.properties, message.delivery.data));
        }
        messages
    }

    /// Whether `queue` exists.
    async fn exists(&self, queue: &str) -> bool {
        let connection = raw_connection(&self.url).await;
        let channel = connection.create_channel().await.unwrap();
        let passive = QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        };
        channel
            .queue_declare(queue.into(), passive, FieldTable::default())
            .await
            .is_ok()
    }

    async fn declare(&self, queue: &str, arguments: &[(&str, AMQPValue)]) {
        let connection = raw_connection(&self.url).await;
        let channel = connection.create_channel().await.unwrap();
        let mut table = FieldTable::default();
        for (key, value) in arguments {
            table.insert((*key).into(), value.clone());
        }
        channel
            .queue_declare(queue.into(), QueueDeclareOptions::durable(), table)
            .await
            .unwrap();
    }
}

impl Drop for Queues {
    fn drop(&mut self) {
        let (url, prefix) = (self.url.clone(), self.name.clone());
        let names: Vec<String> = [
            "",
            ".dlq",
            ".py.dlq",
            ".ours.dlq",
            ".py.to",
            ".ours.to",
            ".work",
        ]
        .iter()
        .map(|suffix| format!("{prefix}{suffix}"))
        .collect();
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async {
                let Ok(connection) =
                    Connection::connect(&url, ConnectionProperties::default()).await
                else {
                    return;
                };
                for name in names {
                    if let Ok(channel) = connection.create_channel().await {
                        let _ = channel
                            .queue_delete(name.as_str().into(), QueueDeleteOptions::default())
                            .await;
                    }
                }
                let _ = connection.close(200, "test done".into()).await;
            });
        })
        .join();
    }
}

async fn raw_connection(url: &str) -> Connection {
    Connection::connect(url, ConnectionProperties::default())
        .await
        .expect("connect to the test's broker")
}

fn header<'p>(properties: &'p BasicProperties, name: &str) -> Option<&'p AMQPValue> {
    properties.headers().as_ref()?.inner().get(name)
}

fn record(id: &str, queue: &str) -> Vec<u8> {
    let mut envelope = Envelope::new(URN, json!({"id": id}))
        .with_id(id)
        .with_queue(queue)
        .with_attempts(3);
    envelope.dead_letter = Some(DeadLetter::new(DeadLetterReason::Failed, queue, 3));
    envelope.to_vec()
}

fn id_of(body: &[u8]) -> String {
    let value: Value = serde_json::from_slice(body).unwrap();
    value["meta"]["id"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redriven_messages_equal_the_python_sdks_bodies_and_headers() {
    const TEST: &str = "redriven_messages_equal_the_python_sdks";
    let (Some(url), Some(python)) = (server_url(AMQP_URL, TEST), python(TEST)) else {
        return;
    };
    let queues = Queues::new(&url);
    let transport = queues.transport().await;
    let block = format!(
        r#"{{"reason":"failed","error":"boom","exception":"RuntimeError","failed_at":1796093299123,"original_queue":"{}","attempts":3,"lang":"python"}}"#,
        queues.name
    );
    let records = [
        format!(
            r#"{{"job":"{URN}","trace_id":"t-1","data":{{"price":2.50,"tiny":1e-7,"text":"\u00e9\/"}},"meta":{{"id":"a-1","queue":"q","lang":"go","schema_version":1,"created_at":1}},"attempts":3,"dead_letter":{block}}}"#
        ),
        format!(
            r#"{{"urn":"{URN}","trace_id":"t-2","data":{{}},"meta":{{"id":"a-2","queue":"q","lang":"php","schema_version":1,"created_at":1,"ts":2}},"dead_letter":{block}}}"#
        ),
    ];
    for bypass in [false, true] {
        let (python_dlq, ours_dlq) = (queues.named("py.dlq"), queues.named("ours.dlq"));
        let (python_to, ours_to) = (queues.named("py.to"), queues.named("ours.to"));
        for dlq in [&python_dlq, &ours_dlq] {
            for text in &records {
                transport.publish(dlq, text.as_bytes()).await.unwrap();
            }
        }
        let mut args = vec!["redrive", &url, &python_dlq, "--to", &python_to];
        if bypass {
            args.extend(["--bypass", "1"]);
        }
        let out = peer(&python, &args).await;
        assert_eq!(out["redriven"], 2, "{out}");
        let options = RedriveOptions::new().to(&ours_to).bypass(bypass);
        let report = transport.redrive(&ours_dlq, &options).await.unwrap();
        assert_eq!(report.moved, 2, "{report:?}");

        let (theirs, ours) = (queues.drain(&python_to).await, queues.drain(&ours_to).await);
        assert_eq!(theirs.len(), 2);
        for ((their_properties, their_body), (our_properties, our_body)) in theirs.iter().zip(&ours)
        {
            assert_eq!(
                String::from_utf8_lossy(our_body),
                String::from_utf8_lossy(their_body)
            );
            for name in [
                "x-attempts",
                "x-schema-version",
                "x-source-lang",
                "bq-replay-bypass",
            ] {
                assert_eq!(
                    header(our_properties, name).is_some(),
                    header(their_properties, name).is_some(),
                    "{name}"
                );
            }
            assert_eq!(our_properties.message_id(), their_properties.message_id());
            assert_eq!(our_properties.kind(), their_properties.kind());
        }
        assert!(queues.drain(&ours_dlq).await.is_empty());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_dead_letters_babel_idem_redrives_with_bypass_and_python_sees_replays() {
    const TEST: &str = "amqp_python_dead_letters_babel_idem_redrives";
    let (Some(url), Some(python)) = (server_url(AMQP_URL, TEST), python(TEST)) else {
        return;
    };
    let queues = Queues::new(&url);
    let queue = queues.name.clone();
    let sent = python_publishes(&python, PEER, &url, &queue, 3).await;
    let out = peer(&python, &["consume", &url, &queue, "0.5", "--fail", "1"]).await;
    assert!(out["received"].as_array().unwrap().is_empty(), "{out}");

    let transport = queues.transport().await;
    let looked = transport.dead_letters(&queues.dlq(), None).await.unwrap();
    assert_eq!(looked.len(), 3, "{looked:?}");
    let report = transport
        .redrive(&queues.dlq(), &RedriveOptions::new().bypass(true))
        .await
        .unwrap();
    assert_eq!(report.moved, 3, "{report:?}");

    let out = python_consumes(&python, PEER, &url, &queue).await;
    let received = out["received"].as_array().unwrap();
    assert_eq!(received.len(), 3, "{out}");
    let sent_ids: Vec<&str> = sent
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    for message in received {
        assert!(sent_ids.contains(&message["id"].as_str().unwrap()));
        assert_eq!(message["replay"], true, "{message}");
        assert_eq!(message["attempts"], 0, "{message}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn babel_idem_dead_letters_python_redrives_and_babel_idem_runs_them_again() {
    const TEST: &str = "amqp_babel_idem_dead_letters_python_redrives";
    let (Some(url), Some(python)) = (server_url(AMQP_URL, TEST), python(TEST)) else {
        return;
    };
    let queues = Queues::new(&url);
    let transport = AmqpTransport::builder()
        .reserve_wait(Duration::from_millis(50))
        .connect(&url)
        .await
        .unwrap();
    let mut sent = Vec::new();
    for n in 0..3 {
        let envelope = Envelope::new(URN, json!({"n": n})).with_queue(&queues.name);
        sent.push(envelope.meta.id.clone().unwrap());
        transport
            .publish(&queues.name, &envelope.to_vec())
            .await
            .unwrap();
    }
    let failing = Consumer::builder(
        recording_router(SeenLog::default(), true),
        transport.clone(),
        &queues.name,
    )
    .build()
    .unwrap();
    let report = run_until_idle(&failing, QUIET).await;
    assert_eq!(report.dead_lettered, 3, "{report:?}");

    let out = peer(&python, &["redrive", &url, &queues.dlq(), "--bypass", "1"]).await;
    assert_eq!(out["redriven"], 3, "{out}");

    let log = SeenLog::default();
    let consumer = Consumer::builder(
        recording_router(std::sync::Arc::clone(&log), false),
        transport,
        &queues.name,
    )
    .build()
    .unwrap();
    let report = run_until_idle(&consumer, QUIET).await;
    assert_eq!(report.acked, 3, "{report:?}");
    let seen = log.lock().unwrap().clone();
    let mut seen_ids: Vec<String> = seen.iter().map(|s| s.id.clone()).collect();
    seen_ids.sort();
    sent.sort();
    assert_eq!(seen_ids, sent);
    assert!(seen.iter().all(|s| s.attempts == 0 && s.replay), "{seen:?}");
}

#[tokio::test]
async fn messages_the_broker_dead_lettered_go_back_with_the_reason_from_x_death() {
    const TEST: &str = "messages_the_broker_dead_lettered";
    let Some(url) = server_url(AMQP_URL, TEST) else {
        return;
    };
    let queues = Queues::new(&url);
    let work = queues.named("work");
    queues.declare(&queues.dlq(), &[]).await;
    queues
        .declare(
            &work,
            &[
                ("x-dead-letter-exchange", AMQPValue::LongString("".into())),
                (
                    "x-dead-letter-routing-key",
                    AMQPValue::LongString(queues.dlq().as_str().into()),
                ),
            ],
        )
        .await;
    let transport = queues.transport().await;
    for n in 0..3 {
        let envelope = Envelope::new(URN, json!({"n": n}))
            .with_id(format!("x-{n}"))
            .with_queue(&work)
            .with_attempts(2);
        transport.publish(&work, &envelope.to_vec()).await.unwrap();
    }
    // A consumer rejects them: the broker moves them to the DLQ with x-death.
    let connection = raw_connection(&url).await;
    let channel = connection.create_channel().await.unwrap();
    while let Some(message) = channel
        .basic_get(work.as_str().into(), BasicGetOptions { no_ack: false })
        .await
        .unwrap()
    {
        channel
            .basic_reject(
                message.delivery.delivery_tag,
                BasicRejectOptions { requeue: false },
            )
            .await
            .unwrap();
    }
    eventually("the broker dead-lettered them", || async {
        transport
            .dead_letters(&queues.dlq(), None)
            .await
            .unwrap()
            .len()
            == 3
    })
    .await;
    let looked = transport.dead_letters(&queues.dlq(), None).await.unwrap();
    for record in &looked {
        assert_eq!(record.kind, RecordKind::Envelope);
        assert_eq!(record.reason, "rejected");
        assert_eq!(record.original_queue.as_deref(), Some(work.as_str()));
        assert!(record.failed_at.is_some_and(|at| at > 1_700_000_000_000));
    }
    let options = RedriveOptions::new().select(Selection::new().reason("rejected"));
    let report = transport.redrive(&queues.dlq(), &options).await.unwrap();
    assert_eq!(report.moved, 3, "{report:?}");
    let back = queues.drain(&work).await;
    assert_eq!(back.len(), 3);
    for (properties, body) in back {
        let value: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(value["attempts"], 0);
        assert!(header(&properties, "x-death").is_none());
    }
}

#[tokio::test]
async fn a_dry_run_and_looks_leave_the_dlq_as_it_was_and_max_is_honoured() {
    const TEST: &str = "amqp_a_dry_run_leaves_the_dlq";
    let Some(url) = server_url(AMQP_URL, TEST) else {
        return;
    };
    let queues = Queues::new(&url);
    let transport = queues.transport().await;
    let bodies: Vec<Vec<u8>> = (0..6)
        .map(|n| record(&format!("d-{n}"), &queues.name))
        .chain([b"not json".to_vec()])
        .collect();
    for body in &bodies {
        transport.publish(&queues.dlq(), body).await.unwrap();
    }
    let plan = transport
        .redrive(&queues.dlq(), &RedriveOptions::new().dry_run(true))
        .await
        .unwrap();
    assert_eq!((plan.would_move, plan.left, plan.moved), (6, 1, 0));
    let looked: Vec<Vec<u8>> = transport
        .dead_letters(&queues.dlq(), None)
        .await
        .unwrap()
        .into_iter()
        .map(|record| record.body)
        .collect();
    assert_eq!(looked, bodies, "same messages, same order");

    let report = transport
        .redrive(&queues.dlq(), &RedriveOptions::new().max(2))
        .await
        .unwrap();
    assert_eq!(report.moved, 2);
    let moved: Vec<String> = queues
        .drain(&queues.name)
        .await
        .iter()
        .map(|(_, b)| id_of(b))
        .collect();
    assert_eq!(moved, ["d-0", "d-1"]);
    let rest: Vec<Vec<u8>> = transport
        .dead_letters(&queues.dlq(), None)
        .await
        .unwrap()
        .into_iter()
        .map(|record| record.body)
        .collect();
    assert_eq!(rest, bodies[2..], "the undecodable body stays untouched");
}

#[tokio::test]
async fn a_missing_dlq_is_refused_and_not_created() {
    const TEST: &str = "a_missing_dlq_is_refused";
    let Some(url) = server_url(AMQP_URL, TEST) else {
        return;
    };
    let queues = Queues::new(&url);
    let transport = queues.transport().await;
    let error = transport
        .redrive(&queues.dlq(), &RedriveOptions::new())
        .await
        .unwrap_err();
    assert!(matches!(error, RedriveError::MissingQueue(_)), "{error}");
    assert!(!queues.exists(&queues.dlq()).await);
}

#[tokio::test]
async fn looking_at_a_quorum_dlq_with_a_delivery_limit_never_dead_letters_a_message() {
    const TEST: &str = "looking_at_a_quorum_dlq";
    let Some(url) = server_url(AMQP_URL, TEST) else {
        return;
    };
    let queues = Queues::new(&url);
    queues
        .declare(
            &queues.dlq(),
            &[
                ("x-queue-type", AMQPValue::LongString("quorum".into())),
                ("x-delivery-limit", AMQPValue::LongInt(1)),
            ],
        )
        .await;
    let transport = queues.transport().await;
    let ids: Vec<String> = (0..3).map(|n| format!("q-{n}")).collect();
    for id in &ids {
        transport
            .publish(&queues.dlq(), &record(id, &queues.name))
            .await
            .unwrap();
    }
    for look in 0..5 {
        let mut seen: Vec<String> = transport
            .dead_letters(&queues.dlq(), None)
            .await
            .unwrap()
            .iter()
            .map(|record| record.id.clone().unwrap())
            .collect();
        seen.sort();
        assert_eq!(seen, ids, "look {look}");
    }
    let plan = transport
        .redrive(&queues.dlq(), &RedriveOptions::new().dry_run(true))
        .await
        .unwrap();
    assert_eq!(plan.would_move, 3);
    let report = transport
        .redrive(&queues.dlq(), &RedriveOptions::new())
        .await
        .unwrap();
    assert_eq!(report.moved, 3);
}

/// A TCP proxy to the broker, owned by one test: `stop` drops every
/// connection through it and stops listening, so the broker is unreachable.
struct Proxy {
    port: u16,
    tasks: std::sync::Arc<std::sync::Mutex<Vec<tokio::task::AbortHandle>>>,
}

impl Proxy {
    async fn start(upstream: String) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let tasks: std::sync::Arc<std::sync::Mutex<Vec<tokio::task::AbortHandle>>> =
            std::sync::Arc::default();
        let registry = std::sync::Arc::clone(&tasks);
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
        tasks.lock().unwrap().push(accept.abort_handle());
        Proxy { port, tasks }
    }

    fn stop(&self) {
        self.tasks
            .lock()
            .unwrap()
            .drain(..)
            .for_each(|task| task.abort());
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_lost_mid_run_stops_the_redrive_with_what_moved_and_loses_nothing() {
    const TEST: &str = "amqp_a_broker_lost_mid_run";
    let Some(url) = server_url(AMQP_URL, TEST) else {
        return;
    };
    let queues = Queues::new(&url);
    let direct = queues.transport().await;
    let total = 300;
    let ids: Vec<String> = (0..total).map(|n| format!("l-{n}")).collect();
    let records: Vec<Vec<u8>> = ids.iter().map(|id| record(id, &queues.name)).collect();
    direct.publish_many(&queues.dlq(), &records).await.unwrap();

    let uri: lapin::uri::AMQPUri = url.parse().unwrap();
    let proxy = Proxy::start(format!("{}:{}", uri.authority.host, uri.authority.port)).await;
    let proxied = url.replacen(
        &format!(":{}", uri.authority.port),
        &format!(":{}", proxy.port),
        1,
    );
    let transport = AmqpTransport::builder()
        .timeout(Duration::from_secs(1))
        .reconnect_attempts(0)
        .connect(&proxied)
        .await
        .unwrap();
    let dlq = queues.dlq();
    let run = tokio::spawn(async move {
        transport
            .redrive(&dlq, &RedriveOptions::new().rate(100))
            .await
    });
    eventually("some messages moved", || async {
        direct
            .dead_letters(&queues.name, None)
            .await
            .map_or(0, |m| m.len())
            >= 20
    })
    .await;
    proxy.stop();
    let error = run
        .await
        .unwrap()
        .expect_err("the broker went away mid-run");
    let RedriveError::Stopped { report, .. } = &error else {
        panic!("stopped with a report: {error}");
    };
    assert!(report.moved >= 20 && report.moved < total, "{report:?}");

    // The broker requeues what the lost connection held: every message is
    // in the DLQ or on the queue (both only if cut between confirm and ack).
    eventually("every message is back", || async {
        let found: HashSet<String> = direct
            .dead_letters(&queues.dlq(), None)
            .await
            .unwrap()
            .into_iter()
            .chain(direct.dead_letters(&queues.name, None).await.unwrap())
            .filter_map(|record| record.id)
            .collect();
        found.len() == total
    })
    .await;
    let again = direct
        .redrive(&queues.dlq(), &RedriveOptions::new())
        .await
        .unwrap();
    assert!(again.moved <= total - report.moved, "{again:?}");
    let work: HashSet<String> = direct
        .dead_letters(&queues.name, None)
        .await
        .unwrap()
        .into_iter()
        .filter_map(|record| record.id)
        .collect();
    assert_eq!(work, ids.into_iter().collect::<HashSet<_>>());
}

// ---------------------------------------------------------------- numbers beyond a float

/// Records the Python SDK dead-letters on RabbitMQ holding numbers no
/// `f64` holds: poison bodies it splices as written, two without identity
/// and an envelope (the family refuses a number that is not a finite
/// double). Each is read as the poison it is, the envelope with its id and
/// URN; none is redriven as an envelope; each body goes back byte for byte
/// when asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_records_python_writes_with_numbers_beyond_a_float_are_read_and_give_back_their_bodies()
 {
    const TEST: &str = "amqp_records_with_numbers_beyond_a_float";
    let (Some(url), Some(python)) = (server_url(AMQP_URL, TEST), python(TEST)) else {
        return;
    };
    let queues = Queues::new(&url);
    let queue = queues.name.clone();
    let transport = queues.transport().await;
    let huge = format!("1{}", "7".repeat(399));
    let bodies = [
        r#"{"order":"p-1","amount":1e400}"#.to_owned(),
        format!(r#"{{"order": "p-2", "n": {huge}, "n": -1E+400, "x": [2.5e-400]}}"#),
        format!(
            r#"{{"job":"{URN}","trace_id":"t-big","data":{{"n":{huge}}},"meta":{{"id":"big-1","queue":"{queue}","lang":"rust","schema_version":1,"created_at":1}},"attempts":0}}"#
        ),
    ];
    for body in &bodies {
        transport.publish(&queue, body.as_bytes()).await.unwrap();
    }
    peer(&python, &["consume", &url, &queue, "0.5"]).await;
    eventually("Python dead-lettered every message", || async {
        transport
            .dead_letters(&queues.dlq(), None)
            .await
            .is_ok_and(|records| records.len() == 3)
    })
    .await;

    let looked = transport.dead_letters(&queues.dlq(), None).await.unwrap();
    for body in &bodies {
        let kept = &body.as_bytes()[..body.len() - 1];
        assert!(
            looked.iter().any(|record| record.body.starts_with(kept)),
            "{body} spliced as written"
        );
    }
    for record in &looked {
        let body = String::from_utf8_lossy(&record.body);
        assert_eq!(record.kind, RecordKind::Poison, "{body}");
        assert_eq!(record.reason, "poison", "{body}");
        assert_eq!(
            record.original_queue.as_deref(),
            Some(queue.as_str()),
            "{body}"
        );
        assert!(record.error.is_some(), "{body}");
    }
    let envelope = looked
        .iter()
        .find(|record| record.id.as_deref() == Some("big-1"))
        .expect("the envelope's id read from its record");
    assert_eq!(envelope.urn.as_deref(), Some(URN));

    let report = transport
        .redrive(&queues.dlq(), &RedriveOptions::new())
        .await
        .unwrap();
    assert_eq!((report.moved, report.left), (0, 3), "{report:?}");
    let report = transport
        .redrive(&queues.dlq(), &RedriveOptions::new().include_poison(true))
        .await
        .unwrap();
    assert_eq!((report.moved, report.left), (3, 0), "{report:?}");
    let mut back: Vec<Vec<u8>> = queues
        .drain(&queue)
        .await
        .into_iter()
        .map(|(_, body)| body)
        .collect();
    back.sort();
    let mut sent: Vec<Vec<u8>> = bodies
        .iter()
        .map(|body| body.clone().into_bytes())
        .collect();
    sent.sort();
    assert_eq!(back, sent);
}
