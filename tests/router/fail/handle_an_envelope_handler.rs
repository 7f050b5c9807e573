// `.handle` reads the URN from the handler's message type; an Envelope
// handler has none, and registers with `.route(urn, handler)`.
use babel_idem::{Envelope, Router};

async fn on_order_created(_env: Envelope) -> Result<(), anyhow::Error> {
    Ok(())
}

fn main() {
    let _router = Router::builder().handle(on_order_created);
}
