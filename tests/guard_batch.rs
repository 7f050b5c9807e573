//! `Guard::run_batch`: one `seen_many`, the handlers, one `remember_many`,
//! and the per-message contract of DESIGN section 1 for every message, on
//! the in-memory store and on real Redis.

#[macro_use]
mod store_contract;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use babel_idem::store::{StoreFuture, StoreOperation};
use babel_idem::{
    BatchOutcome, Decision, Envelope, Guard, InMemoryStore, MessageId, OnRememberFailure, Store,
    StoreError,
};
#[cfg(feature = "redis")]
use store_contract::Backend;
use store_contract::{DeliveryError, envelope};

/// An in-memory store that counts its calls and fails the ones a test asks for.
#[derive(Default)]
struct Flaky {
    inner: InMemoryStore,
    /// `seen_many` / `remember_many` fail.
    fail_batches: bool,
    /// `seen` / `remember` of these ids fail.
    poison: Vec<&'static str>,
    calls: Mutex<Vec<&'static str>>,
}

impl Flaky {
    fn call(&self, name: &'static str) {
        self.calls.lock().unwrap().push(name);
    }

    fn calls(&self, name: &str) -> usize {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|c| **c == name)
            .count()
    }

    fn refuse<T>(&self, operation: StoreOperation, id: &str) -> Option<StoreFuture<'_, T>> {
        self.poison
            .contains(&id)
            .then(|| StoreFuture::ready(Err(StoreError::new(operation, "flaky", "refused"))))
    }
}

impl Store for Flaky {
    fn seen<'a>(&'a self, id: &'a str) -> StoreFuture<'a, bool> {
        self.call("seen");
        self.refuse(StoreOperation::Seen, id)
            .unwrap_or_else(|| self.inner.seen(id))
    }
    fn remember<'a>(&'a self, id: &'a str) -> StoreFuture<'a, ()> {
        self.call("remember");
        self.refuse(StoreOperation::Remember, id)
            .unwrap_or_else(|| self.inner.remember(id))
    }
    fn forget<'a>(&'a self, id: &'a str) -> StoreFuture<'a, ()> {
        self.inner.forget(id)
    }
    fn seen_many<'a>(&'a self, ids: &'a [&'a str]) -> StoreFuture<'a, Vec<bool>> {
        self.call("seen_many");
        match self.fail_batches {
            true => StoreFuture::ready(Err(StoreError::new(StoreOperation::Seen, "flaky", "down"))),
            false => self.inner.seen_many(ids),
        }
    }
    fn remember_many<'a>(&'a self, ids: &'a [&'a str]) -> StoreFuture<'a, ()> {
        self.call("remember_many");
        match self.fail_batches {
            true => StoreFuture::ready(Err(StoreError::new(
                StoreOperation::Remember,
                "flaky",
                "down",
            ))),
            false => self.inner.remember_many(ids),
        }
    }
}

/// Ids `""` (no usable id), ones ending in `!` fail in the handler.
fn batch(ids: &[&str]) -> Vec<Envelope> {
    ids.iter()
        .map(|id| match *id {
            "" => envelope("").without_id(),
            id => envelope(id),
        })
        .collect()
}

/// Runs `messages` through `guard`, counting the handler's runs per id;
/// an id ending in `!` fails.
async fn run<S: Store>(
    guard: &Guard<S>,
    messages: &[Envelope],
    runs: &Mutex<Vec<String>>,
) -> Vec<BatchOutcome<DeliveryError>> {
    guard
        .run_batch(messages, |env| async move {
            let id = env.message_id().unwrap_or("").to_owned();
            let fails = id.ends_with('!');
            runs.lock().unwrap().push(id);
            match fails {
                true => Err(DeliveryError::Handler),
                false => Ok(()),
            }
        })
        .await
}

fn decisions<E>(outcomes: &[BatchOutcome<E>]) -> Vec<Decision> {
    outcomes.iter().map(BatchOutcome::decision).collect()
}

/// The contract for every message of one mixed batch, with one `seen_many`
/// and one `remember_many` for all of it.
async fn mixed_batch_keeps_the_contract_per_message<S: Store>(store: S) {
    store.remember("seen-before").await.unwrap();
    let guard = Guard::new(&store);
    let runs = Mutex::new(Vec::new());
    let messages = batch(&[
        "id-A",
        "id-B",
        "id-A",
        "seen-before",
        "",
        "bad!",
        "id-C",
        "bad!",
    ]);
    let outcomes = run(&guard, &messages, &runs).await;

    use Decision::*;
    assert_eq!(
        decisions(&outcomes),
        [Ran, Ran, Skipped, Skipped, FailOpen, Failed, Ran, Failed]
    );
    for (at, outcome) in outcomes.iter().enumerate() {
        let failed = matches!(outcome.result(), Err(DeliveryError::Handler));
        assert_eq!(failed, outcome.decision() == Failed, "message {at}");
        assert!(!matches!(outcome.result(), Err(DeliveryError::Store(_))));
    }
    assert_eq!(
        *runs.lock().unwrap(),
        ["id-A", "id-B", "", "bad!", "id-C", "bad!"],
        "each id ran once, a failed one on each of its deliveries, none seen before"
    );
    assert_eq!(
        store
            .seen_many(&["id-A", "id-B", "id-C", "bad!"])
            .await
            .unwrap(),
        [true, true, true, false],
        "a failed handler leaves only its own id unmarked"
    );

    // The same batch again: every id with a successful run is skipped.
    runs.lock().unwrap().clear();
    let again = run(&guard, &messages, &runs).await;
    assert_eq!(
        decisions(&again),
        [
            Skipped, Skipped, Skipped, Skipped, FailOpen, Failed, Skipped, Failed
        ]
    );
}

#[tokio::test]
async fn mixed_batch_on_the_memory_store() {
    mixed_batch_keeps_the_contract_per_message(InMemoryStore::new()).await;
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn mixed_batch_on_redis() {
    if let Some(backend) = store_contract::RedisBackend::create("guard_mixed_batch") {
        let store = backend.open("guard_batch", None).await;
        mixed_batch_keeps_the_contract_per_message(store).await;
    }
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn a_scoped_batch_keys_as_the_single_guard_does_on_redis() {
    if let Some(backend) = store_contract::RedisBackend::create("guard_scoped_batch") {
        let store = backend.open("guard_scoped", None).await;
        let billing = Guard::new(&store).scope("billing");
        let runs = Mutex::new(Vec::new());
        run(&billing, &batch(&["id-A"]), &runs).await;
        assert!(store.seen("7:billing:id-A").await.unwrap());
        assert!(!store.seen("id-A").await.unwrap());
        // The single guard skips what the batch remembered, and the other way round.
        let single = billing
            .run(&envelope("id-A"), async {
                Err::<(), _>(DeliveryError::Handler)
            })
            .await;
        assert!(single.is_ok(), "skipped");
        billing
            .run(&envelope("id-B"), async { Ok::<(), DeliveryError>(()) })
            .await
            .unwrap();
        let outcomes = run(&billing, &batch(&["id-B", "id-C"]), &runs).await;
        assert_eq!(decisions(&outcomes), [Decision::Skipped, Decision::Ran]);
    }
}

/// Two round trips for a batch, one for a batch of duplicates, none for a
/// batch without ids; never a single-id operation.
#[tokio::test]
async fn a_batch_costs_one_seen_many_and_one_remember_many() {
    let store = Flaky::default();
    let guard = Guard::new(&store);
    let runs = Mutex::new(Vec::new());
    run(&guard, &batch(&["a", "b", "a", "c!"]), &runs).await;
    assert_eq!(
        (store.calls("seen_many"), store.calls("remember_many")),
        (1, 1)
    );
    run(&guard, &batch(&["a", "b", "b"]), &runs).await;
    assert_eq!(
        (store.calls("seen_many"), store.calls("remember_many")),
        (2, 1),
        "an all-duplicate batch remembers nothing"
    );
    run(&guard, &batch(&["", ""]), &runs).await;
    run(&guard, &[], &runs).await;
    assert_eq!(
        (store.calls("seen_many"), store.calls("remember_many")),
        (2, 1)
    );
    assert_eq!((store.calls("seen"), store.calls("remember")), (0, 0));
}

/// A repeated id whose first copy failed runs again, as a redelivery would,
/// and is remembered once that run succeeds.
#[tokio::test]
async fn a_repeat_of_a_failed_message_runs_again() {
    let store = InMemoryStore::new();
    let guard = Guard::new(&store);
    let attempts = AtomicUsize::new(0);
    let messages = batch(&["id-A", "id-A", "id-A"]);
    let outcomes = guard
        .run_batch(&messages, |_| async {
            match attempts.fetch_add(1, Ordering::SeqCst) {
                0 => Err(DeliveryError::Handler),
                _ => Ok(()),
            }
        })
        .await;
    use Decision::*;
    assert_eq!(decisions(&outcomes), [Failed, Ran, Skipped]);
    assert_eq!(attempts.load(Ordering::SeqCst), 2);
    assert!(store.seen("id-A").await.unwrap());
}

/// `seen_many` fails: each message is asked on its own, so only the one
/// the store cannot answer for fails, and its handler does not run.
#[tokio::test]
async fn a_failed_seen_many_fails_only_the_messages_the_store_cannot_answer() {
    let store = Flaky {
        fail_batches: true,
        poison: vec!["poison"],
        ..Flaky::default()
    };
    store.inner.remember("seen-before").await.unwrap();
    let guard = Guard::new(&store);
    let runs = Mutex::new(Vec::new());
    let outcomes = run(&guard, &batch(&["id-A", "poison", "seen-before"]), &runs).await;
    use Decision::*;
    assert_eq!(decisions(&outcomes), [Ran, StoreFailed, Skipped]);
    assert!(
        matches!(outcomes[1].result(), Err(DeliveryError::Store(e)) if e.operation() == StoreOperation::Seen)
    );
    assert_eq!(*runs.lock().unwrap(), ["id-A"]);
    assert!(
        store.inner.seen("id-A").await.unwrap(),
        "remembered one at a time"
    );

    // A store that is down answers nothing: nothing runs.
    let down = Flaky {
        fail_batches: true,
        poison: vec!["id-X", "id-Y"],
        ..Flaky::default()
    };
    runs.lock().unwrap().clear();
    let outcomes = run(&Guard::new(&down), &batch(&["id-X", "id-Y"]), &runs).await;
    assert_eq!(decisions(&outcomes), [StoreFailed, StoreFailed]);
    assert!(runs.lock().unwrap().is_empty());
}

/// `remember_many` fails: each id is remembered on its own, and the one
/// that still fails is reported by the guard's policy, alone.
#[tokio::test]
async fn a_failed_remember_many_reports_each_unmarked_id_by_the_policy() {
    for (policy, expect_error) in [
        (OnRememberFailure::AckAndReport, false),
        (OnRememberFailure::ReturnError, true),
    ] {
        // `remember_many` fails; of the single `remember`s, only the poison id's.
        let store = Flaky {
            fail_batches: true,
            ..Flaky::default()
        };
        let store = RememberPoison(store, "unmarkable");
        let guard = Guard::new(&store).on_remember_failure(policy);
        let runs = Mutex::new(Vec::new());
        let outcomes = run(&guard, &batch(&["id-A", "unmarkable"]), &runs).await;
        use Decision::*;
        assert_eq!(decisions(&outcomes), [Ran, MarkFailed], "{policy:?}");
        assert!(outcomes[0].result().is_ok());
        assert_eq!(outcomes[1].result().is_err(), expect_error, "{policy:?}");
        assert_eq!(runs.lock().unwrap().len(), 2, "both ran");
        assert!(store.0.inner.seen("id-A").await.unwrap());
        assert!(!store.0.inner.seen("unmarkable").await.unwrap());
    }
}

/// A [`Flaky`] whose `seen_many` answers and whose `remember` of one id fails.
struct RememberPoison(Flaky, &'static str);

impl Store for RememberPoison {
    fn seen<'a>(&'a self, id: &'a str) -> StoreFuture<'a, bool> {
        self.0.seen(id)
    }
    fn remember<'a>(&'a self, id: &'a str) -> StoreFuture<'a, ()> {
        match id == self.1 {
            true => StoreFuture::ready(Err(StoreError::new(
                StoreOperation::Remember,
                "flaky",
                "refused",
            ))),
            false => self.0.remember(id),
        }
    }
    fn forget<'a>(&'a self, id: &'a str) -> StoreFuture<'a, ()> {
        self.0.forget(id)
    }
    fn seen_many<'a>(&'a self, ids: &'a [&'a str]) -> StoreFuture<'a, Vec<bool>> {
        self.0.inner.seen_many(ids)
    }
    fn remember_many<'a>(&'a self, ids: &'a [&'a str]) -> StoreFuture<'a, ()> {
        self.0.remember_many(ids)
    }
}

/// A handler that panics: the ids that succeeded before it are remembered,
/// its own is not, and the panic reaches the caller.
#[tokio::test]
async fn a_panicking_handler_keeps_the_earlier_marks_and_resumes() {
    let store = Arc::new(InMemoryStore::new());
    let result = tokio::spawn({
        let store = Arc::clone(&store);
        async move {
            let messages = batch(&["id-A", "boom", "id-C"]);
            let guard = Guard::new(&*store);
            guard
                .run_batch(&messages, |env| async move {
                    if env.message_id() == Some("boom") {
                        panic!("handler panicked");
                    }
                    Ok::<(), StoreError>(())
                })
                .await
                .len()
        }
    })
    .await;
    assert!(result.unwrap_err().is_panic());
    assert_eq!(
        store.seen_many(&["id-A", "boom", "id-C"]).await.unwrap(),
        [true, false, false],
        "id-C never ran"
    );
}
