//! The consumer loop: reserve while there is room, dispatch each delivery on
//! its own task, settle it, and stop gracefully.

use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::Poll;
use std::time::Duration;

use tokio::sync::{AcquireError, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::broker::{Reserved, Settlement, Transport};
use crate::envelope::{DeadLetterReason, Envelope};
use crate::guard::context::{self, DeliveryContext, HandlerSlot, StoreBatches};
use crate::guard::inflight::{InFlight, Running};
use crate::router::{Delivery, Disposition, ReleaseReason, Router};

use super::Counters;
use super::handoff::Slot;
use super::outage::{Failure, Outage};
use super::settle::{self, Outcome};
use super::{Consumer, ConsumerReport, MAX_BATCH};

/// The first and the longest pause after a broker error.
const BROKER_BACKOFF: (Duration, Duration) = (Duration::from_millis(50), Duration::from_secs(2));

/// The first and the longest pause after reservations that brought only
/// deliveries that went back at once, unattempted, for want of a place to
/// be held back in (copies of an id being run, deliveries of a part of the
/// store that is down). Short: other ids may be queued behind them, and
/// each reservation moves those it brought to the back of the queue.
const BUSY_BACKOFF: (Duration, Duration) = (Duration::from_millis(10), Duration::from_millis(100));

/// What every delivery task of one run shares.
struct Shared<T: Transport> {
    router: Arc<Router>,
    transport: Arc<T>,
    counters: Arc<Counters>,
    queue: Arc<str>,
    dead_letter_queue: Arc<str>,
    max_body_bytes: Option<usize>,
    delivery_timeout: Option<Duration>,
    release_delay: Duration,
    keep_alive: Option<Duration>,
    /// Handler slots: one per delivery being handled.
    slots: Arc<Semaphore>,
    /// Places for deliveries reserved ahead, waiting for a handler slot.
    ahead: Arc<Semaphore>,
    /// How many places ahead must be free before the consumer reserves
    /// for them alone (a free handler slot reserves at once).
    refill: u32,
    /// Places for deliveries that wait without a handler slot (a backoff,
    /// a release delay, an ack or a mark on its way).
    waiting: Arc<Semaphore>,
    /// Places for deliveries held back unattempted: copies of an id
    /// waiting for its run to end, and deliveries whose part of the store
    /// is down. Apart from `waiting`, so neither a burst of one id nor a
    /// shard's outage takes the places the other ids' waits need.
    held_back: Arc<Semaphore>,
    /// The ids being dispatched.
    inflight: Arc<InFlight>,
    /// Where the guards' store calls meet; `None`: one call per message.
    batches: Option<Arc<StoreBatches>>,
}

impl<T: Transport> Consumer<T> {
    /// Consumes until `shutdown` completes, then stops gracefully: no new
    /// reservations; in-flight deliveries get the shutdown timeout to finish
    /// and settle; those still running are dropped (their handlers' guards
    /// leave their ids unmarked) and left unsettled for the broker's recovery.
    /// Returns the totals.
    ///
    /// Broker errors never end the loop: it logs them and tries again with
    /// backoff, so a broker restart only pauses it; nor do store outages,
    /// which pause reservations until the store answers. The report's
    /// [`failing`](ConsumerReport::failing) says whether the consumer was
    /// failing when it stopped.
    pub async fn run_until<F: Future<Output = ()>>(&self, shutdown: F) -> ConsumerReport {
        let shared = Arc::new(Shared {
            router: Arc::clone(&self.router),
            transport: Arc::clone(&self.transport),
            counters: Arc::clone(&self.counters),
            queue: Arc::clone(&self.queue),
            dead_letter_queue: Arc::clone(&self.dead_letter_queue),
            max_body_bytes: self.max_body_bytes,
            delivery_timeout: self.delivery_timeout,
            release_delay: self.release_delay,
            keep_alive: self.keep_alive,
            slots: Arc::new(Semaphore::new(self.concurrency)),
            ahead: Arc::new(Semaphore::new(self.read_ahead)),
            refill: u32::try_from(self.read_ahead.div_ceil(2).max(1)).unwrap_or(u32::MAX),
            waiting: Arc::new(Semaphore::new(self.max_waiting)),
            held_back: Arc::new(Semaphore::new(self.max_held_back)),
            inflight: Arc::default(),
            batches: self.batches_store_calls().then(Arc::default),
        });
        let outage = &self.counters.outage;
        let mut tasks = JoinSet::new();
        let mut idle = Backoff::new(self.idle_poll);
        let mut broker = Backoff::new(BROKER_BACKOFF);
        let mut bounced = Backoff::new(BUSY_BACKOFF);
        // The reservations whose deliveries' fates are not all known yet.
        let mut tallies: Vec<Arc<Tally>> = Vec::new();
        tokio::pin!(shutdown);

        loop {
            while let Some(joined) = tasks.try_join_next() {
                report_task_end(joined);
            }
            // While the store is down: nothing until the pause is over, then
            // one delivery to probe it.
            let width = tokio::select! {
                biased;
                () = &mut shutdown => break,
                width = outage.gate(MAX_BATCH) => width,
            };
            // Wait for room: a handler slot, else half the places ahead (so
            // that one reservation fetches several deliveries while those
            // still ahead keep the handlers busy); then take whatever else
            // is free, slots first.
            let mut room = tokio::select! {
                biased;
                () = &mut shutdown => break,
                permit = Arc::clone(&shared.slots).acquire_owned() => {
                    vec![Room::Slot(permit.expect("the consumer never closes its semaphore"))]
                }
                permit = Arc::clone(&shared.ahead).acquire_many_owned(shared.refill) => {
                    let mut places = permit.expect("the consumer never closes its semaphore");
                    let mut room = Vec::with_capacity(places.num_permits());
                    while places.num_permits() > 1 {
                        let place = places.split(1).expect("it holds more than one permit");
                        room.push(Room::Ahead(place));
                    }
                    room.push(Room::Ahead(places));
                    room
                }
            };
            // A probe while the store is down is one delivery.
            room.truncate(width);
            tokio::task::yield_now().await;
            while room.len() < width {
                match Arc::clone(&shared.slots).try_acquire_owned() {
                    Ok(permit) => room.push(Room::Slot(permit)),
                    Err(_) => break,
                }
            }
            while room.len() < width {
                match Arc::clone(&shared.ahead).try_acquire_owned() {
                    Ok(permit) => room.push(Room::Ahead(permit)),
                    Err(_) => break,
                }
            }

            // A delivery with no place to be held back in goes straight back
            // unattempted: a copy of a busy id beyond their places
            // (`take_turn`), one whose part of the store is down
            // (`held_back`). When the latest reservation whose deliveries'
            // fates are all known brought nothing else, a short pause comes
            // first, as after an empty one: a burst of one id, or the ids of
            // a shard without a replica, are not spun through the broker
            // at full speed. One other delivery in it means other work is
            // queued: no pause.
            if let Some(all_busy) = Tally::latest_decided(&mut tallies) {
                if all_busy {
                    if stand_by(room, outage, bounced.next(), &mut shutdown).await {
                        break;
                    }
                    continue;
                }
                bounced.reset();
            }

            // Not raced against `shutdown`: a reservation dropped half-way
            // would sit in the broker until its recovery.
            self.counters.reserve_calls.fetch_add(1, Ordering::Relaxed);
            let batch = match self.transport.reserve(&self.queue, room.len()).await {
                Ok(batch) => {
                    broker.reset();
                    self.counters.reserved(batch.is_empty());
                    batch
                }
                Err(error) => {
                    self.counters.reserve_failed(&error);
                    tracing::warn!(queue = &*self.queue, %error, "babel-idem: reserving failed; trying again");
                    if stand_by(room, outage, broker.next(), &mut shutdown).await {
                        break;
                    }
                    continue;
                }
            };
            if batch.is_empty() {
                if stand_by(room, outage, idle.next(), &mut shutdown).await {
                    break;
                }
                continue;
            }
            idle.reset();

            let count = batch.len() as u64;
            self.counters.delivered.fetch_add(count, Ordering::Relaxed);
            self.counters.in_flight.fetch_add(count, Ordering::Relaxed);
            let tally = Arc::new(Tally::new(batch.len()));
            tallies.push(Arc::clone(&tally));
            for (reserved, room) in batch.into_iter().zip(room) {
                let room = queue_for_slot(&shared.slots, room).await;
                tasks.spawn(handle(
                    Arc::clone(&shared),
                    reserved,
                    room,
                    Arc::clone(&tally),
                ));
            }
        }

        self.drain(tasks).await;
        self.progress().report()
    }

    /// Consumes until the process is stopped (a future that never completes).
    pub async fn run(&self) -> ConsumerReport {
        self.run_until(std::future::pending()).await
    }

    /// Waits for the in-flight deliveries up to the shutdown timeout, then
    /// drops the rest unsettled.
    async fn drain(&self, mut tasks: JoinSet<()>) {
        let finished = tokio::time::timeout(self.shutdown_timeout, async {
            while let Some(joined) = tasks.join_next().await {
                report_task_end(joined);
            }
        })
        .await;
        if finished.is_err() {
            let unfinished = tasks.len() as u64;
            tracing::warn!(
                queue = &*self.queue,
                unfinished,
                "babel-idem: shutdown timeout reached; unfinished deliveries are left for the broker's recovery"
            );
            self.counters
                .unfinished
                .fetch_add(unfinished, Ordering::Relaxed);
            self.counters
                .in_flight
                .fetch_sub(unfinished, Ordering::Relaxed);
            tasks.abort_all();
            while tasks.join_next().await.is_some() {}
        }
    }
}

/// What became of one reservation's deliveries: how many are yet to be
/// known, and how many went back to the broker at once, unattempted, for
/// want of a place to be held back in (a copy of a busy id, a delivery
/// whose part of the store is down).
struct Tally {
    count: usize,
    undecided: AtomicUsize,
    back_at_once: AtomicUsize,
}

impl Tally {
    fn new(count: usize) -> Self {
        Tally {
            count,
            undecided: AtomicUsize::new(count),
            back_at_once: AtomicUsize::new(0),
        }
    }

    /// One delivery's fate is known: it went back at once, or not (it ran,
    /// or it waits held back).
    fn decided(&self, back_at_once: bool) {
        if back_at_once {
            self.back_at_once.fetch_add(1, Ordering::Relaxed);
        }
        self.undecided.fetch_sub(1, Ordering::Release);
    }

    /// Drops the reservations whose deliveries' fates are all known;
    /// whether the latest of them all went back at once (`None`: none is
    /// known whole yet).
    fn latest_decided(tallies: &mut Vec<Arc<Tally>>) -> Option<bool> {
        let mut latest = None;
        tallies.retain(|tally| {
            if tally.undecided.load(Ordering::Acquire) > 0 {
                return true;
            }
            latest = Some(tally.back_at_once.load(Ordering::Relaxed) >= tally.count);
            false
        });
        latest
    }
}

/// A delivery's share of its reservation's [`Tally`], told once.
struct Fate<'t>(Option<&'t Tally>);

impl Fate<'_> {
    fn decided(&mut self, back_at_once: bool) {
        if let Some(tally) = self.0.take() {
            tally.decided(back_at_once);
        }
    }
}

impl Drop for Fate<'_> {
    /// A delivery that ends any other way (it ran, it was settled) did not
    /// go back at once.
    fn drop(&mut self) {
        self.decided(false);
    }
}

/// A request for a handler slot, in the semaphore's queue.
type SlotRequest = Pin<Box<dyn Future<Output = Result<OwnedSemaphorePermit, AcquireError>> + Send>>;

/// The room a reserved delivery holds in the consumer.
enum Room {
    /// A handler slot: the delivery is dispatched at once.
    Slot(OwnedSemaphorePermit),
    /// A place ahead, before it asked for a slot.
    Ahead(OwnedSemaphorePermit),
    /// A place ahead, and its place in the slots' queue.
    Queued(OwnedSemaphorePermit, SlotRequest),
}

/// Puts a delivery reserved ahead in the slots' queue before its task
/// starts (and before the loop asks for a slot again): the semaphore is
/// first come, first served, so deliveries reach a handler in the order
/// reserved, whatever order their tasks first run in.
async fn queue_for_slot(slots: &Arc<Semaphore>, room: Room) -> Room {
    let Room::Ahead(place) = room else {
        return room;
    };
    let mut request: SlotRequest = Box::pin(Arc::clone(slots).acquire_owned());
    match poll_fn(|cx| Poll::Ready(request.as_mut().poll(cx))).await {
        Poll::Ready(permit) => Room::Slot(permit.expect("the consumer never closes its semaphore")),
        Poll::Pending => Room::Queued(place, request),
    }
}

/// The task of one delivery: wait for a handler slot (when reserved ahead),
/// dispatch, wait, then settle. Holds a handler slot while it dispatches,
/// up to its guard's mark ([`handoff`]); acks without one when a waiting
/// place is free, so the next delivery's handler runs while this one's ack
/// is on its way. The reservation is kept alive until it settles.
///
/// `tally` is its reservation's: the delivery tells it whether it went
/// back at once, unattempted.
async fn handle<T: Transport>(
    shared: Arc<Shared<T>>,
    reserved: Reserved<T::Handle>,
    room: Room,
    tally: Arc<Tally>,
) {
    let Reserved {
        body,
        headers,
        attempts,
        poison,
        handle,
    } = reserved;
    let decided = async {
        let permit = match room {
            Room::Slot(permit) => Ok(permit),
            Room::Ahead(place) => {
                let permit = Arc::clone(&shared.slots).acquire_owned().await;
                drop(place);
                permit
            }
            Room::Queued(place, request) => {
                let permit = request.await;
                drop(place);
                permit
            }
        }
        .expect("the consumer never closes its semaphore");
        let mut slot = Some(permit);
        let decided = decide(
            &shared,
            Received {
                body,
                headers,
                attempts,
                poison,
            },
            &mut slot,
            Fate(Some(&tally)),
        )
        .await;
        (decided, slot)
    };
    let ((outcome, settlement), mut slot) = kept_alive(&shared, &handle, decided).await;
    let settle = settle_until_done(&shared, &handle, &settlement, outcome);
    match settlement {
        // An ack appends nothing anywhere: the next handler may start
        // before it is done.
        Settlement::Ack => without_slot(&shared, &mut slot, settle).await,
        // A requeue or a dead-letter record appends to a list: with its slot
        // held, one consumer at concurrency 1 appends in the order it
        // handled the deliveries (but for one whose mark failed after it
        // handed its slot on at that mark).
        Settlement::Requeue(_) | Settlement::DeadLetter { .. } => settle.await,
    }
    shared.counters.in_flight.fetch_sub(1, Ordering::Relaxed);
    drop(slot);
}

/// What [`decide`] takes of a [`Reserved`] delivery: all but its handle.
struct Received {
    body: Vec<u8>,
    headers: Vec<(String, String)>,
    attempts: Option<u64>,
    poison: bool,
}

/// Dispatches one delivery (one of its id at a time, within the timeout)
/// and waits out its backoff or release delay: how to settle it.
async fn decide<T: Transport>(
    shared: &Shared<T>,
    received: Received,
    slot: &mut Option<OwnedSemaphorePermit>,
    mut fate: Fate<'_>,
) -> (Outcome, Settlement) {
    let Received {
        body,
        headers,
        attempts,
        poison,
    } = received;
    let (queue, dead_letter_queue) = (&*shared.queue, &*shared.dead_letter_queue);
    if let Some(limit) = shared.max_body_bytes
        && body.len() > limit
    {
        return (
            Outcome::DeadLettered,
            settle::oversized(&body, limit, queue, dead_letter_queue),
        );
    }
    if poison {
        return (
            Outcome::DeadLettered,
            settle::undecoded(&body, queue, dead_letter_queue),
        );
    }
    let decoded = Envelope::from_slice(&body);
    let id = decoded
        .as_ref()
        .ok()
        .and_then(|envelope| envelope.meta.id.as_deref())
        .filter(|id| !id.is_empty());
    let running = match id {
        Some(id) => match take_turn(shared, id, slot, &mut fate).await {
            Some(running) => Some(running),
            // Not attempted: it goes back unchanged, no attempt spent.
            None => {
                shared.counters.id_busy.fetch_add(1, Ordering::Relaxed);
                return (Outcome::Released, Settlement::Requeue(body));
            }
        },
        None => None,
    };

    let counted = match attempts {
        Some(attempts) => Delivery::new().with_attempts(attempts),
        None => Delivery::new(),
    };
    let delivery = headers
        .into_iter()
        .fold(counted.with_queue(queue), |delivery, (name, value)| {
            delivery.with_header(name, value)
        });
    let replay = delivery.is_replay();
    // The delivery's hold on its handler slot, which its guards reach
    // through its context; the dispatch (and its guard's mark) over, the
    // next delivery of the id may go: `running` ends with the hold.
    let handoff = Slot::new(&shared.slots, &shared.waiting, slot.take(), running);
    let context = DeliveryContext::new(
        shared.batches.clone(),
        Some(Arc::clone(&handoff) as Arc<dyn HandlerSlot>),
        replay,
    );
    // Boxed: the dispatch's state is most of the task's, and a smaller task
    // is cheaper to spawn and to move.
    let dispatch = Box::pin(context::scope(
        context,
        shared.router.dispatch_decoded(&body, decoded, delivery),
    ));
    let dispatched = match shared.delivery_timeout {
        None => Ok(dispatch.await),
        Some(timeout) => tokio::time::timeout(timeout, dispatch).await,
    };
    let (disposition, part_down) = match dispatched {
        Ok((disposition, context)) => (disposition, context.is_some_and(|c| c.part_down())),
        Err(_) => {
            let timeout = shared.delivery_timeout.unwrap_or_default();
            shared.counters.timed_out.fetch_add(1, Ordering::Relaxed);
            let delivery = Delivery::new().with_queue(queue);
            (shared.router.timed_out(&body, &delivery, timeout), false)
        }
    };
    // The context, and with it its share of the hand-off, is gone.
    *slot = handoff.end();
    let hold = note_store(shared, &disposition, part_down);

    // A retry waits its backoff, a release its delay, before going back, so
    // neither spins on the queue; a store outage pauses the whole consumer
    // instead, and a partial one holds the delivery back (`hold`).
    let wait = match &disposition {
        Disposition::Retry(retry) => retry.backoff,
        Disposition::Release {
            reason: ReleaseReason::StoreUnavailable,
            ..
        } => None,
        Disposition::Release { delay, .. } => Some(delay.unwrap_or(shared.release_delay)),
        _ => None,
    };
    let settlement = settle::settlement_for(disposition, &body, queue, dead_letter_queue);
    drop(body);
    if let Some(hold) = hold {
        held_back(shared, slot, hold, &mut fate).await;
    }
    if let Some(wait) = wait.filter(|wait| !wait.is_zero()) {
        // Boxed: a timer is large, and only the deliveries that wait pay
        // for one.
        without_slot(shared, slot, Box::pin(tokio::time::sleep(wait))).await;
    }
    settlement
}

/// Enters `id` in the registry, waiting (within the per-delivery timeout)
/// while another delivery of it runs; then holds a slot again. `None` when
/// this delivery must go back to the broker unattempted: every place for
/// deliveries held back is taken, or the run it waited for went on past
/// the timeout.
///
/// Invariant: a copy waiting for its id holds no handler slot and no place
/// ahead, only a place for deliveries held back. A waiter that held a slot could
/// keep the id's next run (a waiter that won the turn without one) from
/// ever getting one: with every slot held by copies waiting for that very
/// run, the consumer would stall until the timeout. Beyond the places, a
/// copy is settled at once by going back unchanged; by the time it comes
/// again its id has run, and its guard skips it (or runs it, if that run
/// failed).
async fn take_turn<T: Transport>(
    shared: &Shared<T>,
    id: &str,
    slot: &mut Option<OwnedSemaphorePermit>,
    fate: &mut Fate<'_>,
) -> Option<Running> {
    let give_up = shared
        .delivery_timeout
        .map(|timeout| Instant::now() + timeout);
    let turn = match shared.inflight.enter(id) {
        Ok(running) => return Some(running),
        Err(turn) => turn,
    };
    shared
        .counters
        .waited_for_id
        .fetch_add(1, Ordering::Relaxed);
    let Ok(place) = Arc::clone(&shared.held_back).try_acquire_owned() else {
        fate.decided(true);
        // Its going back needs no order kept: the slot goes to the next
        // delivery now, not after the settle's round trip.
        drop(slot.take());
        tracing::debug!(
            queue = &*shared.queue,
            message_id = id,
            "babel-idem: every place for deliveries held back is taken; handing this copy of a busy id back"
        );
        return None;
    };
    fate.decided(false);
    drop(slot.take());
    let running = match give_up {
        Some(at) => tokio::time::timeout_at(at, turn).await.ok(),
        None => Some(turn.await),
    };
    let Some(running) = running else {
        tracing::warn!(
            queue = &*shared.queue,
            message_id = id,
            "babel-idem: another delivery of this id ran past the timeout; handing this one back"
        );
        return None;
    };
    // The place is kept until a slot is had: those that won their turn and
    // wait for a slot stay bounded too.
    let permit = Arc::clone(&shared.slots).acquire_owned().await;
    *slot = Some(permit.expect("the consumer never closes its semaphore"));
    drop(place);
    Some(running)
}

/// Runs `wait` without holding a handler slot, when a waiting place is
/// free (else with it: the number waiting is bounded). The slot is not
/// taken back: who needs one again asks for it.
async fn without_slot<T: Transport, F: Future>(
    shared: &Shared<T>,
    slot: &mut Option<OwnedSemaphorePermit>,
    wait: F,
) -> F::Output {
    match Arc::clone(&shared.waiting).try_acquire_owned() {
        Ok(place) => {
            drop(slot.take());
            let output = wait.await;
            drop(place);
            output
        }
        Err(_) => wait.await,
    }
}

/// Keeps the reservation of `handle` alive while `work` runs, where the
/// transport can.
async fn kept_alive<T: Transport, F: Future>(
    shared: &Shared<T>,
    handle: &T::Handle,
    work: F,
) -> F::Output {
    let Some(every) = shared.keep_alive else {
        return work.await;
    };
    let renew = async {
        loop {
            tokio::time::sleep(every).await;
            match shared.transport.extend(handle).await {
                Ok(true) => {}
                Ok(false) => {
                    tracing::warn!(
                        queue = &*shared.queue,
                        "babel-idem: a reservation lapsed while it was held; it may be delivered again"
                    );
                    std::future::pending::<()>().await;
                }
                Err(error) => {
                    shared
                        .counters
                        .broker_errors
                        .fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(queue = &*shared.queue, %error, "babel-idem: extending a reservation failed; trying again");
                }
            }
        }
    };
    tokio::select! {
        biased;
        output = work => output,
        () = renew => unreachable!("the renewal loop never ends"),
    }
}

/// Tells the outage watch what `disposition` says about the store; how
/// long a delivery whose store failed is held back before it goes back:
/// `Some` in a partial outage (the store answers other deliveries, or
/// `part_down`: it said the failure concerns a part of it only).
fn note_store<T: Transport>(
    shared: &Shared<T>,
    disposition: &Disposition,
    part_down: bool,
) -> Option<Duration> {
    let counters = &shared.counters;
    let answered = match disposition {
        Disposition::Release {
            reason: ReleaseReason::StoreUnavailable,
            ..
        } => {
            counters.store_unavailable.fetch_add(1, Ordering::Relaxed);
            return match counters.outage.failed(part_down) {
                Failure::Started => {
                    counters.store_outages.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(
                        queue = &*shared.queue,
                        "babel-idem: the store is unavailable; pausing reservations until it answers (no attempt is spent)"
                    );
                    None
                }
                Failure::Down => None,
                Failure::Partial { hold, first } => {
                    if first {
                        tracing::warn!(
                            queue = &*shared.queue,
                            "babel-idem: the store fails for some deliveries while it answers others (a part of it is down); those are held back and go back unattempted, the others go on"
                        );
                    }
                    Some(hold)
                }
            };
        }
        Disposition::Ack | Disposition::Retry(_) => true,
        Disposition::Release {
            reason: ReleaseReason::Parked,
            ..
        } => true,
        Disposition::DeadLetter(dead) => dead.reason == DeadLetterReason::Failed,
        _ => false,
    };
    if answered && counters.outage.answered() {
        tracing::info!(
            queue = &*shared.queue,
            "babel-idem: the store answers again; resuming reservations"
        );
    }
    None
}

/// Holds a delivery back for `hold` in one of the places for deliveries
/// held back unattempted, without its handler slot: a delivery whose part
/// of the store is down waits there, so its id does not spin through the
/// broker while the consumer goes on with the others. Without a free place
/// it goes back at once (told to `fate`): it must not keep a slot the other
/// ids need.
async fn held_back<T: Transport>(
    shared: &Shared<T>,
    slot: &mut Option<OwnedSemaphorePermit>,
    hold: Duration,
    fate: &mut Fate<'_>,
) {
    drop(slot.take());
    match Arc::clone(&shared.held_back).try_acquire_owned() {
        Ok(place) => {
            fate.decided(false);
            Box::pin(tokio::time::sleep(hold)).await;
            drop(place);
        }
        Err(_) => fate.decided(true),
    }
}

/// Settles, retrying a failing broker with backoff: the dispatch is done, so
/// giving up would only leave the delivery to be handled again. Stops when
/// the consumer's shutdown aborts the task.
async fn settle_until_done<T: Transport>(
    shared: &Shared<T>,
    handle: &T::Handle,
    settlement: &Settlement,
    outcome: Outcome,
) {
    let counters = &shared.counters;
    let mut backoff = Backoff::new(BROKER_BACKOFF);
    loop {
        match shared.transport.settle(handle, settlement).await {
            Ok(true) => return counters.count(outcome),
            Ok(false) => {
                counters.lapsed.fetch_add(1, Ordering::Relaxed);
                return;
            }
            Err(error) => {
                counters.broker_errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(queue = &*shared.queue, settlement = settlement.kind(), %error, "babel-idem: settling failed; trying again");
                Box::pin(tokio::time::sleep(backoff.next())).await;
            }
        }
    }
}

/// Gives the room back and the probe up (nothing was reserved for them),
/// then sleeps `delay` unless `shutdown` completes first; `true` when it did.
async fn stand_by<F: Future<Output = ()>>(
    room: Vec<Room>,
    outage: &Outage,
    delay: Duration,
    shutdown: &mut std::pin::Pin<&mut F>,
) -> bool {
    drop(room);
    outage.probe_unused();
    tokio::select! {
        biased;
        () = shutdown.as_mut() => true,
        () = tokio::time::sleep(delay) => false,
    }
}

fn report_task_end(joined: Result<(), tokio::task::JoinError>) {
    // Dispatch catches handler panics; this would be a bug in the consumer
    // itself. The delivery stays reserved for recovery.
    if let Err(error) = joined
        && error.is_panic()
    {
        tracing::error!(%error, "babel-idem: a delivery task panicked; its delivery is left for recovery");
    }
}

/// A doubling pause between `first` and `max`.
struct Backoff {
    first: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    fn new((first, max): (Duration, Duration)) -> Self {
        Backoff {
            first,
            max,
            next: first,
        }
    }

    fn next(&mut self) -> Duration {
        let now = self.next;
        self.next = (self.next * 2).min(self.max);
        now
    }

    fn reset(&mut self) {
        self.next = self.first;
    }
}
