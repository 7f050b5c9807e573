//! Arguments of the wrong shape, each reported on its own token.
use std::sync::LazyLock;

use babel_idem::{Envelope, InMemoryStore, StoreError, idempotent};

static STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);

#[idempotent(store STORE)]
async fn missing_equals(env: Envelope) -> Result<(), StoreError> {
    let _ = env;
    Ok(())
}

#[idempotent(store = STORE, scope = billing)]
async fn scope_not_a_literal(env: Envelope) -> Result<(), StoreError> {
    let _ = env;
    Ok(())
}

#[idempotent(store = STORE, scope = "")]
async fn empty_scope(env: Envelope) -> Result<(), StoreError> {
    let _ = env;
    Ok(())
}

#[idempotent(store = STORE, message = "env")]
async fn message_not_a_name(env: Envelope) -> Result<(), StoreError> {
    let _ = env;
    Ok(())
}

#[idempotent(store = STORE, on_remember_failure = Retry)]
async fn unknown_policy(env: Envelope) -> Result<(), StoreError> {
    let _ = env;
    Ok(())
}

#[idempotent(store = STORE scope = "billing")]
async fn missing_comma(env: Envelope) -> Result<(), StoreError> {
    let _ = env;
    Ok(())
}

fn main() {
    let _ = (missing_equals, scope_not_a_literal, empty_scope);
    let _ = (message_not_a_name, unknown_policy, missing_comma);
}
