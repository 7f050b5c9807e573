//! `store = ...` must be a `Store` or reach one by auto-deref.
use std::sync::LazyLock;

use babel_idem::{Envelope, InMemoryStore, StoreError, idempotent};

static STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);

static NOT_A_STORE: LazyLock<Vec<String>> = LazyLock::new(Vec::new);

#[idempotent(store = NOT_A_STORE)]
async fn on_order(env: Envelope) -> Result<(), StoreError> {
    let _ = (env, &STORE);
    Ok(())
}

fn main() {
    let _ = on_order;
}
