//! The redrive benchmark: a dead-letter list of 10,000 records on a real
//! Redis moved back to work, by babel-idem (`Redrive::redrive` on a `RedisTransport`) and
//! by the Python SDK's `redrive` (`babelqueue` 1.24, through
//! `babel-idem/tests/python/consumer_peer.py`, timed inside the Python process), one
//! after the other on the same server, on identical lists.
//!
//! Reported: messages/s of each and babel-idem's throughput over Python's.
//!
//! ```text
//! source .ci/servers.sh; source .ci/python.sh
//! cargo bench --bench redrive --features redis-transport,redrive
//! BENCH_MESSAGES=2000 cargo bench ...   # a quicker run
//! ```
//!
//! Without `BABEL_IDEM_REDIS_URL` it prints `skipped:`; without
//! `BABEL_IDEM_PYTHON` the Python run is skipped.

use std::process::Command;
use std::time::Instant;

use babel_idem::Envelope;
use babel_idem::envelope::{DeadLetter, DeadLetterReason};
use babel_idem::redrive::{Redrive, RedriveOptions};
use babel_idem::transport::RedisTransport;
use serde_json::{Value, json};

fn records(queue: &str, count: usize) -> Vec<Vec<u8>> {
    (0..count)
        .map(|n| {
            let mut envelope = Envelope::new("urn:babel:orders:created", json!({"n": n}))
                .with_queue(queue)
                .with_attempts(3);
            envelope.dead_letter =
                Some(DeadLetter::new(DeadLetterReason::Failed, queue, 3).with_error("timeout"));
            envelope.to_vec()
        })
        .collect()
}

async fn fill(url: &str, key: &str, values: &[Vec<u8>]) {
    let client = redis::Client::open(url).unwrap();
    let mut raw = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("DEL")
        .arg(key)
        .query_async(&mut raw)
        .await
        .unwrap();
    for chunk in values.chunks(1000) {
        let _: () = redis::cmd("RPUSH")
            .arg(key)
            .arg(chunk)
            .query_async(&mut raw)
            .await
            .unwrap();
    }
}

async fn delete(url: &str, keys: &[&str]) {
    let client = redis::Client::open(url).unwrap();
    let mut raw = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("DEL")
        .arg(keys)
        .query_async(&mut raw)
        .await
        .unwrap();
}

fn main() {
    let Ok(url) = std::env::var("BABEL_IDEM_REDIS_URL") else {
        println!("skipped: redrive bench: BABEL_IDEM_REDIS_URL not set");
        return;
    };
    let count: usize = std::env::var("BENCH_MESSAGES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(10_000);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let queue = format!("bench-redrive-{}", uuid::Uuid::new_v4().simple());
    let (dlq, target) = (format!("{queue}.dlq"), format!("{queue}.to"));
    let values = records(&queue, count);

    let ours = runtime.block_on(async {
        fill(&url, &dlq, &values).await;
        let transport = RedisTransport::connect(&url).await.unwrap();
        let started = Instant::now();
        let report = transport
            .redrive(&dlq, &RedriveOptions::new().to(&target))
            .await
            .unwrap();
        let seconds = started.elapsed().as_secs_f64();
        assert_eq!(report.moved, count);
        delete(&url, &[&dlq, &target]).await;
        seconds
    });
    println!(
        "babel-idem: {count} messages in {ours:.3} s, {:.0} messages/s",
        count as f64 / ours
    );

    let python = match std::env::var("BABEL_IDEM_PYTHON") {
        Ok(python) if !python.is_empty() => python,
        _ => {
            println!("skipped: the Python SDK's redrive: BABEL_IDEM_PYTHON not set");
            return;
        }
    };
    runtime.block_on(fill(&url, &dlq, &values));
    let output = Command::new(python)
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/babel-idem/tests/python/consumer_peer.py"
        ))
        .args(["redrive", &url, &dlq, "--to", &target])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let out: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(out["redriven"], count);
    let theirs = out["seconds"].as_f64().unwrap();
    runtime.block_on(delete(&url, &[&dlq, &target]));
    println!(
        "python-sdk: {count} messages in {theirs:.3} s, {:.0} messages/s",
        count as f64 / theirs
    );
    println!(
        "babel-idem / python-sdk: {:.1}x the throughput",
        theirs / ours
    );
}
