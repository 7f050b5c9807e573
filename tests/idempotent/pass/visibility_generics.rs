//! `pub(crate)` and `pub` handlers, a generic handler with a `where` clause
//! whose store is a parameter, and explicit lifetimes (`&'a Envelope`).

#[path = "../support.rs"]
mod support;

use std::sync::LazyLock;

use babel_idem::{Envelope, InMemoryStore, Store, idempotent};
use support::{HandlerError, Runs};

static STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);

mod handlers {
    use super::*;

    pub static RUNS: Runs = Runs::new();

    #[idempotent(store = STORE)]
    pub(crate) async fn crate_visible(env: Envelope) -> Result<(), HandlerError> {
        RUNS.record(&env)
    }

    #[idempotent(store = STORE, scope = "pub")]
    pub async fn public(env: Envelope) -> Result<(), HandlerError> {
        RUNS.record(&env)
    }
}

static GENERIC_RUNS: Runs = Runs::new();

/// Generic over the store and the error, with a `where` clause.
#[idempotent(store = store)]
async fn generic<S, E>(store: &S, env: Envelope) -> Result<(), E>
where
    S: Store + ?Sized,
    E: From<babel_idem::StoreError> + From<HandlerError>,
{
    GENERIC_RUNS.record(&env)?;
    Ok(())
}

static BORROWED_RUNS: Runs = Runs::new();

/// Explicit lifetimes: the handler borrows the envelope and a context.
#[idempotent(store = STORE, scope = "borrowed")]
async fn borrowed<'a, 'b: 'a>(env: &'a Envelope, tag: &'b str) -> Result<(), HandlerError> {
    assert_eq!(tag, "orders");
    BORROWED_RUNS.record(env)
}

pub async fn exercise() {
    support::check_contract(&handlers::RUNS, handlers::crate_visible).await;
    support::check_contract(&handlers::RUNS, handlers::public).await;

    let store = InMemoryStore::new();
    support::check_contract(&GENERIC_RUNS, |env| generic::<_, HandlerError>(&store, env)).await;

    let env = support::envelope(&support::fresh_id());
    support::assert_send(generic::<_, HandlerError>(&store, env))
        .await
        .unwrap();

    let dyn_store: &dyn Store = &store;
    let env = support::envelope(&support::fresh_id());
    generic::<dyn Store, HandlerError>(dyn_store, env.clone())
        .await
        .unwrap();
    generic::<dyn Store, HandlerError>(dyn_store, env)
        .await
        .unwrap();

    let before = BORROWED_RUNS.count();
    let env = support::envelope(&support::fresh_id());
    borrowed(&env, "orders").await.unwrap();
    borrowed(&env, "orders").await.unwrap();
    assert_eq!(
        BORROWED_RUNS.count(),
        before + 1,
        "a borrowed duplicate is skipped"
    );
    support::assert_send(borrowed(&env, "orders"))
        .await
        .unwrap();
}

fn main() {
    support::block_on(exercise());
}
