//! A delivery's handler slot, handed on while its guard records the run.
//!
//! Once a handler has returned `Ok` and its guard sends the mark (or the
//! claim's commit), the handler's work is over: the slot goes to the next
//! delivery, whose guard asks its store while this mark is on its way
//! rather than after it. At concurrency 1 that takes one store round trip
//! off every message's path.
//!
//! Invariants:
//! - Handler bodies never outnumber the slots. A guard about to run a body
//!   for a delivery that handed its slot on (a handler that calls a second
//!   guard after the first marked) takes a slot back first.
//! - A delivery goes on without its slot only with a waiting place, so
//!   those that do are bounded as the deliveries that wait are.
//! - The delivery keeps its id's turn until its dispatch ends: the next
//!   delivery of the same id still waits for the mark.
//! - Taking a slot back never waits on a delivery that waits for this one:
//!   a delivery waiting for its id's turn holds no slot.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::guard::context::{HandlerSlot, TakeBack};
use crate::guard::inflight::Running;

/// One delivery's hold on a handler slot while it dispatches; its guards
/// reach it through the delivery's context.
pub(super) struct Slot {
    held: Mutex<Held>,
    /// The delivery's turn on its id, if it has an id: held until the
    /// dispatch ends, so the next delivery of the id waits for the mark.
    #[allow(dead_code, reason = "held for its drop")]
    running: Option<Running>,
    slots: Arc<Semaphore>,
    waiting: Arc<Semaphore>,
}

enum Held {
    /// A handler slot: a body may run.
    Slot(OwnedSemaphorePermit),
    /// Handed on, for this waiting place.
    HandedOn(#[allow(dead_code, reason = "held for its drop")] OwnedSemaphorePermit),
    /// Neither: the delivery came to its dispatch without a slot.
    Nothing,
}

impl Slot {
    /// The hold of a delivery that comes to its dispatch with `slot` (a
    /// handler slot, or `None`) and `running` (its id's turn, dropped when
    /// the hold is [`ended`](Slot::end)).
    pub(super) fn new(
        slots: &Arc<Semaphore>,
        waiting: &Arc<Semaphore>,
        slot: Option<OwnedSemaphorePermit>,
        running: Option<Running>,
    ) -> Arc<Self> {
        Arc::new(Slot {
            held: Mutex::new(match slot {
                Some(permit) => Held::Slot(permit),
                None => Held::Nothing,
            }),
            running,
            slots: Arc::clone(slots),
            waiting: Arc::clone(waiting),
        })
    }

    /// The dispatch is over (and its context dropped, so this is the hold's
    /// last owner): the id's turn ends; the slot, unless the delivery
    /// handed it on.
    pub(super) fn end(self: Arc<Self>) -> Option<OwnedSemaphorePermit> {
        let held = std::mem::replace(&mut *self.held(), Held::Nothing);
        drop(self);
        match held {
            Held::Slot(permit) => Some(permit),
            Held::HandedOn(_) | Held::Nothing => None,
        }
    }

    fn held(&self) -> MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    async fn take_slot_back(&self) {
        let permit = Arc::clone(&self.slots)
            .acquire_owned()
            .await
            .expect("the consumer never closes its semaphore");
        *self.held() = Held::Slot(permit);
    }
}

impl HandlerSlot for Slot {
    fn marking(&self) {
        let mut held = self.held();
        if !matches!(*held, Held::Slot(_)) {
            return;
        }
        // Without a waiting place the slot is kept: the handler's work is
        // over all the same, only the next delivery starts later.
        if let Ok(place) = Arc::clone(&self.waiting).try_acquire_owned() {
            *held = Held::HandedOn(place);
        }
    }

    fn handed_on(&self) -> bool {
        matches!(*self.held(), Held::HandedOn(_))
    }

    fn take_back(self: Arc<Self>) -> TakeBack {
        Box::pin(async move { self.take_slot_back().await })
    }
}
