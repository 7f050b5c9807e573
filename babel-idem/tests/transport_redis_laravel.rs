//! `RedisTransport` in the Laravel-compatible layout (`?laravel=1`) against a
//! real Redis, with the BabelQueue Python SDK's `RedisTransport(laravel_compat=True)`
//! (`tests/python/laravel_peer.py`) as the peer producer and consumer on the
//! same queues.
//!
//! Environment: `BABEL_IDEM_REDIS_URL` (the shared server), `BABEL_IDEM_PYTHON`
//! (the peer's virtualenv python); without them a test prints `skipped:`, and
//! with `BABEL_IDEM_REQUIRE_SERVERS=1` it fails instead. Each test has queues
//! of its own, whose keys it deletes.
#![cfg(all(feature = "redis-transport", feature = "redis", feature = "sqlite"))]

mod consumer_support;
mod store_contract;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use babel_idem::broker::Publisher;
use babel_idem::consumer::ConsumerReport;
use babel_idem::transport::{Outgoing, RedisTransport, Settlement, Transport, TransportError};
use babel_idem::{Consumer, Envelope};
use redis::AsyncCommands;
use serde_json::{Value, json};
use store_contract::servers::{REDIS_URL, server_url, unique_suffix};

use consumer_support::{
    QUIET, SeenLog, SharedSeenSet, URN, assert_poison_records_as_python_writes, delete_keys,
    envelope_with_id, eventually, python, python_received, recording_router, run_until_idle,
};

/// The Python peer of these tests.
const PEER: &str = "laravel_peer.py";

/// Runs one subcommand of the Python peer; its JSON answer.
async fn peer(python: &Path, args: &[&str]) -> Value {
    let args = args.iter().map(|arg| (*arg).to_owned()).collect();
    consumer_support::peer(python, PEER, args, None).await
}

/// One test's queue in the Laravel layout: a unique name, every key of it
/// (and of its dead-letter queue) deleted on drop.
struct LaravelQueue {
    /// The server, without the layout's query.
    server: String,
    /// The server with `?laravel=1`: what the transport and the peer get.
    url: String,
    name: String,
}

impl LaravelQueue {
    fn new(server: &str) -> Self {
        LaravelQueue {
            server: server.to_owned(),
            url: format!("{server}?laravel=1"),
            name: format!("bi-laravel-{}", unique_suffix()),
        }
    }

    fn ready(&self) -> String {
        format!("queues:{}", self.name)
    }

    fn reserved(&self) -> String {
        format!("queues:{}:reserved", self.name)
    }

    fn delayed(&self) -> String {
        format!("queues:{}:delayed", self.name)
    }

    fn notify(&self) -> String {
        format!("queues:{}:notify", self.name)
    }

    fn dlq(&self) -> String {
        format!("queues:{}.dlq", self.name)
    }

    async fn raw(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.server.as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .expect("connect to the test's Redis")
    }

    async fn transport(&self) -> RedisTransport {
        RedisTransport::connect(&self.url)
            .await
            .expect("connect the transport")
    }

    async fn list(&self, key: &str) -> Vec<Vec<u8>> {
        self.raw().await.lrange(key, 0, -1).await.unwrap()
    }

    async fn zset(&self, key: &str) -> Vec<(Vec<u8>, f64)> {
        self.raw()
            .await
            .zrange_withscores(key, 0, -1)
            .await
            .unwrap()
    }

    /// Whether the ready list, the reservations, the delayed set and the
    /// wake-up tokens are all empty.
    async fn drained(&self) -> bool {
        let mut raw = self.raw().await;
        let lists: usize = raw.llen(self.ready()).await.unwrap();
        let tokens: usize = raw.llen(self.notify()).await.unwrap();
        let reserved: usize = raw.zcard(self.reserved()).await.unwrap();
        let delayed: usize = raw.zcard(self.delayed()).await.unwrap();
        (lists, tokens, reserved, delayed) == (0, 0, 0, 0)
    }

    /// Runs a consumer of [`recording_router`] (failing every delivery when
    /// `fail` says so) with `concurrency` handlers on this queue until it is
    /// idle: its report, and what the handler saw.
    async fn consume(&self, fail: bool, concurrency: usize) -> (ConsumerReport, SeenLog) {
        let log = SeenLog::default();
        let router = recording_router(Arc::clone(&log), fail);
        let consumer = Consumer::builder(router, self.transport().await, &self.name)
            .concurrency(concurrency)
            .build()
            .unwrap();
        (run_until_idle(&consumer, QUIET).await, log)
    }

    /// The server's clock, whole seconds.
    async fn server_now(&self) -> u64 {
        let (seconds, _): (u64, u64) = redis::cmd("TIME")
            .query_async(&mut self.raw().await)
            .await
            .unwrap();
        seconds
    }
}

impl Drop for LaravelQueue {
    fn drop(&mut self) {
        delete_keys(&self.server, &[&format!("queues:{}*", self.name)]);
    }
}

/// The Redis server and the peer's python, or `None` after a skip line.
fn servers(test: &str) -> Option<(String, std::path::PathBuf)> {
    match (server_url(REDIS_URL, test), python(test)) {
        (Some(url), Some(python)) => Some((url, python)),
        _ => None,
    }
}

/// Checks that the handler saw each message of `sent` (the peer's answer)
/// once, with its URN and data, and no transport header (the layout stores
/// none).
fn seen_once_as_sent(sent: &Value, log: &SeenLog) {
    let seen = log.lock().unwrap();
    let sent = sent.as_array().unwrap();
    assert_eq!(seen.len(), sent.len(), "one run a message: {seen:?}");
    for message in sent {
        let id = message["id"].as_str().unwrap();
        let got: Vec<_> = seen.iter().filter(|s| s.id == id).collect();
        assert_eq!(got.len(), 1, "{id} ran once");
        assert_eq!(got[0].urn, URN);
        assert_eq!(got[0].data, message["data"]);
        assert_eq!(got[0].attempts, 0);
        assert!(got[0].headers.is_empty(), "{:?}", got[0].headers);
    }
}

fn our_envelope(queue: &str, n: u64) -> Envelope {
    Envelope::new(URN, json!({"n": n, "text": "héllo \u{2028} \"q\""})).with_queue(queue)
}

// ---------------------------------------------------------------- interop

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_publishes_and_babel_idem_consumes_on_the_laravel_layout() {
    const TEST: &str = "laravel_python_publishes_and_babel_idem_consumes";
    let Some((server, python)) = servers(TEST) else {
        return;
    };
    let queue = LaravelQueue::new(&server);
    let sent = peer(&python, &["publish", &queue.url, &queue.name, "25"]).await;
    assert_eq!(queue.list(&queue.ready()).await.len(), 25);
    assert_eq!(queue.list(&queue.notify()).await, vec![b"1".to_vec(); 25]);

    let (report, log) = queue.consume(false, 8).await;
    assert_eq!(report.acked, 25, "{report:?}");
    seen_once_as_sent(&sent, &log);
    assert!(queue.drained().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn babel_idem_publishes_bare_jobs_with_a_wake_up_token_each_and_python_consumes_them() {
    const TEST: &str = "laravel_babel_idem_publishes_and_python_consumes";
    let Some((server, python)) = servers(TEST) else {
        return;
    };
    let queue = LaravelQueue::new(&server);
    let transport = queue.transport().await;
    let sent: Vec<Envelope> = (0..8).map(|n| our_envelope(&queue.name, n)).collect();
    let bodies: Vec<Vec<u8>> = sent.iter().map(Envelope::to_vec).collect();
    let headers = [("traceparent".to_owned(), "00-ab".to_owned())];
    for body in &bodies[..3] {
        transport.publish(&queue.name, body).await.unwrap();
    }
    let text = String::from_utf8(bodies[3].clone()).unwrap();
    transport
        .publish_with_headers(&queue.name, &text, &headers)
        .await
        .unwrap();
    transport
        .publish_body(&queue.name, &bodies[4], &headers)
        .await
        .unwrap();
    let batch: Vec<Outgoing<'_>> = bodies[5..]
        .iter()
        .map(|body| Outgoing::new(&queue.name, body).with_headers(&headers))
        .collect();
    let outcome = Publisher::publish_batch(&transport, &batch).await.unwrap();
    assert!(outcome.iter().all(Result::is_ok), "{outcome:?}");

    // The jobs as they were given, headers dropped, one token each.
    assert_eq!(queue.list(&queue.ready()).await, bodies);
    assert_eq!(queue.list(&queue.notify()).await, vec![b"1".to_vec(); 8]);

    let out = peer(&python, &["consume", &queue.url, &queue.name, "0.5"]).await;
    let by_id = python_received(&out, &sent.iter().collect::<Vec<_>>());
    for received in by_id.values() {
        assert_eq!(received["headers"], json!({}));
    }
    assert!(queue.drained().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_and_babel_idem_workers_share_one_laravel_queue_and_run_each_id_once() {
    const TEST: &str = "laravel_workers_share_one_seen_set";
    let Some((server, python)) = servers(TEST) else {
        return;
    };
    let queue = LaravelQueue::new(&server);
    let transport = queue.transport().await;
    let scenario = SharedSeenSet::new(&queue.name, &server);
    for body in scenario.bodies(&queue.name) {
        transport.publish(&queue.name, &body).await.unwrap();
    }
    let redeliveries = async {
        for body in scenario.redeliveries(&queue.name).await {
            transport.publish(&queue.name, &body).await.unwrap();
        }
    };
    let python_worker = scenario.python_worker(&python, PEER, &queue.url, &queue.name, &[]);
    let consumer = scenario.consumer(transport.clone(), &queue.name);
    let rust_worker = scenario.run_after_python(&consumer);
    let (python_out, report, ()) = tokio::join!(python_worker, rust_worker, redeliveries);

    scenario.assert_each_id_ran_once(&python_out, &report).await;
    assert!(queue.drained().await);
}

// ---------------------------------------------------------------- delayed

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_job_waits_in_the_delayed_set_and_no_worker_takes_it_early() {
    const TEST: &str = "laravel_a_delayed_job_waits";
    let Some((server, python)) = servers(TEST) else {
        return;
    };
    let queue = LaravelQueue::new(&server);
    let transport = queue.transport().await;
    let ours = our_envelope(&queue.name, 1).to_vec();
    let before = queue.server_now().await;
    transport
        .publish_delayed(&queue.name, &ours, Duration::from_secs(3600))
        .await
        .unwrap();
    peer(
        &python,
        &["publish-delayed", &queue.url, &queue.name, "1", "3600"],
    )
    .await;
    let after = queue.server_now().await;

    let delayed = queue.zset(&queue.delayed()).await;
    assert_eq!(delayed.len(), 2, "both wait in :delayed");
    let (_, score) = delayed.iter().find(|(member, _)| *member == ours).unwrap();
    assert!(
        (before + 3600..=after + 3600).contains(&(*score as u64)),
        "due an hour from the server's now: {score}, now {before}..{after}"
    );
    assert!(queue.list(&queue.ready()).await.is_empty());
    assert!(queue.list(&queue.notify()).await.is_empty(), "no token yet");

    // Neither worker takes them before they are due.
    assert!(transport.reserve(&queue.name, 10).await.unwrap().is_empty());
    let out = peer(&python, &["consume", &queue.url, &queue.name, "0.5"]).await;
    assert_eq!(out["processed"], 0, "{out}");
    assert_eq!(queue.zset(&queue.delayed()).await, delayed);
}

/// Waits until every member of `queue`'s delayed set is due by the server's clock.
async fn until_due(queue: &LaravelQueue) {
    let due = queue
        .zset(&queue.delayed())
        .await
        .iter()
        .map(|(_, score)| *score as u64)
        .max()
        .expect("a delayed job");
    eventually("the delayed jobs are due", || async {
        queue.server_now().await >= due
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_job_reaches_the_other_sides_worker_once_due() {
    const TEST: &str = "laravel_a_delayed_job_reaches_the_other_side";
    let Some((server, python)) = servers(TEST) else {
        return;
    };
    // Ours published, Python consumes.
    let to_python = LaravelQueue::new(&server);
    let transport = to_python.transport().await;
    let envelope = our_envelope(&to_python.name, 7);
    transport
        .publish_delayed(&to_python.name, &envelope.to_vec(), Duration::from_secs(1))
        .await
        .unwrap();
    until_due(&to_python).await;
    let out = peer(
        &python,
        &["consume", &to_python.url, &to_python.name, "0.5"],
    )
    .await;
    python_received(&out, &[&envelope]);
    assert!(to_python.drained().await);

    // Python published, ours consumes.
    let to_us = LaravelQueue::new(&server);
    let sent = peer(
        &python,
        &["publish-delayed", &to_us.url, &to_us.name, "3", "1"],
    )
    .await;
    until_due(&to_us).await;
    let (report, log) = to_us.consume(false, 4).await;
    assert_eq!(report.acked, 3, "{report:?}");
    seen_once_as_sent(&sent, &log);
    assert!(to_us.drained().await);
}

#[tokio::test]
async fn the_legacy_layout_refuses_publish_delayed_and_writes_nothing() {
    const TEST: &str = "laravel_the_legacy_layout_refuses_publish_delayed";
    let Some(server) = server_url(REDIS_URL, TEST) else {
        return;
    };
    let queue = LaravelQueue::new(&server);
    let legacy = RedisTransport::connect(&server).await.unwrap();
    let error = legacy
        .publish_delayed(&queue.name, b"{}", Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(
        matches!(error, TransportError::Unsupported { .. }),
        "{error:?}"
    );
    assert!(error.to_string().contains("Laravel"), "{error}");
    let mut raw = queue.raw().await;
    let keys: Vec<String> = raw.keys(format!("*{}*", queue.name)).await.unwrap();
    assert!(keys.is_empty(), "{keys:?}");
}

#[tokio::test]
async fn a_key_prefix_names_every_key_of_the_layout() {
    const TEST: &str = "laravel_a_key_prefix_names_every_key";
    let Some(server) = server_url(REDIS_URL, TEST) else {
        return;
    };
    let name = format!("bi-laravel-{}", unique_suffix());
    let prefix = format!("bi-app-{name}:");
    let by_url = RedisTransport::connect(&format!("{server}?laravel=1&prefix={prefix}"))
        .await
        .unwrap();
    let by_builder = RedisTransport::builder()
        .laravel_layout()
        .key_prefix(&prefix)
        .connect(&server)
        .await
        .unwrap();
    by_url.publish(&name, b"{\"attempts\":0}").await.unwrap();
    by_builder
        .publish_delayed(&name, b"{\"attempts\":1}", Duration::from_secs(60))
        .await
        .unwrap();
    let mut raw = redis::Client::open(server.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let mut keys: Vec<String> = raw.keys(format!("{prefix}*")).await.unwrap();
    keys.sort();
    delete_keys(&server, &[&format!("{prefix}*")]);
    assert_eq!(
        keys,
        [
            format!("{prefix}{name}"),
            format!("{prefix}{name}:delayed"),
            format!("{prefix}{name}:notify"),
        ]
    );
}

// ---------------------------------------------------------------- settling

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_goes_back_through_the_delayed_set_and_python_sees_its_attempt() {
    const TEST: &str = "laravel_a_retry_goes_back_through_the_delayed_set";
    let Some((server, python)) = servers(TEST) else {
        return;
    };
    let queue = LaravelQueue::new(&server);
    let transport = queue.transport().await;
    let envelope = envelope_with_id(&format!("retry-{}", unique_suffix()), &queue.name, 0);
    transport
        .publish(&queue.name, &envelope.to_vec())
        .await
        .unwrap();

    let mut reserved = transport.reserve(&queue.name, 5).await.unwrap();
    assert_eq!(reserved.len(), 1);
    let delivery = reserved.pop().unwrap();
    assert_eq!(
        delivery.body,
        envelope.to_vec(),
        "the handler gets the job as stored"
    );
    assert!(!delivery.poison);
    // The reservation is the job with its attempt counted.
    let members = queue.zset(&queue.reserved()).await;
    assert_eq!(members.len(), 1);
    assert_eq!(members[0].0, delivery.handle.raw());
    let member: Value = serde_json::from_slice(delivery.handle.raw()).unwrap();
    assert_eq!(member["attempts"], 1);

    let retry = envelope.clone().with_attempts(1).to_vec();
    let now = queue.server_now().await;
    let settled = transport
        .settle(&delivery.handle, &Settlement::Requeue(retry.clone()))
        .await
        .unwrap();
    assert!(settled);
    let delayed = queue.zset(&queue.delayed()).await;
    assert_eq!(delayed.len(), 1);
    assert_eq!(delayed[0].0, retry, "the retry waits in :delayed");
    assert!(delayed[0].1 as u64 >= now, "due now: {}", delayed[0].1);
    assert!(queue.zset(&queue.reserved()).await.is_empty());
    assert!(queue.list(&queue.ready()).await.is_empty());

    // Python's worker migrates it and sees the attempt counted.
    let out = peer(&python, &["consume", &queue.url, &queue.name, "0.5"]).await;
    let received = out["received"].as_array().unwrap();
    assert_eq!(received.len(), 1, "{out}");
    assert_eq!(received[0]["id"], json!(envelope.meta.id));
    assert_eq!(received[0]["attempts"], 1);
    assert!(queue.drained().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_deliveries_retry_through_the_delayed_set_then_reach_the_dead_letter_list() {
    const TEST: &str = "laravel_failing_deliveries_retry_then_dead_letter";
    let Some((server, python)) = servers(TEST) else {
        return;
    };
    let queue = LaravelQueue::new(&server);
    let sent = peer(&python, &["publish", &queue.url, &queue.name, "2"]).await;
    let (report, log) = queue.consume(true, 4).await;
    assert_eq!((report.retried, report.dead_lettered), (4, 2), "{report:?}");
    let mut attempts: Vec<u64> = log.lock().unwrap().iter().map(|s| s.attempts).collect();
    attempts.sort_unstable();
    assert_eq!(attempts, [0, 0, 1, 1, 2, 2]);

    // Dead-lettered as the Python SDK's worker writes there: the record on
    // queues:<queue>.dlq, a token on its :notify list.
    let records = queue.list(&queue.dlq()).await;
    assert_eq!(records.len(), 2);
    assert_eq!(
        queue.list(&format!("{}:notify", queue.dlq())).await,
        vec![b"1".to_vec(); 2]
    );
    for record in &records {
        let record = Envelope::from_slice(record).unwrap();
        let block = record.dead_letter.unwrap();
        assert_eq!(block.reason.as_str(), "failed");
        assert!(
            sent.as_array()
                .unwrap()
                .iter()
                .any(|s| s["id"] == json!(record.meta.id))
        );
    }
    assert!(queue.drained().await);
}

/// Jobs Laravel's pop reserves as they are (not JSON, not an object, no
/// numeric `attempts`, one cjson cannot encode again), and bodies that are
/// no envelope.
fn poison_bodies(queue: &str) -> Vec<Vec<u8>> {
    let envelope = |attempts: &str| {
        format!(
            r#"{{"job":"{URN}","trace_id":"t-1","data":{{}},"meta":{{"id":"p-1","queue":"{queue}","lang":"go","schema_version":1,"created_at":0}}{attempts}}}"#
        )
        .into_bytes()
    };
    vec![
        b"not json at all".to_vec(),
        b"\xff\xfe{\"job\": \"urn:babel:interop:created\"}".to_vec(),
        b"[1, 2, 3]".to_vec(),
        envelope(""),
        envelope(r#","attempts":"two""#),
        br#"{"job":"urn:babel:interop:created","big":1e400,"attempts":0}"#.to_vec(),
        br#"{"data":{},"attempts":0}"#.to_vec(),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_jobs_are_dead_lettered_as_python_dead_letters_them_and_the_worker_goes_on() {
    const TEST: &str = "laravel_poison_jobs_are_dead_lettered";
    let Some((server, python)) = servers(TEST) else {
        return;
    };
    let ours = LaravelQueue::new(&server);
    let theirs = LaravelQueue::new(&server);
    let bodies = poison_bodies(&ours.name);
    let good = envelope_with_id(&format!("good-{}", unique_suffix()), &ours.name, 0).to_vec();
    let mut raw = ours.raw().await;
    for queue in [&ours, &theirs] {
        for body in bodies.iter().chain([&good]) {
            let _: () = raw.rpush(queue.ready(), body).await.unwrap();
            let _: () = raw.rpush(queue.notify(), 1).await.unwrap();
        }
    }

    // One at a time, so the DLQ holds the records in the order of the bodies.
    let (report, log) = ours.consume(false, 1).await;
    assert_eq!(
        log.lock().unwrap().len(),
        1,
        "the good job after the poison ran"
    );
    assert_eq!(report.dead_lettered as usize, bodies.len(), "{report:?}");
    let records = ours.list(&ours.dlq()).await;
    assert_poison_records_as_python_writes(&python, PEER, &ours.name, &bodies, &records).await;
    assert!(ours.drained().await);

    // Python's worker dead-letters the same jobs, as poison too.
    let out = peer(&python, &["consume", &theirs.url, &theirs.name, "0.5"]).await;
    assert_eq!(out["received"].as_array().unwrap().len(), 1, "{out}");
    let python_records = theirs.list(&theirs.dlq()).await;
    assert_eq!(python_records.len(), bodies.len());
    for record in &python_records {
        let block: Value =
            serde_json::from_str(&consumer_support::dead_letter_block(record)).unwrap();
        assert_eq!(
            block["reason"],
            "poison",
            "{}",
            String::from_utf8_lossy(record)
        );
    }
    assert!(theirs.drained().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_settle_of_a_migrated_reservation_touches_nothing() {
    const TEST: &str = "laravel_a_late_settle_touches_nothing";
    let Some(server) = server_url(REDIS_URL, TEST) else {
        return;
    };
    let queue = LaravelQueue::new(&server);
    let transport = RedisTransport::builder()
        .retry_after(Duration::from_secs(1))
        .connect(&queue.url)
        .await
        .unwrap();
    let body = envelope_with_id("late-1", &queue.name, 0).to_vec();
    transport.publish(&queue.name, &body).await.unwrap();
    let delivery = transport
        .reserve(&queue.name, 1)
        .await
        .unwrap()
        .pop()
        .unwrap();
    let deadline = queue.zset(&queue.reserved()).await[0].1 as u64;
    eventually("the reservation lapsed", || async {
        queue.server_now().await >= deadline
    })
    .await;
    assert_eq!(transport.sweep(&queue.name).await.unwrap(), 1);

    for settlement in [
        Settlement::Ack,
        Settlement::Requeue(body.clone()),
        Settlement::DeadLetter {
            queue: format!("{}.dlq", queue.name),
            body: b"record".to_vec(),
        },
    ] {
        let settled = transport
            .settle(&delivery.handle, &settlement)
            .await
            .unwrap();
        assert!(!settled, "{settlement:?}");
    }
    // The migration returned the reserved member, its attempt counted, as
    // Laravel recovers a reservation; the late settles added nothing.
    assert_eq!(
        queue.list(&queue.ready()).await,
        vec![delivery.handle.raw().to_vec()]
    );
    assert!(queue.zset(&queue.reserved()).await.is_empty());
    assert!(queue.zset(&queue.delayed()).await.is_empty());
    assert!(queue.list(&queue.dlq()).await.is_empty());
}

#[cfg(feature = "redrive")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redrive_moves_dead_letters_back_as_the_python_sdks_redrive_does() {
    use babel_idem::redrive::{Redrive, RedriveOptions};

    const TEST: &str = "laravel_a_redrive_moves_dead_letters_back";
    let Some((server, python)) = servers(TEST) else {
        return;
    };
    // Dead letters of our consumer, copied to a second dead-letter list.
    let ours = LaravelQueue::new(&server);
    let theirs = LaravelQueue::new(&server);
    let sent = peer(&python, &["publish", &ours.url, &ours.name, "3"]).await;
    assert_eq!(ours.consume(true, 4).await.0.dead_lettered, 3);
    let records = ours.list(&ours.dlq()).await;
    let mut raw = ours.raw().await;
    for record in &records {
        let _: () = raw.rpush(theirs.dlq(), record).await.unwrap();
        let _: () = raw
            .rpush(format!("{}:notify", theirs.dlq()), 1)
            .await
            .unwrap();
    }

    let out = peer(
        &python,
        &[
            "redrive",
            &theirs.url,
            &format!("{}.dlq", theirs.name),
            "--to",
            &theirs.name,
            "--bypass",
            "1",
        ],
    )
    .await;
    assert_eq!(out["redriven"], 3, "{out}");
    let options = RedriveOptions::new().to(&ours.name).bypass(true);
    let report = ours
        .transport()
        .await
        .redrive(&format!("{}.dlq", ours.name), &options)
        .await
        .unwrap();
    assert_eq!((report.moved, report.left), (3, 0), "{report:?}");

    // The same bare jobs (the layout stores no bypass header), with a token
    // each, and nothing left of the dead letters, on either side.
    let (python_values, our_values) = (
        theirs.list(&theirs.ready()).await,
        ours.list(&ours.ready()).await,
    );
    assert_eq!(our_values.len(), 3);
    for (python_value, our_value) in python_values.iter().zip(&our_values) {
        assert_eq!(
            String::from_utf8_lossy(our_value),
            String::from_utf8_lossy(python_value)
        );
        let envelope = Envelope::from_slice(our_value).unwrap();
        assert_eq!(
            (envelope.attempts, envelope.dead_letter.is_none()),
            (0, true)
        );
        assert!(
            sent.as_array()
                .unwrap()
                .iter()
                .any(|s| s["id"] == json!(envelope.meta.id))
        );
    }
    for queue in [&ours, &theirs] {
        assert_eq!(queue.list(&queue.notify()).await.len(), 3);
        assert!(queue.list(&queue.dlq()).await.is_empty());
        assert!(
            queue
                .list(&format!("{}:notify", queue.dlq()))
                .await
                .is_empty()
        );
        assert!(
            queue
                .zset(&format!("{}:reserved", queue.dlq()))
                .await
                .is_empty()
        );
    }
}
