//! A store outage pauses the consumer; it never spends attempts.
//!
//! A delivery whose guard could not ask its store comes back from dispatch
//! as a release with reason
//! [`StoreUnavailable`](crate::router::ReleaseReason::StoreUnavailable).
//! The consumer then stops reserving for a pause that doubles with each
//! failure in a row, and after it reserves one delivery only (a probe):
//! the first dispatch that is not a store failure ends the outage and the
//! consumer reserves at full width again.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// The first and the longest pause of a store outage.
const STORE_BACKOFF: (Duration, Duration) = (Duration::from_millis(200), Duration::from_secs(5));

/// Whether the consumer's store is down, and until when it waits.
#[derive(Debug, Default)]
pub(super) struct Outage {
    state: Mutex<State>,
    changed: Notify,
}

#[derive(Debug, Default)]
struct State {
    /// Store failures in a row; 0: no outage.
    failures: u32,
    /// No reservation before this.
    resume_at: Option<Instant>,
    /// A probe delivery is out: nothing else is reserved meanwhile.
    probing: bool,
}

impl Outage {
    /// A dispatch found the store down. `true` when this starts an outage.
    pub(super) fn failed(&self) -> bool {
        let mut state = self.lock();
        state.failures = state.failures.saturating_add(1);
        let pause = pause(state.failures);
        let until = Instant::now() + pause;
        state.resume_at = Some(state.resume_at.map_or(until, |at| at.max(until)));
        state.probing = false;
        let started = state.failures == 1;
        drop(state);
        self.changed.notify_waiters();
        started
    }

    /// A dispatch got past its guard's store. `true` when this ends an outage.
    pub(super) fn answered(&self) -> bool {
        let mut state = self.lock();
        if state.failures == 0 {
            return false;
        }
        *state = State::default();
        drop(state);
        self.changed.notify_waiters();
        true
    }

    /// The probe reserved nothing (an empty queue, a broker error).
    pub(super) fn probe_unused(&self) {
        self.lock().probing = false;
        self.changed.notify_waiters();
    }

    /// Whether the store is down.
    pub(super) fn is_down(&self) -> bool {
        self.lock().failures > 0
    }

    /// Waits until the consumer may reserve; how many deliveries at most
    /// (`max`, or 1 for a probe while the store is down).
    pub(super) async fn gate(&self, max: usize) -> usize {
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let resume_at = {
                let mut state = self.lock();
                match state.resume_at {
                    None => return max,
                    Some(_) if state.probing => None,
                    Some(at) if at > Instant::now() => Some(at),
                    Some(_) => {
                        state.probing = true;
                        return 1;
                    }
                }
            };
            match resume_at {
                Some(at) => {
                    tokio::select! {
                        () = tokio::time::sleep_until(at) => {}
                        () = notified => {}
                    }
                }
                None => notified.await,
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The pause after `failures` store failures in a row.
fn pause(failures: u32) -> Duration {
    let (first, max) = STORE_BACKOFF;
    first
        .saturating_mul(1 << failures.saturating_sub(1).min(16))
        .min(max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pause_doubles_up_to_its_bound() {
        assert_eq!(pause(1), STORE_BACKOFF.0);
        assert_eq!(pause(2), STORE_BACKOFF.0 * 2);
        assert_eq!(pause(40), STORE_BACKOFF.1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_down_store_lets_one_probe_through_after_the_pause_and_an_answer_reopens() {
        let outage = Outage::default();
        assert_eq!(outage.gate(64).await, 64, "no outage: full width");
        assert!(outage.failed(), "the first failure starts the outage");
        assert!(outage.is_down());
        let started = Instant::now();
        assert_eq!(outage.gate(64).await, 1, "after the pause, one probe");
        assert!(started.elapsed() >= STORE_BACKOFF.0);
        let second = tokio::time::timeout(Duration::from_secs(60), outage.gate(64)).await;
        assert!(second.is_err(), "nothing more while the probe is out");
        assert!(outage.answered(), "an answer ends the outage");
        assert_eq!(outage.gate(64).await, 64);
        assert!(!outage.is_down());
    }
}
