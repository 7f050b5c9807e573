//! The seen-set a guard consults: the [`Store`] trait, its future and its error.
//!
//! A store answers three questions about a dedupe key: was it processed
//! ([`Store::seen`]), mark it processed ([`Store::remember`]), and un-mark it
//! ([`Store::forget`]). Every backend implements exactly these and nothing
//! else; the decision of what to do with the answers lives in [`crate::guard::run_once`].

use std::error::Error as StdError;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

// Types the backends' admin operations (their `admin.rs`) share.
mod admin;
mod batch;
pub(crate) mod claim;
pub(crate) mod layer;
mod memory;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "redis")]
mod redis;
// Always built: `InMemoryStore`'s builder shares the TTL rule.
mod settings;
#[cfg(feature = "sqlite")]
mod sqlite;
mod transaction;

pub use admin::{Admin, IdState, Retention, StoreStats};
pub use claim::{Claim, ClaimStore, ClaimToken, InvalidLease, MAX_LEASE};
pub use layer::batched::Batched;
pub use layer::cached::{Cached, CachedBuilder, DEFAULT_CAPACITY, DEFAULT_WINDOW};
pub use memory::{InMemoryStore, InMemoryStoreBuilder};
#[cfg(feature = "postgres")]
pub use postgres::{PostgresStore, PostgresStoreBuilder};
#[cfg(feature = "redis")]
pub use redis::{NotReplicated, RedisStore, RedisStoreBuilder, ShortOfReplicas};
pub use settings::{MAX_TTL, check_url_credentials, redact_url_secrets};
#[cfg(feature = "sqlite")]
pub use sqlite::{SqliteStore, SqliteStoreBuilder};
pub use transaction::{AsConnection, TransactionMisuse, TransactionalStore};

/// A seen-set of processed message ids, shared by every delivery of a consumer.
///
/// `Store` is object safe, so a backend chosen from configuration at run time
/// works as `Arc<dyn Store>` or `&dyn Store` as well as a generic `S: Store`.
/// Its operations return a [`StoreFuture`]: a store that answers from memory
/// returns [`StoreFuture::ready`] and costs no allocation, one that talks to a
/// server returns [`StoreFuture::new`] around its `async` block. A store
/// that can tell whether an id was seen without waiting also gives that
/// answer through `seen_now`, which the guard asks first.
///
/// All three operations must be idempotent: remembering a remembered id and
/// forgetting an unknown id both succeed.
///
/// # Implementing a store
///
/// ```
/// use std::collections::HashSet;
/// use std::sync::Mutex;
/// use babel_idem::Store;
/// use babel_idem::store::StoreFuture;
///
/// #[derive(Default)]
/// struct TinyStore(Mutex<HashSet<String>>);
///
/// impl Store for TinyStore {
///     fn seen<'a>(&'a self, id: &'a str) -> StoreFuture<'a, bool> {
///         StoreFuture::ready(Ok(self.0.lock().unwrap().contains(id)))
///     }
///     fn remember<'a>(&'a self, id: &'a str) -> StoreFuture<'a, ()> {
///         self.0.lock().unwrap().insert(id.to_owned());
///         StoreFuture::ready(Ok(()))
///     }
///     fn forget<'a>(&'a self, id: &'a str) -> StoreFuture<'a, ()> {
///         // A network backend would write `StoreFuture::new(async move { ... })`.
///         StoreFuture::new(async move {
///             self.0.lock().unwrap().remove(id);
///             Ok(())
///         })
///     }
/// }
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let store = TinyStore::default();
/// store.remember("id-A").await?;
/// assert!(store.seen("id-A").await?);
/// store.forget("id-A").await?;
/// assert!(!store.seen("id-A").await?);
/// # Ok::<(), babel_idem::StoreError>(())
/// # }).unwrap();
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a babel-idem `Store`",
    label = "expected a `Store` here",
    note = "`store = ...` takes a value (or a reference to one) whose type implements `babel_idem::Store`, \
            such as `InMemoryStore`, `Arc<dyn Store>` or a persistent store"
)]
pub trait Store: Send + Sync {
    /// Whether `id` was remembered (and has not expired or been forgotten).
    fn seen<'a>(&'a self, id: &'a str) -> StoreFuture<'a, bool>;

    /// Marks `id` as processed. Remembering an id twice is not an error.
    fn remember<'a>(&'a self, id: &'a str) -> StoreFuture<'a, ()>;

    /// Removes `id`, so a later delivery runs again (manual replay).
    /// Forgetting an unknown id is not an error.
    fn forget<'a>(&'a self, id: &'a str) -> StoreFuture<'a, ()>;

    /// [`seen`](Store::seen) for every id of a batch, answered in the ids'
    /// order (`answers[i]` is about `ids[i]`; a repeated id gets the same
    /// answer each time). An empty batch answers an empty `Vec`.
    ///
    /// The default asks [`seen`](Store::seen) once per id, one after the
    /// other; the server stores answer a whole batch in one round trip. The
    /// batch fails as a whole: an `Err` says nothing about any single id,
    /// and a caller that must tell them apart asks them one at a time (the
    /// batch guard does).
    ///
    /// The answers come back as a `Vec<bool>` rather than into a buffer the
    /// caller lends: a store that asks a server allocates for the request
    /// anyway, and an owned answer keeps the future free of a `&mut` borrow,
    /// so the trait stays object safe and simple to forward.
    ///
    /// ```
    /// use babel_idem::{InMemoryStore, Store};
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let store = InMemoryStore::new();
    /// store.remember_many(&["id-A", "id-C"]).await?;
    /// assert_eq!(store.seen_many(&["id-A", "id-B", "id-A"]).await?, [true, false, true]);
    /// # Ok::<(), babel_idem::StoreError>(())
    /// # }).unwrap();
    /// ```
    fn seen_many<'a>(&'a self, ids: &'a [&'a str]) -> StoreFuture<'a, Vec<bool>> {
        StoreFuture::new(batch::seen_each(self, ids))
    }

    /// [`remember`](Store::remember) for every id of a batch, with the same
    /// set-if-absent and TTL semantics; a repeated id is remembered once.
    ///
    /// The default calls [`remember`](Store::remember) once per id; the
    /// server stores write a whole batch in one round trip. On an `Err` some
    /// ids may have been remembered and others not.
    fn remember_many<'a>(&'a self, ids: &'a [&'a str]) -> StoreFuture<'a, ()> {
        StoreFuture::new(batch::remember_each(self, ids))
    }

    /// A hook of the guard's, off the documented contract: a store that
    /// keeps the default loses nothing but a duplicate's skip without a
    /// future.
    ///
    /// [`seen`](Store::seen)'s answer where the store has it without
    /// waiting, `None` where it would have to wait (the default).
    ///
    /// The seen-set guard asks it first and awaits [`seen`](Store::seen)
    /// only on `None`, so a store with a local answer (memory, a local
    /// cache in front of a server) skips a duplicate in the guard's first
    /// poll, without a future. An answer here must be the one `seen` would
    /// give at the same moment, errors included: an `Err` fails the
    /// delivery as a failed `seen` does, and the handler does not run.
    ///
    /// ```
    /// use std::collections::HashSet;
    /// use std::sync::Mutex;
    /// use babel_idem::{Store, StoreError};
    /// use babel_idem::store::StoreFuture;
    ///
    /// #[derive(Default)]
    /// struct LocalStore(Mutex<HashSet<String>>);
    ///
    /// impl Store for LocalStore {
    ///     fn seen<'a>(&'a self, id: &'a str) -> StoreFuture<'a, bool> {
    ///         StoreFuture::ready(Ok(self.0.lock().unwrap().contains(id)))
    ///     }
    ///     fn seen_now(&self, id: &str) -> Option<Result<bool, StoreError>> {
    ///         Some(Ok(self.0.lock().unwrap().contains(id)))
    ///     }
    ///     fn remember<'a>(&'a self, id: &'a str) -> StoreFuture<'a, ()> {
    ///         self.0.lock().unwrap().insert(id.to_owned());
    ///         StoreFuture::ready(Ok(()))
    ///     }
    ///     fn forget<'a>(&'a self, id: &'a str) -> StoreFuture<'a, ()> {
    ///         self.0.lock().unwrap().remove(id);
    ///         StoreFuture::ready(Ok(()))
    ///     }
    /// }
    ///
    /// let store = LocalStore::default();
    /// assert!(matches!(store.seen_now("id-A"), Some(Ok(false))));
    /// store.0.lock().unwrap().insert("id-A".to_owned());
    /// assert!(matches!(store.seen_now("id-A"), Some(Ok(true))));
    ///
    /// // A store that does not override it has no answer without waiting.
    /// struct Remote;
    /// impl Store for Remote {
    ///     fn seen<'a>(&'a self, _id: &'a str) -> StoreFuture<'a, bool> {
    ///         StoreFuture::new(async { Ok(false) })
    ///     }
    ///     fn remember<'a>(&'a self, _id: &'a str) -> StoreFuture<'a, ()> {
    ///         StoreFuture::new(async { Ok(()) })
    ///     }
    ///     fn forget<'a>(&'a self, _id: &'a str) -> StoreFuture<'a, ()> {
    ///         StoreFuture::new(async { Ok(()) })
    ///     }
    /// }
    /// assert!(Remote.seen_now("id-A").is_none());
    /// ```
    #[inline]
    #[doc(hidden)]
    fn seen_now(&self, id: &str) -> Option<Result<bool, StoreError>> {
        let _ = id;
        None
    }

    /// `Some` for a store whose [`seen_many`](Store::seen_many) and
    /// [`remember_many`](Store::remember_many) answer a whole batch in one
    /// round trip, naming this store object; `None` (the default) for one
    /// that answers id by id, or already groups its calls. A hook of the
    /// consumer's, off the documented contract.
    ///
    /// A [`Consumer`][Consumer] that holds more than one
    /// delivery sends the concurrent `seen` and `remember` calls its guards
    /// make to the same target together, as [`Batched`] would (see
    /// [`guide::batches`](crate::guide::batches)); calls to a store that
    /// answers `None` stay one per message. The server stores (Redis,
    /// PostgreSQL, SQLite) answer `Some`; the in-memory store (no round
    /// trip to save) and [`Batched`] (which batches already) answer `None`;
    /// `&S`, `Arc<S>`, `Box<S>` and [`Cached`] pass their store's answer on.
    ///
    /// ```
    /// use babel_idem::{InMemoryStore, Store};
    /// use babel_idem::store::{BatchTarget, StoreFuture};
    ///
    /// // A store whose batch calls are one round trip each says so.
    /// struct Remote {
    ///     url: String,
    /// }
    /// impl Store for Remote {
    ///     fn seen<'a>(&'a self, _id: &'a str) -> StoreFuture<'a, bool> {
    ///         StoreFuture::new(async { Ok(false) })
    ///     }
    ///     fn remember<'a>(&'a self, _id: &'a str) -> StoreFuture<'a, ()> {
    ///         StoreFuture::new(async { Ok(()) })
    ///     }
    ///     fn forget<'a>(&'a self, _id: &'a str) -> StoreFuture<'a, ()> {
    ///         StoreFuture::new(async { Ok(()) })
    ///     }
    ///     // A real one also overrides `seen_many` and `remember_many`.
    ///     fn batch_target(&self) -> Option<BatchTarget> {
    ///         BatchTarget::of(self)
    ///     }
    /// }
    ///
    /// let store = Remote { url: "redis://127.0.0.1/".into() };
    /// assert!(store.batch_target().is_some());
    /// // A reference names the same store object.
    /// assert_eq!((&store).batch_target(), store.batch_target());
    /// assert!(InMemoryStore::new().batch_target().is_none());
    /// ```
    #[cfg_attr(feature = "consumer", doc = "[Consumer]: crate::consumer::Consumer")]
    #[cfg_attr(
        not(feature = "consumer"),
        doc = "[Consumer]: https://docs.rs/babel-idem/latest/babel_idem/consumer/struct.Consumer.html"
    )]
    #[inline]
    #[doc(hidden)]
    fn batch_target(&self) -> Option<BatchTarget> {
        None
    }
}

/// Names one store object whose concurrent single calls may go out
/// together (`Store::batch_target`): two targets are equal only for the
/// same object (its address while it is borrowed, and its type).
///
/// ```
/// use babel_idem::store::BatchTarget;
/// use babel_idem::InMemoryStore;
///
/// let (a, b) = (InMemoryStore::new(), InMemoryStore::new());
/// assert_eq!(BatchTarget::of(&a), BatchTarget::of(&a));
/// assert_ne!(BatchTarget::of(&a), BatchTarget::of(&b));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BatchTarget {
    address: usize,
    size: usize,
    type_name: &'static str,
}

impl BatchTarget {
    /// The target that names `store`; `None` for a zero-sized store, whose
    /// address names no object of its own (its calls stay per message).
    ///
    /// ```
    /// use babel_idem::store::BatchTarget;
    ///
    /// struct Unit;
    /// assert!(BatchTarget::of(&Unit).is_none());
    /// assert!(BatchTarget::of(&String::from("a store")).is_some());
    /// ```
    pub fn of<S: ?Sized>(store: &S) -> Option<Self> {
        let size = std::mem::size_of_val(store);
        if size == 0 {
            return None;
        }
        // Two objects alive at once share an address only where one holds
        // the other at its start, and then their types differ.
        Some(BatchTarget {
            address: std::ptr::from_ref(store).cast::<()>() as usize,
            size,
            type_name: std::any::type_name::<S>(),
        })
    }
}

macro_rules! forward_store {
    ($($ty:ty),+ $(,)?) => {$(
        impl<S: Store + ?Sized> Store for $ty {
            #[inline]
            fn seen<'a>(&'a self, id: &'a str) -> StoreFuture<'a, bool> {
                (**self).seen(id)
            }
            #[inline]
            fn remember<'a>(&'a self, id: &'a str) -> StoreFuture<'a, ()> {
                (**self).remember(id)
            }
            #[inline]
            fn forget<'a>(&'a self, id: &'a str) -> StoreFuture<'a, ()> {
                (**self).forget(id)
            }
            #[inline]
            fn seen_many<'a>(&'a self, ids: &'a [&'a str]) -> StoreFuture<'a, Vec<bool>> {
                (**self).seen_many(ids)
            }
            #[inline]
            fn remember_many<'a>(&'a self, ids: &'a [&'a str]) -> StoreFuture<'a, ()> {
                (**self).remember_many(ids)
            }
            #[inline]
            fn seen_now(&self, id: &str) -> Option<Result<bool, StoreError>> {
                (**self).seen_now(id)
            }
            #[inline]
            fn batch_target(&self) -> Option<BatchTarget> {
                (**self).batch_target()
            }
        }
    )+};
}

forward_store!(&S, Arc<S>, Box<S>);

/// The future a [`Store`] operation returns.
///
/// Either an answer that is already known ([`StoreFuture::ready`], no
/// allocation) or a boxed future ([`StoreFuture::new`]). Awaiting it yields
/// `Result<T, StoreError>`.
///
/// ```
/// use babel_idem::store::StoreFuture;
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let known: StoreFuture<'_, bool> = StoreFuture::ready(Ok(true));
/// assert!(known.await.unwrap());
///
/// let later: StoreFuture<'_, bool> = StoreFuture::new(async { Ok(false) });
/// assert!(!later.await.unwrap());
/// # });
/// ```
#[must_use = "a store operation does nothing unless awaited"]
pub struct StoreFuture<'a, T>(Inner<'a, T>);

enum Inner<'a, T> {
    Ready(Option<Result<T, StoreError>>),
    Pending(Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>),
}

impl<'a, T> StoreFuture<'a, T> {
    /// An operation that completed synchronously.
    #[inline]
    pub fn ready(result: Result<T, StoreError>) -> Self {
        StoreFuture(Inner::Ready(Some(result)))
    }

    /// An operation that has to wait (a network round trip, a blocking pool).
    pub fn new<F>(future: F) -> Self
    where
        F: Future<Output = Result<T, StoreError>> + Send + 'a,
    {
        StoreFuture(Inner::Pending(Box::pin(future)))
    }
}

impl<T> StoreFuture<'_, T> {
    /// The answer of a store that gave it in the call itself, or this
    /// future, to await (`store_answer!` in `guard.rs` says why).
    #[inline(always)]
    pub(crate) fn into_ready(self) -> Result<Result<T, StoreError>, Self> {
        match self.0 {
            Inner::Ready(Some(answer)) => Ok(answer),
            pending => Err(StoreFuture(pending)),
        }
    }
}

// Neither variant is self-referential: the boxed future is pinned on the heap.
impl<T> Unpin for StoreFuture<'_, T> {}

impl<T> Future for StoreFuture<'_, T> {
    type Output = Result<T, StoreError>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.get_mut().0 {
            Inner::Ready(result) => Poll::Ready(
                result
                    .take()
                    .expect("StoreFuture polled after it completed"),
            ),
            Inner::Pending(future) => future.as_mut().poll(cx),
        }
    }
}

impl<T> fmt::Debug for StoreFuture<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.0 {
            Inner::Ready(Some(_)) => "ready",
            Inner::Ready(None) => "done",
            Inner::Pending(_) => "pending",
        };
        f.debug_tuple("StoreFuture").field(&state).finish()
    }
}

/// Which [`Store`] operation failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StoreOperation {
    /// [`Store::seen`].
    Seen,
    /// [`Store::remember`].
    Remember,
    /// [`Store::forget`].
    Forget,
    /// Opening the store: connecting, creating its table, checking its settings.
    Open,
    /// Housekeeping outside the three operations, such as purging expired ids.
    Maintenance,
    /// [`ClaimStore::claim`].
    Claim,
    /// [`ClaimStore::commit`].
    Commit,
    /// [`ClaimStore::release`].
    Release,
    /// [`ClaimStore::renew`].
    Renew,
    /// [`Store::seen_many`]: a batch of `seen`.
    SeenMany,
    /// [`Store::remember_many`]: a batch of `remember`.
    RememberMany,
}

impl StoreOperation {
    /// The operation's name as the contract spells it: `seen`, `remember`, ...
    pub fn as_str(self) -> &'static str {
        match self {
            StoreOperation::Seen => "seen",
            StoreOperation::Remember => "remember",
            StoreOperation::Forget => "forget",
            StoreOperation::Open => "open",
            StoreOperation::Maintenance => "maintenance",
            StoreOperation::Claim => "claim",
            StoreOperation::Commit => "commit",
            StoreOperation::Release => "release",
            StoreOperation::Renew => "renew",
            StoreOperation::SeenMany => "seen_many",
            StoreOperation::RememberMany => "remember_many",
        }
    }
}

impl fmt::Display for StoreOperation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Any error that can cross threads: what a [`StoreError`] carries as its
/// source, and what the router turns a handler's error into.
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// A store operation failed: the backend was unreachable, timed out, or
/// refused the command.
///
/// It says which operation failed and which backend, and carries the
/// backend's own error as its [`source`](StdError::source). It converts into
/// `anyhow::Error` and `Box<dyn Error + Send + Sync>` with `?`.
///
/// ```
/// use babel_idem::StoreError;
/// use babel_idem::store::StoreOperation;
///
/// let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
/// let err = StoreError::new(StoreOperation::Seen, "redis", io);
/// assert_eq!(err.operation(), StoreOperation::Seen);
/// assert_eq!(err.to_string(), "redis store: `seen` failed: refused");
///
/// let boxed: Box<dyn std::error::Error + Send + Sync> = err.into();
/// assert!(boxed.source().is_some());
/// ```
#[derive(thiserror::Error)]
#[error(transparent)]
pub struct StoreError(Box<Failure>);

/// What a [`StoreError`] says, behind one pointer: a `StoreError`, and a
/// `Result<(), StoreError>`, are one word, and only a failure allocates.
#[derive(Debug, thiserror::Error)]
enum Failure {
    /// A backend failed while it ran `operation`.
    #[error("{backend} store: `{operation}` failed: {source}")]
    Backend {
        operation: StoreOperation,
        backend: &'static str,
        source: BoxError,
    },
    /// A refusal the claim-mode guard made itself (backend
    /// [`claim::GUARD`]): no backend failed, so it reads as the refusal.
    #[error("{source}")]
    Guard {
        operation: StoreOperation,
        source: BoxError,
    },
}

impl fmt::Debug for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreError")
            .field("operation", &self.operation())
            .field("backend", &self.backend())
            .field("source", self.source_ref())
            .finish()
    }
}

impl StoreError {
    /// Wraps a backend error raised by `operation`.
    pub fn new(
        operation: StoreOperation,
        backend: &'static str,
        source: impl Into<BoxError>,
    ) -> Self {
        let source = source.into();
        StoreError(Box::new(if backend == claim::GUARD {
            Failure::Guard { operation, source }
        } else {
            Failure::Backend {
                operation,
                backend,
                source,
            }
        }))
    }

    /// The operation that failed.
    pub fn operation(&self) -> StoreOperation {
        match *self.0 {
            Failure::Backend { operation, .. } | Failure::Guard { operation, .. } => operation,
        }
    }

    /// The backend that failed: `memory`, `sqlite`, `redis`, `postgres`, ...,
    /// or `guard` for a refusal a claim-mode guard made itself (a parked
    /// delivery, a lost claim, a lease out of range).
    pub fn backend(&self) -> &'static str {
        match *self.0 {
            Failure::Backend { backend, .. } => backend,
            Failure::Guard { .. } => claim::GUARD,
        }
    }

    /// The backend's error, for downcasting.
    pub fn into_source(self) -> BoxError {
        match *self.0 {
            Failure::Backend { source, .. } | Failure::Guard { source, .. } => source,
        }
    }

    /// The backend's error, borrowed.
    pub(crate) fn source_ref(&self) -> &BoxError {
        match &*self.0 {
            Failure::Backend { source, .. } | Failure::Guard { source, .. } => source,
        }
    }
}

/// The `map_err` adapter of every backend: an error of `backend` while it
/// ran `operation`, as a [`StoreError`].
///
/// `.map_err(failed(BACKEND, StoreOperation::Seen))?`
pub(crate) fn failed<E: Into<BoxError>>(
    backend: &'static str,
    operation: StoreOperation,
) -> impl FnOnce(E) -> StoreError {
    move |source| StoreError::new(operation, backend, source)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync + 'static>() {}

    #[test]
    fn store_error_is_a_shareable_error() {
        assert_send_sync::<StoreError>();
        let err = StoreError::new(StoreOperation::Remember, "memory", "full");
        let any: anyhow::Error = err.into();
        assert_eq!(any.to_string(), "memory store: `remember` failed: full");
    }

    #[test]
    fn a_store_error_and_a_result_of_one_are_one_word() {
        use std::mem::size_of;
        assert_eq!(size_of::<StoreError>(), size_of::<usize>());
        assert_eq!(size_of::<Result<(), StoreError>>(), size_of::<usize>());
        let err = StoreError::new(StoreOperation::Seen, "redis", "refused");
        assert_eq!(
            format!("{err:?}"),
            r#"StoreError { operation: Seen, backend: "redis", source: "refused" }"#
        );
        assert_eq!(err.backend(), "redis");
        assert_eq!(err.operation(), StoreOperation::Seen);
        assert_eq!(err.into_source().to_string(), "refused");
    }

    /// A store that keeps every default: it has no answer without waiting.
    struct Remote;

    impl Store for Remote {
        fn seen<'a>(&'a self, _id: &'a str) -> StoreFuture<'a, bool> {
            StoreFuture::new(async { Ok(true) })
        }
        fn remember<'a>(&'a self, _id: &'a str) -> StoreFuture<'a, ()> {
            StoreFuture::new(async { Ok(()) })
        }
        fn forget<'a>(&'a self, _id: &'a str) -> StoreFuture<'a, ()> {
            StoreFuture::new(async { Ok(()) })
        }
    }

    #[test]
    fn seen_now_is_none_by_default_even_where_seen_would_answer_true() {
        assert!(Remote.seen_now("id-A").is_none());
        assert!(<&Remote as Store>::seen_now(&&Remote, "id-A").is_none());
        let shared: Arc<dyn Store> = Arc::new(Remote);
        assert!(shared.seen_now("id-A").is_none());
        assert!(Batched::new(Remote).seen_now("id-A").is_none());
    }

    #[test]
    fn seen_now_is_forwarded_through_references_arcs_boxes_and_batched() {
        let store = Arc::new(InMemoryStore::new());
        assert!(matches!(store.seen_now("id-A"), Some(Ok(false))));
        assert!(matches!(
            StoreFuture::into_ready(store.remember("id-A")),
            Ok(Ok(()))
        ));
        let answers = [
            <InMemoryStore as Store>::seen_now(&store, "id-A"),
            <&InMemoryStore as Store>::seen_now(&&*store, "id-A"),
            <Arc<InMemoryStore> as Store>::seen_now(&store, "id-A"),
            Arc::clone(&store).seen_now("id-A"),
            (Box::new(&*store) as Box<dyn Store + '_>).seen_now("id-A"),
            (&*store as &dyn Store).seen_now("id-A"),
            Batched::new(Arc::clone(&store)).seen_now("id-A"),
        ];
        for (at, answer) in answers.into_iter().enumerate() {
            assert!(
                matches!(answer, Some(Ok(true))),
                "forwarder {at}: {answer:?}"
            );
        }
    }

    #[test]
    fn dyn_store_is_a_store() {
        fn takes<S: Store + ?Sized>(_: &S) {}
        let store: Arc<dyn Store> = Arc::new(InMemoryStore::new());
        takes(&store);
        takes(&*store);
        let boxed: Box<dyn Store> = Box::new(InMemoryStore::new());
        takes(&boxed);
    }
}
