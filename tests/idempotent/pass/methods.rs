//! Methods: `&self` with `store = self.store` (an `Arc<dyn Store>` field),
//! `&mut self` with `store = self.shared.clone()`, `self: Arc<Self>` with
//! `store = self.store.clone()`, and a store reached through a method call.

#[path = "../support.rs"]
mod support;

use std::sync::Arc;

use babel_idem::{Envelope, InMemoryStore, Store, idempotent};
use support::{HandlerError, Runs};

struct Billing {
    store: Arc<dyn Store>,
    runs: Runs,
}

impl Billing {
    #[idempotent(store = self.store)]
    async fn on_order(&self, env: Envelope) -> Result<(), HandlerError> {
        self.runs.record(&env)
    }

    #[idempotent(store = self.store.clone(), scope = "arc")]
    async fn on_order_arc(self: Arc<Self>, env: Envelope) -> Result<(), HandlerError> {
        self.runs.record(&env)
    }

    fn store(&self) -> &dyn Store {
        &*self.store
    }

    #[idempotent(store = self.store(), scope = "accessor")]
    async fn through_accessor(&self, env: Envelope) -> Result<(), HandlerError> {
        self.runs.record(&env)
    }
}

struct Ledger {
    shared: Arc<InMemoryStore>,
    entries: Vec<String>,
    runs: Runs,
}

impl Ledger {
    /// Mutates `self` in the body: the store is an owned clone, taken before.
    #[idempotent(store = self.shared.clone())]
    async fn on_payment(&mut self, env: Envelope) -> Result<(), HandlerError> {
        self.runs.record(&env)?;
        self.entries.push(env.urn().to_owned());
        Ok(())
    }
}

pub async fn exercise() {
    let billing = Arc::new(Billing {
        store: Arc::new(InMemoryStore::new()),
        runs: Runs::new(),
    });
    support::check_contract(&billing.runs, |env| billing.on_order(env)).await;
    support::check_contract(&billing.runs, |env| billing.through_accessor(env)).await;
    support::check_contract(&billing.runs, |env| billing.clone().on_order_arc(env)).await;
    support::assert_send(billing.on_order(support::envelope("send")))
        .await
        .unwrap();
    support::assert_send(billing.clone().on_order_arc(support::envelope("send")))
        .await
        .unwrap();

    let mut ledger = Ledger {
        shared: Arc::new(InMemoryStore::new()),
        entries: Vec::new(),
        runs: Runs::new(),
    };
    let id = support::fresh_id();
    ledger.on_payment(support::envelope(&id)).await.unwrap();
    ledger.on_payment(support::envelope(&id)).await.unwrap();
    assert_eq!(
        ledger.entries.len(),
        1,
        "the duplicate did not touch the ledger"
    );
    assert!(ledger.shared.seen(&id).await.unwrap());
    assert!(
        ledger
            .on_payment(support::failing_envelope("other"))
            .await
            .is_err()
    );
    assert!(
        !ledger.shared.seen("other").await.unwrap(),
        "an error leaves the id unmarked"
    );
    assert_eq!(ledger.runs.count(), 2);
}

fn main() {
    support::block_on(exercise());
}
