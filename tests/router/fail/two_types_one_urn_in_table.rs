// Two message types that carry one URN cannot both be routed in one table:
// `cargo check` compares their URNs.
use babel_idem::{Message, routes};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Message)]
#[message(urn = "urn:babel:orders:created")]
struct OrderCreated {
    order_id: u64,
}

// A second version of the type, left on the first one's URN.
#[derive(Serialize, Deserialize, Message)]
#[message(urn = "urn:babel:orders:created")]
struct OrderCreatedV2 {
    order_id: u64,
    customer: String,
}

async fn on_created(_order: OrderCreated) -> Result<(), anyhow::Error> {
    Ok(())
}

async fn on_created_v2(_order: OrderCreatedV2) -> Result<(), anyhow::Error> {
    Ok(())
}

fn main() {
    let _router = routes! {
        OrderCreated => on_created,
        OrderCreatedV2 => on_created_v2,
    };
}
