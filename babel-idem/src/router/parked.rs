//! A parked claim as the delivery's own outcome, not as an error to search.
//!
//! A claim-mode guard that finds its id held by another owner does not run
//! the handler and returns a parked [`StoreError`](crate::store::StoreError)
//! through the handler's error type, which may keep it, wrap it or drop it.
//! So the guard also records its claim decision in the delivery's context,
//! and [`Router::dispatch`](super::Router::dispatch) reads that record once
//! the handler has returned: whatever the error type does with the parked
//! error, the delivery is released as parked.
//!
//! The context is a per-thread slot that dispatch makes current for the
//! length of each poll of the handler's future ([`watching`]) and puts back
//! as it was afterwards, like `tracing`'s `Instrumented`: it follows the
//! handler from thread to thread and needs no particular executor. Every
//! claim decision made while it is current overwrites it, so it holds the
//! *last* claim decision made in the delivery's own future:
//!
//! - a guard nested in a claimed handler parks and its error is returned:
//!   the outer guard decided earlier, the park is last, the delivery is
//!   released as parked;
//! - a handler that calls a parked guard again until it runs: the last
//!   decision is not a park, so a failure after it is an ordinary failure;
//! - a handler that swallows a park and then fails for another reason, with
//!   no claim decided in between: the park is last, and the delivery is
//!   released as parked (another owner is running part of it);
//! - a handler that succeeds is acked, whatever was parked inside it;
//! - a guard that runs outside any dispatch (a loop of one's own, a tower
//!   service, a task the handler spawns) records nothing: its caller reads
//!   the error it returns
//!   ([`StoreError::is_parked`](crate::store::StoreError::is_parked));
//! - a dispatch nested in a handler keeps its own record and puts the outer
//!   delivery's back when its poll ends.
//!
//! What a parked delivery becomes is decided here too ([`LastClaim::parked_delay`],
//! [`release`]).

use std::cell::Cell;
use std::time::Duration;

use super::disposition::{DispatchError, Disposition, ReleaseReason};

/// How long a parked delivery waits when its store cannot say how long the
/// other owner's lease has left.
const DEFAULT_PARKED_DELAY: Duration = Duration::from_secs(1);

/// The last claim decision a guard made in one delivery's future.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum LastClaim {
    /// No claim was decided, or the last one did not park (the claim was
    /// won, the id was done, the store failed, the message had no id).
    #[default]
    NotParked,
    /// Another owner held the id's claim: the handler did not run.
    Parked {
        /// How long the other owner's lease had left, where the store knew.
        retry_after: Option<Duration>,
    },
    /// A guard could not ask its store whether to run (`seen`, `claim` or
    /// the transactional mark failed): the handler did not run. Recorded by
    /// every mode, so an outage is told apart from a handler's failure
    /// whatever the error type keeps of the store's error.
    StoreFailed,
}

impl LastClaim {
    /// How long to hold a delivery back whose handler failed with `error`
    /// after this claim decision; `None` when the failure is an ordinary one
    /// (it spends an attempt). A panic is always ordinary: the handler did
    /// not return the parked outcome, it crashed.
    pub(super) fn parked_delay(self, error: &DispatchError) -> Option<Duration> {
        match (self, error) {
            (LastClaim::Parked { retry_after }, DispatchError::Handler(_)) => {
                Some(retry_after.unwrap_or(DEFAULT_PARKED_DELAY))
            }
            _ => None,
        }
    }

    /// Whether a handler that failed with `error` after this decision
    /// failed because its guard's store could not answer: an outage, not
    /// an attempt. A panic is always the handler's own failure.
    pub(super) fn store_failed(self, error: &DispatchError) -> bool {
        matches!(
            (self, error),
            (LastClaim::StoreFailed, DispatchError::Handler(_))
        )
    }
}

/// A delivery whose guard's store failed goes back unchanged, with no
/// attempt counted: an outage, which the consumer waits out.
pub(super) fn store_unavailable(urn: String) -> Disposition {
    tracing::debug!(
        urn,
        "babel-idem: the guard's store failed, releasing the delivery"
    );
    Disposition::Release {
        urn,
        reason: ReleaseReason::StoreUnavailable,
        delay: None,
    }
}

/// A parked delivery goes back unchanged after `delay`: it was not attempted.
pub(super) fn release(urn: String, delay: Duration) -> Disposition {
    tracing::debug!(urn, ?delay, "babel-idem: delivery parked, releasing it");
    Disposition::Release {
        urn,
        reason: ReleaseReason::Parked,
        delay: Some(delay),
    }
}

/// What this thread's slot holds.
#[derive(Debug, Clone, Copy)]
enum Slot {
    /// No dispatch is polling a handler here: claim decisions go unrecorded.
    Unwatched,
    /// A dispatch is polling its handler here; its last claim decision.
    Watched(LastClaim),
}

thread_local! {
    static SLOT: Cell<Slot> = const { Cell::new(Slot::Unwatched) };
}

/// Records a claim-mode guard's decision for the delivery being polled on
/// this thread, if any. Every decision is recorded, not only a park: a
/// later decision replaces an earlier park.
pub(crate) fn record(decision: LastClaim) {
    // `try_with`: a guard polled while its thread is torn down records
    // nothing rather than panicking.
    let _ = SLOT.try_with(|slot| {
        if let Slot::Watched(_) = slot.get() {
            slot.set(Slot::Watched(decision));
        }
    });
}

/// Runs `poll` (one poll of a delivery's handler) with `last` as the current
/// record, then stores what it became back in `last` and puts the thread's
/// previous slot back, also when `poll` unwinds.
pub(super) fn watching<T>(last: &mut LastClaim, poll: impl FnOnce() -> T) -> T {
    struct Restore<'a> {
        previous: Slot,
        last: &'a mut LastClaim,
    }
    impl Drop for Restore<'_> {
        fn drop(&mut self) {
            let _ = SLOT.try_with(|slot| {
                if let Slot::Watched(last) = slot.replace(self.previous) {
                    *self.last = last;
                }
            });
        }
    }
    let previous = SLOT
        .try_with(|slot| slot.replace(Slot::Watched(*last)))
        .unwrap_or(Slot::Unwatched);
    let _restore = Restore { previous, last };
    poll()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::router::HandlerError;

    const PARKED: LastClaim = LastClaim::Parked {
        retry_after: Some(Duration::from_millis(40)),
    };

    fn unwatched() -> bool {
        matches!(SLOT.with(Cell::get), Slot::Unwatched)
    }

    #[test]
    fn a_decision_outside_any_delivery_is_not_recorded() {
        record(PARKED);
        assert!(unwatched());
    }

    #[test]
    fn the_last_decision_of_a_delivery_is_kept_across_polls() {
        let mut last = LastClaim::NotParked;
        watching(&mut last, || record(PARKED));
        assert_eq!(last, PARKED);
        assert!(unwatched(), "the slot is current only during a poll");
        watching(&mut last, || {});
        assert_eq!(last, PARKED, "a poll that decides nothing keeps the park");
        watching(&mut last, || record(LastClaim::NotParked));
        assert_eq!(
            last,
            LastClaim::NotParked,
            "a later claim replaces the park"
        );
    }

    #[test]
    fn a_nested_delivery_keeps_its_own_record_even_when_it_unwinds() {
        let unknown = LastClaim::Parked { retry_after: None };
        let mut outer = LastClaim::NotParked;
        let mut inner = LastClaim::NotParked;
        watching(&mut outer, || {
            record(PARKED);
            watching(&mut inner, || record(LastClaim::NotParked));
            let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                watching(&mut inner, || {
                    record(unknown);
                    std::panic::resume_unwind(Box::new("handler"));
                })
            }));
            assert!(unwound.is_err());
        });
        assert_eq!(inner, unknown, "recorded before the unwind");
        assert_eq!(outer, PARKED, "the inner decisions stayed inner");
        assert!(unwatched(), "the slot was put back");
    }

    #[test]
    fn only_a_returned_error_after_a_park_is_parked() {
        let returned = DispatchError::Handler(HandlerError::new(std::io::Error::other(
            "dropped its source",
        )));
        let panicked = DispatchError::Panicked {
            message: "boom".into(),
        };
        assert_eq!(
            PARKED.parked_delay(&returned),
            Some(Duration::from_millis(40))
        );
        assert_eq!(
            LastClaim::Parked { retry_after: None }.parked_delay(&returned),
            Some(DEFAULT_PARKED_DELAY)
        );
        assert_eq!(PARKED.parked_delay(&panicked), None);
        assert_eq!(LastClaim::NotParked.parked_delay(&returned), None);
    }

    #[test]
    fn only_a_returned_error_after_a_store_failure_is_an_outage() {
        let returned = DispatchError::Handler(HandlerError::new(std::io::Error::other(
            "wrapped the store error",
        )));
        let panicked = DispatchError::Panicked {
            message: "boom".into(),
        };
        assert!(LastClaim::StoreFailed.store_failed(&returned));
        assert!(!LastClaim::StoreFailed.store_failed(&panicked));
        assert!(!LastClaim::NotParked.store_failed(&returned));
        assert!(!PARKED.store_failed(&returned));
        assert_eq!(LastClaim::StoreFailed.parked_delay(&returned), None);
    }
}
