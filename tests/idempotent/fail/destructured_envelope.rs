//! The envelope must be bound to a name so the guard can read its id.
use std::sync::LazyLock;

use babel_idem::{Envelope, InMemoryStore, StoreError, idempotent};

static STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);

#[idempotent(store = STORE)]
async fn on_order(Envelope { data, .. }: Envelope) -> Result<(), StoreError> {
    let _ = data;
    Ok(())
}

fn main() {
    let _ = on_order;
}
