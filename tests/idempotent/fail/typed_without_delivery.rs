//! A typed handler without a `Delivery` parameter has no message id to
//! dedupe on: its message type is the `data`, which carries none.
use std::sync::LazyLock;

use babel_idem::{InMemoryStore, Message, StoreError, idempotent};
use serde::{Deserialize, Serialize};

static STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);

#[derive(Serialize, Deserialize, Message)]
#[message(urn = "urn:babel:orders:created")]
struct OrderCreated {
    order_id: u64,
}

#[idempotent(store = STORE)]
async fn on_created(order: OrderCreated) -> Result<(), StoreError> {
    let _ = order.order_id;
    Ok(())
}

fn main() {
    let _ = on_created;
}
