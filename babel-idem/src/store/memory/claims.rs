//! [`ClaimStore`] for [`InMemoryStore`]: claims beside the seen-set.
//!
//! Each claim is a record (owner, fence, lease deadline) in a table sharded
//! by the id's hash. Every operation that reads or changes the done marker
//! of a claimable id does so under the claim shard's lock, so `claim` cannot
//! miss a `commit` that is marking the id done at the same moment. Fences
//! come from one store-wide counter: successive claims of an id are
//! serialised by its shard's lock, so their fences strictly increase, also
//! after a release or a lapse removed the record.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use foldhash::fast::RandomState;

use super::InMemoryStore;
use crate::store::claim::{ClaimFuture, RenewFuture, lease_millis};
use crate::store::{Claim, ClaimStore, ClaimToken, StoreError, StoreFuture, StoreOperation};

const SHARDS: usize = 16;

/// The claims of one [`InMemoryStore`].
pub(super) struct Claims {
    shards: Box<[Mutex<Shard>]>,
    hasher: RandomState,
    last_fence: AtomicU64,
}

#[derive(Default)]
struct Shard {
    records: HashMap<Box<str>, Record, RandomState>,
    /// Lapsed records are dropped when the shard grows past this, so claims
    /// whose owners crashed and whose ids never came back do not pile up.
    sweep_at: usize,
}

#[derive(Clone, Copy)]
struct Record {
    owner: ClaimToken,
    lease_until: Instant,
}

impl Record {
    fn live(&self, now: Instant) -> bool {
        self.lease_until > now
    }

    fn held_by(&self, owner: ClaimToken, now: Instant) -> bool {
        self.owner == owner && self.live(now)
    }
}

impl Default for Claims {
    fn default() -> Self {
        Claims {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            hasher: RandomState::default(),
            last_fence: AtomicU64::new(0),
        }
    }
}

impl Claims {
    /// The shard of `id`. Nothing panics while a shard is held, so a
    /// poisoned lock still guards a consistent table.
    fn shard(&self, id: &str) -> MutexGuard<'_, Shard> {
        let index = self.hasher.hash_one(id) as usize % SHARDS;
        self.shards[index]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// How many claim records are kept, lapsed ones not yet swept included.
    #[cfg(test)]
    fn len(&self) -> usize {
        (0..SHARDS)
            .map(|index| {
                let shard = self.shards[index].lock();
                shard.map_or(0, |shard| shard.records.len())
            })
            .sum()
    }
}

impl InMemoryStore {
    fn claim_now(&self, id: &str, owner: ClaimToken, lease: Duration) -> Claim {
        // A done id stays done: answer without a lock.
        if self.contains(id) {
            return Claim::Done;
        }
        let mut shard = self.claims.shard(id);
        // Again under the lock: a commit may have marked it meanwhile.
        if self.contains(id) {
            return Claim::Done;
        }
        let now = Instant::now();
        if let Some(record) = shard.records.get(id).filter(|record| record.live(now)) {
            return Claim::Held {
                retry_after: Some(record.lease_until - now),
            };
        }
        let fence = self.claims.last_fence.fetch_add(1, Ordering::Relaxed) + 1;
        let record = Record {
            owner,
            lease_until: now + lease,
        };
        match shard.records.get_mut(id) {
            Some(lapsed) => *lapsed = record,
            None => {
                shard.sweep(now);
                shard.records.insert(id.into(), record);
            }
        }
        Claim::Won { fence }
    }

    fn commit_now(&self, id: &str, owner: ClaimToken) -> bool {
        let mut shard = self.claims.shard(id);
        let now = Instant::now();
        match shard.records.get(id) {
            Some(record) if record.held_by(owner, now) => {
                self.insert(id);
                shard.records.remove(id);
                true
            }
            // A done id answers true: a commit retried after its first
            // attempt took effect finds its effect recorded. Checked under
            // the shard's lock, as every mark of a claimable id is made.
            _ => self.contains(id),
        }
    }

    fn release_now(&self, id: &str, owner: ClaimToken) -> bool {
        let mut shard = self.claims.shard(id);
        // A lapsed claim of the same owner may go too: nobody else holds it.
        match shard.records.get(id) {
            Some(record) if record.owner == owner => {
                shard.records.remove(id);
                true
            }
            _ => false,
        }
    }

    fn renew_now(&self, id: &str, owner: ClaimToken, lease: Duration) -> bool {
        let mut shard = self.claims.shard(id);
        let now = Instant::now();
        match shard.records.get_mut(id) {
            Some(record) if record.held_by(owner, now) => {
                record.lease_until = now + lease;
                true
            }
            _ => false,
        }
    }
}

impl Shard {
    fn sweep(&mut self, now: Instant) {
        if self.records.len() < self.sweep_at {
            return;
        }
        self.records.retain(|_, record| record.live(now));
        self.sweep_at = (self.records.len() * 2).max(64);
    }
}

/// The lease in whole milliseconds, as every store keeps it.
fn checked(lease: Duration, operation: StoreOperation) -> Result<Duration, StoreError> {
    lease_millis(lease)
        .map(|millis| Duration::from_millis(millis.into()))
        .map_err(|error| StoreError::new(operation, "memory", error))
}

/// Claims are in-process: every operation completes before it returns, with
/// no allocation beyond the record of a first claim.
impl ClaimStore for InMemoryStore {
    fn claim<'a>(&'a self, id: &'a str, owner: ClaimToken, lease: Duration) -> ClaimFuture<'a> {
        let lease = checked(lease, StoreOperation::Claim);
        StoreFuture::ready(lease.map(|lease| self.claim_now(id, owner, lease)))
    }

    fn commit<'a>(&'a self, id: &'a str, owner: ClaimToken) -> StoreFuture<'a, bool> {
        StoreFuture::ready(Ok(self.commit_now(id, owner)))
    }

    fn release<'a>(&'a self, id: &'a str, owner: ClaimToken) -> StoreFuture<'a, bool> {
        StoreFuture::ready(Ok(self.release_now(id, owner)))
    }

    fn renew<'a>(&'a self, id: &'a str, owner: ClaimToken, lease: Duration) -> RenewFuture<'a> {
        let lease = checked(lease, StoreOperation::Renew);
        StoreFuture::ready(lease.map(|lease| self.renew_now(id, owner, lease)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_secs(60);

    #[test]
    fn one_owner_at_a_time_and_done_stays_done() {
        let store = InMemoryStore::new();
        let (a, b) = (ClaimToken::random(), ClaimToken::random());
        let Claim::Won { fence } = store.claim_now("id", a, LEASE) else {
            panic!("the first claim wins");
        };
        assert!(fence >= 1);
        assert!(matches!(
            store.claim_now("id", b, LEASE),
            Claim::Held { retry_after: Some(left) } if left <= LEASE
        ));
        assert!(!store.commit_now("id", b), "a stranger cannot commit");
        assert!(store.commit_now("id", a));
        assert!(store.contains("id"), "commit marks the id done");
        assert!(store.commit_now("id", a), "a retried commit finds it done");
        assert_eq!(store.claim_now("id", b, LEASE), Claim::Done);
        assert_eq!(store.claims.len(), 0, "commit drops the claim");
    }

    #[test]
    fn lapsed_records_are_swept_as_new_claims_arrive() {
        let store = InMemoryStore::new();
        let lapsing = Duration::from_millis(1);
        for n in 0..1_000 {
            store.claim_now(&format!("crashed-{n}"), ClaimToken::random(), lapsing);
        }
        std::thread::sleep(Duration::from_millis(5));
        // Every shard grows well past its sweep point with live claims.
        for n in 0..20_000 {
            store.claim_now(&format!("live-{n}"), ClaimToken::random(), LEASE);
        }
        assert_eq!(store.claims.len(), 20_000, "the lapsed claims were swept");
    }
}
