//! `transaction = ...` needs a store whose table the handler's connection can
//! write: an `InMemoryStore` is refused with `TransactionalStore`'s message.
use babel_idem::{Envelope, InMemoryStore, StoreError, idempotent};
use sqlx::SqliteConnection;

#[idempotent(store = store, transaction = tx)]
async fn on_credit(store: &InMemoryStore, env: Envelope, tx: &mut SqliteConnection) -> Result<(), StoreError> {
    let _ = (env, tx);
    Ok(())
}

fn main() {
    let _ = on_credit;
}
