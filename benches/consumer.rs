//! The consumer benchmark: 100,000 messages with 10% duplicate ids through a
//! real Redis, a handler that does nothing, the seen-set in Redis with the Go
//! SDK's layout (`EXISTS` / `SET NX` on `bq:idemp:<id>`). Three runs on the
//! same server, one after the other:
//!
//! 1. babel-idem: `Consumer` + `RedisTransport` + a guarded no-op handler,
//!    once with a round trip per store call and once with the store in
//!    [`Batched`], where the calls that meet share one;
//! 2. the Python SDK's worker (`babelqueue` 1.24, `babel-idem/tests/python/consumer_peer.py`)
//!    with the same seen-set layout;
//! 3. the raw-Redis ceiling: the commands the batched worker issues (sweep,
//!    reserve, `MGET`, `SET NX` in `MULTI`/`EXEC`, settle) with the same
//!    client, pipelined per batch, no decoding, no router, no guard.
//!
//! Reported: messages/s, Redis commands per message and round trips per
//! message (the server's `INFO`: commands processed, socket reads), worker
//! CPU per message and Redis CPU per message.
//!
//! Our workers and the ceiling run on one current-thread Tokio runtime, as
//! `examples/worker.rs` does (the Python worker is one thread too);
//! `BENCH_RUNTIME=multi_thread` runs them on the multi-threaded scheduler.
//!
//! ```text
//! source .ci/servers.sh; source .ci/python.sh
//! cargo bench --bench consumer --features redis-transport,redis
//! BENCH_MESSAGES=20000 BENCH_PYTHON_MESSAGES=5000 cargo bench ...   # a quicker run
//! BENCH_RUNTIME=multi_thread cargo bench ...   # Tokio's multi-threaded scheduler
//! ```
//!
//! Without `BABEL_IDEM_REDIS_URL` it prints `skipped:`; without
//! `BABEL_IDEM_PYTHON` the Python run is skipped.

#[path = "support/load.rs"]
mod load;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use babel_idem::store::Batched;
use babel_idem::store::RedisStore;
use babel_idem::transport::RedisTransport;
use babel_idem::{Consumer, Envelope, Router, Store, run_once, urn};
use load::{bodies, cpu_seconds, env_count, id_of, remember_unseen, run_python};
use redis::aio::ConnectionManager;

/// Deliveries in flight, for our workers and the ceiling alike
/// (`BENCH_CONCURRENCY` to change it).
const CONCURRENCY: usize = 256;
/// The raw ceiling's batch per worker task.
const RAW_BATCH: usize = 16;

fn concurrency() -> usize {
    env_count("BENCH_CONCURRENCY", CONCURRENCY)
}

async fn fill(raw: &mut ConnectionManager, queue: &str, bodies: &[Vec<u8>]) {
    for chunk in bodies.chunks(1000) {
        let _: () = redis::cmd("RPUSH")
            .arg(queue)
            .arg(chunk)
            .query_async(raw)
            .await
            .unwrap();
    }
}

/// What the server did meanwhile: commands processed, socket reads (a
/// client's round trip is one read, however many commands it pipelined)
/// and CPU seconds.
#[derive(Clone, Copy)]
struct ServerStats {
    commands: u64,
    reads: u64,
    cpu: f64,
}

async fn server_stats(raw: &mut ConnectionManager) -> ServerStats {
    let info: String = redis::cmd("INFO")
        .arg("all")
        .query_async(raw)
        .await
        .unwrap();
    let field = |name: &str| -> f64 {
        info.lines()
            .find_map(|line| line.strip_prefix(name).and_then(|v| v.strip_prefix(':')))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0)
    };
    ServerStats {
        commands: field("total_commands_processed") as u64,
        reads: field("total_reads_processed") as u64,
        cpu: field("used_cpu_user") + field("used_cpu_sys"),
    }
}

struct Figures {
    name: &'static str,
    messages: usize,
    seconds: f64,
    commands: u64,
    round_trips: u64,
    worker_cpu: f64,
    server_cpu: f64,
}

impl Figures {
    fn rate(&self) -> f64 {
        self.messages as f64 / self.seconds
    }

    fn print(&self) {
        let per = |x: f64| x / self.messages as f64;
        println!(
            "{:<18} {:>8} msgs {:>7.2} s {:>9.0} msgs/s  {:>5.2} cmds/msg  {:>5.2} round trips/msg  {:>6.1} µs worker CPU/msg  {:>6.1} µs Redis CPU/msg",
            self.name,
            self.messages,
            self.seconds,
            self.rate(),
            per(self.commands as f64),
            per(self.round_trips as f64),
            per(self.worker_cpu) * 1e6,
            per(self.server_cpu) * 1e6,
        );
    }
}

/// How the worker's guards reach the seen-set.
#[derive(Clone, Copy, PartialEq)]
enum Calls {
    /// One round trip per `seen` and per `remember`.
    PerDelivery,
    /// Through [`Batched`]: the calls that meet share one `MGET` / one
    /// `MULTI`..`EXEC`.
    Batched,
}

async fn bench_babel_idem(
    url: &str,
    raw: &mut ConnectionManager,
    count: usize,
    calls: Calls,
) -> Figures {
    let run = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
    let queue = format!("bench-consumer-{run}");
    let prefix = format!("bench-consumer-{run}:bq:idemp:");
    fill(raw, &queue, &bodies(&queue, count, &run)).await;

    let store = RedisStore::builder()
        .prefix(&prefix)
        .connect_lazy(url)
        .unwrap();
    let store: Arc<dyn Store> = match calls {
        Calls::PerDelivery => Arc::new(store),
        Calls::Batched => Arc::new(Batched::new(store)),
    };
    let router =
        Router::builder()
            .route(urn!("urn:babel:interop:created"), move |env: Envelope| {
                let store = Arc::clone(&store);
                async move {
                    run_once(store, &env, async { Ok::<(), babel_idem::StoreError>(()) }).await
                }
            })
            .build()
            .unwrap();
    let transport = RedisTransport::connect(url).await.unwrap();
    let consumer = Consumer::builder(router, transport, &queue)
        .concurrency(concurrency())
        // The per-delivery row keeps one store call per message.
        .batch_store_calls(calls == Calls::Batched)
        .build()
        .unwrap();
    let progress = consumer.progress();

    let (before, cpu_before, started) =
        (server_stats(raw).await, cpu_seconds(false), Instant::now());
    consumer
        .run_until(async {
            loop {
                let now = progress.report();
                if now.delivered as usize >= count && now.in_flight == 0 {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await;
    let seconds = started.elapsed().as_secs_f64();
    let (after, cpu_after) = (server_stats(raw).await, cpu_seconds(false));
    cleanup(raw, &queue, &prefix).await;
    Figures {
        name: match calls {
            Calls::PerDelivery => "babel-idem",
            Calls::Batched => "babel-idem+batched",
        },
        messages: count,
        seconds,
        // The INFO call is the benchmark's own.
        commands: after.commands - before.commands - 1,
        round_trips: after.reads - before.reads - 1,
        worker_cpu: cpu_after - cpu_before,
        server_cpu: after.cpu - before.cpu,
    }
}

async fn bench_python(
    url: &str,
    raw: &mut ConnectionManager,
    python: &Path,
    count: usize,
) -> Figures {
    let run = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
    let queue = format!("bench-consumer-py-{run}");
    let prefix = format!("bench-consumer-py-{run}:bq:idemp:");
    fill(raw, &queue, &bodies(&queue, count, &run)).await;
    let (before, cpu_before) = (server_stats(raw).await, cpu_seconds(true));
    let seconds = run_python(
        python,
        "babel-idem/tests/python/consumer_peer.py",
        &[
            "consume",
            url,
            &queue,
            "0.2",
            "--seen-prefix",
            &prefix,
            "--noop",
            "1",
        ],
    )
    .await;
    let (after, cpu_after) = (server_stats(raw).await, cpu_seconds(true));
    cleanup(raw, &queue, &prefix).await;
    Figures {
        name: "python-sdk",
        messages: count,
        seconds,
        commands: after.commands - before.commands - 1,
        round_trips: after.reads - before.reads - 1,
        worker_cpu: cpu_after - cpu_before,
        server_cpu: after.cpu - before.cpu,
    }
}

/// The same commands, pipelined per batch, with no consumer around them.
async fn bench_raw(raw: &mut ConnectionManager, count: usize) -> Figures {
    let run = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
    let queue = Arc::new(format!("bench-consumer-raw-{run}"));
    let prefix = Arc::new(format!("bench-consumer-raw-{run}:bq:idemp:"));
    fill(raw, &queue, &bodies(&queue, count, &run)).await;
    // The transport's scripts as it loads them: the layout's shared
    // functions (keys.lua) before each one's body.
    macro_rules! layout_script {
        ($file:literal) => {
            redis::Script::new(concat!(
                include_str!("../babel-idem/src/transport/redis/keys.lua"),
                include_str!(concat!("../babel-idem/src/transport/redis/", $file))
            ))
        };
    }
    let scripts = Arc::new([
        layout_script!("sweep.lua"),
        layout_script!("reserve.lua"),
        layout_script!("settle.lua"),
    ]);
    for script in scripts.iter() {
        script.prepare_invoke().load_async(raw).await.unwrap();
    }
    let (before, cpu_before, started) =
        (server_stats(raw).await, cpu_seconds(false), Instant::now());
    let mut workers = tokio::task::JoinSet::new();
    // Reservation tokens from a counter: no randomness to pay for.
    let next_token = Arc::new(AtomicU64::new(0));
    for _ in 0..concurrency().div_ceil(RAW_BATCH) {
        let next_token = Arc::clone(&next_token);
        let (mut connection, queue, prefix, scripts) = (
            raw.clone(),
            Arc::clone(&queue),
            Arc::clone(&prefix),
            Arc::clone(&scripts),
        );
        workers.spawn(async move {
            let (processing, deadlines) = (
                format!("{queue}:processing"),
                format!("{queue}:processing:deadlines"),
            );
            loop {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_secs();
                let tokens: Vec<String> = (0..RAW_BATCH)
                    .map(|_| format!("{:032x}", next_token.fetch_add(1, Ordering::Relaxed)))
                    .collect();
                let mut pipe = redis::pipe();
                pipe.cmd("EVALSHA")
                    .arg(scripts[0].get_hash())
                    .arg(3)
                    .arg(&*queue)
                    .arg(&processing)
                    .arg(&deadlines)
                    .arg(now)
                    .arg(-1)
                    .ignore();
                pipe.cmd("EVALSHA")
                    .arg(scripts[1].get_hash())
                    .arg(3)
                    .arg(&*queue)
                    .arg(&processing)
                    .arg(&deadlines)
                    .arg(now + 90)
                    .arg(&tokens);
                let (raws,): (Vec<Vec<u8>>,) = pipe.query_async(&mut connection).await.unwrap();
                if raws.is_empty() {
                    return;
                }
                let keys: Vec<Vec<u8>> = raws
                    .iter()
                    .map(|body| [prefix.as_bytes(), id_of(body)].concat())
                    .collect();
                remember_unseen(&mut connection, &keys).await;
                let mut settle = redis::pipe();
                for (raw, token) in raws.iter().zip(&tokens) {
                    settle
                        .cmd("EVALSHA")
                        .arg(scripts[2].get_hash())
                        .arg(2)
                        .arg(&processing)
                        .arg(&deadlines)
                        .arg(token)
                        .arg(raw)
                        .ignore();
                }
                let () = settle.query_async(&mut connection).await.unwrap();
            }
        });
    }
    while let Some(done) = workers.join_next().await {
        done.unwrap();
    }
    let seconds = started.elapsed().as_secs_f64();
    let (after, cpu_after) = (server_stats(raw).await, cpu_seconds(false));
    cleanup(raw, &queue, &prefix).await;
    Figures {
        name: "raw-redis",
        messages: count,
        seconds,
        commands: after.commands - before.commands - 1,
        round_trips: after.reads - before.reads - 1,
        worker_cpu: cpu_after - cpu_before,
        server_cpu: after.cpu - before.cpu,
    }
}

async fn cleanup(raw: &mut ConnectionManager, queue: &str, prefix: &str) {
    let script = "local n = 0 for _, k in ipairs(redis.call('KEYS', ARGV[1])) do redis.call('DEL', k) n = n + 1 end return n";
    for pattern in [format!("{queue}*"), format!("{prefix}*")] {
        let _: i64 = redis::cmd("EVAL")
            .arg(script)
            .arg(0)
            .arg(pattern)
            .query_async(raw)
            .await
            .unwrap();
    }
}

fn main() {
    let Ok(url) = std::env::var("BABEL_IDEM_REDIS_URL") else {
        println!("skipped: consumer benchmark: BABEL_IDEM_REDIS_URL not set");
        return;
    };
    let count = env_count("BENCH_MESSAGES", 100_000);
    let python_count = env_count("BENCH_PYTHON_MESSAGES", count);
    let runtime = load::runtime();
    // `BENCH_ONLY=<worker>` runs one worker alone (to profile it).
    let only = std::env::var("BENCH_ONLY").ok();
    let runs = |worker: &str| only.as_deref().is_none_or(|only| only == worker);
    runtime.block_on(async {
        let client = redis::Client::open(url.as_str()).unwrap();
        let mut raw = ConnectionManager::new(client).await.unwrap();
        let mut figures = Vec::new();
        for (worker, calls) in [
            ("babel-idem", Calls::PerDelivery),
            ("babel-idem+batched", Calls::Batched),
        ] {
            if runs(worker) {
                figures.push(bench_babel_idem(&url, &mut raw, count, calls).await);
            }
        }
        if runs("raw-redis") {
            figures.push(bench_raw(&mut raw, count).await);
        }
        match std::env::var("BABEL_IDEM_PYTHON") {
            Ok(python) if !python.is_empty() && runs("python-sdk") => {
                figures.push(bench_python(&url, &mut raw, Path::new(&python), python_count).await);
            }
            Ok(python) if !python.is_empty() => {}
            _ => println!("skipped: the Python worker: BABEL_IDEM_PYTHON not set"),
        }
        println!("consumer benchmark: {count} messages, 10% duplicate ids, no-op handler, seen-set bq:idemp: in Redis, {} deliveries in flight", concurrency());
        for figure in &figures {
            figure.print();
        }
        let by_name: HashMap<&str, f64> = figures.iter().map(|f| (f.name, f.rate())).collect();
        for worker in ["babel-idem", "babel-idem+batched"] {
            let Some(rust) = by_name.get(worker) else { continue };
            if let Some(python) = by_name.get("python-sdk") {
                println!("{worker} / python-sdk: {:.1}x (goal >= 20x)", rust / python);
            }
            if let Some(ceiling) = by_name.get("raw-redis") {
                println!("{worker} / raw-redis ceiling: {:.2} (goal >= 0.5)", rust / ceiling);
            }
        }
    });
}
