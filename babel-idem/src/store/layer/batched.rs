//! [`Batched`]: a store whose concurrent `seen` and `remember` calls go to
//! the server together, as one [`Store::seen_many`] / [`Store::remember_many`].

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::coalesce::Coalescer;
use crate::store::claim::{Claim, ClaimFuture, ClaimStore, ClaimToken};
use crate::store::{Store, StoreError, StoreFuture};

/// Wraps a store so that the `seen` calls made while another is on its way
/// to the server go out together in one [`seen_many`](Store::seen_many),
/// and likewise `remember` in one [`remember_many`](Store::remember_many).
///
/// This is how a `Consumer` that reserves many
/// deliveries at once asks about all of them in one round trip: each
/// delivery's guard (`#[idempotent]`, [`run_once`](crate::guard::run_once)) makes its
/// own call, unchanged, and the calls that meet are answered by one batch.
/// A lone call (concurrency 1) is sent as it is, with no wait added; under
/// load the batches grow to what arrives during one round trip (group
/// commit), so round trips per message fall as concurrency rises.
///
/// Every answer is the one a single call would give, and the guard's
/// decision is unchanged. When a batch fails as a whole, each of its calls
/// is asked again on its own, so an error reaches only the calls the store
/// cannot answer (a poison id fails alone, as with
/// [`Guard::run_batch`](crate::guard::Guard::run_batch)). `forget`, and
/// `seen_now`, go straight to the inner store.
///
/// Claim mode ([`Guard::lease`](crate::guard::Guard::lease)) is batched the same
/// way: concurrent `claim` calls meet in one
/// [`claim_many`](ClaimStore::claim_many), concurrent `commit` calls in one
/// [`commit_many`](ClaimStore::commit_many), each entry with its own owner
/// and fence; `release` and `renew` go straight to the inner store.
///
/// Batching pays where a call is a round trip: wrap `RedisStore`,
/// `PostgresStore` or `SqliteStore`, not the [`InMemoryStore`], which
/// answers without waiting. In claim mode every store answers a batch
/// together: one script on Redis, one statement on PostgreSQL, one read and
/// one write transaction on SQLite. A store that keeps the default
/// `claim_many` (one call per entry, in turn) would make concurrent claims
/// wait for each other: do not wrap such a store in claim mode. Clones
/// share their batches.
///
/// [`InMemoryStore`]: crate::store::InMemoryStore
///
/// ```
/// use babel_idem::store::Batched;
/// use babel_idem::{Envelope, InMemoryStore, Store, StoreError, run_once};
/// use serde_json::json;
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// // In production: `Batched::new(RedisStore::connect(url).await?)`.
/// let store = Batched::new(InMemoryStore::new());
/// let order = Envelope::new("urn:babel:orders:created", json!({ "order": 7 }));
///
/// // 64 concurrent deliveries: their `seen` calls meet in one `seen_many`,
/// // their `remember` calls in one `remember_many`.
/// let mut deliveries = tokio::task::JoinSet::new();
/// for n in 0..64 {
///     let store = store.clone();
///     let env = Envelope::new("urn:babel:orders:created", json!({ "order": n }));
///     deliveries.spawn(async move { run_once(&store, &env, async { Ok::<(), StoreError>(()) }).await });
/// }
/// while let Some(delivered) = deliveries.join_next().await {
///     delivered.expect("no delivery panics")?;
/// }
/// assert_eq!(store.get_ref().len(), 64);
/// assert!(!store.seen(order.meta.id.as_deref().unwrap()).await?);
/// # Ok::<(), StoreError>(())
/// # }).unwrap();
/// ```
pub struct Batched<S> {
    inner: Arc<Inner<S>>,
}

struct Inner<S> {
    store: S,
    seen: Coalescer<Box<str>, bool>,
    remember: Coalescer<Box<str>, ()>,
    claim: Coalescer<(Box<str>, ClaimToken, Duration), Claim>,
    commit: Coalescer<(Box<str>, ClaimToken), bool>,
}

impl<S: Store> Batched<S> {
    /// Batches the concurrent calls made to `store`.
    pub fn new(store: S) -> Self {
        Batched {
            inner: Arc::new(Inner {
                store,
                seen: Coalescer::new(),
                remember: Coalescer::new(),
                claim: Coalescer::new(),
                commit: Coalescer::new(),
            }),
        }
    }

    /// The store the batches go to.
    ///
    /// ```
    /// use babel_idem::InMemoryStore;
    /// use babel_idem::store::Batched;
    ///
    /// let store = Batched::new(InMemoryStore::new());
    /// assert_eq!(store.get_ref().len(), 0);
    /// ```
    pub fn get_ref(&self) -> &S {
        &self.inner.store
    }
}

impl<S: Store> Store for Batched<S> {
    fn seen<'a>(&'a self, id: &'a str) -> StoreFuture<'a, bool> {
        let Inner { store, seen, .. } = &*self.inner;
        StoreFuture::new(seen_through(seen, store, id))
    }

    fn remember<'a>(&'a self, id: &'a str) -> StoreFuture<'a, ()> {
        let Inner {
            store, remember, ..
        } = &*self.inner;
        StoreFuture::new(remember_through(remember, store, id))
    }

    fn forget<'a>(&'a self, id: &'a str) -> StoreFuture<'a, ()> {
        self.inner.store.forget(id)
    }

    /// The inner store's own answer without waiting: an answer at hand
    /// needs no batch.
    fn seen_now(&self, id: &str) -> Option<Result<bool, StoreError>> {
        self.inner.store.seen_now(id)
    }

    fn seen_many<'a>(&'a self, ids: &'a [&'a str]) -> StoreFuture<'a, Vec<bool>> {
        self.inner.store.seen_many(ids)
    }

    fn remember_many<'a>(&'a self, ids: &'a [&'a str]) -> StoreFuture<'a, ()> {
        self.inner.store.remember_many(ids)
    }
}

/// Claim mode: concurrent `claim` calls go out together in one
/// [`claim_many`](ClaimStore::claim_many) (calls that asked for different
/// leases, from guards sharing the store, each go alone), concurrent
/// `commit` calls in one
/// [`commit_many`](ClaimStore::commit_many); each entry keeps its own owner,
/// and its answer is the one a single call would give. `release` and
/// `renew`, rarer and never on a delivery's common path, go straight to the
/// inner store.
impl<S: ClaimStore> ClaimStore for Batched<S> {
    fn claim<'a>(&'a self, id: &'a str, owner: ClaimToken, lease: Duration) -> ClaimFuture<'a> {
        let Inner { store, claim, .. } = &*self.inner;
        StoreFuture::new(async move {
            let batched = claim.call((id.into(), owner, lease), |requests| async move {
                if requests.iter().any(|(_, _, asked)| *asked != lease) {
                    // Guards with different leases share this store: a batch
                    // has one lease, so each of these calls asks alone.
                    return None;
                }
                let claims: Vec<(&str, ClaimToken)> = requests
                    .iter()
                    .map(|(id, owner, _)| (&**id, *owner))
                    .collect();
                match claims.as_slice() {
                    [(id, owner)] => store.claim(id, *owner, lease).await.ok().map(|c| vec![c]),
                    _ => match store.claim_many(&claims, lease).await {
                        Ok(answers) => Some(answers),
                        Err(_) => {
                            // The batch may have claimed some entries before it
                            // failed: give those back (owner-checked, so no
                            // other owner's claim is touched), so that each
                            // caller, asking alone, can win instead of finding
                            // its own claim held.
                            for &(id, owner) in &claims {
                                let _ = store.release(id, owner).await;
                            }
                            None
                        }
                    },
                }
            });
            match batched.await {
                Some(answer) => Ok(answer),
                None => store.claim(id, owner, lease).await,
            }
        })
    }

    fn commit<'a>(&'a self, id: &'a str, owner: ClaimToken) -> StoreFuture<'a, bool> {
        let Inner { store, commit, .. } = &*self.inner;
        StoreFuture::new(async move {
            let batched = commit.call((id.into(), owner), |requests| async move {
                let commits: Vec<(&str, ClaimToken)> =
                    requests.iter().map(|(id, owner)| (&**id, *owner)).collect();
                match commits.as_slice() {
                    [(id, owner)] => store.commit(id, *owner).await.ok().map(|done| vec![done]),
                    _ => store.commit_many(&commits).await.ok(),
                }
            });
            match batched.await {
                Some(answer) => Ok(answer),
                None => store.commit(id, owner).await,
            }
        })
    }

    pass_claims_through! {
        release(id: &'a str, owner: ClaimToken) -> bool;
        renew(id: &'a str, owner: ClaimToken, lease: Duration) -> bool;
        claim_many(claims: &'a [(&'a str, ClaimToken)], lease: Duration) -> Vec<Claim>;
        commit_many(commits: &'a [(&'a str, ClaimToken)]) -> Vec<bool>;
    }
}

/// `store.seen(id)`, sent in `coalescer`'s next flush with the calls that
/// meet it there: one `seen_many` (a lone call is sent as the single call,
/// the same command as without batching). A batch that failed as a whole,
/// or whose leader was dropped, leaves each call to ask alone, so an error
/// reaches only the calls the store cannot answer.
///
/// Every caller of one coalescer must pass the same store object: the
/// flush is made by whichever caller leads, with its own `store`.
pub(crate) async fn seen_through<S: Store + ?Sized>(
    coalescer: &Coalescer<Box<str>, bool>,
    store: &S,
    id: &str,
) -> Result<bool, StoreError> {
    let batched = coalescer.call(id.into(), |ids| async move {
        let ids: Vec<&str> = ids.iter().map(|id| &**id).collect();
        match ids.as_slice() {
            // Alone: the single call, the same command as without us.
            [id] => store.seen(id).await.ok().map(|seen| vec![seen]),
            _ => store.seen_many(&ids).await.ok(),
        }
    });
    match batched.await {
        Some(seen) => Ok(seen),
        None => store.seen(id).await,
    }
}

/// [`seen_through`] for `remember`: one `remember_many` per flush.
pub(crate) async fn remember_through<S: Store + ?Sized>(
    coalescer: &Coalescer<Box<str>, ()>,
    store: &S,
    id: &str,
) -> Result<(), StoreError> {
    let batched = coalescer.call(id.into(), |ids| async move {
        let ids: Vec<&str> = ids.iter().map(|id| &**id).collect();
        let done = match ids.as_slice() {
            [id] => store.remember(id).await,
            _ => store.remember_many(&ids).await,
        };
        done.ok().map(|()| vec![(); ids.len()])
    });
    match batched.await {
        Some(()) => Ok(()),
        None => store.remember(id).await,
    }
}

clone_shares_inner!(Batched);

impl<S: fmt::Debug> fmt::Debug for Batched<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Batched").field(&self.inner.store).finish()
    }
}
