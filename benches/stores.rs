//! Deliveries per second through the guarded handler on each persistent
//! store, against the raw commands the guard issues, sent directly through
//! the same client and connection setup:
//!
//! | backend | first delivery (raw) | duplicate (raw) |
//! |---|---|---|
//! | SQLite | the store's `SELECT EXISTS`, then its `INSERT ... ON CONFLICT` | the `SELECT EXISTS` |
//! | Redis | `EXISTS`, then `SET key 1 NX` | `EXISTS` |
//! | PostgreSQL | the store's `SELECT EXISTS`, then its `INSERT ... ON CONFLICT` | the `SELECT EXISTS` |
//!
//! at 1, 16 and 64 concurrent deliveries, with the ratio guarded / raw, and
//! the round trips per delivery: the store calls the guard made (counted by
//! a wrapping store) and, as a cross-check, what the server counted (Redis
//! `INFO commandstats`; PostgreSQL committed transactions, one per
//! autocommit statement). The server counts are server-wide: run the bench
//! alone on its servers for them to be exact.
//!
//! Then claim mode against seen-set mode on the same store (both through
//! `Guard`, same paths and concurrency), with the ratio claim / seen-set
//! and the claim side's round trips per delivery: store calls, and the
//! server's count (Redis `INFO commandstats`: `evalsha` + `eval`; PostgreSQL:
//! statements and round trips through a counting proxy). For Redis, the
//! last column is the server's own microseconds per delivery from the same
//! stats, claim side / seen-set side (`evalsha` + `eval` / `exists` + `set`):
//! the server-side cost without the client or the wire. Like the counts, it
//! is server-wide: run the bench alone on its Redis for it to be exact.
//! On each server-backed store the comparison runs twice: as is, and with
//! both modes' concurrent calls coalesced by `store::Batched` (rows
//! `redis+b`, `postgres+b`, `sqlite+b`: claims through `claim_many` /
//! `commit_many`, one script per batch on Redis, one statement on
//! PostgreSQL, one read and one write transaction on SQLite; the seen-set
//! through `seen_many` / `remember_many`).
//!
//! Last, batches: `Guard::run_batch` over batches of 64 against one `guard`
//! call per message, at concurrency 1, with the ratio and the round trips
//! per batch (store calls; Redis `INFO commandstats`: `mget` + `exec`, the
//! batch's `MGET` and its `MULTI`/`EXEC` pipeline; PostgreSQL: statements
//! and round trips through the counting proxy).
//!
//! Run: `BABEL_IDEM_REDIS_URL=redis://127.0.0.1:6379/
//! BABEL_IDEM_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/postgres
//! cargo bench --features redis,postgres --bench stores`. A backend whose
//! URL is not set (or whose feature is off) is skipped with a line saying
//! so. `BABEL_IDEM_BENCH_SECS` sets the seconds per point (default 2);
//! `BABEL_IDEM_BENCH_STORES` (`sqlite,redis,postgres` by default) picks the
//! backends, e.g. to run one under `valgrind --tool=callgrind`.
//! Without `--bench` (as under `cargo test --benches`) every point runs for
//! a few milliseconds, to check the bench still works.
//!
//! For a profiler, `BABEL_IDEM_STORES_PROFILE=claim-first` (or
//! `claim-duplicate`, `seen-set-first`, `seen-set-duplicate`) skips all of
//! the above and runs only that mode and path on Redis, [`PROFILED`]
//! deliveries one at a time in `profiled_deliveries`, on one thread with the
//! connection's own task, e.g.
//! `valgrind --tool=callgrind --toggle-collect=*profiled_deliveries* <bench binary> --bench`:
//! the client's instructions per delivery are that function's inclusive
//! count / [`PROFILED`].

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use babel_idem::store::SqliteStore;
use babel_idem::store::{Batched, Claim, ClaimToken, StoreFuture};
use babel_idem::{ClaimStore, Guard, MessageId, Store, StoreError, run_once};

const CONCURRENCY: [usize; 3] = [1, 16, 64];
/// Ids remembered before the duplicate-path runs, delivered round robin.
const DUPLICATE_IDS: usize = 1024;

fn main() {
    if let Ok(profile) = std::env::var("BABEL_IDEM_STORES_PROFILE") {
        redis_profile(&profile);
        return;
    }
    let full_run = std::env::args().any(|arg| arg == "--bench");
    let seconds: f64 = std::env::var("BABEL_IDEM_BENCH_SECS")
        .ok()
        .and_then(|secs| secs.parse().ok())
        .unwrap_or(2.0);
    let point = if full_run {
        Duration::from_secs_f64(seconds)
    } else {
        Duration::from_millis(20)
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a Tokio runtime");
    let stores = std::env::var("BABEL_IDEM_BENCH_STORES")
        .unwrap_or_else(|_| "sqlite,redis,postgres".to_owned());
    let chosen = |backend: &str| stores.split(',').any(|name| name.trim() == backend);
    runtime.block_on(async {
        print_header(point);
        if chosen("sqlite") {
            sqlite::bench(point).await;
        }
        if chosen("redis") {
            redis_bench(point).await;
        }
        if chosen("postgres") {
            postgres_bench(point).await;
        }
    });
}

// ------------------------------------------------------------------ harness

/// A message that is only its id: the bench measures the store, not decoding.
struct Delivery(String);

impl MessageId for Delivery {
    fn message_id(&self) -> Option<&str> {
        Some(&self.0)
    }
}

/// Counts the store calls the guard makes, each one command or statement.
struct Counted<S> {
    inner: S,
    calls: AtomicU64,
}

impl<S: Store> Counted<S> {
    fn new(inner: S) -> Self {
        Counted {
            inner,
            calls: AtomicU64::new(0),
        }
    }

    fn take_calls(&self) -> u64 {
        self.calls.swap(0, Ordering::Relaxed)
    }
}

impl<S: Store> Store for Counted<S> {
    fn seen<'a>(&'a self, id: &'a str) -> StoreFuture<'a, bool> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.seen(id)
    }
    fn remember<'a>(&'a self, id: &'a str) -> StoreFuture<'a, ()> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.remember(id)
    }
    fn forget<'a>(&'a self, id: &'a str) -> StoreFuture<'a, ()> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.forget(id)
    }
    fn seen_many<'a>(&'a self, ids: &'a [&'a str]) -> StoreFuture<'a, Vec<bool>> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.seen_many(ids)
    }
    fn remember_many<'a>(&'a self, ids: &'a [&'a str]) -> StoreFuture<'a, ()> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.remember_many(ids)
    }
}

impl<S: ClaimStore> ClaimStore for Counted<S> {
    fn claim<'a>(
        &'a self,
        id: &'a str,
        owner: ClaimToken,
        lease: Duration,
    ) -> StoreFuture<'a, Claim> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.claim(id, owner, lease)
    }
    fn commit<'a>(&'a self, id: &'a str, owner: ClaimToken) -> StoreFuture<'a, bool> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.commit(id, owner)
    }
    fn release<'a>(&'a self, id: &'a str, owner: ClaimToken) -> StoreFuture<'a, bool> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.release(id, owner)
    }
    fn renew<'a>(
        &'a self,
        id: &'a str,
        owner: ClaimToken,
        lease: Duration,
    ) -> StoreFuture<'a, bool> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.renew(id, owner, lease)
    }
    fn claim_many<'a>(
        &'a self,
        claims: &'a [(&'a str, ClaimToken)],
        lease: Duration,
    ) -> StoreFuture<'a, Vec<Claim>> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.claim_many(claims, lease)
    }
    fn commit_many<'a>(
        &'a self,
        commits: &'a [(&'a str, ClaimToken)],
    ) -> StoreFuture<'a, Vec<bool>> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.commit_many(commits)
    }
}

/// The raw commands of one backend, issued without the guard.
trait RawCommands: Send + Sync + 'static {
    fn seen(&self, id: String) -> impl Future<Output = bool> + Send;
    fn remember(&self, id: String) -> impl Future<Output = ()> + Send;
}

/// Which delivery the workers repeat.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Path {
    /// A fresh id each time: `seen` (false), the handler, `remember`.
    First,
    /// An id remembered beforehand: `seen` (true), skipped.
    Duplicate,
}

impl Path {
    fn name(self) -> &'static str {
        match self {
            Path::First => "first delivery",
            Path::Duplicate => "duplicate",
        }
    }

    fn id(self, run: &str, worker: usize, n: u64) -> String {
        match self {
            Path::First => format!("first-{run}-{worker}-{n}"),
            Path::Duplicate => format!("dup-{run}-{}", n as usize % DUPLICATE_IDS),
        }
    }
}

/// Runs `deliver(worker, n)` on `concurrency` tasks for `duration`; returns
/// the deliveries per second and how many there were.
async fn measure<F, Fut>(concurrency: usize, duration: Duration, deliver: F) -> (f64, u64)
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send,
{
    let deliver = Arc::new(deliver);
    let total = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let deadline = started + duration;
    let workers: Vec<_> = (0..concurrency)
        .map(|worker| {
            let deliver = Arc::clone(&deliver);
            let total = Arc::clone(&total);
            tokio::spawn(async move {
                let mut n = 0;
                while Instant::now() < deadline {
                    deliver(worker, n).await;
                    n += 1;
                }
                total.fetch_add(n, Ordering::Relaxed);
            })
        })
        .collect();
    for worker in workers {
        worker.await.expect("a bench worker");
    }
    let deliveries = total.load(Ordering::Relaxed);
    (
        deliveries as f64 / started.elapsed().as_secs_f64(),
        deliveries,
    )
}

/// A server-side count of commands, read before and after a run.
trait ServerCounter: Send + Sync {
    fn read(&self) -> impl Future<Output = Option<u64>> + Send;

    /// The microseconds the server says it spent in those commands, where
    /// it says: the server's own cost, apart from the client and the wire.
    fn read_usec(&self) -> impl Future<Output = Option<u64>> + Send {
        async { None }
    }
}

/// No server: the store calls are the only count.
struct NoServer;

impl ServerCounter for NoServer {
    async fn read(&self) -> Option<u64> {
        None
    }
}

/// Rounds per point: guarded and raw alternate, so a machine that slows
/// down for a moment (other builds, the other backend's server) hurts both
/// sides of a ratio alike. The medians are reported.
const ROUNDS: usize = 5;

/// Every point of one backend: both paths, every concurrency, guarded and raw.
async fn bench_backend<S, R, C>(
    backend: &str,
    store: Arc<Counted<S>>,
    raw: Arc<R>,
    server: &C,
    point: Duration,
) where
    S: Store + 'static,
    R: RawCommands,
    C: ServerCounter,
{
    let run = unique_suffix();
    for n in 0..DUPLICATE_IDS {
        raw.remember(Path::Duplicate.id(&run, 0, n as u64)).await;
    }
    let slice = point / (2 * ROUNDS as u32);
    for path in [Path::First, Path::Duplicate] {
        for concurrency in CONCURRENCY {
            let mut guarded_rates = Vec::with_capacity(ROUNDS);
            let mut raw_rates = Vec::with_capacity(ROUNDS);
            let mut ratios = Vec::with_capacity(ROUNDS);
            let (mut calls, mut server_calls, mut deliveries) = (0, 0, 0);
            for round in 0..ROUNDS {
                // The duplicate path reads the ids remembered above; the
                // first-delivery path needs ids no round has used.
                let ids = |side: &str| match path {
                    Path::First => format!("{run}{side}{concurrency}x{round}"),
                    Path::Duplicate => run.clone(),
                };
                let before = server.read().await;
                let (guarded, done) = measure(concurrency, slice, {
                    let store = Arc::clone(&store);
                    let ids = ids("g");
                    move |worker, n| {
                        let store = Arc::clone(&store);
                        let message = Delivery(path.id(&ids, worker, n));
                        async move {
                            run_once(&*store, &message, async { Ok::<(), StoreError>(()) })
                                .await
                                .expect("a guarded delivery");
                        }
                    }
                })
                .await;
                let after = server.read().await;
                calls += store.take_calls();
                server_calls += since(before, after);
                deliveries += done;

                let (direct, _) = measure(concurrency, slice, {
                    let raw = Arc::clone(&raw);
                    let ids = ids("r");
                    move |worker, n| {
                        let raw = Arc::clone(&raw);
                        let id = path.id(&ids, worker, n);
                        async move {
                            if !raw.seen(id.clone()).await && path == Path::First {
                                raw.remember(id).await;
                            }
                        }
                    }
                })
                .await;
                guarded_rates.push(guarded);
                raw_rates.push(direct);
                ratios.push(guarded / direct);
            }
            let counted = server.read().await.is_some();
            println!(
                "{backend:<10} {:<15} {concurrency:>5} {:>12.0} {:>12.0} {:>7.3} {:>14.2} {:>15}",
                path.name(),
                median(&mut guarded_rates),
                median(&mut raw_rates),
                median(&mut ratios),
                calls as f64 / deliveries as f64,
                server_column(counted, server_calls, deliveries),
            );
        }
    }
}

/// A lease no bench delivery outlives: renewal never fires.
const BENCH_LEASE: Duration = Duration::from_secs(30);

/// Claim mode against seen-set mode, both through `Guard` on `guarded` (the
/// counted `store`, or a wrapper of it such as `Batched`): every path and
/// concurrency, rounds alternating as in [`bench_backend`]. `server` counts
/// the claim side's commands; where the server also says how long it spent
/// in them, the last column compares that per delivery with what
/// `seen_set_server` counts for the seen-set side.
async fn bench_claim_mode<S, G, C, D>(
    backend: &str,
    store: Arc<Counted<S>>,
    guarded: G,
    server: &C,
    seen_set_server: &D,
    point: Duration,
) where
    S: ClaimStore + 'static,
    G: ClaimStore + Clone + Send + Sync + 'static,
    C: ServerCounter,
    D: ServerCounter,
{
    let run = unique_suffix();
    for n in 0..DUPLICATE_IDS {
        store
            .remember(&Path::Duplicate.id(&run, 0, n as u64))
            .await
            .expect("remember a duplicate id");
    }
    store.take_calls();
    let slice = point / (2 * ROUNDS as u32);
    for path in [Path::First, Path::Duplicate] {
        for concurrency in CONCURRENCY {
            let (mut claimed_rates, mut seen_set_rates, mut ratios) = (vec![], vec![], vec![]);
            let (mut calls, mut server_calls, mut deliveries) = (0, 0, 0);
            let (mut claim_usec, mut seen_set_usec, mut seen_set_deliveries) = (0, 0, 0);
            for round in 0..ROUNDS {
                let ids = |side: &str| match path {
                    Path::First => format!("{run}{side}{concurrency}x{round}"),
                    Path::Duplicate => run.clone(),
                };
                let before = server.read().await;
                let usec_before = server.read_usec().await;
                let (claimed, done) = measure(concurrency, slice, {
                    let guard = Arc::new(Guard::new(guarded.clone()).lease(BENCH_LEASE).unwrap());
                    let ids = ids("c");
                    move |worker, n| {
                        let guard = Arc::clone(&guard);
                        let message = Delivery(path.id(&ids, worker, n));
                        async move {
                            guard
                                .run(&message, async { Ok::<(), StoreError>(()) })
                                .await
                                .expect("a claimed delivery");
                        }
                    }
                })
                .await;
                let after = server.read().await;
                claim_usec += since(usec_before, server.read_usec().await);
                calls += store.take_calls();
                server_calls += since(before, after);
                deliveries += done;

                let usec_before = seen_set_server.read_usec().await;
                let (seen_set, seen_set_done) = measure(concurrency, slice, {
                    let guard = Arc::new(Guard::new(guarded.clone()));
                    let ids = ids("s");
                    move |worker, n| {
                        let guard = Arc::clone(&guard);
                        let message = Delivery(path.id(&ids, worker, n));
                        async move {
                            guard
                                .run(&message, async { Ok::<(), StoreError>(()) })
                                .await
                                .expect("a seen-set delivery");
                        }
                    }
                })
                .await;
                seen_set_usec += since(usec_before, seen_set_server.read_usec().await);
                seen_set_deliveries += seen_set_done;
                store.take_calls();
                claimed_rates.push(claimed);
                seen_set_rates.push(seen_set);
                ratios.push(claimed / seen_set);
            }
            let counted = server.read().await.is_some();
            let usec = match server.read_usec().await.is_some() {
                true => format!(
                    "{:.2} / {:.2}",
                    claim_usec as f64 / deliveries as f64,
                    seen_set_usec as f64 / seen_set_deliveries as f64
                ),
                false => "-".to_owned(),
            };
            println!(
                "{backend:<10} {:<15} {concurrency:>5} {:>12.0} {:>12.0} {:>7.3} {:>14.2} {:>15} {usec:>22}",
                path.name(),
                median(&mut claimed_rates),
                median(&mut seen_set_rates),
                median(&mut ratios),
                calls as f64 / deliveries as f64,
                server_column(counted, server_calls, deliveries),
            );
        }
    }
}

/// [`bench_claim_mode`] on a server that counts nothing: on the counted
/// store itself, then with both modes' concurrent calls coalesced by
/// `store::Batched` (rows `<backend>+b`).
async fn bench_claim_mode_uncounted<S>(backend: &str, store: Arc<Counted<S>>, point: Duration)
where
    S: ClaimStore + 'static,
{
    print_claim_header(backend);
    bench_claim_mode(
        backend,
        Arc::clone(&store),
        Arc::clone(&store),
        &NoServer,
        &NoServer,
        point,
    )
    .await;
    let batched = format!("{backend}+b");
    print_claim_header(&format!("{batched} (both modes in store::Batched)"));
    bench_claim_mode(
        &batched,
        Arc::clone(&store),
        Batched::new(store),
        &NoServer,
        &NoServer,
        point,
    )
    .await;
}

/// Messages per batch in the batch comparison.
const BATCH: usize = 64;

/// `Guard::run_batch` over batches of [`BATCH`] against one `guard` call
/// per message, at concurrency 1, on both paths: messages per second, the
/// ratio batch / one at a time, and the batch side's round trips per batch
/// (store calls; `server` counts what the server saw).
async fn bench_batches<S, C>(backend: &str, store: Arc<Counted<S>>, server: &C, point: Duration)
where
    S: Store + 'static,
    C: ServerCounter,
{
    println!(
        "{backend:<10} batches of {BATCH} vs one at a time, concurrency 1 ({ROUNDS} alternating rounds; medians)\n\
         {:<10} {:<15} {:>12} {:>12} {:>7} {:>14} {:>15}",
        "backend", "path", "batch msg/s", "single msg/s", "ratio", "calls/batch", "server/batch"
    );
    let run = unique_suffix();
    let duplicates: Vec<String> = (0..DUPLICATE_IDS as u64)
        .map(|n| Path::Duplicate.id(&run, 0, n))
        .collect();
    let duplicates: Vec<&str> = duplicates.iter().map(String::as_str).collect();
    store
        .inner
        .remember_many(&duplicates)
        .await
        .expect("remember the duplicates");
    let slice = point / (2 * ROUNDS as u32);
    for path in [Path::First, Path::Duplicate] {
        let (mut batch_rates, mut single_rates, mut ratios) = (vec![], vec![], vec![]);
        let (mut calls, mut server_calls, mut batches) = (0, 0, 0);
        for round in 0..ROUNDS {
            let ids = |side: &str| match path {
                Path::First => format!("{run}b{side}{round}"),
                Path::Duplicate => run.clone(),
            };
            store.take_calls();
            let before = server.read().await;
            let (rate, done) = measure(1, slice, {
                let store = Arc::clone(&store);
                let ids = ids("b");
                move |worker, n| {
                    let store = Arc::clone(&store);
                    let messages: Vec<Delivery> = (0..BATCH as u64)
                        .map(|at| Delivery(path.id(&ids, worker, n * BATCH as u64 + at)))
                        .collect();
                    async move {
                        let guard = Guard::new(&*store);
                        for outcome in guard
                            .run_batch(&messages, |_| async { Ok::<(), StoreError>(()) })
                            .await
                        {
                            outcome.into_result().expect("a batched delivery");
                        }
                    }
                }
            })
            .await;
            let after = server.read().await;
            calls += store.take_calls();
            server_calls += since(before, after);
            batches += done;

            let (single, _) = measure(1, slice, {
                let store = Arc::clone(&store);
                let ids = ids("s");
                move |worker, n| {
                    let store = Arc::clone(&store);
                    let message = Delivery(path.id(&ids, worker, n));
                    async move {
                        run_once(&*store, &message, async { Ok::<(), StoreError>(()) })
                            .await
                            .expect("a guarded delivery");
                    }
                }
            })
            .await;
            store.take_calls();
            let batch_rate = rate * BATCH as f64;
            batch_rates.push(batch_rate);
            single_rates.push(single);
            ratios.push(batch_rate / single);
        }
        let counted = server.read().await.is_some();
        println!(
            "{backend:<10} {:<15} {:>12.0} {:>12.0} {:>7.1} {:>14.2} {:>15}",
            path.name(),
            median(&mut batch_rates),
            median(&mut single_rates),
            median(&mut ratios),
            calls as f64 / batches as f64,
            server_column(counted, server_calls, batches),
        );
    }
}

fn print_claim_header(backend: &str) {
    println!(
        "{backend:<10} claim mode vs seen-set mode ({ROUNDS} alternating rounds; medians)\n\
         {:<10} {:<15} {:>5} {:>12} {:>12} {:>7} {:>14} {:>15} {:>22}",
        "backend",
        "path",
        "conc",
        "claim/s",
        "seen-set/s",
        "ratio",
        "calls/delivery",
        "server/delivery",
        "server us claim / seen"
    );
}

/// A server counter's growth between two reads, or 0 where it keeps none.
fn since(before: Option<u64>, after: Option<u64>) -> u64 {
    after
        .zip(before)
        .map_or(0, |(after, before)| after - before)
}

/// The `server/...` column: the server's own count of calls per delivery or
/// batch, or `-` for a backend the bench cannot count on the server.
fn server_column(counted: bool, server_calls: u64, per: u64) -> String {
    match counted {
        true => format!("{:.2}", server_calls as f64 / per as f64),
        false => "-".to_owned(),
    }
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn print_header(point: Duration) {
    println!(
        "stores: {:.2} s per point ({ROUNDS} alternating rounds of guarded and raw; medians)",
        point.as_secs_f64()
    );
    println!(
        "{:<10} {:<15} {:>5} {:>12} {:>12} {:>7} {:>14} {:>15}",
        "backend",
        "path",
        "conc",
        "guarded/s",
        "raw/s",
        "ratio",
        "calls/delivery",
        "server/delivery"
    );
}

fn unique_suffix() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..8].to_owned()
}

fn skipped(backend: &str, reason: &str) {
    println!("{backend:<10} skipped: {reason}");
}

// ------------------------------------------------------------------- SQLite

mod sqlite {
    use super::*;

    /// The store's own statements, on the store's own pool.
    struct Raw {
        pool: sqlx::SqlitePool,
        seen: String,
        remember: String,
    }

    impl RawCommands for Raw {
        async fn seen(&self, id: String) -> bool {
            sqlx::query_scalar(&self.seen)
                .bind(id)
                .fetch_one(&self.pool)
                .await
                .expect("raw SELECT")
        }

        async fn remember(&self, id: String) {
            sqlx::query(&self.remember)
                .bind(id)
                .bind(None::<i64>)
                .execute(&self.pool)
                .await
                .expect("raw INSERT");
        }
    }

    pub(super) async fn bench(point: Duration) {
        let dir = std::env::temp_dir().join(format!("babel-idem-bench-{}", unique_suffix()));
        std::fs::create_dir_all(&dir).expect("a scratch directory");
        let store = SqliteStore::open(dir.join("seen.db"))
            .await
            .expect("open SQLite");
        store
            .migrate_claims()
            .await
            .expect("create claim mode's tables");
        let raw = Raw {
            pool: store.pool().clone(),
            seen: store.seen_statement().to_owned(),
            remember: store.remember_statement().to_owned(),
        };
        let store = Arc::new(Counted::new(store));
        bench_backend(
            "sqlite",
            Arc::clone(&store),
            Arc::new(raw),
            &NoServer,
            point,
        )
        .await;
        bench_claim_mode_uncounted("sqlite", Arc::clone(&store), point).await;
        bench_batches("sqlite", store, &NoServer, point).await;
        let _ = std::fs::remove_dir_all(&dir);
    }
}

// -------------------------------------------------------------------- Redis

#[cfg(not(feature = "redis"))]
async fn redis_bench(_point: Duration) {
    skipped("redis", "the `redis` feature is off");
}

#[cfg(feature = "redis")]
async fn redis_bench(point: Duration) {
    redis_backend::bench(point).await
}

#[cfg(not(feature = "redis"))]
fn redis_profile(_profile: &str) {
    skipped("redis", "the `redis` feature is off");
}

#[cfg(feature = "redis")]
fn redis_profile(profile: &str) {
    redis_backend::profile(profile)
}

/// Deliveries in one profiled run.
#[cfg(feature = "redis")]
const PROFILED: u64 = 20_000;

/// [`PROFILED`] deliveries in claim or seen-set mode, one at a time, all
/// polled on this thread (`runtime` is a current-thread runtime).
#[cfg(feature = "redis")]
#[inline(never)]
fn profiled_deliveries<S: ClaimStore>(
    runtime: &tokio::runtime::Runtime,
    store: &S,
    claim: bool,
    path: Path,
    run: &str,
) {
    let claimed = Guard::new(store).lease(BENCH_LEASE).expect("a lease");
    let seen_set = Guard::new(store);
    runtime.block_on(async {
        for n in 0..PROFILED {
            let message = Delivery(path.id(run, 0, n));
            let handler = async { Ok::<(), StoreError>(()) };
            let delivered = match claim {
                true => claimed.run(&message, handler).await,
                false => seen_set.run(&message, handler).await,
            };
            delivered.expect("a profiled delivery");
        }
    });
}

#[cfg(feature = "redis")]
mod redis_backend {
    use super::*;
    use babel_idem::store::RedisStore;
    use redis::aio::{ConnectionManager, ConnectionManagerConfig};

    /// `EXISTS` and `SET NX` on the connection manager the store uses.
    struct Raw {
        connection: ConnectionManager,
        prefix: String,
    }

    impl RawCommands for Raw {
        async fn seen(&self, id: String) -> bool {
            let mut connection = self.connection.clone();
            let count: i64 = redis::cmd("EXISTS")
                .arg(format!("{}{id}", self.prefix))
                .query_async(&mut connection)
                .await
                .expect("raw EXISTS");
            count > 0
        }

        async fn remember(&self, id: String) {
            let mut connection = self.connection.clone();
            let _: redis::Value = redis::cmd("SET")
                .arg(format!("{}{id}", self.prefix))
                .arg(1)
                .arg("NX")
                .query_async(&mut connection)
                .await
                .expect("raw SET NX");
        }
    }

    /// Calls of some commands from `INFO commandstats`, and the server's
    /// microseconds in them: `exists` + `set` for seen-set mode, `evalsha` +
    /// `eval` for claim mode (the commands a script runs count too, so they
    /// would not count round trips, and their time is inside the script's).
    struct CommandStats(ConnectionManager, &'static [&'static str]);

    impl CommandStats {
        /// The sum of one `INFO commandstats` field over the commands.
        async fn sum(&self, field: &str) -> Option<u64> {
            let mut connection = self.0.clone();
            let info: String = redis::cmd("INFO")
                .arg("commandstats")
                .query_async(&mut connection)
                .await
                .ok()?;
            let value = |command: &str| -> u64 {
                info.lines()
                    .find_map(|line| line.strip_prefix(&format!("cmdstat_{command}:")))
                    .and_then(|stats| {
                        stats
                            .split(',')
                            .find_map(|pair| pair.strip_prefix(field)?.strip_prefix('='))?
                            .parse()
                            .ok()
                    })
                    .unwrap_or(0)
            };
            Some(self.1.iter().map(|command| value(command)).sum())
        }
    }

    impl ServerCounter for CommandStats {
        async fn read(&self) -> Option<u64> {
            self.sum("calls").await
        }

        async fn read_usec(&self) -> Option<u64> {
            self.sum("usec").await
        }
    }

    pub(super) async fn bench(point: Duration) {
        let Ok(url) = std::env::var("BABEL_IDEM_REDIS_URL") else {
            skipped("redis", "BABEL_IDEM_REDIS_URL not set");
            return;
        };
        let client = redis::Client::open(url.as_str()).expect("a Redis URL");
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(2)))
            .set_response_timeout(Some(Duration::from_secs(2)));
        let connection = ConnectionManager::new_with_config(client, config)
            .await
            .expect("connect to Redis");
        let prefix = format!("bqbench:{}:", unique_suffix());
        let store = RedisStore::builder()
            .prefix(prefix.clone())
            .from_connection_manager(connection.clone())
            .expect("a Redis store");
        let raw = Raw {
            connection: connection.clone(),
            prefix: prefix.clone(),
        };
        let store = Arc::new(Counted::new(store));
        let seen_set = CommandStats(connection.clone(), &["exists", "set"]);
        bench_backend("redis", Arc::clone(&store), Arc::new(raw), &seen_set, point).await;
        print_claim_header("redis");
        let scripts = CommandStats(connection.clone(), &["evalsha", "eval"]);
        bench_claim_mode(
            "redis",
            Arc::clone(&store),
            Arc::clone(&store),
            &scripts,
            &seen_set,
            point,
        )
        .await;
        // Both modes again with the concurrent calls coalesced: claims in
        // `claim_many`/`commit_many` scripts, the seen-set in `MGET` and
        // `MULTI`/`SET NX`/`EXEC`.
        print_claim_header("redis+b (both modes in store::Batched)");
        let batched_seen_set = CommandStats(connection.clone(), &["exists", "set", "mget"]);
        bench_claim_mode(
            "redis+b",
            Arc::clone(&store),
            Batched::new(Arc::clone(&store)),
            &scripts,
            &batched_seen_set,
            point,
        )
        .await;
        // A batch's round trips: its `MGET` and its `MULTI`/`EXEC` pipeline.
        let batches = CommandStats(connection.clone(), &["mget", "exec"]);
        bench_batches("redis", store, &batches, point).await;
        delete_prefix(connection, &prefix).await;
    }

    /// One mode and path for a profiler (see the module's documentation).
    pub(super) fn profile(profile: &str) {
        let (claim, path) = match profile {
            "claim-first" => (true, Path::First),
            "claim-duplicate" => (true, Path::Duplicate),
            "seen-set-first" => (false, Path::First),
            "seen-set-duplicate" => (false, Path::Duplicate),
            other => panic!(
                "BABEL_IDEM_STORES_PROFILE={other:?}: expected claim-first, claim-duplicate, \
                 seen-set-first or seen-set-duplicate"
            ),
        };
        let url = std::env::var("BABEL_IDEM_REDIS_URL").expect("BABEL_IDEM_REDIS_URL");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a Tokio runtime");
        let prefix = format!("bqbench:{}:", unique_suffix());
        let run = unique_suffix();
        let (connection, store) = runtime.block_on(async {
            let client = redis::Client::open(url.as_str()).expect("a Redis URL");
            // Under valgrind every command takes far longer than the default allows.
            let config =
                ConnectionManagerConfig::new().set_response_timeout(Some(Duration::from_secs(30)));
            let connection = ConnectionManager::new_with_config(client, config)
                .await
                .expect("connect to Redis");
            let store = RedisStore::builder()
                .prefix(prefix.clone())
                .from_connection_manager(connection.clone())
                .expect("a Redis store");
            for n in 0..DUPLICATE_IDS as u64 {
                store
                    .remember(&Path::Duplicate.id(&run, 0, n))
                    .await
                    .expect("remember a duplicate id");
            }
            (connection, store)
        });
        profiled_deliveries(&runtime, &store, claim, path, &run);
        runtime.block_on(delete_prefix(connection, &prefix));
        println!("{profile}: {PROFILED} deliveries on Redis, one at a time");
    }

    /// Deletes the run's keys: the seen-set under `prefix`, and the claim
    /// keys and fence counter beside it (`<prefix minus ':'>-claim:`,
    /// `-fence`), which the random run suffix keeps apart from any other run.
    async fn delete_prefix(mut connection: ConnectionManager, prefix: &str) {
        let prefix = prefix.trim_end_matches(':');
        let mut cursor = 0u64;
        loop {
            let (next, keys): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(format!("{prefix}*"))
                .arg("COUNT")
                .arg(10_000)
                .query_async(&mut connection)
                .await
                .expect("SCAN");
            if !keys.is_empty() {
                let _: i64 = redis::cmd("DEL")
                    .arg(keys)
                    .query_async(&mut connection)
                    .await
                    .expect("DEL");
            }
            if next == 0 {
                return;
            }
            cursor = next;
        }
    }
}

// --------------------------------------------------------------- PostgreSQL

#[cfg(not(feature = "postgres"))]
async fn postgres_bench(_point: Duration) {
    skipped("postgres", "the `postgres` feature is off");
}

#[cfg(feature = "postgres")]
async fn postgres_bench(point: Duration) {
    postgres_backend::bench(point).await
}

#[cfg(feature = "postgres")]
mod postgres_backend {
    use super::*;
    use babel_idem::store::PostgresStore;
    use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions, PgSslMode};

    /// The store's own statements, on the pool the store uses.
    struct Raw {
        pool: PgPool,
        seen: String,
        remember: String,
    }

    impl Raw {
        fn new(pool: PgPool, store: &PostgresStore) -> Self {
            Raw {
                pool,
                seen: store.seen_statement().to_owned(),
                remember: store.remember_statement().to_owned(),
            }
        }
    }

    impl RawCommands for Raw {
        async fn seen(&self, id: String) -> bool {
            sqlx::query_scalar(&self.seen)
                .bind(id)
                .fetch_one(&self.pool)
                .await
                .expect("raw SELECT")
        }

        async fn remember(&self, id: String) {
            sqlx::query(&self.remember)
                .bind(id)
                .bind(None::<i64>)
                .execute(&self.pool)
                .await
                .expect("raw INSERT");
        }
    }

    /// What went over the wire, counted by [`wire::Proxy`].
    #[derive(Clone, Copy, Default)]
    struct Wire {
        /// `ReadyForQuery` messages: one per round trip that ends in a Sync.
        round_trips: u64,
        /// `CommandComplete` messages: one per statement executed.
        statements: u64,
    }

    /// Round trips and statements per delivery on one path, guarded (seen-set
    /// mode), raw, and guarded in claim mode, through a counting proxy in
    /// front of the server (one connection, one delivery at a time, so
    /// nothing else is on the wire).
    async fn wire_counts(options: &PgConnectOptions, table: &str, path: Path) -> [(f64, f64); 3] {
        const DELIVERIES: u64 = 1000;
        let (proxy, pool) = proxied_pool(options).await;
        let store = PostgresStore::builder()
            .table(table)
            .from_pool(pool.clone())
            .expect("a PostgreSQL store");
        let raw = Raw::new(pool.clone(), &store);
        let claimed = Guard::new(&store).lease(BENCH_LEASE).expect("a lease");
        let run = unique_suffix();
        if path == Path::Duplicate {
            for n in 0..DUPLICATE_IDS {
                raw.remember(path.id(&run, 0, n as u64)).await;
            }
        }
        let mut per_delivery = [(0.0, 0.0); 3];
        for (side, counts) in per_delivery.iter_mut().enumerate() {
            // Let the last release ping finish before reading the counters.
            tokio::time::sleep(Duration::from_millis(100)).await;
            let before = proxy.counts();
            for n in 0..DELIVERIES {
                // Duplicates read the ids remembered above; first deliveries
                // need ids of their own per side.
                let id = match path {
                    Path::First => path.id(&format!("{run}{side}"), 0, n),
                    Path::Duplicate => path.id(&run, 0, n),
                };
                if side == 0 {
                    run_once(&store, &Delivery(id), async { Ok::<(), StoreError>(()) })
                        .await
                        .expect("a guarded delivery");
                } else if side == 2 {
                    claimed
                        .run(&Delivery(id), async { Ok::<(), StoreError>(()) })
                        .await
                        .expect("a claimed delivery");
                } else if !raw.seen(id.clone()).await && path == Path::First {
                    raw.remember(id).await;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            let after = proxy.counts();
            *counts = (
                (after.round_trips - before.round_trips) as f64 / DELIVERIES as f64,
                (after.statements - before.statements) as f64 / DELIVERIES as f64,
            );
        }
        pool.close().await;
        per_delivery
    }

    /// A pool of one connection through a fresh counting proxy.
    async fn proxied_pool(options: &PgConnectOptions) -> (wire::Proxy, PgPool) {
        let proxy = wire::Proxy::start(options.get_host(), options.get_port());
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .test_before_acquire(false)
            .connect_with(
                options
                    .clone()
                    .host("127.0.0.1")
                    .port(proxy.port())
                    .ssl_mode(PgSslMode::Disable),
            )
            .await
            .expect("connect through the counting proxy");
        (proxy, pool)
    }

    /// Round trips and statements per batch of [`BATCH`] through
    /// `Guard::run_batch` on one path, counted by the proxy.
    async fn batch_wire_counts(options: &PgConnectOptions, table: &str, path: Path) -> (f64, f64) {
        const BATCHES: u64 = 50;
        let (proxy, pool) = proxied_pool(options).await;
        let store = PostgresStore::builder()
            .table(table)
            .from_pool(pool.clone())
            .expect("a PostgreSQL store");
        let run = unique_suffix();
        let id = |n: u64| path.id(&run, 0, n);
        if path == Path::Duplicate {
            let ids: Vec<String> = (0..BATCHES * BATCH as u64).map(id).collect();
            let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
            store
                .remember_many(&ids)
                .await
                .expect("remember the duplicates");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let before = proxy.counts();
        for n in 0..BATCHES {
            let messages: Vec<Delivery> = (0..BATCH as u64)
                .map(|at| Delivery(id(n * BATCH as u64 + at)))
                .collect();
            for outcome in Guard::new(&store)
                .run_batch(&messages, |_| async { Ok::<(), StoreError>(()) })
                .await
            {
                outcome.into_result().expect("a batched delivery");
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let after = proxy.counts();
        pool.close().await;
        (
            (after.round_trips - before.round_trips) as f64 / BATCHES as f64,
            (after.statements - before.statements) as f64 / BATCHES as f64,
        )
    }

    /// A TCP proxy that counts the server's `ReadyForQuery` and
    /// `CommandComplete` messages. Plain threads and blocking sockets: it
    /// only has to keep up with one connection at a time.
    mod wire {
        use super::Wire;
        use std::io::{Read, Write};
        use std::net::{Shutdown, TcpListener, TcpStream};
        use std::sync::Arc;
        use std::sync::atomic::{AtomicU64, Ordering};
        use std::thread;

        pub(super) struct Proxy {
            port: u16,
            round_trips: Arc<AtomicU64>,
            statements: Arc<AtomicU64>,
        }

        impl Proxy {
            pub(super) fn start(host: &str, port: u16) -> Proxy {
                let listener = TcpListener::bind("127.0.0.1:0").expect("a proxy port");
                let proxy = Proxy {
                    port: listener.local_addr().expect("an address").port(),
                    round_trips: Arc::default(),
                    statements: Arc::default(),
                };
                let upstream = format!("{host}:{port}");
                let (round_trips, statements) = (
                    Arc::clone(&proxy.round_trips),
                    Arc::clone(&proxy.statements),
                );
                thread::spawn(move || {
                    for client in listener.incoming().flatten() {
                        let server = TcpStream::connect(&upstream).expect("reach PostgreSQL");
                        let _ = client.set_nodelay(true);
                        let _ = server.set_nodelay(true);
                        let (round_trips, statements) =
                            (Arc::clone(&round_trips), Arc::clone(&statements));
                        let (client_in, server_out) = (
                            client.try_clone().expect("a socket"),
                            server.try_clone().expect("a socket"),
                        );
                        thread::spawn(move || copy(client_in, server_out));
                        thread::spawn(move || count(server, client, &round_trips, &statements));
                    }
                });
                proxy
            }

            pub(super) fn port(&self) -> u16 {
                self.port
            }

            pub(super) fn counts(&self) -> Wire {
                Wire {
                    round_trips: self.round_trips.load(Ordering::SeqCst),
                    statements: self.statements.load(Ordering::SeqCst),
                }
            }
        }

        fn copy(mut from: TcpStream, mut to: TcpStream) {
            let _ = std::io::copy(&mut from, &mut to);
            let _ = to.shutdown(Shutdown::Write);
        }

        /// Forwards the server's messages (a type byte, then a big-endian
        /// length that counts itself) and counts two of their types.
        fn count(
            mut server: TcpStream,
            mut client: TcpStream,
            round_trips: &AtomicU64,
            statements: &AtomicU64,
        ) {
            let mut header = [0u8; 5];
            let mut body = Vec::new();
            let mut message = Vec::new();
            while server.read_exact(&mut header).is_ok() {
                let length = u32::from_be_bytes([header[1], header[2], header[3], header[4]]);
                body.resize((length as usize).saturating_sub(4), 0);
                if server.read_exact(&mut body).is_err() {
                    break;
                }
                match header[0] {
                    b'Z' => round_trips.fetch_add(1, Ordering::SeqCst),
                    b'C' => statements.fetch_add(1, Ordering::SeqCst),
                    _ => 0,
                };
                // One write per message: two small writes would wait on
                // Nagle's algorithm and the peer's delayed ACK.
                message.clear();
                message.extend_from_slice(&header);
                message.extend_from_slice(&body);
                if client.write_all(&message).is_err() {
                    break;
                }
            }
            let _ = client.shutdown(Shutdown::Write);
        }
    }

    pub(super) async fn bench(point: Duration) {
        let Ok(url) = std::env::var("BABEL_IDEM_POSTGRES_URL") else {
            skipped("postgres", "BABEL_IDEM_POSTGRES_URL not set");
            return;
        };
        // The settings `PostgresStore::connect_lazy` gives its own pool.
        let pool = PgPoolOptions::new()
            .max_connections(10)
            .test_before_acquire(false)
            .connect(&url)
            .await
            .expect("connect to PostgreSQL");
        let table = format!("bqbench_{}", unique_suffix());
        let store = PostgresStore::builder()
            .table(table.clone())
            .from_pool(pool.clone())
            .expect("a PostgreSQL store");
        store.migrate().await.expect("create the bench table");
        store
            .migrate_claims()
            .await
            .expect("create claim mode's tables");
        let raw = Raw::new(pool.clone(), &store);
        let store = Arc::new(Counted::new(store));
        bench_backend(
            "postgres",
            Arc::clone(&store),
            Arc::new(raw),
            &NoServer,
            point,
        )
        .await;
        bench_claim_mode_uncounted("postgres", Arc::clone(&store), point).await;
        bench_batches("postgres", store, &NoServer, point).await;
        let options: PgConnectOptions = url.parse().expect("a PostgreSQL URL");
        for path in [Path::First, Path::Duplicate] {
            let [
                (guarded_trips, guarded_statements),
                (raw_trips, raw_statements),
                (claim_trips, claim_statements),
            ] = wire_counts(&options, &table, path).await;
            println!(
                "postgres   {:<15} per delivery on the wire: guarded {guarded_statements:.2} statements in \
                 {guarded_trips:.2} round trips, raw {raw_statements:.2} in {raw_trips:.2}, \
                 claim mode {claim_statements:.2} in {claim_trips:.2} \
                 (sqlx pings each connection it takes back into the pool)",
                path.name()
            );
        }
        for path in [Path::First, Path::Duplicate] {
            let (trips, statements) = batch_wire_counts(&options, &table, path).await;
            println!(
                "postgres   {:<15} per batch of {BATCH} on the wire: {statements:.2} statements in \
                 {trips:.2} round trips (with the pings as above)",
                path.name()
            );
        }
        sqlx::raw_sql(&format!(
            "DROP TABLE {table}, {table}_claims; DROP SEQUENCE {table}_claims_fence"
        ))
        .execute(&pool)
        .await
        .expect("drop the bench table");
    }
}
