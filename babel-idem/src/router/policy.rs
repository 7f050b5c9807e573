//! The router's failure policies: what happens to an unknown URN, and how
//! long a retry waits.

use std::time::Duration;

/// What dispatch does with a valid envelope whose URN has no handler. The
/// four strategies of the Go SDK (`StrategyFail`, `StrategyDeadLetter`,
/// `StrategyDelete`, `StrategyRelease`), with the same meaning.
///
/// ```
/// use babel_idem::Router;
/// use babel_idem::router::UnknownUrnStrategy;
///
/// let router = Router::builder()
///     .on_unknown_urn(UnknownUrnStrategy::DeadLetter)
///     .build()?;
/// assert_eq!(router.unknown_urn_strategy(), UnknownUrnStrategy::DeadLetter);
/// # Ok::<(), babel_idem::router::RouterError>(())
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum UnknownUrnStrategy {
    /// Treat it as a failed delivery: [`Retry`](crate::router::Disposition::Retry)
    /// while attempts are left, then dead-letter with reason `unknown_urn`.
    /// Gives a deploy that adds the handler time to arrive. The default, as in
    /// the Go SDK.
    #[default]
    Fail,
    /// Dead-letter it at once with reason `unknown_urn`.
    DeadLetter,
    /// Ack and drop it ([`Disposition::Delete`](crate::router::Disposition::Delete)).
    Delete,
    /// Put it back unchanged ([`Disposition::Release`](crate::router::Disposition::Release))
    /// for another consumer to take.
    Release,
}

/// How long a retried message waits before it is handled again. Dispatch
/// only computes the delay ([`Retry::backoff`](crate::router::Retry::backoff)); the
/// broker loop applies it.
///
/// ```
/// use babel_idem::router::Backoff;
/// use std::time::Duration;
///
/// let backoff = Backoff::exponential(Duration::from_millis(100), Duration::from_secs(1));
/// assert_eq!(backoff.delay(1), Some(Duration::from_millis(100)));
/// assert_eq!(backoff.delay(2), Some(Duration::from_millis(200)));
/// assert_eq!(backoff.delay(9), Some(Duration::from_secs(1)));
/// assert_eq!(Backoff::None.delay(2), None);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Backoff {
    /// Republish at once (the BabelQueue SDKs' behaviour).
    #[default]
    None,
    /// The same delay before every retry.
    Fixed(Duration),
    /// `base`, then twice as long on every further attempt, never more than `max`.
    Exponential {
        /// The delay before the first retry.
        base: Duration,
        /// The longest delay.
        max: Duration,
    },
}

impl Backoff {
    /// A fixed delay.
    pub fn fixed(delay: Duration) -> Self {
        Backoff::Fixed(delay)
    }

    /// A doubling delay from `base`, capped at `max`.
    pub fn exponential(base: Duration, max: Duration) -> Self {
        Backoff::Exponential { base, max }
    }

    /// The delay before the retry that follows failed attempt number
    /// `attempts` (1 for the first failure).
    pub fn delay(&self, attempts: u64) -> Option<Duration> {
        match *self {
            Backoff::None => None,
            Backoff::Fixed(delay) => Some(delay),
            Backoff::Exponential { base, max } => {
                // 2^(attempts - 1), saturating: a large count reaches `max`,
                // never an overflow.
                let doublings = attempts.saturating_sub(1).min(u64::from(u32::MAX)) as u32;
                let factor = 2u32.checked_pow(doublings).unwrap_or(u32::MAX);
                Some(base.saturating_mul(factor).min(max))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exponential_backoff_saturates_at_max_instead_of_overflowing() {
        let backoff = Backoff::exponential(Duration::from_secs(1), Duration::from_secs(60));
        assert_eq!(backoff.delay(0), Some(Duration::from_secs(1)));
        assert_eq!(backoff.delay(3), Some(Duration::from_secs(4)));
        assert_eq!(backoff.delay(40), Some(Duration::from_secs(60)));
        assert_eq!(backoff.delay(u64::MAX), Some(Duration::from_secs(60)));
    }

    #[test]
    fn fixed_backoff_is_the_same_every_time() {
        let backoff = Backoff::fixed(Duration::from_millis(5));
        assert_eq!(backoff.delay(1), backoff.delay(7));
    }
}
