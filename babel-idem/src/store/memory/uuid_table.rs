//! An open-addressing set of UUIDs that readers probe without taking a lock.
//!
//! A duplicate delivery only reads, so it must not write to memory another
//! core reads too: a lock word bouncing between two cores would make two
//! workers slower than one. Here readers only load atomics.
//!
//! One writer at a time (the caller holds its shard's lock) fills a slot by
//! storing the low word and the stamp, then publishing the high word with
//! `Release`; a reader loads the high word with `Acquire`, so a slot it sees
//! is complete. A slot goes empty -> occupied -> tombstone and is never
//! reused in place, so a reader never sees one UUID's high word with
//! another's low word. Growth and tombstone clean-up build a new table that
//! replaces this one as a whole (see `memory.rs`), so a reader always probes
//! a consistent table.
//!
//! A probe looks at each slot at most once. The writer keeps the table at
//! most three quarters full (some large ones seven eighths), so a probe
//! normally ends on an empty slot; if that bookkeeping were ever wrong, a
//! probe still ends, after one lap, with [`Probe::Full`] (the UUID is
//! absent: every slot was looked at), and the writer rebuilds the table
//! instead of looping for ever.
//!
//! `loom.rs` checks this protocol under the loom model checker.

use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};

use super::canonical_uuid::Uuid;
use super::sync::AtomicU64;

/// A high word that marks an empty slot.
const EMPTY: u64 = 0;
/// A high word that marks a forgotten slot: probing goes on past it.
const TOMBSTONE: u64 = 1;

/// The smallest table; always a power of two.
pub(super) const MIN_SLOTS: usize = 16;

/// The size from which an unstamped table is filled to seven eighths instead
/// of three quarters (see [`UuidTable::fill_limit`]). A choice between two
/// measured points, not a measured boundary: 7/8 was slower with tables of
/// 32 slots (1,000 ids) and faster with 2,048 (100,000 ids). 1,024 slots
/// are 16 KiB, 1 MiB over 64 shards.
pub(super) const DENSE_FROM: usize = 1024;

/// Whether `uuid` can live in a table: its high word must not be a marker.
/// The few UUIDs whose high word is all zeros but for a `1` first at most
/// (the digits of bytes 0..16, 32 and 33: see `canonical_uuid::parse`)
/// take the text path instead.
#[inline]
pub(super) fn storable(uuid: Uuid) -> bool {
    uuid[0] > TOMBSTONE
}

/// A fixed-size table; see the module docs for the protocol.
pub(super) struct UuidTable {
    slots: Box<[Slot]>,
    /// One stamp per slot when the store has a TTL or a capacity.
    stamps: Option<Box<[AtomicU64]>>,
    mask: usize,
}

struct Slot {
    high: AtomicU64,
    low: AtomicU64,
}

/// Where a UUID is, or where it would go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Probe {
    /// Present at `index`, remembered with `stamp` (0 in an unstamped table).
    Found { index: usize, stamp: u64 },
    /// Absent; `index` is the empty slot that ends its probe sequence.
    Vacant { index: usize },
    /// Absent, and no slot is empty: the probe looked at every slot once.
    Full,
}

impl UuidTable {
    /// An empty table of `slots` slots (a power of two, at least [`MIN_SLOTS`]).
    pub(super) fn new(slots: usize, stamped: bool) -> Self {
        debug_assert!(slots.is_power_of_two() && slots >= MIN_SLOTS);
        UuidTable {
            slots: (0..slots)
                .map(|_| Slot {
                    high: AtomicU64::new(EMPTY),
                    low: AtomicU64::new(0),
                })
                .collect(),
            stamps: stamped.then(|| (0..slots).map(|_| AtomicU64::new(0)).collect()),
            mask: slots - 1,
        }
    }

    #[cfg(test)]
    pub(super) fn slots(&self) -> usize {
        self.slots.len()
    }

    /// How many slots may be filled (live or tombstone) before the table
    /// must be rebuilt, leaving empty slots for every probe to end on.
    ///
    /// Three quarters, but seven eighths of a large unstamped table
    /// ([`DENSE_FROM`] slots and up): there a lookup waits on the miss of
    /// its slot far longer than on the few more slots it compares, and the
    /// smaller table misses less. A table the caches hold is slower for
    /// it, and a stamped one (a store with a TTL or a capacity) fills
    /// with the tombstones of expired and evicted ids, whose longer probes
    /// every first delivery would pay.
    pub(super) fn fill_limit(&self) -> usize {
        let slots = self.slots.len();
        if slots >= DENSE_FROM && self.stamps.is_none() {
            slots / 8 * 7
        } else {
            slots / 4 * 3
        }
    }

    /// Finds `uuid`, looking at each slot at most once. Safe to call
    /// concurrently with the writer.
    #[inline]
    pub(super) fn probe(&self, uuid: Uuid, hash: u64) -> Probe {
        let mut index = hash as usize & self.mask;
        for _ in 0..self.slots.len() {
            let slot = &self.slots[index];
            let high = slot.high.load(Acquire);
            if high == EMPTY {
                return Probe::Vacant { index };
            }
            if high == uuid[0] && slot.low.load(Relaxed) == uuid[1] {
                return Probe::Found {
                    index,
                    stamp: self.stamp(index),
                };
            }
            index = (index + 1) & self.mask;
        }
        Probe::Full
    }

    #[inline]
    fn stamp(&self, index: usize) -> u64 {
        self.stamps
            .as_ref()
            .map_or(0, |stamps| stamps[index].load(Acquire))
    }

    /// Writer only: stores `uuid` in the empty slot `index` that a probe for it returned.
    pub(super) fn fill(&self, index: usize, uuid: Uuid, stamp: u64) {
        let slot = &self.slots[index];
        debug_assert_eq!(slot.high.load(Relaxed), EMPTY);
        slot.low.store(uuid[1], Relaxed);
        if let Some(stamps) = &self.stamps {
            stamps[index].store(stamp, Relaxed);
        }
        slot.high.store(uuid[0], Release);
    }

    /// Writer only: forgets the UUID at `index`.
    pub(super) fn bury(&self, index: usize) {
        self.slots[index].high.store(TOMBSTONE, Release);
    }

    /// Writer only: the live UUIDs with their stamps, to move into a new table.
    pub(super) fn live(&self) -> impl Iterator<Item = (Uuid, u64)> + '_ {
        self.slots.iter().enumerate().filter_map(|(index, slot)| {
            let high = slot.high.load(Acquire);
            storable([high, 0]).then(|| ([high, slot.low.load(Relaxed)], self.stamp(index)))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vacant_index(table: &UuidTable, uuid: Uuid, hash: u64) -> usize {
        match table.probe(uuid, hash) {
            Probe::Vacant { index } => index,
            found => panic!("expected a vacant slot, got {found:?}"),
        }
    }

    #[test]
    fn colliding_uuids_probe_past_each_other_and_past_tombstones() {
        let table = UuidTable::new(MIN_SLOTS, true);
        let (a, b, c) = ([10, 1], [11, 2], [12, 3]);
        // All three hash to slot 5.
        for (uuid, stamp) in [(a, 7), (b, 8), (c, 9)] {
            let index = vacant_index(&table, uuid, 5);
            table.fill(index, uuid, stamp);
        }
        assert_eq!(table.probe(c, 5), Probe::Found { index: 7, stamp: 9 });
        table.bury(6);
        assert_eq!(table.probe(b, 5), Probe::Vacant { index: 8 });
        assert_eq!(table.probe(c, 5), Probe::Found { index: 7, stamp: 9 });
        let live: Vec<_> = table.live().collect();
        assert_eq!(live, vec![(a, 7), (c, 9)]);
    }

    #[test]
    fn probing_wraps_around_the_end() {
        let table = UuidTable::new(MIN_SLOTS, false);
        let index = vacant_index(&table, [20, 1], 15);
        table.fill(index, [20, 1], 0);
        let next = vacant_index(&table, [21, 1], 15);
        assert_eq!(next, 0);
        table.fill(next, [21, 1], 0);
        assert_eq!(
            table.probe([21, 1], 15),
            Probe::Found { index: 0, stamp: 0 }
        );
    }

    #[test]
    fn a_probe_of_a_table_with_no_empty_slot_ends_after_one_lap() {
        let table = UuidTable::new(MIN_SLOTS, false);
        // Fill every slot, past the fill limit the writer keeps to.
        for n in 0..MIN_SLOTS as u64 {
            let index = vacant_index(&table, [100 + n, 1], 3);
            table.fill(index, [100 + n, 1], 0);
        }
        assert_eq!(table.probe([99, 1], 3), Probe::Full);
        let last = [100 + MIN_SLOTS as u64 - 1, 1];
        assert_eq!(
            table.probe(last, 3),
            Probe::Found { index: 2, stamp: 0 },
            "the last slot of the lap is still looked at"
        );
        table.bury(7);
        assert_eq!(
            table.probe([99, 1], 3),
            Probe::Full,
            "a tombstone is not empty"
        );
    }

    #[test]
    fn markers_are_not_storable() {
        assert!(!storable([EMPTY, 5]));
        assert!(!storable([TOMBSTONE, 5]));
        assert!(storable([2, 0]));
    }
}
