//! An open-addressing set of UUIDs that readers probe without a lock and
//! without a locked instruction.
//!
//! A duplicate delivery only reads, so it must not write to memory another
//! core reads too (a lock word bouncing between two cores would make two
//! workers slower than one), nor run a locked instruction: on x86 one waits
//! for every earlier load and store, so the next delivery's cache misses
//! could not start while this one's were pending. Readers here only load.
//!
//! One writer at a time (the caller holds its shard's lock) fills a slot by
//! storing the low word and the stamp, then publishing the high word with
//! `Release`; a reader loads the high word with `Acquire`, so a slot it sees
//! is complete. Between two rearrangements a slot goes empty -> occupied ->
//! tombstone, so a reader never sees one UUID's high word with another's
//! low word.
//!
//! Growth and tombstone clean-up rearrange the slots in place, under a
//! sequence number that is odd while they do (a seqlock): a reader notes
//! the number before it probes and looks again after, and an answer that
//! two layouts may have mixed is not taken ([`UuidTable::read`] says
//! `None`; `memory.rs` then asks again under the shard's lock).
//!
//! Slots live in segments, each allocated when the table first grows over
//! it and kept until the store is dropped, so that memory a reader may
//! still be reading is never freed: segments 0 and 1 hold [`MIN_SLOTS`]
//! slots each, and segment `k` holds `MIN_SLOTS << (k - 1)`, so a table of
//! `MIN_SLOTS << n` slots is the first `n + 1` segments, in index order.
//! The store's memory is thus what its largest table needed, whatever the
//! churn.
//!
//! A probe looks at each slot at most once: one at a time, but a lock-free
//! read of a table larger than the caches hold looks at four at a time,
//! with no branch between them (see `scan`). The writer keeps the table at
//! most three quarters full (some large ones seven eighths), so a probe
//! normally ends on an empty slot; if that bookkeeping were ever wrong, a
//! probe still ends, after one lap, with [`Probe::Full`] (the UUID is
//! absent: every slot was looked at), and the writer rearranges the table
//! instead of looping for ever. A lookup first compares the slots at the
//! UUID's home alone ([`UuidTable::read_home`]), where most probes end, and
//! takes the whole probe only when those do not answer.
//!
//! `loom.rs` checks this protocol under the loom model checker.

use std::sync::OnceLock;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};

use super::canonical_uuid::Uuid;
use super::sync::{AtomicU64, fence};

/// A high word that marks an empty slot.
const EMPTY: u64 = 0;
/// A high word that marks a forgotten slot: probing goes on past it.
const TOMBSTONE: u64 = 1;

/// The smallest table, and the size of its first segment; a power of two
/// (4 under loom, so that a model's rearrangement stays small).
pub(super) const MIN_SLOTS: usize = if cfg!(all(test, loom)) { 4 } else { 16 };

/// Segments in a table's directory: room for `MIN_SLOTS << 40` slots, far
/// more than a 48-bit address space holds (under loom, 4: see `new`).
const SEGMENTS: usize = if cfg!(all(test, loom)) { 4 } else { 41 };

/// The size from which a table is taken to live beyond the caches, where a
/// lookup waits on the miss of its slot: an unstamped one is filled to
/// seven eighths instead of three quarters (see [`UuidTable::fill_limit`]),
/// and a lock-free read compares [`WINDOW`] slots at a time instead of one.
/// A table that stays in the caches goes one slot at a time, and is filled
/// to three quarters. 1,024 slots are 16 KiB, 256 KiB over the 16 shards of
/// a store's default.
///
/// Under loom, twice the smallest table (the smallest whose seven eighths
/// leave a slot empty), so that the models probe with windows too.
pub(super) const LARGE_FROM: usize = if cfg!(all(test, loom)) {
    2 * MIN_SLOTS
} else {
    1024
};

/// Whether `uuid` can live in a table: its high word must not be a marker.
/// The few UUIDs whose high word is all zeros but for a `1` first at most
/// (the digits of bytes 0..16, 32 and 33: see `canonical_uuid::parse`)
/// take the text path instead.
#[inline]
pub(super) fn storable(uuid: Uuid) -> bool {
    uuid[0] > TOMBSTONE
}

/// A shard's table; see the module docs for the protocol.
pub(super) struct UuidTable {
    /// Even while the layout holds, odd while the writer rearranges it.
    sequence: AtomicU64,
    /// The slot count minus one; changed only while `sequence` is odd.
    mask: AtomicU64,
    /// Whether each slot has a stamp (the store has a TTL or a capacity).
    stamped: bool,
    segments: [OnceLock<Segment>; SEGMENTS],
}

struct Segment {
    slots: Box<[Slot]>,
    stamps: Option<Box<[AtomicU64]>>,
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

/// Slots a probe compares at once: four of 16 bytes, one or two cache lines.
const WINDOW: usize = 4;

/// Slots from a UUID's home that [`UuidTable::read_home`] compares.
const HOME: usize = 4;

/// Where a probe ends within the slots it was given, by offset among them.
enum Stop {
    Found(usize),
    Vacant(usize),
}

impl Stop {
    /// The probe's answer, for slots given from `offset` in `segment`,
    /// where slot `offset` is the table's slot `index`.
    #[inline(always)]
    fn probe(self, segment: &Segment, offset: usize, index: usize) -> Probe {
        match self {
            Stop::Found(at) => Probe::Found {
                index: index + at,
                stamp: segment.stamp(offset + at),
            },
            Stop::Vacant(at) => Probe::Vacant { index: index + at },
        }
    }
}

/// Where the probe for `uuid` ends within `window`, if it does: at `uuid`,
/// or else at the first empty slot.
///
/// The slots are compared with no branch between them. Where in its run a
/// UUID sits is random, so a branch per slot was mispredicted on most
/// lookups, and a mispredicted branch that waits on a cache miss holds up
/// the next delivery's loads as well. A hit is taken even past a slot that
/// reads empty: a UUID's slot and every slot between it and its home stay
/// filled until the next rearrangement, so that slot was filled while this
/// probe ran.
#[inline(always)]
fn scan<const N: usize>(window: &[Slot; N], uuid: Uuid) -> Option<Stop> {
    // Each high word is loaded once (`Acquire`), before its low word: an
    // empty slot and a hit must be read from the same load, or a slot
    // filled between two loads would end the probe past its first empty
    // slot, at an index the writer's protocol never gives.
    let highs = window.each_ref().map(|slot| slot.high.load(Acquire));
    let mut found = 0u32;
    for (bit, (slot, high)) in window.iter().zip(highs).enumerate() {
        let low = slot.low.load(Relaxed);
        found |= u32::from((high ^ uuid[0]) | (low ^ uuid[1]) == 0) << bit;
    }
    if found != 0 {
        return Some(Stop::Found(found.trailing_zeros() as usize));
    }
    let empty = (highs.iter().enumerate()).fold(0u32, |empty, (bit, &high)| {
        empty | u32::from(high == EMPTY) << bit
    });
    (empty != 0).then(|| Stop::Vacant(empty.trailing_zeros() as usize))
}

/// The segment that holds slot `index`, and the slot's place in it.
///
/// From the index's highest bit, with the bits below `MIN_SLOTS` set so
/// that segment 0 needs no case of its own (every probe step runs this).
#[inline]
fn place(index: usize) -> (usize, usize) {
    let top = (index | (MIN_SLOTS - 1)).ilog2();
    let segment = (top + 1 - MIN_SLOTS.ilog2()) as usize;
    // Below the highest bit, or the whole first segment.
    (segment, index & (((1 << top) - 1) | (MIN_SLOTS - 1)))
}

#[inline]
fn segment_len(segment: usize) -> usize {
    (MIN_SLOTS << segment >> 1).max(MIN_SLOTS)
}

impl Segment {
    /// The stamp of the slot at `offset`; 0 in an unstamped table.
    #[inline]
    fn stamp(&self, offset: usize) -> u64 {
        self.stamps
            .as_ref()
            .map_or(0, |stamps| stamps[offset].load(Acquire))
    }

    fn new(segment: usize, stamped: bool) -> Self {
        let len = segment_len(segment);
        Segment {
            slots: (0..len)
                .map(|_| Slot {
                    high: AtomicU64::new(EMPTY),
                    low: AtomicU64::new(0),
                })
                .collect(),
            stamps: stamped.then(|| (0..len).map(|_| AtomicU64::new(0)).collect()),
        }
    }
}

impl UuidTable {
    /// An empty table of [`MIN_SLOTS`] slots.
    pub(super) fn new(stamped: bool) -> Self {
        let table = UuidTable {
            sequence: AtomicU64::new(0),
            mask: AtomicU64::new(MIN_SLOTS as u64 - 1),
            stamped,
            segments: std::array::from_fn(|_| OnceLock::new()),
        };
        // Loom cannot see a `OnceLock`'s synchronisation, so under loom
        // every segment is made here, before any reader can run.
        let made_now = if cfg!(all(test, loom)) { SEGMENTS } else { 1 };
        for segment in 0..made_now {
            table.segments[segment].get_or_init(|| Segment::new(segment, stamped));
        }
        table
    }

    /// How many slots the table has now.
    #[inline]
    pub(super) fn slots(&self) -> usize {
        self.mask.load(Relaxed) as usize + 1
    }

    /// How many slots may be filled (live or tombstone) before the table
    /// must be rearranged, leaving empty slots for every probe to end on.
    ///
    /// Three quarters, but seven eighths of a large unstamped table
    /// ([`LARGE_FROM`] slots and up): there a lookup waits on the miss of
    /// its slot far longer than on the few more slots it compares, and the
    /// smaller table misses less. A table the caches hold is slower for
    /// it, and a stamped one (a store with a TTL or a capacity) fills
    /// with the tombstones of expired and evicted ids, whose longer probes
    /// every first delivery would pay.
    pub(super) fn fill_limit(&self) -> usize {
        let slots = self.slots();
        if slots >= LARGE_FROM && !self.stamped {
            slots / 8 * 7
        } else {
            slots / 4 * 3
        }
    }

    /// Finds `uuid` without a lock: `None` when the writer rearranged the
    /// table during the probe, whose answer then may mix two layouts (ask
    /// again under the shard's lock, where no rearrangement runs).
    #[inline]
    pub(super) fn read(&self, uuid: Uuid, hash: u64) -> Option<Probe> {
        // The lock-free reader is the one that waits on a large table's
        // misses (a duplicate's whole lookup); the writer's probes, under
        // the lock, go one slot at a time: they run where the reader has
        // just been, or rearrange a table, and windows only cost them.
        self.seqlocked(move |mask| {
            Some(if mask as usize + 1 >= LARGE_FROM {
                self.probe_by::<WINDOW>(uuid, hash, mask)
            } else {
                self.probe_by::<1>(uuid, hash, mask)
            })
        })
    }

    /// The reader's half of the seqlock, around `probe` (given the mask,
    /// loaded once for both the choice of width and the probe): `None`
    /// when the writer rearranged the table meanwhile.
    #[inline(always)]
    fn seqlocked(&self, probe: impl FnOnce(u64) -> Option<Probe>) -> Option<Probe> {
        let sequence = self.sequence.load(Acquire);
        if sequence & 1 == 1 {
            return None;
        }
        let probe = probe(self.mask.load(Relaxed))?;
        // The probe's loads come before the second look, so one that saw
        // a rearranging store sees the odd (or a later) sequence.
        fence(Acquire);
        (self.sequence.load(Relaxed) == sequence).then_some(probe)
    }

    /// [`read`](Self::read) as far as the first slots of `uuid`'s probe,
    /// where most lookups end: a large table's first window, or else up
    /// to [`HOME`] slots one at a time, within the home slot's segment.
    /// `None` when those do not give the answer, or the writer rearranged
    /// the table.
    ///
    /// The same slots, compared the same way, as `read`'s first steps,
    /// without its segment and lap bookkeeping.
    #[inline(always)]
    pub(super) fn read_home(&self, uuid: Uuid, hash: u64) -> Option<Probe> {
        self.seqlocked(move |mask| {
            let index = hash as usize & mask as usize;
            let (segment, first) = self.locate(index)?;
            let home = segment.slots.get(first..)?;
            if mask as usize + 1 >= LARGE_FROM {
                let stop = scan(home.first_chunk::<WINDOW>()?, uuid)?;
                Some(stop.probe(segment, first, index))
            } else {
                // One slot at a time, as `read` goes in a small table, up
                // to the segment's end: a probe that crosses it goes on in
                // `read`.
                home.iter().take(HOME).enumerate().find_map(|(at, slot)| {
                    let stop = scan(std::array::from_ref(slot), uuid)?;
                    Some(stop.probe(segment, first + at, index + at))
                })
            }
        })
    }

    /// Finds `uuid`, looking at each slot at most once, one at a time. Safe
    /// to call concurrently with the writer's `fill` and `bury`; a reader
    /// that may race a rearrangement calls [`read`](Self::read) instead.
    #[inline]
    pub(super) fn probe(&self, uuid: Uuid, hash: u64) -> Probe {
        self.probe_by::<1>(uuid, hash, self.mask.load(Relaxed))
    }

    /// [`probe`](Self::probe), `WIDTH` slots at a time (see [`scan`]).
    #[inline(always)]
    fn probe_by<const WIDTH: usize>(&self, uuid: Uuid, hash: u64, mask: u64) -> Probe {
        let mask = mask as usize;
        let mut index = hash as usize & mask;
        let mut unseen = mask + 1;
        // Segment by segment: a miss probes dozens of slots in a full table,
        // and finding each one's segment again cost more than comparing it.
        while unseen > 0 {
            // A segment is missing only to a reader racing a growth, which
            // `read` throws away.
            let Some((segment, first)) = self.locate(index) else {
                return Probe::Full;
            };
            let slots = &segment.slots;
            let end = slots.len().min(first + unseen);
            let mut offset = first;
            while let Some(rest) = slots.get(offset..end) {
                // Whole windows while they fit, so that each is unrolled; a
                // segment's or a lap's last few slots one at a time.
                let (stop, width) = if let Some(window) = rest.first_chunk::<WIDTH>() {
                    (scan(window, uuid), WIDTH)
                } else if let Some(slot) = rest.first_chunk::<1>() {
                    (scan(slot, uuid), 1)
                } else {
                    break;
                };
                match stop {
                    Some(stop) => return stop.probe(segment, offset, index + (offset - first)),
                    None => offset += width,
                }
            }
            // The layout's last segment ends at its last slot: wrap to 0.
            unseen -= end - first;
            index = (index + (end - first)) & mask;
        }
        Probe::Full
    }

    /// The segment of slot `index` and the slot's offset in it, if that
    /// segment has been allocated.
    #[inline]
    fn locate(&self, index: usize) -> Option<(&Segment, usize)> {
        let (segment, offset) = place(index);
        Some((self.segments.get(segment)?.get()?, offset))
    }

    /// Writer only: stores `uuid` in the empty slot `index` that a probe for it returned.
    pub(super) fn fill(&self, index: usize, uuid: Uuid, stamp: u64) {
        let Some((segment, offset)) = self.locate(index) else {
            debug_assert!(false, "slot {index} is outside the table");
            return;
        };
        let slot = &segment.slots[offset];
        debug_assert_eq!(slot.high.load(Relaxed), EMPTY);
        slot.low.store(uuid[1], Relaxed);
        if let Some(stamps) = &segment.stamps {
            stamps[offset].store(stamp, Relaxed);
        }
        slot.high.store(uuid[0], Release);
    }

    /// Writer only: forgets the UUID at `index`.
    pub(super) fn bury(&self, index: usize) {
        if let Some((segment, offset)) = self.locate(index) {
            segment.slots[offset].high.store(TOMBSTONE, Release);
        }
    }

    /// Writer only: the live UUIDs with their stamps.
    pub(super) fn live(&self) -> impl Iterator<Item = (Uuid, u64)> + '_ {
        self.in_use().flat_map(|segment| {
            segment
                .slots
                .iter()
                .enumerate()
                .filter_map(|(offset, slot)| {
                    let high = slot.high.load(Relaxed);
                    storable([high, 0]).then(|| {
                        let stamp = segment.stamp(offset);
                        ([high, slot.low.load(Relaxed)], stamp)
                    })
                })
        })
    }

    /// The segments the current layout spans.
    fn in_use(&self) -> impl Iterator<Item = &Segment> + '_ {
        let last = place(self.slots() - 1).0;
        self.segments[..=last].iter().filter_map(OnceLock::get)
    }

    /// Writer only: rearranges the table in place to hold its live UUIDs at
    /// most half full and no tombstone: larger when they need it, the same
    /// size or smaller when it was mostly tombstones. Sized from what the
    /// table really holds, not from the bookkeeping, so it always has free
    /// slots after. `hash` is the store's hash of a UUID. Returns how many
    /// UUIDs it holds.
    pub(super) fn rebuild(&self, hash: impl Fn(Uuid) -> u64) -> usize {
        let live: Vec<_> = self.live().collect();
        self.rearrange(live, hash)
    }

    /// Writer only: forgets every UUID; the table shrinks to [`MIN_SLOTS`]
    /// (its segments stay allocated, for the next growth).
    pub(super) fn clear(&self) {
        self.rearrange(Vec::new(), |_| 0);
    }

    fn rearrange(&self, live: Vec<(Uuid, u64)>, hash: impl Fn(Uuid) -> u64) -> usize {
        let slots = ((live.len() + 1) * 2)
            .next_power_of_two()
            .clamp(MIN_SLOTS, MIN_SLOTS << (SEGMENTS - 1));
        self.lay_out(slots, live, hash)
    }

    /// [`rearrange`](Self::rearrange) into `slots` slots, a power of two
    /// that holds `live` at most half full.
    pub(super) fn lay_out(
        &self,
        slots: usize,
        live: Vec<(Uuid, u64)>,
        hash: impl Fn(Uuid) -> u64,
    ) -> usize {
        let sequence = self.sequence.load(Relaxed);
        self.sequence.store(sequence.wrapping_add(1), Relaxed);
        // The writer's half of the seqlock: a reader whose probe sees any
        // store below sees the odd sequence when it looks again.
        fence(Release);
        // Every slot outside the layout is kept empty, so growing over a
        // segment allocated earlier finds it empty too. The high word alone
        // says empty: `fill` writes the low word and the stamp before it.
        for slot in self.in_use().flat_map(|segment| &segment.slots) {
            if slot.high.load(Relaxed) != EMPTY {
                slot.high.store(EMPTY, Relaxed);
            }
        }
        for segment in 0..=place(slots - 1).0 {
            self.segments[segment].get_or_init(|| Segment::new(segment, self.stamped));
        }
        self.mask.store(slots as u64 - 1, Relaxed);
        let mut moved = 0;
        for (uuid, stamp) in live {
            if let Probe::Vacant { index } = self.probe(uuid, hash(uuid)) {
                self.fill(index, uuid, stamp);
                moved += 1;
            }
        }
        self.sequence.store(sequence.wrapping_add(2), Release);
        moved
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
        let table = UuidTable::new(true);
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

    /// An empty table of `slots` slots; [`LARGE_FROM`] and up, its
    /// lock-free reads compare windows of slots.
    fn table_of(slots: usize, stamped: bool) -> UuidTable {
        let table = UuidTable::new(stamped);
        table.lay_out(slots, Vec::new(), |_| 0);
        assert_eq!(table.slots(), slots);
        table
    }

    /// A table whose reads go one slot at a time, and one whose reads
    /// compare windows.
    const SIZES: [usize; 2] = [MIN_SLOTS, LARGE_FROM];

    /// What `read` and `probe` both answer (no rearrangement runs), and
    /// `read_home` where it answers.
    fn both(table: &UuidTable, uuid: Uuid, hash: u64) -> Probe {
        let probe = table.probe(uuid, hash);
        let read = table.read(uuid, hash);
        assert_eq!(read, Some(probe), "read and probe differ");
        if let Some(home) = table.read_home(uuid, hash) {
            assert_eq!(Some(home), read, "read_home and read differ");
        }
        probe
    }

    /// What a reader may see while the writer fills a run: a later slot
    /// filled, an earlier one not yet. A window takes the hit; one slot at
    /// a time, the probe ends on the empty slot. Any other UUID's probe
    /// ends on the first empty slot either way, not past it.
    #[test]
    fn a_window_takes_a_hit_past_an_empty_slot_and_other_probes_stop_at_the_first() {
        for slots in SIZES {
            let table = table_of(slots, false);
            let (a, b) = ([10, 1], [11, 2]);
            table.fill(6, a, 0);
            assert_eq!(both(&table, b, 4), Probe::Vacant { index: 4 }, "{slots}");
            assert_eq!(both(&table, b, 5), Probe::Vacant { index: 5 }, "{slots}");
            assert_eq!(both(&table, b, 6), Probe::Vacant { index: 7 }, "{slots}");
            assert_eq!(table.probe(a, 4), Probe::Vacant { index: 4 }, "{slots}");
            let read = if slots >= LARGE_FROM {
                Probe::Found { index: 6, stamp: 0 }
            } else {
                Probe::Vacant { index: 4 }
            };
            assert_eq!(table.read(a, 4), Some(read), "{slots}");
        }
    }

    /// Runs longer than a window, from homes in every place of a window and
    /// near the table's end: across window edges, the segment's end and
    /// the wrap to 0, past a tombstone; `read` and `probe` agree.
    #[test]
    fn long_runs_are_probed_across_windows_from_every_home() {
        for slots in SIZES {
            let homes = (0..MIN_SLOTS).chain(slots - MIN_SLOTS..slots);
            for home in homes {
                let table = table_of(slots, true);
                let uuid = |n: u64| [100 + n, n];
                let at = |n: u64| (home + n as usize) % slots;
                for n in 0..9 {
                    let index = vacant_index(&table, uuid(n), home as u64);
                    assert_eq!(index, at(n), "{slots} slots, home {home}, uuid {n}");
                    table.fill(index, uuid(n), n + 50);
                }
                table.bury(at(3));
                for n in (0..9).filter(|&n| n != 3) {
                    assert_eq!(
                        both(&table, uuid(n), home as u64),
                        Probe::Found {
                            index: at(n),
                            stamp: n + 50
                        },
                        "{slots} slots, home {home}, uuid {n}"
                    );
                }
                assert_eq!(
                    both(&table, uuid(3), home as u64),
                    Probe::Vacant { index: at(9) },
                    "{slots} slots, home {home}: a tombstone neither matches nor ends the probe"
                );
            }
        }
    }

    /// `read_home` answers a probe that ends within its first slots, and
    /// leaves one that goes further, or crosses the home segment's end,
    /// to `read`.
    #[test]
    fn read_home_answers_within_the_first_slots_and_leaves_the_rest() {
        for slots in SIZES {
            let table = table_of(slots, true);
            let uuid = |n: u64| [100 + n, n];
            // A run of six from slot 2 (in segment 0 at either size).
            for n in 0..6 {
                table.fill(2 + n as usize, uuid(n), n + 50);
            }
            let found = |n: u64| Probe::Found {
                index: 2 + n as usize,
                stamp: n + 50,
            };
            for n in 0..HOME as u64 {
                assert_eq!(
                    table.read_home(uuid(n), 2),
                    Some(found(n)),
                    "{slots} slots, uuid {n}"
                );
            }
            for n in HOME as u64..6 {
                assert_eq!(table.read_home(uuid(n), 2), None, "{slots} slots, uuid {n}");
                assert_eq!(
                    both(&table, uuid(n), 2),
                    found(n),
                    "{slots} slots, uuid {n}"
                );
            }
            assert_eq!(
                table.read_home(uuid(9), 0),
                Some(Probe::Vacant { index: 0 })
            );
            assert_eq!(table.read_home(uuid(9), 2), None, "past the first slots");
            // Slots 14 and 15 end segment 0: the probe from 14 goes on in
            // segment 1, or in a table of 16 slots wraps to slot 0.
            let next = 16 % slots;
            table.fill(14, uuid(7), 57);
            table.fill(15, uuid(8), 58);
            table.fill(next, uuid(10), 60);
            // One at a time, the slots before the segment's end are read;
            // a large table's window must lie within the segment.
            let at_14 = (slots < LARGE_FROM).then_some(Probe::Found {
                index: 14,
                stamp: 57,
            });
            assert_eq!(table.read_home(uuid(7), 14), at_14, "{slots} slots");
            assert_eq!(
                both(&table, uuid(7), 14),
                Probe::Found {
                    index: 14,
                    stamp: 57
                }
            );
            assert_eq!(
                table.read_home(uuid(10), 14),
                None,
                "{slots} slots: across a segment's end"
            );
            assert_eq!(
                both(&table, uuid(10), 14),
                Probe::Found {
                    index: next,
                    stamp: 60
                }
            );
        }
    }

    #[test]
    fn probing_wraps_around_the_end() {
        let table = UuidTable::new(false);
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
        let table = UuidTable::new(false);
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
    fn segments_tile_the_slots_in_index_order() {
        let mut next = 0;
        for segment in 0..12 {
            for offset in 0..segment_len(segment) {
                assert_eq!(place(next), (segment, offset), "slot {next}");
                next += 1;
            }
            // A table of `MIN_SLOTS << n` slots ends where segment `n` does.
            assert_eq!(next, MIN_SLOTS << segment);
        }
        assert_eq!(place((MIN_SLOTS << (SEGMENTS - 1)) - 1).0, SEGMENTS - 1);
    }

    /// A table grown to many segments, shrunk back, then grown again: every
    /// live UUID is found at every step, tombstones are gone after each
    /// rebuild, and growing again over kept segments finds them empty.
    #[test]
    fn rebuilds_in_place_keep_the_live_uuids_across_segments() {
        let table = UuidTable::new(true);
        let uuid = |n: u64| [n + 2, n * 7];
        let hash = |uuid: Uuid| uuid[0].wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let insert = |n: u64| {
            if table.probe(uuid(n), hash(uuid(n))) == Probe::Full
                || table.live().count() + 1 > table.fill_limit()
            {
                table.rebuild(hash);
            }
            let Probe::Vacant { index } = table.probe(uuid(n), hash(uuid(n))) else {
                panic!("no room for {n}");
            };
            table.fill(index, uuid(n), n + 100);
        };
        for n in 0..3_000 {
            insert(n);
        }
        assert_eq!(table.slots(), 4_096);
        for n in (0..3_000).filter(|n| n % 10 != 0) {
            let Probe::Found { index, stamp } = table.probe(uuid(n), hash(uuid(n))) else {
                panic!("{n} lost");
            };
            assert_eq!(stamp, n + 100);
            table.bury(index);
        }
        assert_eq!(table.rebuild(hash), 300);
        assert_eq!(table.slots(), 1_024, "mostly tombstones: the table shrank");
        for n in 0..3_000 {
            let found = matches!(table.probe(uuid(n), hash(uuid(n))), Probe::Found { .. });
            assert_eq!(found, n % 10 == 0, "{n}");
        }
        for n in 3_000..6_000 {
            insert(n);
        }
        assert_eq!(table.live().count(), 3_300);
        for n in (0..6_000).filter(|n| *n >= 3_000 || n % 10 == 0) {
            assert!(
                matches!(table.probe(uuid(n), hash(uuid(n))), Probe::Found { .. }),
                "{n} lost after growing again"
            );
        }
        table.clear();
        assert_eq!((table.slots(), table.live().count()), (MIN_SLOTS, 0));
    }

    #[test]
    fn a_read_during_a_rearrangement_is_not_taken() {
        let table = UuidTable::new(false);
        let index = vacant_index(&table, [20, 1], 3);
        table.fill(index, [20, 1], 0);
        assert_eq!(
            table.read([20, 1], 3),
            Some(Probe::Found { index: 3, stamp: 0 })
        );
        // What a reader sees while the writer is between the two stores.
        table.sequence.store(1, Relaxed);
        assert_eq!(table.read([20, 1], 3), None);
        table.sequence.store(2, Relaxed);
        assert_eq!(
            table.read([20, 1], 3),
            Some(Probe::Found { index: 3, stamp: 0 })
        );
    }

    #[test]
    fn markers_are_not_storable() {
        assert!(!storable([EMPTY, 5]));
        assert!(!storable([TOMBSTONE, 5]));
        assert!(storable([2, 0]));
    }
}
