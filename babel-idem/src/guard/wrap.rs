//! [`wrap`]: the runtime counterpart of `#[idempotent]`, for closures and
//! handlers built at run time.

use std::borrow::Cow;
use std::future::Future;

use crate::guard::{Guard, OnRememberFailure};

use crate::message::MessageId;

use crate::store::{Store, StoreError};

/// Wraps `handler` so each call goes through a [`Guard`] over `store`.
///
/// ```
/// use babel_idem::{wrap, Envelope, InMemoryStore, StoreError};
/// use serde_json::json;
/// use std::sync::atomic::{AtomicU32, Ordering};
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let runs = AtomicU32::new(0);
/// let handler = wrap(InMemoryStore::new(), |env: Envelope| {
///     let runs = &runs;
///     async move {
///         runs.fetch_add(1, Ordering::Relaxed);
///         let _order = &env.data["order_id"];
///         Ok::<(), StoreError>(())
///     }
/// });
///
/// let env = Envelope::new("urn:babel:orders:created", json!({"order_id": 1}));
/// handler.call(env.clone()).await?;
/// handler.call(env).await?;
/// assert_eq!(runs.load(Ordering::Relaxed), 1);
/// # Ok::<(), StoreError>(())
/// # }).unwrap();
/// ```
pub fn wrap<S: Store, H>(store: S, handler: H) -> Wrapped<S, H> {
    Wrapped {
        guard: Guard::new(store),
        handler,
    }
}

/// A handler behind a [`Guard`]; made by [`wrap`].
#[derive(Debug, Clone)]
pub struct Wrapped<S, H> {
    guard: Guard<S>,
    handler: H,
}

impl<S: Store, H> Wrapped<S, H> {
    /// Namespaces the keys; see [`Guard::scope`].
    pub fn scope(mut self, scope: impl Into<Cow<'static, str>>) -> Self {
        self.guard = self.guard.scope(scope);
        self
    }

    /// Sets the remember-failure policy; see [`Guard::on_remember_failure`].
    pub fn on_remember_failure(mut self, policy: OnRememberFailure) -> Self {
        self.guard = self.guard.on_remember_failure(policy);
        self
    }

    /// The guard every call goes through.
    pub fn guard(&self) -> &Guard<S> {
        &self.guard
    }

    /// Delivers one message: skipped when its id was seen, run otherwise.
    ///
    /// The handler's future is created before the decision but only polled
    /// if the guard runs it, so side effects belong inside the future.
    pub async fn call<M, Fut, E>(&self, message: M) -> Result<(), E>
    where
        H: Fn(M) -> Fut,
        M: MessageId,
        Fut: Future<Output = Result<(), E>>,
        E: From<StoreError>,
    {
        let key = self.guard.key(&message);
        self.guard.run_keyed(key, (self.handler)(message)).await
    }
}
