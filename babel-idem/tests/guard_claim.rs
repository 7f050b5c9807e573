//! Claim mode (see `babel_idem::guide::modes`): every row of its table,
//! driven through `Guard::lease` over a real `InMemoryStore`, plus
//! concurrency, renewal, stale owners, fences and the router's handling of
//! a parked delivery (on every claim store, and whatever the handler's error
//! type keeps: `tests/router_parked.rs`).
//!
//! Leases are real and short; the tests assert outcomes, never durations.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use babel_idem::guard::fence;
use babel_idem::router::ReleaseReason;
use babel_idem::store::{Claim, ClaimToken, MAX_LEASE, StoreFuture, StoreOperation};
use babel_idem::telemetry::metrics::{self, Decision};
use babel_idem::{
    ClaimStore, Delivery, Disposition, Envelope, Guard, InMemoryStore, OnRememberFailure, Router,
    Store, StoreError, run_once, urn,
};
use serde_json::json;

const LONG: Duration = Duration::from_secs(30);

fn order(id: &str) -> Envelope {
    Envelope::new("urn:babel:orders:created", json!({"order_id": 1})).with_id(id)
}

fn unique(name: &str) -> String {
    format!("{name}-{}", uuid::Uuid::new_v4())
}

async fn won(store: &impl ClaimStore, id: &str, owner: ClaimToken, lease: Duration) -> u64 {
    match store.claim(id, owner, lease).await.unwrap() {
        Claim::Won { fence } => fence,
        other => panic!("expected to win the claim on {id}, got {other:?}"),
    }
}

/// An in-memory store whose chosen claim operations fail, standing in for a
/// server that is down for that operation.
#[derive(Default)]
struct Outage {
    inner: InMemoryStore,
    claim: bool,
    commit: bool,
    renew: bool,
    renewals: AtomicU32,
    /// How many commits fail next, having done nothing.
    commits_refused: AtomicU32,
    /// How many commits fail next after they took effect: their reply lost.
    commit_replies_lost: AtomicU32,
}

/// Takes one from `count` when it is above zero; whether it did.
fn take_one(count: &AtomicU32) -> bool {
    count
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

fn down(operation: StoreOperation) -> StoreError {
    StoreError::new(operation, "test", "connection refused")
}

impl Store for Outage {
    fn seen<'a>(&'a self, id: &'a str) -> StoreFuture<'a, bool> {
        self.inner.seen(id)
    }
    fn remember<'a>(&'a self, id: &'a str) -> StoreFuture<'a, ()> {
        self.inner.remember(id)
    }
    fn forget<'a>(&'a self, id: &'a str) -> StoreFuture<'a, ()> {
        self.inner.forget(id)
    }
}

impl ClaimStore for Outage {
    fn claim<'a>(
        &'a self,
        id: &'a str,
        owner: ClaimToken,
        lease: Duration,
    ) -> StoreFuture<'a, Claim> {
        if self.claim {
            return StoreFuture::new(async { Err(down(StoreOperation::Claim)) });
        }
        self.inner.claim(id, owner, lease)
    }
    fn commit<'a>(&'a self, id: &'a str, owner: ClaimToken) -> StoreFuture<'a, bool> {
        if self.commit || take_one(&self.commits_refused) {
            return StoreFuture::new(async { Err(down(StoreOperation::Commit)) });
        }
        if take_one(&self.commit_replies_lost) {
            return StoreFuture::new(async move {
                self.inner.commit(id, owner).await?;
                Err(down(StoreOperation::Commit))
            });
        }
        self.inner.commit(id, owner)
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
        self.renewals.fetch_add(1, Ordering::SeqCst);
        if self.renew {
            return StoreFuture::new(async { Err(down(StoreOperation::Renew)) });
        }
        self.inner.renew(id, owner, lease)
    }
}

/// Inside a handler: waits until a competing owner has taken the claim over
/// (possible only once this run's lease lapsed unrenewed), returns its fence.
async fn until_taken_over(store: &impl ClaimStore, id: &str, poll_every: Duration) -> u64 {
    let competitor = ClaimToken::random();
    loop {
        if let Claim::Won { fence } = store.claim(id, competitor, LONG).await.unwrap() {
            return fence;
        }
        tokio::time::sleep(poll_every).await;
    }
}

// ---- building the guard ------------------------------------------------

#[test]
fn a_lease_no_store_can_hold_is_refused_when_the_guard_is_built() {
    for lease in [
        Duration::ZERO,
        Duration::from_micros(999),
        MAX_LEASE + Duration::from_millis(1),
        Duration::MAX,
    ] {
        let refused = Guard::new(InMemoryStore::new()).lease(lease).unwrap_err();
        assert_eq!(refused.lease(), lease);
        let as_store_error: StoreError = refused.into();
        assert!(as_store_error.to_string().contains("out of range"));
    }
    let leased = Guard::new(InMemoryStore::new()).lease(MAX_LEASE).unwrap();
    assert_eq!(leased.mode().lease(), MAX_LEASE);
}

// ---- the table, row by row ----------------------------------------------

#[tokio::test]
async fn a_message_without_id_runs_unclaimed_every_time() {
    let guard = Guard::new(InMemoryStore::new()).lease(LONG).unwrap();
    let runs = AtomicU32::new(0);
    for env in [order(""), order("x").without_id()] {
        guard
            .run(&env, async {
                assert_eq!(fence(), None, "no claim, no fence");
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<(), StoreError>(())
            })
            .await
            .unwrap();
    }
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert!(guard.store().is_empty());
}

#[tokio::test]
async fn a_done_id_is_skipped() {
    let id = unique("done");
    let guard = Guard::new(InMemoryStore::new()).lease(LONG).unwrap();
    guard.store().remember(&id).await.unwrap();
    let result = guard
        .run(&order(&id), async {
            panic!("a done id must not run");
            #[allow(unreachable_code)]
            Ok::<(), StoreError>(())
        })
        .await;
    assert!(result.is_ok());
}

#[tokio::test]
async fn a_won_claim_runs_commits_and_is_done_for_every_later_claim() {
    let id = unique("won");
    let store = InMemoryStore::new();
    let guard = Guard::new(&store).lease(LONG).unwrap();
    let mut seen_fence = None;
    guard
        .run(&order(&id), async {
            seen_fence = fence();
            Ok::<(), StoreError>(())
        })
        .await
        .unwrap();
    assert!(seen_fence.is_some_and(|fence| fence >= 1));
    assert!(
        store.seen(&id).await.unwrap(),
        "commit writes the done marker"
    );
    let later = store.claim(&id, ClaimToken::random(), LONG).await.unwrap();
    assert_eq!(later, Claim::Done, "a done id is never claimable again");
}

#[tokio::test]
async fn a_live_claim_parks_the_delivery_without_running_it() {
    let id = unique("held");
    let store = InMemoryStore::new();
    won(&store, &id, ClaimToken::random(), LONG).await;
    let guard = Guard::new(&store).lease(LONG).unwrap();
    let error = guard
        .run(&order(&id), async {
            panic!("a held id must not run");
            #[allow(unreachable_code)]
            Ok::<(), StoreError>(())
        })
        .await
        .unwrap_err();
    assert!(error.is_parked(), "{error}");
    assert!(!error.is_lost_claim());
    let left = error
        .retry_after()
        .expect("the in-memory store knows the lease");
    assert!(left <= LONG);
    assert!(!store.seen(&id).await.unwrap());
}

#[tokio::test]
async fn a_claim_that_fails_does_not_run_and_returns_the_store_error() {
    let store = Outage {
        claim: true,
        ..Outage::default()
    };
    let guard = Guard::new(&store).lease(LONG).unwrap();
    let error = guard
        .run(&order(&unique("outage")), async {
            panic!("an unclaimed id must not run");
            #[allow(unreachable_code)]
            Ok::<(), StoreError>(())
        })
        .await
        .unwrap_err();
    assert_eq!(error.operation(), StoreOperation::Claim);
    assert!(!error.is_parked(), "an outage is not a parked delivery");
}

#[tokio::test]
async fn a_success_whose_claim_was_lost_is_not_marked_and_reports_lost_claim() {
    let id = unique("lost");
    let lease = Duration::from_millis(60);
    // Renewals fail, so the lease lapses while the handler runs.
    let store = Outage {
        renew: true,
        ..Outage::default()
    };
    let guard = Guard::new(&store).lease(lease).unwrap();
    let mut fences = (None, 0);
    let error = guard
        .run(&order(&id), async {
            let mine = fence();
            let theirs = until_taken_over(&store, &id, Duration::from_millis(10)).await;
            fences = (mine, theirs);
            Ok::<(), StoreError>(())
        })
        .await
        .unwrap_err();
    assert!(error.is_lost_claim(), "{error}");
    assert!(
        !store.seen(&id).await.unwrap(),
        "a lost claim never marks the id"
    );
    let (mine, theirs) = fences;
    assert!(theirs > mine.unwrap(), "the take-over has the larger fence");
    let third = store.claim(&id, ClaimToken::random(), LONG).await.unwrap();
    assert!(
        matches!(third, Claim::Held { .. }),
        "the new owner still holds the id: {third:?}"
    );
}

#[tokio::test]
async fn a_failed_handler_releases_its_claim_so_a_redelivery_runs_at_once() {
    let id = unique("failed");
    let store = InMemoryStore::new();
    let guard = Guard::new(&store).lease(LONG).unwrap();
    let declined = StoreError::new(StoreOperation::Seen, "handler", "declined");
    let error = guard
        .run(&order(&id), async { Err::<(), _>(declined) })
        .await
        .unwrap_err();
    assert_eq!(
        error.backend(),
        "handler",
        "the handler's own error comes back"
    );
    assert!(!store.seen(&id).await.unwrap());
    won(&store, &id, ClaimToken::random(), LONG).await;
}

#[tokio::test]
async fn a_failed_handler_never_releases_another_owners_claim() {
    let id = unique("stale-failure");
    let store = Outage {
        renew: true,
        ..Outage::default()
    };
    let guard = Guard::new(&store).lease(Duration::from_millis(60)).unwrap();
    guard
        .run(&order(&id), async {
            until_taken_over(&store, &id, Duration::from_millis(10)).await;
            Err::<(), _>(StoreError::new(StoreOperation::Seen, "handler", "declined"))
        })
        .await
        .unwrap_err();
    let after = store.claim(&id, ClaimToken::random(), LONG).await.unwrap();
    assert!(
        matches!(after, Claim::Held { .. }),
        "the stale owner's release must leave the new claim alone: {after:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_handler_releases_its_claim_then_panics_on() {
    let id = unique("panic");
    let store = Arc::new(InMemoryStore::new());
    let guard = Guard::new(store.clone()).lease(LONG).unwrap();
    let env = order(&id);
    let joined = tokio::spawn(async move {
        guard
            .run(&env, async {
                panic!("handler bug");
                #[allow(unreachable_code)]
                Ok::<(), StoreError>(())
            })
            .await
    })
    .await;
    assert!(
        joined.unwrap_err().is_panic(),
        "the panic reaches the caller"
    );
    assert!(!store.seen(&id).await.unwrap());
    won(&*store, &id, ClaimToken::random(), LONG).await;
}

#[tokio::test]
async fn a_dropped_delivery_leaves_its_claim_to_lapse_with_the_lease() {
    let id = unique("dropped");
    // Long enough that the claim is still live when checked just after the
    // drop, whatever pause a loaded machine puts in between.
    let lease = Duration::from_secs(1);
    let store = InMemoryStore::new();
    let guard = Guard::new(&store).lease(lease).unwrap();
    let started = tokio::sync::Notify::new();
    let mut dropped_fence = None;
    let delivery = guard.run(&order(&id), async {
        dropped_fence = fence();
        started.notify_one();
        std::future::pending::<()>().await;
        Ok::<(), StoreError>(())
    });
    tokio::select! {
        _ = delivery => unreachable!("the handler never finishes"),
        () = started.notified() => {}
    }
    // The delivery future is gone (a timeout, a shutdown): no release ran.
    let during = store.claim(&id, ClaimToken::random(), lease).await.unwrap();
    assert!(matches!(during, Claim::Held { .. }), "{during:?}");
    let retaken = loop {
        if let Claim::Won { fence } = store.claim(&id, ClaimToken::random(), lease).await.unwrap() {
            break fence;
        }
        tokio::time::sleep(lease / 4).await;
    };
    assert!(retaken > dropped_fence.unwrap());
}

/// A commit that keeps failing is retried for up to the lease; this lease
/// is short, so the policy decides soon.
#[tokio::test]
async fn a_commit_that_fails_acks_by_default_or_returns_the_error_by_policy() {
    let store = Outage {
        commit: true,
        ..Outage::default()
    };
    let lease = Duration::from_millis(300);
    let acked = Guard::new(&store).lease(lease).unwrap();
    acked
        .run(&order(&unique("commit")), async {
            Ok::<(), StoreError>(())
        })
        .await
        .unwrap();
    let strict = Guard::new(&store)
        .on_remember_failure(OnRememberFailure::ReturnError)
        .lease(lease)
        .unwrap();
    let error = strict
        .run(&order(&unique("commit")), async {
            Ok::<(), StoreError>(())
        })
        .await
        .unwrap_err();
    assert_eq!(error.operation(), StoreOperation::Commit);
}

/// A commit that fails a few times (a failover) is sent again, the lease
/// renewed meanwhile: the handler ran once and the id ends done.
#[tokio::test]
async fn a_commit_that_fails_for_a_while_is_retried_keeping_the_claim_and_marks_the_id() {
    let store = Outage {
        commits_refused: AtomicU32::new(5),
        ..Outage::default()
    };
    let id = unique("commit-retry");
    // Five failures take more than a third of this lease to back off from
    // (50 ms doubling): the lease is renewed before the attempt that works.
    let guard = Guard::new(&store)
        .on_remember_failure(OnRememberFailure::ReturnError)
        .lease(Duration::from_secs(3))
        .unwrap();
    let runs = AtomicU32::new(0);
    guard
        .run(&order(&id), async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<(), StoreError>(())
        })
        .await
        .unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(
        store.commits_refused.load(Ordering::SeqCst),
        0,
        "every failure was retried"
    );
    assert!(store.seen(&id).await.unwrap());
    assert!(
        store.renewals.load(Ordering::SeqCst) >= 1,
        "the lease was renewed while the commit was retried"
    );
}

/// A commit that took effect but whose reply was lost (a timeout, a
/// failover, a `WAIT` that failed) is sent again and finds the id done: the
/// delivery succeeds, with no lost claim and no second run.
#[tokio::test]
async fn a_commit_whose_reply_was_lost_is_retried_and_finds_the_id_done() {
    let store = Outage {
        commit_replies_lost: AtomicU32::new(1),
        ..Outage::default()
    };
    let id = unique("commit-lost-reply");
    let guard = Guard::new(&store)
        .on_remember_failure(OnRememberFailure::ReturnError)
        .lease(LONG)
        .unwrap();
    for _ in 0..2 {
        guard
            .run(&order(&id), async {
                assert!(!store.seen(&id).await.unwrap(), "the id runs once");
                Ok::<(), StoreError>(())
            })
            .await
            .unwrap();
    }
    assert_eq!(store.commit_replies_lost.load(Ordering::SeqCst), 0);
    assert!(store.seen(&id).await.unwrap());
}

// ---- concurrency and renewal --------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_concurrent_deliveries_of_one_id_run_one_at_a_time_and_once() {
    let id = unique("burst");
    let guard = Arc::new(
        Guard::new(InMemoryStore::new())
            .lease(Duration::from_secs(5))
            .unwrap(),
    );
    let in_flight = Arc::new(AtomicU32::new(0));
    let overlapped = Arc::new(AtomicBool::new(false));
    let effects = Arc::new(AtomicU32::new(0));
    let parked = Arc::new(AtomicU32::new(0));

    let deliveries = (0..64).map(|_| {
        let (guard, env) = (guard.clone(), order(&id));
        let (in_flight, overlapped) = (in_flight.clone(), overlapped.clone());
        let (effects, parked) = (effects.clone(), parked.clone());
        tokio::spawn(async move {
            // A parked delivery comes back later, as a broker would redeliver it.
            loop {
                let handler = async {
                    if in_flight.fetch_add(1, Ordering::SeqCst) > 0 {
                        overlapped.store(true, Ordering::SeqCst);
                    }
                    // The run lasts until another delivery met its claim (a
                    // fixed 20 ms could pass before any other task started on a
                    // loaded machine); bounded, so that a claim that let every
                    // delivery run fails the asserts below instead of hanging.
                    let give_up = std::time::Instant::now() + Duration::from_secs(10);
                    while parked.load(Ordering::SeqCst) == 0 && std::time::Instant::now() < give_up
                    {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    effects.fetch_add(1, Ordering::SeqCst);
                    in_flight.fetch_sub(1, Ordering::SeqCst);
                    Ok::<(), StoreError>(())
                };
                match guard.run(&env, handler).await {
                    Ok(()) => return,
                    Err(error) if error.is_parked() => {
                        parked.fetch_add(1, Ordering::SeqCst);
                        let wait = error.retry_after().unwrap().min(Duration::from_millis(5));
                        tokio::time::sleep(wait).await;
                    }
                    Err(error) => panic!("unexpected error: {error}"),
                }
            }
        })
    });
    for delivery in deliveries.collect::<Vec<_>>() {
        delivery.await.unwrap();
    }
    assert!(
        !overlapped.load(Ordering::SeqCst),
        "two runs of one id overlapped"
    );
    assert_eq!(effects.load(Ordering::SeqCst), 1, "exactly one effect");
    assert!(
        parked.load(Ordering::SeqCst) >= 1,
        "the burst met a live claim"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_three_times_slower_than_its_lease_keeps_its_claim() {
    let id = unique("slow");
    // Long enough that a loaded machine's scheduling gaps stay well inside the
    // slack between a renewal (every third of the lease) and the lapse.
    let lease = Duration::from_secs(1);
    let store = Arc::new(Outage::default());
    let guard = Guard::new(store.clone()).lease(lease).unwrap();
    let runs = Arc::new(AtomicU32::new(0));
    let finished = Arc::new(AtomicBool::new(false));
    let (started, slow_started) = tokio::sync::oneshot::channel();

    let slow = {
        let (guard, env, runs, finished) =
            (guard.clone(), order(&id), runs.clone(), finished.clone());
        tokio::spawn(async move {
            let result = guard
                .run(&env, async {
                    runs.fetch_add(1, Ordering::SeqCst);
                    started.send(()).unwrap();
                    tokio::time::sleep(lease * 3).await;
                    Ok::<(), StoreError>(())
                })
                .await;
            finished.store(true, Ordering::SeqCst);
            result
        })
    };
    // A competing worker redelivers the same id all along: had the lease
    // lapsed, it would have won the claim and run the handler a second time.
    let competitor = {
        let (env, runs) = (order(&id), runs.clone());
        tokio::spawn(async move {
            // Only once the slow run holds the claim: a competitor that came
            // first would win it itself and leave nothing to test.
            slow_started.await.unwrap();
            let mut parked = 0;
            loop {
                let done = finished.load(Ordering::SeqCst);
                let result = guard
                    .run(&env, async {
                        runs.fetch_add(1, Ordering::SeqCst);
                        Ok::<(), StoreError>(())
                    })
                    .await;
                match result {
                    Err(error) if error.is_parked() => parked += 1,
                    Err(error) => panic!("unexpected error: {error}"),
                    Ok(()) if done => return parked,
                    Ok(()) => {}
                }
                tokio::time::sleep(lease / 10).await;
            }
        })
    };
    slow.await
        .unwrap()
        .expect("the slow run kept its claim and committed");
    let parked = competitor.await.unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the slow handler ran once");
    assert!(parked >= 1, "the competitor met the live claim");
    assert!(
        store.renewals.load(Ordering::SeqCst) >= 1,
        "the lease was renewed"
    );
    assert!(store.seen(&id).await.unwrap());
}

// ---- stale owners and fences --------------------------------------------

#[tokio::test]
async fn a_stale_owner_changes_nothing_and_a_take_over_has_a_larger_fence() {
    let id = unique("stale");
    let store = InMemoryStore::new();
    let short = Duration::from_millis(20);
    let stale = ClaimToken::random();
    let first = won(&store, &id, stale, short).await;
    tokio::time::sleep(short * 2).await;

    let owner = ClaimToken::random();
    let second = won(&store, &id, owner, LONG).await;
    assert!(
        second > first,
        "an expired claim is taken over with a larger fence"
    );

    assert!(!store.release(&id, stale).await.unwrap());
    assert!(!store.commit(&id, stale).await.unwrap());
    assert!(!store.renew(&id, stale, LONG).await.unwrap());
    assert!(
        !store.seen(&id).await.unwrap(),
        "a stale commit marks nothing"
    );
    let other = store.claim(&id, ClaimToken::random(), LONG).await.unwrap();
    assert!(matches!(other, Claim::Held { .. }), "still held: {other:?}");

    assert!(store.renew(&id, owner, LONG).await.unwrap());
    assert!(store.commit(&id, owner).await.unwrap());
    assert!(store.seen(&id).await.unwrap());
}

#[tokio::test]
async fn fences_grow_across_claims_and_nested_guards_restore_the_outer_one() {
    let store = InMemoryStore::new();
    let claimed = Guard::new(&store).lease(LONG).unwrap();
    let (outer_id, inner_id) = (unique("outer"), unique("inner"));
    assert_eq!(fence(), None, "no fence outside a handler");

    let mut first = None;
    let declined = StoreError::new(StoreOperation::Seen, "handler", "declined");
    let _ = claimed
        .run(&order(&outer_id), async {
            first = fence();
            Err::<(), _>(declined)
        })
        .await;

    let mut seen = Vec::new();
    claimed
        .run(&order(&outer_id), async {
            seen.push(fence());
            claimed
                .run(&order(&inner_id), async {
                    seen.push(fence());
                    tokio::task::yield_now().await;
                    seen.push(fence());
                    Ok::<(), StoreError>(())
                })
                .await?;
            seen.push(fence());
            // A seen-set guard inside a claimed handler keeps the claim's fence.
            run_once(&store, &order(&unique("plain")), async {
                seen.push(fence());
                Ok::<(), StoreError>(())
            })
            .await?;
            Ok::<(), StoreError>(())
        })
        .await
        .unwrap();
    assert_eq!(fence(), None);

    let first = first.unwrap();
    let (outer, inner) = (seen[0].unwrap(), seen[1].unwrap());
    assert!(outer > first, "a later claim of one id has a larger fence");
    assert_ne!(inner, outer);
    assert_eq!(
        seen,
        [
            Some(outer),
            Some(inner),
            Some(inner),
            Some(outer),
            Some(outer)
        ]
    );

    let mut plain = Some(0);
    run_once(&store, &order(&unique("seen-set")), async {
        plain = fence();
        Ok::<(), StoreError>(())
    })
    .await
    .unwrap();
    assert_eq!(plain, None, "seen-set mode has no fence");
}

// ---- the router ----------------------------------------------------------

#[tokio::test]
async fn a_parked_delivery_is_released_after_a_delay_without_spending_an_attempt() {
    let store = Arc::new(InMemoryStore::new());
    let guard = Guard::new(store.clone()).lease(LONG).unwrap();
    let runs = Arc::new(AtomicU32::new(0));
    let router = Router::builder()
        .route(urn!("urn:babel:orders:created"), {
            let runs = runs.clone();
            move |env: Envelope| {
                let (guard, runs) = (guard.clone(), runs.clone());
                async move {
                    guard
                        .run(&env, async {
                            runs.fetch_add(1, Ordering::SeqCst);
                            Ok::<(), anyhow::Error>(())
                        })
                        .await
                }
            }
        })
        .build()
        .unwrap();

    let id = unique("routed");
    let mut env = order(&id);
    env.attempts = 2;
    let bytes = env.to_vec();
    let other = ClaimToken::random();
    won(&*store, &id, other, LONG).await;

    match router.dispatch(&bytes, Delivery::new()).await {
        Disposition::Release {
            urn,
            reason: ReleaseReason::Parked,
            delay: Some(delay),
        } => {
            assert_eq!(urn, "urn:babel:orders:created");
            assert!(delay > Duration::ZERO && delay <= LONG, "{delay:?}");
        }
        other => panic!("expected a parked release, got {other}"),
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0);

    // The other owner finishes; the released delivery comes back and is acked.
    assert!(store.commit(&id, other).await.unwrap());
    let again = router.dispatch(&bytes, Delivery::new()).await;
    assert!(again.is_ack(), "{again}");
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "the other owner's run counts"
    );

    // A plain failure still spends an attempt (2 before, 3 now).
    let failing = Router::builder()
        .route(urn!("urn:babel:orders:created"), |_: Envelope| async {
            Err::<(), _>(StoreError::new(StoreOperation::Claim, "redis", "refused"))
        })
        .max_attempts(5)
        .build()
        .unwrap();
    match failing.dispatch(&bytes, Delivery::new()).await {
        Disposition::Retry(retry) => assert_eq!(retry.attempts, 3),
        other => panic!("expected a retry, got {other}"),
    }
}

// ---- observability ---------------------------------------------------------

#[tokio::test]
async fn parked_and_lost_claim_are_counted() {
    let before = metrics::counts();
    let store = Outage {
        renew: true,
        ..Outage::default()
    };
    let id = unique("observed");
    // Held for the whole test: with a lease as short as the guard's, a pause
    // before the delivery would let it lapse and the delivery would win.
    won(&store, &id, ClaimToken::random(), LONG).await;
    let guard = Guard::new(&store).lease(Duration::from_millis(40)).unwrap();
    let parked = guard
        .run(&order(&id), async { Ok::<(), StoreError>(()) })
        .await;
    assert!(parked.unwrap_err().is_parked());

    let lost_id = unique("observed-lost");
    let lost = guard
        .run(&order(&lost_id), async {
            until_taken_over(&store, &lost_id, Duration::from_millis(10)).await;
            Ok::<(), StoreError>(())
        })
        .await;
    assert!(lost.unwrap_err().is_lost_claim());

    // Other tests in this binary count too: at least ours moved.
    let moved = metrics::counts().since(&before);
    assert!(moved.get(Decision::Parked) >= 1);
    assert!(moved.get(Decision::LostClaim) >= 1);
    assert_eq!(Decision::Parked.as_str(), "parked");
    assert_eq!(Decision::LostClaim.as_str(), "lost_claim");
}

#[allow(dead_code)]
fn guards_are_send_for_spawning(guard: Guard<Arc<InMemoryStore>, babel_idem::guard::Leased>) {
    fn assert_send<T: Send>(_: T) {}
    let env = order("x");
    let counter = AtomicU64::new(0);
    assert_send(guard.run(&env, async move {
        counter.fetch_add(1, Ordering::SeqCst);
        Ok::<(), StoreError>(())
    }));
}
