//! What `#[idempotent]` costs over writing the guard call by hand: the same
//! handler body, once annotated and once as
//! `Guard::new(&STORE).run_keyed(key, async move { .. })`, on
//!
//! - the duplicate path (the id is already remembered: the body is skipped),
//! - the first-delivery path (a fresh id: `seen`, the body, `remember`).
//!
//! Criterion reports each path's latency; a closing pass times both versions
//! interleaved, in rounds, and prints the ratio annotated / hand-written
//! (zero overhead is a ratio within noise of 1.0).
//!
//! Run: `cargo bench --bench idempotent` (add
//! `-- --warm-up-time 1 --measurement-time 3` for a shorter run).

use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use babel_idem::{Envelope, Guard, InMemoryStore, Store, StoreError, idempotent};
use criterion::{BatchSize, Criterion};
use serde_json::json;

/// Each version gets its own store, so neither sees the other's ids.
static ANNOTATED_STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);
static HAND_WRITTEN_STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);

/// The id every duplicate delivery carries (a UUID, like real ids).
const DUPLICATE_ID: &str = "0b5e8c1a-7f3d-4e2b-9a61-3c4d5e6f7a8b";

#[idempotent(store = ANNOTATED_STORE)]
async fn annotated(env: &Envelope) -> Result<(), StoreError> {
    black_box(env.urn());
    Ok(())
}

/// What the attribute saves the user from writing.
async fn hand_written(env: &Envelope) -> Result<(), StoreError> {
    let guard = Guard::new(&*HAND_WRITTEN_STORE);
    let key = guard.key(env);
    guard
        .run_keyed(key, async move {
            black_box(env.urn());
            Ok(())
        })
        .await
}

/// Polls a future that never waits (the stores answer from memory) once, so
/// the figures hold the guard's cost and no executor's.
fn ready<F: Future>(future: F) -> F::Output {
    match pin!(future).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(output) => output,
        Poll::Pending => unreachable!("an in-memory delivery never waits"),
    }
}

fn envelope(id: &str) -> Envelope {
    Envelope::new("urn:babel:orders:created", json!({"order_id": 1042})).with_id(id)
}

/// A UUID-shaped id no earlier call has used.
fn fresh_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("00000000-0000-4000-8000-{n:012x}")
}

fn remember_duplicate() {
    ready(async {
        ANNOTATED_STORE.remember(DUPLICATE_ID).await?;
        HAND_WRITTEN_STORE.remember(DUPLICATE_ID).await
    })
    .expect("in-memory remember succeeds");
}

fn duplicate_path(c: &mut Criterion) {
    remember_duplicate();
    let env = envelope(DUPLICATE_ID);
    let mut group = c.benchmark_group("idempotent/duplicate");
    group.bench_function("annotated", |b| {
        b.iter(|| ready(annotated(black_box(&env))))
    });
    group.bench_function("hand_written", |b| {
        b.iter(|| ready(hand_written(black_box(&env))))
    });
    group.finish();
}

fn first_delivery_path(c: &mut Criterion) {
    let mut group = c.benchmark_group("idempotent/first_delivery");
    group.bench_function("annotated", |b| {
        b.iter_batched_ref(
            || envelope(&fresh_id()),
            |env| ready(annotated(env)),
            BatchSize::SmallInput,
        )
    });
    group.bench_function("hand_written", |b| {
        b.iter_batched_ref(
            || envelope(&fresh_id()),
            |env| ready(hand_written(env)),
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

/// Times `rounds` interleaved batches of each version and returns the median
/// nanoseconds per batch of each, so drift (frequency, other load) hits both.
fn interleaved<A, B>(rounds: usize, mut a: A, mut b: B) -> (f64, f64)
where
    A: FnMut() -> Duration,
    B: FnMut() -> Duration,
{
    let mut a_times = Vec::with_capacity(rounds);
    let mut b_times = Vec::with_capacity(rounds);
    for round in 0..rounds {
        // Alternate which one goes first, so neither always meets a colder
        // cache or a store that the other has just grown.
        if round % 2 == 0 {
            a_times.push(a().as_nanos() as f64);
            b_times.push(b().as_nanos() as f64);
        } else {
            b_times.push(b().as_nanos() as f64);
            a_times.push(a().as_nanos() as f64);
        }
    }
    (median(&mut a_times), median(&mut b_times))
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Prints annotated / hand-written for both paths.
fn report_ratio() {
    const CALLS: u32 = 20_000;
    const ROUNDS: usize = 31;

    remember_duplicate();
    let env = envelope(DUPLICATE_ID);
    let (annotated_ns, hand_ns) = interleaved(
        ROUNDS,
        || {
            let start = Instant::now();
            for _ in 0..CALLS {
                ready(annotated(black_box(&env))).unwrap();
            }
            start.elapsed()
        },
        || {
            let start = Instant::now();
            for _ in 0..CALLS {
                ready(hand_written(black_box(&env))).unwrap();
            }
            start.elapsed()
        },
    );
    print_ratio("duplicate", annotated_ns, hand_ns, CALLS);

    // Fresh envelopes are built before each timed batch, outside the timing.
    let batch =
        |calls: u32| -> Vec<Envelope> { (0..calls).map(|_| envelope(&fresh_id())).collect() };
    let (annotated_ns, hand_ns) = interleaved(
        ROUNDS,
        || {
            let envs = batch(CALLS);
            let start = Instant::now();
            for env in &envs {
                ready(annotated(env)).unwrap();
            }
            start.elapsed()
        },
        || {
            let envs = batch(CALLS);
            let start = Instant::now();
            for env in &envs {
                ready(hand_written(env)).unwrap();
            }
            start.elapsed()
        },
    );
    print_ratio("first delivery", annotated_ns, hand_ns, CALLS);
}

fn print_ratio(path: &str, annotated_ns: f64, hand_ns: f64, calls: u32) {
    let calls = f64::from(calls);
    println!(
        "idempotent/{path}: annotated {:.1} ns, hand-written {:.1} ns per call, \
         ratio annotated / hand-written = {:.3}",
        annotated_ns / calls,
        hand_ns / calls,
        annotated_ns / hand_ns,
    );
}

/// The two versions build futures of the same size: the attribute adds no
/// state of its own.
fn report_future_sizes() {
    let env = envelope(DUPLICATE_ID);
    println!(
        "idempotent: future size annotated {} bytes, hand-written {} bytes",
        std::mem::size_of_val(&annotated(&env)),
        std::mem::size_of_val(&hand_written(&env)),
    );
}

fn main() {
    report_future_sizes();
    let mut criterion = Criterion::default().configure_from_args();
    duplicate_path(&mut criterion);
    first_delivery_path(&mut criterion);
    criterion.final_summary();
    report_ratio();
}
