//! Claim mode on a Redis Cluster of its own (3 masters, 0 or 1 replica
//! each, in a temporary folder on free ports) while its busiest master is
//! killed (`kill -9`) mid-run and its replica promoted; and a slot range
//! resharded while deliveries run.
//!
//! Without `WAIT`, and while resharding: three worker processes of 16 tasks
//! each (this test binary run again, its ignored test
//! [`failover_worker_process`] selected, told what to do by environment
//! variables) take 2,000 ids, each delivered 3 times in random order, from
//! a queue on the shared Redis server (`BABEL_IDEM_REDIS_URL`, keys of the
//! run's own); a delivery whose guard fails (a store error, a parked claim)
//! goes back to the queue, as a broker's redelivery would. The handlers
//! count there, per id, runs in flight at once (an atomic `HINCRBY` at the
//! start and end of each run, so runs of one id in two processes are seen
//! to overlap) and runs in all. The run must finish with every id done;
//! the figures (runs overlapping, ids run twice, store errors, the master's
//! replication offset against its replica's at the kill) are printed.
//!
//! With `wait_for_replicas(1, ...)`: a `Consumer` takes the same deliveries
//! from a queue on the shared Redis server, and the killed master's shard
//! is left with no replica: its ids are an outage (none runs twice, none is
//! dead-lettered, none is lost) while the other shards' ids run, each once.

#![cfg(all(feature = "redis-cluster", feature = "redis-transport"))]

mod consumer_support;
mod store_contract;

use std::collections::HashMap;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use babel_idem::store::{ClaimStore, RedisStore};
use babel_idem::{Guard, MessageId, OnRememberFailure, Store, StoreError};
use redis::AsyncCommands;
use store_contract::servers::{REDIS_URL, server_url, skip_or_fail, unique_suffix};

/// Worker processes, and tasks in each.
const WORKERS: usize = 3;
const TASKS: usize = 16;
const IDS: usize = 2_000;
const DELIVERIES: usize = 3;
/// The ids queued once the cluster has failed over, in the consumer's run.
const WAVE: usize = 1_500;
const LEASE: Duration = Duration::from_secs(5);
const DEADLINE: Duration = Duration::from_secs(150);

/// How long a call to the board (on the shared Redis server) may take.
const BOARD_TIMEOUT: Duration = Duration::from_secs(30);

/// Set in a worker process: the run it takes part in (see [`WorkerConfig`]).
const WORKER_ENV: &str = "BABEL_IDEM_FAILOVER_WORKER";
/// The test a worker process runs.
const WORKER_TEST: &str = "failover_worker_process";

/// A master's port, node id and slot ranges.
type Master = (u16, String, Vec<(u16, u16)>);

/// Six `redis-server`s in cluster mode, killed and deleted on drop.
struct OwnCluster {
    dir: PathBuf,
    ports: Vec<u16>,
    nodes: Vec<Option<Child>>,
}

/// A free port whose cluster bus port (`port + 10000`) is free too.
fn free_port() -> u16 {
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .map(|address| address.port())
            .expect("a free port");
        if port < 55_000 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}

/// One cluster at a time: two starting at once could pick each other's
/// ports, and the machine's cores are few.
static ONE_CLUSTER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A cluster node on `port`, its files in `<dir>/<port>` (its `nodes.conf`
/// kept there, so a restarted node rejoins as what the cluster made it).
fn spawn_node(dir: &std::path::Path, port: u16) -> Child {
    let node_dir = dir.join(port.to_string());
    std::fs::create_dir_all(&node_dir).expect("a node folder");
    Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--cluster-enabled", "yes", "--cluster-node-timeout", "1000"])
        // A replica synced at once (not after the diskless sync's 5 s
        // delay), and always allowed to take over.
        .args(["--repl-diskless-sync-delay", "0"])
        .args(["--cluster-replica-validity-factor", "0"])
        .args([
            "--cluster-config-file",
            "nodes.conf",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .arg("--logfile")
        .arg(node_dir.join("redis.log"))
        .arg("--dir")
        .arg(&node_dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start redis-server")
}

fn cli(port: u16, args: &[&str]) -> String {
    Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .map(|out| String::from_utf8_lossy(&out.stdout).into_owned())
        .unwrap_or_default()
}

impl OwnCluster {
    /// 3 masters with `replicas` replicas each.
    fn start(test: &str, replicas: usize) -> Option<Self> {
        if Command::new("redis-server")
            .arg("--version")
            .output()
            .is_err()
            || Command::new("redis-cli").arg("--version").output().is_err()
        {
            skip_or_fail(test, "redis-server or redis-cli is not installed");
            return None;
        }
        let dir = std::env::temp_dir().join(format!("babel-idem-cluster-{}", unique_suffix()));
        let ports: Vec<u16> = (0..3 * (1 + replicas)).map(|_| free_port()).collect();
        let nodes = ports
            .iter()
            .map(|&port| Some(spawn_node(&dir, port)))
            .collect();
        let cluster = OwnCluster { dir, ports, nodes };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !cluster
            .ports
            .iter()
            .all(|&p| cli(p, &["ping"]).trim() == "PONG")
        {
            assert!(
                Instant::now() < deadline,
                "the cluster's nodes did not start"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let addresses: Vec<String> = cluster
            .ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        let created = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addresses)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdout(Stdio::null())
            .status()
            .expect("redis-cli --cluster create");
        assert!(created.success(), "redis-cli --cluster create failed");
        cluster.wait_ok(&cluster.ports);
        // Every replica has its master's data before anything is killed.
        let deadline = Instant::now() + Duration::from_secs(30);
        while !cluster.ports.iter().all(|&p| {
            let info = cli(p, &["info", "replication"]);
            info.contains("role:master") || info.contains("master_link_status:up")
        }) {
            assert!(Instant::now() < deadline, "the replicas never synced");
            std::thread::sleep(Duration::from_millis(100));
        }
        Some(cluster)
    }

    fn wait_ok(&self, ports: &[u16]) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !ports
            .iter()
            .all(|&p| cli(p, &["cluster", "info"]).contains("cluster_state:ok"))
        {
            assert!(
                Instant::now() < deadline,
                "the cluster never reached cluster_state:ok"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn url(&self) -> String {
        let seeds: Vec<String> = self
            .ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        format!("redis+cluster://{}/", seeds.join(","))
    }

    /// Each master's port and its slot ranges, from `CLUSTER NODES`.
    fn masters(&self) -> Vec<Master> {
        let alive = self
            .ports
            .iter()
            .zip(&self.nodes)
            .find(|(_, node)| node.is_some())
            .map(|(p, _)| *p)
            .unwrap_or_default();
        cli(alive, &["cluster", "nodes"])
            .lines()
            .filter_map(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                if !fields.get(2)?.contains("master") || fields.get(2)?.contains("fail") {
                    return None;
                }
                let port: u16 = fields[1]
                    .split('@')
                    .next()?
                    .rsplit(':')
                    .next()?
                    .parse()
                    .ok()?;
                let ranges = fields[8..]
                    .iter()
                    .filter(|r| !r.starts_with('['))
                    .filter_map(|r| {
                        let (a, b) = r.split_once('-').unwrap_or((r, r));
                        Some((a.parse().ok()?, b.parse().ok()?))
                    })
                    .collect();
                Some((port, fields[0].to_owned(), ranges))
            })
            .collect()
    }

    fn kill(&mut self, port: u16) {
        if let Some(index) = self.ports.iter().position(|&p| p == port)
            && let Some(mut child) = self.nodes[index].take()
        {
            let _ = child.kill(); // SIGKILL
            let _ = child.wait();
        }
    }
}

impl Drop for OwnCluster {
    fn drop(&mut self) {
        for node in self.nodes.iter_mut().flatten() {
            let _ = node.kill();
            let _ = node.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn slot_of(key: &str) -> u16 {
    // CRC16-XMODEM of the key (no hash tag in the test's keys), mod 16384.
    let mut crc: u16 = 0;
    for &byte in key.as_bytes() {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

struct Delivery(String);

impl MessageId for Delivery {
    fn message_id(&self) -> Option<&str> {
        Some(&self.0)
    }
}

/// What happens to the cluster a third of the way through the run.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Disruption {
    /// The busiest master is killed.
    Kill,
    /// 4,000 slots move from the busiest master to another, by
    /// `redis-cli --cluster reshard`; the guard's calls go through
    /// `store::Batched`, so batches meet the moving slots too.
    Reshard,
}

impl Disruption {
    fn name(self) -> &'static str {
        match self {
            Disruption::Kill => "kill",
            Disruption::Reshard => "reshard",
        }
    }

    fn from_name(name: &str) -> Option<Self> {
        [Disruption::Kill, Disruption::Reshard]
            .into_iter()
            .find(|d| d.name() == name)
    }
}

/// What a worker process is told, one line in [`WORKER_ENV`]:
/// `<disruption> <cluster URL> <store prefix> <board URL> <board prefix>`.
struct WorkerConfig {
    disruption: Disruption,
    cluster_url: String,
    prefix: String,
    board_url: String,
    board: String,
}

impl WorkerConfig {
    fn to_env(&self) -> String {
        format!(
            "{} {} {} {} {}",
            self.disruption.name(),
            self.cluster_url,
            self.prefix,
            self.board_url,
            self.board
        )
    }

    fn from_env(line: &str) -> Self {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [disruption, cluster_url, prefix, board_url, board] = fields[..] else {
            panic!("{WORKER_ENV} has five fields, got {line:?}");
        };
        WorkerConfig {
            disruption: Disruption::from_name(disruption).expect("a disruption's name"),
            cluster_url: cluster_url.to_owned(),
            prefix: prefix.to_owned(),
            board_url: board_url.to_owned(),
            board: board.to_owned(),
        }
    }
}

/// The run's shared state on the shared Redis server, under `<board>`:
///
/// | key | what |
/// |---|---|
/// | `queue` | a list of the deliveries not yet taken |
/// | `left` | how many deliveries are not yet acked |
/// | `processed` | how many deliveries were acked |
/// | `in-flight` | a hash: per id, runs started and not ended |
/// | `runs` | a hash: per id, runs ended |
/// | `overlapping` | runs that started while another run of their id was in flight |
/// | `store-errors` | guard errors other than a park (a store error, a lost claim) |
/// | `parked` | deliveries parked behind a live claim |
/// | `error-kinds` | a hash: each store error's text (its start), and how often |
struct Board {
    prefix: String,
}

impl Board {
    fn key(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    fn keys(&self) -> Vec<String> {
        [
            "queue",
            "left",
            "processed",
            "in-flight",
            "runs",
            "overlapping",
            "store-errors",
            "parked",
            "error-kinds",
        ]
        .iter()
        .map(|name| self.key(name))
        .collect()
    }
}

/// The board's keys of one run, deleted when the run ends, however it ends.
struct BoardKeys {
    url: String,
    keys: Vec<String>,
}

impl Drop for BoardKeys {
    fn drop(&mut self) {
        if let Ok(mut connection) =
            redis::Client::open(self.url.as_str()).and_then(|client| client.get_connection())
        {
            let _: redis::RedisResult<i64> =
                redis::cmd("DEL").arg(&self.keys).query(&mut connection);
        }
    }
}

/// The worker processes of one run, killed if still running when dropped.
struct Workers(Vec<Child>);

impl Drop for Workers {
    fn drop(&mut self) {
        for child in &mut self.0 {
            if matches!(child.try_wait(), Ok(None)) {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// One worker process: 16 tasks take deliveries from the board's queue and
/// run each through a claim-mode guard over the cluster, until every
/// delivery of the run is acked.
async fn run_worker(config: WorkerConfig) {
    let board = Arc::new(Board {
        prefix: config.board.clone(),
    });
    // The board's calls must not fail when the machine is loaded: a late
    // answer is waited for (a retried HINCRBY could count a run twice).
    let connection = redis::Client::open(config.board_url.as_str())
        .expect("the board's URL")
        .get_connection_manager_with_config(
            redis::aio::ConnectionManagerConfig::new()
                .set_connection_timeout(Some(BOARD_TIMEOUT))
                .set_response_timeout(Some(BOARD_TIMEOUT)),
        )
        .await
        .expect("the board's Redis answers");
    let builder = RedisStore::builder()
        .prefix(&config.prefix)
        .timeout(Duration::from_millis(500));
    let store = builder
        .connect(&config.cluster_url)
        .await
        .expect("the cluster answers");
    let guarded: Arc<dyn ClaimStore> = if config.disruption == Disruption::Reshard {
        Arc::new(babel_idem::store::Batched::new(store))
    } else {
        Arc::new(store)
    };
    // A commit that fails is returned, not acked: the delivery comes back.
    let guard = Arc::new(
        Guard::new(guarded)
            .on_remember_failure(OnRememberFailure::ReturnError)
            .lease(LEASE)
            .expect("a lease"),
    );
    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let (guard, board, mut connection) =
                (Arc::clone(&guard), Arc::clone(&board), connection.clone());
            tokio::spawn(async move {
                loop {
                    let next: Option<String> = connection
                        .lpop(board.key("queue"), None)
                        .await
                        .expect("LPOP the queue");
                    let Some(id) = next else {
                        let left: i64 = connection
                            .get(board.key("left"))
                            .await
                            .expect("GET the count left");
                        if left <= 0 {
                            return;
                        }
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    };
                    let mut runs = connection.clone();
                    let handler = async {
                        let now: i64 = runs
                            .hincr(board.key("in-flight"), &id, 1)
                            .await
                            .expect("HINCRBY in-flight");
                        if now > 1 {
                            let _: i64 = runs
                                .incr(board.key("overlapping"), 1)
                                .await
                                .expect("INCR overlapping");
                        }
                        tokio::time::sleep(Duration::from_millis(1 + (task as u64 % 5))).await;
                        let _: i64 = runs
                            .hincr(board.key("runs"), &id, 1)
                            .await
                            .expect("HINCRBY runs");
                        let _: i64 = runs
                            .hincr(board.key("in-flight"), &id, -1)
                            .await
                            .expect("HINCRBY in-flight");
                        Ok::<(), StoreError>(())
                    };
                    match guard.run(&Delivery(id.clone()), handler).await {
                        Ok(()) => {
                            let _: i64 = connection
                                .incr(board.key("processed"), 1)
                                .await
                                .expect("INCR processed");
                            let _: i64 = connection
                                .decr(board.key("left"), 1)
                                .await
                                .expect("DECR left");
                        }
                        Err(error) => {
                            if error.is_parked() {
                                let _: i64 = connection
                                    .incr(board.key("parked"), 1)
                                    .await
                                    .expect("INCR parked");
                            } else {
                                let kind: String = error.to_string().chars().take(160).collect();
                                let _: i64 = connection
                                    .incr(board.key("store-errors"), 1)
                                    .await
                                    .expect("INCR store-errors");
                                let _: i64 = connection
                                    .hincr(board.key("error-kinds"), kind, 1)
                                    .await
                                    .expect("HINCRBY error-kinds");
                            }
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            let _: i64 = connection
                                .rpush(board.key("queue"), &id)
                                .await
                                .expect("RPUSH the queue");
                        }
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("a worker task ran to its end");
    }
}

/// Runs as a worker process of a failover test when [`WORKER_ENV`] is set
/// (the tests start it so); otherwise does nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a worker process the failover tests start themselves; alone it does nothing"]
async fn failover_worker_process() {
    let Ok(line) = std::env::var(WORKER_ENV) else {
        return;
    };
    run_worker(WorkerConfig::from_env(&line)).await;
}

/// What one run measured.
struct Figures {
    overlapping: i64,
    run_twice: usize,
    store_errors: i64,
    parked: i64,
    error_kinds: String,
    offsets: String,
    took: Duration,
}

/// The run of `disruption` on `cluster`: three worker processes, the
/// disruption a third of the way through, then every id checked done.
/// `None` when the shared Redis server for the board is not configured.
async fn claim_mode_run(
    test: &str,
    cluster: &mut OwnCluster,
    disruption: Disruption,
) -> Option<Figures> {
    let board_url = server_url(REDIS_URL, test)?;
    let run = unique_suffix();
    let config = WorkerConfig {
        disruption,
        cluster_url: cluster.url(),
        prefix: format!("fo{run}:"),
        board_url: board_url.clone(),
        board: format!("bqtest:failover:{run}:"),
    };
    let board = Board {
        prefix: config.board.clone(),
    };
    let _board_keys = BoardKeys {
        url: board_url.clone(),
        keys: board.keys(),
    };
    let mut connection = redis::Client::open(board_url.as_str())
        .expect("the board's URL")
        .get_multiplexed_async_connection_with_config(
            &redis::AsyncConnectionConfig::new()
                .set_connection_timeout(Some(BOARD_TIMEOUT))
                .set_response_timeout(Some(BOARD_TIMEOUT)),
        )
        .await
        .expect("the shared Redis answers");
    let ids: Vec<String> = (0..IDS).map(|n| format!("order-{n:05}")).collect();
    let mut deliveries: Vec<String> = ids
        .iter()
        .flat_map(|id| std::iter::repeat_n(id.clone(), DELIVERIES))
        .collect();
    let mut seed = uuid::Uuid::new_v4().as_u64_pair().0 | 1;
    for i in (1..deliveries.len()).rev() {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        deliveries.swap(i, (seed % (i as u64 + 1)) as usize);
    }
    for chunk in deliveries.chunks(1_000) {
        let _: i64 = connection
            .rpush(board.key("queue"), chunk)
            .await
            .expect("RPUSH the deliveries");
    }
    let _: () = connection
        .set(board.key("left"), deliveries.len())
        .await
        .expect("SET the count left");

    // The master holding the most test ids.
    let masters = cluster.masters();
    let mut per_master: HashMap<u16, usize> = HashMap::new();
    for id in &ids {
        let slot = slot_of(&format!("{}{id}", config.prefix));
        if let Some((port, _, _)) = masters
            .iter()
            .find(|(_, _, ranges)| ranges.iter().any(|&(a, b)| (a..=b).contains(&slot)))
        {
            *per_master.entry(*port).or_default() += 1;
        }
    }
    let (victim, _) = per_master
        .iter()
        .max_by_key(|(_, n)| **n)
        .map(|(p, n)| (*p, *n))
        .unwrap();
    let (_, victim_id, _) = masters
        .iter()
        .find(|(p, _, _)| *p == victim)
        .unwrap()
        .clone();

    let started = Instant::now();
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut workers = Workers(
        (0..WORKERS)
            .map(|_| {
                Command::new(&exe)
                    .args([WORKER_TEST, "--exact", "--ignored", "--nocapture"])
                    .args(["--test-threads", "1"])
                    .env(WORKER_ENV, config.to_env())
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::inherit())
                    .spawn()
                    .expect("start a worker process")
            })
            .collect(),
    );

    let figures = |connection: &redis::aio::MultiplexedConnection| {
        let mut connection = connection.clone();
        let keys = (
            board.key("processed"),
            board.key("queue"),
            board.key("store-errors"),
            board.key("error-kinds"),
        );
        async move {
            let processed: Option<i64> = connection.get(&keys.0).await.unwrap_or_default();
            let queued: i64 = connection.llen(&keys.1).await.unwrap_or_default();
            let errors: Option<i64> = connection.get(&keys.2).await.unwrap_or_default();
            let kinds: HashMap<String, i64> = connection.hgetall(&keys.3).await.unwrap_or_default();
            format!(
                "{} processed, {queued} queued, {} store errors: {kinds:?}",
                processed.unwrap_or(0),
                errors.unwrap_or(0)
            )
        }
    };

    // Mid-run: the busiest master's offset against its replica's, then kill -9.
    loop {
        let processed: Option<i64> = connection
            .get(board.key("processed"))
            .await
            .expect("GET processed");
        if processed.unwrap_or(0) >= (IDS * DELIVERIES / 3) as i64 {
            break;
        }
        for worker in &mut workers.0 {
            if let Ok(Some(status)) = worker.try_wait() {
                panic!(
                    "a worker process ended before the disruption ({status}): {}",
                    figures(&connection).await
                );
            }
        }
        assert!(
            started.elapsed() < DEADLINE,
            "the run stalled before the disruption: {}",
            figures(&connection).await
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let offsets = if disruption == Disruption::Reshard {
        let target = masters
            .iter()
            .find(|(p, _, _)| *p != victim)
            .map(|(_, id, _)| id.clone())
            .unwrap();
        let resharded = tokio::task::spawn_blocking(move || {
            Command::new("redis-cli")
                .args(["--cluster", "reshard", &format!("127.0.0.1:{victim}")])
                .args(["--cluster-from", &victim_id, "--cluster-to", &target])
                .args(["--cluster-slots", "4000", "--cluster-yes"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
        })
        .await
        .expect("the reshard task")
        .expect("redis-cli --cluster reshard");
        assert!(resharded.success(), "redis-cli --cluster reshard failed");
        format!("4000 slots moved off {victim} while deliveries ran")
    } else {
        // The replica's offset first, then the master's, then the kill: the
        // difference is at least what the replica lacked when the master died.
        let replica_port = cluster
            .ports
            .iter()
            .copied()
            .find(|&p| {
                cli(p, &["cluster", "nodes"])
                    .lines()
                    .any(|l| l.contains("myself,slave") && l.contains(&victim_id))
            })
            .unwrap_or_default();
        let replica_offset = cli(replica_port, &["info", "replication"]);
        let master_offset = cli(victim, &["info", "replication"]);
        cluster.kill(victim);
        let pick = |info: &str, field: &str| {
            info.lines()
                .find_map(|l| l.trim().strip_prefix(field).map(str::to_owned))
                .unwrap_or_default()
        };
        format!(
            "master {victim} master_repl_offset {} / replica {replica_port} slave_repl_offset {}",
            pick(&master_offset, "master_repl_offset:"),
            pick(&replica_offset, "slave_repl_offset:")
        )
    };

    // Every worker ends once every delivery is acked.
    loop {
        let mut running = 0;
        for worker in &mut workers.0 {
            match worker.try_wait().expect("a worker's status") {
                None => running += 1,
                Some(status) => assert!(
                    status.success(),
                    "a worker process failed ({status}): {}",
                    figures(&connection).await
                ),
            }
        }
        if running == 0 {
            break;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "the run did not finish after the disruption: {}",
            figures(&connection).await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let took = started.elapsed();

    let store = RedisStore::builder()
        .prefix(&config.prefix)
        .connect(&config.cluster_url)
        .await
        .expect("the cluster answers again");
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    let seen = store
        .seen_many(&refs)
        .await
        .expect("the cluster answers again");
    let not_done: Vec<&str> = refs
        .iter()
        .zip(&seen)
        .filter(|(_, seen)| !**seen)
        .map(|(id, _)| *id)
        .collect();
    assert!(
        not_done.is_empty(),
        "every id ends done; not: {:?} ({:?}); {}",
        &not_done[..not_done.len().min(5)],
        babel_idem::store::Admin::states(&store, &not_done[..not_done.len().min(5)]).await,
        figures(&connection).await
    );
    let runs: HashMap<String, i64> = connection
        .hgetall(board.key("runs"))
        .await
        .expect("HGETALL runs");
    let never: Vec<&String> = ids.iter().filter(|id| !runs.contains_key(*id)).collect();
    assert!(
        never.is_empty(),
        "every id ran; not: {:?}",
        &never[..never.len().min(5)]
    );
    let board_connection = connection.clone();
    let count = |key: &str| {
        let mut connection = board_connection.clone();
        let key = board.key(key);
        async move {
            let value: Option<i64> = connection.get(key).await.expect("GET a figure");
            value.unwrap_or(0)
        }
    };
    let kinds: HashMap<String, i64> = connection
        .hgetall(board.key("error-kinds"))
        .await
        .expect("HGETALL error-kinds");
    let mut kinds: Vec<(String, i64)> = kinds.into_iter().collect();
    kinds.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
    Some(Figures {
        overlapping: count("overlapping").await,
        run_twice: runs.values().filter(|&&n| n > 1).count(),
        store_errors: count("store-errors").await,
        parked: count("parked").await,
        error_kinds: kinds
            .iter()
            .take(4)
            .map(|(kind, n)| format!("{n} × {kind}"))
            .collect::<Vec<_>>()
            .join("; "),
        offsets,
        took,
    })
}

impl Figures {
    fn print(&self, what: &str) {
        eprintln!(
            "{what}: {} overlapping runs, {} ids run twice, {} store errors, {} parked; {}; \
             run took {:.1} s; errors: [{}]",
            self.overlapping,
            self.run_twice,
            self.store_errors,
            self.parked,
            self.offsets,
            self.took.as_secs_f64(),
            self.error_kinds
        );
    }
}

/// Without `WAIT`: the run finishes after the busiest master dies, every id
/// done; what the lost writes did is printed, with the offsets at the kill.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_master_is_failed_over_and_the_claim_mode_run_finishes() {
    const TEST: &str = "a_killed_master_is_failed_over_and_the_claim_mode_run_finishes";
    let _one = ONE_CLUSTER.lock().await;
    let Some(mut cluster) = OwnCluster::start(TEST, 1) else {
        return;
    };
    let Some(figures) = claim_mode_run(TEST, &mut cluster, Disruption::Kill).await else {
        return;
    };
    figures.print("failover without WAIT");
}

/// With `wait_for_replicas(1, 1s)` on 3 masters with one replica each: the
/// busiest master is killed a third of the way through and its replica
/// promoted, so that shard has no replica left and every write to it fails
/// (`NotReplicated`, then `ShortOfReplicas`), by design, until an operator
/// gives it one. A `Consumer` in claim mode (concurrency 32, on a queue of
/// the shared Redis server) treats those ids as an outage: they go back
/// unattempted, none runs twice, none is dead-lettered, none is lost; and
/// the ids of the two other shards keep flowing, each run once, a second
/// wave of them queued once the cluster has failed over included, with no
/// pause of every reservation meanwhile. The throughput before the kill and
/// after the failover is printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by hand (`cargo test --all-features --test cluster_failover -- --ignored`): on a loaded machine the other shards' ids can slow to a few per second behind the shard without a replica, and outlast the test's patience"]
async fn with_wait_a_shard_left_without_a_replica_pauses_its_ids_while_the_others_run_once() {
    const TEST: &str =
        "with_wait_a_shard_left_without_a_replica_pauses_its_ids_while_the_others_run_once";
    let _one = ONE_CLUSTER.lock().await;
    let Some(mut cluster) = OwnCluster::start(TEST, 1) else {
        return;
    };
    let Some(queue_url) = server_url(REDIS_URL, TEST) else {
        return;
    };
    let figures = consumer_run_with_wait(&mut cluster, &queue_url).await;
    figures.print();
    assert_eq!(figures.overlapping, 0, "two runs of an id overlapped");
    assert!(
        figures.run_twice.is_empty(),
        "ids ran twice: {:?}",
        figures.run_twice
    );
    assert!(
        figures.others_not_run.is_empty(),
        "ids of the other shards never ran: {:?}",
        figures.others_not_run
    );
    assert_eq!(figures.report.dead_lettered, 0, "{:?}", figures.report);
    assert_eq!(figures.dead_letter_records, 0, "records in the DLQ");
    assert_eq!(figures.report.retried, 0, "{:?}", figures.report);
    // Whole-consumer pauses begun after the failover are printed above, not
    // asserted: whether a failure comes within the partial-outage window of
    // another delivery's answer depends on the machine's load. What the
    // consumer promises is asserted: the other shards' ids all ran, once.
    assert!(
        figures.lost.is_empty(),
        "ids of the killed shard neither run nor in the queue: {:?}",
        figures.lost
    );
}

/// Whether the cluster, asked at `survivor`, holds the node at `victim`
/// failed and is `cluster_state:ok` again (its replica took over).
fn failed_over(survivor: u16, victim: u16) -> bool {
    let victim_failed = cli(survivor, &["cluster", "nodes"]).lines().any(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        fields.get(1).is_some_and(|address| {
            address
                .split('@')
                .next()
                .is_some_and(|a| a.ends_with(&format!(":{victim}")))
        }) && fields
            .get(2)
            .is_some_and(|flags| flags.split(',').any(|flag| flag == "fail"))
    });
    victim_failed && cli(survivor, &["cluster", "info"]).contains("cluster_state:ok")
}

/// What [`consumer_run_with_wait`] measured.
struct ConsumerFigures {
    overlapping: u64,
    run_twice: Vec<String>,
    others_not_run: Vec<String>,
    lost: Vec<String>,
    dead_letter_records: usize,
    /// Store outages (each a pause of every reservation) begun between the
    /// cluster's `cluster_state:ok` after the kill and the last id of the
    /// other shards.
    outages_while_others_ran: u64,
    killed_ran: usize,
    killed_ids: usize,
    /// Ids run before the kill, and how long that took.
    before: (usize, Duration),
    /// How long the cluster took to be `cluster_state:ok` after the kill.
    failover: Duration,
    /// The other shards' ids run after that (those left of the first wave,
    /// and all of the second), and how long they took.
    after: (usize, Duration),
    report: babel_idem::consumer::ConsumerReport,
}

impl ConsumerFigures {
    fn print(&self) {
        let rate = |(n, took): (usize, Duration)| n as f64 / took.as_secs_f64().max(0.001);
        eprintln!(
            "shard without a replica: before the kill {} ids in {:.1} s ({:.0} ids/s); failover \
             {:.1} s; after it the other shards' {} ids in {:.1} s ({:.0} ids/s), {} \
             whole-consumer pauses begun meanwhile; the killed shard's {} ids: {} ran, the rest \
             paused; report: {:?}",
            self.before.0,
            self.before.1.as_secs_f64(),
            rate(self.before),
            self.failover.as_secs_f64(),
            self.after.0,
            self.after.1.as_secs_f64(),
            rate(self.after),
            self.outages_while_others_ran,
            self.killed_ids,
            self.killed_ran,
            self.report
        );
    }
}

/// The ids run, and per id runs in flight, counted by the handler.
#[derive(Default)]
struct Runs {
    done: std::sync::Mutex<HashMap<String, u32>>,
    in_flight: std::sync::Mutex<HashMap<String, u32>>,
    overlapping: std::sync::atomic::AtomicU64,
}

/// The consumer run of the test above; the cluster is `cluster`, the queue
/// on the Redis server `queue_url`.
async fn consumer_run_with_wait(cluster: &mut OwnCluster, queue_url: &str) -> ConsumerFigures {
    use babel_idem::transport::RedisTransport;
    use babel_idem::{Consumer, Envelope, Router, urn};
    use std::sync::atomic::Ordering;

    let run = unique_suffix();
    let prefix = format!("fo{run}:");
    let queue = consumer_support::redis_queue::Queue::new(queue_url);
    // The first wave is queued at the start, the second once the cluster
    // has failed over: the other shards' ids of that wave all run with the
    // killed master's shard left without a replica.
    let ids: Vec<String> = (0..IDS + WAVE).map(|n| format!("order-{n:05}")).collect();
    let (first_wave, second_wave) = ids.split_at(IDS);

    // Which master holds each id's keys; the busiest is killed.
    let masters = cluster.masters();
    let master_of = |id: &str| {
        let slot = slot_of(&format!("{prefix}{id}"));
        masters
            .iter()
            .find(|(_, _, ranges)| ranges.iter().any(|&(a, b)| (a..=b).contains(&slot)))
            .map(|(port, _, _)| *port)
            .expect("every slot is served")
    };
    let mut per_master: HashMap<u16, usize> = HashMap::new();
    for id in &ids {
        *per_master.entry(master_of(id)).or_default() += 1;
    }
    let victim = per_master
        .iter()
        .max_by_key(|(_, n)| **n)
        .map(|(p, _)| *p)
        .unwrap();
    let killed: std::collections::HashSet<&str> = ids
        .iter()
        .filter(|id| master_of(id) == victim)
        .map(String::as_str)
        .collect();

    // Each id of a wave DELIVERIES times, in random order.
    let mut raw = queue.raw().await;
    let publish = |wave: &[String]| {
        let mut deliveries: Vec<&String> = wave
            .iter()
            .flat_map(|id| std::iter::repeat_n(id, DELIVERIES))
            .collect();
        let mut seed = uuid::Uuid::new_v4().as_u64_pair().0 | 1;
        for i in (1..deliveries.len()).rev() {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            deliveries.swap(i, (seed % (i as u64 + 1)) as usize);
        }
        let bodies: Vec<Vec<Vec<u8>>> = deliveries
            .chunks(500)
            .map(|chunk| {
                chunk
                    .iter()
                    .map(|id| consumer_support::envelope_with_id(id, &queue.name, 0).to_vec())
                    .collect()
            })
            .collect();
        let (mut raw, name) = (raw.clone(), queue.name.clone());
        async move {
            for chunk in bodies {
                let _: i64 = raw.rpush(&name, chunk).await.expect("RPUSH");
            }
        }
    };
    publish(first_wave).await;

    let store = RedisStore::builder()
        .prefix(&prefix)
        .timeout(Duration::from_millis(500))
        .wait_for_replicas(1, Duration::from_secs(1))
        .connect(&cluster.url())
        .await
        .expect("the cluster answers");
    let guard = Arc::new(
        Guard::new(Arc::new(store) as Arc<dyn ClaimStore>)
            .lease(LEASE)
            .expect("a lease"),
    );
    let runs = Arc::new(Runs::default());
    let router = {
        let (guard, runs) = (Arc::clone(&guard), Arc::clone(&runs));
        Router::builder()
            .route(urn!("urn:babel:interop:created"), move |env: Envelope| {
                let (guard, runs) = (Arc::clone(&guard), Arc::clone(&runs));
                async move {
                    let id = env.meta.id.clone().unwrap_or_default();
                    guard
                        .run(&env, async {
                            let now = {
                                let mut in_flight = runs.in_flight.lock().unwrap();
                                let now = in_flight.entry(id.clone()).or_default();
                                *now += 1;
                                *now
                            };
                            if now > 1 {
                                runs.overlapping.fetch_add(1, Ordering::SeqCst);
                            }
                            tokio::time::sleep(Duration::from_millis(2)).await;
                            *runs.done.lock().unwrap().entry(id.clone()).or_default() += 1;
                            *runs.in_flight.lock().unwrap().get_mut(&id).unwrap() -= 1;
                            Ok::<(), StoreError>(())
                        })
                        .await
                }
            })
            .build()
            .unwrap()
    };
    let transport = RedisTransport::connect(queue_url)
        .await
        .expect("the queue's Redis");
    let consumer = Consumer::builder(router, transport, &queue.name)
        .concurrency(32)
        .shutdown_timeout(Duration::from_secs(5))
        .build()
        .unwrap();

    let started = Instant::now();
    let ran = |runs: &Runs| runs.done.lock().unwrap().len();
    let others_left = |runs: &Runs| {
        let done = runs.done.lock().unwrap();
        ids.iter()
            .filter(|id| !killed.contains(id.as_str()) && !done.contains_key(*id))
            .count()
    };
    let stop = tokio::sync::Notify::new();
    let watch = async {
        // A third of the ids run, then the busiest master dies.
        while ran(&runs) < IDS / 3 {
            assert!(
                started.elapsed() < DEADLINE,
                "the run stalled before the kill: {:?}",
                consumer.progress().report()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let before = (ran(&runs), started.elapsed());
        cluster.kill(victim);
        let killed_at = Instant::now();
        let survivor = *cluster.ports.iter().find(|&&p| p != victim).unwrap();
        while !tokio::task::spawn_blocking(move || failed_over(survivor, victim))
            .await
            .unwrap()
        {
            assert!(
                killed_at.elapsed() < DEADLINE,
                "the cluster never failed over"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let failover = killed_at.elapsed();
        let outages_at_ok = consumer.progress().report().store_outages;
        let left_at_ok = others_left(&runs);
        publish(second_wave).await;
        let ok_at = Instant::now();
        while others_left(&runs) > 0 && killed_at.elapsed() < DEADLINE {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let outages = consumer.progress().report().store_outages - outages_at_ok;
        let after = (
            left_at_ok + second_wave.len()
                - others_left(&runs)
                - second_wave
                    .iter()
                    .filter(|id| killed.contains(id.as_str()))
                    .count(),
            ok_at.elapsed(),
        );
        stop.notify_one();
        (before, failover, after, outages)
    };
    let (report, (before, failover, after, outages_while_others_ran)) =
        tokio::join!(consumer.run_until(stop.notified()), watch);

    let done = runs.done.lock().unwrap().clone();
    // Whatever was not settled is in the queue or still reserved.
    let mut waiting: Vec<Vec<u8>> = raw.lrange(&queue.name, 0, -1).await.unwrap();
    let processing: Vec<Vec<u8>> = raw.lrange(queue.processing(), 0, -1).await.unwrap();
    waiting.extend(processing);
    let queued: std::collections::HashSet<String> = waiting
        .iter()
        .filter_map(|body| Envelope::from_slice(body).ok()?.meta.id)
        .collect();
    let dead_letter_records = queue.len(&queue.dlq()).await;
    ConsumerFigures {
        overlapping: runs.overlapping.load(Ordering::SeqCst),
        run_twice: done
            .iter()
            .filter(|(_, n)| **n > 1)
            .map(|(id, n)| format!("{id}: {n}"))
            .collect(),
        others_not_run: ids
            .iter()
            .filter(|id| !killed.contains(id.as_str()) && !done.contains_key(*id))
            .take(10)
            .cloned()
            .collect(),
        lost: killed
            .iter()
            .filter(|id| !done.contains_key(**id) && !queued.contains(**id))
            .take(10)
            .map(|id| (*id).to_owned())
            .collect(),
        dead_letter_records,
        outages_while_others_ran,
        killed_ran: killed.iter().filter(|id| done.contains_key(**id)).count(),
        killed_ids: killed.len(),
        before,
        failover,
        after,
        report,
    }
}

/// A slot range moves between masters while deliveries run (single calls
/// and `Batched` batches): redirections are followed or the call fails and
/// the delivery comes back; no id is lost, none runs twice, no two runs of
/// an id overlap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resharding_while_deliveries_run_loses_nothing_and_runs_each_id_once() {
    const TEST: &str = "resharding_while_deliveries_run_loses_nothing_and_runs_each_id_once";
    let _one = ONE_CLUSTER.lock().await;
    let Some(mut cluster) = OwnCluster::start(TEST, 0) else {
        return;
    };
    let Some(figures) = claim_mode_run(TEST, &mut cluster, Disruption::Reshard).await else {
        return;
    };
    figures.print("resharding");
    assert_eq!(figures.overlapping, 0, "two runs of an id overlapped");
    assert_eq!(figures.run_twice, 0, "an id ran twice");
}
