//! Claim mode on a Redis Cluster of its own (3 masters, 1 or 2 replicas each, in a
//! temporary folder on free ports) while its busiest master is killed
//! (`kill -9`) mid-run and its replica promoted; and a slot range resharded
//! while deliveries run.
//!
//! 48 tasks (3 groups of 16, as three workers would run them) take 2,000
//! ids, each delivered 3 times in random order, from an in-process queue; a
//! delivery whose guard fails (a store error, a parked claim) goes back to
//! the queue, as a broker's redelivery would. The handlers count, per id,
//! runs in flight at once and runs in all. The run must finish with every
//! id done; the figures (runs overlapping, ids run twice, the master's
//! replication offset against its replica's at the kill) are printed, and
//! with `wait_for_replicas(1, ...)` no two runs of an id ever overlap.

#![cfg(feature = "redis-cluster")]

mod store_contract;

use std::collections::{HashMap, VecDeque};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use babel_idem::store::RedisStore;
use babel_idem::{Guard, MessageId, OnRememberFailure, Store, StoreError};
use store_contract::servers::{skip_or_fail, unique_suffix};

const TASKS: usize = 48;
const IDS: usize = 2_000;
const DELIVERIES: usize = 3;
const LEASE: Duration = Duration::from_secs(5);
const DEADLINE: Duration = Duration::from_secs(150);

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

#[derive(Default)]
struct Board {
    queue: Mutex<VecDeque<String>>,
    in_flight: Mutex<HashMap<String, u64>>,
    runs: Mutex<HashMap<String, u64>>,
    overlapping: AtomicU64,
    processed: AtomicU64,
    store_errors: AtomicU64,
    /// The first store error of each kind, as it reads.
    errors: Mutex<HashMap<String, u64>>,
}

struct Leaving<'a>(&'a Board, &'a str);

impl Drop for Leaving<'_> {
    fn drop(&mut self) {
        if let Some(count) = self.0.in_flight.lock().unwrap().get_mut(self.1) {
            *count -= 1;
        }
    }
}

/// What one run measured.
struct Figures {
    overlapping: u64,
    run_twice: usize,
    store_errors: u64,
    offsets: String,
}

/// What happens to the cluster a third of the way through the run.
#[derive(Clone, Copy, PartialEq)]
enum Disruption {
    /// The busiest master is killed; with `durable`, writes wait for a replica.
    Kill { durable: bool },
    /// 4,000 slots move from the busiest master to another, by
    /// `redis-cli --cluster reshard`; the guard's calls go through
    /// `store::Batched`, so batches meet the moving slots too.
    Reshard,
}

async fn claim_mode_run(cluster: &mut OwnCluster, disruption: Disruption) -> Figures {
    let durable = disruption == Disruption::Kill { durable: true };
    let url = cluster.url();
    let prefix = format!("fo{}:", unique_suffix());
    let mut builder = RedisStore::builder()
        .prefix(&prefix)
        .timeout(Duration::from_millis(500));
    if durable {
        builder = builder.wait_for_replicas(1, Duration::from_secs(1));
    }
    let store = builder.connect(&url).await.expect("the cluster answers");
    // A commit that fails is returned, not acked: the delivery comes back.
    let guarded: Arc<dyn babel_idem::store::ClaimStore> = if disruption == Disruption::Reshard {
        Arc::new(babel_idem::store::Batched::new(store.clone()))
    } else {
        Arc::new(store.clone())
    };
    let guard = Guard::new(guarded)
        .on_remember_failure(OnRememberFailure::ReturnError)
        .lease(LEASE)
        .expect("a lease");
    let guard = Arc::new(guard);
    let ids: Vec<String> = (0..IDS).map(|n| format!("order-{n:05}")).collect();
    let board = Arc::new(Board::default());
    {
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
        board.queue.lock().unwrap().extend(deliveries);
    }
    // The master holding the most test ids.
    let masters = cluster.masters();
    let mut per_master: HashMap<u16, usize> = HashMap::new();
    for id in &ids {
        let slot = slot_of(&format!("{prefix}{id}"));
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
    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let (guard, board) = (Arc::clone(&guard), Arc::clone(&board));
            tokio::spawn(async move {
                loop {
                    let next = board.queue.lock().unwrap().pop_front();
                    let Some(id) = next else {
                        if board.in_flight.lock().unwrap().values().all(|&n| n == 0) {
                            return;
                        }
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    };
                    let handler = async {
                        {
                            let mut in_flight = board.in_flight.lock().unwrap();
                            let now = in_flight.entry(id.clone()).or_default();
                            *now += 1;
                            if *now > 1 {
                                board.overlapping.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        // Leaves the run's in-flight count also when the
                        // guard drops the handler.
                        let _leaving = Leaving(&board, &id);
                        tokio::time::sleep(Duration::from_millis(1 + (task as u64 % 5))).await;
                        *board.runs.lock().unwrap().entry(id.clone()).or_default() += 1;
                        Ok::<(), StoreError>(())
                    };
                    match guard.run(&Delivery(id.clone()), handler).await {
                        Ok(()) => {
                            board.processed.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(error) => {
                            if !error.is_parked() {
                                board.store_errors.fetch_add(1, Ordering::Relaxed);
                                let kind: String = error.to_string().chars().take(400).collect();
                                *board.errors.lock().unwrap().entry(kind).or_default() += 1;
                            }
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            board.queue.lock().unwrap().push_back(id);
                        }
                    }
                }
            })
        })
        .collect();

    // Mid-run: the busiest master's offset against its replica's, then kill -9.
    while board.processed.load(Ordering::Relaxed) < (IDS * DELIVERIES / 3) as u64 {
        assert!(
            started.elapsed() < DEADLINE,
            "the run stalled before the kill: {:?}",
            board.errors.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
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

    for task in tasks {
        let left = DEADLINE.saturating_sub(started.elapsed());
        if tokio::time::timeout(left, task).await.is_err() {
            panic!(
                "the run did not finish after the failover: {} processed, {} queued, {} store errors: {:?}",
                board.processed.load(Ordering::Relaxed),
                board.queue.lock().unwrap().len(),
                board.store_errors.load(Ordering::Relaxed),
                board.errors.lock().unwrap()
            );
        }
    }
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
        "every id ends done; not: {:?} ({:?}); errors: {:?}",
        &not_done[..not_done.len().min(5)],
        babel_idem::store::Admin::states(&store, &not_done[..not_done.len().min(5)]).await,
        board.errors.lock().unwrap()
    );
    let runs = board.runs.lock().unwrap();
    assert!(
        ids.iter().all(|id| runs.get(id).copied().unwrap_or(0) >= 1),
        "every id ran"
    );
    Figures {
        overlapping: board.overlapping.load(Ordering::Relaxed),
        run_twice: runs.values().filter(|&&n| n > 1).count(),
        store_errors: board.store_errors.load(Ordering::Relaxed),
        offsets,
    }
}

/// Without `WAIT`: the run finishes after the busiest master dies; what the
/// lost writes did is printed, with the offsets at the kill.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "flaky on a loaded machine: claims can keep meeting MOVED after the failover until the deadline; passes alone (cargo test --all-features --test cluster_failover -- --ignored)"]
async fn a_killed_master_is_failed_over_and_the_claim_mode_run_finishes() {
    const TEST: &str = "a_killed_master_is_failed_over_and_the_claim_mode_run_finishes";
    let _one = ONE_CLUSTER.lock().await;
    let Some(mut cluster) = OwnCluster::start(TEST, 1) else {
        return;
    };
    let figures = claim_mode_run(&mut cluster, Disruption::Kill { durable: false }).await;
    eprintln!(
        "failover without WAIT: {} overlapping runs, {} ids run twice, {} store errors; {}",
        figures.overlapping, figures.run_twice, figures.store_errors, figures.offsets
    );
}

/// With `wait_for_replicas(1, 1s)`: every acknowledged claim is on the
/// replica that takes over, so no two runs of an id overlap. Writes to the
/// lost master's slots would fail (`NotReplicated`) while the promoted
/// master had no replica: this cluster gives each master two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "flaky on a loaded machine: claims can keep meeting MOVED after the failover until the deadline; passes alone (cargo test --all-features --test cluster_failover -- --ignored)"]
async fn with_wait_a_failover_never_lets_two_runs_of_an_id_overlap() {
    const TEST: &str = "with_wait_a_failover_never_lets_two_runs_of_an_id_overlap";
    // Two replicas per master: after the failover the promoted master
    // still has one for `WAIT 1` (the other replica follows it).
    let _one = ONE_CLUSTER.lock().await;
    let Some(mut cluster) = OwnCluster::start(TEST, 2) else {
        return;
    };
    let figures = claim_mode_run(&mut cluster, Disruption::Kill { durable: true }).await;
    eprintln!(
        "failover with WAIT: {} overlapping runs, {} ids run twice, {} store errors; {}",
        figures.overlapping, figures.run_twice, figures.store_errors, figures.offsets
    );
    assert_eq!(figures.overlapping, 0, "two runs of an id overlapped");
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
    let figures = claim_mode_run(&mut cluster, Disruption::Reshard).await;
    eprintln!(
        "resharding: {} overlapping runs, {} ids run twice, {} store errors; {}",
        figures.overlapping, figures.run_twice, figures.store_errors, figures.offsets
    );
    assert_eq!(figures.overlapping, 0, "two runs of an id overlapped");
    assert_eq!(figures.run_twice, 0, "an id ran twice");
}
