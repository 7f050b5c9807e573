//! A misspelt or invented argument names the ones that exist.
use std::sync::LazyLock;

use babel_idem::{Envelope, InMemoryStore, StoreError, idempotent};

static STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);

#[idempotent(store = STORE, ttl = 60)]
async fn on_order(env: Envelope) -> Result<(), StoreError> {
    let _ = env;
    Ok(())
}

#[idempotent(stor = STORE)]
async fn on_refund(env: Envelope) -> Result<(), StoreError> {
    let _ = env;
    Ok(())
}

fn main() {
    let _ = (on_order, on_refund);
}
