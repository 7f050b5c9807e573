//! An argument given twice is ambiguous.
use std::sync::LazyLock;

use babel_idem::{Envelope, InMemoryStore, StoreError, idempotent};

static STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);

#[idempotent(store = STORE, scope = "billing", store = STORE)]
async fn on_order(env: Envelope) -> Result<(), StoreError> {
    let _ = env;
    Ok(())
}

fn main() {
    let _ = on_order;
}
