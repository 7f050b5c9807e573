//! [`RedisStoreBuilder::wait_for_replicas`](super::RedisStoreBuilder::wait_for_replicas):
//! a write confirmed by `WAIT` in the same pipeline.
//!
//! `WAIT n t` answers how many replicas have acknowledged every write the
//! connection made before it. Sent in the pipeline of the write it
//! confirms, it goes to the same node over the same connection: a reply
//! of `n` or more means the write is on `n` replicas, whatever else the
//! shared connection carried meanwhile.

use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

use ::redis::Pipeline;

/// How many replicas a write waits for, and how long.
#[derive(Debug, Clone, Copy)]
pub(super) struct Durability {
    replicas: u32,
    timeout_ms: u64,
}

impl Durability {
    pub(super) fn new(replicas: u32, timeout: Duration) -> Self {
        Durability {
            replicas,
            timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
        }
    }

    pub(super) fn replicas(&self) -> u32 {
        self.replicas
    }

    /// Refuses what `WAIT` would misread: no replica to wait for, or a
    /// timeout of 0 ms, which `WAIT` takes as "wait forever".
    pub(super) fn check(&self) -> Result<(), &'static str> {
        if self.replicas == 0 {
            return Err("wait_for_replicas needs at least 1 replica to wait for");
        }
        if self.timeout_ms == 0 {
            return Err(
                "wait_for_replicas needs a timeout of at least 1 ms (WAIT reads 0 as forever)",
            );
        }
        Ok(())
    }

    /// `WAIT`'s arguments: the replicas, the timeout in ms.
    #[cfg_attr(not(feature = "redis-cluster"), allow(dead_code))]
    pub(super) fn wait_arguments(&self) -> (u32, u64) {
        (self.replicas, self.timeout_ms)
    }

    pub(super) fn append_wait(&self, pipeline: &mut Pipeline) {
        pipeline.cmd("WAIT").arg(self.replicas).arg(self.timeout_ms);
    }

    /// `Ok` when `acknowledged` replicas are enough.
    pub(super) fn confirm(&self, acknowledged: i64) -> Result<(), NotReplicated> {
        if acknowledged >= i64::from(self.replicas) {
            Ok(())
        } else {
            Err(NotReplicated {
                acknowledged: u32::try_from(acknowledged.max(0)).unwrap_or(0),
                wanted: self.replicas,
                timeout: Duration::from_millis(self.timeout_ms),
            })
        }
    }
}

/// A write the master applied but fewer replicas than
/// [`wait_for_replicas`](super::RedisStoreBuilder::wait_for_replicas) asked
/// for acknowledged in time: a failover now could lose it. The source of
/// the [`StoreError`](crate::StoreError) the write fails with; the guard
/// treats it as any store failure (a failed claim is retried, a failed
/// commit or mark is the remember failure its settings say).
///
/// ```
/// use babel_idem::store::NotReplicated;
///
/// fn lost_on_failover(error: &babel_idem::StoreError) -> Option<&NotReplicated> {
///     std::error::Error::source(error)?.downcast_ref::<NotReplicated>()
/// }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotReplicated {
    /// The replicas that acknowledged the write.
    pub acknowledged: u32,
    /// The replicas the store waits for.
    pub wanted: u32,
    /// How long it waited.
    pub timeout: Duration,
}

impl fmt::Display for NotReplicated {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the write reached {} of the {} replica(s) waited for within {:?}: \
             the master has it, but a failover now could lose it",
            self.acknowledged, self.wanted, self.timeout
        )
    }
}

impl StdError for NotReplicated {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fewer_replicas_than_asked_fail_and_enough_pass() {
        let durability = Durability::new(1, Duration::from_millis(250));
        assert_eq!(durability.confirm(1), Ok(()));
        assert_eq!(durability.confirm(2), Ok(()));
        let short = durability.confirm(0).unwrap_err();
        assert_eq!((short.acknowledged, short.wanted), (0, 1));
        assert!(short.to_string().contains("0 of the 1 replica"), "{short}");
        assert!(Durability::new(0, Duration::from_secs(1)).check().is_err());
        assert!(
            Durability::new(1, Duration::from_micros(10))
                .check()
                .is_err()
        );
    }
}
