//! `babel-idem dlq|redrive --kafka` and `babel-idem kafka reinject`, run as
//! an operator runs them, against the shared Kafka broker
//! (`BABEL_IDEM_KAFKA_URL`; without it a test prints a `skipped:` line, and
//! fails under `BABEL_IDEM_REQUIRE_SERVERS=1`). The crash test `kill -9`s
//! the re-injector part way through.

use std::collections::BTreeSet;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use babel_idem::Envelope;
use babel_idem::envelope::{DeadLetter, DeadLetterReason};
use serde_json::{Value, json};

// The library tests' Kafka helpers (their own `allow`s: this file uses some).
#[path = "../../babel-idem/tests/support/kafka.rs"]
mod kafka;

use kafka::{READ_QUIET, Raw, Topics, kafka_url, now_ms, produce, producer, read_all, unique};

const BIN: &str = env!("CARGO_BIN_EXE_babel-idem");
const URN: &str = "urn:babel:orders:created";

/// The longest a test waits for a condition (a guard against hanging, never
/// a timing assertion).
const PATIENCE: Duration = Duration::from_secs(60);

#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn json_lines(&self) -> Vec<Value> {
        self.stdout
            .lines()
            .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {self:?}")))
            .collect()
    }

    #[track_caller]
    fn ok(&self) -> &Self {
        assert_eq!(self.code, 0, "{self:?}");
        assert!(self.stderr.is_empty(), "{self:?}");
        self
    }

    /// One line on stderr, the code, no panic.
    #[track_caller]
    fn refused(&self, code: i32, says: &str) {
        assert_eq!(self.code, code, "{self:?}");
        assert_eq!(self.stderr.lines().count(), 1, "one line: {self:?}");
        assert!(self.stderr.starts_with("babel-idem: "), "{self:?}");
        assert!(self.stderr.contains(says), "{says:?} in {self:?}");
        assert!(!self.stderr.to_lowercase().contains("panicked"), "{self:?}");
    }
}

fn cli(args: &[&str]) -> Run {
    let output = Command::new(BIN)
        .args(args)
        .env("RUST_BACKTRACE", "1")
        .stdin(Stdio::null())
        .output()
        .expect("run babel-idem");
    Run {
        code: output.status.code().expect("exited, not killed"),
        stdout: String::from_utf8(output.stdout).expect("UTF-8 stdout"),
        stderr: String::from_utf8(output.stderr).expect("UTF-8 stderr"),
    }
}

fn spawn(args: &[&str]) -> Child {
    Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start babel-idem")
}

/// A dead-letter record for `queue`, as a worker writes it.
fn record(id: &str, queue: &str) -> Vec<u8> {
    let mut envelope = Envelope::new(URN, json!({"order": id}))
        .with_id(id)
        .with_queue(queue)
        .with_attempts(3);
    envelope.dead_letter =
        Some(DeadLetter::new(DeadLetterReason::Failed, queue, 3).with_error("timeout"));
    envelope.to_vec()
}

fn id_of(body: &[u8]) -> String {
    let value: Value = serde_json::from_slice(body).unwrap();
    value["meta"]["id"].as_str().unwrap().to_owned()
}

/// A work topic and its DLQ, with `ids` dead-lettered in it (keyed by id).
async fn dead_lettered(url: &str, ids: &[&str]) -> (String, Topics) {
    let queue = unique("bi-cli-kafka");
    let dlq = format!("{queue}.dlq");
    let topics = Topics::create(url, &[queue.clone(), dlq.clone()], 1).await;
    for id in ids {
        produce(
            &producer(topics.url()),
            &dlq,
            Raw {
                key: Some(id.as_bytes()),
                value: &record(id, &queue),
                ..Raw::default()
            },
        )
        .await;
    }
    (queue, topics)
}

#[tokio::test]
async fn dlq_list_show_and_stats_over_kafka_read_and_commit_nothing() {
    let test = "dlq_list_show_and_stats_over_kafka_read_and_commit_nothing";
    let Some(url) = kafka_url(test) else { return };
    let (queue, topics) = dead_lettered(&url, &["c-1", "c-2"]).await;
    let dlq = format!("{queue}.dlq");

    let listed = cli(&["dlq", "list", "--kafka", &url, &dlq, "--json"]);
    let lines = listed.ok().json_lines();
    let ids: Vec<&Value> = lines.iter().map(|line| &line["id"]).collect();
    assert_eq!(ids, [&json!("c-1"), &json!("c-2")]);
    assert_eq!(lines[0]["reason"], "failed");
    assert_eq!(lines[0]["original_queue"], json!(queue));

    let shown = cli(&["dlq", "show", "--kafka", &url, &dlq, "#1", "--json"]);
    assert_eq!(shown.ok().json_lines()[0]["body"]["meta"]["id"], "c-2");
    let stats = cli(&["dlq", "stats", "--kafka", &url, &dlq, "--json"]);
    assert_eq!(stats.ok().json_lines()[0]["messages"], 2);

    let committed = kafka::committed(topics.url(), "babelqueue-redrive", &dlq, 1).await;
    assert_eq!(committed[&0], None, "looking commits nothing");
    assert_eq!(
        read_all(topics.url(), &dlq, None, READ_QUIET).await.len(),
        2
    );
}

#[tokio::test]
async fn redrive_over_kafka_moves_the_selected_record_with_its_key() {
    let test = "redrive_over_kafka_moves_the_selected_record_with_its_key";
    let Some(url) = kafka_url(test) else { return };
    let (queue, topics) = dead_lettered(&url, &["m-1", "m-2"]).await;
    let dlq = format!("{queue}.dlq");

    let run = cli(&[
        "redrive", "--kafka", &url, "--from", &dlq, "--id", "m-2", "--json",
    ]);
    let lines = run.ok().json_lines();
    let summary = lines.last().unwrap();
    assert_eq!(
        (&summary["moved"], &summary["skipped"]),
        (&json!(1), &json!(1))
    );

    let work = read_all(topics.url(), &queue, None, READ_QUIET).await;
    assert_eq!(work.len(), 1);
    assert_eq!(work[0].key.as_deref(), Some(&b"m-2"[..]));
    assert_eq!(id_of(&work[0].value), "m-2");
    let left = cli(&["dlq", "list", "--kafka", &url, &dlq, "--json"]);
    let ids: Vec<Value> = left
        .ok()
        .json_lines()
        .iter()
        .map(|l| l["id"].clone())
        .collect();
    assert_eq!(ids, [json!("m-1")]);
}

#[tokio::test]
async fn a_missing_kafka_dlq_is_exit_4_and_bad_tiers_a_usage_error() {
    let test = "a_missing_kafka_dlq_is_exit_4_and_bad_tiers_a_usage_error";
    let Some(url) = kafka_url(test) else { return };
    let missing = unique("bi-cli-missing");
    cli(&["dlq", "list", "--kafka", &url, &missing]).refused(4, "does not exist");

    let run = cli(&[
        "kafka", "reinject", "--kafka", &url, "--topic", "orders", "--tiers", "30s,5s",
    ]);
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("ascending"), "{run:?}");
    cli(&["dlq", "list", "--kafka", "kafka://a/b", "x.dlq"]).refused(2, "hosts only");
}

#[tokio::test]
async fn kafka_reinject_killed_mid_run_loses_no_record_and_stops_cleanly_on_sigterm() {
    let test = "kafka_reinject_killed_mid_run_loses_no_record_and_stops_cleanly_on_sigterm";
    let Some(url) = kafka_url(test) else { return };
    let queue = unique("bi-cli-reinject");
    let tier = format!("{queue}.retry.1");
    let topics = Topics::create(
        &url,
        &[queue.clone(), tier.clone(), format!("{queue}.retry.2")],
        1,
    )
    .await;
    let ids: Vec<String> = (0..20).map(|n| format!("r-{n}")).collect();
    for id in &ids {
        produce(
            &producer(topics.url()),
            &tier,
            Raw {
                key: Some(id.as_bytes()),
                value: id.as_bytes(),
                headers: vec![
                    ("bq-delay", Some(b"1000")),
                    ("bq-original-topic", Some(queue.as_bytes())),
                ],
                timestamp: Some(now_ms()),
                partition: None,
            },
        )
        .await;
    }
    let group = unique("bi-cli-reinject-group");
    let args = [
        "kafka", "reinject", "--kafka", &url, "--topic", &queue, "--tiers", "1s,2s", "--group",
        &group, "--json",
    ];

    // Killed as soon as something reached the work topic.
    let mut first = spawn(&args);
    let deadline = Instant::now() + PATIENCE;
    read_all(topics.url(), &queue, Some(1), Duration::ZERO).await;
    first.kill().unwrap();
    first.wait().unwrap();

    // A second run delivers whatever the first did not commit.
    let second = spawn(&args);
    let wanted: BTreeSet<String> = ids.iter().cloned().collect();
    loop {
        let delivered: BTreeSet<String> = read_all(topics.url(), &queue, None, READ_QUIET)
            .await
            .iter()
            .map(|record| String::from_utf8(record.value.clone()).unwrap())
            .collect();
        if delivered == wanted {
            break;
        }
        assert!(delivered.is_subset(&wanted), "{delivered:?}");
        assert!(Instant::now() < deadline, "delivered {delivered:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let committed = kafka::committed(topics.url(), &group, &tier, 1).await;
    let deadline = Instant::now() + PATIENCE;
    let mut committed = committed[&0];
    while committed != Some(20) {
        assert!(Instant::now() < deadline, "committed {committed:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
        committed = kafka::committed(topics.url(), &group, &tier, 1).await[&0];
    }

    let status = Command::new("kill")
        .args(["-TERM", &second.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let output = second.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    let summary: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert!(summary["reinjected"].as_u64().unwrap() >= 1, "{summary}");
    assert_eq!(summary["topics"], json!([tier, format!("{queue}.retry.2")]));
}

#[tokio::test]
async fn kafka_reinject_dry_run_names_the_tier_topics_and_moves_nothing() {
    let test = "kafka_reinject_dry_run_names_the_tier_topics_and_moves_nothing";
    let Some(url) = kafka_url(test) else { return };
    let run = cli(&[
        "kafka",
        "reinject",
        "--kafka",
        &url,
        "--topic",
        "orders",
        "--topic",
        "billing",
        "--tiers",
        "5s,30s",
        "--dry-run",
        "--json",
    ]);
    let line = &run.ok().json_lines()[0];
    assert_eq!(
        line["topics"],
        json!([
            "orders.retry.1",
            "orders.retry.2",
            "billing.retry.1",
            "billing.retry.2"
        ])
    );
    assert_eq!(
        (&line["reinjected"], &line["dry_run"]),
        (&json!(0), &json!(true))
    );
}
