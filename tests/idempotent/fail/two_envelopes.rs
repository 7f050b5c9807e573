//! Two envelope parameters: the macro will not guess which one is the message.
use std::sync::LazyLock;

use babel_idem::{Envelope, InMemoryStore, StoreError, idempotent};

static STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);

#[idempotent(store = STORE)]
async fn on_merge(left: Envelope, right: &Envelope) -> Result<(), StoreError> {
    let _ = (left, right);
    Ok(())
}

fn main() {
    let _ = on_merge;
}
