//! The offset ledger of one topic: per partition, the records taken from
//! the broker and which of them are settled, and the position that may be
//! committed.
//!
//! Kafka commits a position per partition, not a record: committing
//! offset `n` says every record below `n` is done. Records settle out of
//! order (handlers run side by side), so the position that may be
//! committed is the lowest offset still unsettled, or one past the last
//! settled record when none is; it never passes an unsettled record. A
//! record held back for its key (another record of the key still runs)
//! counts as unsettled from the moment it is taken.
//!
//! Pure bookkeeping: no client, no clock. The transport commits what the
//! ledger says.

use std::collections::{BTreeMap, HashMap};

/// The records of one topic taken from the broker, per partition.
#[derive(Debug, Default)]
pub(super) struct Ledger {
    partitions: HashMap<i32, Partition>,
}

/// One partition's records, by offset.
#[derive(Debug, Default)]
struct Partition {
    /// Offset → settled. Holds every unsettled record, and the settled
    /// ones above the lowest unsettled (they cannot be committed yet).
    /// Invariant: no settled entry lies below the lowest unsettled one
    /// (those are folded into `done`).
    records: BTreeMap<i64, bool>,
    /// One past the highest settled offset folded out of `records`: the
    /// position when `records` is empty.
    done: Option<i64>,
    /// The last position handed out for a commit.
    committed: Option<i64>,
}

impl Partition {
    /// The position that may be committed: the lowest unsettled offset, or
    /// one past the highest settled one when none is unsettled; `None`
    /// until the lowest record taken has settled (nothing to move past).
    fn position(&self) -> Option<i64> {
        // After a fold the first record, if any, is the lowest unsettled
        // one; `done` is set once anything below it settled.
        match self.records.first_key_value() {
            Some((&lowest_unsettled, _)) => self.done.map(|_| lowest_unsettled),
            None => self.done,
        }
    }

    /// Folds the settled records below the lowest unsettled one into
    /// `done`, keeping the invariant.
    fn fold(&mut self) {
        while let Some(entry) = self.records.first_entry() {
            if !*entry.get() {
                break;
            }
            let (offset, _) = entry.remove_entry();
            self.done = Some(self.done.map_or(offset + 1, |done| done.max(offset + 1)));
        }
    }
}

impl Ledger {
    /// Records `offset` of `partition` as taken and unsettled.
    pub(super) fn take(&mut self, partition: i32, offset: i64) {
        self.partitions
            .entry(partition)
            .or_default()
            .records
            .insert(offset, false);
    }

    /// Marks `offset` of `partition` settled. `Some(position)` when the
    /// partition's committable position moved past what was last handed
    /// out: the caller commits it. `None` when it did not move, or the
    /// record was never taken (a partition given up since).
    pub(super) fn settle(&mut self, partition: i32, offset: i64) -> Option<i64> {
        let state = self.partitions.get_mut(&partition)?;
        let settled = state.records.get_mut(&offset)?;
        *settled = true;
        state.fold();
        let position = state.position()?;
        if state
            .committed
            .is_some_and(|committed| committed >= position)
        {
            return None;
        }
        state.committed = Some(position);
        Some(position)
    }

    /// The position of `partition` that may be committed now (`None`
    /// before any of its records settled), whether or not it was handed
    /// out before: what a rebalance or a close commits.
    pub(super) fn position(&self, partition: i32) -> Option<i64> {
        self.partitions.get(&partition)?.position()
    }

    /// Every partition's position that may be committed now.
    pub(super) fn positions(&self) -> Vec<(i32, i64)> {
        let mut positions: Vec<(i32, i64)> = self
            .partitions
            .iter()
            .filter_map(|(partition, state)| Some((*partition, state.position()?)))
            .collect();
        positions.sort_unstable();
        positions
    }

    /// Whether `offset` of `partition` is taken and not settled.
    #[cfg(test)]
    fn is_unsettled(&self, partition: i32, offset: i64) -> bool {
        self.partitions
            .get(&partition)
            .and_then(|state| state.records.get(&offset))
            .is_some_and(|settled| !settled)
    }

    /// Forgets `partition` (given up in a rebalance): its records, settled
    /// or not, are its next owner's.
    pub(super) fn forget(&mut self, partition: i32) {
        self.partitions.remove(&partition);
    }

    /// How many records are taken and not settled, over all partitions.
    pub(super) fn unsettled(&self) -> usize {
        self.partitions
            .values()
            .map(|state| state.records.values().filter(|settled| !**settled).count())
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::Ledger;

    #[test]
    fn nothing_is_committable_before_a_record_settles() {
        let ledger = taken(&[(0, 10), (0, 11)]);
        assert_eq!(ledger.position(0), None);
        assert_eq!(ledger.positions(), vec![]);
    }

    #[test]
    fn settling_in_order_moves_the_position_one_past_each_record() {
        let mut ledger = taken(&[(0, 0), (0, 1), (0, 2)]);
        assert_eq!(ledger.settle(0, 0), Some(1));
        assert_eq!(ledger.settle(0, 1), Some(2));
        assert_eq!(ledger.settle(0, 2), Some(3));
        assert_eq!(ledger.unsettled(), 0);
    }

    #[test]
    fn a_later_record_settling_first_does_not_pass_the_earlier_unsettled_one() {
        let mut ledger = taken(&[(0, 5), (0, 6), (0, 7), (0, 8)]);
        // 6 and 8 settle while 5 still runs: nothing may be committed past 5.
        assert_eq!(ledger.settle(0, 6), None);
        assert_eq!(ledger.settle(0, 8), None);
        assert_eq!(ledger.position(0), None);
        // 5 settles: the position jumps to the next unsettled record, 7.
        assert_eq!(ledger.settle(0, 5), Some(7));
        assert!(ledger.is_unsettled(0, 7));
        // 7 settles: everything taken is settled, one past the highest.
        assert_eq!(ledger.settle(0, 7), Some(9));
    }

    #[test]
    fn the_position_is_the_lowest_unsettled_offset_once_one_settled() {
        let mut ledger = taken(&[(0, 0), (0, 1), (0, 2)]);
        assert_eq!(ledger.settle(0, 0), Some(1));
        assert_eq!(ledger.settle(0, 2), None);
        assert_eq!(ledger.position(0), Some(1));
    }

    #[test]
    fn gaps_in_offsets_commit_one_past_the_last_settled_record() {
        // Compaction and transaction markers leave gaps: the position is
        // one past the record, never a made-up offset in between.
        let mut ledger = taken(&[(0, 3), (0, 10)]);
        assert_eq!(ledger.settle(0, 3), Some(10));
        assert_eq!(ledger.settle(0, 10), Some(11));
    }

    #[test]
    fn partitions_move_independently() {
        let mut ledger = taken(&[(0, 0), (1, 0), (1, 1)]);
        assert_eq!(ledger.settle(1, 1), None);
        assert_eq!(ledger.settle(0, 0), Some(1));
        assert_eq!(ledger.positions(), vec![(0, 1)]);
        assert_eq!(ledger.settle(1, 0), Some(2));
        assert_eq!(ledger.positions(), vec![(0, 1), (1, 2)]);
    }

    #[test]
    fn a_settle_that_does_not_move_the_position_asks_for_no_commit() {
        let mut ledger = taken(&[(0, 0)]);
        assert_eq!(ledger.settle(0, 0), Some(1));
        // Settled twice (a settle tried again): nothing new to commit.
        assert_eq!(ledger.settle(0, 0), None);
    }

    #[test]
    fn a_forgotten_partition_settles_nothing_and_commits_nothing() {
        let mut ledger = taken(&[(2, 40), (2, 41)]);
        ledger.forget(2);
        assert_eq!(ledger.settle(2, 40), None);
        assert_eq!(ledger.position(2), None);
        assert_eq!(ledger.unsettled(), 0);
    }

    #[test]
    fn records_taken_after_a_fold_keep_the_position_below_them() {
        let mut ledger = taken(&[(0, 0)]);
        assert_eq!(ledger.settle(0, 0), Some(1));
        ledger.take(0, 1);
        ledger.take(0, 2);
        assert_eq!(ledger.position(0), Some(1));
        assert_eq!(ledger.settle(0, 2), None);
        assert_eq!(ledger.settle(0, 1), Some(3));
    }

    #[test]
    fn the_committable_position_never_passes_an_unsettled_record() {
        // Every order of settling four records of two partitions: after
        // each settle, the position is at or below every unsettled record
        // of its partition, and it never goes back.
        let records = [(0, 0), (0, 1), (1, 7), (0, 2), (1, 8)];
        let orders = permutations(records.len());
        for order in orders {
            let mut ledger = taken(&records);
            let mut last = [None::<i64>; 2];
            let mut settled = Vec::new();
            for index in order {
                let (partition, offset) = records[index];
                let handed_out = ledger.settle(partition, offset);
                settled.push(records[index]);
                if let Some(position) = handed_out {
                    let slot = &mut last[partition as usize];
                    assert!(slot.is_none_or(|before| before < position));
                    *slot = Some(position);
                }
                for (p, o) in records {
                    if !settled.contains(&(p, o))
                        && let Some(position) = ledger.position(p)
                    {
                        assert!(position <= o, "{position} passes unsettled {p}/{o}");
                    }
                }
            }
            assert_eq!(ledger.positions(), vec![(0, 3), (1, 9)]);
        }
    }

    /// A ledger that took `records` (partition, offset), in order.
    fn taken(records: &[(i32, i64)]) -> Ledger {
        let mut ledger = Ledger::default();
        for &(partition, offset) in records {
            ledger.take(partition, offset);
        }
        ledger
    }

    /// Every order of `0..n`.
    fn permutations(n: usize) -> Vec<Vec<usize>> {
        if n == 0 {
            return vec![Vec::new()];
        }
        let mut out = Vec::new();
        for rest in permutations(n - 1) {
            for at in 0..=rest.len() {
                let mut order = rest.clone();
                order.insert(at, n - 1);
                out.push(order);
            }
        }
        out
    }
}
