//! `scope` keeps two handlers sharing one store apart; `on_remember_failure`
//! chooses between acking (the default) and returning the store error when
//! the body succeeded but its id could not be remembered.

#[path = "../support.rs"]
mod support;

use std::sync::LazyLock;

use babel_idem::{Envelope, InMemoryStore, Store, idempotent};
use support::{ForgetfulStore, HandlerError, Runs};

static SHARED: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);
static BILLING: Runs = Runs::new();
static SHIPPING: Runs = Runs::new();

#[idempotent(store = SHARED, scope = "billing")]
async fn bill(env: Envelope) -> Result<(), HandlerError> {
    BILLING.record(&env)
}

#[idempotent(store = SHARED, scope = "shipping")]
async fn ship(env: Envelope) -> Result<(), HandlerError> {
    SHIPPING.record(&env)
}

static FORGETFUL: ForgetfulStore = ForgetfulStore;
static ACKED: Runs = Runs::new();
static RETURNED: Runs = Runs::new();

#[idempotent(store = FORGETFUL, on_remember_failure = AckAndReport)]
async fn acks(env: Envelope) -> Result<(), HandlerError> {
    ACKED.record(&env)
}

#[idempotent(store = FORGETFUL, on_remember_failure = ReturnError)]
async fn returns(env: Envelope) -> Result<(), HandlerError> {
    RETURNED.record(&env)
}

pub async fn exercise() {
    support::check_contract(&BILLING, bill).await;
    support::check_contract(&SHIPPING, ship).await;

    let id = support::fresh_id();
    let env = support::envelope(&id);
    let (billed, shipped) = (BILLING.count(), SHIPPING.count());
    bill(env.clone()).await.unwrap();
    ship(env.clone()).await.unwrap();
    bill(env.clone()).await.unwrap();
    ship(env).await.unwrap();
    assert_eq!(BILLING.count(), billed + 1, "billing ran once");
    assert_eq!(
        SHIPPING.count(),
        shipped + 1,
        "shipping was not skipped by billing's mark"
    );
    assert!(SHARED.seen(&format!("7:billing:{id}")).await.unwrap());
    assert!(SHARED.seen(&format!("8:shipping:{id}")).await.unwrap());
    assert!(
        !SHARED.seen(&id).await.unwrap(),
        "no unscoped key was written"
    );

    let env = support::envelope(&id);
    acks(env.clone())
        .await
        .expect("the default acks a failed remember");
    match returns(env).await {
        Err(HandlerError::Store(error)) => assert!(error.to_string().contains("disk full")),
        other => panic!("ReturnError hands the store error back, got {other:?}"),
    }
    assert_eq!((ACKED.count(), RETURNED.count()), (1, 1), "both bodies ran");
}

fn main() {
    support::block_on(exercise());
}
