//! What the consumer tests share, whatever the broker: the Python peer and
//! the checks of what it sent, received and wrote, patience, the recording
//! and the effect counting routers, the shared seen-set and parked-claim
//! scenarios, the start-up errors. A module of the test crates that `mod` it.
#![allow(dead_code, unreachable_pub)]

#[cfg(feature = "amqp-transport")]
pub mod amqp_queue;
#[cfg(feature = "redis-transport")]
pub mod redis_queue;

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use babel_idem::consumer::{ConsumerReport, is_replay};
use babel_idem::guard::fence;
use babel_idem::store::{Claim, ClaimToken, RedisStore};
use babel_idem::transport::{Transport, TransportError};
use babel_idem::{
    ClaimStore, Consumer, Delivery, Envelope, Guard, InMemoryStore, Router, Store, StoreError,
    run_once, urn,
};
use redis::AsyncCommands;
use serde_json::{Value, json};

pub const URN: &str = "urn:babel:interop:created";

/// The longest any test waits for a condition before it fails (never a
/// timing assertion: only a guard against hanging forever).
pub const PATIENCE: Duration = Duration::from_secs(120);

/// How long a consumer must stay idle (nothing reserved, nothing in flight)
/// before a test stops it as drained. Longer than any pause between two
/// deliveries under load: a shorter one could stop a consumer that still has
/// work, e.g. before its first reserve returned.
pub const QUIET: Duration = Duration::from_secs(2);

#[path = "../support/python.rs"]
mod python_peer;
// A test crate may use one of the two only.
#[allow(unused_imports)]
pub use python_peer::{peer, python};

/// Waits until `condition` holds (polling), failing after [`PATIENCE`].
pub async fn eventually<F, Fut>(what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let give_up = tokio::time::Instant::now() + PATIENCE;
    while !condition().await {
        assert!(
            tokio::time::Instant::now() < give_up,
            "gave up waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Runs `consumer` until it has been idle for `quiet`.
pub async fn run_until_idle<T: Transport>(
    consumer: &Consumer<T>,
    quiet: Duration,
) -> ConsumerReport {
    let progress = consumer.progress();
    tokio::time::timeout(PATIENCE, consumer.run_until(progress.idle_for(quiet)))
        .await
        .expect("the consumer drains the queue")
}

/// The `traceparent` the Python peer publishes beside each message.
pub const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// The Python peer `script` publishes `count` messages to `queue` with a
/// [`TRACEPARENT`] header each; what it sent (`id`, `urn`, `data` each).
pub async fn python_publishes(
    python: &Path,
    script: &str,
    url: &str,
    queue: &str,
    count: u64,
) -> Value {
    let args = ["publish", url, queue, &count.to_string(), "--header"]
        .map(str::to_owned)
        .into_iter()
        .chain([format!("traceparent={TRACEPARENT}")])
        .collect();
    peer(python, script, args, None).await
}

/// The Python peer `script` consumes `queue` as a worker until it is idle;
/// its answer: `processed`, and `received` (what each handler run saw).
pub async fn python_consumes(python: &Path, script: &str, url: &str, queue: &str) -> Value {
    let args = ["consume", url, queue, "0.5"].map(str::to_owned).to_vec();
    peer(python, script, args, None).await
}

/// What a handler saw, kept for the assertions.
#[derive(Debug, Clone, PartialEq)]
pub struct Seen {
    pub id: String,
    pub urn: String,
    pub data: Value,
    pub attempts: u64,
    pub headers: BTreeMap<String, String>,
    pub replay: bool,
}

pub type SeenLog = Arc<Mutex<Vec<Seen>>>;

/// A router whose one handler records every delivery it runs, and fails it
/// when `fail` says so; a failed delivery is tried 3 times.
pub fn recording_router(log: SeenLog, fail: bool) -> Router {
    Router::builder()
        .route(
            urn!("urn:babel:interop:created"),
            move |env: Envelope, delivery: Delivery| {
                log.lock().unwrap().push(Seen {
                    id: env.meta.id.clone().unwrap_or_default(),
                    urn: env.job.clone(),
                    data: Value::Object(env.data.clone()),
                    attempts: delivery.attempts(),
                    headers: delivery
                        .headers()
                        .map(|(n, v)| (n.to_owned(), v.to_owned()))
                        .collect(),
                    replay: is_replay(),
                });
                async move {
                    if fail {
                        return Err(std::io::Error::other("payment gateway timeout"));
                    }
                    Ok(())
                }
            },
        )
        .max_attempts(3)
        .build()
        .unwrap()
}

/// Checks that the handler saw each message the Python peer `sent` (as
/// [`python_publishes`] answers) once, with its URN, data and
/// [`TRACEPARENT`], not as a replay; what it saw of each, in the order sent.
pub fn seen_as_python_sent<'s>(sent: &Value, seen: &'s [Seen]) -> Vec<&'s Seen> {
    let sent = sent.as_array().unwrap();
    assert_eq!(seen.len(), sent.len(), "one run a message: {seen:?}");
    let by_id: HashMap<&str, &Seen> = seen.iter().map(|s| (s.id.as_str(), s)).collect();
    sent.iter()
        .map(|message| {
            let got = by_id[message["id"].as_str().unwrap()];
            assert_eq!(got.urn, message["urn"].as_str().unwrap());
            assert_eq!(got.data, message["data"]);
            assert_eq!(
                got.headers.get("traceparent").map(String::as_str),
                Some(TRACEPARENT)
            );
            assert!(!got.replay);
            got
        })
        .collect()
}

/// Checks that the Python worker's answer `out` (as [`python_consumes`]
/// answers) holds each of `sent` once, with its URN and data, written by Rust
/// with no attempt spent; what it received of each, by id.
pub fn python_received<'o>(out: &'o Value, sent: &[&Envelope]) -> HashMap<&'o str, &'o Value> {
    let received = out["received"].as_array().unwrap();
    assert_eq!(received.len(), sent.len(), "{out}");
    let by_id: HashMap<&str, &Value> = received
        .iter()
        .map(|r| (r["id"].as_str().unwrap(), r))
        .collect();
    for envelope in sent {
        let got = by_id[envelope.meta.id.as_deref().unwrap()];
        assert_eq!(got["urn"], URN);
        assert_eq!(got["data"], Value::Object(envelope.data.clone()));
        assert_eq!(got["lang"], "rust");
        assert_eq!(got["attempts"], 0);
    }
    by_id
}

/// Checks each dead-letter record of `records` against the poison record
/// the Python peer `script` writes for the same body and block, byte for
/// byte: one record a body of `originals`, in order, each a `poison` record
/// of `queue`.
pub async fn assert_poison_records_as_python_writes(
    python: &Path,
    script: &str,
    queue: &str,
    originals: &[Vec<u8>],
    records: &[Vec<u8>],
) {
    assert_eq!(records.len(), originals.len());
    for (original, record) in originals.iter().zip(records) {
        let block_json = dead_letter_block(record);
        let block: Value = serde_json::from_str(&block_json).unwrap();
        assert_eq!(
            block["reason"],
            "poison",
            "{}",
            String::from_utf8_lossy(record)
        );
        assert_eq!(block["original_queue"], queue);
        let python_record = peer(
            python,
            script,
            vec!["poison-record".into()],
            Some(json!({"body": original, "block_json": block_json})),
        )
        .await;
        let python_record: Vec<u8> =
            serde_json::from_value(python_record["record"].clone()).unwrap();
        assert_eq!(
            &python_record,
            record,
            "the record of {:?} differs from Python's:\n ours: {}",
            String::from_utf8_lossy(original),
            String::from_utf8_lossy(record)
        );
    }
}

pub fn envelope_with_id(id: &str, queue: &str, n: u64) -> Envelope {
    Envelope::new(URN, json!({"n": n}))
        .with_id(id)
        .with_queue(queue)
}

/// A router whose handler, guarded by `store`, counts its effect per id in
/// the Redis hash `effects` (HINCRBY), as a side effect another process can see.
pub fn effect_router<S: Store + Clone + 'static>(store: S, url: &str, effects: String) -> Router {
    let client = redis::Client::open(url).unwrap();
    Router::builder()
        .route(urn!("urn:babel:interop:created"), move |env: Envelope| {
            let (store, client, effects) = (store.clone(), client.clone(), effects.clone());
            async move {
                run_once(store, &env, async {
                    let mut raw = client.get_multiplexed_async_connection().await?;
                    let id = env.meta.id.clone().unwrap_or_default();
                    let _: i64 = raw.hincr(&effects, id, 1).await?;
                    Ok::<(), anyhow::Error>(())
                })
                .await
            }
        })
        .build()
        .unwrap()
}

/// A Python and a Rust worker on one queue with one seen-set on a Redis
/// server (the Go layout, `<prefix><id>` = "1"), each counting its effects in
/// one Redis hash: 900 messages, then 100 redeliveries of the first 100 ids,
/// published once those ids have their effect (the seen-set is post-success
/// dedupe, not a lock: a redelivery taken while its original still runs in
/// the other worker would run too). Every id must run once, by either worker.
pub struct SharedSeenSet {
    /// The 900 ids.
    pub ids: Vec<String>,
    /// The seen-set's key prefix, under the queue's name.
    pub seen_prefix: String,
    /// The Redis hash of the effects: a count per id.
    pub effects: String,
    /// The Redis server of the seen-set and the effects.
    pub redis_url: String,
}

impl SharedSeenSet {
    /// How many deliveries the workers get in all: the 900 and the 100 again.
    pub const DELIVERIES: u64 = 1000;

    /// The scenario's names for `queue`, its seen-set and effects on the
    /// Redis server `redis_url`.
    pub fn new(queue: &str, redis_url: &str) -> Self {
        SharedSeenSet {
            ids: (0..900).map(|n| format!("mixed-{n}")).collect(),
            seen_prefix: format!("{queue}:bq:idemp:"),
            effects: format!("{queue}:effects"),
            redis_url: redis_url.to_owned(),
        }
    }

    /// The 900 bodies, for `queue`.
    pub fn bodies(&self, queue: &str) -> Vec<Vec<u8>> {
        self.ids
            .iter()
            .enumerate()
            .map(|(n, id)| envelope_with_id(id, queue, n as u64).to_vec())
            .collect()
    }

    /// Waits until the first 100 ids have their effect; then their
    /// redeliveries, for `queue`.
    pub async fn redeliveries(&self, queue: &str) -> Vec<Vec<u8>> {
        eventually("the first 100 ids ran", || async {
            let counts = self.effect_counts().await;
            self.ids[..100].iter().all(|id| counts.contains_key(id))
        })
        .await;
        self.ids[..100]
            .iter()
            .enumerate()
            .map(|(n, id)| envelope_with_id(id, queue, (900 + n) as u64).to_vec())
            .collect()
    }

    /// The Python worker of peer `script` on `queue` of the broker `url`,
    /// with `extra` arguments before the seen-set's; its answer.
    pub async fn python_worker(
        &self,
        python: &Path,
        script: &str,
        url: &str,
        queue: &str,
        extra: &[&str],
    ) -> Value {
        let args = ["consume", url, queue, "1.0"]
            .iter()
            .chain(extra)
            .chain(&[
                "--seen-prefix",
                self.seen_prefix.as_str(),
                "--effects",
                self.effects.as_str(),
            ])
            .map(|arg| (*arg).to_owned())
            .collect();
        peer(python, script, args, None).await
    }

    /// The Rust worker on `transport`, with four handlers at a time.
    pub fn consumer<T: Transport>(&self, transport: T, queue: &str) -> Consumer<T> {
        let store = RedisStore::builder()
            .prefix(&self.seen_prefix)
            .connect_lazy(&self.redis_url)
            .unwrap();
        Consumer::builder(
            effect_router(store, &self.redis_url, self.effects.clone()),
            transport,
            queue,
        )
        .concurrency(4)
        .build()
        .unwrap()
    }

    /// Runs the Rust `consumer` until it is idle, once the Python worker has
    /// run a first message: started alone, the Rust worker could take every
    /// message before Python's interpreter is up, and Python would take no
    /// part.
    pub async fn run_after_python<T: Transport>(&self, consumer: &Consumer<T>) -> ConsumerReport {
        eventually("the Python worker ran a first message", || async {
            self.redis()
                .await
                .hlen::<_, usize>(&self.effects)
                .await
                .unwrap()
                > 0
        })
        .await;
        run_until_idle(consumer, QUIET).await
    }

    /// The effects so far: how many times each id ran.
    pub async fn effect_counts(&self) -> HashMap<String, i64> {
        self.redis().await.hgetall(&self.effects).await.unwrap()
    }

    /// Checks that every id ran once, that both workers took part and
    /// handled or skipped every delivery once between them (`python_out`,
    /// the Python worker's answer; `report`, the Rust worker's), and that
    /// the seen-set is the Go layout.
    pub async fn assert_each_id_ran_once(&self, python_out: &Value, report: &ConsumerReport) {
        let counts = self.effect_counts().await;
        assert_eq!(counts.len(), self.ids.len(), "every id ran");
        assert!(
            counts.values().all(|&n| n == 1),
            "an id ran twice: {:?}",
            counts.iter().filter(|(_, n)| **n != 1).collect::<Vec<_>>()
        );
        let python_processed = python_out["processed"].as_u64().unwrap();
        assert_eq!(
            python_processed + report.acked,
            Self::DELIVERIES,
            "every delivery was handled or skipped once: {report:?}"
        );
        assert!(
            python_processed > 0 && report.acked > 0,
            "both workers took part: python {python_processed}, rust {report:?}"
        );
        let marker: Option<String> = self
            .redis()
            .await
            .get(format!("{}{}", self.seen_prefix, self.ids[0]))
            .await
            .unwrap();
        assert_eq!(marker.as_deref(), Some("1"));
    }

    async fn redis(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.redis_url.as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .expect("connect to the test's Redis")
    }
}

impl Drop for SharedSeenSet {
    /// Deletes the seen-set and the effects, also when the test failed.
    fn drop(&mut self) {
        let seen_set = format!("{}*", self.seen_prefix);
        delete_keys(&self.redis_url, &[&seen_set, &self.effects]);
    }
}

/// Deletes the keys of the Redis server `url` that match any of `patterns`
/// (`KEYS` patterns), without waiting on a runtime: for a test's `Drop`.
/// Best effort: a server gone already keeps them.
pub fn delete_keys(url: &str, patterns: &[&str]) {
    let Ok(client) = redis::Client::open(url) else {
        return;
    };
    let Ok(mut connection) = client.get_connection() else {
        return;
    };
    let keys: Vec<String> = patterns
        .iter()
        .flat_map(|pattern| {
            redis::cmd("KEYS")
                .arg(pattern)
                .query::<Vec<String>>(&mut connection)
                .unwrap_or_default()
        })
        .collect();
    if !keys.is_empty() {
        let _: redis::RedisResult<()> = redis::cmd("DEL").arg(keys).query(&mut connection);
    }
}

/// A local port nothing listens on (bound, then let go).
pub fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Checks that connecting to `url` failed as a malformed URL, with the
/// error saying so and keeping the password out.
pub fn assert_invalid_url<T: std::fmt::Debug>(url: &str, connected: Result<T, TransportError>) {
    let error = connected.unwrap_err();
    assert!(
        matches!(error, TransportError::InvalidUrl { .. }),
        "{url}: {error}"
    );
    assert!(error.to_string().contains("invalid broker URL"), "{error}");
    assert!(!error.to_string().contains(":guest@"), "{error}");
}

/// Checks that connecting failed because nothing answered, with the error
/// saying so.
pub fn assert_cannot_connect<T: std::fmt::Debug>(connected: Result<T, TransportError>) {
    let error = connected.unwrap_err();
    assert!(matches!(error, TransportError::Connect(_)), "{error}");
    assert!(error.to_string().contains("cannot connect"), "{error}");
}

/// Checks that a consumer of `transport` is not built for any queue of
/// `bad`, the error naming the queue name as the cause.
pub fn assert_queue_names_refused<T: Transport + Clone>(transport: &T, bad: &[&str]) {
    for bad in bad {
        let router = Router::builder().build().unwrap();
        let error = Consumer::builder(router, transport.clone(), *bad)
            .build()
            .err()
            .expect("refused");
        assert!(
            error.to_string().contains("invalid queue name"),
            "{bad:?}: {error}"
        );
    }
}

/// The `dead_letter` member of a record as written (its key order matters to
/// a byte comparison): the record always ends in `"dead_letter":{...}}`.
pub fn dead_letter_block(record: &[u8]) -> String {
    let text = String::from_utf8(record.to_vec()).unwrap();
    let marker = "\"dead_letter\":";
    let start = text.rfind(marker).expect("a dead_letter member") + marker.len();
    text[start..text.len() - 1].to_owned()
}

/// One delivery of the parked-claim scenario, as the route saw it once the
/// guard had decided.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimedDelivery {
    pub attempts: u64,
    pub traceparent: Option<String>,
    /// The guard's answer: `Err` for a parked delivery.
    pub ran: bool,
}

/// Claim mode on a real broker. `queue` holds one message, `id`, published
/// with the header `traceparent: 00-parked`, and another worker holds the
/// id's claim when the consumer meets it: the delivery is parked, and the
/// consumer puts it back unchanged (no attempt spent, its headers kept)
/// after the other lease's time left. The other worker then gives its claim
/// up (its handler failed), so the copy wins the claim, with a larger fence,
/// and runs once.
pub async fn a_parked_delivery_goes_back_unchanged_and_runs_once_freed<T: Transport>(
    transport: T,
    queue: &str,
    id: &str,
) {
    // The other worker's lease is short, so the parked delivery waits at most
    // that long; it keeps it alive until the consumer has parked the delivery
    // (under load it may take longer than one lease to get there).
    const OTHER_LEASE: Duration = Duration::from_secs(2);
    let store = Arc::new(InMemoryStore::new());
    let other = ClaimToken::random();
    let other_fence = match store.claim(id, other, OTHER_LEASE).await.unwrap() {
        Claim::Won { fence } => fence,
        claim => panic!("the other worker claims {id} first: {claim:?}"),
    };

    let log: Arc<Mutex<Vec<ClaimedDelivery>>> = Arc::default();
    let fences: Arc<Mutex<Vec<Option<u64>>>> = Arc::default();
    let guard = Guard::new(Arc::clone(&store))
        .lease(Duration::from_secs(30))
        .unwrap();
    let router = Router::builder()
        .route(urn!("urn:babel:interop:created"), {
            let (log, fences) = (Arc::clone(&log), Arc::clone(&fences));
            move |env: Envelope, delivery: Delivery| {
                let (guard, log, fences) = (guard.clone(), Arc::clone(&log), Arc::clone(&fences));
                async move {
                    let answer = guard
                        .run(&env, async {
                            fences.lock().unwrap().push(fence());
                            Ok::<(), StoreError>(())
                        })
                        .await;
                    log.lock().unwrap().push(ClaimedDelivery {
                        attempts: delivery.attempts(),
                        traceparent: delivery.header("traceparent").map(str::to_owned),
                        ran: answer.is_ok(),
                    });
                    answer
                }
            }
        })
        .max_attempts(3)
        .build()
        .unwrap();
    let consumer = Consumer::builder(router, transport, queue).build().unwrap();

    let other_worker = async {
        // Holds the claim until the delivery has been parked, then gives up.
        while log.lock().unwrap().is_empty() {
            assert!(
                store.renew(id, other, OTHER_LEASE).await.unwrap(),
                "the other worker's claim lapsed"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(store.release(id, other).await.unwrap());
    };
    let (report, ()) = tokio::join!(run_until_idle(&consumer, QUIET), other_worker);

    let parked_then_ran = [false, true].map(|ran| ClaimedDelivery {
        attempts: 0,
        traceparent: Some("00-parked".to_owned()),
        ran,
    });
    assert_eq!(*log.lock().unwrap(), parked_then_ran, "{report:?}");
    let fences = fences.lock().unwrap().clone();
    assert!(
        matches!(fences.as_slice(), [Some(fence)] if *fence > other_fence),
        "one run, fenced above the other worker's {other_fence}: {fences:?}"
    );
    assert_eq!(
        (
            report.delivered,
            report.released,
            report.acked,
            report.retried,
            report.dead_lettered
        ),
        (2, 1, 1, 0, 0),
        "{report:?}"
    );
    assert!(store.seen(id).await.unwrap(), "the run is committed");
}

/// The worker example's scenario: `ids` envelopes `<prefix>-0`,
/// `<prefix>-1`, ..., the first `twice` of them each followed at once by a
/// second copy (the copy right behind its original, as a producer that
/// publishes twice in a row).
pub fn twice_in_a_row(queue: &str, prefix: &str, ids: u64, twice: u64) -> Vec<Vec<u8>> {
    let mut bodies = Vec::new();
    for n in 0..ids {
        let body = envelope_with_id(&format!("{prefix}-{n}"), queue, n).to_vec();
        if n < twice {
            bodies.push(body.clone());
        }
        bodies.push(body);
    }
    bodies
}

/// What a [`counting_router`] saw: deliveries handled, and per id how many
/// times the guarded body ran.
#[derive(Clone, Default)]
pub struct RunCounts {
    pub handled: Arc<std::sync::atomic::AtomicU64>,
    pub ran: Arc<Mutex<HashMap<String, u32>>>,
}

impl RunCounts {
    /// Bodies run, all ids together.
    pub fn ran(&self) -> u64 {
        self.ran
            .lock()
            .unwrap()
            .values()
            .map(|&n| u64::from(n))
            .sum()
    }

    /// Deliveries the guard skipped: handled, body not run.
    pub fn skipped(&self) -> u64 {
        self.handled.load(std::sync::atomic::Ordering::SeqCst) - self.ran()
    }
}

/// A seen-set-mode router on `store` whose body yields for `work` (so that
/// two deliveries of one id would overlap if both ran) and counts its runs.
pub fn counting_router<S: Store + Clone + 'static>(
    store: S,
    counts: RunCounts,
    work: Duration,
) -> Router {
    Router::builder()
        .route(urn!("urn:babel:interop:created"), move |env: Envelope| {
            let (store, counts) = (store.clone(), counts.clone());
            async move {
                counts
                    .handled
                    .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                run_once(store, &env, async {
                    tokio::time::sleep(work).await;
                    *counts
                        .ran
                        .lock()
                        .unwrap()
                        .entry(env.meta.id.clone().unwrap_or_default())
                        .or_default() += 1;
                    Ok::<(), StoreError>(())
                })
                .await
            }
        })
        .build()
        .unwrap()
}

/// Consumes the [`twice_in_a_row`] scenario (already published on `queue`)
/// with a consumer of concurrency 64 in seen-set mode: every id ran once,
/// every second copy was skipped, none ran beside its original.
pub async fn assert_each_id_runs_once_in_one_process<T: Transport>(
    transport: T,
    queue: &str,
    ids: u64,
    twice: u64,
) -> ConsumerReport {
    let counts = RunCounts::default();
    let router = counting_router(
        Arc::new(InMemoryStore::new()),
        counts.clone(),
        Duration::from_millis(5),
    );
    let consumer = Consumer::builder(router, transport, queue)
        .concurrency(64)
        .build()
        .unwrap();
    let report = run_until_idle(&consumer, QUIET).await;
    let twice_ran: Vec<_> = counts
        .ran
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(id, n)| format!("{id}: {n}"))
        .collect();
    assert!(twice_ran.is_empty(), "ran twice: {twice_ran:?}");
    assert_eq!(counts.ran(), ids, "ran: {report:?}");
    assert_eq!(counts.skipped(), twice, "skipped: {report:?}");
    assert_eq!(report.acked, ids + twice, "{report:?}");
    assert!(
        report.waited_for_id > 0,
        "some second copies met their original running: {report:?}"
    );
    report
}

/// How long a burst scenario may take before it counts as wedged: far more
/// than a healthy run needs, far less than the default reservation lifetime
/// a wedged delivery would be held for (a failure, never a speed assertion).
pub const BURST_PATIENCE: Duration = Duration::from_secs(60);

/// A burst of one id ahead of the ordinary traffic: `copies` deliveries of
/// `<prefix>-burst`, then one of each of `<prefix>-0` .. `<prefix>-<others - 1>`.
pub fn burst_of_one_id(queue: &str, prefix: &str, copies: u64, others: u64) -> Vec<Vec<u8>> {
    let burst = envelope_with_id(&format!("{prefix}-burst"), queue, 0).to_vec();
    let mut bodies = vec![burst; copies as usize];
    bodies.extend(
        (0..others).map(|n| envelope_with_id(&format!("{prefix}-{n}"), queue, n + 1).to_vec()),
    );
    bodies
}

/// Consumes the [`burst_of_one_id`] scenario (already published on `queue`)
/// with a consumer of `concurrency` in seen-set mode on `store` (a store
/// over the network: each copy's skip is a round trip, as in a worker),
/// the transport's defaults otherwise: each of the `others + 1` ids runs
/// once, every delivery ends acked, none timed out, none taken back by a
/// sweep, none dead-lettered, within [`BURST_PATIENCE`].
pub async fn a_burst_of_one_id_never_wedges_the_consumer<T, S>(
    transport: T,
    store: S,
    queue: &str,
    concurrency: usize,
    (copies, others): (u64, u64),
) -> ConsumerReport
where
    T: Transport,
    S: Store + Clone + 'static,
{
    let counts = RunCounts::default();
    let router = counting_router(store, counts.clone(), Duration::from_millis(5));
    let consumer = Consumer::builder(router, transport, queue)
        .concurrency(concurrency)
        .build()
        .unwrap();
    let progress = consumer.progress();
    let report = tokio::time::timeout(BURST_PATIENCE, consumer.run_until(progress.idle_for(QUIET)))
        .await
        .unwrap_or_else(|_| {
            panic!(
                "the consumer was wedged by the burst: {:?}",
                consumer.progress().report()
            )
        });
    let ran = counts.ran.lock().unwrap().clone();
    let twice: Vec<_> = ran.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "ran twice: {twice:?}");
    assert_eq!(ran.len() as u64, others + 1, "ids run: {report:?}");
    assert_eq!(report.timed_out, 0, "{report:?}");
    assert_eq!(report.lapsed, 0, "taken back by a sweep: {report:?}");
    assert_eq!(report.dead_lettered, 0, "{report:?}");
    assert_eq!(report.acked, copies + others, "{report:?}");
    assert_eq!(report.in_flight, 0, "{report:?}");
    println!("burst: {report:?}");
    report
}

/// A consumer at concurrency 1 with the default read-ahead (which must be
/// `default_read_ahead` on `transport`) holds that many deliveries beyond
/// the one its handler runs, one handler at a time, and hands deliveries to
/// the handler in the order reserved; with `read_ahead(0)` it holds only
/// the one being handled. `transport` must be able to hold two deliveries
/// (a RabbitMQ prefetch of 2 or more); `queue` starts empty, `publish`
/// queues bodies on it.
pub async fn a_delivery_read_ahead_waits_for_the_handler_slot_in_order<T, P, F>(
    transport: T,
    queue: &str,
    default_read_ahead: usize,
    publish: P,
) where
    T: Transport + Clone,
    P: Fn(Vec<Vec<u8>>) -> F,
    F: Future<Output = ()>,
{
    use std::sync::atomic::{AtomicUsize, Ordering};

    for read_ahead in [None, Some(0)] {
        let bodies: Vec<Vec<u8>> = (0..4)
            .map(|n| envelope_with_id(&format!("ahead-{n}"), queue, n).to_vec())
            .collect();
        publish(bodies).await;
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let (running, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let order = Arc::new(Mutex::new(Vec::new()));
        let router = {
            let (gate, running, most, order) = (
                Arc::clone(&gate),
                Arc::clone(&running),
                Arc::clone(&most),
                Arc::clone(&order),
            );
            Router::builder()
                .route(urn!("urn:babel:interop:created"), move |env: Envelope| {
                    let (gate, running, most, order) = (
                        Arc::clone(&gate),
                        Arc::clone(&running),
                        Arc::clone(&most),
                        Arc::clone(&order),
                    );
                    async move {
                        let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        order
                            .lock()
                            .unwrap()
                            .push(env.meta.id.clone().unwrap_or_default());
                        gate.acquire().await?.forget();
                        running.fetch_sub(1, Ordering::SeqCst);
                        Ok::<(), anyhow::Error>(())
                    }
                })
                .build()
                .unwrap()
        };
        let builder = Consumer::builder(router, transport.clone(), queue).concurrency(1);
        let consumer = match read_ahead {
            Some(deliveries) => builder.read_ahead(deliveries),
            None => builder,
        }
        .build()
        .unwrap();
        let held = 1 + consumer.read_ahead();
        assert_eq!(
            consumer.read_ahead(),
            read_ahead.unwrap_or(default_read_ahead)
        );
        let (progress, idle) = (consumer.progress(), consumer.progress());
        let steps = async {
            for handled in 0..4 {
                let expected = held.min(4 - handled);
                eventually(&format!("{expected} held, one handled"), || async {
                    progress.report().in_flight == expected as u64
                        && order.lock().unwrap().len() == handled + 1
                })
                .await;
                gate.add_permits(1);
            }
            idle.idle_for(QUIET).await;
        };
        let report = tokio::time::timeout(PATIENCE, consumer.run_until(steps))
            .await
            .expect("the consumer drains the queue");
        assert_eq!(report.acked, 4, "{report:?}");
        assert_eq!(most.load(Ordering::SeqCst), 1, "one handler at a time");
        let expected: Vec<String> = (0..4).map(|n| format!("ahead-{n}")).collect();
        assert_eq!(
            *order.lock().unwrap(),
            expected,
            "handled in the order reserved"
        );
    }
}
