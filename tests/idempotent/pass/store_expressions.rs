//! What `store = ...` accepts: a `LazyLock` static, an `Arc<dyn Store>` inside
//! a static, a method on a borrowed context, a deref'd `Arc`, and a local
//! variable; and the generated locals never clash with the user's names.

#[path = "../support.rs"]
mod support;

use std::sync::{Arc, LazyLock};

use babel_idem::{Envelope, InMemoryStore, Store, idempotent};
use support::{HandlerError, Runs};

static RUNS: Runs = Runs::new();

static DYN_STORE: LazyLock<Arc<dyn Store>> = LazyLock::new(|| Arc::new(InMemoryStore::new()));

#[idempotent(store = DYN_STORE)]
async fn dyn_static(env: Envelope) -> Result<(), HandlerError> {
    RUNS.record(&env)
}

struct Context {
    store: Arc<dyn Store>,
}

impl Context {
    fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }
}

#[idempotent(store = ctx.store())]
async fn through_context(ctx: &Context, env: Envelope) -> Result<(), HandlerError> {
    let _ = &ctx.store;
    RUNS.record(&env)
}

/// An owned context: the store is cloned out before the body takes `ctx`.
#[idempotent(store = ctx.store().clone())]
async fn owned_context(ctx: Context, env: Envelope) -> Result<(), HandlerError> {
    drop(ctx);
    RUNS.record(&env)
}

#[idempotent(store = &*shared)]
async fn deref_arc(shared: Arc<InMemoryStore>, env: Envelope) -> Result<(), HandlerError> {
    RUNS.record(&env)
}

/// Parameters named like the generated locals stay the user's own.
#[idempotent(store = __babel_idem_store)]
async fn shadowing(
    __babel_idem_store: &InMemoryStore,
    env: Envelope,
    __babel_idem_key: u8,
    __babel_idem_guard: &str,
) -> Result<(), HandlerError> {
    assert_eq!((__babel_idem_key, __babel_idem_guard), (7, "mine"));
    RUNS.record(&env)
}

pub async fn exercise() {
    support::check_contract(&RUNS, dyn_static).await;

    let ctx = Context {
        store: Arc::new(InMemoryStore::new()),
    };
    support::check_contract(&RUNS, |env| through_context(&ctx, env)).await;

    let shared: Arc<dyn Store> = Arc::new(InMemoryStore::new());
    support::check_contract(&RUNS, |env| {
        owned_context(
            Context {
                store: shared.clone(),
            },
            env,
        )
    })
    .await;

    let store = Arc::new(InMemoryStore::new());
    support::check_contract(&RUNS, |env| deref_arc(store.clone(), env)).await;

    let local = InMemoryStore::new();
    support::check_contract(&RUNS, |env| shadowing(&local, env, 7, "mine")).await;
}

fn main() {
    support::block_on(exercise());
}
