//! The attribute goes on an `async fn` with a body; on anything else the
//! item is kept as written next to the error.
use std::sync::LazyLock;

use babel_idem::{Envelope, InMemoryStore, StoreError, idempotent};

static STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);

#[idempotent(store = STORE)]
struct Handler {
    env: Envelope,
}

trait Consumer {
    #[idempotent(store = STORE)]
    async fn consume(&self, env: Envelope) -> Result<(), StoreError>;
}

fn main() {
    let handler = Handler {
        env: Envelope::new("urn:babel:orders:created", Default::default()),
    };
    let _ = (handler.env, &STORE);
}
