//! [`IdempotencyLayer`]: the guard in front of any tower [`Service`] whose
//! request carries a [`MessageId`] (feature `tower`), for services built from
//! tower stacks (axum, tonic, job runners).
//!
//! The decision is the [`Guard`]'s own, in either mode: a seen-set guard
//! ([`Guard::new`]) or a claim-mode one ([`Guard::lease`]). The layer only
//! calls it, with the inner service's call as the handler:
//!
//! | the guard decides | the layered service returns |
//! |---|---|
//! | run (a new id, or no id: fail-open), the inner call succeeds | `Ok(Guarded::Ran(response))`, the id marked done |
//! | skip (the id is done) | `Ok(Guarded::Skipped)`; the inner service is not called |
//! | the inner call fails | `Err(GuardedError::Service(error))`, the id left unmarked |
//! | the store fails, or claim mode parks the request | `Err(GuardedError::Store(error))`; the inner service is not called |
//!
//! A call whose future is dropped (an outer timeout) leaves the id unmarked,
//! like any guard.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tower_layer::Layer;
use tower_service::Service;

use crate::guard::{Guard, Leased, SeenSet};
use crate::message::MessageId;
use crate::store::{ClaimStore, Store, StoreError};

/// A tower [`Layer`] that runs each request through a [`Guard`].
///
/// Built from a configured guard (store, scope, remember-failure policy,
/// mode); every service it wraps shares that one guard. The inner service
/// must be `Clone`: the instance made ready by `poll_ready` is moved into the
/// call's future and called only if the guard decides to run, so a skipped
/// request never reaches it (not even its `call`).
///
/// ```
/// use babel_idem::adapters::tower::{Guarded, IdempotencyLayer};
/// use babel_idem::{Envelope, Guard, InMemoryStore};
/// use serde_json::json;
/// use std::convert::Infallible;
/// use std::future::{Ready, ready};
/// use std::task::{Context, Poll};
/// use tower_layer::Layer;
/// use tower_service::Service;
///
/// /// Charges an order; the response is the order's number.
/// #[derive(Clone)]
/// struct Charge;
///
/// impl Service<Envelope> for Charge {
///     type Response = u64;
///     type Error = Infallible;
///     type Future = Ready<Result<u64, Infallible>>;
///     fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
///         Poll::Ready(Ok(()))
///     }
///     fn call(&mut self, env: Envelope) -> Self::Future {
///         ready(Ok(env.data["order_id"].as_u64().unwrap_or_default()))
///     }
/// }
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let mut charge = IdempotencyLayer::new(Guard::new(InMemoryStore::new())).layer(Charge);
/// let env = Envelope::new("urn:babel:orders:created", json!({"order_id": 7}));
///
/// std::future::poll_fn(|cx| charge.poll_ready(cx)).await?;
/// assert_eq!(charge.call(env.clone()).await?, Guarded::Ran(7));
/// std::future::poll_fn(|cx| charge.poll_ready(cx)).await?;
/// assert_eq!(charge.call(env).await?, Guarded::Skipped);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
pub struct IdempotencyLayer<S, Mode = SeenSet> {
    guard: Arc<Guard<S, Mode>>,
}

impl<S, Mode> IdempotencyLayer<S, Mode> {
    /// A layer that puts `guard` in front of the services it wraps.
    pub fn new(guard: Guard<S, Mode>) -> Self {
        IdempotencyLayer {
            guard: Arc::new(guard),
        }
    }

    /// The guard every wrapped service runs its requests through.
    pub fn guard(&self) -> &Guard<S, Mode> {
        &self.guard
    }
}

impl<S, Mode> Clone for IdempotencyLayer<S, Mode> {
    fn clone(&self) -> Self {
        IdempotencyLayer {
            guard: Arc::clone(&self.guard),
        }
    }
}

impl<S, Mode> fmt::Debug for IdempotencyLayer<S, Mode> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyLayer").finish_non_exhaustive()
    }
}

impl<Svc, S, Mode> Layer<Svc> for IdempotencyLayer<S, Mode> {
    type Service = Idempotent<Svc, S, Mode>;

    fn layer(&self, inner: Svc) -> Self::Service {
        Idempotent {
            inner,
            guard: Arc::clone(&self.guard),
        }
    }
}

/// The [`Service`] an [`IdempotencyLayer`] makes: the inner service behind
/// the layer's guard.
pub struct Idempotent<Svc, S, Mode = SeenSet> {
    inner: Svc,
    guard: Arc<Guard<S, Mode>>,
}

impl<Svc, S, Mode> Idempotent<Svc, S, Mode> {
    /// The wrapped service.
    pub fn inner(&self) -> &Svc {
        &self.inner
    }
}

impl<Svc: Clone, S, Mode> Clone for Idempotent<Svc, S, Mode> {
    fn clone(&self) -> Self {
        Idempotent {
            inner: self.inner.clone(),
            guard: Arc::clone(&self.guard),
        }
    }
}

impl<Svc: fmt::Debug, S, Mode> fmt::Debug for Idempotent<Svc, S, Mode> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Idempotent")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

/// What a layered service answers when it does not fail: the guard's own
/// outcome, [`Guarded::Ran`] with the inner service's response or
/// [`Guarded::Skipped`].
///
/// A skipped request has no response to give: the inner service did not run
/// (its response to the first delivery was given then, and is not stored).
/// `Skipped` says so, rather than a made-up `Default` value that a caller
/// could take for a fresh result, or an `Option` whose `None` would not say
/// why; a message consumer acks both. The guard's other outcomes (parked,
/// failed, store failed) come back as a [`GuardedError`].
#[doc(no_inline)]
pub use crate::guard::Guarded;

/// Why a layered service failed: its inner service, or the guard's store.
#[derive(Debug, thiserror::Error)]
pub enum GuardedError<E> {
    /// The inner service failed (in `poll_ready` or in its call); the id
    /// stays unmarked.
    #[error(transparent)]
    Service(E),
    /// The store could not say whether to run (the inner service was not
    /// called), or claim mode parked the request
    /// ([`is_parked`](StoreError::is_parked)), or, with
    /// [`OnRememberFailure::ReturnError`](crate::guard::OnRememberFailure::ReturnError),
    /// the id could not be marked done.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl<E> GuardedError<E> {
    /// The inner service's error, if that is what failed.
    pub fn into_service(self) -> Option<E> {
        match self {
            GuardedError::Service(error) => Some(error),
            GuardedError::Store(_) => None,
        }
    }
}

// One impl per guard mode, each calling that mode's own `run_keyed`: the
// decision stays the guard's, and a mode the guard does not run compiles
// no service.
macro_rules! service_per_mode {
    ($($mode:ty where S: $store:path),+) => {$(
        impl<Svc, S, Req> Service<Req> for Idempotent<Svc, S, $mode>
        where
            S: $store + 'static,
            Req: MessageId + Send + 'static,
            Svc: Service<Req> + Clone + Send + 'static,
            Svc::Future: Send,
            Svc::Response: Send,
            Svc::Error: Send,
        {
            type Response = Guarded<Svc::Response>;
            type Error = GuardedError<Svc::Error>;
            type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

            fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
                self.inner.poll_ready(cx).map_err(GuardedError::Service)
            }

            fn call(&mut self, request: Req) -> Self::Future {
                // The instance `poll_ready` made ready goes into the future; a
                // clone waits for the next `poll_ready` (tower's usual pattern).
                let fresh = self.inner.clone();
                let mut ready = std::mem::replace(&mut self.inner, fresh);
                let guard = Arc::clone(&self.guard);
                let key = guard.key(&request);
                Box::pin(async move {
                    let mut response = None;
                    guard
                        .run_keyed(key, async {
                            let answer = ready.call(request).await;
                            response = Some(answer.map_err(GuardedError::Service)?);
                            Ok::<(), Self::Error>(())
                        })
                        .await?;
                    Ok(response.map_or(Guarded::Skipped, Guarded::Ran))
                })
            }
        }
    )+};
}

service_per_mode!(SeenSet where S: Store, Leased where S: ClaimStore);
