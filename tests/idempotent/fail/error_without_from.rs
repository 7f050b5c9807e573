//! The error type must absorb a `StoreError`: the guard returns it when the
//! seen-set cannot be read.
use std::sync::LazyLock;

use babel_idem::{Envelope, InMemoryStore, StoreError, idempotent};

static STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);

#[derive(Debug)]
struct BillingError;

#[idempotent(store = STORE)]
async fn on_order(env: Envelope) -> Result<(), BillingError> {
    let _ = (env, StoreError::new);
    Err(BillingError)
}

fn main() {
    let _ = on_order;
}
