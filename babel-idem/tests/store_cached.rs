//! `store::Cached`: positive answers kept in memory, for at most the window
//! and the store's TTL, dropped by a local `forget`, bounded in number; and
//! what it saves through the guard and a consumer on a real Redis (ids sent
//! to the store, counted by a wrapper around `RedisStore`).
//!
//! Environment: `BABEL_IDEM_REDIS_URL`; without it the Redis tests print
//! `skipped:`, and with `BABEL_IDEM_REQUIRE_SERVERS=1` they fail instead.
#![cfg(all(feature = "redis-transport", feature = "redis", feature = "sqlite"))]

mod consumer_support;
mod store_contract;
mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use babel_idem::store::{Batched, Cached, Claim, ClaimToken, RedisStore};
use babel_idem::{ClaimStore, Consumer, Envelope, InMemoryStore, Store, StoreError, run_once};
use serde_json::json;
use store_contract::servers::{REDIS_URL, server_url, unique_suffix};
use support::{CountingStore, StoreCalls};

use consumer_support::redis_queue::Queue;
use consumer_support::{QUIET, RunCounts, counting_router, run_until_idle, twice_in_a_row};

fn counted_memory() -> Cached<Arc<CountingStore<InMemoryStore>>> {
    Cached::new(Arc::new(CountingStore::new(InMemoryStore::new())))
}

#[tokio::test]
async fn only_positive_answers_are_kept() {
    let store = counted_memory();
    let calls = Arc::clone(&store.get_ref().calls);
    assert!(!store.seen("id-A").await.unwrap());
    assert!(!store.is_kept("id-A"), "a negative answer is not kept");
    assert!(!store.seen("id-A").await.unwrap());
    assert_eq!(
        StoreCalls::get(&calls.seen),
        2,
        "each negative asks the store"
    );

    // Done elsewhere: the store answers `true`, and that answer is kept.
    store.get_ref().inner.remember("id-A").await.unwrap();
    assert!(store.seen("id-A").await.unwrap());
    assert!(store.is_kept("id-A"));
    assert!(store.seen("id-A").await.unwrap());
    assert!(matches!(store.seen_now("id-A"), Some(Ok(true))));
    assert_eq!(
        StoreCalls::get(&calls.seen),
        3,
        "the kept answer asks nothing"
    );

    // A batch asks only about the ids not kept, and keeps its positives.
    store.get_ref().inner.remember("id-B").await.unwrap();
    let answers = store.seen_many(&["id-A", "id-B", "id-C"]).await.unwrap();
    assert_eq!(answers, [true, true, false]);
    assert_eq!(StoreCalls::get(&calls.seen_ids), 3 + 2);
    assert!(store.is_kept("id-B") && !store.is_kept("id-C"));
    assert_eq!(
        store.seen_many(&["id-A", "id-B"]).await.unwrap(),
        [true, true]
    );
    assert_eq!(StoreCalls::get(&calls.seen_many), 1, "all kept: no call");
}

#[tokio::test]
async fn a_failed_remember_keeps_nothing() {
    let store = Cached::new(support::FailingStore::new(support::Failure::Remember));
    store.remember("id-A").await.unwrap_err();
    assert!(!store.is_kept("id-A"));
}

#[tokio::test]
async fn a_kept_answer_expires_at_the_window() {
    let store = Cached::builder(Arc::new(CountingStore::new(InMemoryStore::new())))
        .window(Duration::from_millis(200))
        .build();
    let calls = Arc::clone(&store.get_ref().calls);
    store.remember("id-A").await.unwrap();
    assert!(store.is_kept("id-A"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!store.is_kept("id-A"), "expired at the window");
    // Asked again, and kept again from the store's answer.
    assert!(store.seen("id-A").await.unwrap());
    assert_eq!(StoreCalls::get(&calls.seen), 1);
    assert!(store.is_kept("id-A"));
}

#[tokio::test]
async fn a_kept_answer_never_outlives_the_stores_ttl() {
    let ttl = Duration::from_millis(200);
    let store = Cached::builder(InMemoryStore::builder().ttl(ttl).build().unwrap())
        .window(Duration::from_secs(60))
        .ttl(ttl)
        .build();
    assert_eq!(store.lifetime(), ttl);
    store.remember("id-A").await.unwrap();
    assert!(store.seen("id-A").await.unwrap());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!store.is_kept("id-A"));
    assert!(
        !store.seen("id-A").await.unwrap(),
        "expired with the store's mark"
    );
}

#[tokio::test]
async fn a_forget_through_the_wrapper_is_seen_at_once() {
    let store = counted_memory();
    store.remember("id-A").await.unwrap();
    assert!(store.is_kept("id-A"));
    store.forget("id-A").await.unwrap();
    assert!(!store.is_kept("id-A"));
    assert!(!store.seen("id-A").await.unwrap());
}

#[tokio::test]
async fn the_set_is_bounded_by_its_capacity_oldest_first() {
    let store = Cached::builder(InMemoryStore::new()).capacity(100).build();
    for n in 0..1000 {
        store.remember(&format!("id-{n}")).await.unwrap();
    }
    assert_eq!(store.kept(), 100);
    assert!(!store.is_kept("id-0") && !store.is_kept("id-899"));
    assert!(store.is_kept("id-900") && store.is_kept("id-999"));
    // Every id is still answered, by the store.
    assert!(store.seen("id-0").await.unwrap());

    let nothing = Cached::builder(InMemoryStore::new()).capacity(0).build();
    nothing.remember("id-A").await.unwrap();
    assert_eq!(nothing.kept(), 0);
    let long = "x".repeat(200);
    store.remember(&long).await.unwrap();
    assert!(
        !store.is_kept(&long),
        "an id longer than a slot is not kept"
    );
    assert!(store.seen(&long).await.unwrap());
}

#[tokio::test]
async fn a_claim_of_a_kept_id_is_done_without_asking_and_a_commit_keeps_its_id() {
    let store = Cached::new(InMemoryStore::new());
    let lease = Duration::from_secs(30);
    let owner = ClaimToken::random();
    assert!(matches!(
        store.claim("id-A", owner, lease).await.unwrap(),
        Claim::Won { .. }
    ));
    assert!(!store.is_kept("id-A"), "a claim won is not done");
    assert!(store.commit("id-A", owner).await.unwrap());
    assert!(store.is_kept("id-A"));
    // Forgotten in the store behind the wrapper's back: the kept answer
    // still says done, for the window.
    store.get_ref().forget("id-A").await.unwrap();
    assert_eq!(
        store
            .claim("id-A", ClaimToken::random(), lease)
            .await
            .unwrap(),
        Claim::Done
    );
    let batch = [
        ("id-A", ClaimToken::random()),
        ("id-B", ClaimToken::random()),
    ];
    let answers = store.claim_many(&batch, lease).await.unwrap();
    assert_eq!(answers[0], Claim::Done);
    assert!(matches!(answers[1], Claim::Won { .. }));
}

/// A Redis seen-set of this test's own, deleted on drop.
struct SeenSet {
    url: String,
    prefix: String,
}

impl SeenSet {
    fn new(url: &str) -> Self {
        SeenSet {
            url: url.to_owned(),
            prefix: format!("bi-cached-{}:", unique_suffix()),
        }
    }

    fn store(&self) -> RedisStore {
        RedisStore::builder()
            .prefix(self.prefix.clone())
            .connect_lazy(&self.url)
            .unwrap()
    }
}

impl Drop for SeenSet {
    fn drop(&mut self) {
        consumer_support::delete_keys(&self.url, &[&format!("{}*", self.prefix)]);
    }
}

/// A `forget` made by another process (here, another `RedisStore` on the
/// same keys, as the CLI's `forget` is) is not seen within the window, and
/// is once the window has passed.
#[tokio::test]
async fn a_forget_made_elsewhere_is_seen_once_the_window_has_passed() {
    const TEST: &str = "a_forget_made_elsewhere_is_seen_after_the_window";
    let Some(url) = server_url(REDIS_URL, TEST) else {
        return;
    };
    let seen_set = SeenSet::new(&url);
    let store = Cached::builder(seen_set.store())
        .window(Duration::from_millis(500))
        .build();
    store.remember("id-A").await.unwrap();
    seen_set.store().forget("id-A").await.unwrap();
    assert!(store.seen("id-A").await.unwrap(), "within the window: kept");
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(
        !store.seen("id-A").await.unwrap(),
        "after it: the store's answer"
    );
}

/// Through the guard on Redis: a redelivery of an id this process ran is
/// skipped with nothing sent to the store.
#[tokio::test]
async fn through_the_guard_a_redelivery_is_skipped_without_asking_redis() {
    const TEST: &str = "through_the_guard_a_redelivery_is_skipped_locally";
    let Some(url) = server_url(REDIS_URL, TEST) else {
        return;
    };
    let seen_set = SeenSet::new(&url);
    let store = Cached::new(CountingStore::new(seen_set.store()));
    let runs = AtomicU32::new(0);
    let env = Envelope::new("urn:babel:orders:created", json!({ "order": 1 }));
    for _ in 0..3 {
        run_once(&store, &env, async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<(), StoreError>(())
        })
        .await
        .unwrap();
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let calls = &store.get_ref().calls;
    assert_eq!(StoreCalls::get(&calls.seen_ids), 1, "only the first asked");
    assert_eq!(StoreCalls::get(&calls.remember_ids), 1);
    // The mark is Redis's own: a process without the set sees it.
    let id = env.meta.id.as_deref().unwrap();
    assert!(seen_set.store().seen(id).await.unwrap());
}

/// The consumer scenario of the worker example (1,000 ids, 300 of them
/// published twice in a row) on Redis, with and without `Cached`: the
/// copies, each handled after its original, are answered locally, so the
/// ids sent to the store fall from one per delivery to one per id, with
/// the same decisions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_on_redis_sends_only_first_deliveries_to_the_store_with_cached() {
    const TEST: &str = "a_consumer_on_redis_sends_fewer_ids_with_cached";
    let Some(url) = server_url(REDIS_URL, TEST) else {
        return;
    };
    const IDS: u64 = 1000;
    const TWICE: u64 = 300;
    let mut sent = Vec::new();
    for cached in [false, true] {
        let seen_set = SeenSet::new(&url);
        let counted = Arc::new(CountingStore::new(seen_set.store()));
        let counts = RunCounts::default();
        let queue = Queue::new(&url);
        let transport = queue.transport().await;
        for body in twice_in_a_row(&queue.name, "cached", IDS, TWICE) {
            transport.publish(&queue.name, &body).await.unwrap();
        }
        let router = match cached {
            true => counting_router(
                Cached::new(Arc::clone(&counted)),
                counts.clone(),
                Duration::from_millis(1),
            ),
            false => counting_router(
                Arc::clone(&counted),
                counts.clone(),
                Duration::from_millis(1),
            ),
        };
        let consumer = Consumer::builder(router, transport, &queue.name)
            .concurrency(64)
            .build()
            .unwrap();
        let report = run_until_idle(&consumer, QUIET).await;
        assert_eq!(counts.ran(), IDS, "{report:?}");
        assert_eq!(counts.skipped(), TWICE, "{report:?}");
        assert!(queue.drained().await);
        sent.push(StoreCalls::get(&counted.calls.seen_ids));
    }
    assert_eq!(
        sent,
        [IDS + TWICE, IDS],
        "ids sent to Redis in `seen`, without and with Cached"
    );
}

/// `Cached` in front of `Batched`: the kept ids are answered here, the
/// rest meet in batches behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cached_composes_with_batched() {
    const TEST: &str = "cached_composes_with_batched";
    let Some(url) = server_url(REDIS_URL, TEST) else {
        return;
    };
    let seen_set = SeenSet::new(&url);
    let counted = Arc::new(CountingStore::new(seen_set.store()));
    let store = Cached::new(Batched::new(Arc::clone(&counted)));
    let envs: Vec<Envelope> = (0..64)
        .map(|n| Envelope::new("urn:babel:orders:created", json!({ "order": n })))
        .collect();
    for _round in 0..2 {
        let mut deliveries = tokio::task::JoinSet::new();
        for env in envs.clone() {
            let store = store.clone();
            deliveries.spawn(async move {
                run_once(&store, &env, async { Ok::<(), StoreError>(()) }).await
            });
        }
        while let Some(done) = deliveries.join_next().await {
            done.unwrap().unwrap();
        }
    }
    let calls = &counted.calls;
    assert_eq!(
        StoreCalls::get(&calls.seen_ids),
        64,
        "the second round asked nothing"
    );
    assert_eq!(StoreCalls::get(&calls.remember_ids), 64);
    assert!(
        StoreCalls::get(&calls.seen_many) > 0,
        "the first round met in batches"
    );
}
