//! Process-wide counters of what guards decided, cheap enough for every delivery.
//!
//! Each thread adds to its own cache-line-padded stripe, so two workers
//! counting at once never fight over one atomic; a read sums the stripes.

use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

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
}

impl Decision {
    /// Every decision, in the order of [`GuardCounts`]' fields.
    pub const ALL: [Decision; 6] = [
        Decision::Ran,
        Decision::Skipped,
        Decision::Failed,
        Decision::FailOpen,
        Decision::MarkFailed,
        Decision::StoreFailed,
    ];

    /// The name used in tracing events: `ran`, `skipped`, `failed`, `fail_open`,
    /// `mark_failed`, `store_failed`.
    ///
    /// ```
    /// assert_eq!(babel_idem::Decision::FailOpen.as_str(), "fail_open");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Ran => "ran",
            Decision::Skipped => "skipped",
            Decision::Failed => "failed",
            Decision::FailOpen => "fail_open",
            Decision::MarkFailed => "mark_failed",
            Decision::StoreFailed => "store_failed",
        }
    }
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
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
    /// Deliveries refused because `seen` failed.
    pub store_failed: u64,
}

impl GuardCounts {
    /// The counter of one decision.
    pub fn get(&self, decision: Decision) -> u64 {
        match decision {
            Decision::Ran => self.ran,
            Decision::Skipped => self.skipped,
            Decision::Failed => self.failed,
            Decision::FailOpen => self.fail_open,
            Decision::MarkFailed => self.mark_failed,
            Decision::StoreFailed => self.store_failed,
        }
    }

    /// How the counters moved since an `earlier` snapshot.
    pub fn since(&self, earlier: &GuardCounts) -> GuardCounts {
        GuardCounts {
            ran: self.ran - earlier.ran,
            skipped: self.skipped - earlier.skipped,
            failed: self.failed - earlier.failed,
            fail_open: self.fail_open - earlier.fail_open,
            mark_failed: self.mark_failed - earlier.mark_failed,
            store_failed: self.store_failed - earlier.store_failed,
        }
    }
}

/// Reads the process-wide counters of every guard's decisions.
///
/// ```
/// use babel_idem::{guard, InMemoryStore, Envelope, StoreError};
/// use serde_json::json;
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let store = InMemoryStore::new();
/// let env = Envelope::new("urn:babel:orders:created", json!({}));
/// let before = babel_idem::metrics::counts();
/// guard(&store, &env, async { Ok::<(), StoreError>(()) }).await?;
/// guard(&store, &env, async { Ok::<(), StoreError>(()) }).await?;
/// let moved = babel_idem::metrics::counts().since(&before);
/// assert!(moved.ran >= 1 && moved.skipped >= 1);
/// # Ok::<(), StoreError>(())
/// # }).unwrap();
/// ```
pub fn counts() -> GuardCounts {
    let mut sums = [0u64; Decision::ALL.len()];
    for stripe in &STRIPES {
        for (sum, counter) in sums.iter_mut().zip(&stripe.0) {
            *sum += counter.load(Ordering::Relaxed);
        }
    }
    let [ran, skipped, failed, fail_open, mark_failed, store_failed] = sums;
    GuardCounts {
        ran,
        skipped,
        failed,
        fail_open,
        mark_failed,
        store_failed,
    }
}

const STRIPE_COUNT: usize = 16;

#[repr(align(128))]
struct Stripe([AtomicU64; Decision::ALL.len()]);

static STRIPES: [Stripe; STRIPE_COUNT] =
    [const { Stripe([const { AtomicU64::new(0) }; Decision::ALL.len()]) }; STRIPE_COUNT];

static NEXT_STRIPE: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static MY_STRIPE: usize = NEXT_STRIPE.fetch_add(1, Ordering::Relaxed) % STRIPE_COUNT;
}

#[inline]
pub(crate) fn record(decision: Decision) {
    let stripe = MY_STRIPE.try_with(|stripe| *stripe).unwrap_or(0);
    STRIPES[stripe].0[decision as usize].fetch_add(1, Ordering::Relaxed);
}
