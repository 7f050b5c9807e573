//! Claim mode across a fleet of real OS processes (see `babel_idem::guide::modes`).
//!
//! Three worker processes (this test binary, started again with
//! `--ignored --exact fleet_worker`) run 16 tasks each against one real
//! Redis (and, in a second test, one real PostgreSQL). 1,000 ids are each
//! delivered 5 times, in random order, through a queue in the same server;
//! a handler sleeps 0-20 ms and 10% of its runs fail (before their effect).
//! One worker is `kill -9`ed while its handlers run, and the test puts the
//! deliveries it had reserved back, as a broker's visibility timeout would.
//!
//! Counted in the server, by the handlers themselves:
//! - runs of one id in flight at once: never more than one, except that a
//!   run of the killed worker never ends (its successors count as takeovers);
//! - effects per id: exactly one, except an id whose run was killed between
//!   its effect and its commit (at most the killed worker's in-flight runs);
//! - a fenced effect (`... WHERE fence < $fence`): one record per id, and no
//!   write with a stale fence ever applied (a lapsed owner's late write is
//!   refused; a killed run's successor holds a larger fence and overwrites).
#![cfg(any(feature = "redis", feature = "postgres"))]

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use babel_idem::{ClaimStore, Guard, MessageId, OnRememberFailure, Store, StoreError};

use babel_idem::guard::fence;

const WORKERS: usize = 3;
const TASKS: usize = 16;
const IDS: usize = 1000;
const DELIVERIES_PER_ID: usize = 5;
/// Long enough that a live worker's lease never lapses on a loaded machine
/// (renewals come every third of it, so the slack is over 6 s), nor one of
/// the killed worker's before the test has marked it killed: either would
/// count as an overlap or a second effect. The killed worker's ids wait out
/// one lease before others take them. (Runs that failed with an id run
/// twice, neither run counted killed nor overlapping, had three causes, each
/// reproduced and fixed: a PostgreSQL claim that raced a slow commit took
/// its tombstone over (pinned by `a_claim_racing_a_slow_commit_never_wins`
/// in `store_postgres.rs`); a parked task cleared the unsettled mark of a
/// run of its own worker that the kill then cut (see [`Run`]); a Redis
/// commit failed on a client timeout and was acked (see the Redis board).)
const LEASE: Duration = Duration::from_secs(10);
/// The whole fleet run must end well before this, or the test fails.
const DEADLINE: Duration = Duration::from_secs(100);
const WORKER_ENV: &str = "BABEL_IDEM_FLEET_WORKER";

fn id(n: usize) -> String {
    format!("order-{n:04}")
}

/// A small xorshift generator: random enough for order and latency, and no
/// extra dependency.
struct Rng(u64);

impl Rng {
    fn new() -> Self {
        Rng(uuid::Uuid::new_v4().as_u64_pair().0 | 1)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

struct Delivery(String);

impl MessageId for Delivery {
    fn message_id(&self) -> Option<&str> {
        Some(&self.0)
    }
}

#[derive(Debug)]
enum RunError {
    Failed,
    Store(StoreError),
}

impl From<StoreError> for RunError {
    fn from(error: StoreError) -> Self {
        RunError::Store(error)
    }
}

/// What the fleet shares besides the store: the queue and the counters.
/// Each backend keeps them in its own server.
///
/// Two marks per id: `running` while a handler runs (a second live run is
/// an overlap), `unsettled` from the handler's start until the guard has
/// committed or released (what a kill can leave half done). `unsettled`
/// names the run (see [`Run`]), not only its worker.
trait Board: Send + Sync + 'static {
    /// Takes the next delivery for `worker`: `(handle, id)`.
    fn reserve(&self, worker: usize) -> impl Future<Output = Option<(String, String)>> + Send;
    fn ack(&self, worker: usize, handle: &str) -> impl Future<Output = ()> + Send;
    /// Puts a reserved delivery back at the end of the queue.
    fn requeue(&self, worker: usize, handle: &str) -> impl Future<Output = ()> + Send;
    /// A handler starts: counts an overlap when another live run of `id`
    /// is in flight, and a takeover when the killed worker left it unsettled.
    fn run_starts(&self, id: &str, run: &Run) -> impl Future<Output = ()> + Send;
    /// The handler returns.
    fn run_ends(&self, id: &str, worker: usize) -> impl Future<Output = ()> + Send;
    /// The guard has committed or released `run`, if it started.
    fn settled(&self, id: &str, run: &Run) -> impl Future<Output = ()> + Send;
    fn effect(&self, id: &str) -> impl Future<Output = ()> + Send;
    /// The fenced effect: applied only over a smaller fence.
    fn fenced_effect(&self, id: &str, fence: u64) -> impl Future<Output = ()> + Send;
    fn stopped(&self) -> impl Future<Output = bool> + Send;
}

// ---------------------------------------------------------------- worker

/// One worker process: `TASKS` tasks taking deliveries until the queue is
/// empty and the test says stop.
#[test]
#[ignore = "a fleet worker process: started by the fleet tests, not on its own"]
fn fleet_worker() {
    let Ok(spec) = std::env::var(WORKER_ENV) else {
        eprintln!("fleet_worker runs only when a fleet test starts it ({WORKER_ENV})");
        return;
    };
    let parts: Vec<&str> = spec.splitn(4, ' ').collect();
    let [backend, run, worker, url] = parts[..] else {
        panic!("{WORKER_ENV} is `<backend> <run> <worker> <url>`, got {spec:?}");
    };
    let worker: usize = worker.parse().expect("a worker number");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a Tokio runtime");
    runtime.block_on(async move {
        match backend {
            #[cfg(feature = "redis")]
            "redis" => {
                let (store, board) = redis_fleet::open(url, run).await;
                work(store, board, worker).await
            }
            #[cfg(feature = "postgres")]
            "postgres" => {
                let (store, board) = postgres_fleet::open(url, run).await;
                work(store, board, worker).await
            }
            other => panic!("no fleet backend {other:?} in this build"),
        }
    });
}

async fn work<S, B>(store: S, board: B, worker: usize)
where
    S: ClaimStore + 'static,
    B: Board,
{
    // A commit that fails is returned rather than acked and reported to
    // tracing (the default), so the worker says which id may run again.
    let guard = Guard::new(store)
        .on_remember_failure(OnRememberFailure::ReturnError)
        .lease(LEASE)
        .expect("a valid lease");
    let guard = Arc::new(guard);
    let board = Arc::new(board);
    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let (guard, board) = (guard.clone(), board.clone());
            tokio::spawn(async move {
                let mut rng = Rng::new();
                for n in 0.. {
                    let Some((handle, id)) = board.reserve(worker).await else {
                        if board.stopped().await {
                            return;
                        }
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    };
                    let fails = rng.below(10) == 0;
                    let latency = Duration::from_millis(rng.below(21));
                    let run = Run::new(worker, task, n);
                    let handler = run_once(&*board, &id, &run, fails, latency);
                    let outcome = guard.run(&Delivery(id.clone()), handler).await;
                    board.settled(&id, &run).await;
                    match outcome {
                        Ok(()) => board.ack(worker, &handle).await,
                        Err(RunError::Store(error)) if error.is_parked() => {
                            // Released without spending an attempt, after a pause.
                            tokio::time::sleep(Duration::from_millis(20)).await;
                            board.requeue(worker, &handle).await;
                        }
                        Err(RunError::Failed) => board.requeue(worker, &handle).await,
                        // A lost claim or a store error: retried. Said on the
                        // worker's stderr (the test's output), as a second
                        // effect that fails the test follows from one.
                        Err(RunError::Store(error)) => {
                            eprintln!("fleet worker {worker}: {id}: {error}");
                            board.requeue(worker, &handle).await
                        }
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("a worker task");
    }
}

/// One delivery's run of the handler on `worker`. The `unsettled` mark it
/// leaves, `mark` (`<worker>:<task>:<n>`), is its own: a task of the same
/// worker that was parked on the id, or ran it after a release, cannot
/// clear it. (With the worker alone as the mark, a parked task's `settled`
/// once cleared the mark of a run the kill then cut between effect and
/// commit, and the test blamed the store for its second effect.)
struct Run {
    worker: usize,
    mark: String,
}

impl Run {
    fn new(worker: usize, task: usize, n: u64) -> Self {
        Run {
            worker,
            mark: format!("{worker}:{task}:{n}"),
        }
    }
}

/// The worker of a [`Run`]'s mark, read back from the board.
fn worker_of(run: &str) -> &str {
    run.split(':').next().unwrap_or(run)
}

/// The handler: counts itself in flight, sleeps, fails before its effect
/// one time in ten, else writes the effect and the fenced effect.
async fn run_once<B: Board>(
    board: &B,
    id: &str,
    run: &Run,
    fails: bool,
    latency: Duration,
) -> Result<(), RunError> {
    let fence = fence().expect("a claimed handler has a fence");
    board.run_starts(id, run).await;
    tokio::time::sleep(latency).await;
    if fails {
        board.run_ends(id, run.worker).await;
        return Err(RunError::Failed);
    }
    board.effect(id).await;
    board.fenced_effect(id, fence).await;
    board.run_ends(id, run.worker).await;
    Ok(())
}

// ---------------------------------------------------------------- parent

/// What the fleet left behind, read after every id is done.
#[derive(Debug, Default)]
struct Tally {
    /// Runs that started while another live run of the id was in flight.
    overlaps: u64,
    /// Effects per id.
    effects: HashMap<String, u64>,
    /// Ids whose run on the killed worker never ended.
    killed_in_flight: HashSet<String>,
    /// Ids another worker ran after the killed worker's claim lapsed.
    taken_over: HashSet<String>,
    /// Fenced effects refused because a larger fence had been written.
    stale_fenced_writes: u64,
    /// Ids with a fenced record.
    fenced_ids: u64,
}

/// The parent's side of one backend: seed the queue, kill, read the tally.
trait Fleet {
    type Store: ClaimStore;
    fn backend(&self) -> &'static str;
    fn url(&self) -> &str;
    fn run(&self) -> &str;
    fn store(&self) -> &Self::Store;
    async fn seed(&self, deliveries: Vec<String>);
    /// Marks `worker` dead and puts its reserved deliveries back.
    async fn killed(&self, worker: usize);
    /// Runs `worker` has started and not settled yet.
    async fn in_flight_on(&self, worker: usize) -> u64;
    async fn effects_so_far(&self) -> u64;
    async fn stop(&self);
    async fn tally(&self) -> Tally;
    async fn clean_up(&self);
}

/// Starts worker process `worker`. Its stderr lines are echoed to the
/// test's and kept in `lines`, so a failed assertion can quote those that
/// name its id.
fn spawn_worker<F: Fleet>(fleet: &F, worker: usize, lines: &WorkerLines) -> Child {
    let mut child = Command::new(std::env::current_exe().expect("the test binary"))
        .args(["--ignored", "--exact", "fleet_worker", "--nocapture"])
        .env(
            WORKER_ENV,
            format!(
                "{} {} {worker} {}",
                fleet.backend(),
                fleet.run(),
                fleet.url()
            ),
        )
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start a worker process");
    let stderr = child.stderr.take().expect("a piped stderr");
    let lines = lines.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("{line}");
            lines.lock().expect("the lines' lock").push(line);
        }
    });
    child
}

/// Every worker's stderr lines, in the order they came.
type WorkerLines = Arc<Mutex<Vec<String>>>;

/// The worker lines that name `id`, or a note that there were none.
fn lines_naming(lines: &WorkerLines, id: &str) -> String {
    let lines = lines.lock().expect("the lines' lock");
    let named = format!(" {id}:");
    let naming: Vec<&str> = lines
        .iter()
        .filter(|line| line.contains(&named))
        .map(String::as_str)
        .collect();
    if naming.is_empty() {
        "no worker line names it: every run of it that ended reported a commit".to_owned()
    } else {
        format!("the workers said:\n{}", naming.join("\n"))
    }
}

async fn run_fleet<F: Fleet>(fleet: F) {
    let started = Instant::now();
    let mut rng = Rng::new();
    let mut deliveries: Vec<String> = (0..IDS)
        .flat_map(|n| std::iter::repeat_n(id(n), DELIVERIES_PER_ID))
        .collect();
    for at in (1..deliveries.len()).rev() {
        deliveries.swap(at, rng.below(at as u64 + 1) as usize);
    }
    fleet.seed(deliveries).await;

    let lines = WorkerLines::default();
    let mut workers: Vec<Child> = (0..WORKERS)
        .map(|w| spawn_worker(&fleet, w, &lines))
        .collect();

    // Kill worker 0 once the fleet is well under way and it has handlers
    // mid-run (a worker that started late could have none yet).
    while fleet.effects_so_far().await < (IDS as u64) / 4 || fleet.in_flight_on(0).await == 0 {
        assert!(started.elapsed() < DEADLINE, "the fleet made no progress");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    workers[0].kill().expect("kill -9 worker 0");
    workers[0].wait().expect("reap worker 0");
    let killed_at = Instant::now();
    fleet.killed(0).await;

    // Wait until every id is done in the store.
    let mut pending: Vec<String> = (0..IDS).map(id).collect();
    while !pending.is_empty() {
        assert!(
            started.elapsed() < DEADLINE,
            "{} ids still not done after {DEADLINE:?}: {:?}",
            pending.len(),
            &pending[..pending.len().min(5)]
        );
        let mut still = Vec::new();
        for id in pending {
            if !fleet.store().seen(&id).await.expect("seen") {
                still.push(id);
            }
        }
        pending = still;
        if !pending.is_empty() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let all_done = killed_at.elapsed();
    fleet.stop().await;
    for worker in &mut workers[1..] {
        let status = worker.wait().expect("a worker exits");
        assert!(status.success(), "a worker failed: {status}");
    }
    let tally = fleet.tally().await;
    fleet.clean_up().await;

    // One run at a time per id.
    assert_eq!(tally.overlaps, 0, "runs of one id overlapped");
    // Every effect happened, exactly once but for killed runs.
    assert_eq!(tally.effects.len(), IDS, "every id's effect happened");
    let doubled: Vec<&String> = tally
        .effects
        .iter()
        .filter(|&(_, &count)| count != 1)
        .map(|(id, _)| id)
        .collect();
    for id in &doubled {
        assert!(
            tally.killed_in_flight.contains(*id) && tally.effects[*id] == 2,
            "{id}: {} effects, and its run was not killed mid-commit; {}",
            tally.effects[*id],
            lines_naming(&lines, id)
        );
    }
    // The killed worker was mid-handler, and its ids were run by others.
    assert!(
        !tally.killed_in_flight.is_empty(),
        "worker 0 was killed with no handler in flight"
    );
    assert!(
        tally.taken_over.is_subset(&tally.killed_in_flight),
        "a takeover of an id the killed worker was not running"
    );
    // The fenced effect: one record per id, never a stale write applied.
    assert_eq!(tally.fenced_ids, IDS as u64);
    assert_eq!(
        tally.stale_fenced_writes, 0,
        "a stale owner's write came late"
    );

    println!(
        "claim fleet on {}: {WORKERS} workers x {TASKS} tasks, {IDS} ids x {DELIVERIES_PER_ID} \
         deliveries, lease {LEASE:?}: 0 overlapping runs; worker 0 killed with {} runs in flight, \
         {} of them run again by another worker after the lease lapsed; {} ids with their effect \
         twice (killed between effect and commit), every other id once; fenced records {} \
         (stale writes refused: {}); all ids done {:.1} s after the kill, {:.1} s in all",
        fleet.backend(),
        tally.killed_in_flight.len(),
        tally.taken_over.len(),
        doubled.len(),
        tally.fenced_ids,
        tally.stale_fenced_writes,
        all_done.as_secs_f64(),
        started.elapsed().as_secs_f64(),
    );
}

fn run_name() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..10].to_owned()
}

/// The server URL, or `None` after a `skipped:` line (a failure when
/// `BABEL_IDEM_REQUIRE_SERVERS=1`).
fn server_url(variable: &str, test: &str) -> Option<String> {
    match std::env::var(variable) {
        Ok(url) if !url.trim().is_empty() => Some(url),
        _ if std::env::var("BABEL_IDEM_REQUIRE_SERVERS").is_ok_and(|v| v == "1") => {
            panic!("{test}: {variable} is not set, and BABEL_IDEM_REQUIRE_SERVERS=1 requires it")
        }
        _ => {
            eprintln!("skipped: {test}: {variable} not set");
            None
        }
    }
}

// ----------------------------------------------------------------- Redis

#[cfg(feature = "redis")]
mod redis_fleet {
    use super::*;
    use babel_idem::store::RedisStore;
    use redis::aio::{ConnectionManager, ConnectionManagerConfig};
    use redis::{AsyncCommands, Script};

    /// redis-rs gives up on an answer after 500 ms by default and reconnects,
    /// failing every command in flight on the connection. A commit failed so
    /// on a loaded machine runs its id again once the claim lapses (with a
    /// 2 ms timeout, the test fails so). A longer stall would lapse live
    /// leases anyway (their slack is over 6 s).
    const RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);

    /// Every key of one run starts with this.
    fn base(run: &str) -> String {
        format!("bqfleet:{run}:")
    }

    pub(crate) struct RedisBoard {
        connection: ConnectionManager,
        base: String,
        run_starts: Script,
        settled: Script,
        fenced: Script,
    }

    impl RedisBoard {
        fn key(&self, name: &str) -> String {
            format!("{}{name}", self.base)
        }
    }

    pub(crate) async fn open(url: &str, run: &str) -> (RedisStore, RedisBoard) {
        let client = redis::Client::open(url).expect("a Redis URL");
        let config = ConnectionManagerConfig::new().set_response_timeout(Some(RESPONSE_TIMEOUT));
        let connection = ConnectionManager::new_with_config(client, config)
            .await
            .expect("connect to Redis");
        let store = RedisStore::builder()
            .prefix(format!("{}idemp:", base(run)))
            .from_connection_manager(connection.clone())
            .expect("a Redis store");
        let board = RedisBoard {
            connection,
            base: base(run),
            // A run starts: claim the id's slot in `running`, or take it
            // over from the killed worker, or count an overlap.
            // KEYS: running, killed, stats, taken_over, unsettled.
            // ARGV: id, worker, run mark (`<worker>:...`).
            run_starts: Script::new(
                "local killed = redis.call('GET', KEYS[2])
                 local holder = redis.call('HGET', KEYS[1], ARGV[1])
                 if holder and holder ~= killed then
                   redis.call('HINCRBY', KEYS[3], 'overlaps', 1)
                 end
                 redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
                 local left = redis.call('HGET', KEYS[5], ARGV[1])
                 if killed and left and string.match(left, '^[^:]*') == killed then
                   redis.call('SADD', KEYS[4], ARGV[1])
                 end
                 redis.call('HSET', KEYS[5], ARGV[1], ARGV[3])
                 return 1",
            ),
            // KEYS: unsettled. Clears only this run's mark.
            settled: Script::new(
                "if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then
                   return redis.call('HDEL', KEYS[1], ARGV[1])
                 end
                 return 0",
            ),
            // `UPDATE ... SET fence = $f WHERE fence < $f`, in Redis.
            fenced: Script::new(
                "local current = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
                 if current < tonumber(ARGV[2]) then
                   redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
                   return 1
                 end
                 redis.call('HINCRBY', KEYS[2], 'stale_fenced_writes', 1)
                 return 0",
            ),
        };
        (store, board)
    }

    impl Board for RedisBoard {
        async fn reserve(&self, worker: usize) -> Option<(String, String)> {
            let id: Option<String> = self
                .connection
                .clone()
                .lmove(
                    self.key("queue"),
                    self.key(&format!("reserved:{worker}")),
                    redis::Direction::Left,
                    redis::Direction::Right,
                )
                .await
                .expect("LMOVE");
            id.map(|id| (id.clone(), id))
        }

        async fn ack(&self, worker: usize, handle: &str) {
            let _: i64 = self
                .connection
                .clone()
                .lrem(self.key(&format!("reserved:{worker}")), 1, handle)
                .await
                .expect("LREM");
        }

        async fn requeue(&self, worker: usize, handle: &str) {
            let _: () = redis::pipe()
                .atomic()
                .lrem(self.key(&format!("reserved:{worker}")), 1, handle)
                .rpush(self.key("queue"), handle)
                .query_async(&mut self.connection.clone())
                .await
                .expect("requeue");
        }

        async fn run_starts(&self, id: &str, run: &Run) {
            let _: i64 = self
                .run_starts
                .key(self.key("running"))
                .key(self.key("killed"))
                .key(self.key("stats"))
                .key(self.key("taken_over"))
                .key(self.key("unsettled"))
                .arg(id)
                .arg(run.worker)
                .arg(&run.mark)
                .invoke_async(&mut self.connection.clone())
                .await
                .expect("run starts");
        }

        async fn settled(&self, id: &str, run: &Run) {
            let _: i64 = self
                .settled
                .key(self.key("unsettled"))
                .arg(id)
                .arg(&run.mark)
                .invoke_async(&mut self.connection.clone())
                .await
                .expect("settled");
        }

        async fn run_ends(&self, id: &str, _worker: usize) {
            let _: i64 = self
                .connection
                .clone()
                .hdel(self.key("running"), id)
                .await
                .expect("HDEL");
        }

        async fn effect(&self, id: &str) {
            let _: i64 = self
                .connection
                .clone()
                .hincr(self.key("effects"), id, 1)
                .await
                .expect("HINCRBY");
        }

        async fn fenced_effect(&self, id: &str, fence: u64) {
            let _: i64 = self
                .fenced
                .key(self.key("fenced"))
                .key(self.key("stats"))
                .arg(id)
                .arg(fence)
                .invoke_async(&mut self.connection.clone())
                .await
                .expect("fenced effect");
        }

        async fn stopped(&self) -> bool {
            self.connection
                .clone()
                .exists(self.key("stop"))
                .await
                .expect("EXISTS")
        }
    }

    pub(crate) struct RedisFleet {
        url: String,
        run: String,
        store: RedisStore,
        board: RedisBoard,
    }

    impl Fleet for RedisFleet {
        type Store = RedisStore;

        fn backend(&self) -> &'static str {
            "redis"
        }
        fn url(&self) -> &str {
            &self.url
        }
        fn run(&self) -> &str {
            &self.run
        }
        fn store(&self) -> &RedisStore {
            &self.store
        }

        async fn seed(&self, deliveries: Vec<String>) {
            let _: i64 = self
                .board
                .connection
                .clone()
                .rpush(self.board.key("queue"), deliveries)
                .await
                .expect("RPUSH");
        }

        async fn killed(&self, worker: usize) {
            let mut connection = self.board.connection.clone();
            let _: () = connection
                .set(self.board.key("killed"), worker)
                .await
                .expect("SET");
            let reserved = self.board.key(&format!("reserved:{worker}"));
            while let Some(id) = connection
                .lpop::<_, Option<String>>(&reserved, None)
                .await
                .expect("LPOP")
            {
                let _: i64 = connection
                    .rpush(self.board.key("queue"), id)
                    .await
                    .expect("RPUSH");
            }
        }

        async fn in_flight_on(&self, worker: usize) -> u64 {
            let runs: Vec<String> = self
                .board
                .connection
                .clone()
                .hvals(self.board.key("unsettled"))
                .await
                .expect("HVALS");
            let worker = worker.to_string();
            runs.iter().filter(|run| worker_of(run) == worker).count() as u64
        }

        async fn effects_so_far(&self) -> u64 {
            self.board
                .connection
                .clone()
                .hlen(self.board.key("effects"))
                .await
                .expect("HLEN")
        }

        async fn stop(&self) {
            let _: () = self
                .board
                .connection
                .clone()
                .set(self.board.key("stop"), 1)
                .await
                .expect("SET");
        }

        async fn tally(&self) -> Tally {
            let mut connection = self.board.connection.clone();
            let stats: HashMap<String, u64> = connection
                .hgetall(self.board.key("stats"))
                .await
                .expect("HGETALL");
            let unsettled: HashMap<String, String> = connection
                .hgetall(self.board.key("unsettled"))
                .await
                .expect("HGETALL");
            let taken_over: HashSet<String> = connection
                .smembers(self.board.key("taken_over"))
                .await
                .expect("SMEMBERS");
            let fenced: u64 = connection
                .hlen(self.board.key("fenced"))
                .await
                .expect("HLEN");
            // A killed run is still unsettled, or was taken over.
            let killed_in_flight = unsettled
                .into_iter()
                .filter(|(_, run)| worker_of(run) == "0")
                .map(|(id, _)| id)
                .chain(taken_over.iter().cloned())
                .collect();
            Tally {
                overlaps: stats.get("overlaps").copied().unwrap_or(0),
                effects: connection
                    .hgetall(self.board.key("effects"))
                    .await
                    .expect("HGETALL"),
                killed_in_flight,
                taken_over,
                stale_fenced_writes: stats.get("stale_fenced_writes").copied().unwrap_or(0),
                fenced_ids: fenced,
            }
        }

        async fn clean_up(&self) {
            let mut connection = self.board.connection.clone();
            // The store's keys (done markers, claims, fence) are under it too.
            let keys: Vec<String> = connection
                .keys(format!("{}*", self.board.base))
                .await
                .expect("KEYS");
            if !keys.is_empty() {
                let _: i64 = connection.del(keys).await.expect("DEL");
            }
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_fleet_on_redis_runs_each_id_once_at_a_time() {
        let test = "a_fleet_on_redis_runs_each_id_once_at_a_time";
        let Some(url) = server_url("BABEL_IDEM_REDIS_URL", test) else {
            return;
        };
        let run = run_name();
        let (store, board) = open(&url, &run).await;
        run_fleet(RedisFleet {
            url,
            run,
            store,
            board,
        })
        .await;
    }
}

// ------------------------------------------------------------ PostgreSQL

#[cfg(feature = "postgres")]
mod postgres_fleet {
    use super::*;
    use babel_idem::store::PostgresStore;
    use sqlx::PgPool;
    use sqlx::postgres::PgPoolOptions;

    fn table(run: &str) -> String {
        format!("bqfleet_{run}")
    }

    pub(crate) struct PgBoard {
        pool: PgPool,
        table: String,
    }

    pub(crate) async fn open(url: &str, run: &str) -> (PostgresStore, PgBoard) {
        let pool = PgPoolOptions::new()
            .max_connections(10)
            .connect(url)
            .await
            .expect("connect to PostgreSQL");
        let store = PostgresStore::builder()
            .table(table(run))
            .from_pool(pool.clone())
            .expect("a PostgreSQL store");
        let board = PgBoard {
            pool,
            table: table(run),
        };
        (store, board)
    }

    impl PgBoard {
        async fn exec(&self, sql: &str) {
            sqlx::raw_sql(sql)
                .execute(&self.pool)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
        }
    }

    impl Board for PgBoard {
        async fn reserve(&self, worker: usize) -> Option<(String, String)> {
            let t = &self.table;
            let row: Option<(i64, String)> = sqlx::query_as(&format!(
                "UPDATE {t}_queue SET taken_by = $1 WHERE seq = (
                     SELECT seq FROM {t}_queue WHERE taken_by IS NULL
                     ORDER BY seq LIMIT 1 FOR UPDATE SKIP LOCKED)
                 RETURNING seq, message_id"
            ))
            .bind(worker as i32)
            .fetch_optional(&self.pool)
            .await
            .expect("reserve");
            row.map(|(seq, id)| (seq.to_string(), id))
        }

        async fn ack(&self, _worker: usize, handle: &str) {
            let t = &self.table;
            self.exec(&format!("DELETE FROM {t}_queue WHERE seq = {handle}"))
                .await;
        }

        async fn requeue(&self, _worker: usize, handle: &str) {
            let t = &self.table;
            self.exec(&format!(
                "UPDATE {t}_queue SET taken_by = NULL, seq = nextval('{t}_queue_seq_seq')
                 WHERE seq = {handle}"
            ))
            .await;
        }

        async fn run_starts(&self, id: &str, run: &Run) {
            let t = &self.table;
            // An in-flight counter, raised and read in one atomic upsert.
            let in_flight: i32 = sqlx::query_scalar(&format!(
                "INSERT INTO {t}_runs AS r (message_id, holder, unsettled, in_flight)
                     VALUES ($1, $2, $3, 1)
                 ON CONFLICT (message_id) DO UPDATE
                     SET in_flight = r.in_flight + 1, holder = EXCLUDED.holder,
                         unsettled = EXCLUDED.unsettled,
                         taken_over = r.taken_over OR coalesce(
                             split_part(r.unsettled, ':', 1)
                                 = (SELECT killed::text FROM {t}_stats), false)
                 RETURNING in_flight"
            ))
            .bind(id)
            .bind(run.worker as i32)
            .bind(&run.mark)
            .fetch_one(&self.pool)
            .await
            .expect("run starts");
            let overlap = in_flight > 1;
            if overlap {
                self.exec(&format!(
                    "UPDATE {t}_stats SET overlapping = overlapping + 1"
                ))
                .await;
            }
        }

        async fn settled(&self, id: &str, run: &Run) {
            let t = &self.table;
            sqlx::query(&format!(
                "UPDATE {t}_runs SET unsettled = NULL WHERE message_id = $1 AND unsettled = $2"
            ))
            .bind(id)
            .bind(&run.mark)
            .execute(&self.pool)
            .await
            .expect("settled");
        }

        async fn run_ends(&self, id: &str, _worker: usize) {
            let t = &self.table;
            sqlx::query(&format!(
                "UPDATE {t}_runs SET in_flight = in_flight - 1 WHERE message_id = $1"
            ))
            .bind(id)
            .execute(&self.pool)
            .await
            .expect("run ends");
        }

        async fn effect(&self, id: &str) {
            let t = &self.table;
            sqlx::query(&format!(
                "UPDATE {t}_runs SET effects = effects + 1 WHERE message_id = $1"
            ))
            .bind(id)
            .execute(&self.pool)
            .await
            .expect("effect");
        }

        async fn fenced_effect(&self, id: &str, fence: u64) {
            let t = &self.table;
            let applied = sqlx::query(&format!(
                "UPDATE {t}_runs SET fence = $2 WHERE message_id = $1 AND fence < $2"
            ))
            .bind(id)
            .bind(fence as i64)
            .execute(&self.pool)
            .await
            .expect("fenced effect");
            if applied.rows_affected() == 0 {
                self.exec(&format!(
                    "UPDATE {t}_stats SET stale_fenced_writes = stale_fenced_writes + 1"
                ))
                .await;
            }
        }

        async fn stopped(&self) -> bool {
            let t = &self.table;
            sqlx::query_scalar(&format!("SELECT stop FROM {t}_stats"))
                .fetch_one(&self.pool)
                .await
                .expect("stop flag")
        }
    }

    pub(crate) struct PgFleet {
        url: String,
        run: String,
        store: PostgresStore,
        board: PgBoard,
    }

    impl Fleet for PgFleet {
        type Store = PostgresStore;

        fn backend(&self) -> &'static str {
            "postgres"
        }
        fn url(&self) -> &str {
            &self.url
        }
        fn run(&self) -> &str {
            &self.run
        }
        fn store(&self) -> &PostgresStore {
            &self.store
        }

        async fn seed(&self, deliveries: Vec<String>) {
            self.store
                .migrate()
                .await
                .expect("create the store's table");
            self.store
                .migrate_claims()
                .await
                .expect("create claim mode's tables");
            let t = &self.board.table;
            self.board
                .exec(&format!(
                    "CREATE TABLE {t}_queue (seq BIGSERIAL PRIMARY KEY, message_id TEXT NOT NULL,
                                             taken_by INT NULL);
                     CREATE TABLE {t}_runs (message_id TEXT PRIMARY KEY, holder INT NULL,
                                            unsettled TEXT NULL, in_flight INT NOT NULL,
                                            taken_over BOOL NOT NULL DEFAULT false,
                                            effects INT NOT NULL DEFAULT 0,
                                            fence BIGINT NOT NULL DEFAULT 0);
                     CREATE TABLE {t}_stats (overlapping INT NOT NULL, stale_fenced_writes INT NOT NULL,
                                             killed INT NULL, stop BOOL NOT NULL);
                     INSERT INTO {t}_stats VALUES (0, 0, NULL, false);"
                ))
                .await;
            sqlx::query(&format!(
                "INSERT INTO {t}_queue (message_id) SELECT * FROM unnest($1::text[])"
            ))
            .bind(deliveries)
            .execute(&self.board.pool)
            .await
            .expect("seed the queue");
        }

        async fn killed(&self, worker: usize) {
            let t = &self.board.table;
            self.board
                .exec(&format!(
                    "UPDATE {t}_stats SET killed = {worker};
                     UPDATE {t}_queue SET taken_by = NULL WHERE taken_by = {worker};
                     -- The dead worker's runs never end: take them off the counter.
                     UPDATE {t}_runs SET in_flight = in_flight - 1
                         WHERE holder = {worker} AND in_flight > 0;"
                ))
                .await;
        }

        async fn in_flight_on(&self, worker: usize) -> u64 {
            let t = &self.board.table;
            let count: i64 = sqlx::query_scalar(&format!(
                "SELECT count(*) FROM {t}_runs WHERE split_part(unsettled, ':', 1) = $1"
            ))
            .bind(worker.to_string())
            .fetch_one(&self.board.pool)
            .await
            .expect("count unsettled runs");
            count as u64
        }

        async fn effects_so_far(&self) -> u64 {
            let t = &self.board.table;
            let count: i64 =
                sqlx::query_scalar(&format!("SELECT count(*) FROM {t}_runs WHERE effects > 0"))
                    .fetch_one(&self.board.pool)
                    .await
                    .expect("count effects");
            count as u64
        }

        async fn stop(&self) {
            let t = &self.board.table;
            self.board
                .exec(&format!("UPDATE {t}_stats SET stop = true"))
                .await;
        }

        async fn tally(&self) -> Tally {
            let t = &self.board.table;
            let (overlaps, stale): (i32, i32) = sqlx::query_as(&format!(
                "SELECT overlapping, stale_fenced_writes FROM {t}_stats"
            ))
            .fetch_one(&self.board.pool)
            .await
            .expect("stats");
            let runs: Vec<(String, Option<String>, bool, i32, i64)> = sqlx::query_as(&format!(
                "SELECT message_id, unsettled, taken_over, effects, fence FROM {t}_runs"
            ))
            .fetch_all(&self.board.pool)
            .await
            .expect("runs");
            let mut tally = Tally {
                overlaps: overlaps as u64,
                stale_fenced_writes: stale as u64,
                ..Tally::default()
            };
            for (id, unsettled, taken_over, effects, fence) in runs {
                if effects > 0 {
                    tally.effects.insert(id.clone(), effects as u64);
                }
                if fence > 0 {
                    tally.fenced_ids += 1;
                }
                if taken_over {
                    tally.taken_over.insert(id.clone());
                }
                if taken_over || unsettled.as_deref().map(worker_of) == Some("0") {
                    tally.killed_in_flight.insert(id);
                }
            }
            tally
        }

        async fn clean_up(&self) {
            let t = &self.board.table;
            self.board
                .exec(&format!(
                    "DROP TABLE IF EXISTS {t}, {t}_claims, {t}_queue, {t}_runs, {t}_stats;
                     DROP SEQUENCE IF EXISTS {t}_claims_fence;"
                ))
                .await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_fleet_on_postgres_runs_each_id_once_at_a_time() {
        let test = "a_fleet_on_postgres_runs_each_id_once_at_a_time";
        let Some(url) = server_url("BABEL_IDEM_POSTGRES_URL", test) else {
            return;
        };
        let run = run_name();
        let (store, board) = open(&url, &run).await;
        run_fleet(PgFleet {
            url,
            run,
            store,
            board,
        })
        .await;
    }
}
