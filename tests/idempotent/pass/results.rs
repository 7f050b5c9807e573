//! Return types: a `Result` alias the macro cannot see into, `anyhow::Result<()>`,
//! `Box<dyn Error + Send + Sync>`, a fully qualified `std::result::Result`,
//! and a user error with `From<StoreError>`; `?` converts into each.

#[path = "../support.rs"]
mod support;

use std::error::Error;
use std::sync::LazyLock;

use babel_idem::{Envelope, InMemoryStore, idempotent};
use support::{HandlerError, Runs};

static STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);
static RUNS: Runs = Runs::new();

type Outcome = Result<(), HandlerError>;

#[idempotent(store = STORE, scope = "alias")]
async fn aliased(env: Envelope) -> Outcome {
    RUNS.record(&env)?;
    Ok(())
}

mod app {
    /// An alias with a default, like `anyhow::Result`.
    pub type Result<T = (), E = super::HandlerError> = std::result::Result<T, E>;
}

#[idempotent(store = STORE, scope = "defaulted")]
async fn defaulted(env: Envelope) -> app::Result {
    RUNS.record(&env)?;
    Ok(())
}

#[idempotent(store = STORE, scope = "anyhow")]
async fn with_anyhow(env: Envelope) -> anyhow::Result<()> {
    RUNS.record(&env)?;
    anyhow::ensure!(!env.urn().is_empty(), "no urn");
    Ok(())
}

#[idempotent(store = STORE, scope = "boxed")]
async fn boxed(env: Envelope) -> Result<(), Box<dyn Error + Send + Sync>> {
    RUNS.record(&env)?;
    let _parsed: u32 = "42".parse()?;
    Ok(())
}

#[idempotent(store = STORE, scope = "qualified")]
async fn qualified(env: Envelope) -> std::result::Result<(), HandlerError> {
    RUNS.record(&env)
}

pub async fn exercise() {
    support::check_contract(&RUNS, aliased).await;
    support::check_contract(&RUNS, defaulted).await;
    support::check_contract(&RUNS, with_anyhow).await;
    support::check_contract(&RUNS, boxed).await;
    support::check_contract(&RUNS, qualified).await;
    let env = support::envelope(&support::fresh_id());
    support::assert_send(with_anyhow(env.clone()))
        .await
        .unwrap();
    support::assert_send(boxed(env)).await.unwrap();
}

fn main() {
    support::block_on(exercise());
}
