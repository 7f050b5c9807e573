//! [`RedisStoreBuilder::wait_for_replicas`](super::RedisStoreBuilder::wait_for_replicas):
//! a write confirmed by `WAIT` in the same pipeline.
//!
//! `WAIT n t` answers how many replicas have acknowledged every write the
//! connection made before it. Sent in the pipeline of the write it
//! confirms, it goes to the same node over the same connection: a reply
//! of `n` or more means the write is on `n` replicas, whatever else the
//! shared connection carried meanwhile.
//!
//! A master short of replicas (a promoted replica with none of its own)
//! answers every `WAIT` only at its timeout, so each write to it would
//! hold its caller for the whole timeout, and a consumer's handler slots
//! with it. [`Shortages`] remembers such masters: their writes fail at once
//! with [`ShortOfReplicas`], nothing sent, and after a pause one write at a
//! time goes through to see whether a replica came back.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use ::redis::Pipeline;
use tokio::time::Instant;

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
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the write reached {acknowledged} of the {wanted} replica(s) waited for within {timeout:?}: \
     the master has it, but a failover now could lose it"
)]
pub struct NotReplicated {
    /// The replicas that acknowledged the write.
    pub acknowledged: u32,
    /// The replicas the store waits for.
    pub wanted: u32,
    /// How long it waited.
    pub timeout: Duration,
}

/// How long a master short of replicas is refused writes at first, and at
/// most: the pause doubles with each probe write it fails too.
const SHORT_PAUSE: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(8));

/// A write not sent: the master of its key's slot confirmed a recent write
/// to fewer replicas than
/// [`wait_for_replicas`](super::RedisStoreBuilder::wait_for_replicas) asks
/// (after a failover, a promoted replica has no replica of its own until
/// one joins). Such a master answers `WAIT` only at its timeout, so rather
/// than hold every caller that long, the store fails its writes at once for
/// a pause (1 s, doubling while it stays short, up to 8 s), then lets one
/// write through to see whether a replica came back. Nothing was written.
/// The source of the [`StoreError`](crate::StoreError) the write fails
/// with; the guard treats it as any store failure (the handler does not
/// run; a consumer holds the delivery back and its id is paused while
/// other ids go on).
///
/// ```
/// use babel_idem::store::ShortOfReplicas;
///
/// fn master_short_of_replicas(error: &babel_idem::StoreError) -> Option<&ShortOfReplicas> {
///     std::error::Error::source(error)?.downcast_ref::<ShortOfReplicas>()
/// }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "not sent: {} confirmed a recent write to fewer than {wanted} replica(s); \
     its writes fail at once, and one is tried again in {retry_in:?}",
    master_name(.master)
)]
#[non_exhaustive]
pub struct ShortOfReplicas {
    /// The master, `host:port` on a cluster; empty for the one server.
    pub master: String,
    /// The replicas the store waits for.
    pub wanted: u32,
    /// How long until a write to it is tried again.
    pub retry_in: Duration,
}

/// How a message names `master`: `""` is the one server.
fn master_name(master: &str) -> &str {
    match master {
        "" => "the server",
        master => master,
    }
}

/// The masters found short of replicas, by address (`""`: the one server).
#[derive(Debug, Default)]
pub(super) struct Shortages {
    masters: Mutex<HashMap<String, Shortage>>,
}

#[derive(Debug)]
struct Shortage {
    /// No write before this.
    until: Instant,
    /// The pause after the next failed probe.
    pause: Duration,
    /// A probe write is out: the others are refused meanwhile.
    probing: bool,
}

/// The one write let through to a master short of replicas. Until its
/// answer is [`recorded`](Shortages::record), the master's other writes are
/// refused; dropped without one (the write failed otherwise, or its caller
/// gave up), it lets the next write probe.
#[derive(Debug)]
pub(super) struct Probe {
    shortages: Arc<Shortages>,
    master: String,
}

impl Drop for Probe {
    fn drop(&mut self) {
        if let Some(shortage) = self.shortages.lock().get_mut(&self.master) {
            shortage.probing = false;
        }
    }
}

impl Shortages {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Shortage>> {
        self.masters.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether a write to `master` may be sent: `Ok(None)`, none known
    /// short; `Ok(Some(probe))`, it is short and this write is the one to
    /// see whether it still is; `Err` when it must fail at once.
    pub(super) fn admit(
        self: &Arc<Self>,
        master: &str,
        wanted: u32,
    ) -> Result<Option<Probe>, ShortOfReplicas> {
        let mut masters = self.lock();
        let Some(shortage) = masters.get_mut(master) else {
            return Ok(None);
        };
        let now = Instant::now();
        if shortage.probing || now < shortage.until {
            return Err(ShortOfReplicas {
                master: master.to_owned(),
                wanted,
                retry_in: shortage.until.saturating_duration_since(now),
            });
        }
        shortage.probing = true;
        Ok(Some(Probe {
            shortages: Arc::clone(self),
            master: master.to_owned(),
        }))
    }

    /// A write to `master` was answered by `WAIT`: `confirmed`, enough
    /// replicas had it (the master is not short, or no longer), else it is
    /// short for a pause, longer after each `probe` it fails.
    pub(super) fn record(&self, master: &str, confirmed: bool, probe: Option<&Probe>) {
        let mut masters = self.lock();
        if confirmed {
            masters.remove(master);
            return;
        }
        let now = Instant::now();
        match masters.get_mut(master) {
            Some(shortage) => {
                // Writes sent before it was known short come back short
                // too: only a failed probe lengthens the pause.
                if probe.is_some() {
                    shortage.until = now + shortage.pause;
                    shortage.pause = (shortage.pause * 2).min(SHORT_PAUSE.1);
                }
            }
            None => {
                tracing::warn!(
                    master = if master.is_empty() {
                        "the server"
                    } else {
                        master
                    },
                    "babel-idem: a Redis master confirmed a write to fewer replicas than asked; \
                     its writes fail at once for a while, then one is tried again"
                );
                masters.insert(
                    master.to_owned(),
                    Shortage {
                        until: now + SHORT_PAUSE.0,
                        pause: (SHORT_PAUSE.0 * 2).min(SHORT_PAUSE.1),
                        probing: false,
                    },
                );
            }
        }
    }
}

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

    #[tokio::test(start_paused = true)]
    async fn a_master_short_of_replicas_is_refused_writes_then_probed_one_write_at_a_time() {
        let shortages = Arc::new(Shortages::default());
        assert!(matches!(shortages.admit("10.0.0.1:7000", 1), Ok(None)));
        shortages.record("10.0.0.1:7000", false, None);
        shortages.record("10.0.0.1:7000", false, None);
        let refused = shortages.admit("10.0.0.1:7000", 1).unwrap_err();
        assert_eq!(refused.retry_in, SHORT_PAUSE.0);
        assert!(refused.to_string().contains("10.0.0.1:7000"), "{refused}");
        assert!(
            matches!(shortages.admit("10.0.0.2:7000", 1), Ok(None)),
            "another master is not"
        );

        tokio::time::advance(SHORT_PAUSE.0).await;
        let probe = shortages
            .admit("10.0.0.1:7000", 1)
            .unwrap()
            .expect("a probe");
        assert!(
            shortages.admit("10.0.0.1:7000", 1).is_err(),
            "one probe at a time"
        );
        shortages.record("10.0.0.1:7000", false, Some(&probe));
        drop(probe);
        assert_eq!(
            shortages.admit("10.0.0.1:7000", 1).unwrap_err().retry_in,
            SHORT_PAUSE.0 * 2,
            "a failed probe doubles the pause"
        );

        tokio::time::advance(SHORT_PAUSE.0 * 2).await;
        let probe = shortages
            .admit("10.0.0.1:7000", 1)
            .unwrap()
            .expect("a probe");
        drop(probe);
        assert!(
            shortages.admit("10.0.0.1:7000", 1).unwrap().is_some(),
            "a probe dropped unanswered lets the next write probe"
        );
        shortages.record("10.0.0.1:7000", true, None);
        assert!(
            matches!(shortages.admit("10.0.0.1:7000", 1), Ok(None)),
            "a confirmed write ends the shortage"
        );
    }
}
