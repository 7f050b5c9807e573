//! [`InMemoryStore`]: the reference store. Process-local, thread-safe, fast.
//!
//! Ids are spread over cache-line-padded shards, each a small hash table
//! behind its own lock, so workers on different ids rarely meet. An id in the
//! canonical UUID form (lowercase, hyphenated, the form every BabelQueue SDK
//! mints) is kept as 16 bytes; any other id is kept as its string.
//!
//! With neither a TTL nor a capacity, nothing else is stored per id. With
//! either, each shard also keeps its ids in insertion order with a stamp, so
//! the oldest (and therefore the first to expire) are found without a scan.

use std::collections::VecDeque;
use std::fmt;
use std::hash::BuildHasher;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use foldhash::fast::RandomState;
use hashbrown::HashTable;

use super::{Store, StoreFuture};

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
    shards: Box<[Padded<Mutex<Shard>>]>,
    hasher: RandomState,
    ttl: Option<Duration>,
    capacity_per_shard: Option<usize>,
    epoch: Instant,
}

/// Configures an [`InMemoryStore`]; made by [`InMemoryStore::builder`].
#[derive(Debug, Clone, Default)]
pub struct InMemoryStoreBuilder {
    ttl: Option<Duration>,
    capacity: Option<usize>,
    shards: Option<usize>,
}

const MAX_SHARDS: usize = 64;
const EXACT_EVICTION_UP_TO: usize = 4096;

impl InMemoryStoreBuilder {
    /// Forget each id this long after it was remembered.
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

    /// The number of lock shards, rounded up to a power of two (default 64,
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
        let ordered = self.ttl.is_some() || self.capacity.is_some();
        InMemoryStore {
            shards: (0..shard_count)
                .map(|_| Padded(Mutex::new(Shard::new(ordered))))
                .collect(),
            hasher: RandomState::default(),
            ttl: self.ttl,
            capacity_per_shard: self.capacity.map(|c| c.div_ceil(shard_count)),
            epoch: Instant::now(),
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
        self.shards.iter().map(|shard| lock(&shard.0).ids.len()).sum()
    }

    /// Whether the store holds no id.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forgets every id.
    pub fn clear(&self) {
        for shard in self.shards.iter() {
            *lock(&shard.0) = Shard::new(shard_is_ordered(&self.ttl, &self.capacity_per_shard));
        }
    }

    #[inline]
    fn locate<'k>(&self, id: &'k str) -> (Key<'k>, u64, &Mutex<Shard>) {
        let key = Key::of(id);
        let hash = self.hash(key);
        // hashbrown takes its bucket from the low bits and its tag from the
        // top seven; the shard takes bits from neither.
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

    #[inline]
    fn now(&self) -> u64 {
        if self.ttl.is_none() {
            return 0;
        }
        self.epoch.elapsed().as_millis() as u64
    }

    fn contains(&self, id: &str) -> bool {
        let (key, hash, shard) = self.locate(id);
        let now = self.now();
        let shard = lock(shard);
        shard
            .ids
            .find(hash, key)
            .is_some_and(|stamp| !self.expired(stamp, now))
    }

    fn insert(&self, id: &str) {
        let (key, hash, shard) = self.locate(id);
        let now = self.now();
        let mut shard = lock(shard);
        match shard.ids.find(hash, key) {
            // Set-if-absent, like `SET NX`: remembering again keeps the first stamp.
            Some(stamp) if !self.expired(stamp, now) => return,
            Some(_) => shard.ids.remove(hash, key),
            None => {}
        }
        if shard.order.is_some() {
            self.evict(&mut shard, now);
        }
        shard.insert(hash, key, now, &self.hasher);
    }

    fn remove(&self, id: &str) {
        let (key, hash, shard) = self.locate(id);
        lock(shard).ids.remove(hash, key);
    }

    #[inline]
    fn expired(&self, stamp: Stamp, now: u64) -> bool {
        self.ttl
            .is_some_and(|ttl| now.saturating_sub(stamp.remembered_at) >= ttl.as_millis() as u64)
    }

    /// Drops expired ids and, at the capacity, the oldest ones, leaving room
    /// for one more.
    fn evict(&self, shard: &mut Shard, now: u64) {
        let capacity = self.capacity_per_shard.unwrap_or(usize::MAX);
        let Shard { ids, order, .. } = shard;
        let Some(order) = order else {
            return;
        };
        while let Some((owned, stamp)) = order.front() {
            let key = owned.as_key();
            let hash = self.hash(key);
            // An entry whose stamp differs was forgotten (and maybe remembered again later).
            let live = ids.find(hash, key) == Some(*stamp);
            if live && !self.expired(*stamp, now) && ids.len() < capacity {
                break;
            }
            if live {
                ids.remove(hash, key);
            }
            order.pop_front();
        }
    }
}

fn shard_is_ordered(ttl: &Option<Duration>, capacity: &Option<usize>) -> bool {
    ttl.is_some() || capacity.is_some()
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
            .field("ttl", &self.ttl)
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

#[repr(align(128))]
struct Padded<T>(T);

/// A shard's lock is only held for a table operation, which cannot panic
/// half-way; a poisoned lock therefore still guards a consistent table.
#[inline]
fn lock(shard: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    shard.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A canonical UUID as two words (alignment 8 keeps a table slot at 16 bytes).
type Uuid = [u64; 2];

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
        parse_canonical_uuid(id.as_bytes()).map_or(Key::Text(id), Key::Uuid)
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

/// When an id was remembered and which remembering it was, so an order entry
/// left behind by `forget` is told apart from the id remembered again.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Stamp {
    remembered_at: u64,
    sequence: u64,
}

/// One shard: plain sets when the store is unbounded, stamped maps plus an
/// insertion order when it has a TTL or a capacity.
struct Shard {
    ids: Ids,
    order: Option<VecDeque<(OwnedKey, Stamp)>>,
    next_sequence: u64,
}

struct Ids {
    uuids: Table<Uuid>,
    texts: Table<Box<str>>,
}

enum Table<K> {
    Plain(HashTable<K>),
    Stamped(HashTable<(K, Stamp)>),
}

const NO_STAMP: Stamp = Stamp {
    remembered_at: 0,
    sequence: 0,
};

impl Shard {
    fn new(ordered: bool) -> Self {
        Shard {
            ids: Ids {
                uuids: Table::new(ordered),
                texts: Table::new(ordered),
            },
            order: ordered.then(VecDeque::new),
            next_sequence: 0,
        }
    }

    fn insert(&mut self, hash: u64, key: Key<'_>, now: u64, hasher: &RandomState) {
        self.next_sequence += 1;
        let stamp = Stamp {
            remembered_at: now,
            sequence: self.next_sequence,
        };
        match key {
            Key::Uuid(uuid) => self
                .ids
                .uuids
                .insert(hash, uuid, stamp, |k| hasher.hash_one(k)),
            Key::Text(text) => {
                self.ids
                    .texts
                    .insert(hash, text.into(), stamp, |k| hasher.hash_one(&**k))
            }
        }
        if let Some(order) = &mut self.order {
            order.push_back((key.to_owned(), stamp));
        }
    }
}

impl Ids {
    fn len(&self) -> usize {
        self.uuids.len() + self.texts.len()
    }

    #[inline]
    fn find(&self, hash: u64, key: Key<'_>) -> Option<Stamp> {
        match key {
            Key::Uuid(uuid) => self.uuids.find(hash, |k| *k == uuid),
            Key::Text(text) => self.texts.find(hash, |k| **k == *text),
        }
    }

    fn remove(&mut self, hash: u64, key: Key<'_>) {
        match key {
            Key::Uuid(uuid) => self.uuids.remove(hash, |k| *k == uuid),
            Key::Text(text) => self.texts.remove(hash, |k| **k == *text),
        }
    }
}

impl<K> Table<K> {
    fn new(stamped: bool) -> Self {
        if stamped {
            Table::Stamped(HashTable::new())
        } else {
            Table::Plain(HashTable::new())
        }
    }

    fn len(&self) -> usize {
        match self {
            Table::Plain(table) => table.len(),
            Table::Stamped(table) => table.len(),
        }
    }

    #[inline]
    fn find(&self, hash: u64, eq: impl Fn(&K) -> bool) -> Option<Stamp> {
        match self {
            Table::Plain(table) => table.find(hash, |k| eq(k)).map(|_| NO_STAMP),
            Table::Stamped(table) => table.find(hash, |(k, _)| eq(k)).map(|(_, stamp)| *stamp),
        }
    }

    fn insert(&mut self, hash: u64, key: K, stamp: Stamp, rehash: impl Fn(&K) -> u64) {
        match self {
            Table::Plain(table) => {
                table.insert_unique(hash, key, |k| rehash(k));
            }
            Table::Stamped(table) => {
                table.insert_unique(hash, (key, stamp), |(k, _)| rehash(k));
            }
        }
    }

    fn remove(&mut self, hash: u64, eq: impl Fn(&K) -> bool) {
        match self {
            Table::Plain(table) => {
                if let Ok(entry) = table.find_entry(hash, |k| eq(k)) {
                    entry.remove();
                }
            }
            Table::Stamped(table) => {
                if let Ok(entry) = table.find_entry(hash, |(k, _)| eq(k)) {
                    entry.remove();
                }
            }
        }
    }
}

/// Parses the canonical form only (36 bytes, lowercase hex, hyphens at
/// 8-13-18-23), so two ids are one key exactly when their strings are equal.
#[inline]
fn parse_canonical_uuid(id: &[u8]) -> Option<Uuid> {
    let id: &[u8; 36] = id.try_into().ok()?;
    if id[8] != b'-' || id[13] != b'-' || id[18] != b'-' || id[23] != b'-' {
        return None;
    }
    // Branch-free over the 32 digits: a bad one only sets the high bit.
    let mut words = [0u64; 2];
    let mut bad = 0u8;
    let mut digit = 0;
    for group in [0..8, 9..13, 14..18, 19..23, 24..36] {
        for &byte in &id[group] {
            let value = HEX[byte as usize];
            bad |= value;
            let word = &mut words[digit / 16];
            *word = (*word << 4) | u64::from(value & 0x0f);
            digit += 1;
        }
    }
    (bad & INVALID == 0).then_some(words)
}

const INVALID: u8 = 0x80;

/// Lowercase hex digit values; every other byte maps to [`INVALID`].
static HEX: [u8; 256] = {
    let mut table = [INVALID; 256];
    let mut n = 0;
    while n < 10 {
        table[b'0' as usize + n] = n as u8;
        n += 1;
    }
    let mut n = 0;
    while n < 6 {
        table[b'a' as usize + n] = 10 + n as u8;
        n += 1;
    }
    table
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_canonical_uuid_form_is_compacted() {
        let canonical = "f1e2d3c4-b5a6-4789-90ab-cdef01234567";
        assert!(parse_canonical_uuid(canonical.as_bytes()).is_some());
        for other in [
            "F1E2D3C4-B5A6-4789-90AB-CDEF01234567",
            "f1e2d3c4b5a6478990abcdef01234567",
            "{f1e2d3c4-b5a6-4789-90ab-cdef01234567}",
            "f1e2d3c4-b5a6-4789-90ab-cdef0123456g",
            "f1e2d3c4-b5a6-4789-90ab_cdef01234567",
        ] {
            assert!(parse_canonical_uuid(other.as_bytes()).is_none(), "{other}");
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
    fn capacity_evicts_the_oldest_first() {
        let store = InMemoryStore::builder().capacity(3).build();
        for id in ["a", "b", "c", "d"] {
            store.insert(id);
        }
        assert_eq!(store.len(), 3);
        assert!(!store.contains("a"), "the oldest id is evicted");
        assert!(store.contains("b") && store.contains("c") && store.contains("d"));
    }

    #[test]
    fn forget_then_remember_again_keeps_the_fresh_entry_in_order() {
        let store = InMemoryStore::builder().capacity(2).build();
        store.insert("a");
        store.insert("b");
        store.remove("a");
        store.insert("a"); // now the newest
        store.insert("c"); // evicts "b", the oldest live id
        assert!(store.contains("a"));
        assert!(!store.contains("b"));
        assert!(store.contains("c"));
    }
}
