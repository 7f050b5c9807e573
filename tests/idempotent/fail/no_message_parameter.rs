//! No parameter is an `Envelope`, and `message = ...` does not say which one
//! carries the id.
use std::sync::LazyLock;

use babel_idem::{Envelope, InMemoryStore, StoreError, idempotent};

static STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);

struct Order {
    id: String,
}

#[idempotent(store = STORE)]
async fn on_order(order: Order, attempt: u32) -> Result<(), StoreError> {
    let _ = (order.id, attempt);
    Ok(())
}

fn main() {
    let _ = on_order;
    let _: Option<Envelope> = None;
}
