//! The consumer's batching of its guards' store calls: while a consumer
//! holds more than one delivery, the `seen` and `remember` calls its guards
//! make to a store that answers a batch in one round trip
//! ([`Store::batch_target`]) meet, as in [`Batched`](crate::store::Batched).

use std::sync::{Arc, Mutex, PoisonError};

use crate::coalesce::Coalescer;
use crate::store::{BatchTarget, Store, StoreError, StoreFuture};

tokio::task_local! {
    /// The batches of the consumer whose delivery this task runs; `None`
    /// where it does not batch.
    static BATCHES: Option<Arc<Batches>>;
}

/// The most stores a consumer batches for. A guard that builds a store per
/// delivery (each one a new object) would otherwise grow the list for
/// ever; past the bound, the calls to a store not listed go one by one.
const MOST_TARGETS: usize = 16;

/// One consumer's meeting points, one per store its guards call.
#[derive(Default)]
pub(super) struct Batches {
    targets: Mutex<Vec<(BatchTarget, Arc<Meeting>)>>,
}

/// Where the calls to one store meet.
struct Meeting {
    seen: Coalescer<Box<str>, bool>,
    remember: Coalescer<Box<str>, ()>,
}

impl Batches {
    fn meeting(&self, target: BatchTarget) -> Option<Arc<Meeting>> {
        let mut targets = self.targets.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, meeting)) = targets.iter().find(|(kept, _)| *kept == target) {
            return Some(Arc::clone(meeting));
        }
        if targets.len() >= MOST_TARGETS {
            return None;
        }
        let meeting = Arc::new(Meeting {
            seen: Coalescer::new(),
            remember: Coalescer::new(),
        });
        targets.push((target, Arc::clone(&meeting)));
        Some(meeting)
    }
}

/// Runs `future` (one delivery's dispatch) with its guards' calls sent
/// through `batches`, or one by one for `None`.
pub(super) async fn scope<F: std::future::Future>(
    batches: Option<Arc<Batches>>,
    future: F,
) -> F::Output {
    BATCHES.scope(batches, future).await
}

/// Where `store`'s calls meet, inside a batching consumer's delivery.
fn meeting_for<S: Store + ?Sized>(store: &S) -> Option<Arc<Meeting>> {
    let target = store.batch_target()?;
    BATCHES
        .try_with(|batches| batches.as_ref().and_then(|batches| batches.meeting(target)))
        .ok()
        .flatten()
}

/// `store.seen(id)`, sent with the calls that meet it when the caller runs
/// in a batching consumer's delivery.
#[inline]
pub(crate) fn seen<'a, S: Store + ?Sized>(store: &'a S, id: &'a str) -> StoreFuture<'a, bool> {
    match meeting_for(store) {
        None => store.seen(id),
        Some(meeting) => StoreFuture::new(async move {
            crate::store::batched::seen_through(&meeting.seen, store, id).await
        }),
    }
}

/// `store.remember(id)`, as [`seen`].
#[inline]
pub(crate) fn remember<'a, S: Store + ?Sized>(store: &'a S, id: &'a str) -> StoreFuture<'a, ()> {
    match meeting_for(store) {
        None => store.remember(id),
        Some(meeting) => StoreFuture::new(async move {
            let remembered: Result<(), StoreError> =
                crate::store::batched::remember_through(&meeting.remember, store, id).await;
            remembered
        }),
    }
}
