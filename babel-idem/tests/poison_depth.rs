//! Poison bodies nested deeper than a spliced record may be end in the
//! dead-letter queue of a real Redis as records every JSON parser reads:
//! serde_json (which refuses more than 127 levels) and the Python SDK's
//! `json`. A body at the limit is spliced; a deeper one is wrapped as `raw`
//! text, byte for byte as the Python SDK wraps a body its parser refuses.
//!
//! Environment: `BABEL_IDEM_REDIS_URL`, and `BABEL_IDEM_PYTHON` for the
//! Python side; without them a test prints `skipped:`, and with
//! `BABEL_IDEM_REQUIRE_SERVERS=1` it fails instead.
#![cfg(all(feature = "redis-transport", feature = "redis", feature = "sqlite"))]

mod consumer_support;
mod store_contract;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use babel_idem::{Consumer, Router};
use redis::AsyncCommands;
use serde_json::{Value, json};

use consumer_support::redis_queue::Queue;
use consumer_support::{QUIET, dead_letter_block, peer, python, run_until_idle};
use store_contract::servers::{REDIS_URL, server_url};

/// The deepest body the consumer splices (the record is as deep as it).
const SPLICED: usize = 127;

/// An object `depth` levels deep: objects all the way, or one object
/// holding arrays.
fn nested(depth: usize, arrays: bool) -> String {
    if arrays {
        format!(
            "{{\"a\":{}{}}}",
            "[".repeat(depth - 1),
            "]".repeat(depth - 1)
        )
    } else {
        format!(
            "{}{{}}{}",
            "{\"a\":".repeat(depth - 1),
            "}".repeat(depth - 1)
        )
    }
}

/// Whether Python's `json` parses `record`.
fn python_parses(python: &Path, record: &[u8]) -> bool {
    let mut child = Command::new(python)
        .args(["-c", "import json, sys; json.load(sys.stdin)"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("start {python:?}: {e}"));
    child.stdin.take().unwrap().write_all(record).unwrap();
    let output = child.wait_with_output().unwrap();
    if !output.status.success() {
        eprintln!("{}", String::from_utf8_lossy(&output.stderr));
    }
    output.status.success()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deeply_nested_poison_leaves_records_serde_json_and_python_parse() {
    const TEST: &str = "deeply_nested_poison_leaves_records_serde_json_and_python_parse";
    let Some(url) = server_url(REDIS_URL, TEST) else {
        return;
    };
    let queue = Queue::new(&url);
    let transport = queue.transport().await;
    let mut raw = queue.raw().await;
    // (body, spliced)
    let mut bodies = Vec::new();
    for arrays in [false, true] {
        bodies.push((nested(SPLICED, arrays), true));
        bodies.push((nested(SPLICED + 1, arrays), false));
        bodies.push((nested(200_000, arrays), false));
    }
    for (body, _) in &bodies {
        let _: () = raw.rpush(&queue.name, body.as_bytes()).await.unwrap();
    }

    let router = Router::builder().build().expect("an empty router");
    let consumer = Consumer::builder(router, transport, &queue.name)
        .concurrency(1)
        .build()
        .unwrap();
    let report = run_until_idle(&consumer, QUIET).await;
    assert_eq!(report.dead_lettered as usize, bodies.len(), "{report:?}");

    let records: Vec<Vec<u8>> = raw.lrange(queue.dlq(), 0, -1).await.unwrap();
    assert_eq!(records.len(), bodies.len());
    let python = python(TEST);
    for ((body, spliced), record) in bodies.iter().zip(&records) {
        let depth = body.matches(['{', '[']).count();
        let parsed: Value = serde_json::from_slice(record).unwrap_or_else(|e| {
            panic!("the record of a body {depth} deep does not parse with serde_json: {e}")
        });
        assert_eq!(parsed["dead_letter"]["reason"], "poison", "depth {depth}");
        if *spliced {
            assert_eq!(
                parsed["a"],
                serde_json::from_str::<Value>(body).unwrap()["a"]
            );
        } else {
            assert!(
                parsed["raw"].as_str() == Some(body.as_str()),
                "the body {depth} deep is kept as raw text"
            );
        }
        let Some(python) = &python else {
            continue;
        };
        assert!(
            python_parses(python, record),
            "the record of a body {depth} deep does not parse with Python's json"
        );
        // Below Python's own recursion limit its SDK splices a body
        // serde_json could not read back; at the limit and far beyond it,
        // both write the same bytes.
        if depth == SPLICED || depth == 200_000 {
            let python_record = peer(
                python,
                "consumer_peer.py",
                vec!["poison-record".into()],
                Some(json!({
                    "body": body.as_bytes(),
                    "block_json": dead_letter_block(record),
                })),
            )
            .await;
            let python_record: Vec<u8> =
                serde_json::from_value(python_record["record"].clone()).unwrap();
            assert!(
                &python_record == record,
                "the record of a body {depth} deep differs from the Python SDK's"
            );
        }
    }
    assert!(queue.drained().await);
}
