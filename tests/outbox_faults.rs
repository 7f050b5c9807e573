//! The relay when its broker goes away, and the retention purge beside
//! producers and a relay: a RabbitMQ connection cut through a proxy the
//! test owns and a Redis server of the test's own killed and restarted
//! leave the rows pending without spending attempts, and publish them all
//! after recovery; purging published rows while producers write neither
//! deadlocks nor deletes a pending row; a RabbitMQ node of the test's own
//! that closes the channel over one oversized body fails that row alone; a
//! Redis of the test's own busy running a script spends no attempt; `relay
//! --drain` outlives its PostgreSQL connections being ended, and prints, when
//! SIGTERM stops it, the totals of the rows it marked.
//!
//! Environment: `BABEL_IDEM_AMQP_URL`, `BABEL_IDEM_POSTGRES_URL`,
//! `BABEL_IDEM_REDIS_URL`, `redis-server` on the PATH and RabbitMQ
//! installed (`/usr/lib/rabbitmq/bin`); without them the
//! tests print `skipped:`, and with `BABEL_IDEM_REQUIRE_SERVERS=1` fail.
#![cfg(all(
    feature = "outbox",
    feature = "sqlite",
    feature = "postgres",
    feature = "redis-transport",
    feature = "amqp-transport"
))]

#[path = "../babel-idem/tests/outbox_support/mod.rs"]
mod outbox_support;
#[path = "../babel-idem/tests/store_contract/mod.rs"]
mod store_contract;

use std::collections::HashSet;
use std::time::Duration;

use babel_idem::Envelope;
use babel_idem::outbox::{Relay, RelayReport};
use babel_idem::transport::{AmqpTransport, RedisTransport};
use outbox_support::db::{Db, Kind, cli};
use outbox_support::{AMQP_URL, Broker, Landed, Proxy};
use serde_json::json;
use store_contract::servers::{REDIS_URL, server_url, unique_suffix};
use store_contract::spawned::{OwnRabbit, OwnRedis};
use tokio::sync::oneshot;

fn envelopes(queue: &str, from: u64, count: u64) -> Vec<Envelope> {
    (from..from + count)
        .map(|n| Envelope::new("urn:babel:outbox:test", json!({"n": n})).with_queue(queue))
        .collect()
}

fn ids(envelopes: &[Envelope]) -> HashSet<String> {
    envelopes
        .iter()
        .map(|env| env.meta.id.clone().unwrap())
        .collect()
}

/// Waits (a guard against hanging, never a timing assertion) until `check`.
async fn eventually<F: AsyncFnMut() -> bool>(what: &str, mut check: F) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while !check().await {
        assert!(tokio::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// While the broker is down, the rows saved stay pending with no attempt.
async fn assert_pending_untouched(db: &Db, count: usize) {
    let rows = db.rows().await;
    let pending: Vec<_> = rows.iter().filter(|row| row.status == "pending").collect();
    assert_eq!(pending.len(), count, "{rows:?}");
    assert!(
        pending
            .iter()
            .all(|row| row.attempts == 0 && !row.failed_at && row.last_error.is_none()),
        "an unreachable broker spent a row's attempt: {pending:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_rabbitmq_connection_spends_no_attempt_and_every_row_is_published_after() {
    const TEST: &str = "outbox_amqp_down";
    let (Some(db), Some(url)) = (
        Db::open(Kind::Postgres, TEST).await,
        server_url(AMQP_URL, TEST),
    ) else {
        return;
    };
    db.migrate().await;
    let uri: lapin::uri::AMQPUri = url.parse().unwrap();
    let proxy = Proxy::start(format!("{}:{}", uri.authority.host, uri.authority.port)).await;
    let through_proxy = format!(
        "amqp://{}:{}@127.0.0.1:{}/{}",
        uri.authority.userinfo.username,
        uri.authority.userinfo.password,
        proxy.port,
        uri.vhost.replace('%', "%25").replace('/', "%2f")
    );
    let queue = format!("bi-obx-{}", unique_suffix());
    let transport = AmqpTransport::builder()
        .timeout(Duration::from_secs(1))
        .reconnect_attempts(1)
        .connect(&through_proxy)
        .await
        .unwrap();
    let relay = Relay::builder(db.source().await, transport)
        .poll_interval(Duration::from_millis(100))
        .build()
        .await
        .unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let running = tokio::spawn(async move { relay.run(stopped).await });

    let first = envelopes(&queue, 0, 100);
    db.save_all(&first).await;
    let broker = Broker::Amqp(url.clone());
    broker.wait_for(&queue, 100).await;

    proxy.down();
    let second = envelopes(&queue, 100, 200);
    db.save_all(&second).await;
    // Long enough for several passes to meet the cut connection.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_pending_untouched(&db, 200).await;

    proxy.up();
    eventually(
        "every row published after the broker came back",
        async || db.rows().await.iter().all(|row| row.status == "published"),
    )
    .await;
    stop.send(()).unwrap();
    let report: RelayReport = running.await.unwrap().unwrap();
    assert!(report.outages >= 1, "{report:?}");
    assert_eq!(report.refused, 0, "{report:?}");
    assert!(db.rows().await.iter().all(|row| row.attempts == 0));

    let landed: HashSet<String> = broker.drain(&queue).await.iter().map(Landed::id).collect();
    let mut expected = ids(&first);
    expected.extend(ids(&second));
    assert_eq!(landed, expected, "every row reached the broker");
    broker.delete(&[queue]).await;
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_and_restarted_redis_spends_no_attempt_and_every_row_is_published_after() {
    const TEST: &str = "outbox_redis_down";
    let (Some(db), Some(mut redis)) = (Db::open(Kind::Sqlite, TEST).await, OwnRedis::reserve(TEST))
    else {
        return;
    };
    db.migrate().await;
    redis.start();
    let queue = format!("bi-obx-{}", unique_suffix());
    let transport = RedisTransport::builder()
        .timeout(Duration::from_secs(1))
        .reconnect_attempts(1)
        .connect(&redis.url())
        .await
        .unwrap();
    let relay = Relay::builder(db.source().await, transport)
        .poll_interval(Duration::from_millis(100))
        .build()
        .await
        .unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let running = tokio::spawn(async move { relay.run(stopped).await });

    let first = envelopes(&queue, 0, 100);
    db.save_all(&first).await;
    let broker = Broker::Redis(redis.url());
    broker.wait_for(&queue, 100).await;

    redis.kill();
    let second = envelopes(&queue, 100, 200);
    db.save_all(&second).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_pending_untouched(&db, 200).await;

    redis.start();
    eventually("every row published after Redis came back", async || {
        db.rows().await.iter().all(|row| row.status == "published")
    })
    .await;
    stop.send(()).unwrap();
    let report = running.await.unwrap().unwrap();
    assert!(report.outages >= 1, "{report:?}");
    assert_eq!(report.refused, 0, "{report:?}");
    assert!(db.rows().await.iter().all(|row| row.attempts == 0));

    let landed: HashSet<String> = broker.drain(&queue).await.iter().map(Landed::id).collect();
    let mut expected = ids(&first);
    expected.extend(ids(&second));
    assert_eq!(
        landed, expected,
        "every row on the restarted server (the first ones from its append-only file)"
    );
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn purging_published_rows_beside_producers_and_a_relay_never_deletes_a_pending_row() {
    const TEST: &str = "outbox_purge_while_writing";
    let (Some(db), Some(redis)) = (
        Db::open(Kind::Postgres, TEST).await,
        server_url(REDIS_URL, TEST),
    ) else {
        return;
    };
    db.migrate().await;
    let queue = format!("bi-obx-{}", unique_suffix());
    let relay = Relay::builder(
        db.source().await,
        RedisTransport::connect(&redis).await.unwrap(),
    )
    .batch_size(50)
    .poll_interval(Duration::from_millis(20))
    .build()
    .await
    .unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let running = tokio::spawn(async move { relay.run(stopped).await });

    // Four producers, 60 transactions of 10 rows each.
    let mut producers = Vec::new();
    for p in 0..4u64 {
        let outbox = db.postgres();
        let queue = queue.clone();
        producers.push(tokio::spawn(async move {
            let mut saved = Vec::new();
            for t in 0..60u64 {
                let mut tx = outbox.pool().begin().await.unwrap();
                for env in envelopes(&queue, (p * 60 + t) * 10, 10) {
                    outbox.save(&mut tx, &env).await.unwrap();
                    saved.push(env.meta.id.unwrap());
                }
                tx.commit().await.unwrap();
            }
            saved
        }));
    }
    // The purge, every published row at once, in small batches, meanwhile.
    let purger = {
        let outbox = db.postgres();
        tokio::spawn(async move {
            let mut purged = 0;
            for _ in 0..200 {
                purged += outbox
                    .purge_published(Duration::ZERO, 25, false)
                    .await
                    .expect("the purge never deadlocks nor fails");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            purged
        })
    };
    let mut saved = HashSet::new();
    for producer in producers {
        saved.extend(producer.await.unwrap());
    }
    let purged = purger.await.unwrap();
    let broker = Broker::Redis(redis);
    broker.wait_for(&queue, saved.len()).await;
    stop.send(()).unwrap();
    running.await.unwrap().unwrap();
    eprintln!(
        "purge beside producers: {purged} of {} rows purged",
        saved.len()
    );
    assert!(purged > 0, "the purge ran while rows were published");

    let landed: Vec<String> = broker.drain(&queue).await.iter().map(Landed::id).collect();
    assert_eq!(landed.len(), saved.len(), "each row published once");
    assert_eq!(
        landed.into_iter().collect::<HashSet<_>>(),
        saved,
        "no pending row was purged before it was published"
    );
    db.cleanup().await;
}

/// A body over the broker's `max_message_size` makes RabbitMQ close the
/// channel, failing the whole batch's publish while the broker still
/// answers: the relay finds that row, fails it with the broker's reason,
/// and publishes the rows around it, in id order.
async fn oversized_body(rabbit: &OwnRabbit, kind: Kind, test: &str) {
    let Some(db) = Db::open(kind, test).await else {
        return;
    };
    db.migrate().await;
    let queue = format!("bi-obx-{}", unique_suffix());
    let mut batch = envelopes(&queue, 0, 20);
    batch[7] = Envelope::new(
        "urn:babel:outbox:test",
        json!({"n": 7, "pad": "x".repeat(8192)}),
    )
    .with_queue(&queue);
    let saved = db.save_all(&batch).await;
    let transport = AmqpTransport::builder()
        .timeout(Duration::from_secs(5))
        .connect(&rabbit.url())
        .await
        .unwrap();
    let relay = Relay::builder(db.source().await, transport)
        .max_attempts(1)
        .build()
        .await
        .unwrap();
    let report = tokio::time::timeout(Duration::from_secs(120), relay.drain())
        .await
        .expect("the relay stops retrying the batch")
        .unwrap();
    // The channel the broker closed may meet one pass as an outage, which
    // spends no attempt; the relay then goes on and finishes.
    assert_eq!(report.published, 19, "{report:?}");
    assert_eq!((report.refused, report.failed), (1, 1), "{report:?}");

    for row in db.rows().await {
        if row.id == saved[7] {
            assert_eq!(row.status, "failed", "{row:?}");
            let reason = row.last_error.clone().unwrap_or_default();
            assert!(reason.contains("max size"), "{row:?}");
        } else {
            assert_eq!(row.status, "published", "{row:?}");
            assert_eq!(row.attempts, 0, "{row:?}");
        }
    }
    let broker = Broker::Amqp(rabbit.url());
    let landed: Vec<String> = broker.drain(&queue).await.iter().map(Landed::id).collect();
    let mut expected = batch.clone();
    expected.remove(7);
    let expected: Vec<String> = expected
        .iter()
        .map(|env| env.meta.id.clone().unwrap())
        .collect();
    // Rows the broker took before it closed the channel land again (at
    // least once); their first arrivals keep id order.
    let mut first = Vec::new();
    for id in &landed {
        if !first.contains(id) {
            first.push(id.clone());
        }
    }
    assert_eq!(
        first, expected,
        "each row but the oversized one, in id order"
    );
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_over_rabbitmqs_max_message_size_fails_alone_and_the_rest_publish() {
    const TEST: &str = "outbox_amqp_oversized";
    let Some(rabbit) = OwnRabbit::start(TEST, 4096) else {
        return;
    };
    oversized_body(&rabbit, Kind::Sqlite, TEST).await;
    oversized_body(&rabbit, Kind::Postgres, TEST).await;
}

/// Keeps the Redis that runs it busy for three seconds: past its
/// `busy-reply-threshold` it answers every other client `BUSY`.
const BUSY_SCRIPT: &str = "local t0 = redis.call('TIME')
while true do
  local t = redis.call('TIME')
  if (t[1] - t0[1]) * 1000000 + (t[2] - t0[2]) > 3000000 then break end
end
return 1";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_busy_running_a_script_spends_no_attempt_and_every_row_is_published_after() {
    const TEST: &str = "outbox_redis_busy";
    let (Some(db), Some(mut redis)) = (Db::open(Kind::Sqlite, TEST).await, OwnRedis::reserve(TEST))
    else {
        return;
    };
    db.migrate().await;
    redis.start();
    let client = redis::Client::open(redis.url()).unwrap();
    let unhurried = redis::AsyncConnectionConfig::new().set_response_timeout(None);
    let mut admin = client
        .get_multiplexed_async_connection_with_config(&unhurried)
        .await
        .unwrap();
    // `BUSY` after 100 ms of a script rather than 5 s.
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("busy-reply-threshold")
        .arg(100)
        .query_async(&mut admin)
        .await
        .unwrap();
    let queue = format!("bi-obx-{}", unique_suffix());
    let saved = envelopes(&queue, 0, 2_000);
    db.save_all(&saved).await;
    let transport = RedisTransport::builder()
        .timeout(Duration::from_secs(10))
        .connect(&redis.url())
        .await
        .unwrap();
    // Few attempts, short backoffs: a BUSY counted against the rows would
    // fail them all long before the script ends.
    let relay = Relay::builder(db.source().await, transport)
        .batch_size(50)
        .max_attempts(3)
        .backoff(Duration::from_millis(10), Duration::from_millis(100))
        .build()
        .await
        .unwrap();

    let script = {
        let client = client.clone();
        let unhurried = unhurried.clone();
        tokio::spawn(async move {
            let mut connection = client
                .get_multiplexed_async_connection_with_config(&unhurried)
                .await
                .unwrap();
            redis::cmd("EVAL")
                .arg(BUSY_SCRIPT)
                .arg(0)
                .query_async::<i64>(&mut connection)
                .await
        })
    };
    eventually("Redis answers BUSY", async || {
        let probe: redis::RedisResult<i64> =
            redis::cmd("LLEN").arg(&queue).query_async(&mut admin).await;
        probe.is_err_and(|error| error.code() == Some("BUSY"))
    })
    .await;
    let report = relay.drain().await.unwrap();
    assert_eq!(
        script.await.unwrap().unwrap(),
        1,
        "the script ran to its end"
    );

    assert!(
        report.outages >= 1,
        "the relay met the busy server: {report:?}"
    );
    assert_eq!((report.refused, report.failed), (0, 0), "{report:?}");
    let rows = db.rows().await;
    assert!(
        rows.iter()
            .all(|row| row.status == "published" && row.attempts == 0 && row.last_error.is_none()),
        "a busy server spent a row's attempt: {:?}",
        rows.iter()
            .find(|row| row.status != "published" || row.attempts > 0)
    );
    let landed: HashSet<String> = Broker::Redis(redis.url())
        .drain(&queue)
        .await
        .iter()
        .map(Landed::id)
        .collect();
    assert_eq!(landed, ids(&saved), "every row reached the broker");
    db.cleanup().await;
}

/// `url` with `application_name=name`, so a test can find its connections.
fn named(url: &str, name: &str) -> String {
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}application_name={name}")
}

/// Rows `from..from + count` of `queue`, as encoded envelopes with their ids.
fn encoded(queue: &str, count: u64) -> (Vec<(String, String)>, HashSet<String>) {
    let envelopes = envelopes(queue, 0, count);
    let rows = envelopes
        .iter()
        .map(|env| {
            let body = String::from_utf8(env.encode_for_publish().unwrap()).unwrap();
            (queue.to_owned(), body)
        })
        .collect();
    (rows, ids(&envelopes))
}

/// Waits for `child` to end, on a blocking thread; its output.
async fn finished(child: std::process::Child) -> std::process::Output {
    tokio::task::spawn_blocking(move || child.wait_with_output().unwrap())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_drain_outlives_its_postgres_connections_being_terminated_and_publishes_every_row() {
    const TEST: &str = "outbox_postgres_cut";
    let (Some(db), Some(redis)) = (
        Db::open(Kind::Postgres, TEST).await,
        server_url(REDIS_URL, TEST),
    ) else {
        return;
    };
    db.migrate().await;
    let queue = format!("bi-obx-{}", unique_suffix());
    let (rows, saved) = encoded(&queue, 10_000);
    db.insert_plain(&rows).await;
    let name = format!("bi_relay_{}", unique_suffix());
    let child = std::process::Command::new(cli())
        .args(["relay", "--outbox", &named(&db.url(), &name)])
        .args(["--outbox-table", db.table(), "--redis", &redis])
        .args(["--drain", "--batch", "20", "--json"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let running = tokio::spawn(finished(child));

    // Each time the relay made progress and rows are still pending, end
    // every connection it holds, mid-drain.
    let mut cuts = 0;
    let mut seen = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while cuts < 5 && !running.is_finished() {
        assert!(tokio::time::Instant::now() < deadline, "the drain hung");
        let published = db.count("published").await;
        if published > seen && db.count("pending").await > 0 {
            if db.terminate_connections(&name).await > 0 {
                cuts += 1;
            }
            seen = published;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let out = tokio::time::timeout(Duration::from_secs(120), running)
        .await
        .unwrap_or_else(|_| {
            let _ = std::process::Command::new("kill")
                .arg(pid.to_string())
                .status();
            panic!("the drain did not finish")
        })
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("ended the relay's connections {cuts} times mid-drain; its stderr:\n{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(cuts >= 1, "no connection was ended while rows were pending");
    assert_eq!(out.status.code(), Some(0), "after {cuts} cuts: {stderr}");
    assert_eq!(db.count("published").await, 10_000, "every row published");
    let broker = Broker::Redis(redis);
    let landed: HashSet<String> = broker.drain(&queue).await.iter().map(Landed::id).collect();
    assert_eq!(landed, saved, "every row reached the broker");
    db.cleanup().await;
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_during_relay_drain_prints_the_totals_of_the_rows_it_marked() {
    const TEST: &str = "outbox_drain_sigterm";
    let (Some(db), Some(redis)) = (
        Db::open(Kind::Sqlite, TEST).await,
        server_url(REDIS_URL, TEST),
    ) else {
        return;
    };
    db.migrate().await;
    let queue = format!("bi-obx-{}", unique_suffix());
    let (rows, _) = encoded(&queue, 20_000);
    db.insert_plain(&rows).await;
    let child = std::process::Command::new(cli())
        .args(["relay", "--outbox", &db.url(), "--outbox-table", db.table()])
        .args(["--redis", &redis, "--drain", "--batch", "20", "--json"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id().to_string();
    let running = tokio::spawn(finished(child));
    eventually("the relay published some rows", async || {
        db.count("published").await >= 500
    })
    .await;
    let term = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(term.success());
    let out = tokio::time::timeout(Duration::from_secs(120), running)
        .await
        .expect("the relay stops after its batch")
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let printed: serde_json::Value = serde_json::from_str(
        stdout
            .lines()
            .last()
            .unwrap_or_else(|| panic!("a report: {stderr}")),
    )
    .unwrap();
    let published = db.count("published").await;
    assert!(
        db.count("pending").await > 0,
        "stopped mid-drain (published {published})"
    );
    assert_eq!(
        printed["published"].as_i64(),
        Some(published),
        "the printed total is what the table holds published: {printed}"
    );
    assert_eq!(printed["interrupted"], true, "{printed}");
    broker_cleanup(&redis, &queue).await;
    db.cleanup().await;
}

async fn broker_cleanup(redis: &str, queue: &str) {
    Broker::Redis(redis.to_owned())
        .delete(&[queue.to_owned()])
        .await;
}
