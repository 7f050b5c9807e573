//! `transaction = x` must name a parameter of the handler.
use babel_idem::{Envelope, StoreError, idempotent};
use babel_idem::store::SqliteStore;
use sqlx::SqliteConnection;

#[idempotent(store = store, transaction = txn)]
async fn on_credit(store: &SqliteStore, env: Envelope, tx: &mut SqliteConnection) -> Result<(), StoreError> {
    let _ = (env, tx);
    Ok(())
}

fn main() {
    let _ = on_credit;
}
