//! Whole workers side by side: the Go SDK's own worker (its `App` runtime,
//! `idempotency.Wrap`, its Redis seen-set store; `benches/go_workers/main.go`)
//! as it scales, K processes, against `examples/worker.rs` as one process at
//! concurrency K and as K processes at concurrency 1, for K = 1, 2, 4, 8, on
//! Redis and on RabbitMQ. Same broker, same queue contents (the Python SDK
//! publishes the messages once; their bytes are queued again for every
//! run, 10% of them a second time, as redeliveries), same seen-set layout
//! (`bq:idemp:<id>` on the same Redis), in alternating rounds.
//!
//! Reported per run: msg/s, total worker CPU per message (every worker
//! process, from the kernel's accounting of waited children), broker CPU
//! per message (Redis `INFO`; RabbitMQ's `beam.smp` from `/proc`) and store
//! commands per message (Redis `INFO commandstats`: `EXISTS`, `SET`, `SETNX`,
//! `MGET`, `MULTI`, `EXEC`), and the worker CPU by thread name (sampled
//! from `/proc` every 50 ms, so a gap between our threads and Go's total
//! shows which thread it sits in); then the ratio ours / Go per round. Then the
//! raw client ceilings, alternating: a redis-rs pipelined loop against the
//! same loop on go-redis (LMOVE per message, then EXISTS, SET NX and LREM
//! per message, 16 messages per round trip), and a lapin consume-and-ack
//! loop against amqp091-go's (prefetch 64): a gap between the workers that
//! the ceilings also show is the client's; one they do not is ours.
//!
//! Last, `store::Cached` on Redis: 30% of the messages redeliver an id seen
//! shortly before; ids sent to the store per message and round trips per
//! message, with and without it (in process, one consumer at concurrency 32).
//!
//! ```text
//! source .ci/servers.sh; source .ci/python.sh   # the servers, the Python peer
//! BABEL_IDEM_GO_SDK=/path/to/babelqueue-go BABEL_IDEM_GO_MODS=/path/to/go-modules \
//!     cargo bench --bench workers_side_by_side --all-features
//! BENCH_MESSAGES=20000 BENCH_ROUNDS=2 BENCH_K=1,4 BENCH_BROKERS=redis ...   # a quicker run
//! BENCH_SKIP_WORKERS=1 BENCH_SKIP_CEILINGS=1 ...   # store::Cached's section alone
//! BENCH_BASELINE_WORKER=/path/to/worker ...   # another revision's worker beside ours
//! ```
//!
//! `BABEL_IDEM_GO_MODS` holds checkouts of go-redis (v9.7.3), amqp091-go
//! (v1.10.0), xxhash (v2.2.0) and go-rendezvous, as `go-redis/`,
//! `amqp091-go/`, `xxhash/`, `go-rendezvous/` (benches/README.md says how to
//! get them); the benchmark writes a go.mod with `replace` directives to
//! them in a temporary directory and builds there, offline. Without `go`,
//! the SDK or the modules, it prints `skipped:` for the Go side and runs
//! ours alone; without Redis or Python it prints `skipped:` and ends.

#[path = "support/load.rs"]
#[allow(dead_code)]
mod load;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use babel_idem::store::{BatchTarget, Cached, RedisStore, StoreFuture};
use babel_idem::transport::{AmqpTransport, RedisTransport};
use babel_idem::{Consumer, Envelope, Router, Store, StoreError, run_once, urn};
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use load::{cpu_seconds, env_count, id_of};
use redis::AsyncCommands;
use redis::aio::ConnectionManager;

/// How long a worker waits on an empty queue before it stops: the Go SDK's
/// shortest Redis poll (go-redis rounds a shorter blocking timeout up to
/// 1 s), and our worker's `--until-idle`.
const IDLE: Duration = Duration::from_secs(1);

/// The raw loops' batch (Redis) and prefetch (RabbitMQ).
const RAW_BATCH: usize = 16;
const RAW_PREFETCH: u16 = 64;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Broker {
    Redis,
    Amqp,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum Side {
    /// K processes of the Go SDK's worker.
    Go,
    /// One `examples/worker.rs` process at concurrency K.
    OursOne,
    /// K `examples/worker.rs` processes at concurrency 1.
    OursMany,
    /// One process of the baseline build (`BENCH_BASELINE_WORKER`) at concurrency K.
    BaseOne,
    /// K processes of the baseline build at concurrency 1.
    BaseMany,
}

impl Side {
    fn label(self, k: usize) -> String {
        match self {
            Side::Go => format!("go sdk, {k} proc"),
            Side::OursOne => format!("ours, 1 proc c={k}"),
            Side::OursMany => format!("ours, {k} proc c=1"),
            Side::BaseOne => format!("baseline, 1 proc c={k}"),
            Side::BaseMany => format!("baseline, {k} proc c=1"),
        }
    }
}

struct Figures {
    messages: usize,
    seconds: f64,
    worker_cpu: f64,
    broker_cpu: Option<f64>,
    store_commands: u64,
    round_trips: u64,
    /// Where Redis spent its time (`INFO commandstats`).
    busiest: String,
    /// CPU seconds by thread name, over every worker process (sampled).
    threads: Vec<(String, f64)>,
}

impl Figures {
    fn rate(&self) -> f64 {
        self.messages as f64 / self.seconds
    }

    fn print(&self, label: &str) {
        let per = |x: f64| x / self.messages as f64;
        let broker = self.broker_cpu.map_or_else(
            || "   n/a".to_owned(),
            |cpu| format!("{:>6.1}", per(cpu) * 1e6),
        );
        println!(
            "  {label:<22} {:>8.0} msg/s  {:>6.1} µs worker CPU/msg  {broker} µs broker CPU/msg  {:>5.2} store cmds/msg  {:>5.2} Redis round trips/msg",
            self.rate(),
            per(self.worker_cpu) * 1e6,
            per(self.store_commands as f64),
            per(self.round_trips as f64),
        );
        println!("      Redis time: {}", self.busiest);
        if !self.threads.is_empty() {
            let threads: Vec<String> = self
                .threads
                .iter()
                .map(|(name, cpu)| format!("{name} {:.1} µs/msg", per(*cpu) * 1e6))
                .collect();
            println!("      worker CPU by thread: {}", threads.join(", "));
        }
    }
}

/// Samples the CPU time of every thread of some processes from `/proc`
/// until stopped, keeping each thread's last reading: what a thread spent
/// after the last sample (at most one period before its process exits) is
/// not counted.
struct ThreadSampler {
    stop: Arc<AtomicBool>,
    sampler: std::thread::JoinHandle<HashMap<(u32, u32), (String, u64)>>,
}

impl ThreadSampler {
    const PERIOD: Duration = Duration::from_millis(50);

    fn start(pids: Vec<u32>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let sampler = std::thread::spawn(move || {
            let mut last = HashMap::new();
            while !stopped.load(Ordering::Relaxed) {
                for &pid in &pids {
                    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
                        continue;
                    };
                    for task in tasks.flatten() {
                        let Some(tid) = task.file_name().to_str().and_then(|t| t.parse().ok())
                        else {
                            continue;
                        };
                        if let Some(reading) = thread_ticks(&task.path()) {
                            last.insert((pid, tid), reading);
                        }
                    }
                }
                std::thread::sleep(Self::PERIOD);
            }
            last
        });
        ThreadSampler { stop, sampler }
    }

    /// CPU seconds by thread name, most first.
    fn finish(self) -> Vec<(String, f64)> {
        self.stop.store(true, Ordering::Relaxed);
        let last = self.sampler.join().expect("the thread sampler");
        let mut by_name: HashMap<String, u64> = HashMap::new();
        for (name, ticks) in last.into_values() {
            *by_name.entry(name).or_default() += ticks;
        }
        let mut threads: Vec<(String, f64)> = by_name
            .into_iter()
            // /proc counts in USER_HZ, 100 per second on Linux.
            .map(|(name, ticks)| (name, ticks as f64 / 100.0))
            .collect();
        threads.sort_by(|a, b| b.1.total_cmp(&a.1));
        threads
    }
}

/// A thread's name and user plus system time in ticks, from its `stat`.
fn thread_ticks(task: &Path) -> Option<(String, u64)> {
    let stat = std::fs::read_to_string(task.join("stat")).ok()?;
    let (head, rest) = stat.rsplit_once(')')?;
    let name = head.split_once('(')?.1.to_owned();
    // After the name: state is the stat's 3rd field, utime its 14th, stime its 15th.
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((name, utime + stime))
}

/// What the Redis server counted: commands by name, socket reads, CPU.
struct RedisStats {
    /// Calls and server microseconds, by command.
    commands: HashMap<String, (u64, u64)>,
    reads: u64,
    cpu: f64,
}

impl RedisStats {
    async fn read(raw: &mut ConnectionManager) -> Self {
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
        let commands = info
            .lines()
            .filter_map(|line| {
                let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(':')?;
                let value = |key: &str| -> Option<u64> {
                    rest.split(',')
                        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))?
                        .parse()
                        .ok()
                };
                Some((name.to_owned(), (value("calls")?, value("usec")?)))
            })
            .collect();
        RedisStats {
            commands,
            reads: field("total_reads_processed") as u64,
            cpu: field("used_cpu_user") + field("used_cpu_sys"),
        }
    }

    /// The seen-set's commands since `before`, both sides' kinds.
    fn store_commands_since(&self, before: &RedisStats) -> u64 {
        ["exists", "set", "setnx", "mget", "multi", "exec"]
            .iter()
            .map(|name| {
                self.commands.get(*name).map_or(0, |c| c.0)
                    - before.commands.get(*name).map_or(0, |c| c.0)
            })
            .sum()
    }

    /// The commands that took the most server time since `before`, with
    /// their calls and microseconds per message.
    fn busiest_since(&self, before: &RedisStats, messages: usize) -> String {
        let mut spent: Vec<(&str, u64, u64)> = self
            .commands
            .iter()
            .filter(|(name, _)| name.as_str() != "info")
            .map(|(name, &(calls, usec))| {
                let (calls0, usec0) = before.commands.get(name).copied().unwrap_or((0, 0));
                (name.as_str(), calls - calls0, usec - usec0)
            })
            .filter(|&(_, calls, _)| calls > 0)
            .collect();
        spent.sort_by_key(|spent| std::cmp::Reverse(spent.2));
        let per = |x: u64| x as f64 / messages as f64;
        spent
            .iter()
            .take(5)
            .map(|(name, calls, usec)| {
                format!("{name} {:.2}/msg {:.1} µs/msg", per(*calls), per(*usec))
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// CPU seconds RabbitMQ's `beam.smp` has used, where it runs on this host.
fn rabbit_cpu() -> Option<f64> {
    let proc = std::fs::read_dir("/proc").ok()?;
    for entry in proc.flatten() {
        let comm = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
        if comm.trim() == "beam.smp" {
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
            let ticks: f64 =
                fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
            return Some(ticks / 100.0);
        }
    }
    None
}

/// The Python SDK publishes `count - redeliveries` messages on Redis; their
/// bytes, in order, with every tenth place from the 500th on taken by the
/// message 500 places earlier again (a redelivery): `count` bodies, 10% of
/// them repeats.
async fn python_bodies(python: &Path, url: &str, count: usize) -> Vec<Vec<u8>> {
    let redeliveries = (0..count).filter(|&i| i % 10 == 9 && i >= 500).count();
    let queue = format!(
        "bench-sbs-py-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("babel-idem/tests/python/consumer_peer.py");
    let output = Command::new(python)
        .arg(script)
        .args(["publish", url, &queue, &(count - redeliveries).to_string()])
        .stdout(Stdio::null())
        .output()
        .expect("run the Python peer");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let mut raw = connection(url).await;
    let originals: Vec<Vec<u8>> = raw.lrange(&queue, 0, -1).await.unwrap();
    let _: () = raw.del(&queue).await.unwrap();
    let mut originals = originals.into_iter();
    let mut bodies: Vec<Vec<u8>> = Vec::with_capacity(count);
    for i in 0..count {
        let body = if i % 10 == 9 && i >= 500 {
            bodies[i - 500].clone()
        } else {
            originals.next().expect("the Python SDK published them all")
        };
        bodies.push(body);
    }
    bodies
}

async fn connection(url: &str) -> ConnectionManager {
    ConnectionManager::new(redis::Client::open(url).unwrap())
        .await
        .unwrap()
}

/// The seen-set keys of `bodies` on the Go SDK's layout.
fn seen_keys(bodies: &[Vec<u8>]) -> Vec<Vec<u8>> {
    bodies
        .iter()
        .map(|body| [b"bq:idemp:".as_slice(), id_of(body)].concat())
        .collect()
}

async fn forget_all(raw: &mut ConnectionManager, keys: &[Vec<u8>]) {
    for chunk in keys.chunks(10_000) {
        let _: () = raw.del(chunk).await.unwrap();
    }
}

async fn fill_redis(raw: &mut ConnectionManager, queue: &str, bodies: &[Vec<u8>]) {
    for chunk in bodies.chunks(1000) {
        let _: () = raw.rpush(queue, chunk).await.unwrap();
    }
}

async fn redis_drained(raw: &mut ConnectionManager, queue: &str) -> bool {
    let (ready, held): (usize, usize) = redis::pipe()
        .llen(queue)
        .llen(format!("{queue}:processing"))
        .query_async(raw)
        .await
        .unwrap();
    ready == 0 && held == 0
}

/// The programs the runs start.
struct Programs {
    ours: PathBuf,
    go: Option<PathBuf>,
    /// `examples/worker.rs` built from another revision, run beside ours.
    baseline: Option<PathBuf>,
}

/// Builds `examples/worker.rs` with the bench profile's settings (release).
fn build_ours() -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let status = Command::new(cargo)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args([
            "build",
            "--release",
            "--example",
            "worker",
            "--features",
            "redis-transport,amqp-transport,sqlite,redis,redis-cluster,postgres",
        ])
        .status()
        .expect("run cargo build");
    assert!(status.success(), "cargo build --example worker failed");
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
    target.join("release/examples/worker")
}

/// Builds `benches/go_workers/main.go` against the SDK and the modules, in
/// a temporary directory, offline; `None` after a `skipped:` line.
fn build_go(work: &Path) -> Option<PathBuf> {
    let skip = |why: &str| {
        println!("skipped: the Go side ({why}; benches/README.md says how to get it)");
        None
    };
    if Command::new("go").arg("version").output().is_err() {
        return skip("`go` is not on PATH");
    }
    let Ok(sdk) = std::env::var("BABEL_IDEM_GO_SDK") else {
        return skip("BABEL_IDEM_GO_SDK is not set");
    };
    let Ok(mods) = std::env::var("BABEL_IDEM_GO_MODS") else {
        return skip("BABEL_IDEM_GO_MODS is not set");
    };
    let (sdk, mods) = (PathBuf::from(sdk), PathBuf::from(mods));
    if !sdk.join("idempotency-redis/redis.go").is_file() {
        return skip("BABEL_IDEM_GO_SDK does not name a babelqueue-go checkout");
    }
    let module = |name: &str| -> Option<PathBuf> {
        let dir = mods.join(name);
        if !dir.is_dir() {
            return None;
        }
        if dir.join("go.mod").is_file() {
            return Some(dir);
        }
        // A module from before go.mod files (go-rendezvous): a copy with one.
        let copy = work.join(name);
        std::fs::create_dir_all(&copy).ok()?;
        for file in std::fs::read_dir(&dir).ok()?.flatten() {
            if file.path().extension().is_some_and(|ext| ext == "go") {
                std::fs::copy(file.path(), copy.join(file.file_name())).ok()?;
            }
        }
        let path = match name {
            "go-rendezvous" => "github.com/dgryski/go-rendezvous",
            _ => return None,
        };
        std::fs::write(copy.join("go.mod"), format!("module {path}\n")).ok()?;
        Some(copy)
    };
    let wanted = [
        ("github.com/redis/go-redis/v9", "go-redis"),
        ("github.com/rabbitmq/amqp091-go", "amqp091-go"),
        ("github.com/cespare/xxhash/v2", "xxhash"),
        ("github.com/dgryski/go-rendezvous", "go-rendezvous"),
    ];
    let mut replaces = String::new();
    for (path, name) in wanted {
        let Some(dir) = module(name) else {
            return skip(&format!("BABEL_IDEM_GO_MODS has no {name}/"));
        };
        replaces.push_str(&format!("\t{path} => {}\n", dir.display()));
    }
    for (path, dir) in [
        ("", ""),
        ("/amqp", "amqp"),
        ("/idempotency-redis", "idempotency-redis"),
        ("/redis", "redis"),
    ] {
        replaces.push_str(&format!(
            "\tgithub.com/babelqueue/babelqueue-go{path} => {}\n",
            sdk.join(dir).display()
        ));
    }
    let go_mod = format!(
        "module babelidem.invalid/goworkers\n\ngo 1.19\n\nrequire (\n\
         \tgithub.com/babelqueue/babelqueue-go v0.0.0\n\
         \tgithub.com/babelqueue/babelqueue-go/amqp v0.0.0\n\
         \tgithub.com/babelqueue/babelqueue-go/idempotency-redis v0.0.0\n\
         \tgithub.com/babelqueue/babelqueue-go/redis v0.0.0\n\
         \tgithub.com/rabbitmq/amqp091-go v1.10.0\n\
         \tgithub.com/redis/go-redis/v9 v9.7.3\n)\n\nreplace (\n{replaces})\n"
    );
    std::fs::write(work.join("go.mod"), go_mod).unwrap();
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/go_workers/main.go"),
        work.join("main.go"),
    )
    .unwrap();
    let binary = work.join("go_workers");
    let built = Command::new("go")
        .current_dir(work)
        .args(["build", "-o"])
        .arg(&binary)
        .arg(".")
        .env("GOFLAGS", "-mod=mod")
        .env("GOPROXY", "off")
        .env("GOSUMDB", "off")
        .output()
        .expect("run go build");
    if !built.status.success() {
        println!(
            "skipped: the Go side (go build failed: {})",
            String::from_utf8_lossy(&built.stderr).trim()
        );
        return None;
    }
    Some(binary)
}

fn spawn(program: &Path, args: &[&str]) -> Child {
    Command::new(program)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("start {program:?}: {e}"))
}

/// Queues `bodies` on `broker`, starts `side`'s workers, and measures them
/// to the end of the queue.
#[allow(clippy::too_many_arguments)]
async fn run(
    programs: &Programs,
    side: Side,
    k: usize,
    broker: Broker,
    urls: (&str, &str),
    raw: &mut ConnectionManager,
    amqp: Option<&AmqpTransport>,
    bodies: &[Vec<u8>],
) -> Figures {
    let (redis_url, amqp_url) = urls;
    let queue = format!(
        "bench-sbs-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let keys = seen_keys(bodies);
    forget_all(raw, &keys).await;
    match broker {
        Broker::Redis => fill_redis(raw, &queue, bodies).await,
        Broker::Amqp => {
            for chunk in bodies.chunks(2000) {
                amqp.unwrap().publish_many(&queue, chunk).await.unwrap();
            }
        }
    }
    let broker_flag = match broker {
        Broker::Redis => "--redis",
        Broker::Amqp => "--amqp",
    };
    let broker_url = match broker {
        Broker::Redis => redis_url,
        Broker::Amqp => amqp_url,
    };
    let (k_text, idle) = (k.to_string(), format!("{}ms", IDLE.as_millis()));
    let worker = |program: &Path, concurrency: &str| {
        spawn(
            program,
            &[
                broker_flag,
                broker_url,
                "--queue",
                &queue,
                "--concurrency",
                concurrency,
                "--until-idle",
                &idle,
                "--store",
                redis_url,
                "--urn",
                load::URN,
            ],
        )
    };
    let ours = |concurrency: &str| worker(&programs.ours, concurrency);
    let baseline = |concurrency: &str| {
        let program = programs.baseline.as_deref().unwrap();
        worker(program, concurrency)
    };
    let go = || {
        spawn(
            programs.go.as_deref().unwrap(),
            &[
                "worker",
                "-broker",
                &broker_flag[2..],
                "-url",
                broker_url,
                "-queue",
                &queue,
                "-store",
                redis_url,
            ],
        )
    };

    let (before, rabbit_before, cpu_before) =
        (RedisStats::read(raw).await, rabbit_cpu(), cpu_seconds(true));
    let started = Instant::now();
    let mut children: Vec<Child> = match side {
        Side::Go => (0..k).map(|_| go()).collect(),
        Side::OursOne => vec![ours(&k_text)],
        Side::OursMany => (0..k).map(|_| ours("1")).collect(),
        Side::BaseOne => vec![baseline(&k_text)],
        Side::BaseMany => (0..k).map(|_| baseline("1")).collect(),
    };
    let sampler = ThreadSampler::start(children.iter().map(Child::id).collect());
    let mut seconds = None;
    if broker == Broker::Redis {
        while !redis_drained(raw, &queue).await {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        seconds = Some(started.elapsed().as_secs_f64());
    }
    let statuses: Vec<_> = tokio::task::spawn_blocking(move || {
        children
            .iter_mut()
            .map(|child| child.wait().unwrap())
            .collect::<Vec<_>>()
    })
    .await
    .unwrap();
    assert!(
        statuses.iter().all(|s| s.success()),
        "{side:?} {statuses:?}"
    );
    // On RabbitMQ the end is when the last worker stopped, less the idle
    // wait it stopped after.
    let seconds = seconds.unwrap_or_else(|| (started.elapsed() - IDLE).as_secs_f64());
    let (after, rabbit_after, cpu_after) =
        (RedisStats::read(raw).await, rabbit_cpu(), cpu_seconds(true));
    let threads = sampler.finish();
    let distinct: Vec<&Vec<u8>> = keys
        .iter()
        .collect::<std::collections::HashSet<_>>()
        .into_iter()
        .collect();
    let remembered: usize = redis::cmd("EXISTS")
        .arg(&distinct)
        .query_async(raw)
        .await
        .unwrap();
    assert_eq!(
        remembered,
        distinct.len(),
        "{side:?}: every id in the seen-set"
    );
    forget_all(raw, &keys).await;
    match broker {
        Broker::Redis => {
            let _: () = raw
                .del(&[
                    queue.clone(),
                    format!("{queue}:processing"),
                    format!("{queue}:processing:deadlines"),
                ])
                .await
                .unwrap();
        }
        Broker::Amqp => {
            amqp.unwrap().delete_queue(&queue).await.unwrap();
            let _ = amqp.unwrap().delete_queue(&format!("{queue}.dlq")).await;
        }
    }
    Figures {
        messages: bodies.len(),
        seconds,
        worker_cpu: cpu_after - cpu_before,
        broker_cpu: match broker {
            Broker::Redis => Some(after.cpu - before.cpu),
            Broker::Amqp => rabbit_after.zip(rabbit_before).map(|(a, b)| a - b),
        },
        // The INFO calls are the benchmark's own; EXISTS of the check is after.
        store_commands: after.store_commands_since(&before),
        round_trips: after.reads - before.reads,
        busiest: after.busiest_since(&before, bodies.len()),
        threads,
    }
}

/// The median; of an even count, the mean of the middle two.
fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let middle = values.len() / 2;
    match values.len() % 2 {
        0 => (values[middle - 1] + values[middle]) / 2.0,
        _ => values[middle],
    }
}

async fn side_by_side(
    programs: &Programs,
    broker: Broker,
    urls: (&str, &str),
    raw: &mut ConnectionManager,
    bodies: &[Vec<u8>],
    ks: &[usize],
    rounds: usize,
) {
    let amqp = match broker {
        Broker::Amqp => Some(AmqpTransport::connect(urls.1).await.unwrap()),
        Broker::Redis => None,
    };
    let mut sides = vec![Side::OursOne, Side::OursMany];
    if programs.go.is_some() {
        sides.insert(0, Side::Go);
    }
    if programs.baseline.is_some() {
        sides.extend([Side::BaseOne, Side::BaseMany]);
    }
    println!(
        "\n== {broker:?}: {} messages (10% redeliveries), {rounds} alternating rounds",
        bodies.len()
    );
    for &k in ks {
        println!("K = {k}");
        let mut rates: HashMap<Side, Vec<f64>> = HashMap::new();
        let mut ratios: Vec<(usize, String)> = Vec::new();
        for round in 0..rounds {
            // Alternate which side goes first.
            let mut order = sides.clone();
            if round % 2 == 1 {
                order.reverse();
            }
            let mut this_round = HashMap::new();
            for &side in &order {
                let figures =
                    run(programs, side, k, broker, urls, raw, amqp.as_ref(), bodies).await;
                figures.print(&format!("r{} {}", round + 1, side.label(k)));
                rates.entry(side).or_default().push(figures.rate());
                this_round.insert(side, figures.rate());
            }
            for (peer, name) in [(Side::Go, "go"), (Side::BaseOne, "baseline")] {
                let (one, many) = match peer {
                    Side::Go => (this_round.get(&Side::Go), this_round.get(&Side::Go)),
                    _ => (
                        this_round.get(&Side::BaseOne),
                        this_round.get(&Side::BaseMany),
                    ),
                };
                if let (Some(one), Some(many)) = (one, many) {
                    ratios.push((
                        round + 1,
                        format!(
                            "ours 1 proc / {name} {:.2}x, ours {k} procs / {name} {:.2}x",
                            this_round[&Side::OursOne] / one,
                            this_round[&Side::OursMany] / many
                        ),
                    ));
                }
            }
        }
        for (round, ratio) in ratios {
            println!("  round {round} msg/s ratio: {ratio}");
        }
        let medians: Vec<String> = sides
            .iter()
            .map(|side| format!("{} {:.0}", side.label(k), median(rates[side].clone())))
            .collect();
        println!("  median msg/s: {}", medians.join(", "));
    }
    if let Some(amqp) = amqp {
        amqp.close().await;
    }
}

/// The redis-rs loop the Go program's `raw-redis` mirrors: per round trip,
/// `RAW_BATCH` LMOVEs; then per round trip EXISTS, SET NX and LREM for each.
async fn raw_redis_rs(url: &str, queue: &str) -> usize {
    let client = redis::Client::open(url).unwrap();
    let mut connection = client.get_multiplexed_async_connection().await.unwrap();
    let processing = format!("{queue}:processing");
    let mut processed = 0;
    loop {
        let mut moves = redis::pipe();
        for _ in 0..RAW_BATCH {
            moves
                .cmd("LMOVE")
                .arg(queue)
                .arg(&processing)
                .arg("LEFT")
                .arg("RIGHT");
        }
        let values: Vec<Option<Vec<u8>>> = moves.query_async(&mut connection).await.unwrap();
        let values: Vec<Vec<u8>> = values.into_iter().flatten().collect();
        if values.is_empty() {
            return processed;
        }
        let mut settle = redis::pipe();
        for value in &values {
            let key = [b"bq:idemp:".as_slice(), id_of(value)].concat();
            settle.cmd("EXISTS").arg(&key).ignore();
            settle.cmd("SET").arg(&key).arg("1").arg("NX").ignore();
            settle
                .cmd("LREM")
                .arg(&processing)
                .arg(1)
                .arg(value)
                .ignore();
        }
        let () = settle.query_async(&mut connection).await.unwrap();
        processed += values.len();
    }
}

/// lapin's consume-and-ack loop: prefetch `RAW_PREFETCH`, one ack per message.
async fn raw_lapin(url: &str, queue: &str, count: usize) -> usize {
    let connection = lapin::Connection::connect(url, lapin::ConnectionProperties::default())
        .await
        .unwrap();
    let channel = connection.create_channel().await.unwrap();
    channel
        .basic_qos(RAW_PREFETCH, BasicQosOptions::default())
        .await
        .unwrap();
    let mut consumer = channel
        .basic_consume(
            queue.into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let mut processed = 0;
    while processed < count {
        let delivery =
            std::future::poll_fn(|cx| futures_core::Stream::poll_next(Pin::new(&mut consumer), cx))
                .await
                .unwrap()
                .unwrap();
        delivery
            .acker
            .ack(BasicAckOptions::default())
            .await
            .unwrap();
        processed += 1;
    }
    let _ = connection.close(200, "done".into()).await;
    processed
}

async fn ceilings(
    programs: &Programs,
    urls: (&str, &str),
    raw: &mut ConnectionManager,
    bodies: &[Vec<u8>],
    brokers: &[Broker],
    rounds: usize,
) {
    println!(
        "\n== raw client ceilings, {} messages, {rounds} alternating rounds",
        bodies.len()
    );
    let keys = seen_keys(bodies);
    for &broker in brokers {
        let amqp = match broker {
            Broker::Amqp => Some(AmqpTransport::connect(urls.1).await.unwrap()),
            Broker::Redis => None,
        };
        for round in 0..rounds {
            let mut sides = vec!["rust", "go"];
            if round % 2 == 1 {
                sides.reverse();
            }
            let mut rates = HashMap::new();
            for side in sides {
                if side == "go" && programs.go.is_none() {
                    continue;
                }
                let queue = format!(
                    "bench-sbs-raw-{}",
                    &uuid::Uuid::new_v4().simple().to_string()[..8]
                );
                forget_all(raw, &keys).await;
                match broker {
                    Broker::Redis => fill_redis(raw, &queue, bodies).await,
                    Broker::Amqp => {
                        for chunk in bodies.chunks(2000) {
                            amqp.as_ref()
                                .unwrap()
                                .publish_many(&queue, chunk)
                                .await
                                .unwrap();
                        }
                    }
                }
                let (cpu_self, cpu_children, started) =
                    (cpu_seconds(false), cpu_seconds(true), Instant::now());
                let processed = match (side, broker) {
                    ("rust", Broker::Redis) => raw_redis_rs(urls.0, &queue).await,
                    ("rust", Broker::Amqp) => raw_lapin(urls.1, &queue, bodies.len()).await,
                    _ => {
                        let go = programs.go.clone().unwrap();
                        let args: Vec<String> = match broker {
                            Broker::Redis => vec![
                                "raw-redis".into(),
                                "-url".into(),
                                urls.0.into(),
                                "-queue".into(),
                                queue.clone(),
                                "-batch".into(),
                                RAW_BATCH.to_string(),
                            ],
                            Broker::Amqp => vec![
                                "raw-amqp".into(),
                                "-url".into(),
                                urls.1.into(),
                                "-queue".into(),
                                queue.clone(),
                                "-prefetch".into(),
                                RAW_PREFETCH.to_string(),
                                "-n".into(),
                                bodies.len().to_string(),
                            ],
                        };
                        let out = tokio::task::spawn_blocking(move || {
                            Command::new(go).args(&args).output().unwrap()
                        })
                        .await
                        .unwrap();
                        assert!(
                            out.status.success(),
                            "{}",
                            String::from_utf8_lossy(&out.stderr)
                        );
                        bodies.len()
                    }
                };
                let seconds = started.elapsed().as_secs_f64();
                assert_eq!(processed, bodies.len());
                let cpu = (cpu_seconds(false) - cpu_self) + (cpu_seconds(true) - cpu_children);
                let rate = bodies.len() as f64 / seconds;
                println!(
                    "  r{} {broker:?} {side:<4} {:>9.0} msg/s  {:>6.1} µs client CPU/msg",
                    round + 1,
                    rate,
                    cpu / bodies.len() as f64 * 1e6
                );
                rates.insert(side, rate);
                match broker {
                    Broker::Redis => {
                        let _: () = raw
                            .del(&[queue.clone(), format!("{queue}:processing")])
                            .await
                            .unwrap();
                    }
                    Broker::Amqp => amqp.as_ref().unwrap().delete_queue(&queue).await.unwrap(),
                }
            }
            if let (Some(rust), Some(go)) = (rates.get("rust"), rates.get("go")) {
                println!(
                    "  r{} {broker:?} raw ratio rust / go: {:.2}x",
                    round + 1,
                    rust / go
                );
            }
        }
        forget_all(raw, &keys).await;
        if let Some(amqp) = amqp {
            amqp.close().await;
        }
    }
}

/// Counts the ids a store is asked about, and its calls (each a round trip
/// to Redis), passing everything on; its batch target is its own, so the
/// consumer's batches reach it as one `seen_many`.
struct Counting<S> {
    inner: S,
    ids: AtomicU64,
    calls: AtomicU64,
}

impl<S: Store> Store for Counting<S> {
    fn seen<'a>(&'a self, id: &'a str) -> StoreFuture<'a, bool> {
        self.ids.fetch_add(1, Ordering::Relaxed);
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.seen(id)
    }
    fn remember<'a>(&'a self, id: &'a str) -> StoreFuture<'a, ()> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.remember(id)
    }
    fn forget<'a>(&'a self, id: &'a str) -> StoreFuture<'a, ()> {
        self.inner.forget(id)
    }
    fn seen_many<'a>(&'a self, ids: &'a [&'a str]) -> StoreFuture<'a, Vec<bool>> {
        self.ids.fetch_add(ids.len() as u64, Ordering::Relaxed);
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.seen_many(ids)
    }
    fn remember_many<'a>(&'a self, ids: &'a [&'a str]) -> StoreFuture<'a, ()> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.remember_many(ids)
    }
    fn batch_target(&self) -> Option<BatchTarget> {
        self.inner.batch_target()?;
        BatchTarget::of(self)
    }
}

/// `store::Cached` with 30% redeliveries of ids seen shortly before (each
/// the id of the message 50 places earlier): ids sent in `seen` per
/// message and Redis round trips per message, with and without it.
async fn cached(url: &str, raw: &mut ConnectionManager, count: usize, rounds: usize) {
    // The consumer's batching on (its default), then off: one call per message.
    for batch in [true, false] {
        cached_rounds(url, raw, count, rounds, batch).await;
    }
}

async fn cached_rounds(
    url: &str,
    raw: &mut ConnectionManager,
    count: usize,
    rounds: usize,
    batch: bool,
) {
    println!(
        "\n== store::Cached on Redis: {count} messages, 30% redeliveries of recent ids, one consumer at concurrency 32, store calls {}, {rounds} alternating rounds",
        if batch {
            "batched (the default)"
        } else {
            "one per message (batch_store_calls(false))"
        }
    );
    let run = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
    for round in 0..rounds {
        let mut order = [false, true];
        if round % 2 == 1 {
            order.reverse();
        }
        let mut sent = HashMap::new();
        for with_cached in order {
            let queue = format!("bench-sbs-cached-{run}-{batch}-{round}-{with_cached}");
            let mut ids: Vec<usize> = Vec::with_capacity(count);
            for i in 0..count {
                ids.push(if i % 10 < 3 && i >= 50 {
                    ids[i - 50]
                } else {
                    i
                });
            }
            let bodies: Vec<Vec<u8>> = (0..count)
                .map(|i| {
                    let id = ids[i];
                    Envelope::new(load::URN, serde_json::json!({ "n": i }))
                        .with_id(format!("{queue}-{id}"))
                        .with_queue(&queue)
                        .to_vec()
                })
                .collect();
            let keys = seen_keys(&bodies);
            fill_redis(raw, &queue, &bodies).await;
            let counting = Arc::new(Counting {
                inner: RedisStore::connect_lazy(url).unwrap(),
                ids: AtomicU64::new(0),
                calls: AtomicU64::new(0),
            });
            let store: Arc<dyn Store> = match with_cached {
                true => Arc::new(Cached::new(Arc::clone(&counting))),
                false => Arc::clone(&counting) as Arc<dyn Store>,
            };
            let router = Router::builder()
                .route(urn!("urn:babel:interop:created"), move |env: Envelope| {
                    let store = Arc::clone(&store);
                    async move { run_once(store, &env, async { Ok::<(), StoreError>(()) }).await }
                })
                .build()
                .unwrap();
            let consumer =
                Consumer::builder(router, RedisTransport::connect(url).await.unwrap(), &queue)
                    .concurrency(32)
                    .batch_store_calls(batch)
                    .build()
                    .unwrap();
            let progress = consumer.progress();
            let (before, started) = (RedisStats::read(raw).await, Instant::now());
            consumer
                .run_until(async {
                    while !(progress.report().delivered as usize >= count
                        && progress.report().in_flight == 0)
                    {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                })
                .await;
            let seconds = started.elapsed().as_secs_f64();
            let after = RedisStats::read(raw).await;
            let per = |x: u64| x as f64 / count as f64;
            let ids = counting.ids.load(Ordering::Relaxed);
            println!(
                "  r{} {:<14} {:>5.3} ids sent in seen/msg  {:>5.3} store calls/msg  {:>5.3} Redis round trips/msg  {:>8.0} msg/s",
                round + 1,
                if with_cached {
                    "with Cached"
                } else {
                    "without"
                },
                per(ids),
                per(counting.calls.load(Ordering::Relaxed)),
                per(after.reads - before.reads),
                count as f64 / seconds,
            );
            sent.insert(with_cached, (ids, after.reads - before.reads));
            forget_all(raw, &keys).await;
            let _: () = raw
                .del(&[
                    queue.clone(),
                    format!("{queue}:processing"),
                    format!("{queue}:processing:deadlines"),
                ])
                .await
                .unwrap();
        }
        let (without, with) = (sent[&false], sent[&true]);
        println!(
            "  r{} with / without: ids sent {:.2}x ({:.0}% fewer), round trips {:.2}x",
            round + 1,
            with.0 as f64 / without.0 as f64,
            100.0 * (1.0 - with.0 as f64 / without.0 as f64),
            with.1 as f64 / without.1 as f64,
        );
    }
}

/// A Redis server of the benchmark's own (no persistence), so that its
/// command counts and CPU are this benchmark's alone; stopped on drop.
struct OwnRedis(Child);

impl OwnRedis {
    fn start(dir: &Path) -> Option<(OwnRedis, String)> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .ok()?
            .local_addr()
            .ok()?
            .port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        let url = format!("redis://127.0.0.1:{port}/");
        let own = OwnRedis(child);
        for _ in 0..100 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Some((own, url));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn main() {
    let (Ok(shared_redis), Ok(python)) = (
        std::env::var("BABEL_IDEM_REDIS_URL"),
        std::env::var("BABEL_IDEM_PYTHON"),
    ) else {
        println!(
            "skipped: set BABEL_IDEM_REDIS_URL and BABEL_IDEM_PYTHON (source .ci/servers.sh and .ci/python.sh)"
        );
        return;
    };
    let amqp_url = std::env::var("BABEL_IDEM_AMQP_URL").unwrap_or_default();
    let messages = env_count("BENCH_MESSAGES", 100_000);
    let rounds = env_count("BENCH_ROUNDS", 2);
    let ks: Vec<usize> = std::env::var("BENCH_K")
        .unwrap_or_else(|_| "1,2,4,8".to_owned())
        .split(',')
        .filter_map(|k| k.trim().parse().ok())
        .collect();
    let mut brokers: Vec<Broker> = Vec::new();
    for name in std::env::var("BENCH_BROKERS")
        .unwrap_or_else(|_| "redis,amqp".to_owned())
        .split(',')
    {
        match name.trim() {
            "redis" => brokers.push(Broker::Redis),
            "amqp" if amqp_url.is_empty() => {
                println!("skipped: RabbitMQ (BABEL_IDEM_AMQP_URL is not set)")
            }
            "amqp" => brokers.push(Broker::Amqp),
            _ => {}
        }
    }
    let work = std::env::temp_dir().join(format!("babel-idem-sbs-{}", std::process::id()));
    std::fs::create_dir_all(&work).unwrap();
    // Broker and seen-set on a `redis-server` of our own where there is one
    // (BENCH_SHARED_REDIS=1: on BABEL_IDEM_REDIS_URL's server instead).
    let own = match env_count("BENCH_SHARED_REDIS", 0) {
        0 => OwnRedis::start(&work),
        _ => None,
    };
    let redis_url = match &own {
        Some((_, url)) => {
            println!("Redis: a redis-server of the benchmark's own at {url}");
            url.clone()
        }
        None => {
            println!(
                "Redis: the shared server at {shared_redis}: other clients' commands count too"
            );
            shared_redis
        }
    };
    let programs = Programs {
        ours: build_ours(),
        go: build_go(&work),
        baseline: std::env::var_os("BENCH_BASELINE_WORKER").map(PathBuf::from),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut raw = connection(&redis_url).await;
        let bodies = python_bodies(Path::new(&python), &redis_url, messages).await;
        let urls = (redis_url.as_str(), amqp_url.as_str());
        if env_count("BENCH_SKIP_WORKERS", 0) == 0 {
            for &broker in &brokers {
                side_by_side(&programs, broker, urls, &mut raw, &bodies, &ks, rounds).await;
            }
        }
        if env_count("BENCH_SKIP_CEILINGS", 0) == 0 {
            ceilings(&programs, urls, &mut raw, &bodies, &brokers, rounds).await;
        }
        cached(&redis_url, &mut raw, messages, rounds).await;
    });
    drop(own);
    let _ = std::fs::remove_dir_all(&work);
}
