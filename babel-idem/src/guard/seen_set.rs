//! Seen-set mode's decision table (DESIGN section 1): `seen`, run, `remember`.

use std::future::Future;

use super::{OnRememberFailure, mark_failed, report, report_key, store_failed};
use crate::metrics::{Decision, timed};
use crate::store::StoreOperation;
use crate::{DedupeKey, Store, StoreError};

/// The decision itself; every public entry point ends here, returning this
/// future as it is. It owns the key, so a caller's future does not borrow
/// the message.
///
/// An `async` block rather than an `async fn`: an `async fn` copies its
/// arguments into locals on the first poll and keeps room for both, which
/// made every delivery's future larger and slower to build and move.
#[inline]
#[allow(
    clippy::manual_async_fn,
    reason = "an `async fn` holds its arguments twice (see above)"
)]
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
    async move {
        if key.is_missing() {
            report(Decision::FailOpen, "");
            return handler.await;
        }
        // The store is asked with the key itself, and its text taken only
        // on the paths that report it (see `Store::seen_key`). `seen`'s
        // answer lives in a block of its own: whatever is kept across an
        // `await` is stored in the future, which every delivery moves.
        {
            let seen = store_answer!(timed::<S, _>(StoreOperation::Seen, || store.seen_key(&key)));
            match seen {
                Ok(false) => {}
                Ok(true) => {
                    report_key(Decision::Skipped, &key);
                    return Ok(());
                }
                Err(error) => return store_failed(key.id(), error),
            }
        }

        // A panic or a drop inside the handler leaves before `remember`: unmarked.
        if let Err(error) = handler.await {
            report_key(Decision::Failed, &key);
            return Err(error);
        }

        let remembered = store_answer!(timed::<S, _>(StoreOperation::Remember, || {
            store.remember_key(&key)
        }));
        match remembered {
            Ok(()) => {
                report_key(Decision::Ran, &key);
                Ok(())
            }
            Err(error) => mark_failed(key.id(), error, on_remember_failure),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::mem::{size_of, size_of_val};

    use serde_json::json;

    use crate::metrics::Timed;
    use crate::store::StoreFuture;
    use crate::{DedupeKey, Envelope, InMemoryStore, StoreError, guard};

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
        let future = guard(&store, &env, handler);

        let store_call =
            size_of::<Timed<StoreFuture<'_, bool>>>().max(size_of::<Timed<StoreFuture<'_, ()>>>());
        let parts =
            size_of::<DedupeKey>() + size_of::<&InMemoryStore>() + handler_size + store_call;
        // Beyond the parts: the state's tag and a few flags, and padding to
        // the key's 16-byte alignment (24 bytes at most, seen: 176 for 152).
        // Any part held twice would be 16 bytes or more on top of that.
        let align = std::mem::align_of_val(&future);
        assert!(
            size_of_val(&future) <= parts + 8 + align,
            "the guard's future is {} bytes for {parts} bytes of parts",
            size_of_val(&future),
        );
    }
}
