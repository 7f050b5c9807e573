//! The outbox relay to Kafka (`babel-idem relay --kafka URL`) against a
//! real Kafka-protocol broker: committed rows reach their topic byte for
//! byte, with the binding's `bq-` headers, in row order on a one-partition
//! topic; a relay killed (`kill -9`) while it publishes loses nothing: a
//! second relay publishes every row its predecessor did not mark.
//!
//! Environment: `BABEL_IDEM_KAFKA_URL`, `BABEL_IDEM_POSTGRES_URL`; without
//! them the tests print `skipped:`, and with `BABEL_IDEM_REQUIRE_SERVERS=1`
//! fail.
#![cfg(all(
    feature = "outbox",
    feature = "sqlite",
    feature = "postgres",
    feature = "redis-transport",
    feature = "amqp-transport",
    feature = "kafka-transport"
))]

#[path = "../babel-idem/tests/outbox_support/mod.rs"]
mod outbox_support;
#[path = "../babel-idem/tests/store_contract/mod.rs"]
mod store_contract;
#[path = "../babel-idem/tests/support/mod.rs"]
mod support;

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::time::Duration;

use babel_idem::Envelope;
use outbox_support::db::{Db, Kind, cli};
use serde_json::{Value, json};
use support::kafka::{Topics, kafka_url, read_all, unique};

fn envelope(topic: &str, n: u64) -> Envelope {
    Envelope::new("urn:babel:outbox:test", json!({"n": n})).with_queue(topic)
}

/// `babel-idem relay` on `db` to the Kafka cluster `url`, with `extra`.
fn relay(db: &Db, url: &str, extra: &[&str]) -> Command {
    let mut command = Command::new(cli());
    command
        .arg("relay")
        .args(["--outbox", &db.url(), "--outbox-table", db.table()])
        .args(["--kafka", url])
        .args(extra)
        .stdin(Stdio::null());
    command
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_reach_kafka_byte_for_byte_with_the_projection_in_row_order() {
    const TEST: &str = "outbox_kafka_byte_for_byte";
    let (Some(url), Some(db)) = (kafka_url(TEST), Db::open(Kind::Sqlite, TEST).await) else {
        return;
    };
    db.migrate().await;
    let topic = unique("bi-obx-kafka");
    let topics = Topics::create(&url, std::slice::from_ref(&topic), 1).await;
    let envelopes: Vec<Envelope> = (0..50).map(|n| envelope(&topic, n)).collect();
    db.save_all(&envelopes).await;

    let out = tokio::task::spawn_blocking({
        let mut command = relay(&db, &url, &["--drain"]);
        move || command.output().unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let landed = read_all(&url, &topic, Some(50), Duration::ZERO).await;
    assert_eq!(landed.len(), 50);
    for (record, envelope) in landed.iter().zip(&envelopes) {
        assert_eq!(
            record.value,
            envelope.encode_for_publish().unwrap(),
            "the saved bytes, in row order"
        );
        assert_eq!(
            record.header("bq-message-id").as_deref(),
            envelope.meta.id.as_deref()
        );
        assert_eq!(
            record.header("bq-job").as_deref(),
            Some("urn:babel:outbox:test")
        );
        assert_eq!(record.header("bq-attempts").as_deref(), Some("0"));
    }
    topics.delete().await;
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_killed_while_it_publishes_to_kafka_loses_no_row() {
    const TEST: &str = "outbox_kafka_kill";
    let (Some(url), Some(db)) = (kafka_url(TEST), Db::open(Kind::Postgres, TEST).await) else {
        return;
    };
    db.migrate().await;
    let topic = unique("bi-obx-kafka");
    let topics = Topics::create(&url, std::slice::from_ref(&topic), 2).await;
    let envelopes: Vec<Envelope> = (0..2000).map(|n| envelope(&topic, n)).collect();
    db.save_all(&envelopes).await;

    let mut first = relay(&db, &url, &["--batch", "50"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Killed once some rows are on the topic and others are not.
    let _ = read_all(&url, &topic, Some(100), Duration::ZERO).await;
    first.kill().unwrap(); // SIGKILL
    first.wait().unwrap();

    let out = tokio::task::spawn_blocking({
        let mut command = relay(&db, &url, &["--drain"]);
        move || command.output().unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(db.count("pending").await, 0, "every row is marked");

    let landed = read_all(&url, &topic, None, Duration::from_secs(3)).await;
    let mut times: HashMap<String, usize> = HashMap::new();
    for record in &landed {
        let body: Value = serde_json::from_slice(&record.value).unwrap();
        *times
            .entry(body["meta"]["id"].as_str().unwrap().to_owned())
            .or_default() += 1;
    }
    let lost: Vec<&str> = envelopes
        .iter()
        .filter_map(|env| env.meta.id.as_deref())
        .filter(|id| !times.contains_key(*id))
        .collect();
    assert!(lost.is_empty(), "{} rows never reached Kafka", lost.len());
    let repeats: usize = times.values().map(|n| n - 1).sum();
    eprintln!(
        "relay kill -9: {} records for {} rows, {repeats} repeated (published, not yet marked)",
        landed.len(),
        envelopes.len()
    );
    topics.delete().await;
    db.cleanup().await;
}
