//! Every row of the contract table (see `babel_idem::guide::modes`), driven through `guard`,
//! `Guard` and `wrap` over a real `InMemoryStore`.

#[path = "../babel-idem/tests/support/mod.rs"]
mod support;

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use babel_idem::store::{StoreFuture, StoreOperation};
use babel_idem::{
    Envelope, Guard, InMemoryStore, OnRememberFailure, Store, StoreError, run_once, wrap,
};
use serde_json::json;
use support::{FailingStore, Failure};

/// Counts heap allocations made by the current thread, so a test can assert
/// that a code path makes none (other tests' threads do not count).
struct CountingAllocator;

thread_local! {
    static ALLOCATIONS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

// SAFETY: every call is forwarded unchanged to the system allocator; the
// counter is a const-initialised thread local, which never allocates.
unsafe impl std::alloc::GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|count| count.set(count.get() + 1));
        // SAFETY: forwarded with the caller's layout.
        unsafe { std::alloc::System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        // SAFETY: `ptr` came from `alloc` with this layout.
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static COUNTING: CountingAllocator = CountingAllocator;

fn allocations_on_this_thread() -> u64 {
    ALLOCATIONS.with(|count| count.get())
}

#[derive(Debug)]
enum HandlerError {
    Declined,
    Store(StoreError),
}

impl From<StoreError> for HandlerError {
    fn from(error: StoreError) -> Self {
        HandlerError::Store(error)
    }
}

/// A handler that counts its runs and succeeds.
async fn counted(runs: &AtomicU32) -> Result<(), HandlerError> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

fn order(id: &str) -> Envelope {
    Envelope::new("urn:babel:orders:created", json!({"order_id": 1})).with_id(id)
}

#[tokio::test]
async fn a_message_without_id_runs_every_time_and_is_never_remembered() {
    let store = InMemoryStore::new();
    let runs = AtomicU32::new(0);
    for env in [order(""), order("").without_id(), order("").without_id()] {
        run_once(&store, &env, counted(&runs)).await.unwrap();
    }
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    assert!(store.is_empty());
}

#[tokio::test]
async fn a_seen_id_is_skipped_and_acked() {
    let store = InMemoryStore::new();
    store.remember("id-A").await.unwrap();
    let result = run_once(&store, &order("id-A"), async {
        panic!("a duplicate must not run");
        #[allow(unreachable_code)]
        Ok::<(), HandlerError>(())
    })
    .await;
    assert!(result.is_ok());
}

#[tokio::test]
async fn a_failing_seen_returns_the_store_error_without_running() {
    let store = FailingStore::new(Failure::Seen);
    let result = run_once(&store, &order("id-A"), async {
        panic!("must not run when the seen-set cannot answer");
        #[allow(unreachable_code)]
        Ok::<(), HandlerError>(())
    })
    .await;
    match result {
        Err(HandlerError::Store(error)) => assert_eq!(error.operation(), StoreOperation::Seen),
        other => panic!("expected the seen error, got {other:?}"),
    }
}

#[tokio::test]
async fn a_handler_error_leaves_the_id_unmarked_so_a_redelivery_runs() {
    let store = InMemoryStore::new();
    let env = order("id-A");
    let result = run_once(&store, &env, async { Err::<(), _>(HandlerError::Declined) }).await;
    assert!(matches!(result, Err(HandlerError::Declined)));
    assert!(!store.seen("id-A").await.unwrap());

    let runs = AtomicU32::new(0);
    run_once(&store, &env, counted(&runs)).await.unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert!(store.seen("id-A").await.unwrap());
}

#[tokio::test]
async fn a_panicking_handler_leaves_the_id_unmarked() {
    let store = Arc::new(InMemoryStore::new());
    let task = tokio::spawn({
        let store = store.clone();
        async move {
            run_once(&*store, &order("id-A"), async {
                panic!("handler bug");
                #[allow(unreachable_code)]
                Ok::<(), HandlerError>(())
            })
            .await
        }
    });
    assert!(task.await.unwrap_err().is_panic());
    assert!(!store.seen("id-A").await.unwrap());
}

#[tokio::test]
async fn a_dropped_handler_leaves_the_id_unmarked() {
    let store = InMemoryStore::new();
    let delivery = run_once(&store, &order("id-A"), async {
        std::future::pending::<()>().await;
        Ok::<(), HandlerError>(())
    });
    let timed_out = tokio::time::timeout(Duration::from_millis(10), delivery).await;
    assert!(timed_out.is_err());
    assert!(!store.seen("id-A").await.unwrap());
}

#[tokio::test]
async fn a_success_is_remembered() {
    let store = InMemoryStore::new();
    run_once(&store, &order("id-A"), async { Ok::<(), HandlerError>(()) })
        .await
        .unwrap();
    assert!(store.seen("id-A").await.unwrap());
}

#[tokio::test]
async fn a_failing_remember_acks_by_default() {
    let store = FailingStore::new(Failure::Remember);
    let runs = AtomicU32::new(0);
    let result = run_once(&store, &order("id-A"), counted(&runs)).await;
    assert!(result.is_ok(), "the effect happened: the delivery is acked");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_failing_remember_can_return_the_error_instead() {
    let store = FailingStore::new(Failure::Remember);
    let result = Guard::new(&store)
        .on_remember_failure(OnRememberFailure::ReturnError)
        .run(&order("id-A"), async { Ok::<(), HandlerError>(()) })
        .await;
    match result {
        Err(HandlerError::Store(error)) => {
            assert_eq!(error.operation(), StoreOperation::Remember)
        }
        other => panic!("expected the remember error, got {other:?}"),
    }
}

#[tokio::test]
async fn scopes_do_not_skip_each_others_messages() {
    let store = InMemoryStore::new();
    let env = order("id-A");
    let runs = AtomicU32::new(0);
    for scope in ["billing", "shipping", "billing"] {
        Guard::new(&store)
            .scope(scope)
            .run(&env, counted(&runs))
            .await
            .unwrap();
    }
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert!(store.seen("7:billing:id-A").await.unwrap());
    assert!(
        !store.seen("id-A").await.unwrap(),
        "scoped keys never touch the bare id"
    );
}

/// Three messages whose scope and id joined with a bare `:`
/// read alike (`orders:eu:123`), yet they are three messages and each runs.
#[tokio::test]
async fn scope_and_id_pairs_that_join_alike_are_three_messages() {
    let store = InMemoryStore::new();
    let runs = AtomicU32::new(0);
    let deliveries = [
        (Some("orders:eu"), "123"),
        (Some("orders"), "eu:123"),
        (None, "orders:eu:123"),
    ];
    for round in 1..=2 {
        for (scope, id) in deliveries {
            let guard = match scope {
                Some(scope) => Guard::new(&store).scope(scope),
                None => Guard::new(&store),
            };
            guard.run(&order(id), counted(&runs)).await.unwrap();
        }
        assert_eq!(runs.load(Ordering::SeqCst), 3, "round {round}");
    }
    assert_eq!(store.len(), 3);
    assert!(
        store.seen("orders:eu:123").await.unwrap(),
        "the unscoped key is the bare id, as the Go SDK writes it"
    );
}

/// A scoped duplicate of a UUID id is skipped without a heap allocation:
/// the length-prefixed key fits inline (scopes up to 22 bytes).
#[test]
fn a_scoped_duplicate_of_a_uuid_id_allocates_nothing() {
    duplicates_allocate_nothing(Guard::new(&InMemoryStore::new()).scope("billing-eu-west-1-prod"));
}

/// So is an unscoped one, whose key the store reads as bytes.
#[test]
fn an_unscoped_duplicate_of_a_uuid_id_allocates_nothing() {
    duplicates_allocate_nothing(Guard::new(&InMemoryStore::new()));
}

fn duplicates_allocate_nothing(guard: Guard<&InMemoryStore>) {
    use std::future::Future;
    use std::task::{Context, Poll, Waker};

    let store = guard.store();
    let env = order("f1e2d3c4-b5a6-4789-90ab-cdef01234567");
    let mut cx = Context::from_waker(Waker::noop());
    let mut deliver = || {
        let run = guard.run(&env, async { Ok::<(), HandlerError>(()) });
        let mut run = std::pin::pin!(run);
        match run.as_mut().poll(&mut cx) {
            Poll::Ready(result) => result.unwrap(),
            Poll::Pending => panic!("the in-memory store answers at once"),
        }
    };
    deliver(); // the first delivery runs and remembers the key
    let before = allocations_on_this_thread();
    for _ in 0..100 {
        deliver();
    }
    assert_eq!(allocations_on_this_thread() - before, 0);
    assert_eq!(store.len(), 1);
}

/// An empty scope is a scope of its own: not the unscoped seen-set.
#[tokio::test]
async fn an_empty_scope_keeps_apart_from_no_scope() {
    let store = InMemoryStore::new();
    let runs = AtomicU32::new(0);
    let env = order("id-A");
    Guard::new(&store)
        .scope("")
        .run(&env, counted(&runs))
        .await
        .unwrap();
    run_once(&store, &env, counted(&runs)).await.unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn the_dedupe_key_is_meta_id_not_trace_id() {
    let store = InMemoryStore::new();
    let first = order("id-A").with_trace_id("trace-1");
    let same_chain_other_message = order("id-B").with_trace_id("trace-1");
    let runs = AtomicU32::new(0);
    for env in [&first, &same_chain_other_message, &first] {
        run_once(&store, env, counted(&runs)).await.unwrap();
    }
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_store_chosen_at_run_time_works_as_dyn_store() {
    let store: Arc<dyn Store> = Arc::new(InMemoryStore::new());
    let by_ref: &dyn Store = &*store;
    let runs = AtomicU32::new(0);
    for _ in 0..2 {
        run_once(store.clone(), &order("id-A"), counted(&runs))
            .await
            .unwrap();
        run_once(by_ref, &order("id-B"), counted(&runs))
            .await
            .unwrap();
    }
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn wrap_dedupes_a_closure_that_owns_its_message() {
    let runs = Arc::new(AtomicU32::new(0));
    let handler = wrap(InMemoryStore::new(), {
        let runs = runs.clone();
        move |env: Envelope| {
            let runs = runs.clone();
            async move {
                // The handler consumes the envelope; the key was taken before.
                let _owned: Envelope = env;
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<(), anyhow::Error>(())
            }
        }
    })
    .scope("wrapped");
    let env = order("id-A");
    handler.call(env.clone()).await.unwrap();
    handler.call(env).await.unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert!(
        handler
            .guard()
            .store()
            .seen("7:wrapped:id-A")
            .await
            .unwrap()
    );
}

#[test]
fn guarded_futures_are_send_when_the_handler_is() {
    fn assert_send<F: Send>(_: F) {}
    let store = InMemoryStore::new();
    let env = order("id-A");
    assert_send(run_once(&store, &env, async {
        Ok::<(), anyhow::Error>(())
    }));
    let dynamic: Arc<dyn Store> = Arc::new(InMemoryStore::new());
    assert_send(run_once(dynamic, &env, async {
        Ok::<(), anyhow::Error>(())
    }));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_sharing_one_store_each_run_their_ids_once() {
    let store = Arc::new(InMemoryStore::new());
    let runs = Arc::new(AtomicU32::new(0));
    let mut tasks = Vec::new();
    for worker in 0..8 {
        let (store, runs) = (store.clone(), runs.clone());
        tasks.push(tokio::spawn(async move {
            for n in 0..500 {
                let env = order(&format!("worker-{worker}-{n}"));
                // Every message is redelivered twice after its first delivery.
                for _ in 0..3 {
                    let runs = &runs;
                    run_once(&*store, &env, async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        Ok::<(), anyhow::Error>(())
                    })
                    .await
                    .unwrap();
                    tokio::task::yield_now().await;
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(runs.load(Ordering::SeqCst), 8 * 500);
    assert_eq!(store.len(), 8 * 500);
}

/// A store with its answer at hand: `seen_now` gives `answer`, and `seen`
/// is a future that never completes, so a guard that awaited it would
/// never finish.
struct AnswersNow {
    answer: fn() -> Result<bool, StoreError>,
    seen_asked: AtomicU32,
    remembered: AtomicU32,
}

impl AnswersNow {
    fn new(answer: fn() -> Result<bool, StoreError>) -> Self {
        AnswersNow {
            answer,
            seen_asked: AtomicU32::new(0),
            remembered: AtomicU32::new(0),
        }
    }
}

impl Store for AnswersNow {
    fn seen<'a>(&'a self, _id: &'a str) -> StoreFuture<'a, bool> {
        self.seen_asked.fetch_add(1, Ordering::SeqCst);
        StoreFuture::new(std::future::pending())
    }
    fn seen_now(&self, _id: &str) -> Option<Result<bool, StoreError>> {
        Some((self.answer)())
    }
    fn remember<'a>(&'a self, _id: &'a str) -> StoreFuture<'a, ()> {
        self.remembered.fetch_add(1, Ordering::SeqCst);
        StoreFuture::ready(Ok(()))
    }
    fn forget<'a>(&'a self, _id: &'a str) -> StoreFuture<'a, ()> {
        StoreFuture::ready(Ok(()))
    }
}

/// Polls `future` once, with a waker that does nothing.
fn first_poll<F: Future>(future: F) -> Poll<F::Output> {
    pin!(future).poll(&mut Context::from_waker(Waker::noop()))
}

#[test]
fn a_duplicate_a_store_answers_now_is_skipped_in_the_first_poll_without_awaiting_seen() {
    let store = AnswersNow::new(|| Ok(true));
    let runs = AtomicU32::new(0);
    let env = order("id-now");
    let poll = first_poll(run_once(&store, &env, counted(&runs)));
    assert!(matches!(poll, Poll::Ready(Ok(()))), "{poll:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the duplicate ran");
    assert_eq!(store.seen_asked.load(Ordering::SeqCst), 0);
    assert_eq!(store.remembered.load(Ordering::SeqCst), 0);
}

#[test]
fn a_first_delivery_a_store_answers_now_runs_and_is_remembered_without_asking_seen() {
    let store = AnswersNow::new(|| Ok(false));
    let runs = AtomicU32::new(0);
    let env = order("id-now");
    let poll = first_poll(Guard::new(&store).run(&env, counted(&runs)));
    assert!(matches!(poll, Poll::Ready(Ok(()))), "{poll:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(store.seen_asked.load(Ordering::SeqCst), 0);
    assert_eq!(store.remembered.load(Ordering::SeqCst), 1);
}

#[test]
fn an_error_from_seen_now_fails_the_delivery_without_running_the_handler() {
    let store = AnswersNow::new(|| Err(StoreError::new(StoreOperation::Seen, "local", "down")));
    let runs = AtomicU32::new(0);
    let env = order("id-now");
    let Poll::Ready(Err(HandlerError::Store(error))) =
        first_poll(run_once(&store, &env, counted(&runs)))
    else {
        panic!("an error from seen_now did not fail the delivery");
    };
    assert_eq!(error.operation(), StoreOperation::Seen);
    assert_eq!(error.backend(), "local");
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the handler ran");
    assert_eq!(store.seen_asked.load(Ordering::SeqCst), 0);
    assert_eq!(store.remembered.load(Ordering::SeqCst), 0);
}

/// A store that keeps the default `seen_now` (no answer at hand): its
/// `seen` answers after one `Pending`, as a server's would.
#[derive(Default)]
struct AnswersLater {
    seen_asked: AtomicU32,
}

impl Store for AnswersLater {
    fn seen<'a>(&'a self, _id: &'a str) -> StoreFuture<'a, bool> {
        self.seen_asked.fetch_add(1, Ordering::SeqCst);
        StoreFuture::new(async {
            tokio::task::yield_now().await;
            Ok(true)
        })
    }
    fn remember<'a>(&'a self, _id: &'a str) -> StoreFuture<'a, ()> {
        StoreFuture::ready(Ok(()))
    }
    fn forget<'a>(&'a self, _id: &'a str) -> StoreFuture<'a, ()> {
        StoreFuture::ready(Ok(()))
    }
}

#[tokio::test]
async fn a_store_without_an_answer_at_hand_is_asked_seen_and_awaited() {
    let store = AnswersLater::default();
    assert!(store.seen_now("id-later").is_none());
    let runs = AtomicU32::new(0);
    let env = order("id-later");
    let mut delivery = pin!(run_once(&store, &env, counted(&runs)));
    assert!(
        first_poll(delivery.as_mut()).is_pending(),
        "the guard did not wait for seen"
    );
    delivery.await.unwrap();
    assert_eq!(store.seen_asked.load(Ordering::SeqCst), 1);
    assert_eq!(runs.load(Ordering::SeqCst), 0, "a seen id ran");
}
