//! [`Guarded`]: what a guard did with one delivery, as a value.

use std::time::Duration;

/// What a guard did with a delivery: ran its handler, skipped it as a
/// duplicate, parked it behind another owner's claim, saw its handler fail,
/// or could not ask its store.
///
/// The guard reports it in the delivery's context, where the delivery's
/// dispatcher (`Router::dispatch`) reads it once the handler has returned,
/// whatever the handler's error type kept of the guard's error; and a tower
/// service behind the guard's layer answers with it (`Ran(response)` or
/// `Skipped`; the failures come back as its errors).
///
/// ```
/// use babel_idem::guard::Guarded;
/// use std::time::Duration;
///
/// let parked: Guarded = Guarded::Parked { retry_after: Some(Duration::from_millis(40)) };
/// assert!(parked.is_parked());
/// assert_eq!(parked.retry_after(), Some(Duration::from_millis(40)));
/// assert_eq!(Guarded::Ran(7).ran(), Some(7));
/// assert!(Guarded::<u8>::Skipped.is_skipped());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Guarded<R = ()> {
    /// The guard ran the handler (a new id, or a message without an id);
    /// `R` is what the handler gave back, `()` where it gives nothing.
    Ran(R),
    /// The id was done already: the handler did not run.
    Skipped,
    /// Another owner held the id's claim (claim mode): the handler did not
    /// run, and the delivery waits for `retry_after` (where the store knew
    /// how long the other owner's lease had left) without spending an
    /// attempt.
    Parked {
        /// How long the other owner's lease had left, where the store knew.
        retry_after: Option<Duration>,
    },
    /// The handler failed or panicked: its id stays unmarked.
    Failed,
    /// The guard could not ask its store whether to run (`seen`, `claim`
    /// or the transactional mark failed): the handler did not run, and the
    /// delivery is an outage rather than an attempt.
    StoreFailed,
}

impl<R> Guarded<R> {
    /// The handler's response, `None` unless the handler ran.
    pub fn ran(self) -> Option<R> {
        match self {
            Guarded::Ran(response) => Some(response),
            _ => None,
        }
    }

    /// Whether the delivery was skipped as a duplicate.
    pub fn is_skipped(&self) -> bool {
        matches!(self, Guarded::Skipped)
    }

    /// Whether another owner held the id's claim.
    pub fn is_parked(&self) -> bool {
        matches!(self, Guarded::Parked { .. })
    }

    /// How long a parked delivery waits, where the store knew; `None` for
    /// any other outcome.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Guarded::Parked { retry_after } => *retry_after,
            _ => None,
        }
    }
}
