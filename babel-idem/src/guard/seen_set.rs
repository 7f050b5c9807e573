//! Seen-set mode's decision table (see [`guide::modes`](crate::guide::modes)): `seen`, run, `remember`.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;

use super::context::{self, body_starts, marking};
use super::{OnRememberFailure, mark_failed, report, store_failed};
use crate::key::DedupeKey;
use crate::store::StoreOperation;
use crate::store::{Store, StoreError};
use crate::telemetry::metrics::{Decision, timed, timed_now};

/// The decision itself; every public entry point ends here, returning this
/// future as it is. It owns the key, so a caller's future does not borrow
/// the message.
///
/// The store is asked `Store::seen_now` first and [`Store::seen`] only
/// where that has no answer, so a store that answers without waiting skips
/// a duplicate in the future's first poll.
#[inline]
pub(super) fn decide<S, F, E>(
    store: S,
    key: DedupeKey,
    on_remember_failure: OnRememberFailure,
    handler: F,
) -> impl Future<Output = Result<(), E>>
where
    S: Store,
    F: Future<Output = Result<(), E>>,
    E: From<StoreError>,
{
    Decide::Asking {
        store,
        key,
        on_remember_failure,
        handler,
        then: after_asking::<S, F, E>,
        ended: false,
    }
}

pin_project! {
    /// A seen-set decision. Its first poll asks `Store::seen_now` with
    /// the key where the guard wrote it, and ends a duplicate there and
    /// then; every other delivery goes on in [`after_asking`]'s `async`
    /// block.
    ///
    /// Written by hand so that the first poll is small enough to be
    /// inlined where the guard is polled: a duplicate makes no call into a
    /// state machine, and the key is read where it was written, not after
    /// a move of the key into the `async` block's state (a load of a
    /// just-moved key that spans two of the move's stores waits for both to
    /// reach the cache).
    #[project = DecideProj]
    #[project_replace = DecideTaken]
    enum Decide<S, F, C, R> {
        /// Not polled yet, or `ended` in the first poll. `then` builds the
        /// rest of the decision: a function item, so that the rest's type
        /// is named without a box.
        Asking {
            store: S,
            key: DedupeKey,
            on_remember_failure: OnRememberFailure,
            handler: F,
            then: C,
            // Set when the store's answer ended the delivery (a skip, or a
            // store error), rather than a move to `Done`: the key and the
            // handler are then dropped with the future, as they would be
            // anyway, and ending a duplicate writes one flag.
            ended: bool,
        },
        /// The rest of the decision: the store is awaited, or the handler
        /// runs. A rest that ended stays here, and a further poll panics in
        /// its `async` block.
        Deciding {
            #[pin]
            rest: R,
        },
        /// Stands in while the parts move from `Asking` to `Deciding`.
        Done,
    }
}

impl<S, F, E, C, R> Future for Decide<S, F, C, R>
where
    S: Store,
    F: Future<Output = Result<(), E>>,
    E: From<StoreError>,
    C: FnOnce(S, DedupeKey, OnRememberFailure, F, Ask) -> R,
    R: Future<Output = Result<(), E>>,
{
    type Output = Result<(), E>;

    // Forced: the duplicate's whole first poll belongs where the guard is
    // polled (see `Decide`).
    #[inline(always)]
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let ask = match self.as_mut().project() {
            DecideProj::Asking { ended: true, .. } | DecideProj::Done => {
                panic!("a guard's future was polled after it completed")
            }
            DecideProj::Asking {
                store, key, ended, ..
            } if !key.is_missing() => {
                match timed_now::<S, _>(StoreOperation::Seen, || store.seen_now(key.id())) {
                    None => Ask::Store,
                    Some(seen) => match ended_by(seen, key) {
                        Some(result) => {
                            *ended = true;
                            return Poll::Ready(result);
                        }
                        None => Ask::Nothing,
                    },
                }
            }
            // A missing key is the rest's to report.
            DecideProj::Asking { .. } => Ask::Store,
            DecideProj::Deciding { rest } => return rest.poll(cx),
        };
        self.go_on(ask, cx)
    }
}

impl<S, F, E, C, R> Decide<S, F, C, R>
where
    F: Future<Output = Result<(), E>>,
    E: From<StoreError>,
    C: FnOnce(S, DedupeKey, OnRememberFailure, F, Ask) -> R,
    R: Future<Output = Result<(), E>>,
{
    /// Leaves `Asking` for the rest of the decision, which asks the store
    /// what `ask` says, and polls it. Out of line, so that only a
    /// duplicate's skip is inlined where the guard is polled.
    #[inline(never)]
    fn go_on(mut self: Pin<&mut Self>, ask: Ask, cx: &mut Context<'_>) -> Poll<Result<(), E>> {
        // `Done` stands in while the parts are moved to the rest.
        if let DecideTaken::Asking {
            store,
            key,
            on_remember_failure,
            handler,
            then,
            ended: _,
        } = self.as_mut().project_replace(Decide::Done)
        {
            let rest = then(store, key, on_remember_failure, handler, ask);
            self.as_mut().set(Decide::Deciding { rest });
        }
        match self.project() {
            DecideProj::Deciding { rest } => rest.poll(cx),
            _ => unreachable!("`go_on` is only called in `Asking`, which it leaves for `Deciding`"),
        }
    }
}

/// What `seen`'s answer decides: `None` to run the handler, or the result
/// that ends the delivery (a skip, or a store error, on which the handler
/// does not run and the message is retried).
#[inline(always)]
fn ended_by<E: From<StoreError>>(
    seen: Result<bool, StoreError>,
    key: &DedupeKey,
) -> Option<Result<(), E>> {
    match seen {
        Ok(false) => None,
        Ok(true) => {
            report(Decision::Skipped, key.id());
            Some(Ok(()))
        }
        Err(error) => Some(store_failed(key.id(), error)),
    }
}

/// What the rest of a decision still has to ask.
#[derive(Clone, Copy)]
enum Ask {
    /// `seen`, and await it (unless the key is missing: nothing to ask).
    Store,
    /// Nothing: the store answered "not seen" in the first poll. The answer
    /// itself is not handed over, as every upvar of an `async` block takes
    /// room in the future for as long as it lives.
    Nothing,
}

/// The decision after the first poll, which may have asked the store
/// already (see [`Ask`]).
///
/// An `async` block rather than an `async fn`: an `async fn` would keep
/// room for its arguments and for the locals they are moved into.
#[allow(
    clippy::manual_async_fn,
    reason = "an `async fn` holds its arguments twice (see above)"
)]
fn after_asking<S, F, E>(
    store: S,
    key: DedupeKey,
    on_remember_failure: OnRememberFailure,
    handler: F,
    ask: Ask,
) -> impl Future<Output = Result<(), E>>
where
    S: Store,
    F: Future<Output = Result<(), E>>,
    E: From<StoreError>,
{
    async move {
        if let Some(take_back) = body_starts() {
            take_back.await;
        }
        // The key's text is taken again where it is needed, rather than kept
        // in the future across the handler's `await`.
        if key.is_missing() {
            report(Decision::FailOpen, "");
            return handler.await;
        }
        if let Ask::Store = ask {
            // `seen`'s answer lives in a block of its own: whatever is kept
            // across an `await` is stored in the future.
            let seen = store_answer!(timed::<S, _>(StoreOperation::Seen, || {
                context::seen(&store, key.id())
            }));
            if let Some(result) = ended_by(seen, &key) {
                return result;
            }
        }

        // A panic or a drop inside the handler leaves before `remember`: unmarked.
        if let Err(error) = handler.await {
            report(Decision::Failed, key.id());
            return Err(error);
        }
        marking();

        let remembered = store_answer!(timed::<S, _>(StoreOperation::Remember, || {
            context::remember(&store, key.id())
        }));
        match remembered {
            Ok(()) => {
                report(Decision::Ran, key.id());
                Ok(())
            }
            Err(error) => mark_failed(key.id(), error, on_remember_failure),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::mem::{size_of, size_of_val};
    use std::panic::{AssertUnwindSafe, catch_unwind};
    use std::pin::pin;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::task::{Context, Poll, Waker};

    use serde_json::json;

    use crate::envelope::Envelope;
    use crate::guard::run_once;
    use crate::key::DedupeKey;
    use crate::store::{InMemoryStore, Store, StoreError};
    use crate::store::{StoreFuture, StoreOperation};
    use crate::telemetry::metrics::Timed;

    /// A store that answers `seen_now` with `answer`, and counts the calls
    /// that the guard must not make after such an answer: its `seen` is a
    /// future that never completes.
    struct AnswersAtOnce {
        answer: fn() -> Result<bool, StoreError>,
        awaited_seen: AtomicU32,
        remembered: AtomicU32,
    }

    impl AnswersAtOnce {
        fn new(answer: fn() -> Result<bool, StoreError>) -> Self {
            AnswersAtOnce {
                answer,
                awaited_seen: AtomicU32::new(0),
                remembered: AtomicU32::new(0),
            }
        }
    }

    impl Store for AnswersAtOnce {
        fn seen<'a>(&'a self, _id: &'a str) -> StoreFuture<'a, bool> {
            self.awaited_seen.fetch_add(1, Ordering::Relaxed);
            StoreFuture::new(std::future::pending())
        }
        fn remember<'a>(&'a self, _id: &'a str) -> StoreFuture<'a, ()> {
            self.remembered.fetch_add(1, Ordering::Relaxed);
            StoreFuture::ready(Ok(()))
        }
        fn forget<'a>(&'a self, _id: &'a str) -> StoreFuture<'a, ()> {
            StoreFuture::ready(Ok(()))
        }
        fn seen_now(&self, _id: &str) -> Option<Result<bool, StoreError>> {
            Some((self.answer)())
        }
    }

    fn order() -> Envelope {
        Envelope::new("urn:babel:orders:created", json!({}))
    }

    /// Polls once; every future here is ready in its first poll.
    fn poll_once<F: Future>(future: std::pin::Pin<&mut F>) -> F::Output {
        match future.poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(output) => output,
            Poll::Pending => panic!("a guard over stores that answer at once waited"),
        }
    }

    #[test]
    fn a_duplicate_is_skipped_in_the_first_poll_and_a_second_poll_panics() {
        let store = InMemoryStore::new();
        let env = order();
        poll_once(pin!(run_once(&store, &env, async {
            Ok::<(), StoreError>(())
        })))
        .unwrap();

        let runs = AtomicU32::new(0);
        let mut duplicate = pin!(run_once(&store, &env, async {
            runs.fetch_add(1, Ordering::Relaxed);
            Ok::<(), StoreError>(())
        }));
        poll_once(duplicate.as_mut()).unwrap();
        assert_eq!(
            runs.load(Ordering::Relaxed),
            0,
            "the duplicate's handler ran"
        );

        let again = catch_unwind(AssertUnwindSafe(|| poll_once(duplicate.as_mut())));
        again.expect_err("a finished guard answered a second poll");
        assert_eq!(
            runs.load(Ordering::Relaxed),
            0,
            "the second poll ran the handler"
        );
    }

    #[test]
    fn an_answer_at_once_of_not_seen_runs_and_remembers_without_asking_again() {
        let store = AnswersAtOnce::new(|| Ok(false));
        let runs = AtomicU32::new(0);
        let env = order();
        poll_once(pin!(run_once(&store, &env, async {
            runs.fetch_add(1, Ordering::Relaxed);
            Ok::<(), StoreError>(())
        })))
        .unwrap();
        assert_eq!(runs.load(Ordering::Relaxed), 1);
        assert_eq!(store.remembered.load(Ordering::Relaxed), 1);
        assert_eq!(store.awaited_seen.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn an_answer_at_once_of_seen_skips_without_asking_again() {
        let store = AnswersAtOnce::new(|| Ok(true));
        let env = order();
        poll_once(pin!(run_once(&store, &env, async {
            panic!("a seen id's handler ran");
            #[allow(unreachable_code)]
            Ok::<(), StoreError>(())
        })))
        .unwrap();
        assert_eq!(store.remembered.load(Ordering::Relaxed), 0);
        assert_eq!(store.awaited_seen.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn an_error_at_once_fails_the_delivery_without_running_the_handler() {
        let store =
            AnswersAtOnce::new(|| Err(StoreError::new(StoreOperation::Seen, "test", "down")));
        let env = order();
        let error = poll_once(pin!(run_once(&store, &env, async {
            panic!("the handler ran though the store could not answer");
            #[allow(unreachable_code)]
            Ok::<(), StoreError>(())
        })))
        .unwrap_err();
        assert_eq!(error.operation(), StoreOperation::Seen);
        assert_eq!(error.backend(), "test");
        assert_eq!(store.remembered.load(Ordering::Relaxed), 0);
        assert_eq!(store.awaited_seen.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_message_without_an_id_runs_without_asking_the_store() {
        let store =
            AnswersAtOnce::new(|| panic!("the store was asked about a message without an id"));
        let runs = AtomicU32::new(0);
        let env = order().without_id();
        poll_once(pin!(run_once(&store, &env, async {
            runs.fetch_add(1, Ordering::Relaxed);
            Ok::<(), StoreError>(())
        })))
        .unwrap();
        assert_eq!(runs.load(Ordering::Relaxed), 1);
        assert_eq!(store.remembered.load(Ordering::Relaxed), 0);
    }

    /// Every delivery builds this future and moves it at least once, so it
    /// holds each thing the decision needs once: the key, the store, the
    /// handler, and the store call being awaited (timed when the `metrics`
    /// feature is on).
    #[test]
    fn the_future_holds_the_key_the_store_the_handler_and_one_store_call() {
        let store = InMemoryStore::new();
        let env = Envelope::new("urn:babel:orders:created", json!({}));
        let captured = [7u64; 2];
        let handler = async move {
            std::hint::black_box(captured);
            Ok::<(), StoreError>(())
        };
        let handler_size = size_of_val(&handler);
        let future = run_once(&store, &env, handler);

        let store_call =
            size_of::<Timed<StoreFuture<'_, bool>>>().max(size_of::<Timed<StoreFuture<'_, ()>>>());
        let parts =
            size_of::<DedupeKey>() + size_of::<&InMemoryStore>() + handler_size + store_call;
        // Beyond the parts: the state's tag and a few flags, with the
        // padding the key's 16-byte alignment puts around them (40 bytes at
        // most). Any part held twice would be 16 bytes or more on top.
        let align = std::mem::align_of_val(&future);
        assert!(
            size_of_val(&future) <= parts + 8 + 2 * align,
            "the guard's future is {} bytes for {parts} bytes of parts",
            size_of_val(&future),
        );
    }
}
