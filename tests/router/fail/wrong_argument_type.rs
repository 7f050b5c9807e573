// A handler receives the Envelope, not its raw body.
use babel_idem::{Router, urn};

async fn on_order_created(_body: String) -> Result<(), anyhow::Error> {
    Ok(())
}

fn main() {
    let _router = Router::builder().route(urn!("urn:babel:orders:created"), on_order_created);
}
