//! What the consumer benchmarks (`consumer.rs`, `consumer_amqp.rs`) share:
//! the same load (10% duplicate ids) and the same CPU accounting, so their
//! figures compare.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use babel_idem::Envelope;
use redis::aio::ConnectionManager;
use serde_json::json;

/// The URN every benchmark message carries.
pub const URN: &str = "urn:babel:interop:created";

/// `name` from the environment as a count, else `default`.
pub fn env_count(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// `count` envelopes on `queue`; every tenth reuses the id of a message 500
/// places earlier (a redelivery), so 10% are duplicates.
pub fn bodies(queue: &str, count: usize, run: &str) -> Vec<Vec<u8>> {
    (0..count)
        .map(|i| {
            let id = if i % 10 == 9 && i >= 500 { i - 500 } else { i };
            Envelope::new(URN, json!({"n": i}))
                .with_id(format!("{run}-{id}"))
                .with_queue(queue)
                .to_vec()
        })
        .collect()
}

/// CPU seconds of this process (`self`) or of its waited-for children.
pub fn cpu_seconds(children: bool) -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name, which ends at the last ')'.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    // utime, stime are fields 14, 15; cutime, cstime 16, 17 (1-based, counting pid and comm).
    let (a, b) = if children { (13, 14) } else { (11, 12) };
    let ticks: f64 = [a, b]
        .iter()
        .filter_map(|&i| fields.get(i)?.parse::<f64>().ok())
        .sum();
    ticks / 100.0 // USER_HZ is 100 on Linux
}

/// The `meta.id` of a body [`bodies`] made, found without decoding the JSON
/// (the raw ceilings decode nothing).
pub fn id_of(body: &[u8]) -> &[u8] {
    let marker = b"\"id\":\"";
    let start = body
        .windows(marker.len())
        .position(|w| w == marker)
        .map_or(0, |i| i + marker.len());
    let len = body[start..].iter().position(|&b| b == b'"').unwrap_or(0);
    &body[start..start + len]
}

/// The runtime every worker of a run (ours and the raw ceiling) runs on: one
/// thread, as `examples/worker.rs` does, or the multi-threaded scheduler with
/// `BENCH_RUNTIME=multi_thread`.
pub fn runtime() -> tokio::runtime::Runtime {
    match std::env::var("BENCH_RUNTIME").as_deref() {
        Ok("multi_thread") => tokio::runtime::Builder::new_multi_thread(),
        _ => tokio::runtime::Builder::new_current_thread(),
    }
    .enable_all()
    .build()
    .unwrap()
}

/// The seen-set's commands for a batch, as the batched worker sends them:
/// one `MGET` of `keys`, then `SET NX` of the unseen ones in one
/// `MULTI`/`EXEC`.
pub async fn remember_unseen(connection: &mut ConnectionManager, keys: &[Vec<u8>]) {
    let seen: Vec<Option<Vec<u8>>> = redis::cmd("MGET")
        .arg(keys)
        .query_async(connection)
        .await
        .unwrap();
    let mut remember = redis::pipe();
    remember.atomic();
    for (key, _) in keys.iter().zip(&seen).filter(|(_, seen)| seen.is_none()) {
        remember.cmd("SET").arg(key).arg(1).arg("NX").ignore();
    }
    let () = remember.query_async(connection).await.unwrap();
}

/// Runs a Python peer script to the end and returns how long its work took.
/// It runs off the runtime's thread, so the benchmark's own connections (AMQP
/// heartbeats) keep running meanwhile.
pub async fn run_python(python: &Path, script: &str, args: &[&str]) -> f64 {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join(script);
    let mut command = Command::new(python);
    command.arg(script).args(args);
    let started = Instant::now();
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .unwrap()
        .expect("run the Python worker");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // The worker waits 0.2 s on the empty queue before it stops.
    started.elapsed().as_secs_f64() - 0.2
}
