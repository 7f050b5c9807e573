//! Retry tiers: the topics `<topic>.retry.<n>` a delayed or retried record
//! waits on until the re-injector moves it back to its work topic.
//!
//! Tier `n` (1-based) holds records for its own delay. A retry goes to the
//! tier picked by the attempts made before it, `n = min(attempts, N-1) +
//! 1` of the `N` configured (it stays on the last once they run out); a
//! delayed publish goes to the smallest tier whose delay covers the delay
//! asked for.

use std::time::Duration;

/// The family's recommended tiers: 5 s, 30 s, 5 min, 30 min.
pub const DEFAULT_RETRY_TIERS: [Duration; 4] = [
    Duration::from_secs(5),
    Duration::from_secs(30),
    Duration::from_secs(300),
    Duration::from_secs(1800),
];

/// Why a list of tiers cannot be used.
///
/// ```
/// use babel_idem::transport::kafka::{RetryTiers, TierError};
/// use std::time::Duration;
///
/// let error = RetryTiers::new([Duration::from_secs(30), Duration::from_secs(5)]).unwrap_err();
/// assert!(matches!(error, TierError::NotAscending { .. }));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TierError {
    /// A tier of less than one millisecond.
    #[error("a retry tier is at least 1 ms")]
    Zero,
    /// A tier no longer than the one before it.
    #[error("retry tiers must be strictly ascending: {later:?} follows {earlier:?}")]
    NotAscending {
        /// The tier before.
        earlier: Duration,
        /// The tier that does not exceed it.
        later: Duration,
    },
    /// A delay longer than the last tier: nothing can hold it.
    #[error("a delay of {asked:?} exceeds the largest retry tier ({largest:?})")]
    TooLong {
        /// The delay asked for.
        asked: Duration,
        /// The largest tier.
        largest: Duration,
    },
    /// No tiers are configured.
    #[error("no retry tiers are configured")]
    None,
}

/// The retry tiers of a Kafka binding: positive, strictly ascending delays,
/// whole milliseconds. The producer and the re-injector must use the same
/// list (tier `n`'s delay is the `n`-th).
///
/// ```
/// use babel_idem::transport::kafka::RetryTiers;
/// use std::time::Duration;
///
/// let tiers = RetryTiers::recommended();
/// assert_eq!(tiers.topic("orders", 2), "orders.retry.2");
/// // A first retry (no attempts before) waits on tier 1; later ones climb.
/// assert_eq!(tiers.for_retry(0), (1, Duration::from_secs(5)));
/// assert_eq!(tiers.for_retry(9), (4, Duration::from_secs(1800)));
/// // A delay goes to the smallest tier that covers it.
/// assert_eq!(tiers.for_delay(Duration::from_secs(6)).unwrap().0, 2);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RetryTiers {
    tiers: Vec<Duration>,
}

impl RetryTiers {
    /// Tiers of the given delays, checked: each at least 1 ms, strictly
    /// ascending (sub-millisecond parts are dropped, as the `bq-delay`
    /// header carries milliseconds).
    pub fn new(tiers: impl IntoIterator<Item = Duration>) -> Result<Self, TierError> {
        let mut checked: Vec<Duration> = Vec::new();
        for tier in tiers {
            let tier = Duration::from_millis(millis(tier));
            if tier.is_zero() {
                return Err(TierError::Zero);
            }
            if let Some(&earlier) = checked.last()
                && tier <= earlier
            {
                return Err(TierError::NotAscending {
                    earlier,
                    later: tier,
                });
            }
            checked.push(tier);
        }
        Ok(RetryTiers { tiers: checked })
    }

    /// [`DEFAULT_RETRY_TIERS`]: 5 s, 30 s, 5 min, 30 min.
    pub fn recommended() -> Self {
        RetryTiers {
            tiers: DEFAULT_RETRY_TIERS.to_vec(),
        }
    }

    /// No tiers: a retry goes straight back to the work topic.
    pub fn none() -> Self {
        RetryTiers::default()
    }

    /// Whether no tier is configured.
    pub fn is_empty(&self) -> bool {
        self.tiers.is_empty()
    }

    /// The delays, tier 1 first.
    pub fn delays(&self) -> &[Duration] {
        &self.tiers
    }

    /// The topic of tier `n` (1-based) of `work_topic`: `<work_topic>.retry.<n>`.
    pub fn topic(&self, work_topic: &str, n: usize) -> String {
        format!("{work_topic}.retry.{n}")
    }

    /// The tier topics of `work_topic`, tier 1 first.
    pub fn topics(&self, work_topic: &str) -> Vec<String> {
        (1..=self.tiers.len())
            .map(|n| self.topic(work_topic, n))
            .collect()
    }

    /// The tier (`n`, its delay) a retry waits on, from the attempts made
    /// before it: `n = min(attempts, N-1) + 1`. Panics on no tiers: ask
    /// [`is_empty`](Self::is_empty) first.
    pub fn for_retry(&self, attempts_before: u64) -> (usize, Duration) {
        let last = self.tiers.len() - 1;
        let index = usize::try_from(attempts_before).map_or(last, |a| a.min(last));
        (index + 1, self.tiers[index])
    }

    /// The smallest tier (`n`, its delay) whose delay covers `delay`.
    pub fn for_delay(&self, delay: Duration) -> Result<(usize, Duration), TierError> {
        let largest = *self.tiers.last().ok_or(TierError::None)?;
        self.tiers
            .iter()
            .position(|tier| *tier >= delay)
            .map(|index| (index + 1, self.tiers[index]))
            .ok_or(TierError::TooLong {
                asked: delay,
                largest,
            })
    }

    /// The delay of the tier `topic` is, with the work topic it belongs
    /// to: `None` for a topic that is not `<work>.retry.<n>` with `n` one
    /// of the configured tiers.
    pub fn parse_topic<'t>(&self, topic: &'t str) -> Option<(&'t str, Duration)> {
        let (work, n) = topic.rsplit_once(".retry.")?;
        if work.is_empty() || n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let n: usize = n.parse().ok()?;
        let delay = *self.tiers.get(n.checked_sub(1)?)?;
        Some((work, delay))
    }
}

/// `duration` in whole milliseconds, saturating.
pub(crate) fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn tiers_must_be_positive_and_strictly_ascending() {
        assert_eq!(RetryTiers::new([Duration::ZERO]), Err(TierError::Zero));
        assert!(matches!(
            RetryTiers::new([secs(5), secs(5)]),
            Err(TierError::NotAscending { .. })
        ));
        assert_eq!(
            RetryTiers::new([secs(1), secs(2)]).unwrap().delays().len(),
            2
        );
    }

    #[test]
    fn a_retry_climbs_one_tier_per_attempt_and_stays_on_the_last() {
        let tiers = RetryTiers::recommended();
        let picked: Vec<usize> = (0..6).map(|a| tiers.for_retry(a).0).collect();
        assert_eq!(picked, vec![1, 2, 3, 4, 4, 4]);
        assert_eq!(tiers.for_retry(u64::MAX).0, 4);
    }

    #[test]
    fn a_delay_takes_the_smallest_tier_that_covers_it_and_none_beyond_the_last() {
        let tiers = RetryTiers::recommended();
        assert_eq!(tiers.for_delay(Duration::ZERO).unwrap(), (1, secs(5)));
        assert_eq!(tiers.for_delay(secs(5)).unwrap(), (1, secs(5)));
        assert_eq!(tiers.for_delay(secs(301)).unwrap(), (4, secs(1800)));
        assert!(matches!(
            tiers.for_delay(secs(1801)),
            Err(TierError::TooLong { .. })
        ));
        assert_eq!(RetryTiers::none().for_delay(secs(1)), Err(TierError::None));
    }

    #[test]
    fn a_tier_topic_names_its_work_topic_and_delay() {
        let tiers = RetryTiers::recommended();
        assert_eq!(tiers.parse_topic("a.b.retry.2"), Some(("a.b", secs(30))));
        assert_eq!(tiers.parse_topic("orders.retry.5"), None);
        assert_eq!(tiers.parse_topic("orders.retry.0"), None);
        assert_eq!(tiers.parse_topic("orders.retry.x"), None);
        assert_eq!(tiers.parse_topic("orders"), None);
        assert_eq!(
            tiers.topics("o"),
            vec!["o.retry.1", "o.retry.2", "o.retry.3", "o.retry.4"]
        );
    }
}
