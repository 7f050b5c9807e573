// One message type, two handlers, in one table: rejected at compile time.
use babel_idem::{Delivery, Message, routes};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Message)]
#[message(urn = "urn:babel:orders:created")]
struct OrderCreated {
    order_id: u64,
}

async fn on_created(_order: OrderCreated) -> Result<(), anyhow::Error> {
    Ok(())
}

async fn audit_created(_order: OrderCreated, _delivery: Delivery) -> Result<(), anyhow::Error> {
    Ok(())
}

fn main() {
    let _router = routes! {
        OrderCreated => on_created,
        OrderCreated => audit_created,
    };
}
