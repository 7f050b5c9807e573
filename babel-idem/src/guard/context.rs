//! The delivery context: what a guard learns about the delivery it runs in,
//! and what it tells about it, without an argument in the handler's
//! signature.
//!
//! A guard written by `#[idempotent(store = X)]` runs inside the user's
//! handler: whoever dispatches the delivery (a `Router`, a `Consumer`)
//! never holds `X`, and the handler's signature is the user's. So the
//! dispatcher makes one [`DeliveryContext`] current for the delivery's
//! future ([`scope`]), and the guard reads it through one accessor, as
//! `tracing` reads its current span. It carries:
//!
//! - the meeting points where a consumer's concurrent `seen` and `remember`
//!   calls to one store go out together ([`StoreBatches`]);
//! - the delivery's handler slot ([`HandlerSlot`]): handed on as the guard
//!   marks, taken back before a further handler body runs;
//! - whether the delivery is an intended replay;
//! - whether a store failed for a part of the store only, by the store's
//!   own word;
//! - the guard's last [`Guarded`] outcome that bears on the delivery's fate
//!   (a claim decision, a store failure), which the dispatcher reads once
//!   the handler has returned ([`watching`]).
//!
//! The context is current only while the delivery's own future is polled
//! (it is swapped into a per-thread slot for each poll and back out after,
//! also when the poll unwinds), so it follows the delivery from thread to
//! thread, needs no particular executor, and is absent in a task the
//! handler spawns. A guard outside any context (a loop of one's own, a
//! tower service) reads nothing and records nothing. A guard polled while
//! its thread is torn down records nothing rather than panicking.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use pin_project_lite::pin_project;

use super::outcome::Guarded;
use crate::coalesce::Coalescer;
use crate::store::layer::batched::{remember_through, seen_through};
use crate::store::{BatchTarget, Store, StoreError, StoreFuture};

/// A future that waits for a handler slot to come back.
pub(crate) type TakeBack = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A delivery's hold on a handler slot, as its guards see it: the
/// dispatcher implements it.
pub(crate) trait HandlerSlot: Send + Sync {
    /// The handler succeeded and its guard is about to mark it: the slot
    /// may go to the next delivery.
    fn marking(&self);

    /// Whether the slot went on at an earlier mark.
    fn handed_on(&self) -> bool;

    /// Waits for a slot again, for a handler body about to run.
    fn take_back(self: Arc<Self>) -> TakeBack;
}

/// The context of one delivery (see the module's documentation).
#[derive(Default)]
pub(crate) struct DeliveryContext {
    batches: Option<Arc<StoreBatches>>,
    slot: Option<Arc<dyn HandlerSlot>>,
    replay: bool,
    part_down: Cell<bool>,
    record: Cell<Record>,
}

#[allow(
    dead_code,
    reason = "made and read by a consumer; a build without one only scopes fresh contexts"
)]
impl DeliveryContext {
    /// A consumer's delivery: its store calls meet in `batches` (one by one
    /// for `None`), its handler slot is `slot`, `replay` whether it is an
    /// intended replay.
    pub(crate) fn new(
        batches: Option<Arc<StoreBatches>>,
        slot: Option<Arc<dyn HandlerSlot>>,
        replay: bool,
    ) -> Self {
        DeliveryContext {
            batches,
            slot,
            replay,
            ..DeliveryContext::default()
        }
    }

    /// Whether a guard's store failed in the delivery for a part of the
    /// store only, by the store's own word.
    pub(crate) fn part_down(&self) -> bool {
        self.part_down.get()
    }
}

/// Whether a dispatch is watching the guards' outcomes, and the last one.
#[derive(Debug, Clone, Copy, Default)]
enum Record {
    /// No dispatch is polling a handler: outcomes go unrecorded.
    #[default]
    Unwatched,
    /// A dispatch is polling its handler; the last outcome recorded.
    Watched(Option<Guarded>),
}

thread_local! {
    /// The context of the delivery being polled on this thread.
    static CURRENT: RefCell<Option<DeliveryContext>> = const { RefCell::new(None) };
}

/// Whether any thread ever made a context current: until one does (a guard
/// used on its own, with no router), a guard reads no thread-local at all.
/// A thread sets it before its first context, so it reads it set whenever
/// one of its own could be current.
static ENTERED: AtomicBool = AtomicBool::new(false);

/// The one accessor: `read` applied to the current context; `None` outside
/// any delivery (or while the thread is torn down).
#[inline]
fn current<R>(read: impl FnOnce(&DeliveryContext) -> R) -> Option<R> {
    if !ENTERED.load(Ordering::Relaxed) {
        return None;
    }
    CURRENT
        .try_with(|current| {
            let current = current.try_borrow().ok()?;
            current.as_ref().map(read)
        })
        .ok()
        .flatten()
}

/// Whether a delivery's context is current.
pub(crate) fn is_current() -> bool {
    current(|_| ()).is_some()
}

pin_project! {
    /// A delivery's future with its context current while it is polled
    /// (or, for `None`, the context its poller has current).
    pub(crate) struct Scoped<F> {
        context: Option<DeliveryContext>,
        #[pin]
        future: F,
    }
}

/// Runs `future` with `context` current; its output, and the context.
#[allow(
    dead_code,
    reason = "made and read by a consumer; a build without one only scopes fresh contexts"
)]
pub(crate) fn scope<F: Future>(context: DeliveryContext, future: F) -> Scoped<F> {
    Scoped {
        context: Some(context),
        future,
    }
}

/// Runs `future` in the context current where it is built, or in a fresh
/// one where none is.
pub(crate) fn ensure<F: Future>(future: F) -> Scoped<F> {
    Scoped {
        context: (!is_current()).then(DeliveryContext::default),
        future,
    }
}

impl<F: Future> Future for Scoped<F> {
    type Output = (F::Output, Option<DeliveryContext>);

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let future = this.future;
        let polled = match this.context.is_some() {
            true => entered(this.context, || future.poll(cx)),
            false => future.poll(cx),
        };
        match polled {
            Poll::Ready(output) => Poll::Ready((output, this.context.take())),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// Runs `poll` with `context` current, then puts the previous one back (and
/// `context` where it was), also when `poll` unwinds.
fn entered<T>(context: &mut Option<DeliveryContext>, poll: impl FnOnce() -> T) -> T {
    fn swap(context: &mut Option<DeliveryContext>) -> bool {
        CURRENT
            .try_with(|current| match current.try_borrow_mut() {
                Ok(mut current) => {
                    std::mem::swap(&mut *current, context);
                    true
                }
                Err(_) => false,
            })
            .unwrap_or(false)
    }
    struct Leave<'a>(&'a mut Option<DeliveryContext>);
    impl Drop for Leave<'_> {
        fn drop(&mut self) {
            swap(self.0);
        }
    }
    if !ENTERED.load(Ordering::Relaxed) {
        ENTERED.store(true, Ordering::Relaxed);
    }
    let _leave = swap(context).then_some(Leave(context));
    poll()
}

/// Runs `poll` (one poll of a delivery's handler) with `last` as the
/// current context's record, then stores what it became back in `last` and
/// puts the context's previous record back, also when `poll` unwinds: a
/// dispatch nested in a handler keeps its own record, and the outer
/// delivery's comes back when its poll ends.
pub(crate) fn watching<T>(last: &mut Option<Guarded>, poll: impl FnOnce() -> T) -> T {
    struct Restore<'a> {
        previous: Record,
        last: &'a mut Option<Guarded>,
    }
    impl Drop for Restore<'_> {
        fn drop(&mut self) {
            if let Some(Record::Watched(last)) =
                current(|context| context.record.replace(self.previous))
            {
                *self.last = last;
            }
        }
    }
    let previous = current(|context| context.record.replace(Record::Watched(*last)));
    let _restore = previous.map(|previous| Restore { previous, last });
    poll()
}

/// Records a guard's outcome for the delivery being dispatched, if any.
/// Every outcome recorded replaces the last: a later decision replaces an
/// earlier park.
pub(crate) fn record(outcome: Guarded) {
    current(|context| context.note(outcome));
}

impl DeliveryContext {
    fn note(&self, outcome: Guarded) {
        if let Record::Watched(_) = self.record.get() {
            self.record.set(Record::Watched(Some(outcome)));
        }
    }
}

/// A guard could not ask its store (`error`): records the outcome, and
/// notes whether the store says the failure concerns a part of it only.
pub(crate) fn store_failed(error: &StoreError) {
    let part = part_of_the_store(error);
    current(|context| {
        context.note(Guarded::StoreFailed);
        if part {
            context.part_down.set(true);
        }
    });
}

/// Whether `error` is one the store gives for a part of it only: a cluster
/// master short of replicas, the other masters unconcerned.
fn part_of_the_store(error: &StoreError) -> bool {
    #[cfg(feature = "redis")]
    if let Some(short) = std::error::Error::source(error)
        .and_then(|source| source.downcast_ref::<crate::store::ShortOfReplicas>())
    {
        return !short.master.is_empty();
    }
    let _ = error;
    false
}

/// Whether the delivery being handled is an intended replay.
#[allow(
    dead_code,
    reason = "made and read by a consumer; a build without one only scopes fresh contexts"
)]
pub(crate) fn is_replay() -> bool {
    current(|context| context.replay).unwrap_or(false)
}

/// A handler body is about to run: for a delivery that handed its handler
/// slot on at an earlier mark, the wait for a slot back, which the caller
/// awaits before the body; anywhere else, `None`. Boxed: only such a
/// delivery pays for the room the wait takes in the guard's future.
#[inline(always)]
pub(crate) fn body_starts() -> Option<TakeBack> {
    current(|context| {
        let slot = context.slot.as_ref()?;
        slot.handed_on().then(|| Arc::clone(slot))
    })
    .flatten()
    .map(HandlerSlot::take_back)
}

/// The handler succeeded and the guard is about to record it (`remember`,
/// `commit`): the delivery's handler slot may go to the next delivery.
#[inline(always)]
pub(crate) fn marking() {
    current(|context| {
        if let Some(slot) = &context.slot {
            slot.marking();
        }
    });
}

/// The most stores a consumer batches for. A guard that builds a store per
/// delivery (each one a new object) would otherwise grow the list for
/// ever; past the bound, the calls to a store not listed go one by one.
const MOST_TARGETS: usize = 16;

/// One consumer's meeting points, one per store its guards call: while a
/// consumer holds more than one delivery, the `seen` and `remember` calls
/// its guards make to a store that answers a batch in one round trip
/// (`Store::batch_target`) meet, as in [`Batched`](crate::store::Batched).
#[derive(Default)]
pub(crate) struct StoreBatches {
    targets: Mutex<Vec<(BatchTarget, Arc<Meeting>)>>,
}

/// Where the calls to one store meet.
struct Meeting {
    seen: Coalescer<Box<str>, bool>,
    remember: Coalescer<Box<str>, ()>,
}

impl StoreBatches {
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

/// Where `store`'s calls meet, inside a batching consumer's delivery.
fn meeting_for<S: Store + ?Sized>(store: &S) -> Option<Arc<Meeting>> {
    let target = store.batch_target()?;
    current(|context| context.batches.as_ref()?.meeting(target)).flatten()
}

/// `store.seen(id)`, sent with the calls that meet it when the caller runs
/// in a batching consumer's delivery.
#[inline]
pub(crate) fn seen<'a, S: Store + ?Sized>(store: &'a S, id: &'a str) -> StoreFuture<'a, bool> {
    match meeting_for(store) {
        None => store.seen(id),
        Some(meeting) => {
            StoreFuture::new(async move { seen_through(&meeting.seen, store, id).await })
        }
    }
}

/// `store.remember(id)`, as [`seen`].
#[inline]
pub(crate) fn remember<'a, S: Store + ?Sized>(store: &'a S, id: &'a str) -> StoreFuture<'a, ()> {
    match meeting_for(store) {
        None => store.remember(id),
        Some(meeting) => {
            StoreFuture::new(async move { remember_through(&meeting.remember, store, id).await })
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const PARKED: Guarded = Guarded::Parked {
        retry_after: Some(Duration::from_millis(40)),
    };

    /// The current context's record; `None` outside any context.
    fn recorded() -> Option<Record> {
        current(|context| context.record.get())
    }

    /// Runs `check` with a fresh context current.
    fn in_context(check: impl FnOnce()) {
        entered(&mut Some(DeliveryContext::default()), check);
    }

    #[test]
    fn an_outcome_outside_any_delivery_is_not_recorded() {
        record(PARKED);
        assert!(recorded().is_none());
        in_context(|| {
            record(PARKED);
            assert!(matches!(recorded(), Some(Record::Unwatched)));
        });
    }

    #[test]
    fn the_last_outcome_of_a_delivery_is_kept_across_polls() {
        in_context(|| {
            let mut last = None;
            watching(&mut last, || record(PARKED));
            assert_eq!(last, Some(PARKED));
            assert!(
                matches!(recorded(), Some(Record::Unwatched)),
                "watched during a poll only"
            );
            watching(&mut last, || {});
            assert_eq!(
                last,
                Some(PARKED),
                "a poll that decides nothing keeps the park"
            );
            watching(&mut last, || record(Guarded::Ran(())));
            assert_eq!(
                last,
                Some(Guarded::Ran(())),
                "a later claim replaces the park"
            );
        });
    }

    #[test]
    fn a_nested_delivery_keeps_its_own_record_even_when_it_unwinds() {
        let unknown = Guarded::Parked { retry_after: None };
        in_context(|| {
            let mut outer = None;
            let mut inner = None;
            watching(&mut outer, || {
                record(PARKED);
                watching(&mut inner, || record(Guarded::Ran(())));
                let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    watching(&mut inner, || {
                        record(unknown);
                        std::panic::resume_unwind(Box::new("handler"));
                    })
                }));
                assert!(unwound.is_err());
            });
            assert_eq!(inner, Some(unknown), "recorded before the unwind");
            assert_eq!(outer, Some(PARKED), "the inner outcomes stayed inner");
            assert!(matches!(recorded(), Some(Record::Unwatched)), "put back");
        });
        assert!(recorded().is_none(), "the context was left");
    }

    #[tokio::test]
    async fn a_scoped_future_sees_its_context_and_its_poller_does_not() {
        let replay = DeliveryContext::new(None, None, true);
        let (inside, context) = scope(replay, async { is_replay() }).await;
        assert!(inside);
        assert!(context.is_some_and(|context| !context.part_down()));
        assert!(!is_replay());
        let (nested, fresh) = scope(DeliveryContext::new(None, None, true), async {
            ensure(async { is_replay() }).await
        })
        .await
        .0;
        assert!(nested, "a context already current is kept");
        assert!(fresh.is_none());
    }
}
