//! Payload schemas on consume, end to end: a `Consumer` with typed handlers
//! and a router whose schemas come from a `Registry` (the folder
//! `tests/fixtures/schema_registry`), on Redis (`RedisTransport`) and on
//! RabbitMQ (`AmqpTransport`), against the BabelQueue Python SDK (pinned by
//! `.ci/python.sh`): it produces valid payloads, payloads that break their
//! URN's schema and payloads only the message type refuses; each valid one
//! runs once, each invalid one reaches the DLQ after 3 attempts with the
//! family's `dead_letter` block, which the SDK reads back; the SDK's own
//! worker (`babelqueue.schema.wrap`) writes the same block for the same
//! messages.
//!
//! Environment: `BABEL_IDEM_REDIS_URL`, `BABEL_IDEM_AMQP_URL` (the shared
//! servers), `BABEL_IDEM_PYTHON` (the peer's virtualenv python); without them
//! a test prints `skipped:`, and with `BABEL_IDEM_REQUIRE_SERVERS=1` it fails
//! instead. Every test uses queues of its own (a unique name), deleted when
//! it ends.
#![cfg(all(
    feature = "schema",
    feature = "redis",
    feature = "sqlite",
    any(feature = "redis-transport", feature = "amqp-transport")
))]

mod consumer_support;
mod store_contract;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use babel_idem::consumer::ConsumerReport;
use babel_idem::schema::Registry;
use babel_idem::transport::Transport;
use babel_idem::{Consumer, Delivery, Message, Router};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use consumer_support::{QUIET, peer, python, run_until_idle};
use store_contract::servers::server_url;

/// The Python peer of these tests: `tests/python/schema_worker_peer.py`.
const PEER: &str = "schema_worker_peer.py";

const CREATED: &str = "urn:babel:orders:created";
/// A URN the registry has no schema for: never checked.
const NOTED: &str = "urn:babel:orders:noted";

/// The registry the router and the Python worker both read.
fn registry_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/schema_registry/registry.json")
}

#[derive(Debug, Serialize, Deserialize, Message)]
#[message(urn = "urn:babel:orders:created")]
struct OrderCreated {
    order_id: u64,
    currency: String,
    #[serde(default)]
    lines: Vec<Line>,
}

/// `qty` is not in the schema: only the type says what it must be.
#[derive(Debug, Serialize, Deserialize)]
struct Line {
    sku: String,
    qty: u32,
}

#[derive(Debug, Serialize, Deserialize, Message)]
#[message(urn = "urn:babel:orders:noted")]
struct OrderNoted {
    order_id: u64,
    text: String,
}

// ---------------------------------------------------------------- the messages

/// One message the Python SDK produces, and what must become of it.
struct Case {
    urn: &'static str,
    /// The data as JSON text: its member order is what reaches the wire.
    data: String,
    /// `None`: it runs once; else the violation (`path: reason`) its
    /// dead-letter block names.
    refused_at: Option<String>,
}

fn valid(urn: &'static str, data: String) -> Case {
    Case {
        urn,
        data,
        refused_at: None,
    }
}

fn refused(data: &str, violation: &str) -> Case {
    Case {
        urn: CREATED,
        data: data.to_owned(),
        refused_at: Some(violation.to_owned()),
    }
}

/// Payloads that break the registry's schema for `orders:created`, one rule
/// each; the one with `zeta` first is refused for `zeta` only when the data
/// is read in its document order (sorted, `order_id` would come first).
fn schema_invalid() -> Vec<Case> {
    vec![
        refused(r#"{"currency": "EUR"}"#, "order_id: missing_required"),
        refused(
            r#"{"order_id": 0, "currency": "EUR"}"#,
            "order_id: below_minimum",
        ),
        refused(
            r#"{"order_id": 3, "currency": "GBP"}"#,
            "currency: not_in_enum",
        ),
        refused(
            r#"{"zeta": true, "order_id": "x", "currency": "EUR"}"#,
            "zeta: additional_not_allowed",
        ),
        refused(
            r#"{"order_id": 4, "currency": "USD", "lines": [{"sku": "a", "qty": 1}, {"sku": ""}]}"#,
            "lines[1].sku: below_min_length",
        ),
        refused(
            r#"{"order_id": 4.5, "currency": "USD"}"#,
            "order_id: not_an_integer",
        ),
    ]
}

/// Payloads the schema accepts and `OrderCreated` refuses: `qty` is outside
/// the schema, so only serde catches them.
fn undeserializable() -> Vec<Case> {
    vec![
        refused(
            r#"{"order_id": 5, "currency": "EUR", "lines": [{"sku": "b", "qty": "two"}]}"#,
            r#"lines[0].qty: invalid type: string "two", expected u32"#,
        ),
        refused(
            r#"{"order_id": 6, "currency": "TRY", "lines": [{"sku": "c", "qty": -1}]}"#,
            "lines[0].qty: invalid value: integer `-1`, expected u32",
        ),
        refused(
            r#"{"order_id": 7, "currency": "USD", "lines": [{"sku": "d"}]}"#,
            "lines[0]: missing field `qty`",
        ),
    ]
}

/// 20 valid `orders:created`, 5 `orders:noted` (no schema: members a schema
/// would refuse are not checked), and the invalid ones between them.
fn cases() -> Vec<Case> {
    let mut cases: Vec<Case> = (1..=20)
        .map(|n| {
            let data = format!(
                r#"{{"order_id": {n}, "currency": "EUR", "lines": [{{"sku": "s-{n}", "qty": {n}}}]}}"#
            );
            valid(CREATED, data)
        })
        .collect();
    for n in 1..=5 {
        let data = format!(r#"{{"order_id": {n}, "text": "note {n}", "unlisted": [1, "x"]}}"#);
        cases.insert(n * 3, valid(NOTED, data));
    }
    for (at, case) in schema_invalid()
        .into_iter()
        .chain(undeserializable())
        .enumerate()
    {
        cases.insert(at * 3 + 1, case);
    }
    cases
}

/// The dead-letter `error` of a message of `orders:created` refused at
/// `violation`: the Python SDK's `InvalidPayloadError` text.
fn error_text(violation: &str) -> String {
    format!("data for '{CREATED}' does not match its URN schema: {violation}")
}

// ---------------------------------------------------------------- the peer

/// Which broker the Python SDK talks to, and where.
struct Broker {
    /// The peer's name for it: `redis` or `amqp`.
    name: &'static str,
    url: String,
}

impl Broker {
    async fn peer(
        &self,
        python: &Path,
        command: &str,
        args: &[&str],
        stdin: Option<Value>,
    ) -> Value {
        let args = [command, self.name, self.url.as_str()]
            .iter()
            .chain(args)
            .map(|arg| (*arg).to_owned())
            .collect();
        peer(python, PEER, args, stdin).await
    }

    /// The Python SDK publishes `cases` to `queue` in order; their ids.
    async fn publish(&self, python: &Path, queue: &str, cases: &[Case]) -> Vec<String> {
        let messages: Vec<Value> = cases
            .iter()
            .map(|case| json!({"urn": case.urn, "data": case.data}))
            .collect();
        let out = self
            .peer(
                python,
                "publish",
                &[queue],
                Some(json!({"messages": messages})),
            )
            .await;
        let sent = out["sent"].as_array().expect("the peer says what it sent");
        assert_eq!(sent.len(), cases.len(), "{out}");
        sent.iter()
            .zip(cases)
            .map(|(sent, case)| {
                assert_eq!(sent["urn"], case.urn);
                sent["id"].as_str().unwrap().to_owned()
            })
            .collect()
    }

    /// `dlq` as the Python SDK reads it: its redrive plan and its records.
    async fn dead_letters(&self, python: &Path, dlq: &str) -> (Vec<Value>, Vec<Value>) {
        let out = self.peer(python, "dead-letters", &[dlq], None).await;
        let list = |name: &str| out[name].as_array().cloned().unwrap_or_default();
        (list("items"), list("records"))
    }

    /// The Python SDK's worker, its handler wrapped in the registry's
    /// schema check, runs `queue` until it is idle; the ids it handled.
    async fn python_worker(&self, python: &Path, queue: &str) -> Vec<Value> {
        let registry = registry_path();
        let registry = registry.to_str().unwrap();
        let out = self
            .peer(python, "worker", &[queue, registry, CREATED, "1.0"], None)
            .await;
        out["handled"].as_array().cloned().unwrap_or_default()
    }
}

// ---------------------------------------------------------------- the worker

/// Each typed handler run: the message's id and what it was handed,
/// encoded again.
#[derive(Clone, Default)]
struct Runs(Arc<Mutex<Vec<(String, Value)>>>);

impl Runs {
    fn record(&self, message: &impl Serialize, delivery: &Delivery) -> Ready {
        let id = delivery.meta().and_then(|meta| meta.id.clone());
        let message = serde_json::to_value(message).unwrap();
        self.0
            .lock()
            .unwrap()
            .push((id.unwrap_or_default(), message));
        std::future::ready(Ok(()))
    }

    /// How many times each id ran, and what it was handed.
    fn by_id(&self) -> HashMap<String, (usize, Value)> {
        let mut by_id: HashMap<String, (usize, Value)> = HashMap::new();
        for (id, message) in self.0.lock().unwrap().iter() {
            by_id.entry(id.clone()).or_insert((0, message.clone())).0 += 1;
        }
        by_id
    }
}

type Ready = std::future::Ready<Result<(), anyhow::Error>>;

/// Typed handlers of both URNs that record their runs, 3 attempts, and the
/// registry's schemas.
fn router(runs: &Runs) -> Router {
    let (created, noted) = (runs.clone(), runs.clone());
    Router::builder()
        .handle(move |order: OrderCreated, delivery: Delivery| created.record(&order, &delivery))
        .handle(move |note: OrderNoted, delivery: Delivery| noted.record(&note, &delivery))
        .max_attempts(3)
        .schemas(Registry::open(registry_path()).expect("the fixture registry opens"))
        .build()
        .unwrap()
}

/// Runs a consumer of `queue` on `transport` with [`router`] until it is idle.
async fn babel_idem_worker<T: Transport>(transport: T, queue: &str, runs: &Runs) -> ConsumerReport {
    let consumer = Consumer::builder(router(runs), transport, queue)
        .concurrency(4)
        .build()
        .unwrap();
    run_until_idle(&consumer, QUIET).await
}

/// The Python SDK produces [`cases`] on `queue`; a babel-idem worker on
/// `transport` runs each valid one once and dead-letters each invalid one
/// after 3 attempts, never running its handler; the SDK reads the DLQ back
/// with the family's block on each record. Nothing is lost.
async fn valid_run_once_and_invalid_reach_the_dlq<T: Transport>(
    broker: &Broker,
    python: &Path,
    transport: T,
    queue: &str,
    dlq: &str,
) {
    let cases = cases();
    let ids = broker.publish(python, queue, &cases).await;
    let (valid, invalid): (Vec<_>, Vec<_>) = ids
        .iter()
        .zip(&cases)
        .partition(|(_, case)| case.refused_at.is_none());
    assert_eq!((valid.len(), invalid.len()), (25, 9));

    let runs = Runs::default();
    let report = babel_idem_worker(transport, queue, &runs).await;

    assert_eq!(
        (
            report.acked,
            report.retried,
            report.dead_lettered,
            report.released
        ),
        (25, 18, 9, 0),
        "{report:?}"
    );
    assert_eq!(report.delivered, 25 + 9 * 3, "{report:?}");
    let ran = runs.by_id();
    for (id, case) in &valid {
        let (times, handed) = &ran[*id];
        assert_eq!(*times, 1, "{} ran once", case.data);
        let mut sent: Value = serde_json::from_str(&case.data).unwrap();
        // A member the type does not name is dropped by the decode.
        sent.as_object_mut().unwrap().remove("unlisted");
        assert_eq!(*handed, sent, "the handler got the data as sent");
    }
    for (id, case) in &invalid {
        assert!(!ran.contains_key(*id), "{} reached its handler", case.data);
    }
    assert_eq!(ran.len(), valid.len(), "no handler ran for anything else");

    let (items, records) = broker.dead_letters(python, dlq).await;
    assert_eq!(items.len(), invalid.len(), "{items:?}");
    for item in &items {
        assert_eq!(item["reason"], "failed", "{item}");
        assert_eq!(item["urn"], CREATED, "{item}");
        assert_eq!(item["to"], queue, "{item}");
    }
    assert_eq!(records.len(), invalid.len(), "{records:?}");
    let refused: HashMap<&str, &Case> = invalid
        .iter()
        .map(|(id, case)| (id.as_str(), *case))
        .collect();
    for record in &records {
        let id = record["meta"]["id"].as_str().unwrap();
        let case = refused[id];
        let violation = case.refused_at.as_deref().unwrap();
        let block = &record["dead_letter"];
        assert_eq!(block["reason"], "failed", "{record}");
        assert_eq!(block["exception"], "InvalidPayloadError", "{record}");
        assert_eq!(block["error"], error_text(violation), "{record}");
        assert_eq!(block["attempts"], 3, "{record}");
        assert_eq!(block["original_queue"], queue, "{record}");
        assert_eq!(block["lang"], "rust", "{record}");
        assert_eq!(record["attempts"], 3, "{record}");
        let sent: Value = serde_json::from_str(&case.data).unwrap();
        assert_eq!(record["data"], sent, "the record keeps the data as sent");
    }
}

/// The Python SDK produces every schema-invalid message twice, once to a
/// queue a babel-idem worker runs and once to a queue its own worker runs
/// with `babelqueue.schema.wrap` over the same registry; both dead-letter
/// each with the same `reason`, `exception`, `error` and `attempts`, and
/// neither runs a handler.
async fn the_dlq_block_is_the_python_workers<T: Transport>(
    broker: &Broker,
    python: &Path,
    transport: T,
    (ours, ours_dlq): (&str, &str),
    (theirs, their_dlq): (&str, &str),
) {
    let cases = schema_invalid();
    broker.publish(python, ours, &cases).await;
    broker.publish(python, theirs, &cases).await;

    let runs = Runs::default();
    let report = babel_idem_worker(transport, ours, &runs).await;
    assert_eq!(report.dead_lettered, 6, "{report:?}");
    assert!(runs.by_id().is_empty());
    let handled = broker.python_worker(python, theirs).await;
    assert!(handled.is_empty(), "Python ran {handled:?}");

    let by_data = |records: Vec<Value>| -> HashMap<String, Value> {
        records
            .into_iter()
            .map(|record| (record["data"].to_string(), record["dead_letter"].clone()))
            .collect()
    };
    let (_, ours) = broker.dead_letters(python, ours_dlq).await;
    let (_, theirs) = broker.dead_letters(python, their_dlq).await;
    let (ours, theirs) = (by_data(ours), by_data(theirs));
    assert_eq!((ours.len(), theirs.len()), (6, 6), "{ours:?} {theirs:?}");
    for case in &cases {
        let data = serde_json::from_str::<Value>(&case.data)
            .unwrap()
            .to_string();
        let (block, python_block) = (&ours[&data], &theirs[&data]);
        for field in ["reason", "exception", "error", "attempts"] {
            assert_eq!(
                block[field], python_block[field],
                "{field} of {}: ours {block}, Python's {python_block}",
                case.data
            );
        }
        assert_eq!(
            block["error"],
            error_text(case.refused_at.as_deref().unwrap())
        );
        assert_eq!(python_block["lang"], "python");
    }
}

// ---------------------------------------------------------------- Redis

#[cfg(feature = "redis-transport")]
mod on_redis {
    use super::*;
    use consumer_support::redis_queue::Queue;
    use store_contract::servers::REDIS_URL;

    fn broker(url: &str) -> Broker {
        Broker {
            name: "redis",
            url: url.to_owned(),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn valid_payloads_run_once_and_invalid_ones_reach_the_dlq_as_python_reads_it() {
        const TEST: &str = "redis_valid_payloads_run_once_and_invalid_ones_reach_the_dlq";
        let (Some(url), Some(python)) = (server_url(REDIS_URL, TEST), python(TEST)) else {
            return;
        };
        let queue = Queue::new(&url);
        valid_run_once_and_invalid_reach_the_dlq(
            &broker(&url),
            &python,
            queue.transport().await,
            &queue.name,
            &queue.dlq(),
        )
        .await;
        assert!(queue.drained().await);
        assert_eq!(queue.len(&queue.dlq()).await, 0, "the reader took them");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_invalid_payload_is_dead_lettered_with_the_python_workers_block() {
        const TEST: &str =
            "redis_an_invalid_payload_is_dead_lettered_with_the_python_workers_block";
        let (Some(url), Some(python)) = (server_url(REDIS_URL, TEST), python(TEST)) else {
            return;
        };
        let (ours, theirs) = (Queue::new(&url), Queue::new(&url));
        the_dlq_block_is_the_python_workers(
            &broker(&url),
            &python,
            ours.transport().await,
            (&ours.name, &ours.dlq()),
            (&theirs.name, &theirs.dlq()),
        )
        .await;
        assert!(ours.drained().await && theirs.drained().await);
    }
}

// ---------------------------------------------------------------- RabbitMQ

#[cfg(feature = "amqp-transport")]
mod on_rabbitmq {
    use super::*;
    use consumer_support::amqp_queue::{AMQP_URL, Queue};

    fn broker(url: &str) -> Broker {
        Broker {
            name: "amqp",
            url: url.to_owned(),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn valid_payloads_run_once_and_invalid_ones_reach_the_dlq_as_python_reads_it() {
        const TEST: &str = "amqp_valid_payloads_run_once_and_invalid_ones_reach_the_dlq";
        let (Some(url), Some(python)) = (server_url(AMQP_URL, TEST), python(TEST)) else {
            return;
        };
        let queue = Queue::new(&url);
        let transport = queue.transport(8).await;
        valid_run_once_and_invalid_reach_the_dlq(
            &broker(&url),
            &python,
            transport.clone(),
            &queue.name,
            &queue.dlq(),
        )
        .await;
        transport.close().await;
        assert_eq!(queue.ready(&queue.name).await, 0);
        assert_eq!(queue.ready(&queue.dlq()).await, 0, "the reader took them");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_invalid_payload_is_dead_lettered_with_the_python_workers_block() {
        const TEST: &str = "amqp_an_invalid_payload_is_dead_lettered_with_the_python_workers_block";
        let (Some(url), Some(python)) = (server_url(AMQP_URL, TEST), python(TEST)) else {
            return;
        };
        let (ours, theirs) = (Queue::new(&url), Queue::new(&url));
        let transport = ours.transport(8).await;
        the_dlq_block_is_the_python_workers(
            &broker(&url),
            &python,
            transport.clone(),
            (&ours.name, &ours.dlq()),
            (&theirs.name, &theirs.dlq()),
        )
        .await;
        transport.close().await;
        assert_eq!(ours.ready(&ours.name).await, 0);
        assert_eq!(theirs.ready(&theirs.name).await, 0);
    }
}
