//! Handlers return `Result<(), E>`: not nothing, not a value, not an `Option`.
use std::sync::LazyLock;

use babel_idem::{Envelope, InMemoryStore, StoreError, idempotent};

static STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);

#[idempotent(store = STORE)]
async fn returns_nothing(env: Envelope) {
    let _ = env;
}

#[idempotent(store = STORE)]
async fn returns_a_value(env: Envelope) -> Result<u64, StoreError> {
    let _ = env;
    Ok(7)
}

#[idempotent(store = STORE)]
async fn returns_a_tuple(env: Envelope) -> (bool, u8) {
    let _ = env;
    (true, 0)
}

#[idempotent(store = STORE)]
async fn returns_an_option(env: Envelope) -> Option<()> {
    let _ = env;
    Some(())
}

type Verdict = bool;

#[idempotent(store = STORE)]
async fn returns_an_alias_of_bool(env: Envelope) -> Verdict {
    let _ = (env, StoreError::new);
    true
}

fn main() {
    let _ = (returns_nothing, returns_a_value, returns_a_tuple);
    let _ = (returns_an_option, returns_an_alias_of_bool);
}
