//! A delivery hands its handler slot on when its guard marks the run: on a
//! real Redis queue, the next delivery asks its store while the last mark
//! is on its way; handler bodies still never outnumber the slots, and a
//! handler that runs a second guard after its mark takes a slot back
//! without waiting on the deliveries queued behind it.
//!
//! Environment: `BABEL_IDEM_REDIS_URL`; without it a test prints
//! `skipped:`, and with `BABEL_IDEM_REQUIRE_SERVERS=1` it fails instead.
#![cfg(all(feature = "redis-transport", feature = "redis", feature = "sqlite"))]

mod consumer_support;
mod store_contract;
mod support;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use babel_idem::store::StoreFuture;
use babel_idem::{Consumer, Envelope, InMemoryStore, Router, Store, StoreError, run_once, urn};
use store_contract::servers::{REDIS_URL, server_url};
use tokio::sync::Notify;

use consumer_support::redis_queue::Queue;
use consumer_support::{PATIENCE, QUIET, envelope_with_id, run_until_idle};

/// What a [`Watched`] store saw, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Call {
    Seen(String),
    RememberSent(String),
    RememberDone(String),
}

/// An in-memory seen-set that logs its calls, and holds each `remember`
/// until another id's `seen` arrives (or, so that a consumer that never
/// sends one still ends, a second has passed).
#[derive(Clone)]
struct Watched {
    inner: Arc<InMemoryStore>,
    log: Arc<Mutex<Vec<Call>>>,
    asked: Arc<Notify>,
}

impl Watched {
    fn new() -> Self {
        Watched {
            inner: Arc::new(InMemoryStore::new()),
            log: Arc::default(),
            asked: Arc::default(),
        }
    }

    fn log(&self) -> Vec<Call> {
        self.log.lock().unwrap().clone()
    }
}

impl Store for Watched {
    fn seen<'a>(&'a self, id: &'a str) -> StoreFuture<'a, bool> {
        self.log.lock().unwrap().push(Call::Seen(id.to_owned()));
        self.asked.notify_waiters();
        self.inner.seen(id)
    }

    fn remember<'a>(&'a self, id: &'a str) -> StoreFuture<'a, ()> {
        StoreFuture::new(async move {
            let asked = self.asked.notified();
            self.log
                .lock()
                .unwrap()
                .push(Call::RememberSent(id.to_owned()));
            let _ = tokio::time::timeout(Duration::from_secs(1), asked).await;
            self.inner.remember(id).await?;
            self.log
                .lock()
                .unwrap()
                .push(Call::RememberDone(id.to_owned()));
            Ok(())
        })
    }

    fn forget<'a>(&'a self, id: &'a str) -> StoreFuture<'a, ()> {
        self.inner.forget(id)
    }
}

/// Counts the handler bodies running at once, and the most ever.
#[derive(Clone, Default)]
struct Bodies {
    now: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
    ran: Arc<AtomicUsize>,
}

impl Bodies {
    async fn run(&self, work: Duration) -> Result<(), StoreError> {
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(work).await;
        self.now.fetch_sub(1, Ordering::SeqCst);
        self.ran.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// One handler's future.
type Handled = Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send>>;

fn router(route: impl Fn(Envelope) -> Handled + Send + Sync + 'static) -> Router {
    Router::builder()
        .route(urn!("urn:babel:interop:created"), move |env: Envelope| {
            route(env)
        })
        .build()
        .unwrap()
}

/// A queue of this test's own holding one envelope per id, in order;
/// `None` after a `skipped:` line.
async fn queue_of(test: &str, ids: &[&str]) -> Option<Queue> {
    let url = server_url(REDIS_URL, test)?;
    let queue = Queue::new(&url);
    let transport = queue.transport().await;
    for (n, id) in ids.iter().enumerate() {
        let body = envelope_with_id(id, &queue.name, n as u64).to_vec();
        transport.publish(&queue.name, &body).await.unwrap();
    }
    Some(queue)
}

/// A handler that runs two guards in turn over the same envelope, each
/// body taking `work`: the first on a [`Watched`] store, the second on an
/// in-memory one.
fn two_guards(bodies: &Bodies, work: Duration) -> impl Fn(Envelope) -> Handled + use<> {
    let (first, second) = (Watched::new(), Arc::new(InMemoryStore::new()));
    let bodies = bodies.clone();
    move |env: Envelope| -> Handled {
        let (first, second, bodies) = (first.clone(), second.clone(), bodies.clone());
        Box::pin(async move {
            run_once(first, &env, bodies.run(work)).await?;
            run_once(second, &env, bodies.run(work)).await
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_concurrency_one_the_next_delivery_asks_its_store_while_the_last_mark_is_on_its_way() {
    let ids = ["handoff-1", "handoff-2", "handoff-3", "handoff-4"];
    let Some(queue) = queue_of(
        "at_concurrency_one_the_next_delivery_asks_its_store_while_the_last_mark_is_on_its_way",
        &ids,
    )
    .await
    else {
        return;
    };

    let store = Watched::new();
    let bodies = Bodies::default();
    let route = {
        let (store, bodies) = (store.clone(), bodies.clone());
        move |env: Envelope| -> Handled {
            let (store, bodies) = (store.clone(), bodies.clone());
            Box::pin(async move { run_once(store, &env, bodies.run(Duration::ZERO)).await })
        }
    };
    let consumer = Consumer::builder(router(route), queue.transport().await, &queue.name)
        .concurrency(1)
        .build()
        .unwrap();
    let report = run_until_idle(&consumer, QUIET).await;
    assert_eq!(report.acked, 4, "{report:?}");
    assert_eq!(bodies.ran.load(Ordering::SeqCst), 4);
    assert_eq!(bodies.most.load(Ordering::SeqCst), 1, "one body at a time");

    // Each next id's `seen` came between the last id's mark being sent and
    // its answer.
    let log = store.log();
    for pair in ids.windows(2) {
        let at = |call: Call| {
            log.iter()
                .position(|c| *c == call)
                .unwrap_or_else(|| panic!("{call:?} not in {log:?}"))
        };
        let sent = at(Call::RememberSent(pair[0].to_owned()));
        let asked = at(Call::Seen(pair[1].to_owned()));
        let done = at(Call::RememberDone(pair[0].to_owned()));
        assert!(
            sent < asked && asked < done,
            "{} was asked about while {}'s mark was on its way: {log:?}",
            pair[1],
            pair[0]
        );
    }
    assert!(queue.drained().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_guard_after_the_first_marked_waits_for_a_slot_and_never_runs_beside_the_next_body()
 {
    let ids: Vec<String> = (0..6).map(|n| format!("two-guards-{n}")).collect();
    let Some(queue) = queue_of(
        "a_second_guard_after_the_first_marked_waits_for_a_slot_and_never_runs_beside_the_next_body",
        &ids.iter().map(String::as_str).collect::<Vec<_>>(),
    )
    .await
    else {
        return;
    };

    let bodies = Bodies::default();
    let route = two_guards(&bodies, Duration::from_millis(20));
    let consumer = Consumer::builder(router(route), queue.transport().await, &queue.name)
        .concurrency(1)
        .build()
        .unwrap();
    let report = run_until_idle(&consumer, QUIET).await;
    assert_eq!(report.acked, 6, "{report:?}");
    assert_eq!(
        bodies.ran.load(Ordering::SeqCst),
        12,
        "both guards ran, each id"
    );
    assert_eq!(
        bodies.most.load(Ordering::SeqCst),
        1,
        "at concurrency 1 no body ran beside another"
    );
    assert!(queue.drained().await);
}

/// Copies of one id queued right behind a delivery whose handler runs a
/// second guard after its first marks (the mark held up for a second):
/// more copies than the consumer has places for deliveries held back (16
/// at concurrency 1). The copies waiting hold no slot, and those beyond the
/// places go back to the queue unattempted, so the first still gets a slot
/// back for its second guard; each guard ran its body once, and every copy
/// was skipped in the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_of_an_id_waiting_behind_a_two_guard_handler_never_keep_it_from_a_slot() {
    let Some(queue) = queue_of(
        "copies_of_an_id_waiting_behind_a_two_guard_handler_never_keep_it_from_a_slot",
        &["same-id"; 24],
    )
    .await
    else {
        return;
    };

    let bodies = Bodies::default();
    let route = two_guards(&bodies, Duration::ZERO);
    // A stall would end at the timeout, with a copy handed back unhandled.
    let consumer = Consumer::builder(router(route), queue.transport().await, &queue.name)
        .concurrency(1)
        .delivery_timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let report = tokio::time::timeout(PATIENCE, run_until_idle(&consumer, QUIET))
        .await
        .expect("the consumer drains the queue");
    assert_eq!(report.timed_out, 0, "{report:?}");
    assert_eq!(
        report.released, report.id_busy,
        "only copies beyond the places went back: {report:?}"
    );
    assert_eq!(report.acked, 24, "{report:?}");
    assert_eq!(
        bodies.ran.load(Ordering::SeqCst),
        2,
        "each guard ran its body once"
    );
    assert!(
        report.waited_for_id > 0,
        "copies waited for the id: {report:?}"
    );
    assert!(queue.drained().await);
}
