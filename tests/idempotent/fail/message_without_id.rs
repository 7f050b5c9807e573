//! The message type must implement `MessageId`.
use std::sync::LazyLock;

use babel_idem::{Envelope, InMemoryStore, StoreError, idempotent};

static STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);

struct Order {
    id: String,
}

#[idempotent(store = STORE, message = order)]
async fn on_order(order: Order) -> Result<(), StoreError> {
    let _ = order.id;
    Ok(())
}

fn main() {
    let _ = on_order;
    let _: Option<Envelope> = None;
}
