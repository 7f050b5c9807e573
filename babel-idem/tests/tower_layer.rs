//! `IdempotencyLayer` (feature `tower`) composed with tower's own timeout and
//! retry layers, in the orders that make sense, in seen-set and claim mode:
//! how often the inner service runs, what the layered service answers, and
//! that a failed or timed-out call leaves the id unmarked.
#![cfg(feature = "tower")]

mod store_contract;

use std::collections::HashMap;
use std::future::{Future, Ready, ready};
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use babel_idem::adapters::tower::{Guarded, GuardedError, IdempotencyLayer};
use babel_idem::store::ClaimToken;
use babel_idem::{ClaimStore, Envelope, Guard, InMemoryStore, Store};
use serde_json::json;
use tower::retry::Policy;
use tower::{BoxError, Service, ServiceBuilder, ServiceExt};

/// Long enough for an answered call; a hanging call never answers at all.
const TIMEOUT: Duration = Duration::from_millis(200);

/// What the inner service does on its n-th call for one id (the last step
/// repeats): answer, fail, or hang until a timeout drops it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Answer,
    Fail,
    Hang,
}

fn order(steps: &[&str]) -> Envelope {
    Envelope::new("urn:babel:orders:created", json!({ "steps": steps }))
        .with_id(uuid::Uuid::new_v4().to_string())
}

/// The message's id; `""` for one without.
fn id(env: &Envelope) -> String {
    env.meta.id.clone().unwrap_or_default()
}

/// The inner service: follows each message's script and counts, per id,
/// its calls and its completed effects.
#[derive(Clone, Default)]
struct Charge {
    calls: Arc<Mutex<HashMap<String, usize>>>,
    effects: Arc<Mutex<HashMap<String, usize>>>,
}

impl Charge {
    fn calls(&self, id: &str) -> usize {
        self.calls.lock().unwrap().get(id).copied().unwrap_or(0)
    }
    fn effects(&self, id: &str) -> usize {
        self.effects.lock().unwrap().get(id).copied().unwrap_or(0)
    }
}

impl Service<Envelope> for Charge {
    type Response = String;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<String, io::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), io::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, env: Envelope) -> Self::Future {
        let id = id(&env);
        let call = {
            let mut calls = self.calls.lock().unwrap();
            let call = calls.entry(id.clone()).or_default();
            *call += 1;
            *call
        };
        let steps = env.data["steps"].as_array().unwrap();
        let step = match steps[(call - 1).min(steps.len() - 1)].as_str().unwrap() {
            "answer" => Step::Answer,
            "fail" => Step::Fail,
            _ => Step::Hang,
        };
        let effects = self.effects.clone();
        Box::pin(async move {
            match step {
                Step::Answer => {
                    *effects.lock().unwrap().entry(id.clone()).or_default() += 1;
                    Ok(format!("charged {id}"))
                }
                Step::Fail => Err(io::Error::other("payment gateway refused")),
                Step::Hang => std::future::pending().await,
            }
        })
    }
}

/// Retries an error up to `0` more times, at once.
#[derive(Clone)]
struct RetryErrors(usize);

impl<Res, E> Policy<Envelope, Res, E> for RetryErrors {
    type Future = Ready<()>;

    fn retry(&mut self, _: &mut Envelope, result: &mut Result<Res, E>) -> Option<Self::Future> {
        if result.is_err() && self.0 > 0 {
            self.0 -= 1;
            Some(ready(()))
        } else {
            None
        }
    }

    fn clone_request(&mut self, request: &Envelope) -> Option<Envelope> {
        Some(request.clone())
    }
}

async fn marked<S: Store>(store: &S, env: &Envelope) -> bool {
    store.seen(&id(env)).await.unwrap()
}

#[tokio::test]
async fn retry_outside_the_layer_retries_each_attempt_through_the_guard() {
    let store = Arc::new(InMemoryStore::new());
    let charge = Charge::default();
    let service = ServiceBuilder::new()
        .retry(RetryErrors(2))
        .layer(IdempotencyLayer::new(Guard::new(store.clone())))
        .timeout(TIMEOUT)
        .service(charge.clone());

    // Hangs once (timed out: unmarked), fails once (unmarked), then answers.
    let flaky = order(&["hang", "fail", "answer"]);
    let answer = service.clone().oneshot(flaky.clone()).await.unwrap();
    assert_eq!(answer, Guarded::Ran(format!("charged {}", id(&flaky))));
    assert_eq!(
        (charge.calls(&id(&flaky)), charge.effects(&id(&flaky))),
        (3, 1)
    );
    assert!(marked(&store, &flaky).await);

    // A redelivery is skipped: the inner service is not called again.
    let again = service.clone().oneshot(flaky.clone()).await.unwrap();
    assert_eq!(again, Guarded::Skipped);
    assert_eq!(charge.calls(&id(&flaky)), 3);

    // Every attempt fails: the error comes back and the id stays unmarked.
    let broken = order(&["fail"]);
    let error = service.clone().oneshot(broken.clone()).await.unwrap_err();
    assert!(matches!(error, GuardedError::Service(_)), "{error:?}");
    assert_eq!(charge.calls(&id(&broken)), 3, "one call and two retries");
    assert!(!marked(&store, &broken).await);

    // Every attempt times out: unmarked too, and the error is tower's Elapsed.
    let stuck = order(&["hang"]);
    let error = service.clone().oneshot(stuck.clone()).await.unwrap_err();
    let GuardedError::Service(elapsed) = error else {
        panic!("expected the timeout's error, got {error:?}");
    };
    assert!(elapsed.is::<tower::timeout::error::Elapsed>(), "{elapsed}");
    assert!(!marked(&store, &stuck).await);
    assert_eq!(charge.effects(&id(&stuck)), 0);
}

#[tokio::test]
async fn retry_inside_the_layer_is_decided_once_on_its_final_outcome() {
    let store = Arc::new(InMemoryStore::new());
    let charge = Charge::default();
    let service = ServiceBuilder::new()
        .layer(IdempotencyLayer::new(Guard::new(store.clone())))
        .retry(RetryErrors(2))
        .timeout(TIMEOUT)
        .service(charge.clone());

    let flaky = order(&["hang", "answer"]);
    let answer = service.clone().oneshot(flaky.clone()).await.unwrap();
    assert!(matches!(answer, Guarded::Ran(_)), "{answer:?}");
    assert_eq!(
        (charge.calls(&id(&flaky)), charge.effects(&id(&flaky))),
        (2, 1)
    );
    assert!(marked(&store, &flaky).await);
    assert_eq!(
        service.clone().oneshot(flaky.clone()).await.unwrap(),
        Guarded::Skipped
    );
    assert_eq!(charge.calls(&id(&flaky)), 2);

    let broken = order(&["fail", "fail", "hang"]);
    let error = service.clone().oneshot(broken.clone()).await.unwrap_err();
    let error: BoxError = error.into_service().expect("the inner stack's error");
    assert!(error.is::<tower::timeout::error::Elapsed>(), "{error}");
    assert_eq!(charge.calls(&id(&broken)), 3);
    assert!(!marked(&store, &broken).await);
}

#[tokio::test]
async fn a_timeout_outside_the_layer_drops_the_guard_and_leaves_the_id_unmarked() {
    let store = Arc::new(InMemoryStore::new());
    let charge = Charge::default();
    let service = ServiceBuilder::new()
        .timeout(TIMEOUT)
        .layer(IdempotencyLayer::new(Guard::new(store.clone())))
        .service(charge.clone());

    let slow = order(&["hang", "answer"]);
    let error = service.clone().oneshot(slow.clone()).await.unwrap_err();
    assert!(error.is::<tower::timeout::error::Elapsed>(), "{error}");
    assert!(
        !marked(&store, &slow).await,
        "a dropped guard marks nothing"
    );

    // The redelivery runs (the first never finished), then is marked.
    let answer = service.clone().oneshot(slow.clone()).await.unwrap();
    assert!(matches!(answer, Guarded::Ran(_)), "{answer:?}");
    assert_eq!(
        (charge.calls(&id(&slow)), charge.effects(&id(&slow))),
        (2, 1)
    );
    assert!(marked(&store, &slow).await);

    // The layer's own error goes through the timeout as a boxed error.
    let broken = order(&["fail"]);
    let error = service.clone().oneshot(broken.clone()).await.unwrap_err();
    let error = error
        .downcast::<GuardedError<io::Error>>()
        .expect("the layer's error");
    assert_eq!(error.to_string(), "payment gateway refused");
    assert!(!marked(&store, &broken).await);
}

#[tokio::test]
async fn a_message_without_an_id_runs_every_time() {
    use tower::Layer;

    let charge = Charge::default();
    let mut service = IdempotencyLayer::new(Guard::new(InMemoryStore::new())).layer(charge.clone());
    let anonymous = order(&["answer"]).without_id();
    for _ in 0..2 {
        let answer = service.ready().await.unwrap().call(anonymous.clone()).await;
        assert!(matches!(answer, Ok(Guarded::Ran(_))), "{answer:?}");
    }
    assert_eq!((charge.calls(""), charge.effects("")), (2, 2));
}

/// Claim mode on one store: a held id parks (the inner service is not
/// called), a done id skips, and a failure releases the claim.
async fn claim_mode_on<S: ClaimStore + 'static>(store: Arc<S>) {
    let charge = Charge::default();
    let guard = Guard::new(store.clone())
        .lease(Duration::from_secs(10))
        .unwrap();
    let service = ServiceBuilder::new()
        .retry(RetryErrors(1))
        .layer(IdempotencyLayer::new(guard))
        .timeout(TIMEOUT)
        .service(charge.clone());

    let flaky = order(&["fail", "answer"]);
    let answer = service.clone().oneshot(flaky.clone()).await.unwrap();
    assert!(matches!(answer, Guarded::Ran(_)), "{answer:?}");
    assert_eq!(
        (charge.calls(&id(&flaky)), charge.effects(&id(&flaky))),
        (2, 1)
    );
    assert_eq!(
        service.clone().oneshot(flaky.clone()).await.unwrap(),
        Guarded::Skipped
    );
    assert!(marked(&*store, &flaky).await);

    let held = order(&["answer"]);
    store
        .claim(&id(&held), ClaimToken::random(), Duration::from_secs(10))
        .await
        .unwrap();
    let error = service.clone().oneshot(held.clone()).await.unwrap_err();
    let GuardedError::Store(parked) = error else {
        panic!("expected a parked store error, got {error:?}");
    };
    assert!(parked.is_parked(), "{parked}");
    assert_eq!(charge.calls(&id(&held)), 0, "a parked request is not run");

    // Timed out twice: each attempt's claim is released or lapses; unmarked.
    let stuck = order(&["hang"]);
    service.clone().oneshot(stuck.clone()).await.unwrap_err();
    assert!(!marked(&*store, &stuck).await);
}

#[tokio::test]
async fn claim_mode_in_memory() {
    claim_mode_on(Arc::new(InMemoryStore::new())).await;
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn claim_mode_on_real_redis() {
    use store_contract::{Backend, RedisBackend};
    let Some(backend) = RedisBackend::create("claim_mode_on_real_redis") else {
        return;
    };
    claim_mode_on(Arc::new(backend.open("tower", None).await)).await;
}
