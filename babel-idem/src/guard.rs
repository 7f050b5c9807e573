//! The skip / run / mark decision: the one place it is made (see [`run_once`]
//! and [`Guard`]). One decision table per mode, each in its own module:
//!
//! - seen-set mode (the default, the cross-SDK contract): `seen`, run,
//!   `remember`. Not a lock: two concurrent deliveries of one id can both
//!   pass `seen` and both run.
//! - claim mode ([`Guard::lease`], [`Leased`]): claim the id with a lease,
//!   run the handler while renewing the lease, then commit or release. One
//!   run at a time per id; [`fence`] numbers the runs.
//! - transactional mode ([`Guard::transactional`], [`Transactional`]): mark
//!   the id on the handler's own database connection, inside its
//!   transaction, then run or skip. Effect and mark commit together.

use std::borrow::Cow;
use std::future::Future;
use std::time::Duration;

use crate::builders::setters;
use crate::key::DedupeKey;
use crate::message::MessageId;
use crate::store::InvalidLease;
use crate::store::claim::lease_millis;
use crate::store::{ClaimStore, Store, StoreError};
use crate::telemetry::metrics::{self, Decision};

/// The answer of a store call: taken out of a future that already holds it
/// (a store that answered in the call), awaited otherwise. The pending
/// future is bound before it is awaited, so that the `match` on the call's
/// result does not live across the `await`.
macro_rules! store_answer {
    ($call:expr) => {
        'answer: {
            let pending = match $call.into_ready() {
                Ok(answer) => break 'answer answer,
                Err(pending) => pending,
            };
            pending.await
        }
    };
}

mod batch;
mod claim;
pub(crate) mod context;
mod fence;
pub(crate) mod inflight;
pub(crate) mod outcome;
mod seen_set;
pub(crate) mod timer;
mod transaction;
mod wrap;

pub use batch::MessageOutcome;
pub use fence::fence;
pub use outcome::Guarded;
pub use transaction::Transactional;
pub use wrap::{Wrapped, wrap};

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
/// use babel_idem::{run_once, Envelope, InMemoryStore, StoreError};
/// use serde_json::json;
/// use std::sync::atomic::{AtomicU32, Ordering};
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let store = InMemoryStore::new();
/// let charges = AtomicU32::new(0);
/// let env = Envelope::new("urn:babel:orders:created", json!({"order_id": 7}));
///
/// for _delivery in 0..3 {
///     run_once(&store, &env, async {
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
/// The key is copied out of `message` when `run_once` is called, so the returned
/// future does not borrow the message.
#[inline]
pub fn run_once<S, M, F, E>(
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
    // The future is built where the key is (see `DedupeKey::with_new`).
    DedupeKey::with_new(None, message, |key| {
        seen_set::decide(store, key, OnRememberFailure::default(), handler)
    })
}

/// A configured guard: a store, an optional scope, a remember-failure policy
/// and a mode: seen-set ([`SeenSet`], the default) or claim ([`Leased`],
/// turned on by [`Guard::lease`]).
///
/// [`run_once`] is `Guard::new(store).run(message, handler)`. Building a guard
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
pub struct Guard<S, Mode = SeenSet> {
    store: S,
    scope: Option<Cow<'static, str>>,
    on_remember_failure: OnRememberFailure,
    mode: Mode,
}

/// Seen-set mode, the default: `seen`, run, `remember` (see [`guide::modes`](crate::guide::modes)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SeenSet;

/// Claim mode, made by [`Guard::lease`]: one run at a time per id, under a
/// lease the guard renews while the handler runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Leased {
    lease: Duration,
}

impl Leased {
    /// The lease each claim is made and renewed for.
    pub fn lease(&self) -> Duration {
        self.lease
    }
}

impl<S: Store> Guard<S> {
    /// A guard over `store`, unscoped, acking when `remember` fails.
    pub fn new(store: S) -> Self {
        Guard {
            store,
            scope: None,
            on_remember_failure: OnRememberFailure::default(),
            mode: SeenSet,
        }
    }
}

impl<S: Store, Mode> Guard<S, Mode> {
    /// Turns on claim mode (see [`guide::modes`](crate::guide::modes)): before the handler runs, the
    /// guard claims the id for `lease`, so one delivery of an id runs at a
    /// time across every worker sharing the store.
    ///
    /// | state of the id | the guard | the runtime then |
    /// |---|---|---|
    /// | done | skips (`skipped`) | acks |
    /// | absent, or claimed by a lease that lapsed | wins the claim (a larger [`fence`]), runs the handler | as below |
    /// | claimed by a live owner | does not run; returns a parked [`StoreError`] ([`is_parked`](StoreError::is_parked), `parked`) | puts it back without spending an attempt, after [`retry_after`](StoreError::retry_after) |
    /// | `Ok`, commit succeeds, or finds the id already done | marks it done, drops the claim (`ran`) | acks |
    /// | `Ok`, claim lost (another owner's now, the id not done) | does not mark; returns a [`lost claim`](StoreError::is_lost_claim) error (`lost_claim`) | retries; the redelivery sees the new owner's outcome |
    /// | `Ok`, commit fails with a store error | sends it again with backoff, renewing the lease, for up to the lease (at most 10 s); then by [`OnRememberFailure`] (`mark_failed`) | acks (default) |
    /// | `Err` or panic | releases its own claim (never another owner's), returns the error or resumes the panic (`failed`) | retry / dead-letter |
    ///
    /// While the handler runs, the guard renews the lease about every third
    /// of it, inside the same future: no task is spawned and no runtime has
    /// to be named (a process-wide timer thread, started on the first
    /// renewal, wakes it). A lease can therefore be seconds long: a slow
    /// handler keeps its claim, a crashed worker's ids are free again within
    /// one lease. If a renewal finds the claim lost, the handler is not
    /// stopped (that could leave half an effect; the fence refuses its stale
    /// writes) and its success reports `lost_claim`.
    ///
    /// A guard future that is **dropped** (a timeout, a shutdown) cannot
    /// release its claim: nothing can be awaited in `Drop`. The claim lapses
    /// with its lease, which is one reason to keep leases short.
    ///
    /// It compiles only for a [`ClaimStore`]. A lease no store can hold
    /// (under 1 ms or over [`MAX_LEASE`](crate::store::MAX_LEASE)) is refused
    /// here with an [`InvalidLease`], which converts into a [`StoreError`].
    ///
    /// ```
    /// use babel_idem::{Envelope, Guard, InMemoryStore, StoreError};
    /// use serde_json::json;
    /// use std::time::Duration;
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let store = InMemoryStore::new();
    /// let guard = Guard::new(&store).scope("billing").lease(Duration::from_secs(10))?;
    /// let env = Envelope::new("urn:babel:orders:created", json!({"order_id": 7}));
    ///
    /// let mut charges = 0;
    /// for _delivery in 0..3 {
    ///     guard.run(&env, async { charges += 1; Ok::<(), StoreError>(()) }).await?;
    /// }
    /// assert_eq!(charges, 1);
    /// assert!(Guard::new(&store).lease(Duration::ZERO).is_err());
    /// # Ok::<(), StoreError>(())
    /// # }).unwrap();
    /// ```
    pub fn lease(self, lease: Duration) -> Result<Guard<S, Leased>, InvalidLease>
    where
        S: ClaimStore,
    {
        lease_millis(lease)?;
        Ok(Guard {
            store: self.store,
            scope: self.scope,
            on_remember_failure: self.on_remember_failure,
            mode: Leased { lease },
        })
    }

    setters! {
        /// Namespaces every key as `<scope length>:<scope>:<id>` (see
        /// [`DedupeKey`]), so services sharing one store do
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
        pub fn scope(scope: impl Into<Cow<'static, str>>) => self.scope = Some(scope.into());

        /// Chooses what to return when the handler succeeded but `remember` (in
        /// claim mode, `commit`) failed.
        pub fn on_remember_failure(policy: OnRememberFailure) => self.on_remember_failure;
    }

    /// The store this guard consults.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// The key this guard dedupes `message` on. Take it before a handler that
    /// consumes the message is built, then call [`Guard::run_keyed`].
    ///
    /// ```
    /// use babel_idem::{Envelope, Guard, InMemoryStore};
    /// use serde_json::json;
    ///
    /// let env = Envelope::new("urn:babel:orders:created", json!({})).with_id("id-A");
    /// let store = InMemoryStore::new();
    /// assert_eq!(Guard::new(&store).key(&env).as_str(), Some("id-A"));
    /// assert_eq!(Guard::new(&store).scope("billing").key(&env).as_str(), Some("7:billing:id-A"));
    /// ```
    #[inline]
    pub fn key<M: MessageId + ?Sized>(&self, message: &M) -> DedupeKey {
        DedupeKey::new(self.scope.as_deref(), message)
    }

    /// The guard's mode: [`SeenSet`] or [`Leased`].
    pub fn mode(&self) -> &Mode {
        &self.mode
    }
}

impl<S: Store> Guard<S, SeenSet> {
    /// Runs `handler` for `message` under this guard's decision. Like
    /// [`run_once`], the future does not borrow the message.
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
        // `self.run_keyed(self.key(message), handler)`, with the future
        // built where the key is (see `DedupeKey::with_new`).
        DedupeKey::with_new(self.scope.as_deref(), message, |key| {
            self.run_keyed(key, handler)
        })
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
    pub fn run_keyed<'g, F, E>(
        &'g self,
        key: DedupeKey,
        handler: F,
    ) -> impl Future<Output = Result<(), E>> + use<'g, S, F, E>
    where
        F: Future<Output = Result<(), E>>,
        E: From<StoreError>,
    {
        seen_set::decide(&self.store, key, self.on_remember_failure, handler)
    }
}

impl<S: ClaimStore> Guard<S, Leased> {
    /// Runs `handler` for `message` under claim mode (see [`Guard::lease`]).
    /// The future does not borrow the message.
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

    /// Runs `handler` under claim mode with a key taken earlier with
    /// [`Guard::key`], for a handler that owns the message.
    pub async fn run_keyed<F, E>(&self, key: DedupeKey, handler: F) -> Result<(), E>
    where
        F: Future<Output = Result<(), E>>,
        E: From<StoreError>,
    {
        let lease = self.mode.lease;
        claim::decide(&self.store, &key, lease, self.on_remember_failure, handler).await
    }
}

/// The store could not tell whether to run (`seen` or `claim` failed): the
/// handler did not run and the store's error goes back for retry.
fn store_failed<E: From<StoreError>>(id: &str, error: StoreError) -> Result<(), E> {
    tracing::warn!(
        target: "babel_idem",
        message_id = id,
        decision = Decision::StoreFailed.as_str(),
        operation = %error.operation(),
        %error,
        "store unavailable; the message was not run and goes back for retry",
    );
    metrics::record(Decision::StoreFailed);
    // The delivery being dispatched, if any, is an outage, not a failure,
    // and its dispatcher learns whether the store said it is of a part of
    // it only.
    context::store_failed(&error);
    Err(E::from(error))
}

/// The handler succeeded but marking it done (`remember` or `commit`) failed:
/// ack or return the error, by `policy`.
fn mark_failed<E: From<StoreError>>(
    id: &str,
    error: StoreError,
    policy: OnRememberFailure,
) -> Result<(), E> {
    tracing::warn!(
        target: "babel_idem",
        message_id = id,
        decision = Decision::MarkFailed.as_str(),
        operation = %error.operation(),
        %error,
        policy = ?policy,
        "handler succeeded but its id could not be marked done; a redelivery will run it again",
    );
    metrics::record(Decision::MarkFailed);
    match policy {
        OnRememberFailure::AckAndReport => Ok(()),
        OnRememberFailure::ReturnError => Err(E::from(error)),
    }
}

/// Reports a decision: a `tracing` debug event, and [`metrics::record`].
/// Every delivery calls this, so what it does when nobody listens is
/// inlined and small (one relaxed load of the level); the work for a
/// listener is out of line.
#[inline]
fn report(decision: Decision, id: &str) {
    // The event needs DEBUG, so it runs only where the span's INFO check passed.
    metrics::record_with(decision, || {
        if tracing::level_enabled!(tracing::Level::DEBUG) {
            debug_event(decision, id);
        }
    });
}

#[inline(never)]
fn debug_event(decision: Decision, id: &str) {
    tracing::debug!(target: "babel_idem", message_id = id, decision = decision.as_str());
}
