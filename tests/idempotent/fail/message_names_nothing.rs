//! `message = ...` must name one of the parameters.
use std::sync::LazyLock;

use babel_idem::{Envelope, InMemoryStore, StoreError, idempotent};

static STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);

#[idempotent(store = STORE, message = envelope)]
async fn on_order(env: Envelope, attempt: u32) -> Result<(), StoreError> {
    let _ = (env, attempt);
    Ok(())
}

#[idempotent(store = STORE, message = self)]
async fn no_receiver(env: Envelope) -> Result<(), StoreError> {
    let _ = env;
    Ok(())
}

fn main() {
    let _ = (on_order, no_receiver);
}
