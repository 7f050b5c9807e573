//! What the consumer tests share: the Python peer, patience, the effect
//! counting router. A module of the test crates that `mod` it.
#![allow(dead_code)]

#[cfg(feature = "redis-transport")]
pub mod redis_queue;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use babel_idem::consumer::ConsumerReport;
use babel_idem::guard::fence;
use babel_idem::store::{Claim, ClaimToken};
use babel_idem::transport::Transport;
use babel_idem::{
    ClaimStore, Consumer, Delivery, Envelope, Guard, InMemoryStore, Router, Store, StoreError,
    guard, urn,
};
use redis::AsyncCommands;
use serde_json::{Value, json};

use crate::store_contract::servers::skip_or_fail;

pub const URN: &str = "urn:babel:interop:created";

/// The longest any test waits for a condition before it fails (never a
/// timing assertion: only a guard against hanging forever).
pub const PATIENCE: Duration = Duration::from_secs(120);

/// How long a consumer must stay idle (nothing reserved, nothing in flight)
/// before a test stops it as drained. Longer than any pause a loaded machine
/// puts between two deliveries: a shorter one could stop a consumer that
/// still has work, e.g. before its first reserve returned.
pub const QUIET: Duration = Duration::from_secs(2);

/// The peer's python, or `None` after a `skipped:` line.
pub fn python(test: &str) -> Option<PathBuf> {
    match std::env::var("BABEL_IDEM_PYTHON") {
        Ok(path) if !path.trim().is_empty() => Some(PathBuf::from(path)),
        _ => {
            skip_or_fail(test, "BABEL_IDEM_PYTHON is not set (source .ci/python.sh)");
            None
        }
    }
}

/// Runs one subcommand of the peer `tests/python/<script>` to its end (on a
/// blocking thread, so a Rust worker can run beside it); its JSON answer.
pub async fn peer(python: &Path, script: &str, args: Vec<String>, stdin: Option<Value>) -> Value {
    let python = python.to_path_buf();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
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
        let input = stdin.map(|v| v.to_string()).unwrap_or_default();
        std::io::Write::write_all(&mut child.stdin.take().unwrap(), input.as_bytes()).unwrap();
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
                guard(store, &env, async {
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
    // (a loaded machine may take longer than one lease to get there).
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
