//! Group commit for concurrent calls: requests that arrive while a flush is
//! in flight wait, and go out together in the next one.
//!
//! No task is spawned, so it works under any executor. The first caller
//! leads: it flushes what is waiting, answers every waiter, then hands the
//! lead to a caller that arrived meanwhile. No caller leads twice, so none is
//! held back serving the others for longer than one flush.
//!
//! While calls are meeting (the last flush carried several, or the lead was
//! handed on by a flush), a leader first yields one turn, so the callers
//! that are ready to run join its flush. A lone caller (the last flush was
//! its own alone) flushes at once: at concurrency 1 that turn would only
//! cost a pass through the scheduler. The first call of a burst after a
//! quiet spell therefore goes out alone, and the rest, queued meanwhile,
//! together.
//!
//! Cancellation never strands a caller: a leader dropped mid-flush tells the
//! callers of its batch to ask on their own and passes the lead on; a waiter
//! dropped just as the lead reached it passes it on in turn.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};

/// Coalesces concurrent requests of type `R` into batches, each answered by
/// one flush that returns an `A` per request.
pub(crate) struct Coalescer<R, A> {
    state: Mutex<State<R, A>>,
}

struct State<R, A> {
    /// A caller is flushing, or has the lead and is about to.
    leading: bool,
    waiting: VecDeque<Waiter<R, A>>,
    /// The last flush carried more than one request: calls are meeting.
    meeting: bool,
}

struct Waiter<R, A> {
    request: R,
    slot: Arc<Slot<R, A>>,
}

/// What a waiting caller is told.
enum Reply<R, A> {
    /// Its answer, from a flush.
    Answer(A),
    /// The flush failed, or its leader was dropped: ask on your own.
    Alone,
    /// Lead the next flush; here is your request back.
    Lead(R),
}

/// One waiting caller's mailbox.
struct Slot<R, A> {
    state: Mutex<SlotState<R, A>>,
}

enum SlotState<R, A> {
    Waiting(Option<Waker>),
    Replied(Reply<R, A>),
    /// The reply was taken, or the caller is gone.
    Closed,
}

impl<R, A> Coalescer<R, A> {
    pub(crate) fn new() -> Self {
        Coalescer {
            state: Mutex::new(State {
                leading: false,
                waiting: VecDeque::new(),
                meeting: false,
            }),
        }
    }

    /// Sends `request` in the next flush. `flush` is called by whichever
    /// caller leads it, with every request of the batch in arrival order; it
    /// returns one answer per request, or `None` when the batch failed as a
    /// whole.
    ///
    /// `None` means "ask on your own": the batch failed, or its leader was
    /// dropped before it answered. The caller then makes its single call,
    /// so one bad request fails alone.
    pub(crate) async fn call<F, Fut>(&self, request: R, flush: F) -> Option<A>
    where
        F: FnOnce(Vec<R>) -> Fut,
        Fut: Future<Output = Option<Vec<A>>>,
    {
        let queued = {
            let mut state = self.lock();
            if state.leading {
                let slot = Arc::new(Slot::new());
                let waiter = Waiter {
                    request,
                    slot: Arc::clone(&slot),
                };
                state.waiting.push_back(waiter);
                Err(slot)
            } else {
                state.leading = true;
                Ok((request, state.meeting))
            }
        };
        let (request, meeting) = match queued {
            Ok(led) => led,
            Err(slot) => match (Waiting {
                coalescer: self,
                slot,
            })
            .await
            {
                Reply::Answer(answer) => return Some(answer),
                Reply::Alone => return None,
                // Handed on by a flush: calls are meeting.
                Reply::Lead(request) => (request, true),
            },
        };

        // Leading from here on; the lead is passed on however this ends.
        let _lead = Lead(self);
        if meeting {
            // Let the callers that are ready to run reach the queue first,
            // so a burst (a consumer's reserved batch) goes out in one flush.
            YieldOnce(false).await;
        }
        let (mut requests, mut slots) = (vec![request], Vec::new());
        {
            let mut state = self.lock();
            state.meeting = !state.waiting.is_empty();
            for waiter in state.waiting.drain(..) {
                requests.push(waiter.request);
                slots.push(Responder(Some(waiter.slot)));
            }
        }
        let mut answers = flush(requests).await?.into_iter();
        let own = answers.next();
        for (responder, answer) in slots.iter_mut().zip(answers) {
            responder.reply(Reply::Answer(answer));
        }
        // A flush that returned too few answers leaves the rest to ask
        // alone (the responders' drop).
        own
    }

    /// Gives the lead to the first waiter still there, or drops it.
    fn pass_lead(&self) {
        let mut state = self.lock();
        while let Some(waiter) = state.waiting.pop_front() {
            match waiter.slot.reply(Reply::Lead(waiter.request)) {
                Ok(()) => return,
                // That caller is gone; its request goes with it.
                Err(_) => continue,
            }
        }
        state.leading = false;
    }

    fn lock(&self) -> MutexGuard<'_, State<R, A>> {
        // The state is consistent between statements: a panic elsewhere
        // cannot leave it half-written.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Held by the leader: passes the lead on when the flush ends or is dropped.
struct Lead<'c, R, A>(&'c Coalescer<R, A>);

impl<R, A> Drop for Lead<'_, R, A> {
    fn drop(&mut self) {
        self.0.pass_lead();
    }
}

/// The leader's handle on one waiter of its batch: a waiter left unanswered
/// (the flush failed or the leader was dropped) is told to ask alone.
struct Responder<R, A>(Option<Arc<Slot<R, A>>>);

impl<R, A> Responder<R, A> {
    fn reply(&mut self, reply: Reply<R, A>) {
        if let Some(slot) = self.0.take() {
            // A caller that is gone needs no answer.
            let _ = slot.reply(reply);
        }
    }
}

impl<R, A> Drop for Responder<R, A> {
    fn drop(&mut self) {
        self.reply(Reply::Alone);
    }
}

impl<R, A> Slot<R, A> {
    fn new() -> Self {
        Slot {
            state: Mutex::new(SlotState::Waiting(None)),
        }
    }

    /// Delivers `reply`, or hands it back when the caller is gone.
    fn reply(&self, reply: Reply<R, A>) -> Result<(), Reply<R, A>> {
        let mut state = self.lock();
        let waker = match &mut *state {
            SlotState::Waiting(waker) => waker.take(),
            SlotState::Replied(_) | SlotState::Closed => return Err(reply),
        };
        *state = SlotState::Replied(reply);
        drop(state);
        if let Some(waker) = waker {
            waker.wake();
        }
        Ok(())
    }

    fn lock(&self) -> MutexGuard<'_, SlotState<R, A>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A waiting caller's side of its slot.
struct Waiting<'c, R, A> {
    coalescer: &'c Coalescer<R, A>,
    slot: Arc<Slot<R, A>>,
}

impl<R, A> Future for Waiting<'_, R, A> {
    type Output = Reply<R, A>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Reply<R, A>> {
        let mut state = self.slot.lock();
        match std::mem::replace(&mut *state, SlotState::Closed) {
            SlotState::Replied(reply) => Poll::Ready(reply),
            SlotState::Waiting(_) => {
                *state = SlotState::Waiting(Some(cx.waker().clone()));
                Poll::Pending
            }
            SlotState::Closed => panic!("`Waiting` polled after it completed"),
        }
    }
}

impl<R, A> Drop for Waiting<'_, R, A> {
    fn drop(&mut self) {
        let unread = std::mem::replace(&mut *self.slot.lock(), SlotState::Closed);
        // The lead reached a caller that is going away: pass it on, or the
        // callers behind it would wait for a flush nobody makes.
        if let SlotState::Replied(Reply::Lead(_)) = unread {
            self.coalescer.pass_lead();
        }
    }
}

/// Returns `Pending` once (waking itself), then `Ready`: one turn of the
/// executor for the other tasks, without naming a runtime.
struct YieldOnce(bool);

impl Future for YieldOnce {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            return Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::task::Waker;

    /// The batches each flush was given, and a gate every flush waits on.
    #[derive(Default)]
    struct Flushes {
        batches: Mutex<Vec<Vec<u32>>>,
        closed: AtomicBool,
    }

    impl Flushes {
        /// Answers each request with itself times ten once the gate is open
        /// (`None`, a failed batch, for a batch holding 13).
        async fn flush(&self, requests: Vec<u32>) -> Option<Vec<u32>> {
            self.batches.lock().unwrap().push(requests.clone());
            std::future::poll_fn(|_| {
                if self.closed.load(Ordering::SeqCst) {
                    Poll::Pending
                } else {
                    Poll::Ready(())
                }
            })
            .await;
            (!requests.contains(&13)).then(|| requests.iter().map(|r| r * 10).collect())
        }

        fn batches(&self) -> Vec<Vec<u32>> {
            self.batches.lock().unwrap().clone()
        }
    }

    type Call<'a> = Pin<Box<dyn Future<Output = Option<u32>> + 'a>>;

    fn call<'a>(
        coalescer: &'a Coalescer<u32, u32>,
        flushes: &'a Flushes,
        request: u32,
    ) -> Call<'a> {
        Box::pin(coalescer.call(request, move |requests| flushes.flush(requests)))
    }

    /// Polls once with a waker that does nothing: the tests drive every
    /// interleaving by hand.
    fn poll(call: &mut Call<'_>) -> Poll<Option<u32>> {
        call.as_mut().poll(&mut Context::from_waker(Waker::noop()))
    }

    /// A coalescer whose calls are meeting: its last flush carried two
    /// requests (100 went alone, then 101 and 102 together). Forgets those
    /// flushes.
    fn meeting(coalescer: &Coalescer<u32, u32>, flushes: &Flushes) {
        flushes.batches.lock().unwrap().clear();
        flushes.closed.store(true, Ordering::SeqCst);
        let mut alone = call(coalescer, flushes, 100);
        assert!(poll(&mut alone).is_pending()); // flushing [100]
        let (mut b, mut c) = (call(coalescer, flushes, 101), call(coalescer, flushes, 102));
        assert!(poll(&mut b).is_pending());
        assert!(poll(&mut c).is_pending());
        flushes.closed.store(false, Ordering::SeqCst);
        assert_eq!(poll(&mut alone), Poll::Ready(Some(1000)));
        assert!(poll(&mut b).is_pending()); // handed the lead: yields
        assert_eq!(poll(&mut b), Poll::Ready(Some(1010)));
        assert_eq!(poll(&mut c), Poll::Ready(Some(1020)));
        assert_eq!(flushes.batches(), [vec![100], vec![101, 102]]);
        flushes.batches.lock().unwrap().clear();
    }

    #[test]
    fn a_lone_caller_flushes_at_once() {
        let (coalescer, flushes) = (Coalescer::new(), Flushes::default());
        for r in 1..=3 {
            let mut lone = call(&coalescer, &flushes, r);
            assert_eq!(
                poll(&mut lone),
                Poll::Ready(Some(r * 10)),
                "no turn yielded"
            );
        }
        assert_eq!(flushes.batches(), [vec![1], vec![2], vec![3]]);
        // Once calls have met, a leader yields a turn again, then goes
        // back to flushing at once after a flush of its own alone.
        meeting(&coalescer, &flushes);
        let mut next = call(&coalescer, &flushes, 4);
        assert!(poll(&mut next).is_pending());
        assert_eq!(poll(&mut next), Poll::Ready(Some(40)));
        let mut lone = call(&coalescer, &flushes, 5);
        assert_eq!(poll(&mut lone), Poll::Ready(Some(50)));
    }

    #[test]
    fn callers_that_arrive_while_the_leader_yields_share_its_flush() {
        let (coalescer, flushes) = (Coalescer::new(), Flushes::default());
        meeting(&coalescer, &flushes);
        let mut calls: Vec<_> = (0..5).map(|r| call(&coalescer, &flushes, r)).collect();
        for call in &mut calls {
            assert!(poll(call).is_pending());
        }
        // The leader (the first) flushes all five and answers each.
        assert_eq!(poll(&mut calls[0]), Poll::Ready(Some(0)));
        assert_eq!(flushes.batches(), [vec![0, 1, 2, 3, 4]]);
        for (r, call) in calls.iter_mut().enumerate().skip(1) {
            assert_eq!(poll(call), Poll::Ready(Some(r as u32 * 10)));
        }
    }

    #[test]
    fn callers_that_arrive_during_a_flush_go_out_in_the_next_one_led_by_the_first_of_them() {
        let (coalescer, flushes) = (Coalescer::new(), Flushes::default());
        flushes.closed.store(true, Ordering::SeqCst);
        let mut first = call(&coalescer, &flushes, 1);
        assert!(poll(&mut first).is_pending()); // leads alone: flushing [1], gate closed
        let (mut second, mut third) =
            (call(&coalescer, &flushes, 2), call(&coalescer, &flushes, 3));
        assert!(poll(&mut second).is_pending());
        assert!(poll(&mut third).is_pending());

        flushes.closed.store(false, Ordering::SeqCst);
        assert_eq!(poll(&mut first), Poll::Ready(Some(10)));
        // The lead passed to `second`, which yields a turn, then flushes
        // both waiters.
        assert!(poll(&mut second).is_pending());
        assert_eq!(poll(&mut second), Poll::Ready(Some(20)));
        assert_eq!(poll(&mut third), Poll::Ready(Some(30)));
        assert_eq!(flushes.batches(), [vec![1], vec![2, 3]]);
        // Nobody leads now: the next caller leads at once, and since the
        // last flush was shared, yields a turn first.
        let mut fourth = call(&coalescer, &flushes, 4);
        assert!(poll(&mut fourth).is_pending());
        assert_eq!(poll(&mut fourth), Poll::Ready(Some(40)));
    }

    #[test]
    fn a_failed_batch_tells_every_caller_to_ask_alone() {
        let (coalescer, flushes) = (Coalescer::new(), Flushes::default());
        meeting(&coalescer, &flushes);
        let mut calls: Vec<_> = [12, 13, 14].map(|r| call(&coalescer, &flushes, r)).into();
        for call in &mut calls {
            assert!(poll(call).is_pending());
        }
        assert_eq!(poll(&mut calls[0]), Poll::Ready(None));
        assert_eq!(poll(&mut calls[1]), Poll::Ready(None));
        assert_eq!(poll(&mut calls[2]), Poll::Ready(None));
        assert_eq!(flushes.batches(), [vec![12, 13, 14]]);
    }

    #[test]
    fn a_leader_dropped_mid_flush_frees_its_batch_and_the_lead() {
        let (coalescer, flushes) = (Coalescer::new(), Flushes::default());
        meeting(&coalescer, &flushes);
        flushes.closed.store(true, Ordering::SeqCst);
        let mut leader = call(&coalescer, &flushes, 1);
        let mut waiter = call(&coalescer, &flushes, 2);
        assert!(poll(&mut leader).is_pending());
        assert!(poll(&mut waiter).is_pending());
        assert!(poll(&mut leader).is_pending()); // flushing [1, 2]
        let mut late = call(&coalescer, &flushes, 3);
        assert!(poll(&mut late).is_pending()); // waits for the next flush

        drop(leader);
        // The batch's waiter asks alone; the late caller now leads.
        assert_eq!(poll(&mut waiter), Poll::Ready(None));
        flushes.closed.store(false, Ordering::SeqCst);
        assert!(poll(&mut late).is_pending()); // yields
        assert_eq!(poll(&mut late), Poll::Ready(Some(30)));
        assert_eq!(flushes.batches(), [vec![1, 2], vec![3]]);
    }

    #[test]
    fn a_caller_dropped_as_the_lead_reaches_it_passes_the_lead_on() {
        let (coalescer, flushes) = (Coalescer::new(), Flushes::default());
        flushes.closed.store(true, Ordering::SeqCst);
        let mut first = call(&coalescer, &flushes, 1);
        assert!(poll(&mut first).is_pending()); // leads alone: flushing [1]
        let (mut second, mut third) =
            (call(&coalescer, &flushes, 2), call(&coalescer, &flushes, 3));
        assert!(poll(&mut second).is_pending());
        assert!(poll(&mut third).is_pending());
        flushes.closed.store(false, Ordering::SeqCst);
        assert_eq!(poll(&mut first), Poll::Ready(Some(10))); // the lead goes to `second`

        drop(second);
        assert!(poll(&mut third).is_pending()); // leads, yields
        assert_eq!(poll(&mut third), Poll::Ready(Some(30)));
        assert_eq!(flushes.batches(), [vec![1], vec![3]]);
    }
}
