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
//! The record lives in the delivery's context
//! ([`guard::Guarded`](crate::guard::Guarded) outcomes), which dispatch
//! watches for the length of each poll of the handler's future and puts
//! back as it was afterwards. Every outcome recorded while it is watched
//! replaces the last, so it holds the *last* claim decision or store
//! failure of the delivery's own future:
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
//! What a parked delivery becomes is decided here too ([`parked_delay`],
//! [`release`]).

use std::time::Duration;

use super::disposition::{DispatchError, Disposition, ReleaseReason};
use crate::guard::outcome::Guarded;

/// How long a parked delivery waits when its store cannot say how long the
/// other owner's lease has left.
const DEFAULT_PARKED_DELAY: Duration = Duration::from_secs(1);

/// How long to hold a delivery back whose handler failed with `error`
/// after `last`, its guards' last recorded outcome; `None` when the failure
/// is an ordinary one (it spends an attempt). A panic is always ordinary:
/// the handler did not return the parked outcome, it crashed.
///
/// The delay is the other owner's lease time left, but never more than
/// `max`: a foreign claim's TTL (the PHP SDK's layout) says when it expires,
/// not when its owner finishes, and a delivery that waited the whole TTL
/// would sit behind a claim long done.
pub(super) fn parked_delay(
    last: Option<Guarded>,
    error: &DispatchError,
    max: Duration,
) -> Option<Duration> {
    match (last, error) {
        (Some(Guarded::Parked { retry_after }), DispatchError::Handler(_)) => {
            Some(retry_after.unwrap_or(DEFAULT_PARKED_DELAY).min(max))
        }
        _ => None,
    }
}

/// Whether a handler that failed with `error` after `last` failed because
/// its guard's store could not answer: an outage, not an attempt. A panic
/// is always the handler's own failure.
pub(super) fn store_failed(last: Option<Guarded>, error: &DispatchError) -> bool {
    matches!(
        (last, error),
        (Some(Guarded::StoreFailed), DispatchError::Handler(_))
    )
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::router::HandlerError;

    const PARKED: Option<Guarded> = Some(Guarded::Parked {
        retry_after: Some(Duration::from_millis(40)),
    });

    /// A handler's returned error, and a panic.
    fn failures(text: &str) -> (DispatchError, DispatchError) {
        let returned =
            DispatchError::Handler(HandlerError::new(std::io::Error::other(text.to_owned())));
        let panicked = DispatchError::Panicked {
            message: "boom".into(),
        };
        (returned, panicked)
    }

    const MAX: Duration = Duration::from_secs(5);

    #[test]
    fn only_a_returned_error_after_a_park_is_parked() {
        let (returned, panicked) = failures("dropped its source");
        assert_eq!(
            parked_delay(PARKED, &returned, MAX),
            Some(Duration::from_millis(40))
        );
        assert_eq!(
            parked_delay(Some(Guarded::Parked { retry_after: None }), &returned, MAX),
            Some(DEFAULT_PARKED_DELAY)
        );
        assert_eq!(parked_delay(PARKED, &panicked, MAX), None);
        assert_eq!(parked_delay(Some(Guarded::Ran(())), &returned, MAX), None);
        assert_eq!(parked_delay(None, &returned, MAX), None);
    }

    #[test]
    fn a_long_lease_left_is_cut_to_the_bound() {
        let (returned, _) = failures("held for an hour");
        let hour = Some(Guarded::Parked {
            retry_after: Some(Duration::from_secs(3_600)),
        });
        assert_eq!(parked_delay(hour, &returned, MAX), Some(MAX));
        assert_eq!(
            parked_delay(hour, &returned, Duration::ZERO),
            Some(Duration::ZERO)
        );
    }

    #[test]
    fn only_a_returned_error_after_a_store_failure_is_an_outage() {
        let (returned, panicked) = failures("wrapped the store error");
        let failed = Some(Guarded::StoreFailed);
        assert!(store_failed(failed, &returned));
        assert!(!store_failed(failed, &panicked));
        assert!(!store_failed(None, &returned));
        assert!(!store_failed(PARKED, &returned));
        assert_eq!(parked_delay(failed, &returned, MAX), None);
    }
}
