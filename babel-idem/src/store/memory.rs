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
//! (and therefore the first to expire) are found without a scan.

use std::collections::VecDeque;
use std::fmt;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use foldhash::fast::RandomState;
use hashbrown::HashTable;

use super::{Store, StoreFuture};

mod canonical_uuid;
mod claims;
mod uuid_table;

use canonical_uuid::Uuid;
use uuid_table::{MIN_SLOTS, Probe, UuidTable};

/// The reference store: a process-local seen-set in memory.
///
/// Without options it remembers every id until [`forget`](Store::forget),
/// like the in-memory stores of the other BabelQueue SDKs. Two options bound it:
///
/// - a **TTL**: an id stops being seen once it is older than the TTL, and its
///   memory is reclaimed as newer ids arrive;
/// - a **capacity**: past it, the oldest ids are evicted first. An evicted id
///   is forgotten, so a late redelivery of it **runs again**: size the
///   capacity to cover the broker's redelivery window. Eviction order is exact
///   up to 4,096 ids and per shard (approximately oldest-first) above.
///
/// Remembering is set-if-absent, like Redis `SET NX`: remembering a live id
/// again keeps its first stamp, so its TTL is not extended.
///
/// ```
/// use babel_idem::{InMemoryStore, Store};
/// use std::time::Duration;
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let store = InMemoryStore::builder()
///     .ttl(Duration::from_secs(24 * 3600))
///     .capacity(1_000_000)
///     .build();
/// store.remember("f1e2d3c4-b5a6-4789-90ab-cdef01234567").await?;
/// assert!(store.seen("f1e2d3c4-b5a6-4789-90ab-cdef01234567").await?);
/// assert_eq!(store.len(), 1);
/// # Ok::<(), babel_idem::StoreError>(())
/// # }).unwrap();
/// ```
pub struct InMemoryStore {
    shards: Box<[Padded<Shard>]>,
    hasher: RandomState,
    ttl_millis: Option<u64>,
    capacity_per_shard: Option<usize>,
    epoch: Instant,
    claims: claims::Claims,
}

/// Configures an [`InMemoryStore`]; made by [`InMemoryStore::builder`].
///
/// ```
/// use babel_idem::InMemoryStore;
///
/// let store = InMemoryStore::builder().capacity(10_000).shards(4).build();
/// assert!(store.is_empty());
/// ```
#[derive(Debug, Clone, Default)]
pub struct InMemoryStoreBuilder {
    ttl: Option<Duration>,
    capacity: Option<usize>,
    shards: Option<usize>,
}

const MAX_SHARDS: usize = 64;
const EXACT_EVICTION_UP_TO: usize = 4096;

impl InMemoryStoreBuilder {
    /// Forget each id this long after it was remembered (millisecond
    /// resolution; a TTL under one millisecond is taken as one).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// Keep at most about this many ids, evicting the oldest first.
    /// A capacity of 0 is taken as 1.
    pub fn capacity(mut self, capacity: usize) -> Self {
        self.capacity = Some(capacity.max(1));
        self
    }

    /// The number of shards, rounded up to a power of two (default 64,
    /// fewer for small capacities so eviction stays exact).
    pub fn shards(mut self, shards: usize) -> Self {
        self.shards = Some(shards.clamp(1, 1024).next_power_of_two());
        self
    }

    /// Builds the store.
    pub fn build(self) -> InMemoryStore {
        let shard_count = self.shards.unwrap_or_else(|| match self.capacity {
            Some(capacity) => (capacity / EXACT_EVICTION_UP_TO)
                .clamp(1, MAX_SHARDS)
                .next_power_of_two(),
            None => MAX_SHARDS,
        });
        let stamped = self.ttl.is_some() || self.capacity.is_some();
        InMemoryStore {
            shards: (0..shard_count)
                .map(|_| Padded(Shard::new(stamped)))
                .collect(),
            hasher: RandomState::default(),
            ttl_millis: self
                .ttl
                .map(|ttl| u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1)),
            capacity_per_shard: self.capacity.map(|c| c.div_ceil(shard_count)),
            epoch: Instant::now(),
            claims: claims::Claims::default(),
        }
    }
}

impl InMemoryStore {
    /// An unbounded store: ids stay until forgotten.
    pub fn new() -> Self {
        InMemoryStoreBuilder::default().build()
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

    /// Forgets every id.
    pub fn clear(&self) {
        for shard in self.shards.iter() {
            let mut writer = shard.0.lock();
            shard
                .0
                .uuids
                .store(Arc::new(UuidTable::new(MIN_SLOTS, writer.stamped())));
            *writer = Writer::new(writer.stamped());
        }
    }

    #[inline]
    fn locate<'k>(&self, id: &'k str) -> (Key<'k>, u64, &Shard) {
        let key = Key::of(id);
        let hash = self.hash(key);
        // The tables index with the low bits and hashbrown tags with the top
        // seven; the shard takes bits from neither.
        let shard = (hash >> 32) as usize & (self.shards.len() - 1);
        (key, hash, &self.shards[shard].0)
    }

    #[inline]
    fn hash(&self, key: Key<'_>) -> u64 {
        match key {
            Key::Uuid(uuid) => self.hasher.hash_one(uuid),
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

    fn contains(&self, id: &str) -> bool {
        let (key, hash, shard) = self.locate(id);
        let stamp = match key {
            Key::Uuid(uuid) => match shard.uuids.load().probe(uuid, hash) {
                Probe::Found { stamp, .. } => Some(Stamp(stamp)),
                Probe::Vacant { .. } => None,
            },
            Key::Text(text) => shard.lock().find_text(hash, text),
        };
        stamp.is_some_and(|stamp| !self.expired(stamp, || self.now()))
    }

    fn insert(&self, id: &str) {
        let (key, hash, shard) = self.locate(id);
        let mut writer = shard.lock();
        let now = if writer.stamped() { self.now() } else { 0 };
        // `load`, not `load_full`: a reference count bump would write to the
        // cache line every reader of this table reads.
        let uuids = shard.uuids.load();
        match writer.find(&uuids, hash, key) {
            // Set-if-absent: a live id keeps its first stamp.
            Some((stamp, _)) if !self.expired(stamp, || now) => return,
            Some((_, place)) => writer.remove(&uuids, hash, key, place),
            None => {}
        }
        if writer.stamped() {
            let capacity = self.capacity_per_shard.unwrap_or(usize::MAX);
            self.evict(&mut writer, &uuids, now, capacity);
        }
        let stamp = writer.next_stamp(now);
        match key {
            Key::Uuid(uuid) => {
                if writer.uuid_filled >= uuids.fill_limit() {
                    self.rebuild(shard, &mut writer, &uuids);
                }
                let uuids = shard.uuids.load();
                if let Probe::Vacant { index } = uuids.probe(uuid, hash) {
                    uuids.fill(index, uuid, stamp.0);
                    writer.uuid_live += 1;
                    writer.uuid_filled += 1;
                }
            }
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

    fn remove(&self, id: &str) {
        let (key, hash, shard) = self.locate(id);
        let mut writer = shard.lock();
        let uuids = shard.uuids.load();
        if let Some((_, place)) = writer.find(&uuids, hash, key) {
            writer.remove(&uuids, hash, key, place);
        }
    }

    /// Replaces the shard's full UUID table (live ids plus tombstones) with
    /// one that holds the live ids at most half full: larger when they need
    /// it, the same size when it was mostly tombstones. Readers still probing
    /// the old table finish on it undisturbed.
    fn rebuild(&self, shard: &Shard, writer: &mut Writer, full: &UuidTable) {
        let slots = ((writer.uuid_live + 1) * 2)
            .next_power_of_two()
            .max(MIN_SLOTS);
        let rebuilt = UuidTable::new(slots, writer.stamped());
        for (uuid, stamp) in full.live() {
            if let Probe::Vacant { index } = rebuilt.probe(uuid, self.hasher.hash_one(uuid)) {
                rebuilt.fill(index, uuid, stamp);
            }
        }
        writer.uuid_filled = writer.uuid_live;
        shard.uuids.store(Arc::new(rebuilt));
    }

    /// Drops expired ids and, at the capacity, the oldest ones, leaving room
    /// for one more.
    fn evict(&self, writer: &mut Writer, uuids: &UuidTable, now: u64, capacity: usize) {
        while let Some((owned, stamp)) = writer.order.as_ref().and_then(VecDeque::front) {
            let (owned_key, stamp) = (owned.as_key(), *stamp);
            let hash = self.hash(owned_key);
            // An entry whose stamp differs was forgotten (and maybe remembered again later).
            let place = match writer.find(uuids, hash, owned_key) {
                Some((current, place)) if current == stamp => Some(place),
                _ => None,
            };
            if place.is_some() && !self.expired(stamp, || now) && writer.len() < capacity {
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
            .field("capacity_per_shard", &self.capacity_per_shard)
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
}

/// Keeps each shard on its own cache lines, so neighbours do not share them.
#[repr(align(128))]
struct Padded<T>(T);

struct Shard {
    /// Read without a lock; replaced (never mutated in place) only by the
    /// holder of `writer`.
    uuids: ArcSwap<UuidTable>,
    writer: Mutex<Writer>,
}

impl Shard {
    fn new(stamped: bool) -> Self {
        Shard {
            uuids: ArcSwap::from_pointee(UuidTable::new(MIN_SLOTS, stamped)),
            writer: Mutex::new(Writer::new(stamped)),
        }
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
    /// Insertion order, kept only with a TTL or a capacity.
    order: Option<VecDeque<(OwnedKey, Stamp)>>,
    next_sequence: u64,
}

/// Where [`Writer::find`] found an id.
#[derive(Clone, Copy)]
enum Place {
    UuidSlot(usize),
    Text,
}

impl Writer {
    fn new(stamped: bool) -> Self {
        Writer {
            uuid_live: 0,
            uuid_filled: 0,
            texts: HashTable::new(),
            order: stamped.then(VecDeque::new),
            next_sequence: 0,
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
                Probe::Vacant { .. } => None,
            },
            Key::Text(text) => self.find_text(hash, text).map(|stamp| (stamp, Place::Text)),
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
        match canonical_uuid::parse(id) {
            Some(uuid) if uuid_table::storable(uuid) => Key::Uuid(uuid),
            _ => Key::Text(id),
        }
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
    use super::*;

    fn uuid(n: u64) -> String {
        format!("f1e2d3c4-b5a6-4789-90ab-{n:012x}")
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
            "00000000-0000-0001-0000-000000000000",
        ] {
            store.insert(id);
            assert!(store.contains(id));
            store.remove(id);
            assert!(!store.contains(id));
        }
    }

    #[test]
    fn tables_grow_and_drop_tombstones_without_losing_ids() {
        let store = InMemoryStore::builder().shards(1).build();
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
        let slots = store.shards[0].0.uuids.load().slots();
        assert!(slots <= 16_384, "{slots} slots for ~6,700 ids");
    }

    #[test]
    fn capacity_evicts_the_oldest_first() {
        let store = InMemoryStore::builder().capacity(3).build();
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
        let store = InMemoryStore::builder().capacity(2).build();
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
            .build();
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
        let store = InMemoryStore::builder().shards(2).build();
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
