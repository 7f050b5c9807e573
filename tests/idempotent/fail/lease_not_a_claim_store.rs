//! `lease = ...` needs a store that can claim ids: a plain `Store` is refused
//! with `ClaimStore`'s own message.
use std::sync::Arc;
use std::time::Duration;

use babel_idem::{Envelope, Store, StoreError, idempotent};

struct Handlers {
    seen_set_only: Arc<dyn Store>,
}

impl Handlers {
    #[idempotent(store = self.seen_set_only, lease = Duration::from_secs(30))]
    async fn on_order(&self, env: Envelope) -> Result<(), StoreError> {
        let _ = env;
        Ok(())
    }
}

fn main() {
    let _ = Handlers::on_order;
}
