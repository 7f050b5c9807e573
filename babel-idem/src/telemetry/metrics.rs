//! Process-wide counters of what guards decided, cheap enough for every delivery.
//!
//! Each thread counts in its own cache-line-padded counters, so two workers
//! counting at once never touch one cache line; a read sums every thread's.
//!
//! Each decision is also recorded on the current consumer span (field
//! `messaging.babelqueue.idempotency.decision`, see [`Router::dispatch`](crate::router::Router::dispatch)).
//! With the feature `metrics`, decisions, store latency and store errors also
//! go through the `metrics` facade: `DECISIONS_TOTAL`, `STORE_DURATION_SECONDS`,
//! `STORE_ERRORS_TOTAL` and `describe`; so do the attempts refused for an
//! invalid payload, `INVALID_PAYLOADS_TOTAL`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

#[cfg(feature = "metrics")]
mod facade;
mod observe;

#[cfg(all(feature = "metrics", feature = "outbox"))]
pub(crate) use facade::record_outbox;
#[cfg(feature = "metrics")]
pub use facade::{
    DECISIONS_TOTAL, INVALID_PAYLOADS_TOTAL, OUTBOX_LAG_SECONDS, OUTBOX_PUBLISHED_TOTAL,
    OUTBOX_REFUSED_TOTAL, OUTBOX_ROWS, STORE_DURATION_SECONDS, STORE_ERRORS_TOTAL, describe,
};
// The consumer span (router) declares these fields; its unit test checks the names.
#[cfg(test)]
pub(crate) use observe::{DECISION_FIELD, INVALID_PAYLOAD_FIELD};
pub(crate) use observe::{Timed, claim_mode, invalid_payload, timed, timed_now};

/// What a guard did with one delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Decision {
    /// The id was new; the handler ran, succeeded, and the id was remembered.
    Ran,
    /// The id was seen before; the handler did not run and the delivery is acked.
    Skipped,
    /// The handler ran and returned an error; the id stays unmarked.
    Failed,
    /// The message has no usable id; the handler ran without deduplication.
    FailOpen,
    /// The handler succeeded but remembering its id failed.
    MarkFailed,
    /// `seen` failed, so the handler did not run and the store error was returned.
    StoreFailed,
    /// Claim mode: another owner holds a live claim on the id, so the handler
    /// did not run and the delivery goes back without spending an attempt.
    Parked,
    /// Claim mode: the handler succeeded but its claim lapsed and was taken
    /// over before the commit, so the id was not marked and an error returned.
    LostClaim,
}

impl Decision {
    /// Every decision, in the order of [`GuardCounts`]' fields.
    pub const ALL: [Decision; 8] = [
        Decision::Ran,
        Decision::Skipped,
        Decision::Failed,
        Decision::FailOpen,
        Decision::MarkFailed,
        Decision::StoreFailed,
        Decision::Parked,
        Decision::LostClaim,
    ];
}

crate::names::named_variants! {
    /// The name used in tracing events: `ran`, `skipped`, `failed`, `fail_open`,
    /// `mark_failed`, `store_failed`, `parked`, `lost_claim`.
    ///
    /// ```
    /// assert_eq!(babel_idem::telemetry::metrics::Decision::FailOpen.as_str(), "fail_open");
    /// ```
    Decision {
        Ran => "ran",
        Skipped => "skipped",
        Failed => "failed",
        FailOpen => "fail_open",
        MarkFailed => "mark_failed",
        StoreFailed => "store_failed",
        Parked => "parked",
        LostClaim => "lost_claim",
    }
}

/// A snapshot of the process-wide decision counters; see [`counts`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct GuardCounts {
    /// Deliveries whose handler ran and was remembered.
    pub ran: u64,
    /// Duplicates skipped and acked.
    pub skipped: u64,
    /// Handler errors (the id stayed unmarked).
    pub failed: u64,
    /// Deliveries without an id, run without deduplication.
    pub fail_open: u64,
    /// Successful handlers whose id could not be remembered.
    pub mark_failed: u64,
    /// Deliveries refused because `seen` (or, in claim mode, `claim`) failed.
    pub store_failed: u64,
    /// Claim mode: deliveries put back because another owner was running the id.
    pub parked: u64,
    /// Claim mode: successful handlers whose claim was lost before the commit.
    pub lost_claim: u64,
}

impl GuardCounts {
    /// The counter of one decision.
    pub fn get(&self, decision: Decision) -> u64 {
        let mut counts = *self;
        *counts.counter_mut(decision)
    }

    /// How the counters moved since an `earlier` snapshot.
    pub fn since(&self, earlier: &GuardCounts) -> GuardCounts {
        let mut moved = *self;
        for decision in Decision::ALL {
            *moved.counter_mut(decision) -= earlier.get(decision);
        }
        moved
    }

    /// The counter of `decision`, the one field each decision has.
    fn counter_mut(&mut self, decision: Decision) -> &mut u64 {
        match decision {
            Decision::Ran => &mut self.ran,
            Decision::Skipped => &mut self.skipped,
            Decision::Failed => &mut self.failed,
            Decision::FailOpen => &mut self.fail_open,
            Decision::MarkFailed => &mut self.mark_failed,
            Decision::StoreFailed => &mut self.store_failed,
            Decision::Parked => &mut self.parked,
            Decision::LostClaim => &mut self.lost_claim,
        }
    }
}

/// Reads the process-wide counters of every guard's decisions.
///
/// ```
/// use babel_idem::{run_once, InMemoryStore, Envelope, StoreError};
/// use serde_json::json;
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let store = InMemoryStore::new();
/// let env = Envelope::new("urn:babel:orders:created", json!({}));
/// let before = babel_idem::telemetry::metrics::counts();
/// run_once(&store, &env, async { Ok::<(), StoreError>(()) }).await?;
/// run_once(&store, &env, async { Ok::<(), StoreError>(()) }).await?;
/// let moved = babel_idem::telemetry::metrics::counts().since(&before);
/// assert!(moved.ran >= 1 && moved.skipped >= 1);
/// # Ok::<(), StoreError>(())
/// # }).unwrap();
/// ```
pub fn counts() -> GuardCounts {
    let registry = registry();
    let mut sums = registry.retired;
    for counters in &registry.live {
        for (sum, counter) in sums.iter_mut().zip(&counters.0) {
            *sum += counter.load(Ordering::Relaxed);
        }
    }
    let mut snapshot = GuardCounts::default();
    for (decision, sum) in Decision::ALL.into_iter().zip(sums) {
        *snapshot.counter_mut(decision) = sum;
    }
    snapshot
}

const DECISIONS: usize = Decision::ALL.len();

/// One thread's counters. Only that thread writes them, with a plain load
/// and store rather than a read-modify-write, so counting costs what an
/// ordinary increment costs; [`counts`] reads them from any thread.
#[repr(align(128))]
#[derive(Default)]
struct ThreadCounters([AtomicU64; DECISIONS]);

/// The counters of live threads, and the sums of threads that have ended.
struct Registry {
    live: Vec<Arc<ThreadCounters>>,
    retired: [u64; DECISIONS],
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    live: Vec::new(),
    retired: [0; DECISIONS],
});

/// Nothing panics while the registry is held, so a poisoned lock still
/// guards consistent sums.
fn registry() -> MutexGuard<'static, Registry> {
    REGISTRY
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A thread's registration; on thread exit its sums move to `retired`.
struct Registration(Arc<ThreadCounters>);

impl Registration {
    fn new() -> Self {
        let counters = Arc::new(ThreadCounters::default());
        registry().live.push(counters.clone());
        Registration(counters)
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut registry = registry();
        registry.live.retain(|live| !Arc::ptr_eq(live, &self.0));
        for (retired, counter) in registry.retired.iter_mut().zip(&self.0.0) {
            *retired += counter.load(Ordering::Relaxed);
        }
    }
}

thread_local! {
    static MINE: Registration = Registration::new();
}

#[inline]
pub(crate) fn record(decision: Decision) {
    record_with(decision, || {});
}

/// [`record`], running `listened` first where a `tracing` listener takes
/// INFO: the guard's debug event, behind the same check of the level.
/// Forced inline, so the closure is not passed to a call.
#[inline(always)]
pub(crate) fn record_with(decision: Decision, listened: impl FnOnce()) {
    observe::decision(decision, listened);
    let counted = MINE.try_with(|mine| {
        let counter = &mine.0.0[decision as usize];
        counter.store(counter.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    });
    if counted.is_err() {
        count_retired(decision);
    }
}

/// The thread is shutting down and its counters are gone.
#[cold]
#[inline(never)]
fn count_retired(decision: Decision) {
    registry().retired[decision as usize] += 1;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_of_ended_threads_are_kept() {
        let before = counts();
        std::thread::spawn(|| {
            for _ in 0..3 {
                record(Decision::MarkFailed);
            }
        })
        .join()
        .unwrap();
        record(Decision::MarkFailed);
        let moved = counts().since(&before);
        assert_eq!(moved.mark_failed, 4);
        assert_eq!(moved.get(Decision::MarkFailed), 4);
        let live = registry().live.len();
        assert!(live >= 1, "this thread is still registered");
    }
}
