//! A `Consumer` that holds many deliveries sends its guards' store calls
//! in batches by default, on a real Redis: the calls made (counted by a
//! wrapper around `RedisStore`) fall, the decisions do not change, and
//! `batch_store_calls(false)` or a concurrency of 1 keeps one call per
//! message.
//!
//! Environment: `BABEL_IDEM_REDIS_URL`; without it a test prints
//! `skipped:`, and with `BABEL_IDEM_REQUIRE_SERVERS=1` it fails instead.
#![cfg(all(feature = "redis-transport", feature = "redis", feature = "sqlite"))]

mod consumer_support;
mod store_contract;
mod support;

use std::sync::Arc;
use std::time::Duration;

use babel_idem::consumer::ConsumerReport;
use babel_idem::store::{Batched, RedisStore};
use babel_idem::{Consumer, InMemoryStore, Store};
use store_contract::servers::{REDIS_URL, server_url, unique_suffix};
use support::{CountingStore, StoreCalls};

use consumer_support::redis_queue::Queue;
use consumer_support::{QUIET, RunCounts, counting_router, run_until_idle, twice_in_a_row};

const IDS: u64 = 1000;
const TWICE: u64 = 200;

/// A seen-set of this test's own on the shared Redis, deleted on drop.
struct SeenSet {
    url: String,
    prefix: String,
}

impl SeenSet {
    fn new(url: &str) -> Self {
        SeenSet {
            url: url.to_owned(),
            prefix: format!("bi-batching-{}:", unique_suffix()),
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

/// Publishes [`twice_in_a_row`] (`IDS` ids, `TWICE` of them twice) and
/// consumes it at `concurrency` through `store`: each id ran once and each
/// second copy was skipped, whatever the batching.
async fn consume<S: Store + 'static>(
    url: &str,
    store: Arc<S>,
    concurrency: usize,
    batch: bool,
) -> ConsumerReport {
    let queue = Queue::new(url);
    let transport = queue.transport().await;
    for body in twice_in_a_row(&queue.name, "batching", IDS, TWICE) {
        transport.publish(&queue.name, &body).await.unwrap();
    }
    let counts = RunCounts::default();
    let router = counting_router(store, counts.clone(), Duration::from_millis(1));
    let consumer = Consumer::builder(router, transport, &queue.name)
        .concurrency(concurrency)
        .batch_store_calls(batch)
        .build()
        .unwrap();
    assert_eq!(consumer.batches_store_calls(), batch && concurrency > 1);
    let report = run_until_idle(&consumer, QUIET).await;
    let twice_ran = counts
        .ran
        .lock()
        .unwrap()
        .values()
        .filter(|&&n| n > 1)
        .count();
    assert_eq!(twice_ran, 0, "no id ran twice: {report:?}");
    assert_eq!(counts.ran(), IDS, "{report:?}");
    assert_eq!(counts.skipped(), TWICE, "{report:?}");
    assert_eq!(report.acked, IDS + TWICE, "{report:?}");
    assert!(queue.drained().await);
    report
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_holding_many_deliveries_batches_its_guards_store_calls_by_default() {
    const TEST: &str = "a_consumer_holding_many_deliveries_batches_by_default";
    let Some(url) = server_url(REDIS_URL, TEST) else {
        return;
    };
    let seen_set = SeenSet::new(&url);
    let store = Arc::new(CountingStore::new(seen_set.store()));
    consume(&url, Arc::clone(&store), 64, true).await;

    let calls = &store.calls;
    let deliveries = IDS + TWICE;
    // Every delivery still asks about its id once, and every id that ran is
    // remembered once: batching changes the calls, not what is asked.
    assert_eq!(StoreCalls::get(&calls.seen_ids), deliveries);
    assert_eq!(StoreCalls::get(&calls.remember_ids), IDS);
    assert!(
        StoreCalls::get(&calls.seen_many) > 0 && StoreCalls::get(&calls.remember_many) > 0,
        "calls met in batches"
    );
    assert!(
        calls.seen_calls() * 2 <= deliveries && calls.remember_calls() * 2 <= IDS,
        "at most one round trip per two messages: {} seen calls and {} remember calls for {deliveries} deliveries",
        calls.seen_calls(),
        calls.remember_calls(),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_store_calls_false_keeps_one_store_call_per_message() {
    const TEST: &str = "batch_store_calls_false_keeps_one_call_per_message";
    let Some(url) = server_url(REDIS_URL, TEST) else {
        return;
    };
    let seen_set = SeenSet::new(&url);
    let store = Arc::new(CountingStore::new(seen_set.store()));
    consume(&url, Arc::clone(&store), 64, false).await;

    let calls = &store.calls;
    assert_eq!(StoreCalls::get(&calls.seen_many), 0);
    assert_eq!(StoreCalls::get(&calls.remember_many), 0);
    assert_eq!(StoreCalls::get(&calls.seen), IDS + TWICE);
    assert_eq!(StoreCalls::get(&calls.remember), IDS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_of_concurrency_one_makes_single_calls() {
    const TEST: &str = "a_consumer_of_concurrency_one_makes_single_calls";
    let Some(url) = server_url(REDIS_URL, TEST) else {
        return;
    };
    let seen_set = SeenSet::new(&url);
    let store = Arc::new(CountingStore::new(seen_set.store()));
    consume(&url, Arc::clone(&store), 1, true).await;

    let calls = &store.calls;
    assert_eq!(StoreCalls::get(&calls.seen_many), 0);
    assert_eq!(StoreCalls::get(&calls.seen), IDS + TWICE);
    assert_eq!(StoreCalls::get(&calls.remember), IDS);
}

/// A store that does not batch (the in-memory one), and one already in
/// `Batched`, are called as they were: the consumer adds no batching.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stores_that_do_not_batch_or_batch_already_are_called_as_before() {
    const TEST: &str = "stores_that_do_not_batch_are_called_as_before";
    let Some(url) = server_url(REDIS_URL, TEST) else {
        return;
    };
    let memory = Arc::new(CountingStore::new(InMemoryStore::new()));
    consume(&url, Arc::clone(&memory), 64, true).await;
    assert_eq!(StoreCalls::get(&memory.calls.seen_many), 0);
    assert_eq!(StoreCalls::get(&memory.calls.seen), IDS + TWICE);

    // `Batched` does the batching itself, once: the store inside sees its
    // batches, and nothing in front of it groups the calls a second time.
    let seen_set = SeenSet::new(&url);
    let inner = Arc::new(CountingStore::new(seen_set.store()));
    let batched = Arc::new(CountingStore::new(Batched::new(Arc::clone(&inner))));
    assert!(batched.batch_target().is_none());
    consume(&url, Arc::clone(&batched), 64, true).await;
    assert_eq!(StoreCalls::get(&batched.calls.seen_many), 0);
    assert_eq!(StoreCalls::get(&batched.calls.seen), IDS + TWICE);
    assert!(StoreCalls::get(&inner.calls.seen_many) > 0);
    assert_eq!(StoreCalls::get(&inner.calls.seen_ids), IDS + TWICE);
}
