//! The annotated function goes wherever the plain one goes: a generic
//! `F: Fn(Envelope) -> Fut` bound, a function pointer, a registration call
//! that boxes handlers, and the same bounds as an unannotated twin.

#[path = "../support.rs"]
mod support;

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::LazyLock;

use babel_idem::{Envelope, InMemoryStore, idempotent};
use support::{HandlerError, Runs};

static STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);
static RUNS: Runs = Runs::new();

#[idempotent(store = STORE)]
async fn annotated(env: Envelope) -> Result<(), HandlerError> {
    RUNS.record(&env)
}

/// The same handler without the attribute: the shape the annotated one keeps.
async fn plain(env: Envelope) -> Result<(), HandlerError> {
    RUNS.record(&env)
}

/// What a dispatcher asks of a handler.
fn shape<F, Fut>(handler: F) -> F
where
    F: Fn(Envelope) -> Fut + Copy + Send + Sync + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
{
    handler
}

type BoxedHandler = Box<
    dyn Fn(Envelope) -> Pin<Box<dyn Future<Output = Result<(), HandlerError>> + Send>>
        + Send
        + Sync,
>;

/// A registration call in the style of a router.
#[derive(Default)]
struct Registry {
    handlers: HashMap<&'static str, BoxedHandler>,
}

impl Registry {
    fn register<F, Fut>(&mut self, urn: &'static str, handler: F) -> &mut Self
    where
        F: Fn(Envelope) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
    {
        self.handlers
            .insert(urn, Box::new(move |env| Box::pin(handler(env))));
        self
    }

    async fn dispatch(&self, env: Envelope) -> Result<(), HandlerError> {
        (self.handlers[env.urn()])(env).await
    }
}

pub async fn exercise() {
    // The same bounds accept both, so the attribute changed no part of the shape.
    let (annotated_fn, plain_fn) = (shape(annotated), shape(plain));
    let env = support::envelope(&support::fresh_id());
    let before = RUNS.count();
    plain_fn(env.clone()).await.unwrap();
    plain_fn(env.clone()).await.unwrap();
    assert_eq!(RUNS.count(), before + 2, "the plain twin has no guard");
    annotated_fn(env.clone()).await.unwrap();
    annotated_fn(env).await.unwrap();
    assert_eq!(RUNS.count(), before + 3, "the annotated one dedupes");

    // Both coerce to a function pointer of the same parameter list.
    let pointer: fn(Envelope) -> _ = annotated;
    let plain_pointer: fn(Envelope) -> _ = plain;
    support::check_contract(&RUNS, pointer).await;
    let _ = plain_pointer;

    let mut registry = Registry::default();
    registry.register("urn:babel:orders:created", annotated);
    support::check_contract(&RUNS, |env| registry.dispatch(env)).await;
}

fn main() {
    support::block_on(exercise());
}
