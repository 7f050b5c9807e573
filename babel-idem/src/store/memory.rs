//! [`InMemoryStore`]: the reference store. Process-local, thread-safe, fast.
//!
//! Ids are spread over cache-line-padded shards. An id in the canonical UUID
//! form (lowercase, hyphenated: the form every BabelQueue SDK mints) is kept
//! as 16 bytes in a table that `seen` probes without a lock
//! ([`uuid_table`]), so duplicate deliveries on several cores never contend.
//! Any other id is kept as its string, behind the shard's lock. Writes take
//! the shard's lock.
//!
//! With neither a TTL nor a capacity, nothing else is stored per id. With
//! either, each id also carries a stamp (when and in which order it was
//! remembered) and each shard keeps its ids in insertion order, so the oldest
//! (and therefore the first to expire) are found without a scan. `forget`
//! leaves the id's entry in that order behind; once such entries outnumber
//! the live ids, the shard drops them all in one pass, so the order holds at
//! most about twice the live ids whatever the churn.

use std::collections::VecDeque;
use std::fmt;
use std::hash::BuildHasher;
use std::time::{Duration, Instant};

use hashbrown::HashTable;

use super::settings::optional_ttl_millis;
use super::{Store, StoreError, StoreFuture, StoreOperation, failed};

mod canonical_uuid;
mod claims;
#[cfg(all(test, loom))]
mod loom;
mod sync;
mod uuid_table;

use crate::builders::setters;
use canonical_uuid::Uuid;
use sync::{IdHasher, Mutex, MutexGuard};
use uuid_table::{Probe, UuidTable};

/// The reference store: a process-local seen-set in memory.
///
/// Without options it remembers every id until [`forget`](Store::forget),
/// like the in-memory stores of the other BabelQueue SDKs. Two options bound it:
///
/// - a **TTL**: an id stops being seen once it is older than the TTL, and its
///   memory is reclaimed as newer ids arrive;
/// - a **capacity**: past it, the oldest ids are evicted first. An evicted id
///   is forgotten, so a late redelivery of it **runs again**: size the
///   capacity to cover the broker's redelivery window.
///
/// Remembering is set-if-absent, like Redis `SET NX`: remembering a live id
/// again keeps its first stamp, so its TTL is not extended.
///
/// # The rules that hold
///
/// - **Capacity is for the whole store.** It never holds more than
///   `capacity` ids, whatever the shard count: the shard count is at most
///   the capacity (an explicit [`shards`](InMemoryStoreBuilder::shards) above
///   it is lowered to the largest power of two that fits), and the capacity
///   is split between the shards, each evicting its own oldest ids. So
///   eviction is exactly oldest-first with one shard (the default below a
///   capacity of 8,192) and approximately oldest-first above.
/// - **Memory follows the ids held, not the ids seen.** Forgotten, expired
///   and evicted ids give their memory back: however many ids pass through
///   it (remembered, then forgotten), the store's memory stays within a
///   constant factor of what it needed for the most ids it held at once, so
///   at most the capacity when there is one.
/// - **Every lookup ends.** A lookup looks at each slot of a table at most
///   once, so it ends even if the table's bookkeeping were wrong; a writer
///   that finds no free slot rebuilds the table rather than wait for one.
///
/// ```
/// use babel_idem::{InMemoryStore, Store};
/// use std::time::Duration;
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let store = InMemoryStore::builder()
///     .ttl(Duration::from_secs(24 * 3600))
///     .capacity(1_000_000)
///     .build()?;
/// store.remember("f1e2d3c4-b5a6-4789-90ab-cdef01234567").await?;
/// assert!(store.seen("f1e2d3c4-b5a6-4789-90ab-cdef01234567").await?);
/// assert_eq!(store.len(), 1);
/// # Ok::<(), babel_idem::StoreError>(())
/// # }).unwrap();
/// ```
pub struct InMemoryStore {
    shards: Box<[Padded<Shard>]>,
    hasher: IdHasher,
    /// Seeds of the UUID hash ([`canonical_uuid::hash`]), drawn from `hasher`.
    uuid_seeds: [u64; 2],
    ttl_millis: Option<u64>,
    capacity: Option<usize>,
    epoch: Instant,
    claims: claims::Claims,
}

/// Configures an [`InMemoryStore`]; made by [`InMemoryStore::builder`].
///
/// ```
/// use babel_idem::InMemoryStore;
///
/// let store = InMemoryStore::builder().capacity(10_000).shards(4).build()?;
/// assert!(store.is_empty());
/// # Ok::<(), babel_idem::StoreError>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct InMemoryStoreBuilder {
    ttl: Option<Duration>,
    capacity: Option<usize>,
    shards: Option<usize>,
}

/// The default shard count, and the most that a capacity alone asks for.
/// More shards let more writers in at once, but every lookup reads its
/// shard's header (about 1.8 KiB each, mostly the segment directory), so
/// more shards put more headers in the caches' way. Readers take no lock,
/// so only first deliveries wait on a shard's; a store
/// written from many cores at once can ask for more with
/// [`InMemoryStoreBuilder::shards`].
const MAX_SHARDS: usize = 16;
const EXACT_EVICTION_UP_TO: usize = 4096;

/// The backend name in this store's errors.
const BACKEND: &str = "memory";

impl InMemoryStoreBuilder {
    setters! {
        /// Forget each id this long after it was remembered, counted in whole
        /// milliseconds (a fraction of a millisecond is dropped).
        ///
        /// The rule is every store's: at least 1 ms and at most
        /// [`MAX_TTL`](crate::store::MAX_TTL) (36,500 days). A TTL outside it is
        /// refused by [`build`](Self::build), with an error that states the
        /// range. For ids that never expire, set no TTL.
        ///
        /// ```
        /// use babel_idem::InMemoryStore;
        /// use std::time::Duration;
        ///
        /// assert!(InMemoryStore::builder().ttl(Duration::from_secs(3600)).build().is_ok());
        /// let error = InMemoryStore::builder().ttl(Duration::ZERO).build().unwrap_err();
        /// assert!(error.to_string().contains("at least 1 ms"));
        /// ```
        pub fn ttl(ttl: Duration) => self.ttl = Some(ttl);

        /// Keep at most this many ids in the whole store, evicting the oldest
        /// first. A capacity of 0 is taken as 1.
        ///
        /// ```
        /// use babel_idem::{InMemoryStore, Store};
        ///
        /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
        /// let store = InMemoryStore::builder().capacity(2).build()?;
        /// for id in ["a", "b", "c"] {
        ///     store.remember(id).await?;
        /// }
        /// assert_eq!(store.len(), 2);
        /// assert!(!store.seen("a").await?, "the oldest id was evicted");
        /// # Ok::<(), babel_idem::StoreError>(())
        /// # }).unwrap();
        /// ```
        pub fn capacity(capacity: usize) => self.capacity = Some(capacity.max(1));

        /// The number of shards, rounded up to a power of two and at most 1,024
        /// (default 16, fewer for small capacities so eviction stays exact).
        /// With a capacity, the count is also at most the capacity: each shard
        /// holds a share of it, never a copy.
        ///
        /// ```
        /// use babel_idem::{InMemoryStore, Store};
        ///
        /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
        /// let store = InMemoryStore::builder().capacity(10).shards(64).build()?;
        /// for n in 0..1_000 {
        ///     store.remember(&format!("order-{n}")).await?;
        /// }
        /// assert!(store.len() <= 10);
        /// # Ok::<(), babel_idem::StoreError>(())
        /// # }).unwrap();
        /// ```
        pub fn shards(shards: usize) => self.shards = Some(shards.clamp(1, 1024).next_power_of_two());
    }

    /// Builds the store, after checking its TTL.
    ///
    /// # Errors
    ///
    /// An [`Open`](StoreOperation::Open) error of backend `"memory"` when the
    /// [`ttl`](Self::ttl) is under 1 ms or over
    /// [`MAX_TTL`](crate::store::MAX_TTL): the same rule, in the same words,
    /// as every other store's builder.
    ///
    /// ```
    /// use babel_idem::InMemoryStore;
    /// use babel_idem::store::MAX_TTL;
    /// use std::time::Duration;
    ///
    /// let store = InMemoryStore::builder().ttl(MAX_TTL).build()?;
    /// assert!(store.is_empty());
    ///
    /// let too_long = MAX_TTL + Duration::from_millis(1);
    /// let error = InMemoryStore::builder().ttl(too_long).build().unwrap_err();
    /// assert!(error.to_string().contains("at most 36500 days"));
    /// # Ok::<(), babel_idem::StoreError>(())
    /// ```
    pub fn build(self) -> Result<InMemoryStore, StoreError> {
        let ttl_millis = optional_ttl_millis(self.ttl)
            .map_err(failed(BACKEND, StoreOperation::Open))?
            // In range, so positive.
            .map(|millis| millis as u64);
        Ok(self.assemble(ttl_millis))
    }

    /// The store, with its TTL already checked and counted in milliseconds.
    fn assemble(self, ttl_millis: Option<u64>) -> InMemoryStore {
        let shard_count = self.shards.unwrap_or_else(|| match self.capacity {
            Some(capacity) => (capacity / EXACT_EVICTION_UP_TO)
                .clamp(1, MAX_SHARDS)
                .next_power_of_two(),
            None => MAX_SHARDS,
        });
        // A shard cannot hold less than one id, so there are never more
        // shards than the capacity.
        let shard_count = match self.capacity {
            Some(capacity) => shard_count.min(largest_power_of_two_at_most(capacity)),
            None => shard_count,
        };
        let stamped = self.ttl.is_some() || self.capacity.is_some();
        let hasher = IdHasher::default();
        InMemoryStore {
            shards: (0..shard_count)
                .map(|index| {
                    let share = self.capacity.map_or(usize::MAX, |capacity| {
                        share_of(capacity, shard_count, index)
                    });
                    Padded(Shard::new(stamped, share))
                })
                .collect(),
            uuid_seeds: [hasher.hash_one(1u64), hasher.hash_one(2u64)],
            hasher,
            ttl_millis,
            capacity: self.capacity,
            epoch: Instant::now(),
            claims: claims::Claims::default(),
        }
    }
}

fn largest_power_of_two_at_most(n: usize) -> usize {
    debug_assert!(n > 0);
    1 << (usize::BITS - 1 - n.leading_zeros())
}

/// Shard `index`'s share of `capacity`: an even split, the remainder going
/// one each to the first shards, so the shares add up to `capacity` exactly.
fn share_of(capacity: usize, shards: usize, index: usize) -> usize {
    capacity / shards + usize::from(index < capacity % shards)
}

impl InMemoryStore {
    /// An unbounded store: ids stay until forgotten.
    pub fn new() -> Self {
        // No TTL, so nothing to check.
        InMemoryStoreBuilder::default().assemble(None)
    }

    /// Configures a store with a TTL, a capacity or a shard count.
    pub fn builder() -> InMemoryStoreBuilder {
        InMemoryStoreBuilder::default()
    }

    /// How many ids the store holds, counting expired ones not yet reclaimed.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|shard| shard.0.lock().len()).sum()
    }

    /// Whether the store holds no id.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forgets every id. The store keeps the memory its tables had grown
    /// to (a reader may still be probing it), for the ids that come next.
    pub fn clear(&self) {
        for shard in self.shards.iter() {
            let mut writer = shard.0.lock();
            shard.0.uuids.clear();
            *writer = Writer::new(writer.stamped(), writer.capacity);
        }
    }

    #[inline]
    fn locate<'k>(&self, id: &'k str) -> (Key<'k>, u64, &Shard) {
        self.locate_key(Key::of(id))
    }

    #[inline]
    fn locate_key<'k>(&self, key: Key<'k>) -> (Key<'k>, u64, &Shard) {
        let hash = self.hash(key);
        // The tables index with the low bits and hashbrown tags with the top
        // seven; the shard takes bits from neither.
        let shard = (hash >> 32) as usize & (self.shards.len() - 1);
        (key, hash, &self.shards[shard].0)
    }

    #[inline]
    fn hash(&self, key: Key<'_>) -> u64 {
        match key {
            Key::Uuid(uuid) => canonical_uuid::hash(uuid, self.uuid_seeds),
            Key::Text(text) => self.hasher.hash_one(text),
        }
    }

    /// Milliseconds since the store was built; only read when stamps are kept.
    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    #[inline]
    fn expired(&self, stamp: Stamp, now: impl FnOnce() -> u64) -> bool {
        self.ttl_millis
            .is_some_and(|ttl| now().saturating_sub(stamp.remembered_at()) >= ttl)
    }

    /// Whether `id` is held and live: the UUID's parse where the caller
    /// holds the id's text (inlined into the guard's first poll, which
    /// reads the key where it wrote it), one call for the lookup.
    #[inline(always)]
    fn contains(&self, id: &str) -> bool {
        match Key::of(id) {
            Key::Uuid([high, low]) => self.contains_uuid(high, low),
            Key::Text(text) => self.contains_text_id(text),
        }
    }

    /// A UUID's lookup, without a lock: the slots at the UUID's home, and
    /// the rest of the probe out of line.
    #[inline(never)]
    fn contains_uuid(&self, high: u64, low: u64) -> bool {
        let uuid = [high, low];
        let (_, hash, shard) = self.locate_key(Key::Uuid(uuid));
        match shard.uuids.read_home(uuid, hash) {
            Some(probe) => self.live(probe),
            None => self.contains_uuid_past_home(high, low),
        }
    }

    /// [`contains_uuid`](Self::contains_uuid) where the slots at the
    /// UUID's home did not answer: the whole probe, out of line, so that
    /// its loop stays off the common lookup's path.
    #[inline(never)]
    fn contains_uuid_past_home(&self, high: u64, low: u64) -> bool {
        let uuid = [high, low];
        let (_, hash, shard) = self.locate_key(Key::Uuid(uuid));
        let probe = match shard.uuids.read(uuid, hash) {
            Some(probe) => probe,
            None => shard.probe_locked(uuid, hash),
        };
        self.live(probe)
    }

    /// Whether a probe found a live UUID.
    #[inline(always)]
    fn live(&self, probe: Probe) -> bool {
        match probe {
            Probe::Found { stamp, .. } => !self.expired(Stamp(stamp), || self.now()),
            Probe::Vacant { .. } | Probe::Full => false,
        }
    }

    /// [`contains`](Self::contains) for an id that is not a UUID the tables
    /// hold: hashed and looked up under the shard's lock, out of line.
    #[inline(never)]
    fn contains_text_id(&self, text: &str) -> bool {
        let (_, hash, shard) = self.locate_key(Key::Text(text));
        let stamp = shard.lock().find_text(hash, text);
        stamp.is_some_and(|stamp| !self.expired(stamp, || self.now()))
    }

    fn insert(&self, id: &str) {
        self.insert_key(Key::of(id));
    }

    fn insert_key(&self, key: Key<'_>) {
        let (key, hash, shard) = self.locate_key(key);
        let mut writer = shard.lock();
        let now = if writer.stamped() { self.now() } else { 0 };
        let uuids = &shard.uuids;
        match writer.find(uuids, hash, key) {
            // Set-if-absent: a live id keeps its first stamp.
            Some((stamp, _)) if !self.expired(stamp, || now) => return,
            Some((_, place)) => writer.remove(uuids, hash, key, place),
            None => {}
        }
        if writer.stamped() {
            self.evict(&mut writer, uuids, now);
            self.drop_forgotten_from_order(&mut writer, uuids);
        }
        let stamp = writer.next_stamp(now);
        match key {
            Key::Uuid(uuid) => self.insert_uuid(uuids, &mut writer, uuid, hash, stamp),
            Key::Text(text) => {
                writer
                    .texts
                    .insert_unique(hash, (text.into(), stamp), |(text, _)| {
                        self.hasher.hash_one(&**text)
                    });
            }
        }
        if let Some(order) = &mut writer.order {
            order.push_back((key.to_owned(), stamp));
        }
    }

    /// Puts a UUID that `find` just reported absent into the shard's table.
    fn insert_uuid(
        &self,
        uuids: &UuidTable,
        writer: &mut Writer,
        uuid: Uuid,
        hash: u64,
        stamp: Stamp,
    ) {
        if writer.uuid_filled >= uuids.fill_limit() {
            self.rebuild(uuids, writer);
        }
        let mut probe = uuids.probe(uuid, hash);
        if probe == Probe::Full {
            // Only if the fill bookkeeping were wrong. The rebuilt table is
            // sized from what it really holds: at most half full.
            self.rebuild(uuids, writer);
            probe = uuids.probe(uuid, hash);
        }
        // `Found` cannot happen: `find` said absent, under this same lock.
        if let Probe::Vacant { index } = probe {
            uuids.fill(index, uuid, stamp.0);
            writer.uuid_live += 1;
            writer.uuid_filled += 1;
        }
    }

    fn remove(&self, id: &str) {
        let (key, hash, shard) = self.locate(id);
        let mut writer = shard.lock();
        let uuids = &shard.uuids;
        if let Some((_, place)) = writer.find(uuids, hash, key) {
            writer.remove(uuids, hash, key, place);
            self.drop_forgotten_from_order(&mut writer, uuids);
        }
    }

    /// Rearranges the shard's UUID table in place to hold its live ids at
    /// most half full, without tombstones (see [`UuidTable::rebuild`]).
    fn rebuild(&self, uuids: &UuidTable, writer: &mut Writer) {
        let held = uuids.rebuild(|uuid| canonical_uuid::hash(uuid, self.uuid_seeds));
        writer.uuid_live = held;
        writer.uuid_filled = held;
    }

    /// Drops expired ids and, at the shard's share of the capacity, the
    /// oldest ones, leaving room for one more.
    fn evict(&self, writer: &mut Writer, uuids: &UuidTable, now: u64) {
        while let Some((owned, stamp)) = writer.order.as_ref().and_then(VecDeque::front) {
            let (owned_key, stamp) = (owned.as_key(), *stamp);
            let hash = self.hash(owned_key);
            let place = writer.live_place(uuids, hash, owned_key, stamp);
            if place.is_some() && !self.expired(stamp, || now) && writer.len() < writer.capacity {
                break;
            }
            let (owned, _) = writer
                .order
                .as_mut()
                .and_then(VecDeque::pop_front)
                .expect("the front entry was just read");
            if let Some(place) = place {
                writer.remove(uuids, hash, owned.as_key(), place);
            }
        }
    }

    /// Once the order's entries for forgotten ids outnumber the live ids,
    /// drops them all in one pass (amortised O(1) per `forget`), so that
    /// remember-and-forget churn behind a long-lived id cannot grow it.
    fn drop_forgotten_from_order(&self, writer: &mut Writer, uuids: &UuidTable) {
        /// Below this many forgotten entries a pass is not worth its cost.
        const SLACK: usize = 32;
        let Some(order) = &writer.order else { return };
        let live = writer.len();
        if order.len().saturating_sub(live) <= live.max(SLACK) {
            return;
        }
        let mut order = writer.order.take().expect("checked just above");
        order.retain(|(owned, stamp)| {
            let key = owned.as_key();
            writer
                .live_place(uuids, self.hash(key), key, *stamp)
                .is_some()
        });
        // Give back a buffer left over from a burst.
        if order.capacity() > 4 * order.len().max(SLACK) {
            order.shrink_to(2 * order.len().max(SLACK));
        }
        writer.order = Some(order);
    }
}

impl Default for InMemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for InMemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InMemoryStore")
            .field("len", &self.len())
            .field("shards", &self.shards.len())
            .field("ttl_millis", &self.ttl_millis)
            .field("capacity", &self.capacity)
            .finish()
    }
}

impl Store for InMemoryStore {
    #[inline]
    fn seen<'a>(&'a self, id: &'a str) -> StoreFuture<'a, bool> {
        StoreFuture::ready(Ok(self.contains(id)))
    }

    #[inline]
    fn remember<'a>(&'a self, id: &'a str) -> StoreFuture<'a, ()> {
        self.insert(id);
        StoreFuture::ready(Ok(()))
    }

    #[inline]
    fn forget<'a>(&'a self, id: &'a str) -> StoreFuture<'a, ()> {
        self.remove(id);
        StoreFuture::ready(Ok(()))
    }

    // One pass over the batch, answered at once: no boxed future per batch.
    fn seen_many<'a>(&'a self, ids: &'a [&'a str]) -> StoreFuture<'a, Vec<bool>> {
        StoreFuture::ready(Ok(ids.iter().map(|id| self.contains(id)).collect()))
    }

    fn remember_many<'a>(&'a self, ids: &'a [&'a str]) -> StoreFuture<'a, ()> {
        ids.iter().for_each(|id| self.insert(id));
        StoreFuture::ready(Ok(()))
    }

    // Forced, with `contains`: the seen-set guard's first poll asks this
    // and is itself inlined where the guard is polled.
    #[inline(always)]
    fn seen_now(&self, id: &str) -> Option<Result<bool, StoreError>> {
        Some(Ok(self.contains(id)))
    }
}

/// Keeps each shard on its own cache lines, so neighbours do not share them.
#[repr(align(128))]
struct Padded<T>(T);

struct Shard {
    /// Read without a lock; written only by the holder of `writer`.
    uuids: UuidTable,
    writer: Mutex<Writer>,
}

impl Shard {
    fn new(stamped: bool, capacity: usize) -> Self {
        Shard {
            uuids: UuidTable::new(stamped),
            writer: Mutex::new(Writer::new(stamped, capacity)),
        }
    }

    /// Probes the UUID table under the lock, where no rearrangement runs:
    /// for a reader whose lock-free read raced one.
    #[cold]
    #[inline(never)]
    fn probe_locked(&self, uuid: Uuid, hash: u64) -> Probe {
        let _writer = self.lock();
        self.uuids.probe(uuid, hash)
    }

    /// The lock is only held for table operations that cannot panic half
    /// way, so a poisoned lock still guards consistent tables.
    fn lock(&self) -> MutexGuard<'_, Writer> {
        self.writer
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Everything of a shard that only the lock holder touches.
struct Writer {
    uuid_live: usize,
    /// Live ids plus tombstones in the current UUID table.
    uuid_filled: usize,
    texts: HashTable<(Box<str>, Stamp)>,
    /// Insertion order, kept only with a TTL or a capacity: one entry per
    /// live id, plus entries left behind by `forget` (told apart by stamp).
    order: Option<VecDeque<(OwnedKey, Stamp)>>,
    next_sequence: u64,
    /// This shard's share of the store's capacity (`usize::MAX`: none).
    capacity: usize,
}

/// Where [`Writer::find`] found an id.
#[derive(Clone, Copy)]
enum Place {
    UuidSlot(usize),
    Text,
}

impl Writer {
    fn new(stamped: bool, capacity: usize) -> Self {
        Writer {
            uuid_live: 0,
            uuid_filled: 0,
            texts: HashTable::new(),
            order: stamped.then(VecDeque::new),
            next_sequence: 0,
            capacity,
        }
    }

    fn stamped(&self) -> bool {
        self.order.is_some()
    }

    fn len(&self) -> usize {
        self.uuid_live + self.texts.len()
    }

    fn next_stamp(&mut self, now: u64) -> Stamp {
        self.next_sequence += 1;
        Stamp::new(now, self.next_sequence)
    }

    fn find_text(&self, hash: u64, text: &str) -> Option<Stamp> {
        self.texts
            .find(hash, |(key, _)| **key == *text)
            .map(|(_, stamp)| *stamp)
    }

    fn find(&self, uuids: &UuidTable, hash: u64, key: Key<'_>) -> Option<(Stamp, Place)> {
        match key {
            Key::Uuid(uuid) => match uuids.probe(uuid, hash) {
                Probe::Found { index, stamp } => Some((Stamp(stamp), Place::UuidSlot(index))),
                Probe::Vacant { .. } | Probe::Full => None,
            },
            Key::Text(text) => self.find_text(hash, text).map(|stamp| (stamp, Place::Text)),
        }
    }

    /// Where the id of an order entry stamped `stamp` lives, if that entry is
    /// still the id's own: a different stamp means the id was forgotten
    /// since (and maybe remembered again later).
    fn live_place(
        &self,
        uuids: &UuidTable,
        hash: u64,
        key: Key<'_>,
        stamp: Stamp,
    ) -> Option<Place> {
        match self.find(uuids, hash, key) {
            Some((current, place)) if current == stamp => Some(place),
            _ => None,
        }
    }

    fn remove(&mut self, uuids: &UuidTable, hash: u64, key: Key<'_>, place: Place) {
        match (place, key) {
            (Place::UuidSlot(index), _) => {
                uuids.bury(index);
                self.uuid_live -= 1;
            }
            (Place::Text, Key::Text(text)) => {
                if let Ok(entry) = self.texts.find_entry(hash, |(key, _)| **key == *text) {
                    entry.remove();
                }
            }
            (Place::Text, Key::Uuid(_)) => {}
        }
    }
}

/// When an id was remembered (milliseconds since the store was built, high
/// 44 bits) and its place in the shard's insertion sequence (low 20 bits).
/// The sequence tells an order entry left behind by `forget` from the same
/// id remembered again within the same millisecond.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp(u64);

impl Stamp {
    const SEQUENCE_BITS: u32 = 20;

    fn new(remembered_at: u64, sequence: u64) -> Self {
        let sequence = sequence & ((1 << Self::SEQUENCE_BITS) - 1);
        Stamp((remembered_at << Self::SEQUENCE_BITS) | sequence)
    }

    fn remembered_at(self) -> u64 {
        self.0 >> Self::SEQUENCE_BITS
    }
}

#[derive(Clone, Copy)]
enum Key<'a> {
    Uuid(Uuid),
    Text(&'a str),
}

enum OwnedKey {
    Uuid(Uuid),
    Text(Box<str>),
}

impl<'a> Key<'a> {
    #[inline]
    fn of(id: &'a str) -> Self {
        canonical_uuid::parse(id)
            .and_then(Key::held_uuid)
            .unwrap_or(Key::Text(id))
    }

    /// A UUID the tables can hold; the others take the text path.
    #[inline]
    fn held_uuid(uuid: Uuid) -> Option<Self> {
        uuid_table::storable(uuid).then_some(Key::Uuid(uuid))
    }

    fn to_owned(self) -> OwnedKey {
        match self {
            Key::Uuid(uuid) => OwnedKey::Uuid(uuid),
            Key::Text(text) => OwnedKey::Text(text.into()),
        }
    }
}

impl OwnedKey {
    fn as_key(&self) -> Key<'_> {
        match self {
            OwnedKey::Uuid(uuid) => Key::Uuid(*uuid),
            OwnedKey::Text(text) => Key::Text(text),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::uuid_table::MIN_SLOTS;
    use super::*;

    /// The store `builder` makes; with no TTL it has nothing to refuse.
    fn built(builder: InMemoryStoreBuilder) -> InMemoryStore {
        builder.build().expect("no TTL to refuse")
    }

    fn uuid(n: u64) -> String {
        format!("f1e2d3c4-b5a6-4789-90ab-{n:012x}")
    }

    /// What a future of this store answers: it never waits.
    fn answer<T>(future: StoreFuture<'_, T>) -> T {
        match future.into_ready() {
            Ok(answer) => answer.expect("the in-memory store does not fail"),
            Err(_) => panic!("the in-memory store answered later"),
        }
    }

    /// The guard asks `seen_now` and awaits nothing: it must give `seen`'s
    /// answer for every kind of id, the UUID table's and the text table's.
    #[test]
    fn seen_now_answers_as_seen_does_for_every_kind_of_id() {
        let ids = [
            "f1e2d3c4-b5a6-4789-90ab-cdef01234567",
            // 36 bytes, but not a canonical UUID: the text path.
            "F1E2D3C4-B5A6-4789-90AB-CDEF01234567",
            "f1e2d3c4_b5a6_4789_90ab_cdef01234567",
            "éééééééééééééééééé",
            // A UUID the tables cannot hold (its high word is a marker).
            "00000000-0000-0000-0000-000000000000",
            "short",
        ];
        for id in ids {
            let store = InMemoryStore::new();
            assert!(matches!(store.seen_now(id), Some(Ok(false))), "{id}");
            answer(store.remember(id));
            assert!(matches!(store.seen_now(id), Some(Ok(true))), "{id}");
            assert!(answer(store.seen(id)), "{id}");
            for other in ids.iter().filter(|other| **other != id) {
                assert!(
                    matches!(store.seen_now(other), Some(Ok(false))),
                    "{id} remembered, {other} asked"
                );
            }
            answer(store.forget(id));
            assert!(matches!(store.seen_now(id), Some(Ok(false))), "{id}");
        }
    }

    #[test]
    fn uppercase_and_lowercase_uuids_are_different_ids() {
        let store = InMemoryStore::new();
        store.insert("f1e2d3c4-b5a6-4789-90ab-cdef01234567");
        assert!(store.contains("f1e2d3c4-b5a6-4789-90ab-cdef01234567"));
        assert!(!store.contains("F1E2D3C4-B5A6-4789-90AB-CDEF01234567"));
    }

    #[test]
    fn uuids_that_look_like_markers_still_work() {
        let store = InMemoryStore::new();
        for id in [
            "00000000-0000-0000-0000-000000000000",
            "10000000-0000-0000-0000-000000000000",
            "00000000-0000-0001-0000-000000000000",
        ] {
            store.insert(id);
            assert!(store.contains(id));
            store.remove(id);
            assert!(!store.contains(id));
        }
    }

    #[test]
    fn large_unstamped_tables_fill_to_seven_eighths_the_rest_to_three_quarters() {
        let slots_after = |builder: InMemoryStoreBuilder, ids: u64| {
            let store = builder.shards(1).build().expect("a valid TTL");
            for n in 0..ids {
                store.insert(&uuid(n));
            }
            assert!((0..ids).all(|n| store.contains(&uuid(n))));
            store.shards[0].0.uuids.slots()
        };
        let unstamped = InMemoryStore::builder;
        let stamped = || InMemoryStore::builder().ttl(Duration::from_secs(3600));
        // 400 ids fill more than three quarters of 512 slots, not 7/8.
        assert_eq!(slots_after(unstamped(), 400), 1_024);
        // 1,700 fill more than three quarters of 2,048 slots, not 7/8.
        assert_eq!(slots_after(unstamped(), 1_700), 2_048);
        assert_eq!(slots_after(unstamped(), 1_800), 4_096);
        // Expired ids leave tombstones: a stamped table keeps 3/4.
        assert_eq!(slots_after(stamped(), 1_700), 4_096);
    }

    #[test]
    fn tables_grow_and_drop_tombstones_without_losing_ids() {
        let store = built(InMemoryStore::builder().shards(1));
        for n in 0..10_000 {
            store.insert(&uuid(n));
            if n % 3 == 0 {
                store.remove(&uuid(n));
            }
        }
        for n in 0..10_000 {
            assert_eq!(store.contains(&uuid(n)), n % 3 != 0, "id {n}");
        }
        assert_eq!(store.len(), 10_000 - 3334);
        // Forget and remember the same ids over and over: tombstones must be
        // cleaned up rather than growing the table for ever.
        for round in 0..50 {
            for n in 0..100 {
                store.remove(&uuid(n));
                store.insert(&uuid(n));
            }
            assert!(store.contains(&uuid(round)));
        }
        let slots = store.shards[0].0.uuids.slots();
        assert!(slots <= 16_384, "{slots} slots for ~6,700 ids");
    }

    #[test]
    fn a_table_with_no_free_slot_is_rebuilt_rather_than_probed_for_ever() {
        let store = built(InMemoryStore::builder().shards(1));
        // Fill every slot behind the writer's back, as a bookkeeping mistake would.
        let table = &store.shards[0].0.uuids;
        for n in 0..table.slots() as u64 {
            let id = canonical_uuid::parse(&uuid(n)).unwrap();
            if let Probe::Vacant { index } =
                table.probe(id, canonical_uuid::hash(id, store.uuid_seeds))
            {
                table.fill(index, id, 0);
            }
        }
        assert!(!store.contains(&uuid(1000)), "a lookup ends after one lap");
        store.insert(&uuid(1000));
        assert!(store.contains(&uuid(1000)));
        for n in 0..MIN_SLOTS as u64 {
            assert!(store.contains(&uuid(n)), "id {n}");
        }
        assert_eq!(
            store.len(),
            MIN_SLOTS + 1,
            "the rebuild counted what the table held"
        );
    }

    #[test]
    fn forgotten_entries_leave_the_insertion_order() {
        let store = built(InMemoryStore::builder().capacity(1000));
        store.insert("pinned");
        for n in 0..10_000 {
            store.insert(&uuid(n));
            store.remove(&uuid(n));
            store.insert(&format!("text-{n}"));
            store.remove(&format!("text-{n}"));
        }
        let writer = store.shards[0].0.lock();
        let order = writer.order.as_ref().unwrap();
        assert!(order.len() <= 2 * 32 + 1, "{} order entries", order.len());
        assert!(order.capacity() <= 1024, "{} order slots", order.capacity());
        drop(writer);
        assert!(store.contains("pinned"));
        assert_eq!(store.len(), 1);
    }

    #[test]
    fn dropping_forgotten_entries_keeps_the_eviction_order() {
        let store = built(InMemoryStore::builder().capacity(40));
        for n in 0..40 {
            store.insert(&uuid(n));
        }
        // Forget every other id: enough forgotten entries to drop them all.
        for n in (0..40).step_by(2).chain(100..140) {
            store.insert(&uuid(n));
            store.remove(&uuid(n));
        }
        store.insert("a");
        store.insert("b");
        assert_eq!(store.len(), 22);
        for n in 100..120 {
            store.insert(&uuid(n));
        }
        // 42 ids for 40 places: the two oldest survivors went first.
        assert!(!store.contains(&uuid(1)) && !store.contains(&uuid(3)));
        assert!(store.contains(&uuid(5)) && store.contains("a") && store.contains("b"));
        assert_eq!(store.len(), 40);
    }

    #[test]
    fn capacity_evicts_the_oldest_first() {
        let store = built(InMemoryStore::builder().capacity(3));
        for id in ["a", &uuid(1), "c", &uuid(2)] {
            store.insert(id);
        }
        assert_eq!(store.len(), 3);
        assert!(!store.contains("a"), "the oldest id is evicted");
        assert!(store.contains(&uuid(1)) && store.contains("c") && store.contains(&uuid(2)));
        store.insert(&uuid(3));
        assert!(!store.contains(&uuid(1)));
    }

    #[test]
    fn forget_then_remember_again_keeps_the_fresh_entry_in_order() {
        let store = built(InMemoryStore::builder().capacity(2));
        store.insert(&uuid(1));
        store.insert("b");
        store.remove(&uuid(1));
        store.insert(&uuid(1)); // now the newest
        store.insert("c"); // evicts "b", the oldest live id
        assert!(store.contains(&uuid(1)));
        assert!(!store.contains("b"));
        assert!(store.contains("c"));
    }

    #[test]
    fn expired_ids_are_reclaimed_by_later_inserts() {
        let store = InMemoryStore::builder()
            .ttl(Duration::from_millis(1))
            .shards(1)
            .build()
            .expect("1 ms is the shortest TTL accepted");
        for n in 0..100 {
            store.insert(&uuid(n));
        }
        std::thread::sleep(Duration::from_millis(5));
        assert!(!store.contains(&uuid(0)));
        store.insert("after");
        assert_eq!(store.len(), 1, "the expired ids were dropped");
    }

    #[test]
    fn concurrent_readers_see_every_id_a_writer_has_remembered() {
        let store = built(InMemoryStore::builder().shards(2));
        let written = std::sync::atomic::AtomicU64::new(0);
        std::thread::scope(|scope| {
            scope.spawn(|| {
                for n in 0..20_000 {
                    store.insert(&uuid(n));
                    written.store(n + 1, std::sync::atomic::Ordering::Release);
                }
            });
            scope.spawn(|| {
                loop {
                    let done = written.load(std::sync::atomic::Ordering::Acquire);
                    // Every id remembered before `done` was published must be seen,
                    // through however many table rebuilds happened meanwhile.
                    for n in done.saturating_sub(64)..done {
                        assert!(store.contains(&uuid(n)), "id {n} lost");
                    }
                    if done == 20_000 {
                        break;
                    }
                }
            });
        });
    }
}
