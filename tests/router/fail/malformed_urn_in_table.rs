// A routes! table checks its URN literals like urn! does, each on its own literal.
use babel_idem::{Envelope, routes};

async fn on_order_created(_env: Envelope) -> Result<(), anyhow::Error> {
    Ok(())
}

fn main() {
    let _router = routes! {
        "urn:babel:orders:created" => on_order_created,
        "urn:b:orders:paid" => on_order_created,
        "urn:babel:orders:shipped?=x" => on_order_created,
    };
}
