//! The transactional outbox and its relay against real servers: messages
//! commit with their transaction or not at all, a relay killed mid-batch
//! repeats only whole messages with their own ids, two relays share a
//! PostgreSQL outbox, each queue keeps id order, the Python SDK consumes
//! the bytes that were saved, and bad rows fail alone with a reason.
//!
//! Environment: `BABEL_IDEM_REDIS_URL`, `BABEL_IDEM_POSTGRES_URL`,
//! `BABEL_IDEM_AMQP_URL`, `BABEL_IDEM_PYTHON`; without them the tests
//! print `skipped:`, and with `BABEL_IDEM_REQUIRE_SERVERS=1` fail.
#![cfg(all(
    feature = "outbox",
    feature = "sqlite",
    feature = "postgres",
    feature = "redis-transport",
    feature = "amqp-transport"
))]

#[path = "../babel-idem/tests/consumer_support/mod.rs"]
mod consumer_support;
#[path = "../babel-idem/tests/outbox_support/mod.rs"]
mod outbox_support;
#[path = "../babel-idem/tests/store_contract/mod.rs"]
mod store_contract;

use std::collections::HashMap;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use babel_idem::envelope::ProduceError;
use babel_idem::outbox::{OutboxError, Relay, RelayError, RelaySink};
use babel_idem::store::SqliteStore;
use babel_idem::transport::{AmqpTransport, RedisTransport};
use babel_idem::{Envelope, run_once};
use outbox_support::db::{Db, Kind, cli, producer};
use outbox_support::{AMQP_URL, Broker, Landed};
use serde_json::{Value, json};
use store_contract::servers::{REDIS_URL, server_url, unique_suffix};

fn envelope(queue: &str, n: u64) -> Envelope {
    Envelope::new("urn:babel:outbox:test", json!({"n": n})).with_queue(queue)
}

fn queue_name() -> String {
    format!("bi-obx-{}", unique_suffix())
}

/// The broker of `kind`, or `None` after a `skipped:` line.
fn broker(redis: bool, test: &str) -> Option<Broker> {
    if redis {
        server_url(REDIS_URL, test).map(Broker::Redis)
    } else {
        server_url(AMQP_URL, test).map(Broker::Amqp)
    }
}

async fn sink(broker: &Broker) -> RelaySink {
    match broker {
        Broker::Redis(url) => RedisTransport::connect(url).await.unwrap().into(),
        Broker::Amqp(url) => AmqpTransport::connect(url).await.unwrap().into(),
    }
}

fn broker_flag(broker: &Broker) -> [String; 2] {
    match broker {
        Broker::Redis(url) => ["--redis".to_owned(), url.clone()],
        Broker::Amqp(url) => ["--amqp".to_owned(), url.clone()],
    }
}

fn n_of(landed: &Landed) -> u64 {
    let value: Value = serde_json::from_slice(&landed.body).unwrap();
    value["data"]["n"].as_u64().unwrap()
}

/// Runs `command` to its end on a blocking thread.
async fn output(mut command: Command) -> Output {
    tokio::task::spawn_blocking(move || {
        command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output()
            .expect("start the process")
    })
    .await
    .unwrap()
}

fn assert_no_panic(output: &Output) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("panicked"), "a panic: {stderr}");
}

/// `babel-idem relay --drain` on `db` to `broker`; its output.
async fn relay_drain(db: &Db, broker: &Broker, extra: &[&str]) -> Output {
    let mut command = Command::new(cli());
    command
        .arg("relay")
        .args(["--outbox", &db.url(), "--outbox-table", db.table()])
        .args(broker_flag(broker))
        .arg("--drain")
        .args(extra);
    let out = output(command).await;
    assert_no_panic(&out);
    out
}

// ---------------------------------------------------------------- atomicity

/// The producer example saves `count` messages in one transaction and
/// aborts where `crash` says; the ids it saved.
async fn crashing_producer(db: &Db, queue: &str, count: u32, crash: &str) -> Vec<String> {
    let mut command = Command::new(producer());
    command.args([
        "--db",
        &db.url(),
        "--outbox-table",
        db.table(),
        "--queue",
        queue,
        "--count",
        &count.to_string(),
        "--crash",
        crash,
    ]);
    let out = output(command).await;
    assert!(
        !out.status.success(),
        "the producer was to abort: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            out.status.signal(),
            Some(6),
            "aborted (SIGABRT): {:?}",
            out.status
        );
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|line| {
            serde_json::from_str::<Value>(line).unwrap()["id"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect()
}

async fn atomicity(kind: Kind, test: &str) {
    let (Some(db), Some(broker)) = (Db::open(kind, test).await, broker(true, test)) else {
        return;
    };
    let queue = queue_name();

    let lost = crashing_producer(&db, &queue, 3, "before-commit").await;
    assert_eq!(
        lost.len(),
        3,
        "the producer saved three messages before aborting"
    );
    let out = relay_drain(&db, &broker, &[]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        broker.len(&queue).await,
        0,
        "a message saved in a transaction that never committed was published"
    );
    assert!(
        db.rows().await.is_empty(),
        "the aborted transaction left rows"
    );

    let committed = crashing_producer(&db, &queue, 3, "after-commit").await;
    let rows = db.rows().await;
    assert!(rows.iter().all(|row| row.status == "pending"), "{rows:?}");
    let dry = relay_drain(&db, &broker, &["--dry-run", "--json"]).await;
    let said: Value = serde_json::from_slice(&dry.stdout).unwrap();
    assert_eq!(said["pending"], 3, "{said}");
    assert_eq!(broker.len(&queue).await, 0, "--dry-run published nothing");
    let out = relay_drain(&db, &broker, &[]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut landed: Vec<String> = broker.drain(&queue).await.iter().map(Landed::id).collect();
    landed.sort();
    let mut expected = committed.clone();
    expected.sort();
    assert_eq!(landed, expected, "each committed message published once");
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_message_commits_with_its_transaction_or_is_never_published() {
    atomicity(Kind::Sqlite, "outbox_atomicity_sqlite").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_message_commits_with_its_transaction_or_is_never_published() {
    atomicity(Kind::Postgres, "outbox_atomicity_postgres").await;
}

// ---------------------------------------------------------------- kill -9 mid-batch

/// A relay process killed after the broker took its first batch and before
/// it marked it: every row reaches the broker at least once, at most the
/// two batches in flight (the one being marked, the next) repeat, the repeats
/// carry their own `meta.id`, and a consumer with a persistent seen-set
/// runs each message once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_killed_between_publish_and_mark_repeats_only_whole_messages_by_id() {
    const TEST: &str = "outbox_kill_mid_batch";
    let (Some(db), Some(broker)) = (Db::open(Kind::Postgres, TEST).await, broker(true, TEST))
    else {
        return;
    };
    db.migrate().await;
    let queue = queue_name();
    let envelopes: Vec<Envelope> = (0..500).map(|n| envelope(&queue, n)).collect();
    db.save_all(&envelopes).await;

    // A SHARE lock lets the relay take and lock rows (FOR UPDATE) and
    // publish them, but holds its UPDATE back: the batch sits published
    // and unmarked while the relay is killed.
    let Db::Postgres { pool, .. } = &db else {
        unreachable!()
    };
    let mut lock = pool.begin().await.unwrap();
    sqlx::query(&format!("LOCK TABLE {} IN SHARE MODE", db.table()))
        .execute(&mut *lock)
        .await
        .unwrap();
    let mut relay = Command::new(cli())
        .arg("relay")
        .args(["--outbox", &db.url(), "--outbox-table", db.table()])
        .args(broker_flag(&broker))
        .args(["--batch", "100"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    broker.wait_for(&queue, 100).await;
    relay.kill().unwrap(); // SIGKILL
    relay.wait().unwrap();
    lock.rollback().await.unwrap();
    let rows = db.rows().await;
    assert!(
        rows.iter().all(|row| row.status == "pending"),
        "nothing was marked before the kill"
    );

    let out = relay_drain(&db, &broker, &[]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let landed = broker.drain(&queue).await;
    let mut times: HashMap<String, usize> = HashMap::new();
    for message in &landed {
        *times.entry(message.id()).or_default() += 1;
    }
    let sent: Vec<String> = envelopes
        .iter()
        .map(|env| env.meta.id.clone().unwrap())
        .collect();
    assert!(
        sent.iter().all(|id| times.contains_key(id)),
        "every row reached the broker"
    );
    assert_eq!(times.len(), sent.len(), "no id the outbox did not hold");
    let repeats: usize = times.values().map(|n| n - 1).sum();
    eprintln!(
        "kill -9 mid-batch: {} messages on the broker for {} rows, {repeats} repeats",
        landed.len(),
        sent.len()
    );
    assert!(repeats >= 1, "the killed relay's batch is published again");
    // The relay publishes the next batch while the last one's mark
    // commits: a kill repeats at most the two batches in flight.
    assert!(
        repeats <= 200,
        "only the killed relay's two batches in flight repeat"
    );
    let repeated_bodies = landed.iter().filter(|m| times[&m.id()] > 1).all(|m| {
        envelopes
            .iter()
            .any(|env| env.encode_for_publish().unwrap() == m.body)
    });
    assert!(
        repeated_bodies,
        "a repeat is the saved bytes, its own meta.id included"
    );

    // A consumer with a persistent seen-set runs each message once.
    let dir = std::env::temp_dir().join(format!("bi-obx-seen-{}", unique_suffix()));
    std::fs::create_dir_all(&dir).unwrap();
    let store = SqliteStore::open(dir.join("seen.db")).await.unwrap();
    let mut runs = 0usize;
    for message in &landed {
        let env = Envelope::from_slice(&message.body).unwrap();
        run_once(&store, &env, async {
            runs += 1;
            Ok::<(), babel_idem::StoreError>(())
        })
        .await
        .unwrap();
    }
    assert_eq!(runs, sent.len(), "the consumer ran each message once");
    drop(store);
    let _ = std::fs::remove_dir_all(dir);
    db.cleanup().await;
}

// ---------------------------------------------------------------- relays and order

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_relays_on_one_postgres_outbox_publish_each_row_exactly_once() {
    const TEST: &str = "outbox_two_relays";
    let (Some(db), Some(broker)) = (Db::open(Kind::Postgres, TEST).await, broker(true, TEST))
    else {
        return;
    };
    db.migrate().await;
    let queue = queue_name();
    let rows: Vec<(String, String)> = (0..10_000)
        .map(|n| {
            let body = envelope(&queue, n).encode_for_publish().unwrap();
            (queue.clone(), String::from_utf8(body).unwrap())
        })
        .collect();
    db.insert_plain(&rows).await;
    let first = Relay::builder(db.source().await, sink(&broker).await)
        .build()
        .await
        .unwrap();
    let second = Relay::builder(db.source().await, sink(&broker).await)
        .build()
        .await
        .unwrap();
    let (a, b) = tokio::join!(first.drain(), second.drain());
    let (a, b) = (a.unwrap(), b.unwrap());
    eprintln!(
        "two relays: {} and {} rows published",
        a.published, b.published
    );
    assert_eq!(a.published + b.published, 10_000);
    let landed = broker.drain(&queue).await;
    let mut times: HashMap<String, usize> = HashMap::new();
    for message in &landed {
        *times.entry(message.id()).or_default() += 1;
    }
    assert_eq!(landed.len(), 10_000, "no row published twice");
    assert_eq!(times.len(), 10_000);
    assert!(db.rows().await.iter().all(|row| row.status == "published"));
    db.cleanup().await;
}

async fn id_order(kind: Kind, redis: bool, test: &str) {
    let (Some(db), Some(broker)) = (Db::open(kind, test).await, broker(redis, test)) else {
        return;
    };
    db.migrate().await;
    let queues: Vec<String> = (0..3).map(|_| queue_name()).collect();
    // Interleaved across the queues, committed in several transactions.
    for chunk in 0..6u64 {
        let envelopes: Vec<Envelope> = (0..100)
            .map(|i| {
                let n = chunk * 100 + i;
                envelope(&queues[(n % 3) as usize], n)
            })
            .collect();
        db.save_all(&envelopes).await;
    }
    let relay = Relay::builder(db.source().await, sink(&broker).await)
        .batch_size(64)
        .build()
        .await
        .unwrap();
    assert_eq!(relay.drain().await.unwrap().published, 600);
    for (q, queue) in queues.iter().enumerate() {
        let ns: Vec<u64> = broker.drain(queue).await.iter().map(n_of).collect();
        let expected: Vec<u64> = (0..600).filter(|n| n % 3 == q as u64).collect();
        assert_eq!(ns, expected, "queue {queue} received its rows in id order");
    }
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_relay_delivers_each_queue_in_id_order_sqlite_to_redis() {
    id_order(Kind::Sqlite, true, "outbox_order_sqlite_redis").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_relay_delivers_each_queue_in_id_order_postgres_to_rabbitmq() {
    id_order(Kind::Postgres, false, "outbox_order_postgres_amqp").await;
}

// ---------------------------------------------------------------- interop

async fn python_consumes(redis: bool, test: &str) {
    let (Some(db), Some(broker), Some(python)) = (
        Db::open(Kind::Sqlite, test).await,
        broker(redis, test),
        consumer_support::python(test),
    ) else {
        return;
    };
    db.migrate().await;
    let queue = queue_name();
    let envelopes: Vec<Envelope> = (0..5)
        .map(|n| {
            Envelope::new(
                consumer_support::URN,
                json!({"n": n, "text": "héllo \u{2028} \"q\""}),
            )
            .with_queue(&queue)
        })
        .collect();
    db.save_all(&envelopes).await;
    let relay = Relay::builder(db.source().await, sink(&broker).await)
        .build()
        .await
        .unwrap();
    assert_eq!(relay.drain().await.unwrap().published, 5);
    let (peer, url) = match &broker {
        Broker::Redis(url) => ("consumer_peer.py", url.clone()),
        Broker::Amqp(url) => ("amqp_peer.py", url.clone()),
    };
    let answer = consumer_support::peer(
        &python,
        peer,
        vec!["consume".into(), url, queue.clone(), "1".into()],
        None,
    )
    .await;
    let received = answer["received"].as_array().unwrap();
    assert_eq!(received.len(), 5, "{answer}");
    for (env, got) in envelopes.iter().zip(received) {
        assert_eq!(got["id"].as_str(), env.meta.id.as_deref());
        assert_eq!(
            got["encoded"].as_str().unwrap().as_bytes(),
            env.encode_for_publish().unwrap(),
            "the Python SDK read the bytes that were saved"
        );
    }
    broker.delete(&[queue]).await;
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_sdk_consumes_from_redis_the_bytes_that_were_saved() {
    python_consumes(true, "outbox_python_redis").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_sdk_consumes_from_rabbitmq_the_bytes_that_were_saved() {
    python_consumes(false, "outbox_python_amqp").await;
}

async fn family_rows(kind: Kind, test: &str) {
    let (Some(db), Some(broker), Some(python)) = (
        Db::open(kind, test).await,
        broker(true, test),
        consumer_support::python(test),
    ) else {
        return;
    };
    db.migrate_family().await;
    let queue = queue_name();
    let answer = consumer_support::peer(
        &python,
        "consumer_peer.py",
        vec!["encode".into(), queue.clone(), "3".into()],
        None,
    )
    .await;
    let bodies: Vec<String> = answer["encoded"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b.as_str().unwrap().to_owned())
        .collect();
    let rows: Vec<(String, String)> = bodies.iter().map(|b| (queue.clone(), b.clone())).collect();
    db.insert_plain(&rows).await;
    // babel-idem's producer on the family's table: no `headers` column.
    let ours = envelope(&queue, 99);
    match kind {
        Kind::Sqlite => {
            let Db::Sqlite { pool, .. } = &db else {
                unreachable!()
            };
            let mut tx = pool.begin().await.unwrap();
            db.sqlite()
                .without_headers()
                .save(&mut tx, &ours)
                .await
                .unwrap();
            tx.commit().await.unwrap();
        }
        Kind::Postgres => {
            let Db::Postgres { pool, .. } = &db else {
                unreachable!()
            };
            let mut tx = pool.begin().await.unwrap();
            db.postgres()
                .without_headers()
                .save(&mut tx, &ours)
                .await
                .unwrap();
            tx.commit().await.unwrap();
        }
    }
    let relay = Relay::builder(db.source().await, sink(&broker).await)
        .build()
        .await
        .unwrap();
    assert_eq!(relay.drain().await.unwrap().published, 4);
    let landed = broker.drain(&queue).await;
    let mut expected: Vec<Vec<u8>> = bodies.into_iter().map(String::into_bytes).collect();
    expected.push(ours.encode_for_publish().unwrap());
    let got: Vec<Vec<u8>> = landed.into_iter().map(|l| l.body).collect();
    assert_eq!(got, expected, "the family's rows, relayed byte for byte");
    let rows = db.rows().await;
    assert!(rows.iter().all(|row| row.status == "published"), "{rows:?}");
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_rows_written_with_plain_sql_on_the_family_table_are_relayed() {
    family_rows(Kind::Sqlite, "outbox_family_sqlite").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_rows_written_with_plain_sql_on_the_family_table_are_relayed() {
    family_rows(Kind::Postgres, "outbox_family_postgres").await;
}

// ---------------------------------------------------------------- bad input

async fn bad_rows(kind: Kind, redis: bool, test: &str) {
    let (Some(db), Some(broker)) = (Db::open(kind, test).await, broker(redis, test)) else {
        return;
    };
    db.migrate().await;
    let queue = queue_name();
    let bad_queue = if redis { "bad queue" } else { "amq.refused" };
    let big = format!("{{\"pad\":\"{}\"}}", "x".repeat(2_000));
    db.insert_plain(&[
        (
            queue.clone(),
            String::from_utf8(envelope(&queue, 0).encode_for_publish().unwrap()).unwrap(),
        ),
        (bad_queue.to_owned(), "{}".to_owned()),
        (queue.clone(), big),
        (
            queue.clone(),
            String::from_utf8(envelope(&queue, 3).encode_for_publish().unwrap()).unwrap(),
        ),
    ])
    .await;
    let relay = Relay::builder(db.source().await, sink(&broker).await)
        .max_attempts(3)
        .max_body_bytes(1_000)
        .backoff(Duration::from_millis(5), Duration::from_millis(20))
        .build()
        .await
        .unwrap();
    let report = relay.drain().await.unwrap();
    assert_eq!(
        (report.published, report.refused, report.failed),
        (2, 6, 2),
        "{report:?}"
    );
    let ns: Vec<u64> = broker.drain(&queue).await.iter().map(n_of).collect();
    assert_eq!(ns, [0, 3], "the good rows went on");
    let rows = db.rows().await;
    let queue_row = &rows[1];
    assert_eq!(
        (queue_row.status.as_str(), queue_row.attempts),
        ("failed", 3)
    );
    assert!(queue_row.failed_at);
    let reason = queue_row.last_error.as_deref().unwrap();
    assert!(reason.contains("invalid queue name"), "{reason}");
    let body_row = &rows[2];
    assert_eq!((body_row.status.as_str(), body_row.attempts), ("failed", 3));
    let reason = body_row.last_error.as_deref().unwrap();
    assert!(
        reason.contains("over the relay's maximum of 1000 bytes"),
        "{reason}"
    );

    // `outbox stats` sees them; `retry-failed` makes them pending again.
    let out = output({
        let mut c = Command::new(cli());
        c.args([
            "outbox",
            "stats",
            &db.url(),
            "--outbox-table",
            db.table(),
            "--json",
        ]);
        c
    })
    .await;
    let stats: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (stats["failed"].as_u64(), stats["published"].as_u64()),
        (Some(2), Some(2))
    );
    let out = output({
        let mut c = Command::new(cli());
        c.args([
            "outbox",
            "retry-failed",
            &db.url(),
            "--outbox-table",
            db.table(),
            "--json",
        ]);
        c
    })
    .await;
    let retried: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(retried["retried"].as_u64(), Some(2));
    let rows = db.rows().await;
    assert_eq!((rows[1].status.as_str(), rows[1].attempts), ("pending", 0));
    broker.delete(&[queue]).await;
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_to_redis_a_row_the_broker_cannot_take_fails_alone_with_its_reason() {
    bad_rows(Kind::Sqlite, true, "outbox_bad_rows_sqlite_redis").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_to_rabbitmq_a_row_the_broker_cannot_take_fails_alone_with_its_reason() {
    bad_rows(Kind::Postgres, false, "outbox_bad_rows_postgres_amqp").await;
}

/// Rows the relay cannot read (another writer left them: a body that is
/// not UTF-8 text, a headers column that is not a JSON object of strings)
/// are set `'failed'` with the reason, counted, and the rows around them
/// publish; a relay started again does not stop on them.
async fn unreadable_rows(kind: Kind, test: &str) {
    let (Some(db), Some(broker)) = (Db::open(kind, test).await, broker(true, test)) else {
        return;
    };
    db.migrate().await;
    let queue = queue_name();
    let good = |n| String::from_utf8(envelope(&queue, n).encode_for_publish().unwrap()).unwrap();
    db.save_all(&[envelope(&queue, 0), envelope(&queue, 1)])
        .await;
    let mut unreadable = Vec::new();
    if kind == Kind::Sqlite {
        // A BLOB body of bytes that are not UTF-8.
        db.insert_raw(&queue, b"{\"job\":\"\xff\xfe\"}", None).await;
        unreadable.push("the body is not UTF-8 text");
        db.insert_raw(&queue, good(3).as_bytes(), Some(b"\xc3\x28"))
            .await;
        unreadable.push("the headers column is not UTF-8 text");
    }
    db.insert_raw(&queue, good(4).as_bytes(), Some(b"[1]"))
        .await;
    unreadable.push("the headers column is not a JSON object of strings");
    db.save_all(&[envelope(&queue, 5), envelope(&queue, 6)])
        .await;

    let relay = Relay::builder(db.source().await, sink(&broker).await)
        .build()
        .await
        .unwrap();
    let report = relay
        .drain()
        .await
        .expect("an unreadable row does not stop the relay");
    let bad = unreadable.len() as u64;
    assert_eq!(
        (report.published, report.refused, report.failed),
        (4, 0, bad),
        "{report:?}"
    );
    let ns: Vec<u64> = broker.drain(&queue).await.iter().map(n_of).collect();
    assert_eq!(
        ns,
        [0, 1, 5, 6],
        "the rows around the unreadable ones went on"
    );
    let rows = db.rows().await;
    let failed: Vec<_> = rows.iter().filter(|row| row.status == "failed").collect();
    assert_eq!(failed.len(), unreadable.len(), "{rows:?}");
    for (row, reason) in failed.iter().zip(&unreadable) {
        let error = row.last_error.as_deref().unwrap_or_default();
        assert!(error.contains(reason), "{row:?} should say {reason:?}");
        assert!(row.failed_at, "{row:?}");
    }

    // A relay started again finds nothing to do, and does not stop.
    let again = Relay::builder(db.source().await, sink(&broker).await)
        .build()
        .await
        .unwrap()
        .drain()
        .await
        .expect("a restarted relay does not stop on the failed rows");
    assert_eq!((again.published, again.failed), (0, 0), "{again:?}");
    let out = relay_drain(&db, &broker, &[]).await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    broker.delete(&[queue]).await;
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_an_unreadable_row_fails_alone_with_its_reason_and_the_rows_behind_it_publish() {
    unreadable_rows(Kind::Sqlite, "outbox_unreadable_sqlite").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_row_whose_headers_do_not_parse_fails_alone_and_the_rows_behind_it_publish() {
    unreadable_rows(Kind::Postgres, "outbox_unreadable_postgres").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_outbox_table_is_one_clear_error_naming_migrate() {
    const TEST: &str = "outbox_missing_table";
    for kind in [Kind::Sqlite, Kind::Postgres] {
        let (Some(db), Some(broker)) = (Db::open(kind, TEST).await, broker(true, TEST)) else {
            return;
        };
        let error = Relay::builder(db.source().await, sink(&broker).await)
            .build()
            .await
            .unwrap_err();
        assert!(
            matches!(error, RelayError::Outbox(OutboxError::MissingTable { .. })),
            "{error}"
        );
        assert!(
            error
                .to_string()
                .contains("babel-idem migrate URL --outbox"),
            "{error}"
        );
        let out = relay_drain(&db, &broker, &[]).await;
        assert_eq!(out.status.code(), Some(4));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(
            stderr.contains("babel-idem migrate URL --outbox"),
            "{stderr}"
        );
        db.cleanup().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_pointed_at_a_closed_port_fails_clearly_at_start() {
    let Some(db) = Db::open(Kind::Sqlite, "outbox_closed_port").await else {
        return;
    };
    db.migrate().await;
    for broker in [
        Broker::Redis("redis://127.0.0.1:1/0".to_owned()),
        Broker::Amqp("amqp://guest:guest@127.0.0.1:1/%2f".to_owned()),
    ] {
        let out = relay_drain(&db, &broker, &[]).await;
        assert_eq!(out.status.code(), Some(3), "{out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("cannot connect to"), "{stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
    }
    db.cleanup().await;
}

#[tokio::test]
async fn an_envelope_that_does_not_encode_is_refused_and_nothing_is_written() {
    let Some(db) = Db::open(Kind::Sqlite, "outbox_refused_envelope").await else {
        return;
    };
    db.migrate().await;
    let Db::Sqlite { pool, .. } = &db else {
        unreachable!()
    };
    let mut tx = pool.begin().await.unwrap();
    let error = db
        .sqlite()
        .save(&mut tx, &envelope("q", 1).without_id())
        .await
        .unwrap_err();
    assert!(
        matches!(error, OutboxError::Envelope(ProduceError::MissingId)),
        "{error}"
    );
    tx.commit().await.unwrap();
    assert!(db.rows().await.is_empty());
    db.cleanup().await;
}

#[tokio::test]
async fn a_rolled_back_transaction_takes_its_messages_with_it() {
    let Some(db) = Db::open(Kind::Postgres, "outbox_rollback").await else {
        return;
    };
    db.migrate().await;
    let Db::Postgres { pool, .. } = &db else {
        unreachable!()
    };
    let outbox = db.postgres();
    let mut tx = pool.begin().await.unwrap();
    outbox.save(&mut tx, &envelope("q", 1)).await.unwrap();
    tx.rollback().await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    outbox.save(&mut tx, &envelope("q", 2)).await.unwrap();
    tx.commit().await.unwrap();
    let rows = db.rows().await;
    assert_eq!(rows.len(), 1);
    assert_eq!(
        (rows[0].queue.as_str(), rows[0].status.as_str()),
        ("q", "pending")
    );
    let stats = outbox.stats().await.unwrap();
    assert_eq!(stats.pending, 1);
    assert!(stats.oldest_pending_age.is_some());
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn migrations_run_at_once_by_a_fleet_all_succeed() {
    for kind in [Kind::Sqlite, Kind::Postgres] {
        let Some(db) = Db::open(kind, "outbox_migrate_fleet").await else {
            return;
        };
        let mut runs = Vec::new();
        for _ in 0..8 {
            let source = db.source().await;
            runs.push(tokio::spawn(async move { source.migrate().await }));
        }
        for run in runs {
            run.await.unwrap().unwrap();
        }
        db.save_all(&[envelope("q", 1)]).await;
        assert_eq!(db.rows().await.len(), 1);
        db.cleanup().await;
    }
}

#[cfg(feature = "metrics")]
#[test]
fn the_relay_records_the_outbox_lag_and_its_rows_by_status() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let ran = metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            let (Some(db), Some(broker)) = (
                Db::open(Kind::Sqlite, "outbox_metrics").await,
                broker(true, "outbox_metrics"),
            ) else {
                return false;
            };
            db.migrate().await;
            let queue = queue_name();
            db.save_all(&[
                envelope(&queue, 0),
                envelope(&queue, 1),
                envelope(&queue, 2),
            ])
            .await;
            db.insert_plain(&[("bad queue".to_owned(), "{}".to_owned())])
                .await;
            let relay = Relay::builder(db.source().await, sink(&broker).await)
                .max_attempts(1)
                .build()
                .await
                .unwrap();
            relay.drain().await.unwrap();
            broker.delete(&[queue]).await;
            db.cleanup().await;
            true
        })
    });
    if !ran {
        return;
    }
    type Labels = Vec<(String, String)>;
    let values: Vec<(String, Labels, DebugValue)> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let labels = key
                .key()
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            (key.key().name().to_owned(), labels, value)
        })
        .collect();
    let find = |name: &str, status: Option<&str>| {
        values
            .iter()
            .find(|(n, labels, _)| {
                n == name
                    && status.is_none_or(|s| labels.contains(&("status".to_owned(), s.to_owned())))
            })
            .map(|(_, _, value)| value)
            .unwrap_or_else(|| panic!("{name} {status:?} was not recorded: {values:?}"))
    };
    let gauge = |value: &DebugValue| match value {
        DebugValue::Gauge(g) => g.into_inner(),
        other => panic!("not a gauge: {other:?}"),
    };
    assert_eq!(
        gauge(find(
            babel_idem::telemetry::metrics::OUTBOX_ROWS,
            Some("published")
        )),
        3.0
    );
    assert_eq!(
        gauge(find(
            babel_idem::telemetry::metrics::OUTBOX_ROWS,
            Some("failed")
        )),
        1.0
    );
    assert_eq!(
        gauge(find(
            babel_idem::telemetry::metrics::OUTBOX_ROWS,
            Some("pending")
        )),
        0.0
    );
    assert_eq!(
        gauge(find(
            babel_idem::telemetry::metrics::OUTBOX_LAG_SECONDS,
            None
        )),
        0.0
    );
    assert!(matches!(
        find(babel_idem::telemetry::metrics::OUTBOX_PUBLISHED_TOTAL, None),
        &DebugValue::Counter(3)
    ));
    assert!(matches!(
        find(babel_idem::telemetry::metrics::OUTBOX_REFUSED_TOTAL, None),
        &DebugValue::Counter(1)
    ));
}
