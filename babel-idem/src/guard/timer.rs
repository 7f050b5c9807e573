//! A runtime-agnostic timer for lease renewal: one process-wide thread that
//! wakes sleeping futures at their deadlines.
//!
//! The guard must renew a lease under any executor (Tokio, async-std, smol, a
//! plain `block_on`) without the user naming one, so it cannot use an
//! executor's timer. The thread starts on the first renewal that has to
//! wait; a handler that finishes on its first poll never touches it.
//!
//! The queue holds exactly the sleeps that are registered and neither
//! elapsed nor dropped: a sleep removes its own entry when it is dropped or
//! found elapsed, so its size is bounded by the sleeps alive whatever their
//! deadlines (a claim's renewal sleeps a third of its lease, and its handler
//! usually finishes long before).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
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
            self.cancel();
            return Poll::Ready(());
        }
        match &self.slot {
            Some(slot) => slot.set(cx.waker()),
            None => {
                let timer = timer();
                let slot = Arc::new(Slot::new(cx.waker(), timer));
                if let Some(timer) = timer {
                    timer.schedule(self.deadline, slot.clone());
                }
                self.slot = Some(slot);
            }
        }
        Poll::Pending
    }

    /// Forgets the waker and takes the entry out of the queue, if it is
    /// still there: after this the timer wakes nobody for this sleep.
    fn cancel(&mut self) {
        let Some(slot) = self.slot.take() else {
            return;
        };
        // Cleared first: the timer thread may have taken the entry out
        // already and be about to wake it. Dropped with no lock held.
        let waker = slot.lock().take();
        drop(waker);
        if let Some(timer) = slot.timer {
            timer.remove(self.deadline, slot.key);
        }
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        self.cancel();
    }
}

#[derive(Debug)]
struct Slot {
    waker: Mutex<Option<Waker>>,
    /// The timer whose queue holds this slot, if one could be started.
    timer: Option<&'static Timer>,
    /// Tells this slot's entry apart from others with the same deadline.
    key: u64,
}

impl Slot {
    fn new(waker: &Waker, timer: Option<&'static Timer>) -> Self {
        Slot {
            waker: Mutex::new(Some(waker.clone())),
            timer,
            key: timer.map_or(0, |timer| timer.next_key.fetch_add(1, Ordering::Relaxed)),
        }
    }

    /// Nothing panics while a slot is held, so a poisoned one is still whole.
    fn lock(&self) -> MutexGuard<'_, Option<Waker>> {
        self.waker
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

/// What the timer's lock guards.
#[derive(Debug, Default)]
struct Queue {
    /// The queued sleeps by deadline, then by key (unique per slot).
    entries: BTreeMap<(Instant, u64), Arc<Slot>>,
    /// When the thread looks at `entries` next unless told to sooner; `None`
    /// while it waits for an entry. A sleep due before then tells it (and
    /// only then: most deadlines come after those already queued, and a
    /// wake of the thread per sleep would cost every delivery).
    next_look: Option<Instant>,
}

#[derive(Debug)]
struct Timer {
    queue: Mutex<Queue>,
    changed: Condvar,
    next_key: AtomicU64,
}

/// The process-wide timer once first asked for: `None` inside if its thread
/// could not be started.
static TIMER: OnceLock<Option<&'static Timer>> = OnceLock::new();

/// The process-wide timer, or `None` if its thread could not be started.
fn timer() -> Option<&'static Timer> {
    *TIMER.get_or_init(Timer::start)
}

/// Whether the process-wide timer runs (started now if it was not): a
/// [`Sleep`] wakes its task by itself only then.
pub(super) fn available() -> bool {
    timer().is_some()
}

/// How many sleeps the process-wide timer holds: those registered and
/// neither elapsed nor dropped (0 before the timer starts).
pub(crate) fn queued() -> usize {
    TIMER.get().copied().flatten().map_or(0, Timer::len)
}

impl Timer {
    /// A timer with its own thread, or `None` (reported) if the thread could
    /// not be started.
    fn start() -> Option<&'static Timer> {
        let timer: &'static Timer = Box::leak(Box::new(Timer {
            queue: Mutex::new(Queue::default()),
            changed: Condvar::new(),
            next_key: AtomicU64::new(0),
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

    /// Nothing panics while the queue is held, so a poisoned one is whole.
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn len(&self) -> usize {
        self.lock().entries.len()
    }

    fn schedule(&self, deadline: Instant, slot: Arc<Slot>) {
        let mut queue = self.lock();
        queue.entries.insert((deadline, slot.key), slot);
        let sooner = queue.next_look.is_none_or(|next| deadline < next);
        if sooner {
            queue.next_look = Some(deadline);
        }
        drop(queue);
        if sooner {
            self.changed.notify_one();
        }
    }

    /// Takes a sleep's entry out of the queue; nothing if the thread already
    /// took it. The thread is not told: at worst it wakes once for nothing.
    fn remove(&self, deadline: Instant, key: u64) {
        let removed = self.lock().entries.remove(&(deadline, key));
        // Dropped outside the lock (its waker is already cleared).
        drop(removed);
    }

    fn run(&self) {
        // Reused across rounds: the thread allocates only when more sleeps
        // fall due together than ever before.
        let mut due = Vec::new();
        let mut queue = self.lock();
        loop {
            let now = Instant::now();
            while let Some(next) = queue.entries.first_entry() {
                if next.key().0 > now {
                    break;
                }
                due.push(next.remove());
            }
            if !due.is_empty() {
                // Looks again as soon as these are woken.
                queue.next_look = Some(now);
                // Wake outside the lock: a waker may run a task inline, and
                // that task may drop or poll a sleep.
                drop(queue);
                due.drain(..).for_each(|slot| slot.wake());
                queue = self.lock();
                continue;
            }
            queue.next_look = queue.entries.first_key_value().map(|(&(next, _), _)| next);
            queue = match queue.next_look.map(|next| next - now) {
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

    /// A waker that counts its wakes.
    fn counting_waker() -> (Arc<Count>, Waker) {
        let woken = Arc::new(Count(AtomicUsize::new(0)));
        (woken.clone(), Waker::from(woken))
    }

    /// A timer thread of the test's own, and a waker that counts its wakes.
    fn own_timer() -> (&'static Timer, Arc<Count>, Waker) {
        let timer = Timer::start().expect("the test's own timer thread starts");
        let (woken, waker) = counting_waker();
        (timer, woken, waker)
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
        let (woken, waker) = counting_waker();
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

    #[test]
    fn the_queue_holds_no_entry_once_its_sleeps_are_dropped() {
        let (timer, woken, waker) = own_timer();
        let mut cx = Context::from_waker(&waker);
        let deadline = Instant::now() + Duration::from_secs(3_600);
        let mut sleeps: Vec<Sleep> = (0..1_000).map(|_| Sleep::until(deadline)).collect();
        // Polled twice: a sleep keeps one entry however often it is polled.
        for _ in 0..2 {
            for sleep in &mut sleeps {
                assert!(sleep.poll_on(&mut cx, || Some(timer)).is_pending());
            }
        }
        assert_eq!(timer.len(), 1_000);

        sleeps.truncate(400);
        assert_eq!(timer.len(), 400, "each dropped sleep takes its entry out");
        drop(sleeps);
        assert_eq!(timer.len(), 0, "no sleep alive, no entry queued");
        assert_eq!(woken.0.load(SeqCst), 0, "a dropped sleep wakes nobody");
    }

    #[test]
    fn an_elapsed_sleep_leaves_no_entry() {
        let (timer, woken, waker) = own_timer();
        let mut cx = Context::from_waker(&waker);
        let mut sleep = Sleep::until(Instant::now() + Duration::from_millis(5));
        assert!(sleep.poll_on(&mut cx, || Some(timer)).is_pending());
        assert_eq!(timer.len(), 1);
        wait_for(&woken, 1);
        assert!(sleep.poll_on(&mut cx, || Some(timer)).is_ready());
        assert_eq!(timer.len(), 0);
        drop(sleep);
        assert_eq!(timer.len(), 0);
    }
}
