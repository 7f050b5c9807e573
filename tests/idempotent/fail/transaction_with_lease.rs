//! `transaction` and `lease` are two modes: asking for both is one error.
use std::time::Duration;

use babel_idem::{Envelope, StoreError, idempotent};

use babel_idem::store::SqliteStore;
use sqlx::SqliteConnection;

#[idempotent(store = store, lease = Duration::from_secs(30), transaction = tx)]
async fn on_credit(store: &SqliteStore, env: Envelope, tx: &mut SqliteConnection) -> Result<(), StoreError> {
    let _ = (env, tx);
    Ok(())
}

fn main() {
    let _ = on_credit;
}
