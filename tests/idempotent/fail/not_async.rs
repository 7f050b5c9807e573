//! A plain `fn` cannot await the store.
use std::sync::LazyLock;

use babel_idem::{Envelope, InMemoryStore, StoreError, idempotent};

static STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);

#[idempotent(store = STORE)]
fn on_order(env: Envelope) -> Result<(), StoreError> {
    let _ = env;
    Ok(())
}

fn main() {
    // The original item is still emitted, so this call is not a second error.
    let _ = on_order;
}
