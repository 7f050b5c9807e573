//! The ack window of one consuming channel: the deliveries that settle
//! together are acked with one `basic.ack` (`multiple = true`).
//!
//! A `multiple` ack of tag `T` acks every delivery of the channel up to `T`
//! that is still unacked, so it may only be sent once all of them are
//! settled: the window keeps the channel's deliveries in tag order and acks
//! the settled run at its front. A delivery that settles behind one still
//! running waits up to [`STRAGGLER_WAIT`] for that run to reach it, then is
//! acked on its own, so a slow handler never holds the others' acks for long.
//!
//! Every ack is sent under one lock, in the order the window decided it: a
//! delivery acked on its own is never again inside a later `multiple` ack's
//! range as an unacked tag, and a `multiple` ack never names a tag the broker
//! no longer holds (either would be a channel error).

use std::collections::VecDeque;
use std::future::{Future, poll_fn};
use std::sync::Mutex;
use std::task::{Poll, Waker};
use std::time::Duration;

/// How long a settled delivery waits for the ones before it to settle too,
/// before it is acked on its own.
pub(super) const STRAGGLER_WAIT: Duration = Duration::from_millis(10);

/// Sends one `basic.ack` for a delivery: `lapin::Acker`, or a recorder in
/// the tests.
pub(super) trait Ack: Clone + Send + Sync + 'static {
    /// Acks this delivery, and with `multiple` every unacked one before it on
    /// the channel. `Ok(false)`: the channel is gone, nothing was sent.
    fn ack(&self, multiple: bool) -> impl Future<Output = Result<bool, lapin::Error>> + Send;
}

impl Ack for lapin::Acker {
    fn ack(&self, multiple: bool) -> impl Future<Output = Result<bool, lapin::Error>> + Send {
        lapin::Acker::ack(self, lapin::options::BasicAckOptions { multiple })
    }
}

/// What became of a settled delivery's ack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Acked {
    /// The broker has been told.
    Sent,
    /// The channel failed first: the broker takes the delivery back.
    ChannelGone,
}

/// The deliveries of one consuming channel, in tag order, from the oldest
/// one not yet acked.
pub(super) struct AckWindow<A> {
    state: Mutex<State<A>>,
    /// Held while an ack is decided and sent, so acks leave in order.
    sending: tokio::sync::Mutex<()>,
}

struct State<A> {
    /// The tag of `slots[0]`.
    front: u64,
    slots: VecDeque<Slot<A>>,
    /// Every tag up to this one is acked.
    acked_through: u64,
    /// An ack failed: the channel is gone, and every delivery still here
    /// goes back to the queue.
    failed: bool,
    /// Deliveries whose ack is being sent, waiting to hear it went.
    sending_waiters: Vec<Waker>,
}

/// Where a delivery stands once it settles.
enum Settled {
    /// Nothing before it is unacked: it starts a run.
    AtFront,
    /// A delivery before it is still running.
    Behind,
    /// Nothing to send.
    Done(Acked),
    /// Not handed out through this window: acked on its own.
    Unknown,
}

/// What to send, decided under the sending lock.
enum Step<A> {
    /// The run at the front, acked with its last settled delivery's acker
    /// (`multiple`), through this tag, waking these deliveries.
    Run(A, u64, Vec<Waker>),
    /// This delivery on its own.
    Alone,
    /// An earlier run's ack covers it.
    Covered,
    /// The channel is gone.
    Gone,
}

enum Slot<A> {
    /// Handed out, not settled yet.
    Running,
    /// Settled, waiting for its ack.
    Settled { acker: A, waiter: Option<Waker> },
    /// Acked on its own.
    AckedAlone,
}

impl<A: Ack> AckWindow<A> {
    pub(super) fn new() -> Self {
        AckWindow {
            state: Mutex::new(State {
                front: 0,
                slots: VecDeque::new(),
                acked_through: 0,
                failed: false,
                sending_waiters: Vec::new(),
            }),
            sending: tokio::sync::Mutex::new(()),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State<A>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records a delivery handed out by the channel (tags only grow; a gap is
    /// a tag that is not this consumer's, and never waited for).
    pub(super) fn delivered(&self, tag: u64) {
        let mut state = self.state();
        if state.slots.is_empty() {
            state.front = tag;
        }
        let end = state.front + state.slots.len() as u64;
        if tag < end {
            return;
        }
        for _ in end..tag {
            state.slots.push_back(Slot::AckedAlone);
        }
        state.slots.push_back(Slot::Running);
    }

    /// Acks the delivery `tag` once it is settled: with the run of settled
    /// deliveries it completes or joins, or on its own after
    /// [`STRAGGLER_WAIT`].
    pub(super) async fn ack(&self, tag: u64, acker: &A) -> Result<Acked, lapin::Error> {
        match self.settle(tag, acker) {
            Settled::Done(acked) => return Ok(acked),
            Settled::Unknown => {
                let _sending = self.sending.lock().await;
                return self.send(acker, None, Vec::new()).await;
            }
            // Let the deliveries that settle in the same turn join the run.
            Settled::AtFront => tokio::task::yield_now().await,
            Settled::Behind => {
                if let Ok(acked) = tokio::time::timeout(STRAGGLER_WAIT, self.covered(tag)).await {
                    return Ok(acked);
                }
            }
        }
        let _sending = self.sending.lock().await;
        match self.next_step(tag) {
            Step::Gone => Ok(Acked::ChannelGone),
            // An earlier run took it along, and its ack has been sent.
            Step::Covered => Ok(self.covered(tag).await),
            Step::Run(last, through, waiters) => self.send(&last, Some(through), waiters).await,
            Step::Alone => self.send(acker, None, Vec::new()).await,
        }
    }

    /// Marks `tag` settled.
    fn settle(&self, tag: u64, acker: &A) -> Settled {
        let mut state = self.state();
        if state.failed {
            return Settled::Done(Acked::ChannelGone);
        }
        let end = state.front + state.slots.len() as u64;
        match state.slot(tag) {
            Some(slot @ Slot::Running) => {
                *slot = Slot::Settled {
                    acker: acker.clone(),
                    waiter: None,
                };
            }
            // Settled already: acking it again would be a channel error.
            Some(_) => return Settled::Done(Acked::Sent),
            None if tag < end => return Settled::Done(Acked::Sent),
            None => return Settled::Unknown,
        }
        if tag == state.front {
            Settled::AtFront
        } else {
            Settled::Behind
        }
    }

    /// What to send for `tag`, decided under the sending lock.
    fn next_step(&self, tag: u64) -> Step<A> {
        let mut state = self.state();
        if state.failed {
            Step::Gone
        } else if tag < state.front {
            Step::Covered
        } else if tag == state.front {
            let (last, through, waiters) = state.take_run();
            Step::Run(last, through, waiters)
        } else {
            // Still behind a running delivery: acked on its own.
            match state.slot(tag) {
                Some(slot) => {
                    *slot = Slot::AckedAlone;
                    Step::Alone
                }
                None => Step::Gone,
            }
        }
    }

    /// Sends one ack, `multiple` when it covers a run `through` a tag, and
    /// tells the deliveries waiting for it.
    async fn send(
        &self,
        acker: &A,
        through: Option<u64>,
        mut waiters: Vec<Waker>,
    ) -> Result<Acked, lapin::Error> {
        let sent = acker.ack(through.is_some()).await;
        let mut state = self.state();
        let acked = match sent {
            Ok(true) => {
                if let Some(through) = through {
                    state.acked_through = state.acked_through.max(through);
                }
                Acked::Sent
            }
            Ok(false) | Err(_) => {
                state.failed = true;
                for slot in &mut state.slots {
                    if let Slot::Settled { waiter, .. } = slot {
                        waiters.extend(waiter.take());
                    }
                }
                Acked::ChannelGone
            }
        };
        waiters.append(&mut state.sending_waiters);
        drop(state);
        waiters.into_iter().for_each(Waker::wake);
        sent.map(|_| acked)
    }

    /// Waits until a run's ack covers `tag` (or the channel fails).
    async fn covered(&self, tag: u64) -> Acked {
        poll_fn(|cx| {
            let mut state = self.state();
            if state.failed {
                return Poll::Ready(Acked::ChannelGone);
            }
            if tag <= state.acked_through && tag < state.front {
                return Poll::Ready(Acked::Sent);
            }
            if tag < state.front {
                state.sending_waiters.push(cx.waker().clone());
            } else if let Some(Slot::Settled { waiter, .. }) = state.slot(tag) {
                *waiter = Some(cx.waker().clone());
            }
            Poll::Pending
        })
        .await
    }
}

impl<A> State<A> {
    fn slot(&mut self, tag: u64) -> Option<&mut Slot<A>> {
        let index = tag.checked_sub(self.front)?;
        self.slots.get_mut(usize::try_from(index).ok()?)
    }

    /// Takes the settled run at the front: the acker of its last settled
    /// delivery (a `multiple` ack of it covers the run), the tag to count as
    /// acked through, and the deliveries waiting in it.
    fn take_run(&mut self) -> (A, u64, Vec<Waker>) {
        let mut last = None;
        let mut waiters = Vec::new();
        while let Some(Slot::Settled { .. } | Slot::AckedAlone) = self.slots.front() {
            if let Some(Slot::Settled { acker, waiter }) = self.slots.pop_front() {
                waiters.extend(waiter);
                last = Some(acker);
            }
            self.front += 1;
        }
        let acker = last.expect("the run starts with the caller's settled delivery");
        // The run's end: an `AckedAlone` slot after its last settled one is
        // acked already.
        (acker, self.front - 1, waiters)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::sync::{Arc, Mutex};

    use super::*;

    /// The acks sent, in order: (tag, multiple).
    type Log = Arc<Mutex<Vec<(u64, bool)>>>;

    #[derive(Clone)]
    struct Recorder {
        tag: u64,
        log: Log,
        channel_gone: bool,
    }

    impl Ack for Recorder {
        fn ack(&self, multiple: bool) -> impl Future<Output = Result<bool, lapin::Error>> + Send {
            self.log.lock().unwrap().push((self.tag, multiple));
            std::future::ready(Ok(!self.channel_gone))
        }
    }

    /// A window with `tags` handed out, and an acker for each.
    fn window(tags: std::ops::RangeInclusive<u64>) -> (Arc<AckWindow<Recorder>>, Log) {
        let window = Arc::new(AckWindow::new());
        for tag in tags {
            window.delivered(tag);
        }
        (window, Log::default())
    }

    fn settle(
        window: &Arc<AckWindow<Recorder>>,
        log: &Log,
        tag: u64,
    ) -> tokio::task::JoinHandle<Acked> {
        settle_on(window, log, tag, false)
    }

    /// Waits for every settle of `handles`, each acked.
    async fn all_sent(handles: impl IntoIterator<Item = tokio::task::JoinHandle<Acked>>) {
        for handle in handles {
            assert_eq!(handle.await.unwrap(), Acked::Sent);
        }
    }

    /// Settles `tag` on its own task; `channel_gone`: its ack finds the
    /// channel closed.
    fn settle_on(
        window: &Arc<AckWindow<Recorder>>,
        log: &Log,
        tag: u64,
        channel_gone: bool,
    ) -> tokio::task::JoinHandle<Acked> {
        let (window, acker) = (
            Arc::clone(window),
            Recorder {
                tag,
                log: Arc::clone(log),
                channel_gone,
            },
        );
        tokio::spawn(async move { window.ack(tag, &acker).await.unwrap() })
    }

    /// Replays the acks as RabbitMQ reads them: an ack of a tag the channel
    /// does not hold unacked closes the channel.
    fn broker_accepts(outstanding: impl IntoIterator<Item = u64>, log: &Log) -> BTreeSet<u64> {
        let mut outstanding: BTreeSet<u64> = outstanding.into_iter().collect();
        for &(tag, multiple) in log.lock().unwrap().iter() {
            assert!(
                outstanding.contains(&tag),
                "ack of tag {tag} that is not unacked: channel error ({log:?})"
            );
            if multiple {
                outstanding.retain(|&t| t > tag);
            } else {
                outstanding.remove(&tag);
            }
        }
        outstanding
    }

    #[tokio::test(start_paused = true)]
    async fn deliveries_settled_in_one_turn_share_one_multiple_ack() {
        let (window, log) = window(1..=8);
        let settled: Vec<_> = (1..=8).map(|tag| settle(&window, &log, tag)).collect();
        all_sent(settled).await;
        assert_eq!(*log.lock().unwrap(), [(8, true)]);
        assert!(broker_accepts(1..=8, &log).is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_delivery_behind_a_running_one_is_acked_alone_after_the_wait() {
        let (window, log) = window(1..=3);
        let behind = [settle(&window, &log, 2), settle(&window, &log, 3)];
        all_sent(behind).await;
        assert_eq!(*log.lock().unwrap(), [(2, false), (3, false)]);
        // The run that 1 starts passes over them: its ack names 1 only.
        assert_eq!(settle(&window, &log, 1).await.unwrap(), Acked::Sent);
        assert_eq!(*log.lock().unwrap(), [(2, false), (3, false), (1, true)]);
        assert!(broker_accepts(1..=3, &log).is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_delivery_that_settles_within_the_wait_joins_the_run() {
        let (window, log) = window(1..=2);
        let behind = settle(&window, &log, 2);
        tokio::time::sleep(STRAGGLER_WAIT / 2).await;
        assert_eq!(settle(&window, &log, 1).await.unwrap(), Acked::Sent);
        assert_eq!(behind.await.unwrap(), Acked::Sent);
        assert_eq!(*log.lock().unwrap(), [(2, true)]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_run_stops_at_the_first_running_delivery() {
        let (window, log) = window(1..=4);
        let first = [settle(&window, &log, 1), settle(&window, &log, 2)];
        all_sent(first).await;
        assert_eq!(*log.lock().unwrap(), [(2, true)]);
        // 3 is still running: 4 may not be acked by a `multiple` ack yet.
        assert_eq!(broker_accepts(1..=4, &log), BTreeSet::from([3, 4]));
        let rest = [settle(&window, &log, 3), settle(&window, &log, 4)];
        all_sent(rest).await;
        assert!(broker_accepts(1..=4, &log).is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn any_settle_order_acks_every_delivery_once_without_a_channel_error() {
        // A small linear congruential generator: orders and delays, repeatable.
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = move |bound: u64| {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            (seed >> 33) % bound
        };
        let mut acks = 0;
        for _round in 0..50 {
            let (window, log) = window(1..=40);
            let mut tags: Vec<u64> = (1..=40).collect();
            for i in (1..tags.len()).rev() {
                tags.swap(i, next(i as u64 + 1) as usize);
            }
            let mut settled = Vec::new();
            for tag in tags {
                // Some settle in the same turn, some a while later.
                if next(3) == 0 {
                    tokio::time::sleep(Duration::from_millis(next(15))).await;
                }
                settled.push(settle(&window, &log, tag));
            }
            all_sent(settled).await;
            assert!(broker_accepts(1..=40, &log).is_empty(), "{log:?}");
            acks += log.lock().unwrap().len();
        }
        assert!(acks < 2000, "{acks} acks for 2000 deliveries");
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_ack_tells_every_waiting_delivery_its_channel_is_gone() {
        let (window, log) = window(1..=3);
        let run = [
            settle_on(&window, &log, 1, true),
            settle_on(&window, &log, 2, true),
        ];
        for handle in run {
            assert_eq!(handle.await.unwrap(), Acked::ChannelGone);
        }
        assert_eq!(settle(&window, &log, 3).await.unwrap(), Acked::ChannelGone);
        assert_eq!(*log.lock().unwrap(), [(2, true)]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_second_settle_of_one_delivery_sends_nothing() {
        let (window, log) = window(1..=1);
        assert_eq!(settle(&window, &log, 1).await.unwrap(), Acked::Sent);
        assert_eq!(settle(&window, &log, 1).await.unwrap(), Acked::Sent);
        assert_eq!(*log.lock().unwrap(), [(1, true)]);
    }
}
