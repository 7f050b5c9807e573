//! What the guard costs over calling the handler directly, against baselines
//! measured in the same run:
//!
//! - latency (criterion): the bare call, the duplicate path over 100,000
//!   remembered ids (through `&InMemoryStore` and through `&dyn Store`), and
//!   the same duplicate path on the naive design (`Mutex<HashSet<String>>`,
//!   a `String` key per call, a boxed future per store call);
//! - the first-delivery path, inserting 1,000,000 fresh UUID ids into a new
//!   store (custom loop: the store must grow through the whole range);
//! - throughput of two threads against one on the duplicate path;
//! - heap allocations per duplicate delivery and bytes per remembered UUID id,
//!   counted by a counting global allocator;
//! - claim mode (`Guard::lease`) on the same store: the duplicate of a done
//!   id (one `claim` that answers done) and the first delivery (`claim`, run,
//!   `commit`), beside the seen-set figures;
//! - the three paths `benches/go_side_by_side.sh` sets beside the Go SDK's
//!   `idempotency.Wrap`: the bare call and the duplicate over the 100,000
//!   (12 slices of 1,000,000 deliveries each), and the first delivery of
//!   fresh ids (5 slices, each 1,000,000 ids into a new store), every slice
//!   followed by a probe of whether another hardware thread shared the core
//!   meanwhile (`core_width_probe`).
//!
//! Run: `cargo bench --bench guard` (add `-- --quick` for a shorter run).
//! `BABEL_IDEM_GUARD_IDS=1000` runs the duplicate paths over 1,000
//! remembered ids instead of 100,000 (a table that stays in the caches).
//! `BABEL_IDEM_GUARD_WARMUP_SECS=8` runs the duplicate path for 8 seconds
//! before the Go-comparison block and before the profiled duplicate loop
//! below (`go_side_by_side.sh` sets it on both sides).
//!
//! For a profiler, `BABEL_IDEM_GUARD_PROFILE=duplicate` (or `bare`,
//! `duplicate-dyn`: the duplicate called through a `&dyn Fn` as in the Go
//! comparison, or `first`) skips all of the above and runs only that path,
//! 1,000,000 deliveries in `profiled_deliveries` (over `BABEL_IDEM_GUARD_IDS`
//! ids), e.g.
//! `valgrind --tool=callgrind --toggle-collect=*profiled_deliveries* <bench binary>`:
//! the instructions per delivery are that function's inclusive count / 1,000,000.
//! Add `--cache-sim=yes` (and `--LL=` for the last-level cache to model) for
//! the cache misses per delivery (compare `duplicate` with `bare`).

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::HashSet;
use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::sync::atomic::{AtomicIsize, AtomicUsize, Ordering};
use std::sync::{Barrier, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use babel_idem::store::StoreFuture;
use babel_idem::{Envelope, Guard, InMemoryStore, MessageId, Store, StoreError, run_once};
use criterion::{BatchSize, Criterion};
use serde_json::json;

/// Remembered ids of the duplicate paths, unless `BABEL_IDEM_GUARD_IDS` says
/// otherwise (e.g. 1,000, whose table stays in the caches).
const WORKING_SET: usize = 100_000;
const FRESH_IDS: usize = 1_000_000;
/// Deliveries per run of the Go comparison and of the profile mode.
const DELIVERIES: usize = 1_000_000;
/// The claim-mode lease: never lapses during a run, and no handler here waits
/// long enough to renew it.
const LEASE: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------- allocator

struct Counting;

static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);
static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(layout.size() as isize, Ordering::Relaxed);
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: `ptr` came from `alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE_BYTES.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as in `alloc` and `dealloc`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

// ---------------------------------------------------------------- harness

/// Polls a future that never waits (every store here answers from memory)
/// once, so the figures hold the guard's cost and no executor's. A macro,
/// not a function, so that the future is polled where it is built, as an
/// executor polls a task's future where the task keeps it, and no build
/// adds a move of the future that another build leaves out.
macro_rules! ready {
    ($future:expr) => {
        match pin!($future).poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(output) => output,
            Poll::Pending => unreachable!("an in-memory delivery never waits"),
        }
    };
}

/// The handler under test: it only reads the message id (so the bare call
/// pays the same cache misses on the message as the guard does), which makes
/// the difference between the two the guard's own cost.
async fn handler(env: &Envelope) -> Result<(), StoreError> {
    black_box(env.message_id().map(|id| id.as_bytes()[id.len() - 1]));
    Ok(())
}

/// [`WORKING_SET`], or the count `BABEL_IDEM_GUARD_IDS` gives.
fn working_set_size() -> usize {
    let Ok(value) = std::env::var("BABEL_IDEM_GUARD_IDS") else {
        return WORKING_SET;
    };
    match value.parse() {
        Ok(count) if count > 0 => count,
        _ => {
            eprintln!("BABEL_IDEM_GUARD_IDS={value:?}: expected a count of ids above 0");
            std::process::exit(2);
        }
    }
}

fn envelopes(count: usize) -> Vec<Envelope> {
    (0..count)
        .map(|_| Envelope::new("urn:babel:orders:created", json!({"order_id": 1})))
        .collect()
}

fn remembered(envelopes: &[Envelope]) -> InMemoryStore {
    let store = InMemoryStore::new();
    for env in envelopes {
        ready!(run_once(&store, env, handler(env))).unwrap();
    }
    store
}

// ---------------------------------------------------------------- the naive design

/// The straightforward design: a `String` key per call, a boxed future per
/// store call, one mutex around a `HashSet<String>`.
#[derive(Default)]
struct NaiveStore(Mutex<HashSet<String>>);

impl Store for NaiveStore {
    fn seen<'a>(&'a self, id: &'a str) -> StoreFuture<'a, bool> {
        let key = id.to_owned();
        StoreFuture::new(async move { Ok(self.0.lock().unwrap().contains(&key)) })
    }
    fn remember<'a>(&'a self, id: &'a str) -> StoreFuture<'a, ()> {
        let key = id.to_owned();
        StoreFuture::new(async move {
            self.0.lock().unwrap().insert(key);
            Ok(())
        })
    }
    fn forget<'a>(&'a self, id: &'a str) -> StoreFuture<'a, ()> {
        let key = id.to_owned();
        StoreFuture::new(async move {
            self.0.lock().unwrap().remove(&key);
            Ok(())
        })
    }
}

// ---------------------------------------------------------------- latency

fn latency(c: &mut Criterion, working_set: &[Envelope], store: &InMemoryStore) {
    let naive = NaiveStore::default();
    for env in working_set {
        ready!(run_once(&naive, env, handler(env))).unwrap();
    }
    let dynamic: &dyn Store = store;

    let mut group = c.benchmark_group("delivery");
    let mut cycle = working_set.iter().cycle();
    group.bench_function("bare handler call", |b| {
        b.iter(|| ready!(handler(cycle.next().unwrap())))
    });
    group.bench_function("duplicate, &InMemoryStore", |b| {
        b.iter(|| {
            let env = cycle.next().unwrap();
            ready!(run_once(store, env, handler(env)))
        })
    });
    group.bench_function("duplicate, &dyn Store", |b| {
        b.iter(|| {
            let env = cycle.next().unwrap();
            ready!(run_once(dynamic, env, handler(env)))
        })
    });
    group.bench_function("duplicate, naive Mutex<HashSet<String>>", |b| {
        b.iter(|| {
            let env = cycle.next().unwrap();
            ready!(run_once(&naive, env, handler(env)))
        })
    });
    group.bench_function("first delivery, 10k fresh ids per batch", |b| {
        b.iter_batched(
            || (InMemoryStore::new(), envelopes(10_000)),
            |(store, fresh)| {
                for env in &fresh {
                    ready!(run_once(&store, env, handler(env))).unwrap();
                }
                (store, fresh)
            },
            BatchSize::PerIteration,
        )
    });
    let claimed = Guard::new(store).lease(LEASE).unwrap();
    group.bench_function("claim mode: duplicate of a done id, &InMemoryStore", |b| {
        b.iter(|| {
            let env = cycle.next().unwrap();
            ready!(claimed.run(env, handler(env)))
        })
    });
    group.bench_function("claim mode: first delivery, 10k fresh ids per batch", |b| {
        b.iter_batched(
            || (InMemoryStore::new(), envelopes(10_000)),
            |(store, fresh)| {
                let claimed = Guard::new(&store).lease(LEASE).unwrap();
                for env in &fresh {
                    ready!(claimed.run(env, handler(env))).unwrap();
                }
                (store, fresh)
            },
            BatchSize::PerIteration,
        )
    });
    group.finish();
}

// ---------------------------------------------------------------- custom measurements

fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

/// Nanoseconds per delivery, the median of `rounds` runs of `body`.
fn per_delivery(rounds: usize, deliveries: usize, mut body: impl FnMut() -> Duration) -> f64 {
    median(
        (0..rounds)
            .map(|_| body().as_nanos() as f64 / deliveries as f64)
            .collect(),
    )
}

/// The time `fresh` takes to go through the guard into a new store, the
/// first delivery of each (the store's drop not included).
fn first_deliveries(fresh: &[Envelope]) -> Duration {
    let store = InMemoryStore::new();
    let start = Instant::now();
    for env in fresh {
        ready!(run_once(&store, env, handler(env))).unwrap();
    }
    let elapsed = start.elapsed();
    drop(store);
    elapsed
}

/// Prints the first-delivery figures.
fn first_delivery() {
    let fresh = envelopes(FRESH_IDS);
    let bare = per_delivery(5, FRESH_IDS, || {
        let start = Instant::now();
        for env in &fresh {
            ready!(handler(env)).unwrap();
        }
        start.elapsed()
    });
    let guarded = per_delivery(5, FRESH_IDS, || first_deliveries(&fresh));
    let claimed = per_delivery(5, FRESH_IDS, || {
        let store = InMemoryStore::new();
        let claimed = Guard::new(&store).lease(LEASE).unwrap();
        let start = Instant::now();
        for env in &fresh {
            ready!(claimed.run(env, handler(env))).unwrap();
        }
        let elapsed = start.elapsed();
        drop(store);
        elapsed
    });
    let naive = per_delivery(3, FRESH_IDS, || {
        let store = NaiveStore::default();
        let start = Instant::now();
        for env in &fresh {
            ready!(run_once(&store, env, handler(env))).unwrap();
        }
        start.elapsed()
    });
    println!("first delivery, {FRESH_IDS} fresh UUID ids into a new store (median of runs):");
    println!("  bare handler call      {bare:8.1} ns");
    println!(
        "  guarded, InMemoryStore {guarded:8.1} ns  (+{:.1} ns over bare)",
        guarded - bare
    );
    println!(
        "  claim mode, InMemory   {claimed:8.1} ns  (+{:.1} ns over bare, {:.2}x the seen-set path)",
        claimed - bare,
        (claimed - bare) / (guarded - bare)
    );
    println!(
        "  guarded, naive store   {naive:8.1} ns  (+{:.1} ns over bare, {:.2}x the InMemoryStore path)",
        naive - bare,
        (naive - bare) / (guarded - bare)
    );
}

/// Timed slices per path in the Go comparison: the bare call and the
/// duplicate (each slice is [`DELIVERIES`] deliveries), and the first
/// delivery (each slice fills a new store with [`DELIVERIES`] fresh ids).
const COMPARISON_SLICES: usize = 12;
const FIRST_DELIVERY_SLICES: usize = 5;

/// One timed slice of the Go comparison: nanoseconds per delivery, and the
/// [`core_width_probe`] right after it.
struct Slice {
    ns: f64,
    width: f64,
}

/// Fixed work that keeps the core's execution units busy (eight independent
/// chains of add, shift and xor), timed: operations per nanosecond.
///
/// It slows down while another hardware thread shares this core (an SMT
/// sibling), which slows the duplicate path of both sides too.
/// `go_side_by_side.sh` runs the same probe on the Go side after each
/// slice, so that it can set each side's figures beside the other's taken
/// while the core was its own.
#[inline(never)]
fn core_width_probe() -> f64 {
    const STEPS: u64 = 2_000_000;
    let mut lanes: [u64; 8] = black_box([1, 2, 3, 4, 5, 6, 7, 8]);
    let start = Instant::now();
    for step in 0..STEPS {
        for lane in &mut lanes {
            *lane = lane.wrapping_add(step) ^ (*lane >> 3);
        }
    }
    black_box(lanes);
    (STEPS * 8 * 3) as f64 / start.elapsed().as_nanos() as f64
}

/// `count` slices of `body`, each probed as it ends (see [`core_width_probe`]).
fn probed_slices(
    count: usize,
    deliveries: usize,
    mut body: impl FnMut() -> Duration,
) -> Vec<Slice> {
    (0..count)
        .map(|_| {
            let ns = body().as_nanos() as f64 / deliveries as f64;
            Slice {
                ns,
                width: core_width_probe(),
            }
        })
        .collect()
}

/// The three paths of `benches/go_side_by_side.sh`, in the layout it reads:
/// a heading, then a `label  slices` line per path (each slice `ns@width`),
/// then a blank line. The Go side prints the same lines.
fn go_comparison(working_set: &[Envelope], store: &InMemoryStore) {
    warm_up(working_set, store);
    let over_working_set = |body: &dyn Fn(&Envelope)| {
        probed_slices(COMPARISON_SLICES, DELIVERIES, || {
            let start = Instant::now();
            for env in working_set.iter().cycle().take(DELIVERIES) {
                body(env);
            }
            start.elapsed()
        })
    };
    let bare = over_working_set(&|env| ready!(handler(env)).unwrap());
    let duplicate = over_working_set(&|env| ready!(run_once(store, env, handler(env))).unwrap());
    let fresh = envelopes(DELIVERIES);
    let first_delivery = probed_slices(FIRST_DELIVERY_SLICES, DELIVERIES, || {
        first_deliveries(&fresh)
    });
    let median_of = |slices: &[Slice]| median(slices.iter().map(|slice| slice.ns).collect());
    println!(
        "Go comparison (benches/go_side_by_side.sh), ns per delivery over {DELIVERIES} deliveries \
         @ the core-width probe after it, slice by slice ({} remembered ids):",
        working_set.len()
    );
    for (label, slices) in [
        ("bare handler call", &bare),
        ("duplicate", &duplicate),
        ("first delivery", &first_delivery),
    ] {
        let slices: Vec<String> = slices
            .iter()
            .map(|slice| format!("{:.2}@{:.2}", slice.ns, slice.width))
            .collect();
        println!("  {label}  {}", slices.join(" "));
    }
    println!(
        "  (medians: bare {:.1} ns, duplicate {:.1} ns, first delivery {:.1} ns)",
        median_of(&bare),
        median_of(&duplicate),
        median_of(&first_delivery)
    );
    println!();
}

/// Runs the duplicate path for `BABEL_IDEM_GUARD_WARMUP_SECS` (none when
/// unset), as `go_side_by_side.sh` has both sides do before they time it,
/// so that a fresh process is not timed before it settles.
fn warm_up(working_set: &[Envelope], store: &InMemoryStore) {
    let seconds = match std::env::var("BABEL_IDEM_GUARD_WARMUP_SECS") {
        Err(_) => return,
        Ok(value) => value.parse().unwrap_or_else(|_| {
            eprintln!("BABEL_IDEM_GUARD_WARMUP_SECS={value:?}: expected whole seconds");
            std::process::exit(2);
        }),
    };
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(seconds) {
        for env in working_set {
            ready!(run_once(store, env, handler(env))).unwrap();
        }
    }
}

/// `BABEL_IDEM_GUARD_PROFILE`'s loop: nothing but the deliveries of one path,
/// in a function of its own that a profiler can be pointed at.
#[inline(never)]
fn profiled_deliveries(envelopes: &[Envelope], mut deliver: impl FnMut(&Envelope)) {
    let start = Instant::now();
    for env in envelopes.iter().cycle().take(DELIVERIES) {
        deliver(env);
    }
    let per_delivery = start.elapsed().as_nanos() as f64 / DELIVERIES as f64;
    eprintln!("{per_delivery:.1} ns per delivery");
}

fn profile(path: &str) {
    let working_set = envelopes(working_set_size());
    let env = &working_set[0];
    let size = std::mem::size_of_val(&run_once(&InMemoryStore::new(), env, handler(env)));
    eprintln!("size of the guard's future: {size} bytes");
    match path {
        "bare" => profiled_deliveries(&working_set, |env| ready!(handler(env)).unwrap()),
        "duplicate" => {
            let store = remembered(&working_set);
            warm_up(&working_set, &store);
            profiled_deliveries(&working_set, |env| {
                ready!(run_once(&store, env, handler(env))).unwrap()
            });
        }
        // The duplicate called through a `&dyn Fn`, as the Go comparison
        // calls it (and Go's benchmark calls `Wrap`'s handler).
        "duplicate-dyn" => {
            let store = remembered(&working_set);
            warm_up(&working_set, &store);
            let body: &dyn Fn(&Envelope) =
                &|env| ready!(run_once(&store, env, handler(env))).unwrap();
            profiled_deliveries(&working_set, body);
        }
        "first" => {
            let fresh = envelopes(DELIVERIES);
            let store = InMemoryStore::new();
            profiled_deliveries(&fresh, |env| {
                ready!(run_once(&store, env, handler(env))).unwrap()
            });
        }
        other => {
            eprintln!(
                "BABEL_IDEM_GUARD_PROFILE={other:?}: expected bare, duplicate, duplicate-dyn or first"
            );
            std::process::exit(2);
        }
    }
}

fn two_threads(working_set: &[Envelope], store: &InMemoryStore) {
    const PER_THREAD: usize = 4_000_000;
    let run = |threads: usize| -> f64 {
        let barrier = Barrier::new(threads);
        let elapsed = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..threads)
                .map(|thread| {
                    let barrier = &barrier;
                    scope.spawn(move || {
                        // Each thread walks the working set from its own offset.
                        let mut cycle = working_set.iter().cycle().skip(thread * 7919);
                        barrier.wait();
                        let start = Instant::now();
                        for _ in 0..PER_THREAD {
                            let env = cycle.next().unwrap();
                            ready!(run_once(store, env, handler(env))).unwrap();
                        }
                        start.elapsed()
                    })
                })
                .collect();
            workers
                .into_iter()
                .map(|worker| worker.join().unwrap())
                .max()
                .unwrap()
        });
        (threads * PER_THREAD) as f64 / elapsed.as_secs_f64()
    };
    let one = median((0..3).map(|_| run(1)).collect());
    let two = median((0..3).map(|_| run(2)).collect());
    println!(
        "duplicate path throughput over {} remembered ids (median of 3):",
        working_set.len()
    );
    println!("  1 thread   {:8.2} M deliveries/s", one / 1e6);
    println!(
        "  2 threads  {:8.2} M deliveries/s  ({:.2}x one thread)",
        two / 1e6,
        two / one
    );
}

fn allocations_per_duplicate(working_set: &[Envelope], store: &InMemoryStore) {
    let dynamic: &dyn Store = store;
    let count = |body: &dyn Fn(&Envelope)| {
        let before = ALLOCATIONS.load(Ordering::Relaxed);
        for env in working_set {
            body(env);
        }
        (ALLOCATIONS.load(Ordering::Relaxed) - before) as f64 / working_set.len() as f64
    };
    let concrete = count(&|env| ready!(run_once(store, env, handler(env))).unwrap());
    let through_dyn = count(&|env| ready!(run_once(dynamic, env, handler(env))).unwrap());
    let claimed = Guard::new(store).lease(LEASE).unwrap();
    let claim_mode = count(&|env| ready!(claimed.run(env, handler(env))).unwrap());
    let env = &working_set[0];
    let future_size = std::mem::size_of_val(&run_once(store, env, handler(env)));
    println!("size of the guard's future (built on every call): {future_size} bytes");
    println!("heap allocations per duplicate delivery:");
    println!("  &InMemoryStore              {concrete:.3}");
    println!("  &dyn Store                  {through_dyn:.3}");
    println!("  claim mode, &InMemoryStore  {claim_mode:.3}");
    // The duplicate path allocates nothing: held here, not only printed.
    assert_eq!(concrete, 0.0, "a duplicate delivery allocated");
    assert_eq!(
        through_dyn, 0.0,
        "a duplicate delivery through &dyn Store allocated"
    );
}

fn bytes_per_id() {
    let ids: Vec<String> = (0..FRESH_IDS)
        .map(|_| uuid::Uuid::new_v4().to_string())
        .collect();
    let measure = |fill: &dyn Fn() -> Box<dyn std::any::Any>| {
        let before = LIVE_BYTES.load(Ordering::Relaxed);
        let store = fill();
        let bytes = LIVE_BYTES.load(Ordering::Relaxed) - before;
        drop(store);
        bytes as f64 / FRESH_IDS as f64
    };
    let in_memory = measure(&|| {
        let store = InMemoryStore::new();
        for id in &ids {
            ready!(store.remember(id)).unwrap();
        }
        Box::new(store)
    });
    let bounded = measure(&|| {
        let store = InMemoryStore::builder()
            .ttl(Duration::from_secs(3600))
            .capacity(2 * FRESH_IDS)
            .build()
            .expect("one hour is a valid TTL");
        for id in &ids {
            ready!(store.remember(id)).unwrap();
        }
        Box::new(store)
    });
    let naive = measure(&|| {
        let store = NaiveStore::default();
        for id in &ids {
            ready!(store.remember(id)).unwrap();
        }
        Box::new(store)
    });
    println!("heap bytes per remembered UUID id, {FRESH_IDS} ids:");
    println!("  InMemoryStore                 {in_memory:6.1}");
    println!("  InMemoryStore with TTL + cap  {bounded:6.1}");
    println!("  naive HashSet<String>         {naive:6.1}");
}

fn main() {
    if let Ok(path) = std::env::var("BABEL_IDEM_GUARD_PROFILE") {
        profile(&path);
        return;
    }
    let working_set = envelopes(working_set_size());
    let store = remembered(&working_set);

    let mut criterion = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .configure_from_args();
    latency(&mut criterion, &working_set, &store);
    criterion.final_summary();

    println!();
    first_delivery();
    println!();
    go_comparison(&working_set, &store);
    two_threads(&working_set, &store);
    println!();
    allocations_per_duplicate(&working_set, &store);
    println!();
    bytes_per_id();
}
