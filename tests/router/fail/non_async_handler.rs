// A plain fn returns a Result, not a future: it is not a handler.
use babel_idem::{Envelope, Router, urn};

fn on_order_created(_env: Envelope) -> Result<(), anyhow::Error> {
    Ok(())
}

fn main() {
    let _router = Router::builder().route(urn!("urn:babel:orders:created"), on_order_created);
}
