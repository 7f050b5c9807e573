//! [`Cached`]: a store that answers `seen` for the ids this process saw
//! done, from a bounded set in memory, without asking the store.

use std::collections::VecDeque;
use std::fmt;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use arrayvec::ArrayString;
use foldhash::fast::RandomState;
use hashbrown::HashTable;

use crate::builders::setters;
use crate::store::claim::{Claim, ClaimFuture, ClaimStore, ClaimToken};
use crate::store::{BatchTarget, Store, StoreError, StoreFuture};

/// How long a [`Cached`] keeps a positive answer by default: a `forget` made
/// by another process (the CLI's `forget`, a redrive's `--forget-in`) is
/// seen here at most this long after it was made.
///
/// ```
/// use std::time::Duration;
/// assert_eq!(babel_idem::store::DEFAULT_WINDOW, Duration::from_secs(2));
/// ```
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(2);

/// How many ids a [`Cached`] keeps by default; past it the oldest go first.
///
/// ```
/// assert_eq!(babel_idem::store::DEFAULT_CAPACITY, 16_384);
/// ```
pub const DEFAULT_CAPACITY: usize = 16_384;

/// The longest id kept, in bytes (a UUID is 36, a scoped key a few more);
/// a longer id is always asked of the store.
const LONGEST_ID: usize = 96;

/// Wraps a store so that the ids this process saw done (a `seen` that
/// answered `true`, a `remember` or `remember_many` that succeeded, a claim
/// that found the id done or a `commit` that marked it) are answered `seen`
/// from memory for a short while, with no round trip: a redelivery of a
/// message this worker just handled (a broker's requeue, a producer's retry)
/// is skipped locally.
///
/// - Only positive answers are kept. "Not seen" is always asked of the
///   store, so an id done by another worker is never run twice because of
///   this cache.
/// - An answer is kept for the window ([`CachedBuilder::window`], default
///   [`DEFAULT_WINDOW`]) and never longer than the store's TTL
///   ([`CachedBuilder::ttl`]): it expires, at the latest, as the store's own
///   mark would if it was written when the answer was learned.
/// - A [`forget`](Store::forget) through this wrapper removes the id here
///   before and after the store forgets it. A `forget` made elsewhere (the
///   CLI's `babel-idem forget`, `babel-idem dlq redrive --forget-in`, another
///   process) is not seen here until the window has passed: within it, a
///   replay of that id is still skipped by this process. Keep the window
///   short (seconds), or forget through the same wrapper.
/// - At most [`capacity`](CachedBuilder::capacity) ids are kept (default
///   [`DEFAULT_CAPACITY`]); the oldest go first. Ids longer than 96 bytes
///   are not kept. Keeping an id copies it into a slot the set already
///   holds: after the set has filled once, nothing allocates.
///
/// Claim mode ([`ClaimStore`]): a claim of a kept id answers
/// [`Claim::Done`] without asking (the id is done; nothing would be
/// leased), a successful `commit` keeps its id, and `release` and `renew`
/// go to the store. Transactional mode is not offered through this
/// wrapper: a mark written in a caller's transaction may still roll back,
/// and the decision belongs to the database's row lock, which a local
/// answer cannot take part in; use the store itself there.
///
/// It composes with [`Batched`](crate::store::Batched) either way round:
/// `Cached::new(Batched::new(store))` answers what it can locally and
/// batches the rest. Clones share the set.
///
/// ```
/// use std::time::Duration;
/// use babel_idem::store::Cached;
/// use babel_idem::{InMemoryStore, Store};
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// // In production: `Cached::builder(RedisStore::connect_lazy(url)?)`.
/// let store = Cached::builder(InMemoryStore::new())
///     .window(Duration::from_secs(2))
///     .ttl(Duration::from_secs(7 * 24 * 3600))
///     .capacity(10_000)
///     .build();
/// store.remember("id-A").await?;
/// // Answered from the set, without asking the store.
/// assert!(matches!(store.seen_now("id-A"), Some(Ok(true))));
/// assert!(store.is_kept("id-A"));
/// // Never a negative answer: "id-B" is asked of the store.
/// assert!(!store.seen("id-B").await?);
/// assert!(!store.is_kept("id-B"));
/// store.forget("id-A").await?;
/// assert!(!store.seen("id-A").await?);
/// # Ok::<(), babel_idem::StoreError>(())
/// # }).unwrap();
/// ```
pub struct Cached<S> {
    inner: Arc<Inner<S>>,
}

struct Inner<S> {
    store: S,
    /// How long a kept answer lives: the window, or the TTL if shorter.
    lifetime: Duration,
    capacity: usize,
    hasher: RandomState,
    recent: Mutex<Recent>,
}

/// Configures a [`Cached`]; made by [`Cached::builder`].
///
/// ```
/// use std::time::Duration;
/// use babel_idem::store::Cached;
/// use babel_idem::InMemoryStore;
///
/// let store = Cached::builder(InMemoryStore::new())
///     .window(Duration::from_millis(500))
///     .capacity(1_000)
///     .build();
/// assert_eq!(store.lifetime(), Duration::from_millis(500));
/// ```
#[must_use = "call .build() to get the store"]
pub struct CachedBuilder<S> {
    store: S,
    window: Duration,
    ttl: Option<Duration>,
    capacity: usize,
}

impl<S: Store> Cached<S> {
    /// Wraps `store` with the default window and capacity.
    ///
    /// ```
    /// use babel_idem::store::Cached;
    /// use babel_idem::InMemoryStore;
    ///
    /// let store = Cached::new(InMemoryStore::new());
    /// assert_eq!(store.lifetime(), babel_idem::store::DEFAULT_WINDOW);
    /// ```
    pub fn new(store: S) -> Self {
        Cached::builder(store).build()
    }

    /// Wraps `store`, with the settings of the builder.
    pub fn builder(store: S) -> CachedBuilder<S> {
        CachedBuilder {
            store,
            window: DEFAULT_WINDOW,
            ttl: None,
            capacity: DEFAULT_CAPACITY,
        }
    }

    /// The store behind the set.
    ///
    /// ```
    /// use babel_idem::store::Cached;
    /// use babel_idem::InMemoryStore;
    ///
    /// let store = Cached::new(InMemoryStore::new());
    /// assert_eq!(store.get_ref().len(), 0);
    /// ```
    pub fn get_ref(&self) -> &S {
        &self.inner.store
    }

    /// How long a positive answer is kept: the window, or the store's TTL
    /// where that is shorter.
    ///
    /// ```
    /// use std::time::Duration;
    /// use babel_idem::store::Cached;
    /// use babel_idem::InMemoryStore;
    ///
    /// let store = Cached::builder(InMemoryStore::new())
    ///     .window(Duration::from_secs(5))
    ///     .ttl(Duration::from_secs(1))
    ///     .build();
    /// assert_eq!(store.lifetime(), Duration::from_secs(1));
    /// ```
    pub fn lifetime(&self) -> Duration {
        self.inner.lifetime
    }

    /// Whether `id` is answered from the set now (kept and not expired).
    ///
    /// ```
    /// use babel_idem::store::Cached;
    /// use babel_idem::{InMemoryStore, Store};
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let store = Cached::new(InMemoryStore::new());
    /// assert!(!store.is_kept("id-A"));
    /// store.remember("id-A").await?;
    /// assert!(store.is_kept("id-A"));
    /// # Ok::<(), babel_idem::StoreError>(())
    /// # }).unwrap();
    /// ```
    pub fn is_kept(&self, id: &str) -> bool {
        self.inner.hit(id)
    }

    /// How many ids the set holds, expired ones not yet dropped included.
    ///
    /// ```
    /// use babel_idem::store::Cached;
    /// use babel_idem::{InMemoryStore, Store};
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let store = Cached::builder(InMemoryStore::new()).capacity(2).build();
    /// store.remember_many(&["id-A", "id-B", "id-C"]).await?;
    /// assert_eq!(store.kept(), 2);
    /// # Ok::<(), babel_idem::StoreError>(())
    /// # }).unwrap();
    /// ```
    pub fn kept(&self) -> usize {
        self.inner.lock().live
    }
}

impl<S: Store> CachedBuilder<S> {
    setters! {
        /// How long a positive answer is kept at most (default
        /// [`DEFAULT_WINDOW`]): the longest a `forget` made by another process
        /// goes unseen here. Zero keeps nothing.
        ///
        /// ```
        /// use std::time::Duration;
        /// use babel_idem::store::Cached;
        /// use babel_idem::{InMemoryStore, Store};
        ///
        /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
        /// let store = Cached::builder(InMemoryStore::new()).window(Duration::ZERO).build();
        /// store.remember("id-A").await?;
        /// assert!(!store.is_kept("id-A"));
        /// # Ok::<(), babel_idem::StoreError>(())
        /// # }).unwrap();
        /// ```
        pub fn window(window: Duration) => self.window;

        /// The store's TTL: no answer is kept longer (default: no limit but the
        /// window).
        ///
        /// ```
        /// use std::time::Duration;
        /// use babel_idem::store::Cached;
        /// use babel_idem::InMemoryStore;
        ///
        /// let store = Cached::builder(InMemoryStore::new()).ttl(Duration::from_secs(1)).build();
        /// assert_eq!(store.lifetime(), Duration::from_secs(1));
        /// ```
        pub fn ttl(ttl: Duration) => self.ttl = Some(ttl);

        /// How many ids are kept at most (default [`DEFAULT_CAPACITY`]); the
        /// oldest go first. Zero keeps nothing.
        ///
        /// ```
        /// use babel_idem::store::Cached;
        /// use babel_idem::{InMemoryStore, Store};
        ///
        /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
        /// let store = Cached::builder(InMemoryStore::new()).capacity(1).build();
        /// store.remember_many(&["id-A", "id-B"]).await?;
        /// assert!(!store.is_kept("id-A") && store.is_kept("id-B"));
        /// # Ok::<(), babel_idem::StoreError>(())
        /// # }).unwrap();
        /// ```
        pub fn capacity(capacity: usize) => self.capacity;
    }

    /// The wrapper.
    ///
    /// ```
    /// use babel_idem::store::Cached;
    /// use babel_idem::InMemoryStore;
    ///
    /// let store = Cached::builder(InMemoryStore::new()).build();
    /// assert_eq!(store.kept(), 0);
    /// ```
    pub fn build(self) -> Cached<S> {
        let lifetime = self.ttl.map_or(self.window, |ttl| ttl.min(self.window));
        Cached {
            inner: Arc::new(Inner {
                store: self.store,
                lifetime,
                capacity: self.capacity,
                hasher: RandomState::default(),
                recent: Mutex::new(Recent::default()),
            }),
        }
    }
}

/// The ids kept, oldest first. Every answer lives the same `lifetime`, so
/// the order they were kept in is the order they expire in: expiry and
/// eviction both take from the front.
#[derive(Default)]
struct Recent {
    /// Each kept id's sequence number; its slot is `seq - first`.
    index: HashTable<u64>,
    slots: VecDeque<Slot>,
    /// The sequence number of `slots[0]`.
    first: u64,
    /// Slots whose id is still in `index` (not forgotten).
    live: usize,
}

struct Slot {
    id: ArrayString<LONGEST_ID>,
    hash: u64,
    expires: Instant,
    /// `false` once forgotten: the slot waits to leave the front.
    live: bool,
}

impl<S> Inner<S> {
    fn lock(&self) -> MutexGuard<'_, Recent> {
        // Every statement leaves the set consistent: a panic elsewhere
        // cannot leave it half-written.
        self.recent.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn hit(&self, id: &str) -> bool {
        if id.len() > LONGEST_ID || self.capacity == 0 {
            return false;
        }
        let hash = self.hasher.hash_one(id);
        let recent = self.lock();
        recent
            .find(hash, id)
            .is_some_and(|at| recent.slots[at].expires > Instant::now())
    }

    fn keep(&self, id: &str) {
        if id.len() > LONGEST_ID || self.capacity == 0 || self.lifetime.is_zero() {
            return;
        }
        let Ok(text) = ArrayString::from(id) else {
            return;
        };
        let hash = self.hasher.hash_one(id);
        let now = Instant::now();
        let mut recent = self.lock();
        recent.expire(now);
        if recent.find(hash, id).is_some() {
            // Kept already, with an earlier expiry: never extended, so the
            // set stays ordered by expiry.
            return;
        }
        if recent.slots.len() >= self.capacity {
            recent.pop_front();
        }
        let seq = recent.first + recent.slots.len() as u64;
        recent.slots.push_back(Slot {
            id: text,
            hash,
            expires: now + self.lifetime,
            live: true,
        });
        recent.live += 1;
        let Recent {
            index,
            slots,
            first,
            ..
        } = &mut *recent;
        // A growing index hashes again from the hashes the slots keep.
        index.insert_unique(hash, seq, |&kept| slots[(kept - *first) as usize].hash);
    }

    fn drop_id(&self, id: &str) {
        if id.len() > LONGEST_ID {
            return;
        }
        let hash = self.hasher.hash_one(id);
        let mut recent = self.lock();
        let Recent {
            index,
            slots,
            first,
            ..
        } = &mut *recent;
        let first = *first;
        if let Ok(entry) = index.find_entry(hash, |&seq| &*slots[(seq - first) as usize].id == id) {
            let (seq, _) = entry.remove();
            slots[(seq - first) as usize].live = false;
            recent.live -= 1;
        }
    }
}

impl Recent {
    fn find(&self, hash: u64, id: &str) -> Option<usize> {
        self.index
            .find(hash, |&seq| {
                &*self.slots[(seq - self.first) as usize].id == id
            })
            .map(|&seq| (seq - self.first) as usize)
    }

    /// Drops the expired answers, from the front.
    fn expire(&mut self, now: Instant) {
        while self.slots.front().is_some_and(|slot| slot.expires <= now) {
            self.pop_front();
        }
    }

    fn pop_front(&mut self) {
        let Some(slot) = self.slots.pop_front() else {
            return;
        };
        let seq = self.first;
        self.first += 1;
        if slot.live {
            if let Ok(entry) = self.index.find_entry(slot.hash, |&kept| kept == seq) {
                entry.remove();
            }
            self.live -= 1;
        }
    }
}

impl<S: Store> Store for Cached<S> {
    fn seen<'a>(&'a self, id: &'a str) -> StoreFuture<'a, bool> {
        if self.inner.hit(id) {
            return StoreFuture::ready(Ok(true));
        }
        let inner = &*self.inner;
        let asked = inner.store.seen(id);
        match asked.into_ready() {
            Ok(answer) => {
                if let Ok(true) = answer {
                    inner.keep(id);
                }
                StoreFuture::ready(answer)
            }
            Err(pending) => StoreFuture::new(async move {
                let seen = pending.await?;
                if seen {
                    inner.keep(id);
                }
                Ok(seen)
            }),
        }
    }

    fn remember<'a>(&'a self, id: &'a str) -> StoreFuture<'a, ()> {
        let inner = &*self.inner;
        match inner.store.remember(id).into_ready() {
            Ok(done) => {
                if done.is_ok() {
                    inner.keep(id);
                }
                StoreFuture::ready(done)
            }
            Err(pending) => StoreFuture::new(async move {
                pending.await?;
                inner.keep(id);
                Ok(())
            }),
        }
    }

    /// Removes the id here, asks the store to forget it, and removes it
    /// here again: an answer learned while the store was forgetting is not
    /// kept past the forget.
    fn forget<'a>(&'a self, id: &'a str) -> StoreFuture<'a, ()> {
        let inner = &*self.inner;
        inner.drop_id(id);
        StoreFuture::new(async move {
            let forgotten = inner.store.forget(id).await;
            inner.drop_id(id);
            forgotten
        })
    }

    /// The kept ids are answered here; the others go to the store in one
    /// `seen_many` (none when every id is kept).
    fn seen_many<'a>(&'a self, ids: &'a [&'a str]) -> StoreFuture<'a, Vec<bool>> {
        let inner = &*self.inner;
        let kept: Vec<bool> = ids.iter().map(|id| inner.hit(id)).collect();
        if kept.iter().all(|&kept| kept) {
            return StoreFuture::ready(Ok(kept));
        }
        StoreFuture::new(async move {
            let asked: Vec<&str> = ids
                .iter()
                .zip(&kept)
                .filter(|&(_, &kept)| !kept)
                .map(|(id, _)| *id)
                .collect();
            let answers = inner.store.seen_many(&asked).await?;
            let mut answers = answers.into_iter();
            let mut seen = kept;
            for (at, id) in ids.iter().enumerate() {
                if !seen[at] {
                    seen[at] = answers.next().unwrap_or(false);
                    if seen[at] {
                        inner.keep(id);
                    }
                }
            }
            Ok(seen)
        })
    }

    fn remember_many<'a>(&'a self, ids: &'a [&'a str]) -> StoreFuture<'a, ()> {
        let inner = &*self.inner;
        StoreFuture::new(async move {
            inner.store.remember_many(ids).await?;
            for id in ids {
                inner.keep(id);
            }
            Ok(())
        })
    }

    /// A kept id is answered `true` at once; otherwise the store's own
    /// answer without waiting, if it has one.
    #[inline]
    fn seen_now(&self, id: &str) -> Option<Result<bool, StoreError>> {
        if self.inner.hit(id) {
            return Some(Ok(true));
        }
        self.inner.store.seen_now(id)
    }

    /// This wrapper, where the store batches: a consumer's concurrent
    /// calls meet here, and the ids kept are left out of their batch.
    fn batch_target(&self) -> Option<BatchTarget> {
        self.inner.store.batch_target()?;
        BatchTarget::of(self)
    }
}

/// Claim mode: a claim of a kept id is [`Claim::Done`] without asking; a
/// claim that found the id done, and a commit that marked it, keep it.
impl<S: ClaimStore> ClaimStore for Cached<S> {
    fn claim<'a>(&'a self, id: &'a str, owner: ClaimToken, lease: Duration) -> ClaimFuture<'a> {
        let inner = &*self.inner;
        if inner.hit(id) {
            return StoreFuture::ready(Ok(Claim::Done));
        }
        StoreFuture::new(async move {
            let claim = inner.store.claim(id, owner, lease).await?;
            if claim == Claim::Done {
                inner.keep(id);
            }
            Ok(claim)
        })
    }

    fn commit<'a>(&'a self, id: &'a str, owner: ClaimToken) -> StoreFuture<'a, bool> {
        let inner = &*self.inner;
        StoreFuture::new(async move {
            let committed = inner.store.commit(id, owner).await?;
            if committed {
                inner.keep(id);
            }
            Ok(committed)
        })
    }

    pass_claims_through! {
        release(id: &'a str, owner: ClaimToken) -> bool;
        renew(id: &'a str, owner: ClaimToken, lease: Duration) -> bool;
    }

    /// The kept ids answer [`Claim::Done`] here; the others are claimed in
    /// one `claim_many`, in their order.
    fn claim_many<'a>(
        &'a self,
        claims: &'a [(&'a str, ClaimToken)],
        lease: Duration,
    ) -> StoreFuture<'a, Vec<Claim>> {
        let inner = &*self.inner;
        StoreFuture::new(async move {
            let kept: Vec<bool> = claims.iter().map(|(id, _)| inner.hit(id)).collect();
            let asked: Vec<(&str, ClaimToken)> = claims
                .iter()
                .zip(&kept)
                .filter(|&(_, &kept)| !kept)
                .map(|(claim, _)| *claim)
                .collect();
            let mut answers = if asked.is_empty() {
                Vec::new()
            } else {
                inner.store.claim_many(&asked, lease).await?
            }
            .into_iter();
            let mut out = Vec::with_capacity(claims.len());
            for ((id, _), kept) in claims.iter().zip(kept) {
                let claim = match kept {
                    true => Claim::Done,
                    false => answers.next().unwrap_or(Claim::Held { retry_after: None }),
                };
                if !kept && claim == Claim::Done {
                    inner.keep(id);
                }
                out.push(claim);
            }
            Ok(out)
        })
    }

    fn commit_many<'a>(
        &'a self,
        commits: &'a [(&'a str, ClaimToken)],
    ) -> StoreFuture<'a, Vec<bool>> {
        let inner = &*self.inner;
        StoreFuture::new(async move {
            let committed = inner.store.commit_many(commits).await?;
            for ((id, _), &done) in commits.iter().zip(&committed) {
                if done {
                    inner.keep(id);
                }
            }
            Ok(committed)
        })
    }
}

clone_shares_inner!(Cached);

impl<S: fmt::Debug> fmt::Debug for Cached<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cached")
            .field("store", &self.inner.store)
            .field("lifetime", &self.inner.lifetime)
            .field("capacity", &self.inner.capacity)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::InMemoryStore;

    fn block_on<F: std::future::Future>(future: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(future)
    }

    #[test]
    fn an_expired_answer_leaves_the_front_and_the_index() {
        let store = Cached::builder(InMemoryStore::new())
            .window(Duration::from_millis(30))
            .build();
        block_on(store.remember_many(&["id-A", "id-B"])).unwrap();
        assert_eq!(store.kept(), 2);
        std::thread::sleep(Duration::from_millis(60));
        block_on(store.remember("id-C")).unwrap();
        let recent = store.inner.lock();
        assert_eq!(recent.slots.len(), 1, "the expired slots left the front");
        assert_eq!(recent.index.len(), 1);
        assert_eq!(recent.live, 1);
    }

    #[test]
    fn a_forgotten_slot_is_not_counted_and_leaves_with_the_front() {
        let store = Cached::builder(InMemoryStore::new()).capacity(2).build();
        block_on(store.remember_many(&["id-A", "id-B"])).unwrap();
        block_on(store.forget("id-A")).unwrap();
        assert_eq!(store.kept(), 1);
        block_on(store.remember("id-C")).unwrap();
        // The forgotten slot was the oldest: it made room, and id-B stays.
        assert!(store.is_kept("id-B") && store.is_kept("id-C"));
        let recent = store.inner.lock();
        assert_eq!((recent.slots.len(), recent.index.len()), (2, 2));
    }
}
