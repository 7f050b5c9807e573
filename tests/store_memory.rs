//! The store contract against `InMemoryStore`, the reference store, and the
//! bounds it promises on top: memory under remember/forget churn, capacity
//! across shards.

#[macro_use]
#[path = "../babel-idem/tests/store_contract/mod.rs"]
mod store_contract;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use babel_idem::store::{InMemoryStoreBuilder, MAX_TTL, StoreFuture};
use babel_idem::{InMemoryStore, Store};
use store_contract::{MemoryBackend, assert_refused_when_built};

store_contract_tests!(MemoryBackend::create);

// ---------------------------------------------------------------- TTL rule

/// The TTL rule of every store: under 1 ms or over `MAX_TTL` is refused
/// when the store is built, as an `open` error of the memory backend that
/// states the range, rather than rounded up or accepted.
#[test]
fn ttls_out_of_range_are_refused_when_built() {
    for ttl in [
        Duration::ZERO,
        Duration::from_micros(999),
        MAX_TTL + Duration::from_millis(1),
    ] {
        let built = InMemoryStore::builder().ttl(ttl).build();
        if let Err(error) = &built {
            assert_eq!(error.backend(), "memory", "{ttl:?}: {error}");
        }
        assert_refused_when_built(built, ttl, &["at least 1 ms", "at most 36500 days"]);
    }
}

/// Both ends of the range are accepted, and a store built with either
/// remembers what it is given.
#[test]
fn the_ends_of_the_ttl_range_are_accepted() {
    for ttl in [Duration::from_millis(1), MAX_TTL] {
        let store = InMemoryStore::builder()
            .ttl(ttl)
            .build()
            .unwrap_or_else(|error| panic!("{ttl:?} was refused: {error}"));
        now(store.remember("id-A"));
        assert_eq!(store.len(), 1, "{ttl:?}");
    }
    let longest = InMemoryStore::builder().ttl(MAX_TTL).build().unwrap();
    now(longest.remember("id-A"));
    assert!(now(longest.seen("id-A")), "a MAX_TTL id is seen");
}

// ---------------------------------------------------------------- bounds

/// Counts the heap bytes each thread holds, so a test measures its own
/// store while the other tests of this binary run beside it.
struct PerThreadCounting;

thread_local! {
    static HELD_BYTES: Cell<isize> = const { Cell::new(0) };
}

fn count(delta: isize) {
    // `try_with`: the allocator also runs while a thread's locals are torn down.
    let _ = HELD_BYTES.try_with(|held| held.set(held.get() + delta));
}

// SAFETY: every call is forwarded unchanged to the system allocator; the
// counting only touches a const-initialised thread local, which never allocates.
unsafe impl GlobalAlloc for PerThreadCounting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size() as isize);
        // SAFETY: the caller's layout, passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count(-(layout.size() as isize));
        // SAFETY: `ptr` came from `alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: PerThreadCounting = PerThreadCounting;

/// What `build` leaves on this thread's heap, with the value it built.
fn heap_bytes_kept_by<T>(build: impl FnOnce() -> T) -> (T, usize) {
    let before = HELD_BYTES.with(Cell::get);
    let value = build();
    let kept = HELD_BYTES.with(Cell::get) - before;
    (value, usize::try_from(kept).unwrap_or(0))
}

/// The in-memory store answers at once; polling on this thread keeps every
/// allocation on this thread's count.
fn now<T>(future: StoreFuture<'_, T>) -> T {
    match pin!(future).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(result) => result.expect("the in-memory store does not fail"),
        Poll::Pending => panic!("the in-memory store answered later"),
    }
}

fn uuid_id(n: usize) -> String {
    format!("f1e2d3c4-b5a6-4789-90ab-{n:012x}")
}

fn text_id(n: usize) -> String {
    format!("order-{n}")
}

const CAPACITY: usize = 1000;
/// Pairs of the churn tests in release builds; fewer in debug, to run in seconds.
const CHURN_PAIRS: usize = if cfg!(debug_assertions) {
    200_000
} else {
    3_000_000
};

/// One pinned id, then many (remember, forget) pairs.
/// The store's memory afterwards must stay within twice what the same
/// store needs to hold `CAPACITY` ids.
fn churn_behind_a_pinned_id_stays_within_twice_the_memory_at_capacity(
    what: &str,
    config: fn() -> InMemoryStoreBuilder,
    id: fn(usize) -> String,
) {
    let (full, at_capacity) = heap_bytes_kept_by(|| {
        let store = config().build().expect("a valid configuration");
        for n in 0..CAPACITY {
            now(store.remember(&id(n)));
        }
        store
    });
    assert_eq!(full.len(), CAPACITY);
    drop(full);

    let pinned = id(0);
    let (churned, after_churn) = heap_bytes_kept_by(|| {
        let store = config().build().expect("a valid configuration");
        now(store.remember(&pinned));
        for n in 1..=CHURN_PAIRS {
            let id = id(n);
            now(store.remember(&id));
            now(store.forget(&id));
        }
        store
    });
    assert!(now(churned.seen(&pinned)), "{what}: the pinned id was lost");
    assert_eq!(churned.len(), 1, "{what}");
    println!(
        "{what}: {at_capacity} heap bytes holding {CAPACITY} ids; {after_churn} after \
         {CHURN_PAIRS} remember/forget pairs behind one pinned id"
    );
    assert!(
        after_churn <= 2 * at_capacity,
        "{what}: {after_churn} heap bytes after {CHURN_PAIRS} pairs, \
         more than twice the {at_capacity} at capacity"
    );
}

fn with_capacity() -> InMemoryStoreBuilder {
    InMemoryStore::builder().capacity(CAPACITY)
}

fn with_capacity_and_ttl() -> InMemoryStoreBuilder {
    with_capacity().ttl(Duration::from_secs(24 * 3600))
}

/// One shard, so that the pinned id stands in front of all the churn (with
/// the default 16 shards, the other 15 would shed theirs as they went).
fn with_ttl() -> InMemoryStoreBuilder {
    InMemoryStore::builder()
        .ttl(Duration::from_secs(24 * 3600))
        .shards(1)
}

#[test]
fn churn_with_a_capacity_keeps_memory_bounded_uuid_ids() {
    churn_behind_a_pinned_id_stays_within_twice_the_memory_at_capacity(
        "capacity, UUID ids",
        with_capacity,
        uuid_id,
    );
}

#[test]
fn churn_with_a_capacity_keeps_memory_bounded_text_ids() {
    churn_behind_a_pinned_id_stays_within_twice_the_memory_at_capacity(
        "capacity, text ids",
        with_capacity,
        text_id,
    );
}

#[test]
fn churn_with_a_capacity_and_a_ttl_keeps_memory_bounded() {
    for (what, id) in [
        (
            "capacity + 24 h TTL, UUID ids",
            uuid_id as fn(usize) -> String,
        ),
        ("capacity + 24 h TTL, text ids", text_id),
    ] {
        churn_behind_a_pinned_id_stays_within_twice_the_memory_at_capacity(
            what,
            with_capacity_and_ttl,
            id,
        );
    }
}

#[test]
fn churn_with_a_ttl_keeps_memory_bounded() {
    for (what, id) in [
        ("24 h TTL, UUID ids", uuid_id as fn(usize) -> String),
        ("24 h TTL, text ids", text_id),
    ] {
        churn_behind_a_pinned_id_stays_within_twice_the_memory_at_capacity(what, with_ttl, id);
    }
}

/// Mixes UUID and text ids, which live in different tables.
fn mixed_id(n: usize) -> String {
    if n.is_multiple_of(2) {
        uuid_id(n)
    } else {
        text_id(n)
    }
}

#[test]
fn an_explicit_shard_count_does_not_multiply_the_capacity() {
    for (capacity, shards) in [(1, 1024), (10, 64), (3, 4), (100, 1024), (1000, 64)] {
        let store = InMemoryStore::builder()
            .capacity(capacity)
            .shards(shards)
            .build()
            .expect("no TTL to refuse");
        for n in 0..capacity * 20 {
            now(store.remember(&mixed_id(n)));
            assert!(
                store.len() <= capacity,
                "capacity({capacity}).shards({shards}) holds {} ids",
                store.len()
            );
            assert!(now(store.seen(&mixed_id(n))), "the newest id is kept");
        }
        // Each shard holds its share, and the shares add up to the capacity.
        assert_eq!(
            store.len(),
            capacity,
            "capacity({capacity}).shards({shards})"
        );
    }
}

#[test]
fn one_shard_with_a_capacity_evicts_exactly_the_oldest() {
    let store = InMemoryStore::builder()
        .capacity(5)
        .shards(1)
        .build()
        .expect("no TTL to refuse");
    for n in 0..12 {
        now(store.remember(&mixed_id(n)));
    }
    for n in 0..12 {
        assert_eq!(now(store.seen(&mixed_id(n))), n >= 7, "id {n}");
    }
}

#[test]
fn seen_now_answers_at_once_what_seen_answers_for_uuid_and_text_ids() {
    let store = InMemoryStore::new();
    let dynamic: &dyn Store = &store;
    for id in [uuid_id(1), text_id(1)] {
        assert!(matches!(store.seen_now(&id), Some(Ok(false))), "{id}");
        now(store.remember(&id));
        assert!(matches!(store.seen_now(&id), Some(Ok(true))), "{id}");
        assert!(matches!(dynamic.seen_now(&id), Some(Ok(true))), "{id}");
        assert!(now(store.seen(&id)), "{id}");
        now(store.forget(&id));
        assert!(matches!(store.seen_now(&id), Some(Ok(false))), "{id}");
        assert!(!now(store.seen(&id)), "{id}");
    }
}

#[test]
fn seen_now_does_not_see_an_expired_id() {
    let store = InMemoryStore::builder()
        .ttl(Duration::from_millis(1))
        .build()
        .expect("1 ms is a valid TTL");
    let id = uuid_id(2);
    now(store.remember(&id));
    std::thread::sleep(Duration::from_millis(5));
    assert!(matches!(store.seen_now(&id), Some(Ok(false))));
    assert!(!now(store.seen(&id)));
}
