//! The transactional outbox's cost, each figure against a baseline in the
//! same run:
//!
//! 1. Relay throughput: rows per second a `Relay` drains from a PostgreSQL
//!    and a SQLite outbox to Redis and to RabbitMQ, against a raw publish
//!    loop of the same bodies through the same client (`publish_batch`,
//!    batches of 100, no database), and the database's floor: the relay's
//!    own statements taking a batch of 100 and marking it published, one
//!    batch after the other, on the same table with no broker. The goal:
//!    at least 0.5 of the loop; the relay over min(loop, floor) says how
//!    much of the gap is the relay's own.
//! 2. Commit-to-publish latency on PostgreSQL, p50 and p99, from a
//!    producer's `COMMIT` to the message's arrival on Redis: a relay woken
//!    by `LISTEN`/`NOTIFY` against one that polls every 50 ms.
//! 3. `save` inside a producer's transaction (begin, a business insert,
//!    commit) against the same transaction without it, beside the same
//!    transaction with a bare `INSERT` of the row instead of `save`.
//!
//! Run: `cargo bench --all-features --bench outbox` with
//! `BABEL_IDEM_POSTGRES_URL`, `BABEL_IDEM_REDIS_URL` and
//! `BABEL_IDEM_AMQP_URL` (a missing server's figures are skipped);
//! `BABEL_IDEM_BENCH_ROWS` (default 20,000) is the rows per throughput run.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use babel_idem::Envelope;
use babel_idem::outbox::{PostgresOutbox, Relay, RelaySink, RelaySource, SqliteOutbox};
use babel_idem::transport::{AmqpTransport, Outgoing, RedisTransport};
use redis::AsyncCommands;
use serde_json::json;
use sqlx::postgres::PgPoolOptions;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

fn suffix() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..10].to_owned()
}

fn bodies(queue: &str, rows: usize) -> Vec<String> {
    (0..rows)
        .map(|n| {
            let env = Envelope::new(
                "urn:babel:bench:created",
                json!({"n": n, "pad": "x".repeat(100)}),
            )
            .with_queue(queue);
            String::from_utf8(env.encode_for_publish().unwrap()).unwrap()
        })
        .collect()
}

#[derive(Clone)]
enum Broker {
    Redis(String),
    Amqp(String),
}

impl Broker {
    fn name(&self) -> &'static str {
        match self {
            Broker::Redis(_) => "Redis",
            Broker::Amqp(_) => "RabbitMQ",
        }
    }

    async fn sink(&self) -> (RelaySink, Raw) {
        match self {
            Broker::Redis(url) => {
                let t = RedisTransport::connect(url).await.unwrap();
                (t.clone().into(), Raw::Redis(t))
            }
            Broker::Amqp(url) => {
                let t = AmqpTransport::connect(url).await.unwrap();
                (t.clone().into(), Raw::Amqp(t))
            }
        }
    }

    async fn clear(&self, queue: &str) {
        match self {
            Broker::Redis(url) => {
                let client = redis::Client::open(url.as_str()).unwrap();
                let mut c = client.get_multiplexed_async_connection().await.unwrap();
                let _: () = c.del(queue).await.unwrap();
            }
            Broker::Amqp(url) => {
                let t = AmqpTransport::connect(url).await.unwrap();
                let _ = t.delete_queue(queue).await;
                t.close().await;
            }
        }
    }
}

/// The same client the relay publishes through.
enum Raw {
    Redis(RedisTransport),
    Amqp(AmqpTransport),
}

impl Raw {
    async fn publish_all(&self, queue: &str, bodies: &[String]) {
        for chunk in bodies.chunks(100) {
            let batch: Vec<Outgoing<'_>> = chunk
                .iter()
                .map(|b| Outgoing::new(queue, b.as_bytes()))
                .collect();
            let outcome = match self {
                Raw::Redis(t) => t.publish_batch(&batch).await.unwrap(),
                Raw::Amqp(t) => t.publish_batch(&batch).await.unwrap(),
            };
            if let Some(Err(error)) = outcome.iter().find(|r| r.is_err()) {
                panic!("the raw loop lost a message: {error}");
            }
        }
    }
}

enum Db {
    Postgres(String),
    Sqlite(std::path::PathBuf),
}

impl Db {
    fn name(&self) -> &'static str {
        match self {
            Db::Postgres(_) => "PostgreSQL",
            Db::Sqlite(_) => "SQLite",
        }
    }

    /// A fresh outbox table holding `rows` pending rows.
    async fn filled(&self, queue: &str, rows: &[String]) -> (RelaySource, Filled) {
        let table = format!("bench_outbox_{}", suffix());
        match self {
            Db::Postgres(url) => {
                let pool = PgPoolOptions::new()
                    .max_connections(4)
                    .connect(url)
                    .await
                    .unwrap();
                let outbox = PostgresOutbox::new(pool.clone())
                    .with_table(&table)
                    .unwrap();
                outbox.migrate().await.unwrap();
                for chunk in rows.chunks(5_000) {
                    sqlx::query(&format!(
                        "INSERT INTO {table} (queue, body, created_at)
                         SELECT $1, b, now() AT TIME ZONE 'UTC' FROM unnest($2::text[]) AS b"
                    ))
                    .bind(queue)
                    .bind(chunk)
                    .execute(&pool)
                    .await
                    .unwrap();
                }
                (outbox.into(), Filled::Postgres(pool, table))
            }
            Db::Sqlite(dir) => {
                let path = dir.join(format!("{table}.db"));
                // As `babel-idem relay` opens it: WAL, `NORMAL` sync.
                let options = SqliteConnectOptions::new()
                    .filename(&path)
                    .create_if_missing(true)
                    .journal_mode(SqliteJournalMode::Wal)
                    .synchronous(sqlx::sqlite::SqliteSynchronous::Normal);
                let pool = SqlitePoolOptions::new()
                    .max_connections(2)
                    .connect_with(options)
                    .await
                    .unwrap();
                let outbox = SqliteOutbox::new(pool.clone()).with_table(&table).unwrap();
                outbox.migrate().await.unwrap();
                let mut tx = pool.begin().await.unwrap();
                for body in rows {
                    sqlx::query(&format!(
                        "INSERT INTO {table} (queue, body, created_at) VALUES (?1, ?2, '2026-01-01 00:00:00')"
                    ))
                    .bind(queue)
                    .bind(body)
                    .execute(&mut *tx)
                    .await
                    .unwrap();
                }
                tx.commit().await.unwrap();
                (outbox.into(), Filled::Sqlite(pool, path, table))
            }
        }
    }
}

/// What a throughput run made, to remove afterwards.
enum Filled {
    Postgres(sqlx::PgPool, String),
    Sqlite(sqlx::SqlitePool, std::path::PathBuf, String),
}

impl Filled {
    /// The database's floor: rows per second through the relay's own
    /// statements (those on `PostgresOutbox`'s and `SqliteOutbox`'s pages)
    /// to take a batch of 100 and mark it published, one batch after the
    /// other, with no broker at all.
    async fn floor(&self, rows: usize) -> f64 {
        let started = Instant::now();
        let mut marked = 0;
        match self {
            Filled::Postgres(pool, t) => {
                let now = "(now() AT TIME ZONE 'UTC')";
                let take = format!(
                    "SELECT id, queue::text, body, attempts::int8, headers::text FROM {t}
                     WHERE status = 'pending'
                       AND (failed_at IS NULL
                            OR failed_at <= {now} - make_interval(secs => LEAST(attempts * $2, $3)))
                     ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED"
                );
                let mark = format!(
                    "UPDATE {t} AS o SET
                         status = CASE WHEN r.error IS NULL THEN 'published'
                                       WHEN o.attempts + 1 >= $3 THEN 'failed'
                                       ELSE o.status END,
                         published_at = CASE WHEN r.error IS NULL THEN {now} ELSE o.published_at END,
                         attempts = o.attempts + CASE WHEN r.error IS NULL THEN 0 ELSE 1 END,
                         last_error = COALESCE(r.error, o.last_error),
                         failed_at = CASE WHEN r.error IS NULL THEN o.failed_at ELSE {now} END
                     FROM unnest($1::int8[], $2::text[]) AS r(id, error)
                     WHERE o.id = r.id"
                );
                loop {
                    let mut tx = pool
                        .begin_with("BEGIN; SET LOCAL synchronous_commit = off")
                        .await
                        .unwrap();
                    let taken: Vec<(i64, String, String, i64, Option<String>)> =
                        sqlx::query_as(&take)
                            .bind(100i64)
                            .bind(0.05f64)
                            .bind(5.0f64)
                            .fetch_all(&mut *tx)
                            .await
                            .unwrap();
                    if taken.is_empty() {
                        break;
                    }
                    let ids: Vec<i64> = taken.iter().map(|row| row.0).collect();
                    let errors: Vec<Option<String>> = vec![None; ids.len()];
                    sqlx::query(&mark)
                        .bind(&ids)
                        .bind(&errors)
                        .bind(10i64)
                        .execute(&mut *tx)
                        .await
                        .unwrap();
                    tx.commit().await.unwrap();
                    marked += ids.len();
                }
            }
            Filled::Sqlite(pool, _, t) => {
                let now = "strftime('%Y-%m-%d %H:%M:%f', 'now')";
                let take = format!(
                    "SELECT id, queue, body, attempts, headers FROM {t}
                     WHERE status = 'pending'
                       AND (failed_at IS NULL OR failed_at <= strftime('%Y-%m-%d %H:%M:%f', 'now',
                            printf('-%.3f seconds', min(attempts * ?2, ?3))))
                       AND id NOT IN (SELECT value FROM json_each(?4))
                     ORDER BY id LIMIT ?1"
                );
                let mark = format!(
                    "UPDATE {t} SET status = 'published', published_at = {now}
                     WHERE id IN (SELECT value FROM json_each(?1)) AND status = 'pending'"
                );
                loop {
                    let taken: Vec<(i64, String, String, i64, Option<String>)> =
                        sqlx::query_as(&take)
                            .bind(100i64)
                            .bind(0.05f64)
                            .bind(5.0f64)
                            .bind("[]")
                            .fetch_all(pool)
                            .await
                            .unwrap();
                    if taken.is_empty() {
                        break;
                    }
                    let ids: Vec<i64> = taken.iter().map(|row| row.0).collect();
                    sqlx::query(&mark)
                        .bind(serde_json::Value::from(ids.clone()).to_string())
                        .execute(pool)
                        .await
                        .unwrap();
                    marked += ids.len();
                }
            }
        }
        assert_eq!(marked, rows);
        rows as f64 / started.elapsed().as_secs_f64()
    }

    async fn cleanup(self) {
        match self {
            Filled::Postgres(pool, table) => {
                let _ = sqlx::query(&format!("DROP TABLE {table}"))
                    .execute(&pool)
                    .await;
            }
            Filled::Sqlite(pool, path, _) => {
                pool.close().await;
                let _ = std::fs::remove_file(path);
            }
        }
    }
}

async fn throughput(dbs: &[Db], brokers: &[Broker], rows: usize) {
    println!("## relay throughput ({rows} rows, batches of 100)\n");
    println!(
        "| outbox | broker | raw loop rows/s | database floor rows/s | relay rows/s | relay / raw | relay / min(raw, floor) |"
    );
    println!("|---|---|---|---|---|---|---|");
    for broker in brokers {
        for db in dbs {
            let queue = format!("bench-outbox-{}", suffix());
            let bodies = bodies(&queue, rows);
            let (sink, raw) = broker.sink().await;
            // Warm the client (queue declared, connection open). The queue
            // stays until the loop is timed: a queue deleted under a
            // publisher takes nothing, and RabbitMQ returns what it is sent.
            raw.publish_all(&queue, &bodies[..100]).await;

            let started = Instant::now();
            raw.publish_all(&queue, &bodies).await;
            let raw_rate = rows as f64 / started.elapsed().as_secs_f64();
            broker.clear(&queue).await;

            let (_, filled) = db.filled(&queue, &bodies).await;
            let floor_rate = filled.floor(rows).await;
            filled.cleanup().await;

            // The relay's rows go to a queue of their own, which it declares.
            let queue = format!("bench-outbox-{}", suffix());
            let relayed = self::bodies(&queue, rows);
            let (source, cleanup) = db.filled(&queue, &relayed).await;
            let relay = Relay::builder(source, sink).build().await.unwrap();
            let started = Instant::now();
            let report = relay.drain().await.unwrap();
            let relay_rate = report.published as f64 / started.elapsed().as_secs_f64();
            assert_eq!(report.published as usize, rows);
            broker.clear(&queue).await;
            cleanup.cleanup().await;
            println!(
                "| {} | {} | {raw_rate:.0} | {floor_rate:.0} | {relay_rate:.0} | {:.2}x | {:.2}x |",
                db.name(),
                broker.name(),
                relay_rate / raw_rate,
                relay_rate / raw_rate.min(floor_rate)
            );
        }
    }
    println!();
}

fn micros_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index] as f64 / 1000.0
}

async fn latency(url: &str, redis_url: &str) {
    println!("## commit-to-publish latency, PostgreSQL to Redis (500 messages, one every 10 ms)\n");
    println!("| relay wakes by | p50 ms | p99 ms |");
    println!("|---|---|---|");
    for (label, notifications) in [("LISTEN/NOTIFY", true), ("polling every 50 ms", false)] {
        let table = format!("bench_outbox_{}", suffix());
        let queue = format!("bench-latency-{}", suffix());
        let pool = PgPoolOptions::new()
            .max_connections(4)
            .connect(url)
            .await
            .unwrap();
        let outbox = PostgresOutbox::new(pool.clone())
            .with_table(&table)
            .unwrap();
        outbox.migrate().await.unwrap();
        let relay_pool = PgPoolOptions::new()
            .max_connections(3)
            .connect(url)
            .await
            .unwrap();
        let relay = Relay::builder(
            PostgresOutbox::new(relay_pool).with_table(&table).unwrap(),
            RedisTransport::connect(redis_url).await.unwrap(),
        )
        .poll_interval(Duration::from_millis(50))
        .notifications(notifications)
        .build()
        .await
        .unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let running = tokio::spawn(async move { relay.run(stopped).await });
        tokio::time::sleep(Duration::from_millis(200)).await;

        let client = redis::Client::open(redis_url).unwrap();
        let mut reader = client.get_multiplexed_async_connection().await.unwrap();
        let receiving_queue = queue.clone();
        let receiver = tokio::spawn(async move {
            let mut latencies = Vec::with_capacity(500);
            while latencies.len() < 500 {
                let popped: Option<(String, Vec<u8>)> =
                    reader.blpop(&receiving_queue, 5.0).await.unwrap();
                let Some((_, body)) = popped else { break };
                let value: serde_json::Value = serde_json::from_slice(&body).unwrap();
                let sent = value["data"]["committed_us"].as_u64().unwrap();
                latencies.push(micros_now().saturating_sub(sent));
            }
            latencies
        });
        for n in 0..500u64 {
            let mut tx = pool.begin().await.unwrap();
            let env = Envelope::new(
                "urn:babel:bench:created",
                json!({"n": n, "committed_us": micros_now()}),
            )
            .with_queue(&queue);
            outbox.save(&mut tx, &env).await.unwrap();
            tx.commit().await.unwrap();
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let mut latencies = receiver.await.unwrap();
        stop.send(()).unwrap();
        running.await.unwrap().unwrap();
        latencies.sort_unstable();
        println!(
            "| {label} | {:.2} | {:.2} |",
            percentile(&latencies, 0.5),
            percentile(&latencies, 0.99)
        );
        let _ = sqlx::query(&format!("DROP TABLE {table}"))
            .execute(&pool)
            .await;
    }
    println!();
}

async fn save_cost(dbs: &[Db]) {
    const TXS: usize = 2_000;
    println!("## save in a producer's transaction ({TXS} transactions of one business insert)\n");
    println!(
        "| database | without | with a bare INSERT | with save | save / without | bare / without |"
    );
    println!("|---|---|---|---|---|---|");
    for db in dbs {
        let table = format!("bench_outbox_{}", suffix());
        let orders = format!("{table}_orders");
        let queue = "bench-save";
        let body = bodies(queue, 1).remove(0);
        let mut times = [Duration::ZERO; 3];
        match db {
            Db::Postgres(url) => {
                let pool = PgPoolOptions::new()
                    .max_connections(1)
                    .connect(url)
                    .await
                    .unwrap();
                let outbox = PostgresOutbox::new(pool.clone())
                    .with_table(&table)
                    .unwrap();
                outbox.migrate().await.unwrap();
                sqlx::query(&format!("CREATE TABLE {orders} (n BIGINT NOT NULL)"))
                    .execute(&pool)
                    .await
                    .unwrap();
                let business = format!("INSERT INTO {orders} (n) VALUES ($1)");
                let bare = format!(
                    "INSERT INTO {table} (queue, body, created_at) VALUES ($1, $2, now() AT TIME ZONE 'UTC')"
                );
                // Rounds of the three, in turn, so a drift hits all alike.
                for round in 0..4 {
                    for (mode, time) in times.iter_mut().enumerate() {
                        let started = Instant::now();
                        for n in 0..TXS / 4 {
                            let mut tx = pool.begin().await.unwrap();
                            sqlx::query(&business)
                                .bind((round * TXS + n) as i64)
                                .execute(&mut *tx)
                                .await
                                .unwrap();
                            match mode {
                                1 => {
                                    sqlx::query(&bare)
                                        .bind(queue)
                                        .bind(&body)
                                        .execute(&mut *tx)
                                        .await
                                        .unwrap();
                                }
                                2 => {
                                    let env =
                                        Envelope::new("urn:babel:bench:created", json!({"n": n}))
                                            .with_queue(queue);
                                    outbox.save(&mut tx, &env).await.unwrap();
                                }
                                _ => {}
                            }
                            tx.commit().await.unwrap();
                        }
                        *time += started.elapsed();
                    }
                }
                let _ = sqlx::query(&format!("DROP TABLE {table}, {orders}"))
                    .execute(&pool)
                    .await;
            }
            Db::Sqlite(dir) => {
                let path = dir.join(format!("{table}.db"));
                let options = SqliteConnectOptions::new()
                    .filename(&path)
                    .create_if_missing(true)
                    .journal_mode(SqliteJournalMode::Wal)
                    .synchronous(sqlx::sqlite::SqliteSynchronous::Normal);
                let pool = SqlitePoolOptions::new()
                    .max_connections(1)
                    .connect_with(options)
                    .await
                    .unwrap();
                let outbox = SqliteOutbox::new(pool.clone()).with_table(&table).unwrap();
                outbox.migrate().await.unwrap();
                sqlx::query(&format!("CREATE TABLE {orders} (n INTEGER NOT NULL)"))
                    .execute(&pool)
                    .await
                    .unwrap();
                let business = format!("INSERT INTO {orders} (n) VALUES (?1)");
                let bare = format!(
                    "INSERT INTO {table} (queue, body, created_at) VALUES (?1, ?2, strftime('%Y-%m-%d %H:%M:%f', 'now'))"
                );
                for round in 0..4 {
                    for (mode, time) in times.iter_mut().enumerate() {
                        let started = Instant::now();
                        for n in 0..TXS / 4 {
                            let mut tx = pool.begin().await.unwrap();
                            sqlx::query(&business)
                                .bind((round * TXS + n) as i64)
                                .execute(&mut *tx)
                                .await
                                .unwrap();
                            match mode {
                                1 => {
                                    sqlx::query(&bare)
                                        .bind(queue)
                                        .bind(&body)
                                        .execute(&mut *tx)
                                        .await
                                        .unwrap();
                                }
                                2 => {
                                    let env =
                                        Envelope::new("urn:babel:bench:created", json!({"n": n}))
                                            .with_queue(queue);
                                    outbox.save(&mut tx, &env).await.unwrap();
                                }
                                _ => {}
                            }
                            tx.commit().await.unwrap();
                        }
                        *time += started.elapsed();
                    }
                }
                pool.close().await;
                let _ = std::fs::remove_file(&path);
            }
        }
        let per = |t: Duration| t.as_secs_f64() * 1e6 / TXS as f64;
        println!(
            "| {} | {:.0} µs | {:.0} µs | {:.0} µs | {:.2}x the time | {:.2}x the time |",
            db.name(),
            per(times[0]),
            per(times[1]),
            per(times[2]),
            per(times[2]) / per(times[0]),
            per(times[1]) / per(times[0]),
        );
    }
    println!();
}

#[tokio::main]
async fn main() {
    let rows: usize = env("BABEL_IDEM_BENCH_ROWS")
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let dir = std::env::temp_dir().join(format!("babel-idem-bench-outbox-{}", suffix()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut dbs = Vec::new();
    match env("BABEL_IDEM_POSTGRES_URL") {
        Some(url) => dbs.push(Db::Postgres(url)),
        None => println!("skipped: PostgreSQL (BABEL_IDEM_POSTGRES_URL is not set)"),
    }
    dbs.push(Db::Sqlite(dir.clone()));
    let mut brokers = Vec::new();
    match env("BABEL_IDEM_REDIS_URL") {
        Some(url) => brokers.push(Broker::Redis(url)),
        None => println!("skipped: Redis (BABEL_IDEM_REDIS_URL is not set)"),
    }
    match env("BABEL_IDEM_AMQP_URL") {
        Some(url) => brokers.push(Broker::Amqp(url)),
        None => println!("skipped: RabbitMQ (BABEL_IDEM_AMQP_URL is not set)"),
    }
    throughput(&dbs, &brokers, rows).await;
    if let (Some(pg), Some(redis)) = (env("BABEL_IDEM_POSTGRES_URL"), env("BABEL_IDEM_REDIS_URL")) {
        latency(&pg, &redis).await;
    }
    save_cost(&dbs).await;
    let _ = std::fs::remove_dir_all(dir);
}
