//! `Guard::run_batch`: one `seen_many`, the handlers, one `remember_many`,
//! and the per-message contract of seen-set table of `babel_idem::guide::modes` for every message, on
//! the in-memory store and on real Redis.
//!
//! `store::Batched`: single guards running concurrently (a consumer's
//! reserved deliveries) whose calls meet in one `seen_many` and one
//! `remember_many`, each deciding as it would alone; on the in-memory
//! store with its calls counted, and on real Redis, PostgreSQL and SQLite.

#[macro_use]
mod store_contract;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use babel_idem::guard::MessageOutcome;
use babel_idem::store::{Batched, Claim, ClaimToken, StoreFuture, StoreOperation};
use babel_idem::telemetry::metrics::Decision;
use babel_idem::{
    ClaimStore, Envelope, Guard, InMemoryStore, MessageId, OnRememberFailure, Store, StoreError,
};
#[cfg(any(feature = "redis", feature = "postgres", feature = "sqlite"))]
use store_contract::Backend;
use store_contract::{DeliveryError, envelope};

/// An in-memory store that counts its calls and fails the ones a test asks
/// for. Each call takes one turn of the scheduler before it answers, as a
/// round trip to a server would: `Batched` groups the calls that arrive
/// while one is out.
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

/// `future`, answered after one turn of the scheduler.
fn round_trip<'a, T: Send + 'a>(future: StoreFuture<'a, T>) -> StoreFuture<'a, T> {
    StoreFuture::new(async move {
        tokio::task::yield_now().await;
        future.await
    })
}

impl Store for Flaky {
    fn seen<'a>(&'a self, id: &'a str) -> StoreFuture<'a, bool> {
        round_trip({
            self.call("seen");
            self.refuse(StoreOperation::Seen, id)
                .unwrap_or_else(|| self.inner.seen(id))
        })
    }
    fn remember<'a>(&'a self, id: &'a str) -> StoreFuture<'a, ()> {
        round_trip({
            self.call("remember");
            self.refuse(StoreOperation::Remember, id)
                .unwrap_or_else(|| self.inner.remember(id))
        })
    }
    fn forget<'a>(&'a self, id: &'a str) -> StoreFuture<'a, ()> {
        self.inner.forget(id)
    }
    fn seen_many<'a>(&'a self, ids: &'a [&'a str]) -> StoreFuture<'a, Vec<bool>> {
        round_trip({
            self.call("seen_many");
            match self.fail_batches {
                true => {
                    StoreFuture::ready(Err(StoreError::new(StoreOperation::Seen, "flaky", "down")))
                }
                false => self.inner.seen_many(ids),
            }
        })
    }
    fn remember_many<'a>(&'a self, ids: &'a [&'a str]) -> StoreFuture<'a, ()> {
        round_trip({
            self.call("remember_many");
            match self.fail_batches {
                true => StoreFuture::ready(Err(StoreError::new(
                    StoreOperation::Remember,
                    "flaky",
                    "down",
                ))),
                false => self.inner.remember_many(ids),
            }
        })
    }
}

/// Claim mode: `claim` of a poison id fails, and so does a `claim_many`
/// that holds one; `claim_many` / `commit_many` fail while `fail_batches`
/// is set, a failing `claim_many` after claiming its first entry.
impl ClaimStore for Flaky {
    fn claim<'a>(
        &'a self,
        id: &'a str,
        owner: ClaimToken,
        lease: Duration,
    ) -> StoreFuture<'a, Claim> {
        round_trip({
            self.call("claim");
            self.refuse(StoreOperation::Claim, id)
                .unwrap_or_else(|| self.inner.claim(id, owner, lease))
        })
    }
    fn commit<'a>(&'a self, id: &'a str, owner: ClaimToken) -> StoreFuture<'a, bool> {
        round_trip({
            self.call("commit");
            self.inner.commit(id, owner)
        })
    }
    fn release<'a>(&'a self, id: &'a str, owner: ClaimToken) -> StoreFuture<'a, bool> {
        self.inner.release(id, owner)
    }
    fn renew<'a>(
        &'a self,
        id: &'a str,
        owner: ClaimToken,
        lease: Duration,
    ) -> StoreFuture<'a, bool> {
        self.inner.renew(id, owner, lease)
    }
    fn claim_many<'a>(
        &'a self,
        claims: &'a [(&'a str, ClaimToken)],
        lease: Duration,
    ) -> StoreFuture<'a, Vec<Claim>> {
        round_trip({
            self.call("claim_many");
            // A batch holding a poison id fails as a whole, as on a server;
            // a failing batch has claimed its first entry before it fails.
            let poisoned = claims.iter().any(|(id, _)| self.poison.contains(id));
            match self.fail_batches || poisoned {
                true => StoreFuture::new(async move {
                    if let Some(&(id, owner)) = claims.first()
                        && !self.poison.contains(&id)
                    {
                        self.inner.claim(id, owner, lease).await?;
                    }
                    Err(StoreError::new(StoreOperation::Claim, "flaky", "down"))
                }),
                false => self.inner.claim_many(claims, lease),
            }
        })
    }
    fn commit_many<'a>(
        &'a self,
        commits: &'a [(&'a str, ClaimToken)],
    ) -> StoreFuture<'a, Vec<bool>> {
        round_trip({
            self.call("commit_many");
            match self.fail_batches {
                true => StoreFuture::ready(Err(StoreError::new(
                    StoreOperation::Commit,
                    "flaky",
                    "down",
                ))),
                false => self.inner.commit_many(commits),
            }
        })
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
) -> Vec<MessageOutcome<DeliveryError>> {
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

fn decisions<E>(outcomes: &[MessageOutcome<E>]) -> Vec<Decision> {
    outcomes.iter().map(MessageOutcome::decision).collect()
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

/// Runs one single guard per message, all at once on this thread's runtime
/// (as a consumer runs its reserved deliveries), and returns each result in
/// the messages' order; an id ending in `!` fails in its handler.
async fn deliver_concurrently<S>(
    store: &S,
    messages: &[Envelope],
    runs: &Arc<Mutex<Vec<String>>>,
) -> Vec<Result<(), DeliveryError>>
where
    S: Store + Clone + 'static,
{
    let mut deliveries = tokio::task::JoinSet::new();
    for (at, message) in messages.iter().cloned().enumerate() {
        let (store, runs) = (store.clone(), Arc::clone(runs));
        deliveries.spawn(async move {
            let id = message.message_id().unwrap_or("").to_owned();
            let result = babel_idem::run_once(&store, &message, async {
                let fails = id.ends_with('!');
                runs.lock().unwrap().push(id);
                match fails {
                    true => Err(DeliveryError::Handler),
                    false => Ok(()),
                }
            })
            .await;
            (at, result)
        });
    }
    let mut results: Vec<_> = deliveries.join_all().await;
    results.sort_by_key(|(at, _)| *at);
    results.into_iter().map(|(_, result)| result).collect()
}

fn ids(prefix: &str, count: usize) -> Vec<String> {
    (0..count).map(|n| format!("{prefix}-{n}")).collect()
}

/// 64 concurrent deliveries reach the store in at most two batches of each
/// operation (the first caller's, and the one of those that arrived while
/// it was out), never one call per delivery; each still decides as alone.
#[tokio::test]
async fn concurrent_guards_on_a_batched_store_share_their_round_trips() {
    let flaky = Arc::new(Flaky::default());
    let store = Batched::new(Arc::clone(&flaky));
    let runs = Arc::new(Mutex::new(Vec::new()));
    let first = ids("order", 64);
    let messages = batch(&first.iter().map(String::as_str).collect::<Vec<_>>());
    let results = deliver_concurrently(&store, &messages, &runs).await;
    assert!(results.iter().all(Result::is_ok));
    assert_eq!(runs.lock().unwrap().len(), 64, "every first delivery ran");
    let seen_calls = flaky.calls("seen") + flaky.calls("seen_many");
    let remember_calls = flaky.calls("remember") + flaky.calls("remember_many");
    assert!(
        (1..=2).contains(&seen_calls) && (1..=2).contains(&remember_calls),
        "64 deliveries, {seen_calls} seen and {remember_calls} remember round trips"
    );
    assert_eq!(flaky.inner.len(), 64);

    // Redelivered beside 8 new messages and 2 that fail: the redeliveries
    // skip, the new ones run, the failed ones stay unmarked.
    runs.lock().unwrap().clear();
    let mut again: Vec<String> = first.clone();
    again.extend(ids("refund", 8));
    again.extend(["bad-1!".to_owned(), "bad-2!".to_owned()]);
    let messages = batch(&again.iter().map(String::as_str).collect::<Vec<_>>());
    let results = deliver_concurrently(&store, &messages, &runs).await;
    let failed: Vec<usize> = (0..results.len())
        .filter(|&at| results[at].is_err())
        .collect();
    assert_eq!(failed, [72, 73]);
    let mut ran = runs.lock().unwrap().clone();
    ran.sort();
    let mut expected: Vec<String> = ids("refund", 8);
    expected.extend(["bad-1!".to_owned(), "bad-2!".to_owned()]);
    expected.sort();
    assert_eq!(ran, expected, "only the new messages ran");
    assert!(!flaky.inner.seen("bad-1!").await.unwrap());
    assert_eq!(flaky.inner.len(), 72);
}

/// A lone call is not held for company: it reaches the store as the single
/// operation, the same command as without `Batched`.
#[tokio::test]
async fn a_lone_guard_on_a_batched_store_makes_the_single_calls() {
    let flaky = Arc::new(Flaky::default());
    let store = Batched::new(Arc::clone(&flaky));
    let runs = Arc::new(Mutex::new(Vec::new()));
    deliver_concurrently(&store, &batch(&["id-A"]), &runs).await;
    deliver_concurrently(&store, &batch(&["id-A"]), &runs).await;
    assert_eq!(*runs.lock().unwrap(), ["id-A"]);
    assert_eq!(
        (flaky.calls("seen"), flaky.calls("remember")),
        (2, 1),
        "one seen per delivery, one remember for the run"
    );
    assert_eq!(
        (flaky.calls("seen_many"), flaky.calls("remember_many")),
        (0, 0)
    );
}

/// A batch that fails as a whole is asked again one call at a time, so a
/// poison id fails alone (its handler not run) and the others decide.
#[tokio::test]
async fn a_failed_batch_on_a_batched_store_fails_only_the_poison_id() {
    let flaky = Arc::new(Flaky {
        fail_batches: true,
        poison: vec!["poison"],
        ..Flaky::default()
    });
    flaky.inner.remember("seen-before").await.unwrap();
    let store = Batched::new(Arc::clone(&flaky));
    let runs = Arc::new(Mutex::new(Vec::new()));
    let mut all = ids("order", 16);
    all.extend(["poison".to_owned(), "seen-before".to_owned()]);
    let messages = batch(&all.iter().map(String::as_str).collect::<Vec<_>>());
    let results = deliver_concurrently(&store, &messages, &runs).await;
    for (at, result) in results.iter().enumerate() {
        match at {
            16 => assert!(
                matches!(result, Err(DeliveryError::Store(e)) if e.operation() == StoreOperation::Seen),
                "{result:?}"
            ),
            _ => assert!(result.is_ok(), "message {at}: {result:?}"),
        }
    }
    let mut ran = runs.lock().unwrap().clone();
    ran.sort();
    let mut expected = ids("order", 16);
    expected.sort();
    assert_eq!(ran, expected, "neither the poison id nor the seen one ran");
    assert!(flaky.calls("seen_many") >= 1, "the batch was tried");
    assert!(flaky.inner.seen("order-3").await.unwrap());
}

/// Claim mode through `Batched`: concurrent claims and commits meet in
/// `claim_many` / `commit_many`; when those fail as a whole, each call is
/// asked again alone, so the poison id fails alone (its handler not run),
/// the done id is skipped, and every other id runs once and is committed,
/// the entry a failed batch had already claimed included (its claim is
/// given back first, or its own delivery would find it held and park).
#[tokio::test]
async fn a_failed_claim_batch_fails_only_the_poison_id() {
    for fail_batches in [false, true] {
        let flaky = Arc::new(Flaky {
            fail_batches,
            poison: vec!["poison"],
            ..Flaky::default()
        });
        flaky.inner.remember("done-before").await.unwrap();
        let guard = Guard::new(Batched::new(Arc::clone(&flaky)))
            .lease(Duration::from_secs(30))
            .unwrap();
        let runs = Arc::new(Mutex::new(Vec::new()));
        let mut all = ids("claimed", 32);
        all.extend(["poison".to_owned(), "done-before".to_owned()]);
        let mut deliveries = tokio::task::JoinSet::new();
        for id in all.clone() {
            let (guard, runs) = (guard.clone(), Arc::clone(&runs));
            deliveries.spawn(async move {
                let result = guard
                    .run(&envelope(&id), async {
                        runs.lock().unwrap().push(id.clone());
                        Ok::<(), DeliveryError>(())
                    })
                    .await;
                (id, result)
            });
        }
        for (id, result) in deliveries.join_all().await {
            match id.as_str() {
                "poison" => assert!(
                    matches!(&result, Err(DeliveryError::Store(e)) if e.operation() == StoreOperation::Claim),
                    "{result:?}"
                ),
                _ => assert!(result.is_ok(), "{id}: {result:?}"),
            }
        }
        let mut ran = runs.lock().unwrap().clone();
        ran.sort();
        let mut expected = ids("claimed", 32);
        expected.sort();
        assert_eq!(ran, expected, "neither the poison id nor the done one ran");
        let claimed: Vec<&str> = expected.iter().map(String::as_str).collect();
        assert!(
            flaky
                .inner
                .seen_many(&claimed)
                .await
                .unwrap()
                .into_iter()
                .all(|done| done)
        );
        assert!(!flaky.inner.seen("poison").await.unwrap());
        assert!(
            flaky.calls("claim_many") >= 1,
            "32 concurrent claims met at least once (fail_batches: {fail_batches})"
        );
    }
}

/// Thousands of deliveries on four threads: every call is answered (none is
/// stranded by a hand-over of the lead) and each id runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batched_store_answers_every_call_under_contention() {
    let flaky = Arc::new(Flaky::default());
    let store = Batched::new(Arc::clone(&flaky));
    let runs = Arc::new(Mutex::new(Vec::new()));
    let all = ids("load", 4_000);
    let messages = batch(&all.iter().map(String::as_str).collect::<Vec<_>>());
    // A hang detector, not a speed check: a stranded call never returns.
    let results = tokio::time::timeout(
        std::time::Duration::from_secs(120),
        deliver_concurrently(&store, &messages, &runs),
    )
    .await
    .expect("every delivery finishes");
    assert!(results.iter().all(Result::is_ok));
    assert_eq!(runs.lock().unwrap().len(), 4_000);
    assert_eq!(flaky.inner.len(), 4_000);
    let round_trips = flaky.calls("seen") + flaky.calls("seen_many");
    assert!(
        round_trips < 4_000,
        "{round_trips} seen round trips for 4,000 deliveries"
    );
}

/// Claim mode's operations pass through `Batched` unbatched.
#[tokio::test]
async fn claim_mode_runs_through_a_batched_store() {
    let store = Batched::new(InMemoryStore::new());
    let guard = Guard::new(&store)
        .lease(std::time::Duration::from_secs(5))
        .unwrap();
    let runs = AtomicUsize::new(0);
    for _ in 0..2 {
        guard
            .run(&envelope("id-A"), async {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<(), StoreError>(())
            })
            .await
            .unwrap();
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert!(store.seen("id-A").await.unwrap());
}

/// On a real server: 64 concurrent first deliveries run once each, their
/// marks are the store's own (read back without `Batched`), and 64
/// redeliveries skip.
#[cfg(any(feature = "redis", feature = "postgres", feature = "sqlite"))]
async fn batched_guards_on_a_server<S: Store + 'static>(store: S) {
    let store = Batched::new(Arc::new(store));
    let runs = Arc::new(Mutex::new(Vec::new()));
    let all = ids("server", 64);
    let messages = batch(&all.iter().map(String::as_str).collect::<Vec<_>>());
    let results = deliver_concurrently(&store, &messages, &runs).await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    assert_eq!(runs.lock().unwrap().len(), 64);
    let id_refs: Vec<&str> = all.iter().map(String::as_str).collect();
    assert!(
        store
            .get_ref()
            .seen_many(&id_refs)
            .await
            .unwrap()
            .iter()
            .all(|seen| *seen)
    );
    assert!(store.get_ref().seen("server-17").await.unwrap());

    runs.lock().unwrap().clear();
    let results = deliver_concurrently(&store, &messages, &runs).await;
    assert!(results.iter().all(Result::is_ok));
    assert!(runs.lock().unwrap().is_empty(), "every redelivery skipped");
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn batched_guards_on_redis() {
    if let Some(backend) = store_contract::RedisBackend::create("batched_guards_on_redis") {
        batched_guards_on_a_server(backend.open("batched", None).await).await;
    }
}

#[cfg(feature = "postgres")]
#[tokio::test]
async fn batched_guards_on_postgres() {
    if let Some(backend) = store_contract::PostgresBackend::create("batched_guards_on_postgres") {
        batched_guards_on_a_server(backend.open("batched", None).await).await;
    }
}

#[cfg(feature = "sqlite")]
#[tokio::test]
async fn batched_guards_on_sqlite() {
    if let Some(backend) = store_contract::SqliteBackend::create("batched_guards_on_sqlite") {
        batched_guards_on_a_server(backend.open("batched", None).await).await;
    }
}
