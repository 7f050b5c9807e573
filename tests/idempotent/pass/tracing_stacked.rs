//! Stacked with `#[tracing::instrument]` in both orders: each attribute keeps
//! the other's output working, and the handler still dedupes.

#[path = "../support.rs"]
mod support;

use std::sync::LazyLock;

use babel_idem::{Envelope, InMemoryStore, idempotent};
use support::{HandlerError, Runs};

static STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);
static RUNS: Runs = Runs::new();

#[idempotent(store = STORE, scope = "outer")]
#[tracing::instrument(skip_all, fields(urn = env.urn()))]
async fn idempotent_outside(env: Envelope) -> Result<(), HandlerError> {
    tracing::info!("running");
    RUNS.record(&env)
}

#[tracing::instrument(skip(env), err(Debug))]
#[idempotent(store = STORE, scope = "inner")]
async fn instrument_outside(env: Envelope, attempt: u32) -> Result<(), HandlerError> {
    tracing::info!(attempt, "running");
    RUNS.record(&env)
}

pub async fn exercise() {
    support::check_contract(&RUNS, idempotent_outside).await;
    support::check_contract(&RUNS, |env| instrument_outside(env, 1)).await;
    let env = support::envelope(&support::fresh_id());
    support::assert_send(idempotent_outside(env.clone()))
        .await
        .unwrap();
    support::assert_send(instrument_outside(env, 2))
        .await
        .unwrap();
}

fn main() {
    support::block_on(exercise());
}
