// A type row and a literal row that name one URN collide, whichever comes first.
use babel_idem::{Envelope, Message, routes};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Message)]
#[message(urn = "urn:babel:orders:created")]
struct OrderCreated {
    order_id: u64,
}

#[derive(Serialize, Deserialize, Message)]
#[message(urn = "urn:babel:orders:paid")]
struct OrderPaid {
    order_id: u64,
}

async fn on_created(_order: OrderCreated) -> Result<(), anyhow::Error> {
    Ok(())
}

async fn on_paid(_order: OrderPaid) -> Result<(), anyhow::Error> {
    Ok(())
}

async fn on_envelope(_env: Envelope) -> Result<(), anyhow::Error> {
    Ok(())
}

fn main() {
    let _router = routes! {
        OrderCreated => on_created,
        "urn:babel:orders:created" => on_envelope,
        "urn:babel:orders:paid" => on_envelope,
        OrderPaid => on_paid,
    };
}
