//! The ids a consumer is running right now: one delivery per `meta.id` at
//! a time in one consumer.
//!
//! A delivery [`enter`](InFlight::enter)s its id before dispatch. The first
//! gets a [`Running`] entry and runs; a second delivery of the same id gets
//! a [`Busy`] handle instead and waits until the first's entry is dropped
//! (its dispatch, and so its guard's `remember`, is over, or its task was
//! dropped), then enters again: its guard then skips it (the first ran) or
//! runs it (the first failed). Whatever the mode, the process never runs
//! one id twice at once; claim mode's lease still decides between
//! processes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::watch;

/// The ids being dispatched, each with the channel its waiters watch.
#[derive(Debug, Default)]
pub(super) struct InFlight {
    ids: Mutex<HashMap<Box<str>, watch::Sender<()>>>,
}

/// What [`InFlight::enter`] found.
pub(super) enum Entered {
    /// The id was free: this delivery runs it; dropping this frees it.
    Running(Running),
    /// Another delivery of the id is running.
    Busy(Busy),
}

/// The right to run one id, until dropped.
#[derive(Debug)]
pub(super) struct Running {
    registry: Arc<InFlight>,
    id: Box<str>,
}

/// A wait for another delivery of the same id to end.
#[derive(Debug)]
pub(super) struct Busy(watch::Receiver<()>);

impl InFlight {
    /// Enters `id`: [`Entered::Running`] when no delivery of it is running.
    pub(super) fn enter(self: &Arc<Self>, id: &str) -> Entered {
        let mut ids = self.ids.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(running) = ids.get(id) {
            return Entered::Busy(Busy(running.subscribe()));
        }
        ids.insert(id.into(), watch::Sender::new(()));
        Entered::Running(Running {
            registry: Arc::clone(self),
            id: id.into(),
        })
    }

    /// How many ids are running.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.ids.lock().unwrap_or_else(PoisonError::into_inner).len()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let sender = self
            .registry
            .ids
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.id);
        // Dropped outside the lock: its waiters wake up.
        drop(sender);
    }
}

impl Busy {
    /// Completes once the running delivery of the id has ended.
    pub(super) async fn ended(mut self) {
        // Only the sender's drop ends it: nothing is ever sent.
        while self.0.changed().await.is_ok() {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_second_delivery_of_a_running_id_waits_until_the_first_ends() {
        let registry = Arc::new(InFlight::default());
        let Entered::Running(first) = registry.enter("id-1") else {
            panic!("a free id runs");
        };
        let Entered::Busy(busy) = registry.enter("id-1") else {
            panic!("a running id is busy");
        };
        assert!(matches!(registry.enter("id-2"), Entered::Running(_)));
        let mut waiting = tokio::spawn(busy.ended());
        assert!(
            tokio::time::timeout(Duration::from_millis(50), &mut waiting)
                .await
                .is_err(),
            "the wait lasts while the first runs"
        );
        drop(first);
        waiting.await.unwrap();
        assert_eq!(registry.len(), 0, "an ended id leaves the registry");
        assert!(matches!(registry.enter("id-1"), Entered::Running(_)));
    }

    #[tokio::test]
    async fn a_wait_that_starts_after_the_first_ended_returns_at_once() {
        let registry = Arc::new(InFlight::default());
        let Entered::Running(first) = registry.enter("id-1") else {
            panic!("a free id runs");
        };
        let Entered::Busy(busy) = registry.enter("id-1") else {
            panic!("a running id is busy");
        };
        drop(first);
        tokio::time::timeout(Duration::from_secs(5), busy.ended())
            .await
            .expect("the ended entry is seen");
    }
}
