// A handler must say whether it succeeded: `()` is not a Result.
use babel_idem::{Envelope, Router, urn};

async fn on_order_created(env: Envelope) {
    println!("{}", env.urn());
}

fn main() {
    let _router = Router::builder().route(urn!("urn:babel:orders:created"), on_order_created);
}
