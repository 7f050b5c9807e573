//! A claim parked behind another owner, through `Router::dispatch`, on every
//! store that claims: in memory, SQLite, and the real Redis and PostgreSQL
//! (`BABEL_IDEM_REDIS_URL`, `BABEL_IDEM_POSTGRES_URL`; unset, a test prints a
//! `skipped:` line, or fails with `BABEL_IDEM_REQUIRE_SERVERS=1`).
//!
//! The delivery is released as parked whatever the handler's error type
//! keeps of the parked error, and only when the last claim decided in the
//! delivery parked: an error that merely carries a store error, parked or
//! not, from elsewhere is an ordinary failure and spends an attempt.

#[macro_use]
mod store_contract;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use babel_idem::router::ReleaseReason;
use babel_idem::store::{Claim, ClaimToken};
use babel_idem::{
    ClaimStore, Delivery, Disposition, Envelope, Guard, Router, StoreError, idempotent, urn,
};
use serde_json::json;

use store_contract::Backend;

/// Expands to one `#[tokio::test]` per check below, each opening its own
/// fixture with `$create(test_name) -> Option<impl Backend>`.
macro_rules! router_parked_tests {
    ($create:path) => {
        router_parked_tests!(@each $create:
            an_error_type_that_drops_its_source_is_still_released_as_parked,
            a_guard_nested_in_a_claimed_handler_that_parks_releases_the_delivery,
            a_store_error_the_handler_wraps_from_an_unrelated_call_spends_an_attempt,
            a_parked_error_from_a_guard_in_a_spawned_task_spends_an_attempt,
            a_handler_that_claims_after_a_park_and_then_fails_spends_an_attempt,
        );
    };
    (@each $create:path: $($check:ident),+ $(,)?) => {$(
        #[tokio::test]
        async fn $check() {
            if let Some(backend) = $create(stringify!($check)) {
                crate::$check(&backend).await;
            }
        }
    )+};
}

mod memory {
    use crate::store_contract::MemoryBackend;
    router_parked_tests!(MemoryBackend::create);
}

mod sqlite {
    use crate::store_contract::SqliteBackend;
    router_parked_tests!(SqliteBackend::create);
}

#[cfg(feature = "redis")]
mod redis {
    use crate::store_contract::RedisBackend;
    router_parked_tests!(RedisBackend::create);
}

#[cfg(feature = "postgres")]
mod postgres {
    use crate::store_contract::PostgresBackend;
    router_parked_tests!(PostgresBackend::create);
}

/// Outlives every check: a claim taken with it is live until released.
const LONG: Duration = Duration::from_secs(30);
const CREATED: &str = "urn:babel:orders:created";
/// The attempts every delivery here was made with before.
const ATTEMPTS_BEFORE: u64 = 2;

/// A handler error type that converts from `StoreError` and keeps nothing of
/// it: no source, no text.
#[derive(Debug, PartialEq)]
enum Opaque {
    Store,
    Declined,
}

impl From<StoreError> for Opaque {
    fn from(_: StoreError) -> Self {
        Opaque::Store
    }
}

impl std::fmt::Display for Opaque {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Opaque::Store => "the store refused",
            Opaque::Declined => "the payment was declined",
        })
    }
}

impl std::error::Error for Opaque {}

/// A handler error type that keeps the `StoreError` it wraps as its source.
#[derive(Debug, thiserror::Error)]
enum Wrapping {
    #[error("store: {0}")]
    Store(#[from] StoreError),
}

fn unique(name: &str) -> String {
    format!("{name}-{}", uuid::Uuid::new_v4())
}

fn order(id: &str) -> Envelope {
    Envelope::new(CREATED, json!({"order_id": 1042}))
        .with_id(id)
        .with_attempts(ATTEMPTS_BEFORE)
}

/// Takes `id`'s claim as another worker would, and keeps it (for `LONG`).
async fn held_by_another_owner(store: &(impl ClaimStore + ?Sized), id: &str) -> ClaimToken {
    let other = ClaimToken::random();
    match store.claim(id, other, LONG).await.unwrap() {
        Claim::Won { .. } => other,
        claim => panic!("the other owner claims {id} first: {claim:?}"),
    }
}

/// Whether `key` is free to claim: nobody holds it and it is not done.
async fn claimable(store: &(impl ClaimStore + ?Sized), key: &str) -> bool {
    matches!(
        store.claim(key, ClaimToken::random(), LONG).await.unwrap(),
        Claim::Won { .. }
    )
}

fn router_of<H, Args: 'static>(handler: H) -> Router
where
    H: babel_idem::router::Handler<Args>,
{
    Router::builder()
        .route(urn!("urn:babel:orders:created"), handler)
        .max_attempts(5)
        .build()
        .unwrap()
}

fn expect_parked_release(disposition: Disposition) {
    match disposition {
        Disposition::Release {
            urn,
            reason: ReleaseReason::Parked,
            delay: Some(delay),
        } => {
            assert_eq!(urn, CREATED);
            assert!(delay > Duration::ZERO && delay <= LONG, "{delay:?}");
        }
        other => panic!("expected a parked release, got {other}"),
    }
}

/// An ordinary failure: one attempt more, retried.
fn expect_attempt_spent(disposition: Disposition) {
    match disposition {
        Disposition::Retry(retry) => assert_eq!(retry.attempts, ATTEMPTS_BEFORE + 1),
        other => panic!("expected a retry, got {other}"),
    }
}

/// Claim mode through the attribute, generic over the store, with an error
/// type that drops the parked error's source.
#[idempotent(store = store, lease = LONG)]
async fn charge<S>(store: &S, runs: &AtomicU32, env: Envelope) -> Result<(), Opaque>
where
    S: ClaimStore + ?Sized,
{
    let _order = &env.data["order_id"];
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

async fn an_error_type_that_drops_its_source_is_still_released_as_parked<B>(backend: &B)
where
    B: Backend,
    B::Store: ClaimStore + Send + Sync,
{
    let store = Arc::new(backend.open_claims("parked_opaque", None).await);
    let runs = Arc::new(AtomicU32::new(0));
    let router = router_of({
        let (store, runs) = (store.clone(), runs.clone());
        move |env: Envelope| {
            let (store, runs) = (store.clone(), runs.clone());
            async move { charge(&*store, &runs, env).await }
        }
    });
    let id = unique("opaque");
    let other = held_by_another_owner(&*store, &id).await;

    expect_parked_release(router.dispatch(&order(&id).to_vec(), Delivery::new()).await);
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "a parked delivery does not run"
    );

    // The other owner gives up; the released delivery comes back and runs.
    assert!(store.release(&id, other).await.unwrap());
    let again = router.dispatch(&order(&id).to_vec(), Delivery::new()).await;
    assert!(again.is_ack(), "{again}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

async fn a_guard_nested_in_a_claimed_handler_that_parks_releases_the_delivery<B>(backend: &B)
where
    B: Backend,
    B::Store: ClaimStore + Send + Sync,
{
    let store = Arc::new(backend.open_claims("parked_nested", None).await);
    let outer = Guard::new(store.clone())
        .scope("orders")
        .lease(LONG)
        .unwrap();
    let inner = Guard::new(store.clone())
        .scope("billing")
        .lease(LONG)
        .unwrap();
    let id = unique("nested");
    let (outer_key, inner_key) = (outer.key(&order(&id)), inner.key(&order(&id)));
    held_by_another_owner(&*store, inner_key.as_str().unwrap()).await;

    let effects = Arc::new(AtomicU32::new(0));
    let router = router_of({
        let effects = effects.clone();
        move |env: Envelope| {
            let (outer, inner, effects) = (outer.clone(), inner.clone(), effects.clone());
            async move {
                outer
                    .run(&env, async {
                        inner
                            .run(&env, async {
                                effects.fetch_add(1, Ordering::SeqCst);
                                Ok::<(), Opaque>(())
                            })
                            .await
                    })
                    .await
            }
        }
    });

    expect_parked_release(router.dispatch(&order(&id).to_vec(), Delivery::new()).await);
    assert_eq!(effects.load(Ordering::SeqCst), 0);
    assert!(
        claimable(&*store, outer_key.as_str().unwrap()).await,
        "the outer guard gave its claim back"
    );
}

async fn a_store_error_the_handler_wraps_from_an_unrelated_call_spends_an_attempt<B>(backend: &B)
where
    B: Backend,
    B::Store: ClaimStore + Send + Sync,
{
    let store = Arc::new(backend.open_claims("parked_unrelated", None).await);
    let guard = Guard::new(store.clone()).lease(LONG).unwrap();
    let router = router_of({
        let store = store.clone();
        move |env: Envelope| {
            let (guard, store) = (guard.clone(), store.clone());
            async move {
                guard
                    .run(&env, async {
                        // A store call of the handler's own, which the store
                        // refuses: a claim no store can hold.
                        let other_id = unique("unrelated");
                        store
                            .claim(&other_id, ClaimToken::random(), Duration::ZERO)
                            .await?;
                        Ok::<(), Wrapping>(())
                    })
                    .await
            }
        }
    });
    let id = unique("unrelated");

    expect_attempt_spent(router.dispatch(&order(&id).to_vec(), Delivery::new()).await);
    assert!(
        claimable(&*store, &id).await,
        "the failed run gave its claim back"
    );
}

async fn a_parked_error_from_a_guard_in_a_spawned_task_spends_an_attempt<B>(backend: &B)
where
    B: Backend,
    B::Store: ClaimStore + Send + Sync,
{
    let store = Arc::new(backend.open_claims("parked_spawned", None).await);
    let elsewhere = unique("elsewhere");
    held_by_another_owner(&*store, &elsewhere).await;
    let router = router_of({
        let store = store.clone();
        let elsewhere = elsewhere.clone();
        move |_: Envelope| {
            let guard = Guard::new(store.clone()).lease(LONG).unwrap();
            let other_message = order(&elsewhere);
            async move {
                // Another message's guard, polled by a task of its own: not
                // part of this delivery's future.
                let answer = tokio::spawn(async move {
                    guard
                        .run(&other_message, async { Ok::<(), StoreError>(()) })
                        .await
                })
                .await
                .unwrap();
                let error = answer.unwrap_err();
                assert!(error.is_parked(), "{error}");
                Err::<(), Wrapping>(error.into())
            }
        }
    });

    expect_attempt_spent(
        router
            .dispatch(&order(&unique("spawning")).to_vec(), Delivery::new())
            .await,
    );
}

async fn a_handler_that_claims_after_a_park_and_then_fails_spends_an_attempt<B>(backend: &B)
where
    B: Backend,
    B::Store: ClaimStore + Send + Sync,
{
    let store = Arc::new(backend.open_claims("parked_then_won", None).await);
    let guard = Guard::new(store.clone()).lease(LONG).unwrap();
    let id = unique("then-won");
    let other = held_by_another_owner(&*store, &id).await;
    let router = router_of({
        let store = store.clone();
        move |env: Envelope| {
            let (guard, store) = (guard.clone(), store.clone());
            async move {
                let first = guard.run(&env, async { Ok::<(), Opaque>(()) }).await;
                assert_eq!(first, Err(Opaque::Store), "parked behind the other owner");
                // The other owner gives up; the handler claims and runs, and fails.
                assert!(
                    store
                        .release(env.meta.id.as_deref().unwrap(), other)
                        .await
                        .unwrap()
                );
                guard.run(&env, async { Err(Opaque::Declined) }).await
            }
        }
    });

    expect_attempt_spent(router.dispatch(&order(&id).to_vec(), Delivery::new()).await);
    assert!(
        claimable(&*store, &id).await,
        "the failed run gave its claim back"
    );
}

/// A PHP worker's claim with an hour left: the delivery parked behind it
/// comes back within the router's bound, not after the hour, and once the
/// PHP worker commits, the next delivery is skipped.
#[cfg(feature = "redis")]
mod php_claim {
    use super::*;
    use crate::store_contract::RedisBackend;
    use ::redis::AsyncCommands;
    use babel_idem::router::DEFAULT_MAX_PARK_DELAY;
    use babel_idem::store::RedisStore;

    /// The PHP SDK's claim: `SET <prefix><id> 1 PX <ms> NX`.
    const PHP_CLAIM_TTL: Duration = Duration::from_secs(3_600);

    #[tokio::test]
    async fn a_delivery_behind_a_php_claim_of_an_hour_polls_back_within_the_bound() {
        let test = "a_delivery_behind_a_php_claim_of_an_hour_polls_back_within_the_bound";
        let Some(backend) = RedisBackend::create(test) else {
            return;
        };
        let store = Arc::new(
            RedisStore::builder()
                .php_claims()
                .prefix(backend.prefix("php_park"))
                .connect_lazy(&backend.url)
                .unwrap(),
        );
        let runs = Arc::new(AtomicU32::new(0));
        let handler = {
            let (store, runs) = (store.clone(), runs.clone());
            move |env: Envelope| {
                let (store, runs) = (store.clone(), runs.clone());
                async move { charge(&*store, &runs, env).await }
            }
        };
        let bound = Duration::from_secs(2);
        let routers = [
            (router_of(handler.clone()), DEFAULT_MAX_PARK_DELAY),
            (
                Router::builder()
                    .route(urn!("urn:babel:orders:created"), handler)
                    .max_park_delay(bound)
                    .build()
                    .unwrap(),
                bound,
            ),
        ];

        let id = unique("php");
        let key = store.key(&id);
        let mut raw = backend.raw().await;
        let set: Option<String> = ::redis::cmd("SET")
            .arg(&key)
            .arg("1")
            .arg("PX")
            .arg(PHP_CLAIM_TTL.as_millis() as u64)
            .arg("NX")
            .query_async(&mut raw)
            .await
            .unwrap();
        assert_eq!(set.as_deref(), Some("OK"), "the PHP worker claims first");

        for (router, max) in &routers {
            match router.dispatch(&order(&id).to_vec(), Delivery::new()).await {
                Disposition::Release {
                    reason: ReleaseReason::Parked,
                    delay: Some(delay),
                    ..
                } => assert!(
                    delay <= *max,
                    "parked for {delay:?}, the bound is {max:?} (the claim has an hour left)"
                ),
                other => panic!("expected a parked release, got {other}"),
            }
        }
        assert_eq!(runs.load(Ordering::SeqCst), 0, "the handler never ran");

        // The PHP worker commits (`SET key 2`): the next delivery is skipped
        // (acked without running).
        let _: () = raw.set(&key, "2").await.unwrap();
        for (router, _) in &routers {
            let disposition = router.dispatch(&order(&id).to_vec(), Delivery::new()).await;
            assert!(matches!(disposition, Disposition::Ack), "{disposition}");
        }
        assert_eq!(runs.load(Ordering::SeqCst), 0, "done by the PHP worker");
        let _: () = raw.del(&key).await.unwrap();
    }
}
