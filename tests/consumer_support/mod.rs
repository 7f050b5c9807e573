//! What the consumer tests share: the Python peer, patience, the effect
//! counting router. A module of the test crates that `mod` it.
#![allow(dead_code)]

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use babel_idem::consumer::ConsumerReport;
use babel_idem::transport::Transport;
use babel_idem::{Consumer, Envelope, Router, Store, guard, urn};
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
