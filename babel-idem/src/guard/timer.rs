//! A runtime-agnostic timer for lease renewal: one process-wide thread that
//! wakes sleeping futures at their deadlines.
//!
//! The guard must renew a lease under any executor (Tokio, async-std, smol, a
//! plain `block_on`) without the user naming one, so it cannot use an
//! executor's timer. The thread starts on the first renewal that has to
//! wait; a handler that finishes on its first poll never touches it.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::task::{Context, Poll, Waker};
use std::time::Instant;

/// A future-side handle: ready once `deadline` has passed.
#[derive(Debug)]
pub(super) struct Sleep {
    deadline: Instant,
    /// Where the timer thread finds the waker; made on the first pending poll.
    slot: Option<Arc<Slot>>,
}

impl Sleep {
    /// A sleep until `deadline`. Registers nothing until polled.
    pub(super) fn until(deadline: Instant) -> Self {
        Sleep {
            deadline,
            slot: None,
        }
    }

    /// Ready once the deadline has passed; until then the task is woken at
    /// the deadline. If the timer thread cannot be started the sleep never
    /// wakes the task by itself (the caller is polled again by its other
    /// work), and `timer_unavailable` is reported once.
    pub(super) fn poll_elapsed(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        self.poll_on(cx, timer)
    }

    /// [`poll_elapsed`](Self::poll_elapsed) registering with the timer
    /// `timer` returns.
    fn poll_on(
        &mut self,
        cx: &mut Context<'_>,
        timer: impl FnOnce() -> Option<&'static Timer>,
    ) -> Poll<()> {
        if Instant::now() >= self.deadline {
            self.slot = None;
            return Poll::Ready(());
        }
        match &self.slot {
            Some(slot) => slot.set(cx.waker()),
            None => {
                let slot = Arc::new(Slot::new(cx.waker()));
                if let Some(timer) = timer() {
                    timer.schedule(self.deadline, slot.clone());
                }
                self.slot = Some(slot);
            }
        }
        Poll::Pending
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        // The entry stays queued until its deadline; it wakes nobody.
        if let Some(slot) = &self.slot {
            *slot.lock() = None;
        }
    }
}

#[derive(Debug)]
struct Slot(Mutex<Option<Waker>>);

impl Slot {
    fn new(waker: &Waker) -> Self {
        Slot(Mutex::new(Some(waker.clone())))
    }

    /// Nothing panics while a slot is held, so a poisoned one is still whole.
    fn lock(&self) -> MutexGuard<'_, Option<Waker>> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn set(&self, waker: &Waker) {
        let mut current = self.lock();
        if !current.as_ref().is_some_and(|known| known.will_wake(waker)) {
            *current = Some(waker.clone());
        }
    }

    fn wake(&self) {
        let waker = self.lock().take();
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

struct Entry {
    deadline: Instant,
    slot: Arc<Slot>,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        self.deadline == other.deadline
    }
}

impl Eq for Entry {}

impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Entry {
    fn cmp(&self, other: &Self) -> Ordering {
        self.deadline.cmp(&other.deadline)
    }
}

struct Timer {
    queue: Mutex<BinaryHeap<Reverse<Entry>>>,
    changed: Condvar,
}

/// The process-wide timer once first asked for: `None` inside if its thread
/// could not be started.
static TIMER: OnceLock<Option<&'static Timer>> = OnceLock::new();

/// The process-wide timer, or `None` if its thread could not be started.
fn timer() -> Option<&'static Timer> {
    *TIMER.get_or_init(Timer::start)
}

/// How many entries the process-wide timer's queue holds (0 before the
/// timer starts).
pub(crate) fn queued() -> usize {
    TIMER.get().copied().flatten().map_or(0, Timer::len)
}

impl Timer {
    /// A timer with its own thread, or `None` (reported) if the thread could
    /// not be started.
    fn start() -> Option<&'static Timer> {
        let timer: &'static Timer = Box::leak(Box::new(Timer {
            queue: Mutex::new(BinaryHeap::new()),
            changed: Condvar::new(),
        }));
        let started = std::thread::Builder::new()
            .name("babel-idem-lease-timer".into())
            .spawn(move || timer.run());
        match started {
            Ok(_) => Some(timer),
            Err(error) => {
                tracing::error!(
                    target: "babel_idem",
                    %error,
                    "timer_unavailable: the lease timer thread could not start; claims are not renewed \
                     and a handler that outlives its lease reports lost_claim",
                );
                None
            }
        }
    }

    fn len(&self) -> usize {
        self.lock().len()
    }

    /// Nothing panics while the queue is held, so a poisoned one is whole.
    fn lock(&self) -> MutexGuard<'_, BinaryHeap<Reverse<Entry>>> {
        self.queue
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn schedule(&self, deadline: Instant, slot: Arc<Slot>) {
        let mut queue = self.lock();
        let earliest = queue
            .peek()
            .is_none_or(|Reverse(next)| deadline < next.deadline);
        queue.push(Reverse(Entry { deadline, slot }));
        drop(queue);
        if earliest {
            self.changed.notify_one();
        }
    }

    fn run(&self) {
        let mut queue = self.lock();
        loop {
            let now = Instant::now();
            let mut due = Vec::new();
            while let Some(Reverse(next)) = queue.peek() {
                if next.deadline > now {
                    break;
                }
                if let Some(Reverse(entry)) = queue.pop() {
                    due.push(entry.slot);
                }
            }
            if !due.is_empty() {
                // Wake outside the lock: a waker may run a task inline.
                drop(queue);
                due.iter().for_each(|slot| slot.wake());
                queue = self.lock();
                continue;
            }
            queue = match queue.peek().map(|Reverse(next)| next.deadline - now) {
                Some(wait) => {
                    self.changed
                        .wait_timeout(queue, wait)
                        .unwrap_or_else(|poisoned| poisoned.into_inner())
                        .0
                }
                None => self
                    .changed
                    .wait(queue)
                    .unwrap_or_else(|poisoned| poisoned.into_inner()),
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    use std::task::Wake;
    use std::time::Duration;

    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, SeqCst);
        }
    }

    fn wait_for(count: &Count, at_least: usize) {
        for _ in 0..2_000 {
            if count.0.load(SeqCst) >= at_least {
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        panic!("the timer never woke the task");
    }

    #[test]
    fn wakes_at_the_deadline_in_deadline_order_and_not_after_drop() {
        let woken = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(woken.clone());
        let mut cx = Context::from_waker(&waker);
        let start = Instant::now();
        let mut late = Sleep::until(start + Duration::from_millis(30));
        let mut soon = Sleep::until(start + Duration::from_millis(10));
        let mut dropped = Sleep::until(start + Duration::from_millis(20));
        for sleep in [&mut late, &mut soon, &mut dropped] {
            assert!(sleep.poll_elapsed(&mut cx).is_pending());
        }
        drop(dropped);

        wait_for(&woken, 1);
        assert!(soon.poll_elapsed(&mut cx).is_ready());
        wait_for(&woken, 2);
        assert!(late.poll_elapsed(&mut cx).is_ready());
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(woken.0.load(SeqCst), 2, "a dropped sleep wakes nobody");
    }
}
