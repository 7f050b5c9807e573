//! Claim mode through the attribute, `lease = EXPR`: a free fn with a static
//! store, a method whose store and lease are fields, and a handler generic
//! over its `ClaimStore`. Each keeps the contract, sees its fence, and parks
//! a delivery whose id another owner is running.

#[path = "../support.rs"]
mod support;

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use babel_idem::store::{Claim, ClaimToken};
use babel_idem::{ClaimStore, Envelope, InMemoryStore, MessageId, idempotent};
use babel_idem::guard::fence;
use babel_idem::key::DedupeKey;
use support::{HandlerError, Runs};

static STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);
static RUNS: Runs = Runs::new();

/// A free fn: the lease is any `Duration` expression.
#[idempotent(store = STORE, lease = Duration::from_secs(30))]
async fn on_order_created(env: Envelope) -> Result<(), HandlerError> {
    claimed_iff_identified(&env);
    RUNS.record(&env)
}

struct Billing {
    store: Arc<InMemoryStore>,
    lease: Duration,
    runs: Runs,
}

impl Billing {
    /// A method: store and lease are read from `self` on each call.
    #[idempotent(store = self.store, lease = self.lease, scope = "billing")]
    async fn on_order(&self, env: Envelope) -> Result<(), HandlerError> {
        claimed_iff_identified(&env);
        self.runs.record(&env)
    }
}

static GENERIC_RUNS: Runs = Runs::new();

/// Generic over the store: any `ClaimStore` will do.
#[idempotent(store = store, lease = lease)]
async fn generic<S>(store: &S, lease: Duration, env: Envelope) -> Result<(), HandlerError>
where
    S: ClaimStore + ?Sized,
{
    claimed_iff_identified(&env);
    GENERIC_RUNS.record(&env)
}

/// A claimed handler sees its fence; a message without an id runs unclaimed.
fn claimed_iff_identified(env: &Envelope) {
    assert_eq!(fence().is_some(), env.message_id().is_some());
}

/// A delivery whose id another owner holds is parked: not run, not acked.
async fn parks<F, Fut>(store: &InMemoryStore, scope: Option<&str>, deliver: F)
where
    F: FnOnce(Envelope) -> Fut,
    Fut: std::future::Future<Output = Result<(), HandlerError>>,
{
    let id = support::fresh_id();
    let env = support::envelope(&id);
    let key = DedupeKey::new(scope, &env);
    let key = key.as_str().expect("the envelope has an id");
    let claim = store.claim(key, ClaimToken::random(), Duration::from_secs(30)).await;
    assert!(matches!(claim, Ok(Claim::Won { .. })));
    match deliver(env).await {
        Err(HandlerError::Store(error)) => assert!(error.is_parked(), "{error}"),
        other => panic!("expected a parked delivery, got {other:?}"),
    }
}

pub async fn exercise() {
    support::check_contract(&RUNS, on_order_created).await;
    parks(&STORE, None, on_order_created).await;
    let env = support::envelope(&support::fresh_id());
    support::assert_send(on_order_created(env)).await.unwrap();

    let billing = Billing {
        store: Arc::new(InMemoryStore::new()),
        lease: Duration::from_secs(30),
        runs: Runs::new(),
    };
    support::check_contract(&billing.runs, |env| billing.on_order(env)).await;
    parks(&billing.store, Some("billing"), |env| billing.on_order(env)).await;

    let store = InMemoryStore::new();
    let lease = Duration::from_secs(30);
    support::check_contract(&GENERIC_RUNS, |env| generic(&store, lease, env)).await;
    parks(&store, None, |env| generic(&store, lease, env)).await;
    let env = support::envelope(&support::fresh_id());
    support::assert_send(generic(&store, lease, env)).await.unwrap();

    // A lease no store can hold: the handler does not run, the caller gets
    // the store error.
    let refused = generic(&store, Duration::ZERO, support::envelope(&support::fresh_id())).await;
    match refused {
        Err(HandlerError::Store(error)) => assert!(error.to_string().contains("out of range")),
        other => panic!("expected the refused lease, got {other:?}"),
    }
}

fn main() {
    support::block_on(exercise());
}
