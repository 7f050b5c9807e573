//! `examples/worker.rs` as a user runs it: a separate process on a real
//! Redis queue, its flags, its final JSON line, its seen-set kept on disk
//! between two runs, a graceful stop on SIGTERM and clear errors for bad
//! flags.
//!
//! Environment: `BABEL_IDEM_REDIS_URL`; without it the server tests print
//! `skipped:`, and with `BABEL_IDEM_REQUIRE_SERVERS=1` they fail instead.
//! The example is the one `cargo test --all-features` builds; a test run
//! that did not build it (`cargo test --test worker_example`) builds it first.
#![cfg(all(
    feature = "redis-transport",
    feature = "amqp-transport",
    feature = "sqlite",
    feature = "redis",
    feature = "postgres"
))]

#[path = "../babel-idem/tests/consumer_support/mod.rs"]
mod consumer_support;
mod example_binary;
#[path = "../babel-idem/tests/store_contract/mod.rs"]
mod store_contract;
#[cfg(feature = "kafka-transport")]
#[path = "../babel-idem/tests/support/mod.rs"]
mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use babel_idem::Envelope;
use babel_idem::store::{Admin, Retention, SqliteStore};
use consumer_support::amqp_queue::{AMQP_URL, Queue as AmqpQueue};
use consumer_support::redis_queue::Queue;
use redis::AsyncCommands;
use serde_json::{Value, json};
use store_contract::servers::{REDIS_URL, server_url, unique_suffix};

/// The URN the example routes.
const ORDER_CREATED: &str = "urn:babel:orders:created";

/// The example's binary, built once per test run.
fn worker_binary() -> &'static Path {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| example_binary::build("worker", &["--all-features"]))
}

fn worker(args: &[&str]) -> Command {
    let mut command = Command::new(worker_binary());
    command
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// Runs the worker to its end; its output, checked for a panic.
async fn run_worker(args: Vec<String>) -> Output {
    let output = tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        worker(&args).output().expect("start the worker example")
    })
    .await
    .unwrap();
    assert_no_panic(&output);
    output
}

fn assert_no_panic(output: &Output) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !stderr.contains("panicked"),
        "the worker panicked:\n{stderr}"
    );
}

/// The worker's last line on stdout, as JSON.
fn final_line(output: &Output) -> Value {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout.lines().last().unwrap_or_else(|| {
        panic!(
            "the worker printed nothing; stderr:\n{}",
            String::from_utf8_lossy(&output.stderr)
        )
    });
    serde_json::from_str(line).unwrap_or_else(|e| panic!("{line:?} is not JSON: {e}"))
}

/// The summary line of a worker that stopped for `stopped` (`idle`,
/// `signal`), with nothing retried, released, timed out or taken back,
/// its marks kept for the default retention.
fn counts(delivered: u64, ran: u64, skipped: u64, dead_lettered: u64, stopped: &str) -> Value {
    json!({
        "delivered": delivered,
        "ran": ran,
        "skipped": skipped,
        "retried": 0,
        "released": 0,
        "timed_out": 0,
        "taken_back": 0,
        "dead_lettered": dead_lettered,
        "stopped": stopped,
        "retention": "7d",
    })
}

/// Runs the worker to its end, killing it (and failing) if it runs longer
/// than `patience`: a wedged worker is a failure, never a hang.
async fn run_worker_within(args: Vec<String>, patience: Duration) -> Output {
    let output = tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut child = worker(&args).spawn().expect("start the worker example");
        // Read both pipes meanwhile, so a chatty worker never blocks on them.
        let stdout = child.stdout.take().unwrap();
        let stderr = child.stderr.take().unwrap();
        let read = |mut pipe: Box<dyn std::io::Read + Send>| {
            std::thread::spawn(move || {
                let mut bytes = Vec::new();
                let _ = pipe.read_to_end(&mut bytes);
                bytes
            })
        };
        let (stdout, stderr) = (read(Box::new(stdout)), read(Box::new(stderr)));
        let deadline = Instant::now() + patience;
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                let stderr = String::from_utf8_lossy(&stderr.join().unwrap()).into_owned();
                let tail: Vec<&str> = stderr.lines().rev().take(5).collect();
                panic!("the worker was still running after {patience:?}; stderr ends: {tail:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        Output {
            status,
            stdout: stdout.join().unwrap(),
            stderr: stderr.join().unwrap(),
        }
    })
    .await
    .unwrap();
    assert_no_panic(&output);
    output
}

/// The worker's summary after [`burst_of_one_id`](consumer_support::burst_of_one_id)
/// (500 copies of one id, then 200 other ids) at concurrency 64: each id
/// ran once, every other copy was skipped, nothing was retried, timed out,
/// taken back or dead-lettered; copies that went back unattempted came
/// again (and count as delivered again).
fn assert_burst_summary(output: &Output) {
    assert!(output.status.success(), "{output:?}");
    let summary = final_line(output);
    let count = |key: &str| {
        summary[key]
            .as_u64()
            .unwrap_or_else(|| panic!("the summary has no {key:?}: {summary}"))
    };
    assert_eq!(count("ran"), 201, "{summary}");
    assert_eq!(count("skipped"), 499, "{summary}");
    assert_eq!(count("retried"), 0, "{summary}");
    assert_eq!(count("timed_out"), 0, "{summary}");
    assert_eq!(count("taken_back"), 0, "{summary}");
    assert_eq!(count("dead_lettered"), 0, "{summary}");
    assert_eq!(count("delivered"), 700 + count("released"), "{summary}");
    assert_eq!(summary["stopped"], "idle", "{summary}");
}

/// One test's queue and seen-set file; the queue's keys and the file are
/// deleted on drop.
struct Fixture {
    queue: Queue,
    dir: PathBuf,
}

impl Fixture {
    fn new(url: &str) -> Self {
        let queue = Queue::new(url);
        let dir = std::env::temp_dir().join(format!("babel-idem-{}", queue.name));
        std::fs::create_dir_all(&dir).unwrap();
        Fixture { queue, dir }
    }

    /// The example's flags for this fixture, `extra` after them.
    fn args(&self, extra: &[&str]) -> Vec<String> {
        let store = format!("sqlite:{}", self.dir.join("seen.sqlite").display());
        let mut args: Vec<String> = [
            "--redis",
            &self.queue.url,
            "--queue",
            &self.queue.name,
            "--concurrency",
            "8",
            "--store",
            &store,
        ]
        .map(str::to_owned)
        .to_vec();
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        args
    }

    /// Publishes one order per id, in order, through the Redis transport.
    async fn publish(&self, ids: &[String]) {
        let transport = self.queue.transport().await;
        for (n, id) in ids.iter().enumerate() {
            let envelope = Envelope::new(ORDER_CREATED, json!({ "order_id": n }))
                .with_id(id.as_str())
                .with_queue(&self.queue.name);
            transport
                .publish(&self.queue.name, &envelope.to_vec())
                .await
                .unwrap();
        }
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn ids(prefix: &str, range: std::ops::Range<usize>) -> Vec<String> {
    range.map(|n| format!("{prefix}-{n}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_runs_each_order_once_across_two_runs_and_dead_letters_poison() {
    const TEST: &str = "the_worker_runs_each_order_once_across_two_runs";
    let Some(url) = server_url(REDIS_URL, TEST) else {
        return;
    };
    let fixture = Fixture::new(&url);
    let prefix = format!("order-{}", unique_suffix());
    // 20 orders, then 10 of them again: a redelivery within one run.
    let mut first = ids(&prefix, 0..20);
    first.extend(ids(&prefix, 5..15));
    fixture.publish(&first).await;
    let mut raw = fixture.queue.raw().await;
    let _: () = raw
        .rpush(&fixture.queue.name, "not json at all")
        .await
        .unwrap();

    let output = run_worker(fixture.args(&["--until-idle", "1s"])).await;
    assert!(output.status.success(), "{output:?}");
    assert_eq!(final_line(&output), counts(31, 20, 10, 1, "idle"));
    assert!(fixture.queue.drained().await);
    let dlq: Vec<String> = raw.lrange(fixture.queue.dlq(), 0, -1).await.unwrap();
    assert_eq!(dlq.len(), 1);
    assert!(dlq[0].contains("poison"), "{}", dlq[0]);

    // A second process on the same seen-set file: the orders already run
    // are skipped, a new one runs.
    let mut second = ids(&prefix, 15..20);
    second.extend(ids(&prefix, 20..21));
    fixture.publish(&second).await;
    let output = run_worker(fixture.args(&["--until-idle", "1s"])).await;
    assert!(output.status.success(), "{output:?}");
    assert_eq!(final_line(&output), counts(6, 1, 5, 0, "idle"));
    assert!(fixture.queue.drained().await);
}

/// `--kafka` consumes a topic in the group `--group`: every order once, a
/// redelivery skipped, a poison record dead-lettered to `<topic>.dlq`, and
/// every record committed once the worker stops.
#[cfg(feature = "kafka-transport")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_on_kafka_runs_each_order_once_and_commits_what_it_settled() {
    const TEST: &str = "the_worker_on_kafka_runs_each_order_once_and_commits_what_it_settled";
    let Some(url) = support::kafka::kafka_url(TEST) else {
        return;
    };
    let name = support::kafka::unique("bi-worker");
    let topics =
        support::kafka::Topics::create(&url, &[name.clone(), format!("{name}.dlq")], 2).await;
    let group = topics.group();
    let producer = support::kafka::producer(&url);
    let prefix = format!("order-{}", unique_suffix());
    let mut orders = ids(&prefix, 0..20);
    orders.extend(ids(&prefix, 5..15));
    for (n, id) in orders.iter().enumerate() {
        let envelope = Envelope::new(ORDER_CREATED, json!({ "order_id": n }))
            .with_id(id.as_str())
            .with_queue(&name);
        let key = id.as_bytes();
        support::kafka::produce(
            &producer,
            &name,
            support::kafka::Raw::value(&envelope.to_vec()).key(key),
        )
        .await;
    }
    support::kafka::produce(
        &producer,
        &name,
        support::kafka::Raw::value(b"not json at all"),
    )
    .await;

    let dir = std::env::temp_dir().join(format!("babel-idem-{name}"));
    std::fs::create_dir_all(&dir).unwrap();
    let store = format!("sqlite:{}", dir.join("seen.sqlite").display());
    let args = [
        "--kafka",
        &url,
        "--group",
        &group,
        "--queue",
        &name,
        "--concurrency",
        "8",
        "--store",
        &store,
        "--until-idle",
        "3s",
    ]
    .map(str::to_owned)
    .to_vec();
    let output = run_worker(args).await;
    assert!(output.status.success(), "{output:?}");
    assert_eq!(final_line(&output), counts(31, 20, 10, 1, "idle"));

    let dead =
        support::kafka::read_all(&url, &format!("{name}.dlq"), Some(1), Duration::ZERO).await;
    assert!(String::from_utf8_lossy(&dead[0].value).contains("poison"));
    let ends = support::kafka::end_offsets(&url, &name, 31).await;
    let committed = support::kafka::committed(&url, &group, &name, 2).await;
    for (partition, end) in ends {
        assert_eq!(committed[&partition], Some(end), "partition {partition}");
    }
    topics.delete().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--lease` runs claim mode: two worker processes on one queue and one
/// store, every order published twice, run each order once between them;
/// the copies a process finds claimed by the other are put back and then
/// skipped once the other committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_with_a_lease_run_each_order_once_between_them() {
    const TEST: &str = "two_workers_with_a_lease_run_each_order_once_between_them";
    let Some(url) = server_url(REDIS_URL, TEST) else {
        return;
    };
    let fixture = Fixture::new(&url);
    let orders = ids(&format!("order-{}", unique_suffix()), 0..200);
    let twice: Vec<String> = orders
        .iter()
        .flat_map(|id| [id.clone(), id.clone()])
        .collect();
    fixture.publish(&twice).await;

    let args = fixture.args(&["--until-idle", "2s", "--lease", "30s"]);
    let (first, second) = tokio::join!(run_worker(args.clone()), run_worker(args));
    let mut ran = 0;
    let mut skipped = 0;
    for output in [&first, &second] {
        assert!(output.status.success(), "{output:?}");
        let summary = final_line(output);
        assert_eq!(summary["stopped"], "idle", "{summary}");
        assert_eq!(summary["dead_lettered"], 0, "{summary}");
        ran += summary["ran"].as_u64().unwrap();
        skipped += summary["skipped"].as_u64().unwrap();
    }
    assert_eq!(ran, 200, "each order ran once between the two workers");
    assert_eq!(skipped, 200, "each second copy was skipped");
    assert!(fixture.queue.drained().await);
}

/// `--cached` and `--no-batch` change the calls made to the store, never
/// the decisions: the same orders run and the same redeliveries are skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_with_cached_or_without_batching_decides_the_same() {
    const TEST: &str = "the_worker_with_cached_or_without_batching_decides_the_same";
    let Some(url) = server_url(REDIS_URL, TEST) else {
        return;
    };
    for flags in [
        &["--cached", "5s"][..],
        &["--no-batch"],
        &["--cached", "500ms", "--no-batch"],
    ] {
        let fixture = Fixture::new(&url);
        let prefix = format!("order-{}", unique_suffix());
        let mut orders = ids(&prefix, 0..20);
        orders.extend(ids(&prefix, 5..15));
        fixture.publish(&orders).await;
        let mut args = vec!["--until-idle", "1s"];
        args.extend_from_slice(flags);
        let output = run_worker(fixture.args(&args)).await;
        assert!(output.status.success(), "{flags:?}: {output:?}");
        assert_eq!(
            final_line(&output),
            counts(30, 20, 10, 0, "idle"),
            "{flags:?}"
        );
        assert!(fixture.queue.drained().await);
    }
    let refused = worker(&["--redis", &url, "--queue", "q", "--cached", "soon"])
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("--cached: \"soon\" is not a duration")
    );
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_the_worker_with_its_counts() {
    const TEST: &str = "sigterm_stops_the_worker_with_its_counts";
    let Some(url) = server_url(REDIS_URL, TEST) else {
        return;
    };
    let fixture = Fixture::new(&url);
    fixture
        .publish(&ids(&format!("order-{}", unique_suffix()), 0..12))
        .await;
    let args = fixture.args(&[]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut child: Child = worker(&args).spawn().expect("start the worker example");

    let started = Instant::now();
    while !fixture.queue.drained().await {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the worker did not drain the queue"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let output = tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + Duration::from_secs(30);
        while child.try_wait().unwrap().is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("the worker did not stop on SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        child.wait_with_output().unwrap()
    })
    .await
    .unwrap();
    assert_no_panic(&output);
    assert!(output.status.success(), "{output:?}");
    assert_eq!(final_line(&output), counts(12, 12, 0, 0, "signal"));
    assert!(String::from_utf8_lossy(&output.stderr).contains("worker: stopping"));
}

/// 500 copies of one id ahead of 200 other ids on Redis, at concurrency 64
/// with the default settings: the worker is never wedged by the burst.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_one_id_never_wedges_the_worker_on_redis() {
    const TEST: &str = "a_burst_of_one_id_never_wedges_the_worker_on_redis";
    let Some(url) = server_url(REDIS_URL, TEST) else {
        return;
    };
    let fixture = Fixture::new(&url);
    let transport = fixture.queue.transport().await;
    let prefix = format!("burst-{}", unique_suffix());
    for body in consumer_support::burst_of_one_id(&fixture.queue.name, &prefix, 500, 200) {
        transport.publish(&fixture.queue.name, &body).await.unwrap();
    }
    let mut args = fixture.args(&["--until-idle", "2s", "--urn", consumer_support::URN]);
    let at = args.iter().position(|a| a == "--concurrency").unwrap();
    args[at + 1] = "64".to_owned();
    let output = run_worker_within(args, consumer_support::BURST_PATIENCE).await;
    assert_burst_summary(&output);
    assert!(fixture.queue.drained().await);
}

/// The same burst on RabbitMQ (the worker's prefetch: twice its concurrency).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_one_id_never_wedges_the_worker_on_rabbitmq() {
    const TEST: &str = "a_burst_of_one_id_never_wedges_the_worker_on_rabbitmq";
    let Some(url) = server_url(AMQP_URL, TEST) else {
        return;
    };
    let queue = AmqpQueue::new(&url);
    let transport = queue.transport(1).await;
    let prefix = format!("burst-{}", unique_suffix());
    let bodies = consumer_support::burst_of_one_id(&queue.name, &prefix, 500, 200);
    transport.publish_many(&queue.name, &bodies).await.unwrap();
    transport.close().await;
    let dir = std::env::temp_dir().join(format!("babel-idem-{}", queue.name));
    std::fs::create_dir_all(&dir).unwrap();
    let store = format!("sqlite:{}", dir.join("seen.sqlite").display());
    let args = [
        "--amqp",
        &url,
        "--queue",
        &queue.name,
        "--concurrency",
        "64",
        "--store",
        &store,
        "--until-idle",
        "2s",
        "--urn",
        consumer_support::URN,
    ]
    .map(str::to_owned)
    .to_vec();
    let output = run_worker_within(args, consumer_support::BURST_PATIENCE).await;
    let _ = std::fs::remove_dir_all(&dir);
    assert_burst_summary(&output);
    assert_eq!(queue.ready(&queue.name).await, 0);
    assert_eq!(queue.ready(&queue.dlq()).await, 0);
}

#[tokio::test]
async fn bad_flags_and_unreachable_brokers_are_clear_errors_without_a_panic() {
    // (flags, exit code, what stderr says)
    let cases: [(&[&str], i32, &str); 12] = [
        (
            &["--queue", "q"],
            2,
            "exactly one of --redis, --amqp and --kafka",
        ),
        (
            &[
                "--redis",
                "redis://127.0.0.1:1/",
                "--amqp",
                "amqp://x",
                "--queue",
                "q",
            ],
            2,
            "exactly one of --redis, --amqp and --kafka",
        ),
        (
            &["--amqp", "amqp://x", "--kafka", "kafka://x", "--queue", "q"],
            2,
            "exactly one of --redis, --amqp and --kafka",
        ),
        (
            &["--kafka", "redis://127.0.0.1:9092", "--queue", "q"],
            1,
            "invalid broker URL",
        ),
        (&["--redis", "redis://127.0.0.1:1/"], 2, "--queue"),
        (
            &[
                "--redis",
                "redis://h/",
                "--queue",
                "q",
                "--concurrency",
                "many",
            ],
            2,
            "--concurrency must be a whole number",
        ),
        (
            &[
                "--redis",
                "redis://h/",
                "--queue",
                "q",
                "--until-idle",
                "2 seconds",
            ],
            2,
            "--until-idle: \"2 seconds\" is not a duration",
        ),
        (
            &["--redis", "redis://h/", "--queue", "q", "--lease", "soon"],
            2,
            "--lease: \"soon\" is not a duration",
        ),
        (
            &["--redis", "redis://h/", "--queue", "q", "--lease", "0s"],
            2,
            "--lease must be longer than 0s",
        ),
        (
            &["--redis", "not a url", "--queue", "q"],
            1,
            "invalid broker URL \"not a url\"",
        ),
        // Port 1: nothing listens there, so the connection is refused.
        (
            &["--redis", "redis://127.0.0.1:1/", "--queue", "q"],
            1,
            "cannot connect to the broker",
        ),
        (
            &["--amqp", "amqp://127.0.0.1:1/", "--queue", "q"],
            1,
            "cannot connect to the broker",
        ),
    ];
    for (args, code, says) in cases {
        let output = run_worker(args.iter().map(|s| (*s).to_owned()).collect()).await;
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(code), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        assert!(output.stdout.is_empty(), "{args:?}: printed counts");
    }
}

#[tokio::test]
async fn a_queue_name_or_store_it_cannot_use_is_a_clear_error_on_a_live_broker() {
    const TEST: &str = "a_queue_name_or_store_it_cannot_use";
    let Some(url) = server_url(REDIS_URL, TEST) else {
        return;
    };
    let queue = format!("bi-worker-{}", unique_suffix());
    let cases = [
        (
            vec!["--queue", "q:processing"],
            "invalid queue name \"q:processing\"",
        ),
        (
            vec!["--queue", &queue, "--store", "mysql://x"],
            "--store must be sqlite:PATH, redis://URL, redis+cluster://HOST:PORT,... or postgres://URL",
        ),
    ];
    for (args, says) in cases {
        let mut args: Vec<String> = args.into_iter().map(str::to_owned).collect();
        args.extend(["--redis".to_owned(), url.clone()]);
        let output = run_worker(args.clone()).await;
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        assert!(output.stdout.is_empty(), "{args:?}: printed counts");
    }
}

/// `--retention` is the TTL of every mark the worker writes: on Redis each
/// id's key carries it (`none`: no expiry), on SQLite each row; the summary
/// and the start line say which.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_marks_ids_for_its_retention_and_its_summary_shows_it() {
    const TEST: &str = "the_worker_marks_ids_for_its_retention_and_its_summary_shows_it";
    let Some(url) = server_url(REDIS_URL, TEST) else {
        return;
    };
    let fixture = Fixture::new(&url);
    let mut raw = fixture.queue.raw().await;
    let redis_store = |extra: &[&str]| {
        let mut args = vec![
            "--redis",
            fixture.queue.url.as_str(),
            "--queue",
            fixture.queue.name.as_str(),
            "--store",
            url.as_str(),
            "--until-idle",
            "1s",
        ];
        args.extend_from_slice(extra);
        args.into_iter().map(str::to_owned).collect::<Vec<_>>()
    };
    // (flag, what the summary shows, the keys' PTTL range in ms; -1: none)
    let cases: [(&str, &str, std::ops::RangeInclusive<i64>); 3] = [
        ("90m", "1h30m", 3_600_001..=5_400_000),
        ("none", "forever", -1..=-1),
        ("0", "forever", -1..=-1),
    ];
    for (flag, shown, pttl) in cases {
        let prefix = format!("order-{}", unique_suffix());
        let orders = ids(&prefix, 0..5);
        let keys: Vec<String> = orders.iter().map(|id| format!("bq:idemp:{id}")).collect();
        fixture.publish(&orders).await;
        let output = run_worker(redis_store(&["--retention", flag])).await;
        let left: Vec<i64> = {
            let mut left = Vec::new();
            for key in &keys {
                left.push(raw.pttl(key).await.unwrap());
            }
            left
        };
        let _: i64 = raw.del(&keys).await.unwrap();
        assert!(output.status.success(), "{flag}: {output:?}");
        let summary = final_line(&output);
        assert_eq!(summary["ran"], 5, "{flag}: {summary}");
        assert_eq!(summary["retention"], shown, "{flag}: {summary}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains(&format!("keeps each id it marks for {shown}")),
            "{flag}: {stderr}"
        );
        for (key, left) in keys.iter().zip(left) {
            assert!(pttl.contains(&left), "{flag}: {key} has PTTL {left}");
        }
    }

    // SQLite: every row expires its retention after it was written.
    let prefix = format!("order-{}", unique_suffix());
    fixture.publish(&ids(&prefix, 0..5)).await;
    let output = run_worker(fixture.args(&["--until-idle", "1s", "--retention", "2d"])).await;
    assert!(output.status.success(), "{output:?}");
    assert_eq!(final_line(&output)["retention"], "2d");
    let seen = SqliteStore::open(fixture.dir.join("seen.sqlite"))
        .await
        .unwrap();
    assert_eq!(
        seen.stats("").await.unwrap().retention,
        Retention::Ttl(Duration::from_secs(2 * 86_400))
    );
}

/// `--help` states the default retention and why; a retention no store can
/// keep is refused before anything starts.
#[test]
fn the_retention_default_is_explained_and_bad_retentions_are_refused() {
    let help = worker(&["--help"]).output().unwrap();
    let text = String::from_utf8_lossy(&help.stderr);
    for says in [
        "--retention",
        "default 7d",
        "dead-letter queue",
        "replay",
        "1h",
    ] {
        assert!(text.contains(says), "--help does not say {says:?}: {text}");
    }
    for (value, says) in [
        ("soon", "--retention: \"soon\" is not a duration"),
        ("36501d", "longer than the longest TTL a store keeps"),
    ] {
        let refused = worker(&[
            "--redis",
            "redis://h/",
            "--queue",
            "q",
            "--retention",
            value,
        ])
        .output()
        .unwrap();
        assert_eq!(refused.status.code(), Some(2), "{value}");
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(stderr.contains(says), "{value}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}
