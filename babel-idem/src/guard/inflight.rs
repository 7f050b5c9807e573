//! The ids being run right now in this process: one run per id at a time.
//!
//! A run [`enter`](InFlight::enter)s its id first. The first gets a
//! [`Running`] entry and runs; another run of the same id gets a [`Turn`]
//! instead, a future that completes with its own [`Running`] entry once
//! the runs before it have ended (their handlers and marks are over, or
//! their futures were dropped). The waiter's guard then asks its store
//! again and skips (the first ran) or runs (the first failed). Whatever the
//! mode, the process never runs one id twice at once; claim mode's lease
//! still decides between processes.
//!
//! Invariants:
//! - One [`Running`] per id at a time.
//! - The turn passes in the order the waiters entered, and a run that ends
//!   wakes only the waiter whose turn it is: a thousand copies of one id
//!   cost one wakeup per run, not a thousand.
//! - A waiter dropped before its turn leaves the queue; one dropped as its
//!   turn came passes the turn on. A turn is never lost, so a waiter is
//!   never left waiting for an id nobody runs.
//!
//! The registry needs no particular executor: a waiting [`Turn`] keeps its
//! task's waker.
//!
//! Inside a consumer a waiter holds no handler slot while it waits: the
//! run it waits for, or the waiter whose turn comes after it, may need a
//! slot to go on, and must never wait on its own waiters.
//!
//! Used by a consumer (keyed by `meta.id`,
//! one registry per run) and by [`Guard::run_batch`](crate::guard::Guard::run_batch)
//! (keyed by the dedupe key, one registry per process).

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};

/// The ids being run, each with the runs waiting for it.
#[derive(Debug, Default)]
pub(crate) struct InFlight {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    ids: HashMap<Box<str>, Entry>,
    /// The next waiter's ticket.
    next_ticket: u64,
}

/// One id being run (or handed to its next waiter).
#[derive(Debug, Default)]
struct Entry {
    /// The runs waiting for it, in the order they entered: each one's
    /// ticket, and its task's waker once it has been polled.
    waiting: VecDeque<(u64, Option<Waker>)>,
    /// The run ended: the ticket of the waiter whose turn it is now.
    heir: Option<u64>,
}

impl Entry {
    /// Gives the turn to the first waiter, waking it; `false` when none waits.
    fn hand_to_next(&mut self) -> bool {
        match self.waiting.front_mut() {
            Some((ticket, waker)) => {
                self.heir = Some(*ticket);
                if let Some(waker) = waker.take() {
                    waker.wake();
                }
                true
            }
            None => false,
        }
    }
}

/// The right to run one id, until dropped.
#[derive(Debug)]
pub(crate) struct Running {
    registry: Arc<InFlight>,
    id: Box<str>,
}

/// A wait for the id's current run, and the waiters before this one, to
/// end: completes with the right to run it.
#[derive(Debug)]
#[must_use = "a turn does nothing unless awaited"]
pub(crate) struct Turn {
    registry: Arc<InFlight>,
    id: Box<str>,
    ticket: u64,
    /// It completed: its entry is the [`Running`] it returned.
    done: bool,
}

impl InFlight {
    /// Enters `id`: `Ok` when no run of it is going on, else the [`Turn`]
    /// to wait for.
    pub(crate) fn enter(self: &Arc<Self>, id: &str) -> Result<Running, Turn> {
        let mut state = self.lock();
        let ticket = state.next_ticket;
        if let Some(entry) = state.ids.get_mut(id) {
            entry.waiting.push_back((ticket, None));
            state.next_ticket += 1;
            return Err(Turn {
                registry: Arc::clone(self),
                id: id.into(),
                ticket,
                done: false,
            });
        }
        state.ids.insert(id.into(), Entry::default());
        Ok(Running {
            registry: Arc::clone(self),
            id: id.into(),
        })
    }

    /// Enters `id`, waiting for its turn when it is being run.
    pub(crate) async fn turn(self: &Arc<Self>, id: &str) -> Running {
        match self.enter(id) {
            Ok(running) => running,
            Err(turn) => turn.await,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How many ids are being run or waited for.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().ids.len()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let mut state = self.registry.lock();
        if let Some(entry) = state.ids.get_mut(&self.id)
            && !entry.hand_to_next()
        {
            state.ids.remove(&self.id);
        }
    }
}

impl Future for Turn {
    type Output = Running;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Running> {
        assert!(!self.done, "a turn polled after it completed");
        let registry = Arc::clone(&self.registry);
        let mut state = registry.lock();
        let entry = state
            .ids
            .get_mut(&*self.id)
            .expect("an id stays entered while a turn waits for it");
        if entry.heir == Some(self.ticket) {
            entry.heir = None;
            entry.waiting.pop_front();
            drop(state);
            self.done = true;
            return Poll::Ready(Running {
                registry,
                id: self.id.clone(),
            });
        }
        if let Some((_, waker)) = entry
            .waiting
            .iter_mut()
            .find(|(ticket, _)| *ticket == self.ticket)
        {
            match waker {
                Some(waker) => waker.clone_from(cx.waker()),
                None => *waker = Some(cx.waker().clone()),
            }
        }
        Poll::Pending
    }
}

impl Drop for Turn {
    /// A waiter that gives up leaves the queue; if the turn had just come
    /// to it, the next waiter gets it (or, with none, the id is free).
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut state = self.registry.lock();
        let Some(entry) = state.ids.get_mut(&*self.id) else {
            return;
        };
        entry.waiting.retain(|(ticket, _)| *ticket != self.ticket);
        if entry.heir == Some(self.ticket) {
            entry.heir = None;
            if !entry.hand_to_next() {
                state.ids.remove(&*self.id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_second_run_of_an_id_waits_until_the_first_ends_and_then_runs() {
        let registry = Arc::new(InFlight::default());
        let first = registry.enter("id-1").expect("a free id runs");
        let mut turn = registry.enter("id-1").expect_err("a running id is busy");
        assert!(registry.enter("id-2").is_ok(), "other ids are free");

        let woken = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(Arc::clone(&woken));
        let mut cx = Context::from_waker(&waker);
        assert!(Pin::new(&mut turn).poll(&mut cx).is_pending());
        assert!(Pin::new(&mut turn).poll(&mut cx).is_pending());
        drop(first);
        assert_eq!(woken.0.load(Ordering::SeqCst), 1, "woken once");
        let Poll::Ready(second) = Pin::new(&mut turn).poll(&mut cx) else {
            panic!("the turn comes once the first ended");
        };
        assert!(registry.enter("id-1").is_err(), "the second runs now");
        drop(second);
        assert_eq!(registry.len(), 0, "an ended id leaves the registry");
    }

    #[test]
    fn the_turn_passes_in_the_order_entered_and_wakes_only_the_next_waiter() {
        let registry = Arc::new(InFlight::default());
        let first = registry.enter("id-1").unwrap();
        let counts: Vec<Arc<Count>> = (0..3)
            .map(|_| Arc::new(Count(AtomicUsize::new(0))))
            .collect();
        let wakers: Vec<Waker> = counts.iter().map(|c| Waker::from(Arc::clone(c))).collect();
        let mut turns: Vec<Turn> = (0..3)
            .map(|_| registry.enter("id-1").unwrap_err())
            .collect();
        for (turn, waker) in turns.iter_mut().zip(&wakers) {
            let mut cx = Context::from_waker(waker);
            assert!(Pin::new(turn).poll(&mut cx).is_pending());
        }
        drop(first);
        let woken = || {
            counts
                .iter()
                .map(|c| c.0.load(Ordering::SeqCst))
                .collect::<Vec<_>>()
        };
        assert_eq!(woken(), [1, 0, 0], "only the first waiter is woken");
        // The third is polled first: not its turn.
        let mut cx = Context::from_waker(&wakers[2]);
        assert!(Pin::new(&mut turns[2]).poll(&mut cx).is_pending());
        let mut cx = Context::from_waker(&wakers[0]);
        let Poll::Ready(second) = Pin::new(&mut turns[0]).poll(&mut cx) else {
            panic!("the first waiter's turn came");
        };
        assert!(registry.enter("id-1").is_err(), "one run at a time");
        drop(second);
        assert_eq!(woken(), [1, 1, 0], "then the second, alone");
        let mut cx = Context::from_waker(&wakers[1]);
        assert!(Pin::new(&mut turns[1]).poll(&mut cx).is_ready());
    }

    #[test]
    fn a_waiter_dropped_as_its_turn_came_passes_it_on_and_one_dropped_before_leaves_the_queue() {
        let registry = Arc::new(InFlight::default());
        let first = registry.enter("id-1").unwrap();
        let heir = registry.enter("id-1").unwrap_err();
        let gone = registry.enter("id-1").unwrap_err();
        let mut last = registry.enter("id-1").unwrap_err();
        let woken = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(Arc::clone(&woken));
        let mut cx = Context::from_waker(&waker);
        assert!(Pin::new(&mut last).poll(&mut cx).is_pending());
        drop(gone);
        drop(first);
        drop(heir);
        assert_eq!(
            woken.0.load(Ordering::SeqCst),
            1,
            "the turn came to the last"
        );
        let Poll::Ready(running) = Pin::new(&mut last).poll(&mut cx) else {
            panic!("the turn passed over the waiters that left");
        };
        drop(running);
        assert_eq!(registry.len(), 0, "an ended id leaves the registry");

        let first = registry.enter("id-2").unwrap();
        let heir = registry.enter("id-2").unwrap_err();
        drop(first);
        drop(heir);
        assert_eq!(registry.len(), 0, "a turn no one takes frees the id");
        assert!(registry.enter("id-2").is_ok());
    }

    #[test]
    fn a_turn_polled_after_the_first_ended_is_ready_at_once() {
        let registry = Arc::new(InFlight::default());
        let first = registry.enter("id-1").unwrap();
        let mut turn = registry.enter("id-1").unwrap_err();
        drop(first);
        let mut cx = Context::from_waker(Waker::noop());
        assert!(Pin::new(&mut turn).poll(&mut cx).is_ready());
    }
}
