//! A free `async fn` taking an owned `Envelope`, with a static store behind a
//! `LazyLock`; `?` and `return` inside the body stay local to the handler.

#[path = "../support.rs"]
mod support;

use std::sync::LazyLock;

use babel_idem::{Envelope, InMemoryStore, idempotent};
use support::{HandlerError, Runs};

static STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);
static RUNS: Runs = Runs::new();

/// Handles `urn:babel:orders:created`.
#[idempotent(store = STORE)]
async fn on_order_created(env: Envelope) -> Result<(), HandlerError> {
    if env.urn().is_empty() {
        return Ok(());
    }
    RUNS.record(&env)?;
    Ok(())
}

pub async fn exercise() {
    support::check_contract(&RUNS, on_order_created).await;
    // The future is `Send`, so it can be spawned on a multi-threaded runtime.
    let env = support::envelope(&support::fresh_id());
    support::assert_send(on_order_created(env)).await.unwrap();
}

fn main() {
    support::block_on(exercise());
}
