//! The router's failure policies: what happens to an unknown URN, and how
//! long a retry waits.

use std::hash::{Hash, Hasher};
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
/// [`Backoff::geometric`] is the BabelQueue family's retry backoff
/// (ADR-0034 §9, the Python SDK's `retry_delay`): before the retry that
/// follows failed attempt `n`, `d(n) = min(max, base × multiplier^(n−1))`,
/// no cap when `max` is zero, and with full jitter a delay drawn uniformly
/// from `[0, d(n)]`. Its defaults are the Python SDK's (`retry_backoff_multiplier
/// = 1`, `retry_backoff_max = 0`, `retry_jitter = "none"`): a constant `base`.
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
///
/// // The family's form: 0.5 s × 1.5^(n−1), at most 2 s.
/// let family = Backoff::geometric(Duration::from_millis(500))
///     .with_multiplier(1.5)
///     .with_max(Duration::from_secs(2));
/// assert_eq!(family.delay(1), Some(Duration::from_millis(500)));
/// assert_eq!(family.delay(3), Some(Duration::from_millis(1125)));
/// assert_eq!(family.delay(9), Some(Duration::from_secs(2)));
///
/// // Full jitter: anywhere in [0, d(n)], drawn anew for every retry.
/// let jittered = family.with_full_jitter();
/// assert!(jittered.delay(9).unwrap() <= Duration::from_secs(2));
/// assert_eq!(jittered.ceiling(9), Some(Duration::from_secs(2)));
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub enum Backoff {
    /// Republish at once (the BabelQueue SDKs' default behaviour).
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
    /// The family's backoff: `min(max, base × multiplier^(n−1))` before the
    /// retry after failed attempt `n`, then `jitter`. Made with
    /// [`Backoff::geometric`]; [`RouterBuilder::build`](crate::router::RouterBuilder::build)
    /// refuses a `multiplier` that is negative or not finite.
    Geometric {
        /// The delay before the first retry (`retry_backoff`).
        base: Duration,
        /// The factor between two consecutive delays (`retry_backoff_multiplier`).
        multiplier: f64,
        /// The longest delay; `None` for no cap (`retry_backoff_max = 0`).
        max: Option<Duration>,
        /// How the delay is drawn from `d(n)` (`retry_jitter`).
        jitter: Jitter,
    },
}

/// How a [`Backoff::Geometric`] delay is drawn from its ceiling `d(n)`: the
/// family's `retry_jitter` values.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Jitter {
    /// `d(n)` itself (`"none"`, the default).
    #[default]
    None,
    /// Uniformly in `[0, d(n)]` (`"full"`): workers that failed together
    /// do not come back together.
    Full,
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

    /// The family's backoff from `base`, with the Python SDK's defaults:
    /// multiplier 1, no cap, no jitter (so `base` before every retry until
    /// [`with_multiplier`](Self::with_multiplier) says otherwise).
    ///
    /// ```
    /// use babel_idem::router::Backoff;
    /// use std::time::Duration;
    ///
    /// let backoff = Backoff::geometric(Duration::from_secs(1)).with_multiplier(3.0);
    /// assert_eq!(backoff.delay(3), Some(Duration::from_secs(9)));
    /// ```
    pub fn geometric(base: Duration) -> Self {
        Backoff::Geometric {
            base,
            multiplier: 1.0,
            max: None,
            jitter: Jitter::None,
        }
    }

    /// This backoff in the family's form with `multiplier` between two
    /// consecutive delays. [`Fixed`](Self::Fixed) and
    /// [`Exponential`](Self::Exponential) keep their base and cap;
    /// [`None`](Self::None) starts from a zero base.
    pub fn with_multiplier(self, multiplier: f64) -> Self {
        match self.into_geometric() {
            Backoff::Geometric {
                base, max, jitter, ..
            } => Backoff::Geometric {
                base,
                multiplier,
                max,
                jitter,
            },
            other => other,
        }
    }

    /// This backoff in the family's form, never longer than `max`;
    /// `Duration::ZERO` removes the cap, as the family's
    /// `retry_backoff_max = 0` does.
    pub fn with_max(self, max: Duration) -> Self {
        match self.into_geometric() {
            Backoff::Geometric {
                base,
                multiplier,
                jitter,
                ..
            } => Backoff::Geometric {
                base,
                multiplier,
                max: (!max.is_zero()).then_some(max),
                jitter,
            },
            other => other,
        }
    }

    /// This backoff in the family's form, with full jitter: each delay is
    /// drawn uniformly from `[0, d(n)]`, from a random stream of the
    /// calling thread's own (seeded from the operating system).
    pub fn with_full_jitter(self) -> Self {
        match self.into_geometric() {
            Backoff::Geometric {
                base,
                multiplier,
                max,
                ..
            } => Backoff::Geometric {
                base,
                multiplier,
                max,
                jitter: Jitter::Full,
            },
            other => other,
        }
    }

    /// The same delays in the [`Geometric`](Self::Geometric) form.
    fn into_geometric(self) -> Self {
        match self {
            Backoff::None => Backoff::geometric(Duration::ZERO),
            Backoff::Fixed(delay) => Backoff::geometric(delay),
            Backoff::Exponential { base, max } => Backoff::Geometric {
                base,
                multiplier: 2.0,
                max: Some(max),
                jitter: Jitter::None,
            },
            geometric @ Backoff::Geometric { .. } => geometric,
        }
    }

    /// The delay before the retry that follows failed attempt number
    /// `attempts` (1 for the first failure): [`ceiling`](Self::ceiling),
    /// or with [`Jitter::Full`] a delay drawn uniformly from `[0, ceiling]`.
    pub fn delay(&self, attempts: u64) -> Option<Duration> {
        let ceiling = self.ceiling(attempts)?;
        match *self {
            Backoff::Geometric {
                jitter: Jitter::Full,
                ..
            } => Some(ceiling.mul_f64(unit_interval())),
            _ => Some(ceiling),
        }
    }

    /// The delay before the retry after failed attempt `attempts` without
    /// jitter: `d(n)`, the longest [`delay`](Self::delay) can answer.
    pub fn ceiling(&self, attempts: u64) -> Option<Duration> {
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
            Backoff::Geometric {
                base,
                multiplier,
                max,
                ..
            } => Some(geometric_delay(base, multiplier, max, attempts)),
        }
    }

    /// Why this backoff cannot be used, if it cannot: a multiplier that
    /// is negative or not a finite number.
    pub(crate) fn invalid_multiplier(&self) -> Option<f64> {
        match *self {
            Backoff::Geometric { multiplier, .. }
                if !(multiplier.is_finite() && multiplier >= 0.0) =>
            {
                Some(multiplier)
            }
            _ => None,
        }
    }
}

/// `min(max, base × multiplier^(n−1))` computed in seconds as the Python
/// SDK computes it (`float(base) * float(multiplier) ** max(n - 1, 0)`), so
/// the two agree to the nanosecond. Never panics: a product too large for a
/// `Duration` is `max` (or `Duration::MAX` uncapped), and one that is not a
/// number (a multiplier `build` would refuse) is zero.
fn geometric_delay(
    base: Duration,
    multiplier: f64,
    max: Option<Duration>,
    attempts: u64,
) -> Duration {
    let exponent = attempts.saturating_sub(1) as f64;
    let seconds = base.as_secs_f64() * multiplier.powf(exponent);
    let delay = if seconds.is_nan() || seconds <= 0.0 {
        Duration::ZERO
    } else {
        Duration::try_from_secs_f64(seconds).unwrap_or(Duration::MAX)
    };
    match max {
        Some(max) => delay.min(max),
        None => delay,
    }
}

/// A number drawn uniformly from `[0, 1)`, from the calling thread's own
/// stream: the random source claim tokens are drawn from
/// ([`ClaimToken::random`](crate::store::ClaimToken::random), seeded once
/// per thread from the operating system), so two workers draw different
/// sequences.
fn unit_interval() -> f64 {
    // The low half is a scrambled counter mixed with the thread's salt.
    let bits = crate::store::ClaimToken::random().as_u128() as u64;
    // The top 53 bits: every value is an exact `f64` below 1.
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

/// Equal when they answer the same delays: the multipliers compare by
/// their bits, so that `Eq` and `Hash` hold (a NaN equals itself).
impl PartialEq for Backoff {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}

impl Eq for Backoff {}

impl Hash for Backoff {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.key().hash(state);
    }
}

impl Backoff {
    /// What `Eq` and `Hash` compare: the variant and its fields, the
    /// multiplier as bits.
    fn key(&self) -> (u8, Duration, u64, Option<Duration>, Jitter) {
        match *self {
            Backoff::None => (0, Duration::ZERO, 0, None, Jitter::None),
            Backoff::Fixed(delay) => (1, delay, 0, None, Jitter::None),
            Backoff::Exponential { base, max } => (2, base, 0, Some(max), Jitter::None),
            Backoff::Geometric {
                base,
                multiplier,
                max,
                jitter,
            } => (3, base, multiplier.to_bits(), max, jitter),
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
    fn a_geometric_delay_too_large_for_a_duration_saturates() {
        let uncapped = Backoff::geometric(Duration::from_secs(1)).with_multiplier(10.0);
        assert_eq!(uncapped.delay(u64::MAX), Some(Duration::MAX));
        let capped = uncapped.with_max(Duration::from_secs(60));
        assert_eq!(capped.delay(400), Some(Duration::from_secs(60)));
        let nan = Backoff::geometric(Duration::from_secs(1)).with_multiplier(f64::NAN);
        assert_eq!(nan.delay(3), Some(Duration::ZERO));
        assert_eq!(nan.invalid_multiplier().map(f64::is_nan), Some(true));
    }

    #[test]
    fn a_zero_max_means_no_cap_as_in_the_family() {
        let backoff = Backoff::geometric(Duration::from_secs(1))
            .with_multiplier(2.0)
            .with_max(Duration::ZERO);
        assert_eq!(backoff.delay(11), Some(Duration::from_secs(1024)));
    }

    #[test]
    fn the_older_forms_keep_their_delays_in_the_family_form() {
        let exponential = Backoff::exponential(Duration::from_millis(100), Duration::from_secs(1));
        let family = exponential.with_multiplier(2.0);
        for n in 0..12 {
            assert_eq!(exponential.delay(n), family.delay(n), "attempt {n}");
        }
        assert_eq!(
            Backoff::fixed(Duration::from_secs(3))
                .with_max(Duration::ZERO)
                .delay(5),
            Some(Duration::from_secs(3))
        );
    }

    #[test]
    fn fixed_backoff_is_the_same_every_time() {
        let backoff = Backoff::fixed(Duration::from_millis(5));
        assert_eq!(backoff.delay(1), backoff.delay(7));
    }
}
