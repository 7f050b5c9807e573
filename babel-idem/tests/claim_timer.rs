//! Claim mode's lease renewal keeps nothing queued for a handler that has
//! finished, however long its lease: the process-wide renewal timer holds
//! one entry per handler pending now.
//!
//! One test in this binary: the timer is process-wide, and no other test
//! here registers a renewal while it counts.

use std::time::Duration;

use babel_idem::__private::queued_lease_timers;
use babel_idem::{Guard, InMemoryStore, MessageId, StoreError};

/// A lease far longer than any handler here: its first renewal would wait
/// twenty minutes.
const LEASE: Duration = Duration::from_secs(3_600);
const DELIVERIES: usize = 20_000;

struct Delivery(String);

impl MessageId for Delivery {
    fn message_id(&self) -> Option<&str> {
        Some(&self.0)
    }
}

#[test]
fn finished_claim_handlers_leave_no_renewal_queued() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a current-thread runtime");
    let guard = Guard::new(InMemoryStore::new())
        .lease(LEASE)
        .expect("an hour is a valid lease");
    let most_queued = runtime.block_on(async {
        let mut most_queued = 0;
        for n in 0..DELIVERIES {
            let delivery = Delivery(format!("claim-timer-{n}"));
            let mut queued_while_pending = 0;
            guard
                .run(&delivery, async {
                    // Pending once: the guard registers the lease renewal.
                    tokio::task::yield_now().await;
                    queued_while_pending = queued_lease_timers();
                    Ok::<(), StoreError>(())
                })
                .await
                .expect("the handler succeeds");
            assert!(
                queued_while_pending >= 1,
                "a pending handler's renewal is queued"
            );
            most_queued = most_queued.max(queued_while_pending);
        }
        most_queued
    });
    assert_eq!(
        most_queued, 1,
        "one handler pending at a time: one renewal queued at a time"
    );
    assert_eq!(
        queued_lease_timers(),
        0,
        "every handler finished: no renewal queued"
    );
}
