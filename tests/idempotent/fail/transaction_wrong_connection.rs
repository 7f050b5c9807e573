//! The transaction parameter must be a connection of the store's database:
//! a `&mut String` is refused with `AsConnection`'s own message.
use babel_idem::{Envelope, StoreError, idempotent};
use babel_idem::store::SqliteStore;

#[idempotent(store = store, transaction = tx)]
async fn on_credit(store: &SqliteStore, env: Envelope, tx: &mut String) -> Result<(), StoreError> {
    let _ = (env, tx);
    Ok(())
}

fn main() {
    let _ = on_credit;
}
