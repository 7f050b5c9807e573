//! The transaction parameter is a `&mut` connection, not a value.
use babel_idem::{Envelope, StoreError, idempotent};
use babel_idem::store::SqliteStore;

#[idempotent(store = store, transaction = tx)]
async fn on_credit(store: &SqliteStore, env: Envelope, tx: sqlx::SqlitePool) -> Result<(), StoreError> {
    let _ = (env, tx);
    Ok(())
}

fn main() {
    let _ = on_credit;
}
