//! A store outage pauses the consumer; it never spends attempts.
//!
//! A delivery whose guard could not ask its store comes back from dispatch
//! as a release with reason
//! [`StoreUnavailable`](crate::router::ReleaseReason::StoreUnavailable).
//! What that says depends on the other deliveries:
//!
//! - **The store is down**: no delivery got an answer from it within the
//!   last [`PARTIAL_WINDOW`]. The consumer then stops reserving for a pause
//!   that doubles with each failure in a row, and after it reserves one
//!   delivery only (a probe): the first dispatch that is not a store
//!   failure ends the outage and the consumer reserves at full width again.
//! - **Part of the store is down** (a shard of a cluster that lost its
//!   master, or whose promoted master has no replica to confirm writes):
//!   other deliveries still get answers. Pausing every reservation would
//!   stop the ids the store can answer for the sake of those it cannot, so
//!   the consumer goes on at full width, and the failed delivery alone is
//!   held back (without a handler slot) for a pause that doubles while such
//!   failures go on, then goes back unchanged. Its id is paused, the others
//!   flow.
//!
//! A failure the store itself says concerns a part of it only (a cluster
//! master short of replicas: [`ShortOfReplicas`](crate::store::ShortOfReplicas)
//! naming it) is partial whatever the other deliveries got: the store
//! answered, for that part. So a consumer left with nothing but the ids of
//! a shard without a replica is not paused as if the store were down: it
//! goes on reserving (at the pace of its reservations that bring nothing
//! but deliveries going back at once), and reaches the other ids queued
//! behind them.
//!
//! Either way no attempt is spent: the message is never dead-lettered for
//! an outage.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// The first and the longest pause of a store outage.
const STORE_BACKOFF: (Duration, Duration) = (Duration::from_millis(200), Duration::from_secs(5));

/// A store failure within this long of another delivery's answer from the
/// store is a partial outage: the store answers for some ids and not for
/// others.
pub(super) const PARTIAL_WINDOW: Duration = Duration::from_secs(1);

/// What a store failure means for the consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Failure {
    /// The store is down, and this failure starts an outage: reservations
    /// pause.
    Started,
    /// The store is down; the outage goes on.
    Down,
    /// Other deliveries get answers: only a part of the store fails. The
    /// delivery is held back for `hold` before it goes back; the consumer
    /// goes on. `first`: this failure starts a row of them.
    Partial { hold: Duration, first: bool },
}

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
    /// When a dispatch last got past its guard's store.
    answered_at: Option<Instant>,
    /// Failures of a partial outage in a row (none for the longest pause
    /// ends the row), and when the last one came.
    partial: u32,
    partial_at: Option<Instant>,
}

impl Outage {
    /// A dispatch found the store failing: whether the store is down or
    /// only a part of it. `part`: the store said the failure concerns a
    /// part of it only; it answered, so an outage of the whole store ends.
    pub(super) fn failed(&self, part: bool) -> Failure {
        let mut state = self.lock();
        let now = Instant::now();
        let others_answered = state
            .answered_at
            .is_some_and(|at| now.duration_since(at) < PARTIAL_WINDOW);
        if part && state.failures > 0 {
            state.failures = 0;
            state.resume_at = None;
            state.probing = false;
            self.changed.notify_waiters();
        }
        if state.failures == 0 && (others_answered || part) {
            let row_over = state
                .partial_at
                .is_none_or(|at| now.duration_since(at) > STORE_BACKOFF.1);
            if row_over {
                state.partial = 0;
            }
            state.partial = state.partial.saturating_add(1);
            state.partial_at = Some(now);
            return Failure::Partial {
                hold: pause(state.partial),
                first: state.partial == 1,
            };
        }
        state.failures = state.failures.saturating_add(1);
        let pause = pause(state.failures);
        let until = now + pause;
        state.resume_at = Some(state.resume_at.map_or(until, |at| at.max(until)));
        state.probing = false;
        let started = state.failures == 1;
        drop(state);
        self.changed.notify_waiters();
        match started {
            true => Failure::Started,
            false => Failure::Down,
        }
    }

    /// A dispatch got past its guard's store. `true` when this ends an outage.
    pub(super) fn answered(&self) -> bool {
        let mut state = self.lock();
        state.answered_at = Some(Instant::now());
        if state.failures == 0 {
            return false;
        }
        state.failures = 0;
        state.resume_at = None;
        state.probing = false;
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
        assert_eq!(
            outage.failed(false),
            Failure::Started,
            "the first failure starts the outage"
        );
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

    #[tokio::test(start_paused = true)]
    async fn a_failure_while_others_get_answers_holds_that_delivery_back_and_pauses_nothing() {
        let outage = Outage::default();
        assert_eq!(
            outage.failed(false),
            Failure::Started,
            "nobody answered yet"
        );
        assert!(outage.answered());
        assert_eq!(
            outage.failed(false),
            Failure::Partial {
                hold: STORE_BACKOFF.0,
                first: true
            },
            "others got answers: a part of the store fails"
        );
        assert_eq!(
            outage.failed(false),
            Failure::Partial {
                hold: STORE_BACKOFF.0 * 2,
                first: false
            }
        );
        assert!(!outage.is_down());
        assert_eq!(outage.gate(64).await, 64, "reservations go on");
        outage.answered();
        assert!(matches!(outage.failed(false), Failure::Partial { .. }));

        // Nobody answered for the window: the store is down.
        tokio::time::advance(PARTIAL_WINDOW).await;
        assert_eq!(outage.failed(false), Failure::Started);
        assert_eq!(outage.failed(false), Failure::Down);
        assert!(outage.is_down());
        assert!(outage.answered(), "an answer ends the outage");
        // A long quiet spell ends the row of partial failures.
        tokio::time::advance(STORE_BACKOFF.1 * 2).await;
        outage.answered();
        assert_eq!(
            outage.failed(false),
            Failure::Partial {
                hold: STORE_BACKOFF.0,
                first: true
            }
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_failure_the_store_says_is_of_a_part_of_it_never_pauses_and_ends_an_outage() {
        let outage = Outage::default();
        assert!(
            matches!(outage.failed(true), Failure::Partial { .. }),
            "no answer yet, but the store said it is a part of it"
        );
        tokio::time::advance(PARTIAL_WINDOW * 2).await;
        assert_eq!(outage.failed(false), Failure::Started);
        assert!(outage.is_down());
        assert!(matches!(outage.failed(true), Failure::Partial { .. }));
        assert!(!outage.is_down(), "the store answered, for a part of it");
        assert_eq!(outage.gate(64).await, 64);
    }
}
