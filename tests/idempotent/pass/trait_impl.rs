//! An `async fn` in a trait impl, where the trait promises a `Send` future.

#[path = "../support.rs"]
mod support;

use std::future::Future;
use std::sync::Arc;

use babel_idem::{Envelope, InMemoryStore, Store, idempotent};
use support::{HandlerError, Runs};

trait Consumer {
    fn consume(&self, env: Envelope) -> impl Future<Output = Result<(), HandlerError>> + Send;
}

trait AsyncConsumer {
    async fn consume_async(&self, env: &Envelope) -> Result<(), HandlerError>;
}

struct Shipping {
    store: Arc<InMemoryStore>,
    runs: Runs,
}

impl Consumer for Shipping {
    #[idempotent(store = self.store)]
    async fn consume(&self, env: Envelope) -> Result<(), HandlerError> {
        self.runs.record(&env)
    }
}

impl AsyncConsumer for Shipping {
    #[idempotent(store = self.store, scope = "async-trait")]
    async fn consume_async(&self, env: &Envelope) -> Result<(), HandlerError> {
        self.runs.record(env)
    }
}

async fn drive<C: Consumer + Sync>(consumer: &C, env: Envelope) -> Result<(), HandlerError> {
    support::assert_send(consumer.consume(env)).await
}

pub async fn exercise() {
    let shipping = Shipping {
        store: Arc::new(InMemoryStore::new()),
        runs: Runs::new(),
    };
    support::check_contract(&shipping.runs, |env| drive(&shipping, env)).await;

    let id = support::fresh_id();
    let before = shipping.runs.count();
    let env = support::envelope(&id);
    shipping.consume_async(&env).await.unwrap();
    shipping.consume_async(&env).await.unwrap();
    assert_eq!(shipping.runs.count(), before + 1);
    assert!(
        shipping
            .store
            .seen(&format!("11:async-trait:{id}"))
            .await
            .unwrap()
    );
}

fn main() {
    support::block_on(exercise());
}
