//! The skip / run / mark decision: the one place it is made (see [`guard`]).
//!
//! Seen-set dedupe is not a lock: two concurrent deliveries of one id can
//! both pass `seen` and both run.

use std::borrow::Cow;
use std::future::Future;

use crate::metrics::{self, Decision};
use crate::{DedupeKey, MessageId, Store, StoreError};

/// What a guard returns when the handler succeeded but its id could not be
/// remembered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum OnRememberFailure {
    /// Return `Ok` so the delivery is acked: the effect happened, and running
    /// it again on a redelivery is worse than a missing mark. The failure is
    /// reported as a `tracing` warning and in [`metrics::counts`].
    #[default]
    AckAndReport,
    /// Return the store error, so the runtime retries the message (and the
    /// handler runs again unless it is idempotent on its own).
    ReturnError,
}

/// Runs `handler` for `message` unless `store` has seen the message's id; on
/// success remembers the id:
///
/// | situation | the guard |
/// |---|---|
/// | no usable id | runs the handler, remembers nothing (`fail_open`) |
/// | `seen` is true | does not run the handler, returns `Ok` (`skipped`) |
/// | `seen` fails | does not run the handler, returns the store error (`store_failed`) |
/// | the handler returns `Err` | leaves the id unmarked, returns the error (`failed`) |
/// | the handler panics or is dropped | leaves the id unmarked |
/// | `Ok`, then `remember` succeeds | returns `Ok` (`ran`) |
/// | `Ok`, then `remember` fails | by [`OnRememberFailure`]: `Ok` and a warning (default), or the error (`mark_failed`) |
///
/// `store` is anything that implements [`Store`]: a reference, an `Arc`, an
/// `Arc<dyn Store>`. The handler's error type must absorb a [`StoreError`].
///
/// ```
/// use babel_idem::{guard, Envelope, InMemoryStore, StoreError};
/// use serde_json::json;
/// use std::sync::atomic::{AtomicU32, Ordering};
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let store = InMemoryStore::new();
/// let charges = AtomicU32::new(0);
/// let env = Envelope::new("urn:babel:orders:created", json!({"order_id": 7}));
///
/// for _delivery in 0..3 {
///     guard(&store, &env, async {
///         charges.fetch_add(1, Ordering::Relaxed);
///         Ok::<(), StoreError>(())
///     })
///     .await?;
/// }
/// assert_eq!(charges.load(Ordering::Relaxed), 1);
/// # Ok::<(), StoreError>(())
/// # }).unwrap();
/// ```
///
/// The key is copied out of `message` when `guard` is called, so the returned
/// future does not borrow the message.
pub fn guard<S, M, F, E>(
    store: S,
    message: &M,
    handler: F,
) -> impl Future<Output = Result<(), E>> + use<S, M, F, E>
where
    S: Store,
    M: MessageId + ?Sized,
    F: Future<Output = Result<(), E>>,
    E: From<StoreError>,
{
    let key = DedupeKey::new(None, message);
    async move { decide(&store, &key, OnRememberFailure::default(), handler).await }
}

/// A configured guard: a store, an optional scope and a remember-failure policy.
///
/// [`guard`] is `Guard::new(store).run(message, handler)`. Building a guard
/// costs nothing (no allocation for a `&'static str` scope), so it can be made
/// per call.
///
/// ```
/// use babel_idem::{Envelope, Guard, InMemoryStore, OnRememberFailure, StoreError};
/// use serde_json::json;
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let store = InMemoryStore::new();
/// let billing = Guard::new(&store).scope("billing");
/// let shipping = Guard::new(&store)
///     .scope("shipping")
///     .on_remember_failure(OnRememberFailure::ReturnError);
///
/// let env = Envelope::new("urn:babel:orders:created", json!({}));
/// let mut ran = 0;
/// billing.run(&env, async { ran += 1; Ok::<(), StoreError>(()) }).await?;
/// shipping.run(&env, async { ran += 1; Ok::<(), StoreError>(()) }).await?;
/// assert_eq!(ran, 2, "two scopes never skip each other's messages");
/// # Ok::<(), StoreError>(())
/// # }).unwrap();
/// ```
#[derive(Debug, Clone)]
pub struct Guard<S> {
    store: S,
    scope: Option<Cow<'static, str>>,
    on_remember_failure: OnRememberFailure,
}

impl<S: Store> Guard<S> {
    /// A guard over `store`, unscoped, acking when `remember` fails.
    pub fn new(store: S) -> Self {
        Guard {
            store,
            scope: None,
            on_remember_failure: OnRememberFailure::default(),
        }
    }

    /// Namespaces every key as `<scope length>:<scope>:<id>` (see
    /// [`DedupeKey`](crate::DedupeKey)), so services sharing one store do
    /// not skip each other's messages.
    ///
    /// Every scope is accepted: the length in front keeps any two
    /// `(scope, id)` pairs apart, whatever `:` they contain, and the empty
    /// scope is a scope of its own. An unscoped guard keys on the bare id
    /// (the Go SDK's layout).
    ///
    /// ```
    /// use babel_idem::{Envelope, Guard, InMemoryStore};
    /// use serde_json::json;
    ///
    /// let env = Envelope::new("urn:babel:orders:created", json!({})).with_id("eu:123");
    /// let store = InMemoryStore::new();
    /// assert_eq!(Guard::new(&store).scope("orders").key(&env).as_str(), Some("6:orders:eu:123"));
    /// assert_eq!(Guard::new(&store).key(&env).as_str(), Some("eu:123"));
    /// ```
    pub fn scope(mut self, scope: impl Into<Cow<'static, str>>) -> Self {
        self.scope = Some(scope.into());
        self
    }

    /// Chooses what to return when the handler succeeded but `remember` failed.
    pub fn on_remember_failure(mut self, policy: OnRememberFailure) -> Self {
        self.on_remember_failure = policy;
        self
    }

    /// The store this guard consults.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// The key this guard dedupes `message` on. Take it before a handler that
    /// consumes the message is built, then call [`Guard::run_keyed`].
    #[inline]
    pub fn key<M: MessageId + ?Sized>(&self, message: &M) -> DedupeKey {
        DedupeKey::new(self.scope.as_deref(), message)
    }

    /// Runs `handler` for `message` under this guard's decision. Like
    /// [`guard`], the future does not borrow the message.
    pub fn run<'g, M, F, E>(
        &'g self,
        message: &M,
        handler: F,
    ) -> impl Future<Output = Result<(), E>> + use<'g, S, M, F, E>
    where
        M: MessageId + ?Sized,
        F: Future<Output = Result<(), E>>,
        E: From<StoreError>,
    {
        self.run_keyed(self.key(message), handler)
    }

    /// Runs `handler` under a key taken earlier with [`Guard::key`], for a
    /// handler that owns (moves or mutates) the message.
    ///
    /// ```
    /// use babel_idem::{Envelope, Guard, InMemoryStore, StoreError};
    /// use serde_json::json;
    ///
    /// async fn consume(env: Envelope) -> Result<(), StoreError> {
    ///     drop(env);
    ///     Ok(())
    /// }
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let guard = Guard::new(InMemoryStore::new());
    /// let env = Envelope::new("urn:babel:orders:created", json!({}));
    /// let key = guard.key(&env);
    /// guard.run_keyed(key, consume(env)).await?;
    /// # Ok::<(), StoreError>(())
    /// # }).unwrap();
    /// ```
    pub async fn run_keyed<F, E>(&self, key: DedupeKey, handler: F) -> Result<(), E>
    where
        F: Future<Output = Result<(), E>>,
        E: From<StoreError>,
    {
        decide(&self.store, &key, self.on_remember_failure, handler).await
    }
}

/// The decision itself; every public entry point ends here.
async fn decide<S, F, E>(
    store: &S,
    key: &DedupeKey,
    on_remember_failure: OnRememberFailure,
    handler: F,
) -> Result<(), E>
where
    S: Store + ?Sized,
    F: Future<Output = Result<(), E>>,
    E: From<StoreError>,
{
    let Some(id) = key.as_str() else {
        report(Decision::FailOpen, "");
        return handler.await;
    };

    match store.seen(id).await {
        Ok(false) => {}
        Ok(true) => {
            report(Decision::Skipped, id);
            return Ok(());
        }
        Err(error) => {
            tracing::warn!(
                target: "babel_idem",
                message_id = id,
                decision = Decision::StoreFailed.as_str(),
                %error,
                "seen-set unavailable; the message was not run and goes back for retry",
            );
            metrics::record(Decision::StoreFailed);
            return Err(E::from(error));
        }
    }

    // A panic or a drop inside the handler leaves before `remember`: unmarked.
    if let Err(error) = handler.await {
        report(Decision::Failed, id);
        return Err(error);
    }

    match store.remember(id).await {
        Ok(()) => {
            report(Decision::Ran, id);
            Ok(())
        }
        Err(error) => {
            tracing::warn!(
                target: "babel_idem",
                message_id = id,
                decision = Decision::MarkFailed.as_str(),
                %error,
                policy = ?on_remember_failure,
                "handler succeeded but its id could not be remembered; a redelivery will run it again",
            );
            metrics::record(Decision::MarkFailed);
            match on_remember_failure {
                OnRememberFailure::AckAndReport => Ok(()),
                OnRememberFailure::ReturnError => Err(E::from(error)),
            }
        }
    }
}

#[inline]
fn report(decision: Decision, id: &str) {
    tracing::debug!(target: "babel_idem", message_id = id, decision = decision.as_str());
    metrics::record(decision);
}
