// A handler's argument must be the Envelope or a message type: a serde type
// without a URN is neither.
use babel_idem::{Router, urn};
use serde::Deserialize;

#[derive(Deserialize)]
struct OrderCreated {
    order_id: u64,
}

async fn on_order_created(order: OrderCreated) -> Result<(), anyhow::Error> {
    println!("{}", order.order_id);
    Ok(())
}

fn main() {
    let _router = Router::builder().route(urn!("urn:babel:orders:created"), on_order_created);
}
