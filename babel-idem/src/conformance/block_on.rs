//! A minimal executor, so the runner needs no async runtime.
//!
//! The runner drives [`InMemoryStore`](crate::store::InMemoryStore), whose futures
//! are ready on their first poll, so one poll nearly always finishes a
//! delivery. The loop below is still a correct executor for any future: when
//! a poll returns `Pending` the thread parks until the future's waker unparks
//! it (a spurious unpark only costs one more poll). It cannot drive futures
//! that need a runtime's reactor or timers, such as a network store's.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{self, Thread};

/// Wakes the thread that is blocked in [`block_on`].
struct Unpark(Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// Polls `future` on the current thread until it completes.
pub(super) fn block_on<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    let waker = Waker::from(Arc::new(Unpark(thread::current())));
    let mut context = Context::from_waker(&waker);
    loop {
        match future.as_mut().poll(&mut context) {
            Poll::Ready(output) => return output,
            Poll::Pending => thread::park(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pending on the first poll, woken from another thread, ready on the next.
    struct WokenFromElsewhere {
        polls: u32,
    }

    impl Future for WokenFromElsewhere {
        type Output = u32;

        fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<u32> {
            self.polls += 1;
            if self.polls > 1 {
                return Poll::Ready(self.polls);
            }
            let waker = cx.waker().clone();
            thread::spawn(move || waker.wake());
            Poll::Pending
        }
    }

    #[test]
    fn a_pending_future_completes_once_woken() {
        assert!(block_on(WokenFromElsewhere { polls: 0 }) >= 2);
    }

    #[test]
    fn a_ready_future_completes_on_the_first_poll() {
        assert_eq!(block_on(async { 7 }), 7);
    }
}
