// One URN, two handlers, in one table: rejected at compile time.
use babel_idem::{Envelope, routes};

async fn on_order_created(_env: Envelope) -> Result<(), anyhow::Error> {
    Ok(())
}

async fn on_order_created_again(_env: Envelope) -> Result<(), anyhow::Error> {
    Ok(())
}

fn main() {
    let _router = routes! {
        "urn:babel:orders:created" => on_order_created,
        "urn:babel:orders:paid" => on_order_created,
        "urn:babel:orders:created" => on_order_created_again,
    };
}
