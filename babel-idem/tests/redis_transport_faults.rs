//! `RedisTransport` under faults a worker does not cause itself: a worker
//! whose clock runs ahead of the others', and layout keys of the wrong type.
//! Reservation deadlines are written and swept by the Redis server's clock,
//! and a script that cannot finish changes nothing.
//!
//! Environment: `BABEL_IDEM_REDIS_URL` (the shared server); the skewed worker
//! needs Debian's `faketime`. Without them a test prints `skipped:`, and with
//! `BABEL_IDEM_REQUIRE_SERVERS=1` it fails instead.
#![cfg(all(feature = "redis-transport", feature = "redis", feature = "sqlite"))]

mod consumer_support;
mod store_contract;

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use babel_idem::transport::{RedisTransport, Settlement, Transport, TransportError};
use babel_idem::{Consumer, Envelope, Router, urn};
use redis::AsyncCommands;
use serde_json::{Value, json};
use store_contract::servers::{REDIS_URL, server_url, skip_or_fail};

use consumer_support::redis_queue::Queue;
use consumer_support::{PATIENCE, envelope_with_id, eventually};

/// The Redis server's clock, in microseconds since the Unix epoch.
async fn server_micros(queue: &Queue) -> u64 {
    let (seconds, micros): (u64, u64) = redis::cmd("TIME")
        .query_async(&mut queue.raw().await)
        .await
        .unwrap();
    seconds * 1_000_000 + micros
}

/// The deadline members of `queue` with their scores.
async fn deadline_scores(queue: &Queue) -> Vec<(String, f64)> {
    queue
        .raw()
        .await
        .zrange_withscores(queue.deadlines(), 0, -1)
        .await
        .unwrap()
}

async fn list(queue: &Queue, key: &str) -> Vec<Vec<u8>> {
    queue.raw().await.lrange(key, 0, -1).await.unwrap()
}

/// Replaces `key` with a string: a list or sorted set key of the wrong type.
async fn set_to_a_string(queue: &Queue, key: &str) {
    let _: () = queue.raw().await.set(key, "not a list").await.unwrap();
}

async fn delete(queue: &Queue, key: &str) {
    let _: i64 = queue.raw().await.del(key).await.unwrap();
}

fn assert_wrong_type(error: &TransportError, key: &str) {
    assert!(
        matches!(error, TransportError::Broker(_)),
        "a broker error, not {error:?}"
    );
    let text = error.to_string();
    assert!(
        text.contains("WRONGTYPE") && text.contains(key),
        "the error names the key of the wrong type: {text}"
    );
}

// ---------------------------------------------------------------- the server's clock

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_lasts_at_least_retry_after_by_the_servers_clock_and_under_two_seconds_more()
{
    const TEST: &str = "a_reservation_lasts_at_least_retry_after_by_the_servers_clock";
    let Some(url) = server_url(REDIS_URL, TEST) else {
        return;
    };
    let queue = Queue::new(&url);
    let retry_after = Duration::from_millis(1_500);
    let transport = RedisTransport::builder()
        .retry_after(retry_after)
        .connect(&url)
        .await
        .unwrap();
    for n in 0..3 {
        let body = envelope_with_id(&format!("clock-{n}"), &queue.name, n).to_vec();
        transport.publish(&queue.name, &body).await.unwrap();
    }
    let before = server_micros(&queue).await;
    let reserved = transport.reserve(&queue.name, 3).await.unwrap();
    let after = server_micros(&queue).await;
    assert_eq!(reserved.len(), 3);

    let scores = deadline_scores(&queue).await;
    assert_eq!(scores.len(), 3, "{scores:?}");
    let lifetime = retry_after.as_micros() as u64;
    for (member, score) in scores {
        assert_eq!(
            score.fract(),
            0.0,
            "whole seconds, as the Python SDK sweeps"
        );
        let lapses_at = score as u64 * 1_000_000;
        assert!(
            lapses_at >= before + lifetime,
            "{member} lapses at {lapses_at} µs, reserved from {before} µs"
        );
        assert!(
            lapses_at < after + lifetime + 2_000_000,
            "{member} lapses at {lapses_at} µs, reserved by {after} µs"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_with_no_recovery_never_lapses() {
    const TEST: &str = "a_reservation_with_no_recovery_never_lapses";
    let Some(url) = server_url(REDIS_URL, TEST) else {
        return;
    };
    let queue = Queue::new(&url);
    let transport = RedisTransport::builder()
        .no_recovery()
        .connect(&url)
        .await
        .unwrap();
    let body = envelope_with_id("forever", &queue.name, 0).to_vec();
    transport.publish(&queue.name, &body).await.unwrap();
    assert_eq!(transport.reserve(&queue.name, 1).await.unwrap().len(), 1);

    let scores = deadline_scores(&queue).await;
    assert_eq!(scores.len(), 1);
    assert_eq!(scores[0].1, f64::INFINITY, "the Python SDK's +inf");
    assert_eq!(transport.sweep(&queue.name).await.unwrap(), 0);
}

/// The env var that turns [`skewed_worker_process`] into a worker.
const SKEWED_CHILD: &str = "BABEL_IDEM_SKEWED_WORKER_CHILD";

/// How far ahead the skewed worker's clock runs: past the reservations'
/// lifetime, so a sweep by its own clock would take every other worker's
/// reservation back at once.
const SKEW: &str = "+120s";

/// The reservations' lifetime in the skew test: shorter than the skew, far
/// longer than the test.
const SKEW_TEST_RESERVATION: Duration = Duration::from_secs(60);

/// The keys the skew test's workers share.
#[derive(Clone)]
struct SkewKeys {
    /// Hash: how many times each id started.
    runs: String,
    /// Hash: how many runs of each id are running now.
    running: String,
    /// Set: the ids that ran twice at once.
    overlaps: String,
    /// Once it exists, the handlers return.
    release: String,
    /// The skewed worker writes its own clock here (Unix seconds) as it starts.
    started: String,
}

impl SkewKeys {
    fn new(queue: &Queue) -> Self {
        SkewKeys {
            runs: queue.key("runs"),
            running: queue.key("running"),
            overlaps: queue.key("overlaps"),
            release: queue.key("release"),
            started: queue.key("started"),
        }
    }

    fn to_json(&self) -> Value {
        json!([
            self.runs,
            self.running,
            self.overlaps,
            self.release,
            self.started
        ])
    }

    fn from_json(value: &Value) -> Self {
        let key = |i: usize| value[i].as_str().unwrap().to_owned();
        SkewKeys {
            runs: key(0),
            running: key(1),
            overlaps: key(2),
            release: key(3),
            started: key(4),
        }
    }
}

/// The skew test's handler, in both workers: counts each id's runs, notes
/// an id that runs twice at once, and holds its delivery until the test
/// releases it (a `probe` message returns at once).
fn skew_router(url: &str, keys: SkewKeys) -> Router {
    let client = redis::Client::open(url).unwrap();
    Router::builder()
        .route(urn!("urn:babel:interop:created"), move |env: Envelope| {
            let (client, keys) = (client.clone(), keys.clone());
            async move {
                let mut raw = client.get_multiplexed_async_connection().await?;
                let id = env.meta.id.clone().unwrap_or_default();
                let _: i64 = raw.hincr(&keys.runs, &id, 1).await?;
                let running: i64 = raw.hincr(&keys.running, &id, 1).await?;
                if running > 1 {
                    let _: i64 = raw.sadd(&keys.overlaps, &id).await?;
                }
                if env.data.get("probe").is_none() {
                    while !raw.exists::<_, bool>(&keys.release).await? {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
                let _: i64 = raw.hincr(&keys.running, &id, -1).await?;
                Ok::<(), anyhow::Error>(())
            }
        })
        .build()
        .unwrap()
}

/// Not a test of its own: the worker process, run under `faketime` with its
/// clock ahead, that `a_worker_whose_clock_runs_ahead...` starts (this test
/// binary, re-run with `SKEWED_CHILD` set). It stops once its stdin closes:
/// `faketime` runs it as a child of its own, which a kill of `faketime`
/// would leave running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the skewed worker process of a_worker_whose_clock_runs_ahead_takes_no_reservation_of_another, started by that test"]
async fn skewed_worker_process() {
    let Ok(config) = std::env::var(SKEWED_CHILD) else {
        return;
    };
    let config: Value = serde_json::from_str(&config).unwrap();
    let (url, queue) = (
        config["url"].as_str().unwrap(),
        config["queue"].as_str().unwrap(),
    );
    let keys = SkewKeys::from_json(&config["keys"]);
    let own_clock = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let client = redis::Client::open(url).unwrap();
    let mut raw = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = raw.set(&keys.started, own_clock).await.unwrap();
    let transport = RedisTransport::builder()
        .retry_after(SKEW_TEST_RESERVATION)
        .connect(url)
        .await
        .unwrap();
    let stdin_closed = async {
        let read = tokio::task::spawn_blocking(|| {
            std::io::copy(&mut std::io::stdin(), &mut std::io::sink())
        });
        let _ = read.await;
    };
    Consumer::builder(skew_router(url, keys), transport, queue)
        .concurrency(8)
        .shutdown_timeout(Duration::from_secs(1))
        .build()
        .unwrap()
        .run_until(stdin_closed)
        .await;
}

/// A child process stopped when the test ends, also when it fails: its
/// stdin closes (the worker under `faketime` stops then), and it is killed.
struct StopOnDrop(std::process::Child);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        drop(self.0.stdin.take());
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Whether Debian's `faketime` can run a program.
fn faketime_installed() -> bool {
    Command::new("faketime")
        .args(["-f", SKEW, "true"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_clock_runs_ahead_takes_no_reservation_of_another_and_no_message_runs_twice()
{
    const TEST: &str = "a_worker_whose_clock_runs_ahead_takes_no_reservation_of_another";
    let Some(url) = server_url(REDIS_URL, TEST) else {
        return;
    };
    if !faketime_installed() {
        skip_or_fail(TEST, "faketime is not installed (apt-get install faketime)");
        return;
    }
    let queue = Queue::new(&url);
    let keys = SkewKeys::new(&queue);
    let transport = RedisTransport::builder()
        .retry_after(SKEW_TEST_RESERVATION)
        .connect(&url)
        .await
        .unwrap();
    let ids: Vec<String> = (0..8).map(|n| format!("skew-{n}")).collect();
    for (n, id) in ids.iter().enumerate() {
        let body = envelope_with_id(id, &queue.name, n as u64).to_vec();
        transport.publish(&queue.name, &body).await.unwrap();
    }
    // This worker's 8 slots all hold a delivery until the release, and it
    // reads nothing ahead.
    let worker = Consumer::builder(
        skew_router(&url, keys.clone()),
        transport.clone(),
        &queue.name,
    )
    .concurrency(8)
    .read_ahead(0)
    .build()
    .unwrap();

    let report = tokio::time::timeout(
        PATIENCE,
        worker.run_until(async {
            eventually("this worker holds all 8 and runs them", || async {
                queue.len(&queue.processing()).await == 8 && queue.len(&keys.runs).await == 8
            })
            .await;

            let config = json!({"url": url, "queue": queue.name, "keys": keys.to_json()});
            let _skewed = StopOnDrop(
                Command::new("faketime")
                    .args(["-f", SKEW])
                    .arg(std::env::current_exe().unwrap())
                    .args([
                        "--ignored",
                        "--exact",
                        "skewed_worker_process",
                        "--nocapture",
                    ])
                    .env(SKEWED_CHILD, config.to_string())
                    .stdin(Stdio::piped())
                    .stdout(Stdio::null())
                    .spawn()
                    .expect("start the skewed worker under faketime"),
            );
            // This worker has no free slot, so only the skewed one can run
            // the probe: once it did, it has reserved (and swept) at least once.
            let mut probe = envelope_with_id("probe", &queue.name, 99);
            probe.data.insert("probe".into(), json!(true));
            transport
                .publish(&queue.name, &probe.to_vec())
                .await
                .unwrap();
            eventually("the skewed worker ran the probe", || async {
                queue
                    .raw()
                    .await
                    .hexists::<_, _, bool>(&keys.runs, "probe")
                    .await
                    .unwrap()
            })
            .await;
            let started: u64 = queue.raw().await.get(&keys.started).await.unwrap();
            let server_now = server_micros(&queue).await / 1_000_000;
            assert!(
                started >= server_now + 100,
                "faketime put the worker's clock ahead: its {started} against the server's {server_now}"
            );

            let _: () = queue.raw().await.set(&keys.release, 1).await.unwrap();
            eventually("every delivery finished and settled", || async {
                queue.drained().await
                    && queue
                        .raw()
                        .await
                        .hvals::<_, Vec<i64>>(&keys.running)
                        .await
                        .unwrap()
                        .iter()
                        .all(|&n| n == 0)
            })
            .await;
        }),
    )
    .await
    .expect("both workers finish");

    let runs: HashMap<String, i64> = queue.raw().await.hgetall(&keys.runs).await.unwrap();
    let twice: Vec<_> = ids.iter().filter(|id| runs.get(*id) != Some(&1)).collect();
    assert!(
        twice.is_empty(),
        "each message runs once; these did not: {twice:?} ({runs:?})"
    );
    let overlaps: Vec<String> = queue.raw().await.smembers(&keys.overlaps).await.unwrap();
    assert!(overlaps.is_empty(), "ran twice at once: {overlaps:?}");
    assert_eq!(
        (report.acked, report.lapsed),
        (8, 0),
        "this worker settled its own 8: {report:?}"
    );
}

// ---------------------------------------------------------------- keys of the wrong type

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_into_a_key_of_the_wrong_type_fails_and_leaves_the_reservation_until_fixed() {
    const TEST: &str = "a_dead_letter_into_a_key_of_the_wrong_type_fails";
    let Some(url) = server_url(REDIS_URL, TEST) else {
        return;
    };
    let queue = Queue::new(&url);
    let transport = queue.transport().await;
    let body = envelope_with_id("to-the-dlq", &queue.name, 0).to_vec();
    transport.publish(&queue.name, &body).await.unwrap();
    let mut reserved = transport.reserve(&queue.name, 1).await.unwrap();
    let handle = reserved.pop().unwrap().handle;
    set_to_a_string(&queue, &queue.dlq()).await;
    let settlement = Settlement::DeadLetter {
        queue: queue.dlq(),
        body: b"{\"record\":1}".to_vec(),
    };

    for _ in 0..2 {
        let settled = transport.settle(&handle, &settlement).await;
        assert_eq!(list(&queue, &queue.processing()).await, vec![body.clone()]);
        assert_eq!(deadline_scores(&queue).await.len(), 1, "still reserved");
        assert_eq!(queue.len(&queue.name).await, 0);
        assert_wrong_type(&settled.unwrap_err(), &queue.dlq());
    }

    delete(&queue, &queue.dlq()).await;
    assert!(transport.settle(&handle, &settlement).await.unwrap());
    assert_eq!(
        list(&queue, &queue.dlq()).await,
        vec![b"{\"record\":1}".to_vec()]
    );
    assert!(queue.drained().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_consumer_retries_a_dead_letter_the_broker_refuses_and_loses_nothing() {
    const TEST: &str = "the_consumer_retries_a_dead_letter_the_broker_refuses";
    let Some(url) = server_url(REDIS_URL, TEST) else {
        return;
    };
    let queue = Queue::new(&url);
    let transport = queue.transport().await;
    let poison = b"not json at all".to_vec();
    transport.publish(&queue.name, &poison).await.unwrap();
    set_to_a_string(&queue, &queue.dlq()).await;
    let router = Router::builder()
        .route(urn!("urn:babel:interop:created"), |_env: Envelope| async {
            Ok::<(), anyhow::Error>(())
        })
        .build()
        .unwrap();
    let consumer = Consumer::builder(router, transport, &queue.name)
        .build()
        .unwrap();
    let progress = consumer.progress();

    let report = tokio::time::timeout(
        PATIENCE,
        consumer.run_until(async {
            eventually("the dead-letter failed twice and is retried", || async {
                progress.report().broker_errors >= 2
            })
            .await;
            assert_eq!(
                list(&queue, &queue.processing()).await,
                vec![poison.clone()]
            );
            assert_eq!(deadline_scores(&queue).await.len(), 1, "still reserved");
            let so_far = progress.report();
            assert_eq!((so_far.dead_lettered, so_far.lapsed), (0, 0), "{so_far:?}");

            delete(&queue, &queue.dlq()).await;
            eventually("the record reaches the fixed DLQ", || async {
                queue.len(&queue.dlq()).await == 1 && queue.drained().await
            })
            .await;
        }),
    )
    .await
    .expect("the consumer settles once the DLQ is fixed");

    assert_eq!(report.dead_lettered, 1, "{report:?}");
    assert_eq!(report.lapsed, 0, "{report:?}");
    assert!(report.broker_errors >= 2, "{report:?}");
    let record: Value =
        serde_json::from_slice(&list(&queue, &queue.dlq()).await[0]).expect("a JSON record");
    assert!(
        record.to_string().contains("not json at all"),
        "the record keeps the poison body: {record}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reserve_with_a_deadline_set_of_the_wrong_type_fails_and_moves_nothing() {
    const TEST: &str = "a_reserve_with_a_deadline_set_of_the_wrong_type";
    let Some(url) = server_url(REDIS_URL, TEST) else {
        return;
    };
    let queue = Queue::new(&url);
    let transport = queue.transport().await;
    let bodies: Vec<Vec<u8>> = (0..3)
        .map(|n| envelope_with_id(&format!("stay-{n}"), &queue.name, n).to_vec())
        .collect();
    for body in &bodies {
        transport.publish(&queue.name, body).await.unwrap();
    }
    set_to_a_string(&queue, &queue.deadlines()).await;

    let error = transport.reserve(&queue.name, 3).await.unwrap_err();
    assert_eq!(list(&queue, &queue.name).await, bodies, "still ready");
    assert_eq!(queue.len(&queue.processing()).await, 0);
    assert_wrong_type(&error, &queue.deadlines());

    delete(&queue, &queue.deadlines()).await;
    assert_eq!(transport.reserve(&queue.name, 3).await.unwrap().len(), 3);
    assert_eq!(deadline_scores(&queue).await.len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_into_a_ready_key_of_the_wrong_type_fails_and_keeps_the_lapsed_reservation() {
    const TEST: &str = "a_sweep_into_a_ready_key_of_the_wrong_type";
    let Some(url) = server_url(REDIS_URL, TEST) else {
        return;
    };
    let queue = Queue::new(&url);
    let transport = RedisTransport::builder()
        .retry_after(Duration::from_secs(1))
        .connect(&url)
        .await
        .unwrap();
    let body = envelope_with_id("lapses", &queue.name, 0).to_vec();
    transport.publish(&queue.name, &body).await.unwrap();
    assert_eq!(transport.reserve(&queue.name, 1).await.unwrap().len(), 1);
    let deadline = deadline_scores(&queue).await[0].1 as u64;
    eventually("the reservation lapsed by the server's clock", || async {
        server_micros(&queue).await / 1_000_000 >= deadline
    })
    .await;
    set_to_a_string(&queue, &queue.name).await;

    let error = transport.sweep(&queue.name).await.unwrap_err();
    assert_eq!(list(&queue, &queue.processing()).await, vec![body.clone()]);
    assert_eq!(deadline_scores(&queue).await.len(), 1, "the deadline stays");
    assert_wrong_type(&error, &queue.name);

    delete(&queue, &queue.name).await;
    assert_eq!(transport.sweep(&queue.name).await.unwrap(), 1);
    assert_eq!(list(&queue, &queue.name).await, vec![body]);
    assert_eq!(queue.len(&queue.processing()).await, 0);
    assert_eq!(queue.len(&queue.deadlines()).await, 0);
}
