//! `RedisStore` on a Redis Cluster against the same store on one server, in
//! one run: guarded first deliveries per second at concurrency 64, seen-set
//! and claim mode, on the cluster with and without `wait_for_replicas(1,
//! ...)`; the process's CPU per delivery beside each rate; and a batch of 64
//! (`seen_many`, `claim_many`) on both, with the pipelines a batch takes on
//! the cluster (one per master its ids land on).
//!
//! Reads `BABEL_IDEM_REDIS_URL` and `BABEL_IDEM_REDIS_CLUSTER_URL`
//! (`source .ci/servers.sh`); without both it says so and stops.
//! `BENCH_DELIVERIES` sets the deliveries per configuration (default 20,000).

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use babel_idem::store::{ClaimToken, RedisStore};
use babel_idem::{ClaimStore, Guard, MessageId, Store, StoreError};

#[path = "support/load.rs"]
#[allow(dead_code)]
mod load;

const CONCURRENCY: usize = 64;
const BATCH: usize = 64;
const BATCH_ROUNDS: usize = 200;

struct Id(String);

impl MessageId for Id {
    fn message_id(&self) -> Option<&str> {
        Some(&self.0)
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    SeenSet,
    Claim,
}

/// Deliveries per second and CPU µs per delivery for `deliveries` first
/// deliveries of distinct ids through a guard on `store`.
async fn rate(store: RedisStore, mode: Mode, deliveries: usize) -> (f64, f64) {
    let run = uuid::Uuid::new_v4().simple().to_string();
    let next = Arc::new(AtomicUsize::new(0));
    let cpu = load::cpu_seconds(false);
    let started = Instant::now();
    let seen_set = Arc::new(Guard::new(store.clone()));
    let claims = Arc::new(
        Guard::new(store)
            .lease(Duration::from_secs(30))
            .expect("a lease"),
    );
    let tasks: Vec<_> = (0..CONCURRENCY)
        .map(|_| {
            let (seen_set, claims) = (Arc::clone(&seen_set), Arc::clone(&claims));
            let (next, run) = (Arc::clone(&next), run.clone());
            tokio::spawn(async move {
                loop {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    if n >= deliveries {
                        return;
                    }
                    let id = Id(format!("{run}-{n}"));
                    let handler = async { Ok::<(), StoreError>(()) };
                    match mode {
                        Mode::SeenSet => seen_set.run(&id, handler).await,
                        Mode::Claim => claims.run(&id, handler).await,
                    }
                    .expect("a guarded delivery");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("a delivery task");
    }
    let seconds = started.elapsed().as_secs_f64();
    let cpu = load::cpu_seconds(false) - cpu;
    (deliveries as f64 / seconds, cpu / deliveries as f64 * 1e6)
}

/// Microseconds per batch of 64 (`seen_many`, then `claim_many`), averaged.
async fn batch_time(store: &RedisStore) -> (f64, f64) {
    let run = uuid::Uuid::new_v4().simple().to_string();
    let mut seen = Duration::ZERO;
    let mut claimed = Duration::ZERO;
    for round in 0..BATCH_ROUNDS {
        let ids: Vec<String> = (0..BATCH).map(|n| format!("{run}-{round}-{n}")).collect();
        let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
        let started = Instant::now();
        store.seen_many(&refs).await.expect("seen_many");
        seen += started.elapsed();
        let entries: Vec<(&str, ClaimToken)> =
            refs.iter().map(|id| (*id, ClaimToken::random())).collect();
        let started = Instant::now();
        store
            .claim_many(&entries, Duration::from_secs(30))
            .await
            .expect("claim_many");
        claimed += started.elapsed();
    }
    let per = |total: Duration| total.as_secs_f64() * 1e6 / BATCH_ROUNDS as f64;
    (per(seen), per(claimed))
}

/// How many masters a batch of 64 random ids lands on: the pipelines the
/// cluster store sends for it.
fn masters_per_batch(store: &RedisStore, seed: &str) -> f64 {
    let Ok(client) = redis::Client::open(seed) else {
        return f64::NAN;
    };
    let Ok(mut connection) = client.get_connection() else {
        return f64::NAN;
    };
    let slots: Vec<redis::Value> = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query(&mut connection)
        .unwrap_or_default();
    let ranges: Vec<(i64, i64, i64)> = slots
        .iter()
        .filter_map(|range| {
            let redis::Value::Array(fields) = range else {
                return None;
            };
            let start = redis::from_redis_value_ref::<i64>(fields.first()?).ok()?;
            let end = redis::from_redis_value_ref::<i64>(fields.get(1)?).ok()?;
            let redis::Value::Array(master) = fields.get(2)? else {
                return None;
            };
            let port = redis::from_redis_value_ref::<i64>(master.get(1)?).ok()?;
            Some((start, end, port))
        })
        .collect();
    let mut total = 0;
    for round in 0..BATCH_ROUNDS {
        let mut masters = HashSet::new();
        for n in 0..BATCH {
            let key = store.key(&format!("batch-{round}-{n}"));
            let slot: i64 = redis::cmd("CLUSTER")
                .arg("KEYSLOT")
                .arg(key)
                .query(&mut connection)
                .unwrap_or_default();
            if let Some((_, _, port)) = ranges.iter().find(|(a, b, _)| (*a..=*b).contains(&slot)) {
                masters.insert(*port);
            }
        }
        total += masters.len();
    }
    total as f64 / BATCH_ROUNDS as f64
}

/// Deletes every key under `stem` on each of `nodes` (one server, or every
/// master of a cluster), key by key.
fn clean(nodes: &[String], stem: &str) {
    for node in nodes {
        let Ok(client) = redis::Client::open(node.as_str()) else {
            continue;
        };
        let Ok(mut connection) = client.get_connection() else {
            continue;
        };
        let mut cursor = 0u64;
        loop {
            let Ok((next, keys)): redis::RedisResult<(u64, Vec<Vec<u8>>)> = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(format!("{stem}*"))
                .arg("COUNT")
                .arg(1000)
                .query(&mut connection)
            else {
                break;
            };
            let mut pipeline = redis::pipe();
            for key in keys {
                pipeline.cmd("DEL").arg(key).ignore();
            }
            let _: redis::RedisResult<()> = pipeline.query(&mut connection);
            if next == 0 {
                break;
            }
            cursor = next;
        }
    }
}

fn main() {
    let (Ok(single), Ok(cluster)) = (
        std::env::var("BABEL_IDEM_REDIS_URL"),
        std::env::var("BABEL_IDEM_REDIS_CLUSTER_URL"),
    ) else {
        eprintln!(
            "cluster bench: BABEL_IDEM_REDIS_URL and BABEL_IDEM_REDIS_CLUSTER_URL are needed (source .ci/servers.sh)"
        );
        return;
    };
    let deliveries = load::env_count("BENCH_DELIVERIES", 20_000);
    let seeds: Vec<String> = cluster
        .split_once("://")
        .map_or("", |(_, rest)| rest)
        .split('/')
        .next()
        .unwrap_or_default()
        .split(',')
        .map(|host| format!("redis://{host}/"))
        .collect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let stem = format!("bqbench{}", uuid::Uuid::new_v4().simple());
    let prefix = format!("{stem}:");
    runtime.block_on(async {
        let open = |url: &str, wait: bool| {
            let mut builder = RedisStore::builder().prefix(&prefix);
            if wait {
                builder = builder.wait_for_replicas(1, Duration::from_secs(1));
            }
            builder.connect_lazy(url).expect("a store")
        };
        println!(
            "{deliveries} first deliveries per configuration, concurrency {CONCURRENCY}"
        );
        let mut baseline = [0.0; 2];
        for (i, mode) in [Mode::SeenSet, Mode::Claim].into_iter().enumerate() {
            let name = if mode == Mode::SeenSet { "seen-set" } else { "claim" };
            for (label, url, wait) in [
                ("one server", single.as_str(), false),
                ("cluster", cluster.as_str(), false),
                ("cluster + WAIT 1", cluster.as_str(), true),
            ] {
                let (per_second, cpu) = rate(open(url, wait), mode, deliveries).await;
                if label == "one server" {
                    baseline[i] = per_second;
                }
                println!(
                    "{name:<9} {label:<17} {per_second:>9.0} deliveries/s  {:>5.2}x one server  {cpu:>6.1} µs CPU/delivery",
                    per_second / baseline[i]
                );
            }
        }
        let one = open(&single, false);
        let sharded = open(&cluster, false);
        let (seen_one, claim_one) = batch_time(&one).await;
        let (seen_cluster, claim_cluster) = batch_time(&sharded).await;
        println!(
            "batch of {BATCH}: seen_many {seen_one:.0} µs one server, {seen_cluster:.0} µs cluster ({:.2}x the time); \
             claim_many {claim_one:.0} µs, {claim_cluster:.0} µs ({:.2}x)",
            seen_cluster / seen_one,
            claim_cluster / claim_one
        );
        println!(
            "round trips per batch of {BATCH}: 1 on one server; on the cluster one pipeline per master it lands on, {:.2} on average, sent at once",
            masters_per_batch(&sharded, &seeds[0])
        );
    });
    let mut nodes = vec![single];
    if let Some(seed) = seeds.first()
        && let Ok(client) = redis::Client::open(seed.as_str())
        && let Ok(mut connection) = client.get_connection()
    {
        let listing: String = redis::cmd("CLUSTER")
            .arg("NODES")
            .query(&mut connection)
            .unwrap_or_default();
        for line in listing.lines().filter(|l| l.contains("master")) {
            if let Some(address) = line.split_whitespace().nth(1) {
                nodes.push(format!(
                    "redis://{}/",
                    address.split('@').next().unwrap_or_default()
                ));
            }
        }
    }
    clean(&nodes, &stem);
}
