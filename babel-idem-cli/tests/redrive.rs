//! `babel-idem redrive` and `babel-idem dlq`, run as an operator runs them,
//! against the shared Redis and RabbitMQ (`BABEL_IDEM_REDIS_URL`,
//! `BABEL_IDEM_AMQP_URL`; without them a test prints a `skipped:` line, and
//! fails under `BABEL_IDEM_REQUIRE_SERVERS=1`). The crash tests `kill -9`
//! the binary part way through a run.

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use babel_idem::Envelope;
use babel_idem::Store;
use babel_idem::envelope::{DeadLetter, DeadLetterReason};
use babel_idem::redrive::Redrive;
use babel_idem::store::RedisStore;
use babel_idem::transport::AmqpTransport;
use redis::AsyncCommands;
use serde_json::{Value, json};

#[allow(
    dead_code,
    unreachable_pub,
    reason = "the shared helpers, public for the root package's tests; this file uses some"
)]
#[path = "../../babel-idem/tests/store_contract/servers.rs"]
mod servers;

use servers::{REDIS_URL, server_url, unique_suffix};

const BIN: &str = env!("CARGO_BIN_EXE_babel-idem");
const AMQP_URL: &str = "BABEL_IDEM_AMQP_URL";
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
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start babel-idem")
}

fn record(id: &str, queue: &str, reason: DeadLetterReason) -> Vec<u8> {
    let mut envelope = Envelope::new(URN, json!({"order": id}))
        .with_id(id)
        .with_queue(queue)
        .with_attempts(3);
    envelope.dead_letter = Some(DeadLetter::new(reason, queue, 3).with_error("timeout"));
    envelope.to_vec()
}

fn id_of(body: &[u8]) -> String {
    let value: Value = serde_json::from_slice(body).unwrap();
    value["meta"]["id"].as_str().unwrap().to_owned()
}

/// A test's queue and its DLQ on the shared Redis; keys deleted on drop.
struct RedisQueue {
    url: String,
    name: String,
}

impl RedisQueue {
    fn new(url: &str) -> Self {
        RedisQueue {
            url: url.to_owned(),
            name: format!("bi-cli-redrive-{}", unique_suffix()),
        }
    }

    fn dlq(&self) -> String {
        format!("{}.dlq", self.name)
    }

    async fn raw(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.url.as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }

    async fn fill(&self, values: &[Vec<u8>]) {
        let mut raw = self.raw().await;
        for chunk in values.chunks(500) {
            let _: () = raw.rpush(self.dlq(), chunk).await.unwrap();
        }
    }

    async fn values(&self, key: &str) -> Vec<Vec<u8>> {
        self.raw().await.lrange(key, 0, -1).await.unwrap()
    }
}

impl Drop for RedisQueue {
    fn drop(&mut self) {
        if let Ok(client) = redis::Client::open(self.url.as_str())
            && let Ok(mut connection) = client.get_connection()
        {
            let _: redis::RedisResult<()> = redis::cmd("DEL")
                .arg(&self.name)
                .arg(self.dlq())
                .arg(format!("{}.sandbox", self.name))
                .query(&mut connection);
        }
    }
}

/// Where each id is after a run: how many copies sit in the DLQ and on
/// the work queue.
fn placement(dead: &[String], work: &[String]) -> HashMap<String, (usize, usize)> {
    let mut at: HashMap<String, (usize, usize)> = HashMap::new();
    for id in dead {
        at.entry(id.clone()).or_default().0 += 1;
    }
    for id in work {
        at.entry(id.clone()).or_default().1 += 1;
    }
    at
}

#[tokio::test]
async fn redrive_killed_mid_run_on_redis_leaves_every_message_in_the_dlq_or_on_the_queue() {
    const TEST: &str = "redrive_killed_mid_run_on_redis";
    let Some(url) = server_url(REDIS_URL, TEST) else {
        return;
    };
    let queue = RedisQueue::new(&url);
    let ids: Vec<String> = (0..1000).map(|n| format!("k-{n}")).collect();
    let records: Vec<Vec<u8>> = ids
        .iter()
        .map(|id| record(id, &queue.name, DeadLetterReason::Failed))
        .collect();
    queue.fill(&records).await;
    let mut child = spawn(&[
        "redrive",
        "--redis",
        &url,
        "--from",
        &queue.dlq(),
        "--rate",
        "400",
    ]);
    let started = Instant::now();
    loop {
        let moved: usize = queue.raw().await.llen(&queue.name).await.unwrap();
        if moved >= 100 {
            break;
        }
        assert!(started.elapsed() < PATIENCE, "the redrive moved nothing");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    child.kill().expect("kill -9 the redrive");
    child.wait().unwrap();

    let dead: Vec<String> = queue
        .values(&queue.dlq())
        .await
        .iter()
        .map(|v| id_of(v))
        .collect();
    let work: Vec<String> = queue
        .values(&queue.name)
        .await
        .iter()
        .map(|v| id_of(v))
        .collect();
    assert!(
        !work.is_empty() && work.len() < 1000,
        "killed mid-run: {}",
        work.len()
    );
    let at = placement(&dead, &work);
    let in_both = at.values().filter(|(d, w)| *d > 0 && *w > 0).count();
    eprintln!(
        "after kill -9: {} in the DLQ, {} on the queue, {in_both} in both",
        dead.len(),
        work.len()
    );
    for id in &ids {
        assert!(at.contains_key(id), "{id} was lost");
    }
    // On Redis one script moves a message: never in both, never twice.
    assert_eq!(in_both, 0);
    assert_eq!(dead.len() + work.len(), 1000);

    // Run again: it finishes the job.
    cli(&["redrive", "--redis", &url, "--from", &queue.dlq()]).ok();
    assert_eq!(queue.values(&queue.name).await.len(), 1000);
}

#[tokio::test]
async fn redrive_killed_mid_run_on_rabbitmq_loses_no_message() {
    const TEST: &str = "redrive_killed_mid_run_on_rabbitmq";
    let Some(url) = server_url(AMQP_URL, TEST) else {
        return;
    };
    let name = format!("bi-cli-redrive-{}", unique_suffix());
    let dlq = format!("{name}.dlq");
    let transport = AmqpTransport::connect(&url).await.unwrap();
    let ids: Vec<String> = (0..1000).map(|n| format!("k-{n}")).collect();
    let records: Vec<Vec<u8>> = ids
        .iter()
        .map(|id| record(id, &name, DeadLetterReason::Failed))
        .collect();
    transport.publish_many(&dlq, &records).await.unwrap();
    transport
        .publish_many(&name, &[] as &[Vec<u8>])
        .await
        .unwrap();
    let mut child = spawn(&["redrive", "--amqp", &url, "--from", &dlq, "--rate", "400"]);
    let started = Instant::now();
    loop {
        let moved = transport.dead_letters(&name, None).await.unwrap().len();
        if moved >= 100 {
            break;
        }
        assert!(started.elapsed() < PATIENCE, "the redrive moved nothing");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    child.kill().expect("kill -9 the redrive");
    child.wait().unwrap();

    // The broker puts the dead process's unacked messages back.
    let mut at = HashMap::new();
    let started = Instant::now();
    while started.elapsed() < PATIENCE {
        let dead: Vec<String> = transport
            .dead_letters(&dlq, None)
            .await
            .unwrap()
            .iter()
            .map(|r| r.id.clone().unwrap())
            .collect();
        let work: Vec<String> = transport
            .dead_letters(&name, None)
            .await
            .unwrap()
            .iter()
            .map(|r| r.id.clone().unwrap())
            .collect();
        at = placement(&dead, &work);
        if ids.iter().all(|id| at.contains_key(id)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for id in &ids {
        assert!(at.contains_key(id), "{id} was lost");
    }
    let in_both = at.values().filter(|(d, w)| *d > 0 && *w > 0).count();
    let moved = at.values().filter(|(d, w)| *d == 0 && *w > 0).count();
    eprintln!("after kill -9: {moved} moved, {in_both} in both (same meta.id), none lost");
    assert!(moved > 0 && moved < 1000, "killed mid-run: {moved}");
    assert!(
        at.values().all(|(d, w)| *d <= 1 && *w <= 1),
        "no message copied twice over"
    );

    let _ = transport.delete_queue(&name).await;
    let _ = transport.delete_queue(&dlq).await;
}

#[tokio::test]
async fn dry_run_lists_the_plan_and_moves_nothing() {
    const TEST: &str = "cli_dry_run_moves_nothing";
    let Some(url) = server_url(REDIS_URL, TEST) else {
        return;
    };
    let queue = RedisQueue::new(&url);
    let records = vec![
        record("d-0", &queue.name, DeadLetterReason::Failed),
        record("d-1", &queue.name, DeadLetterReason::UnknownUrn),
        b"not json".to_vec(),
    ];
    queue.fill(&records).await;
    let run = cli(&[
        "--dry-run",
        "--json",
        "redrive",
        "--redis",
        &url,
        "--from",
        &queue.dlq(),
    ]);
    run.ok();
    let lines = run.json_lines();
    let summary = lines.last().unwrap();
    assert_eq!(
        (
            &summary["would_move"],
            &summary["moved"],
            &summary["left"],
            &summary["dry_run"]
        ),
        (&json!(2), &json!(0), &json!(1), &json!(true)),
        "{run:?}"
    );
    assert_eq!(lines[0]["outcome"], "would move");
    assert_eq!(lines[0]["to"], queue.name.as_str());
    assert_eq!(queue.values(&queue.dlq()).await, records);
    assert!(queue.values(&queue.name).await.is_empty());

    // Selected by reason, for real, to a sandbox: only d-1 moves.
    let sandbox = format!("{}.sandbox", queue.name);
    let run = cli(&[
        "redrive",
        "--redis",
        &url,
        "--from",
        &queue.dlq(),
        "--reason",
        "unknown_urn",
        "--to",
        &sandbox,
    ]);
    run.ok();
    assert!(
        run.stdout
            .lines()
            .last()
            .unwrap()
            .starts_with("moved 1, skipped 2, left 0"),
        "{run:?}"
    );
    let moved: Vec<String> = queue
        .values(&sandbox)
        .await
        .iter()
        .map(|v| id_of(v))
        .collect();
    assert_eq!(moved, ["d-1"]);
}

#[tokio::test]
async fn dlq_list_show_and_stats_read_and_change_nothing() {
    const TEST: &str = "cli_dlq_list_show_stats";
    let Some(url) = server_url(REDIS_URL, TEST) else {
        return;
    };
    let queue = RedisQueue::new(&url);
    let records = vec![
        record("l-0", &queue.name, DeadLetterReason::Failed),
        record("l-1", &queue.name, DeadLetterReason::UnknownUrn),
        record("l-2", &queue.name, DeadLetterReason::Failed),
    ];
    queue.fill(&records).await;
    let run = cli(&[
        "--json",
        "dlq",
        "list",
        "--redis",
        &url,
        &queue.dlq(),
        "--reason",
        "failed",
    ]);
    run.ok();
    let ids: Vec<Value> = run.json_lines().iter().map(|l| l["id"].clone()).collect();
    assert_eq!(ids, [json!("l-0"), json!("l-2")]);

    let run = cli(&[
        "--json",
        "dlq",
        "show",
        "--redis",
        &url,
        &queue.dlq(),
        "l-1",
    ]);
    run.ok();
    let shown = &run.json_lines()[0];
    assert_eq!(shown["reason"], "unknown_urn");
    assert_eq!(shown["body"]["meta"]["id"], "l-1");
    assert_eq!(shown["error"], "timeout");
    cli(&["dlq", "show", "--redis", &url, &queue.dlq(), "#2"]).ok();
    cli(&["dlq", "show", "--redis", &url, &queue.dlq(), "nope"]).refused(1, "no message");

    let run = cli(&["--json", "dlq", "stats", "--redis", &url, &queue.dlq()]);
    run.ok();
    let stats = &run.json_lines()[0];
    assert_eq!(stats["messages"], 3);
    assert_eq!(stats["by_reason"], json!({"failed": 2, "unknown_urn": 1}));
    assert_eq!(stats["by_urn"], json!({URN: 3}));
    assert_eq!(stats["by_original_queue"][&queue.name], 3);
    assert_eq!(queue.values(&queue.dlq()).await, records);
}

#[tokio::test]
async fn forget_in_forgets_exactly_the_moved_ids_first() {
    const TEST: &str = "cli_forget_in";
    let Some(url) = server_url(REDIS_URL, TEST) else {
        return;
    };
    let queue = RedisQueue::new(&url);
    let prefix = format!("bi-cli-seen-{}:", unique_suffix());
    let store = RedisStore::builder()
        .prefix(&prefix)
        .connect_lazy(&url)
        .unwrap();
    for id in ["f-0", "f-1", "f-2"] {
        store.remember(id).await.unwrap();
    }
    queue
        .fill(&[
            record("f-0", &queue.name, DeadLetterReason::Failed),
            record("f-1", &queue.name, DeadLetterReason::UnknownUrn),
        ])
        .await;
    let run = cli(&[
        "--prefix",
        &prefix,
        "redrive",
        "--redis",
        &url,
        "--from",
        &queue.dlq(),
        "--reason",
        "failed",
        "--forget-in",
        &url,
    ]);
    run.ok();
    assert!(run.stdout.starts_with("forgot 1 of 1 ids"), "{run:?}");
    assert!(!store.seen("f-0").await.unwrap(), "the moved id runs again");
    assert!(
        store.seen("f-1").await.unwrap(),
        "a message that stayed keeps its mark"
    );
    assert!(store.seen("f-2").await.unwrap());
    let moved: Vec<String> = queue
        .values(&queue.name)
        .await
        .iter()
        .map(|v| id_of(v))
        .collect();
    assert_eq!(moved, ["f-0"]);
    for id in ["f-1", "f-2"] {
        store.forget(id).await.unwrap();
    }
}

#[tokio::test]
async fn bad_input_is_one_clear_line_a_non_zero_exit_and_nothing_moved() {
    const TEST: &str = "cli_redrive_bad_input";
    let (Some(redis_url), Some(amqp_url)) =
        (server_url(REDIS_URL, TEST), server_url(AMQP_URL, TEST))
    else {
        return;
    };
    let queue = RedisQueue::new(&redis_url);
    let records = vec![record("b-0", &queue.name, DeadLetterReason::Failed)];
    queue.fill(&records).await;
    let dlq = queue.dlq();
    let redrive = |extra: &[&str]| {
        let mut args = vec![
            "redrive",
            "--redis",
            redis_url.as_str(),
            "--from",
            dlq.as_str(),
        ];
        args.extend(extra);
        cli(&args)
    };
    redrive(&["--to", "has space"]).refused(2, "invalid queue name");
    redrive(&["--to", "orders:processing"]).refused(2, "invalid queue name");
    redrive(&["--since", "yesterday"]).refused(2, "not a point in time");
    redrive(&["--until", "2026-13-45T00:00:00Z"]).refused(2, "not a point in time");
    assert_eq!(queue.values(&queue.dlq()).await, records, "nothing moved");

    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let refused_redis = format!("redis://127.0.0.1:{closed}/");
    cli(&["redrive", "--redis", &refused_redis, "--from", "orders.dlq"]).refused(3, "connect");
    let refused_amqp = format!("amqp://guest:guest@127.0.0.1:{closed}/%2f");
    cli(&["redrive", "--amqp", &refused_amqp, "--from", "orders.dlq"]).refused(3, "connect");

    let missing = format!("bi-cli-missing-{}.dlq", unique_suffix());
    cli(&["redrive", "--amqp", &amqp_url, "--from", &missing]).refused(4, "does not exist");
    cli(&["dlq", "list", "--amqp", &amqp_url, &missing]).refused(4, "does not exist");
    let secret = "amqp://guest:sup3rsecret@127.0.0.1:1/%2f";
    let run = cli(&["dlq", "stats", "--amqp", secret, "orders.dlq"]);
    run.refused(3, "connect");
    assert!(!run.stderr.contains("sup3rsecret"), "{run:?}");

    // An empty (on Redis: missing) DLQ is nothing to redrive.
    let empty = format!("bi-cli-empty-{}.dlq", unique_suffix());
    let run = cli(&["redrive", "--redis", &redis_url, "--from", &empty]);
    run.ok();
    assert!(run.stdout.contains("nothing to redrive"), "{run:?}");
}

/// Records holding numbers no `f64` holds, as the family writes them: a
/// poison body spliced as written, and an envelope whose 400-digit integer
/// is kept as digits. `dlq list|show|stats` read each for what it is (an
/// undecodable body says why), `show --json` gives the body with its
/// numbers as written, and `redrive --include-poison` puts the poison body
/// back byte for byte.
#[tokio::test]
async fn dlq_and_redrive_read_records_holding_numbers_beyond_a_float() {
    const TEST: &str = "cli_dlq_numbers_beyond_a_float";
    let Some(url) = server_url(REDIS_URL, TEST) else {
        return;
    };
    let queue = RedisQueue::new(&url);
    let huge = format!("1{}", "7".repeat(399));
    let block = |reason: &str| {
        format!(
            r#"{{"reason":"{reason}","error":"why","exception":null,"failed_at":1796093299000,"original_queue":"{}","attempts":0,"lang":"python"}}"#,
            queue.name
        )
    };
    let poison_body = format!(r#"{{"order": "p-1", "amount": 1e400, "n": {huge}}}"#);
    let poison = format!(
        r#"{},"dead_letter":{}}}"#,
        &poison_body[..poison_body.len() - 1],
        block("poison")
    );
    let envelope = format!(
        r#"{{"job":"{URN}","trace_id":"t-big","data":{{"n":{huge}}},"meta":{{"id":"big-1","queue":"{}","schema_version":1}},"attempts":3,"dead_letter":{}}}"#,
        queue.name,
        block("failed")
    );
    let records = vec![
        poison.clone().into_bytes(),
        envelope.clone().into_bytes(),
        b"not json".to_vec(),
    ];
    queue.fill(&records).await;

    let run = cli(&["--json", "dlq", "list", "--redis", &url, &queue.dlq()]);
    run.ok();
    let lines = run.json_lines();
    let kinds: Vec<(&Value, &Value, &Value)> = lines
        .iter()
        .map(|l| (&l["kind"], &l["reason"], &l["id"]))
        .collect();
    assert_eq!(
        kinds,
        [
            (&json!("poison"), &json!("poison"), &json!(null)),
            (&json!("envelope"), &json!("failed"), &json!("big-1")),
            (&json!("undecodable"), &json!(""), &json!(null)),
        ],
        "{run:?}"
    );
    assert_eq!(lines[0]["original_queue"], queue.name.as_str());
    let why = lines[2]["error"]
        .as_str()
        .expect("an undecodable body says why");
    assert!(why.contains("JSON"), "{why}");
    let run = cli(&["dlq", "list", "--redis", &url, &queue.dlq()]);
    run.ok();
    assert!(
        run.stdout
            .lines()
            .nth(2)
            .unwrap()
            .contains("not valid JSON"),
        "{run:?}"
    );

    let run = cli(&["--json", "dlq", "show", "--redis", &url, &queue.dlq(), "#0"]);
    run.ok();
    assert!(
        run.stdout
            .contains(&format!(r#""amount":1e400,"n":{huge}"#)),
        "the body's numbers as written: {run:?}"
    );
    assert_eq!(run.stdout.lines().count(), 1, "one JSON object: {run:?}");
    let run = cli(&["dlq", "show", "--redis", &url, &queue.dlq(), "big-1"]);
    run.ok();
    assert!(run.stdout.contains(&huge), "{run:?}");
    let run = cli(&["--json", "dlq", "stats", "--redis", &url, &queue.dlq()]);
    run.ok();
    let stats = &run.json_lines()[0];
    assert_eq!(
        stats["by_reason"],
        json!({"poison": 1, "failed": 1, "-": 1}),
        "{run:?}"
    );

    let sandbox = format!("{}.sandbox", queue.name);
    let run = cli(&[
        "redrive",
        "--redis",
        &url,
        "--from",
        &queue.dlq(),
        "--include-poison",
        "--to",
        &sandbox,
    ]);
    run.ok();
    assert!(
        run.stdout
            .lines()
            .last()
            .unwrap()
            .starts_with("moved 3, skipped 0, left 0"),
        "{run:?}"
    );
    let moved = queue.values(&sandbox).await;
    assert_eq!(
        moved[0],
        poison_body.as_bytes(),
        "the poison body as written"
    );
    let redriven = String::from_utf8(moved[1].clone()).unwrap();
    assert!(redriven.contains(&format!(r#""n":{huge}"#)), "{redriven}");
    assert_eq!(moved[2], b"not json");
}
