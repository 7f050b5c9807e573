//! Without `store = ...` there is no seen-set to consult.
use std::sync::LazyLock;

use babel_idem::{Envelope, InMemoryStore, StoreError, idempotent};

static STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);

#[idempotent(scope = "billing")]
async fn on_order(env: Envelope) -> Result<(), StoreError> {
    let _ = (env, &STORE);
    Ok(())
}

fn main() {
    let _ = on_order;
}
