//! The ids being run right now in this process: one run per id at a time.
//!
//! A run [`enter`](InFlight::enter)s its id first. The first gets a
//! [`Running`] entry and runs; another run of the same id gets a [`Turn`]
//! instead, a future that completes with its own [`Running`] entry once
//! the first one's is dropped (its handler and its mark are over, or its
//! future was dropped). The waiter's guard then asks its store again and
//! skips (the first ran) or runs (the first failed). Whatever the mode, the
//! process never runs one id twice at once; claim mode's lease still decides
//! between processes.
//!
//! The registry needs no particular executor: a waiting [`Turn`] keeps its
//! task's waker, and a dropped [`Running`] wakes them all.
//!
//! A run inside a consumer may hand its handler slot on while its mark is
//! on its way ([`Running::hand_on`]); a waiter that holds a slot of its own
//! watches for that ([`Turn::poll_handed_on`]) and lets its slot go, so a
//! run that needs a slot back to finish never waits on its own waiters.
//!
//! Used by the [`Consumer`](crate::consumer::Consumer) (keyed by `meta.id`,
//! one registry per run) and by [`Guard::run_batch`](crate::guard::Guard::run_batch)
//! (keyed by the dedupe key, one registry per process).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};

/// The ids being run, each with the runs waiting for it.
#[derive(Debug, Default)]
pub(crate) struct InFlight {
    ids: Mutex<HashMap<Box<str>, Entry>>,
}

/// One id being run.
#[derive(Debug, Default)]
struct Entry {
    /// The wakers of the runs waiting for it.
    waiting: Vec<Waker>,
    /// Its run has handed its handler slot on, and not taken one back.
    #[cfg(feature = "consumer")]
    handed_on: bool,
}

impl Entry {
    /// Keeps the task's waker, once, to wake it when the run ends (or hands
    /// its slot on).
    fn wake_later(&mut self, cx: &Context<'_>) {
        if !self.waiting.iter().any(|waker| waker.will_wake(cx.waker())) {
            self.waiting.push(cx.waker().clone());
        }
    }
}

/// The right to run one id, until dropped.
#[derive(Debug)]
pub(crate) struct Running {
    registry: Arc<InFlight>,
    id: Box<str>,
}

/// A wait for the id's current run to end: completes with the right to run it.
#[derive(Debug)]
#[must_use = "a turn does nothing unless awaited"]
pub(crate) struct Turn {
    registry: Arc<InFlight>,
    id: Box<str>,
}

impl InFlight {
    /// Enters `id`: `Ok` when no run of it is going on, else the [`Turn`]
    /// to wait for.
    pub(crate) fn enter(self: &Arc<Self>, id: &str) -> Result<Running, Turn> {
        let mut ids = self.lock();
        if ids.contains_key(id) {
            return Err(Turn {
                registry: Arc::clone(self),
                id: id.into(),
            });
        }
        ids.insert(id.into(), Entry::default());
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

    fn lock(&self) -> MutexGuard<'_, HashMap<Box<str>, Entry>> {
        self.ids.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How many ids are being run.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().len()
    }
}

#[cfg(feature = "consumer")]
impl Running {
    /// The run handed its handler slot on: its waiters are woken, to let
    /// go of theirs ([`Turn::poll_handed_on`]).
    pub(crate) fn hand_on(&self) {
        let waiting = match self.registry.lock().get_mut(&*self.id) {
            Some(entry) => {
                entry.handed_on = true;
                std::mem::take(&mut entry.waiting)
            }
            None => Vec::new(),
        };
        for waker in waiting {
            waker.wake();
        }
    }

    /// The run holds a handler slot again: waiters that come now keep
    /// theirs while they wait, as before it handed its own on.
    pub(crate) fn taken_back(&self) {
        if let Some(entry) = self.registry.lock().get_mut(&*self.id) {
            entry.handed_on = false;
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let entry = self.registry.lock().remove(&self.id);
        // Woken outside the lock; each waiter enters again, one wins.
        for waker in entry.into_iter().flat_map(|entry| entry.waiting) {
            waker.wake();
        }
    }
}

#[cfg(feature = "consumer")]
impl Turn {
    /// Ready once the run it waits for has handed its handler slot on (or
    /// has ended); until then the task is woken when it does.
    pub(crate) fn poll_handed_on(&self, cx: &mut Context<'_>) -> Poll<()> {
        let mut ids = self.registry.lock();
        match ids.get_mut(&*self.id) {
            Some(entry) if !entry.handed_on => {
                entry.wake_later(cx);
                Poll::Pending
            }
            _ => Poll::Ready(()),
        }
    }
}

impl Future for Turn {
    type Output = Running;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Running> {
        let mut ids = self.registry.lock();
        match ids.get_mut(&*self.id) {
            Some(entry) => {
                entry.wake_later(cx);
                Poll::Pending
            }
            None => {
                ids.insert(self.id.clone(), Entry::default());
                Poll::Ready(Running {
                    registry: Arc::clone(&self.registry),
                    id: self.id.clone(),
                })
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

    #[cfg(feature = "consumer")]
    #[test]
    fn a_waiter_learns_when_the_run_hands_its_slot_on_and_when_it_takes_one_back() {
        let registry = Arc::new(InFlight::default());
        let first = registry.enter("id-1").unwrap();
        let turn = registry.enter("id-1").unwrap_err();
        let woken = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(Arc::clone(&woken));
        let mut cx = Context::from_waker(&waker);

        assert!(turn.poll_handed_on(&mut cx).is_pending());
        first.hand_on();
        assert_eq!(
            woken.0.load(Ordering::SeqCst),
            1,
            "handing on wakes the waiter"
        );
        assert!(turn.poll_handed_on(&mut cx).is_ready());

        first.taken_back();
        assert!(
            turn.poll_handed_on(&mut cx).is_pending(),
            "a run that took a slot back is waited for as before"
        );
        drop(first);
        assert_eq!(woken.0.load(Ordering::SeqCst), 2, "the end wakes it too");
        assert!(turn.poll_handed_on(&mut cx).is_ready());
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
