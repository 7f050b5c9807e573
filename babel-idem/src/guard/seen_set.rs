//! Seen-set mode's decision table (DESIGN section 1): `seen`, run, `remember`.

use std::future::Future;

use super::{OnRememberFailure, mark_failed, report, store_failed};
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
        let Some(id) = key.as_str() else {
            report(Decision::FailOpen, "");
            return handler.await;
        };

        match store_answer!(timed::<S, _>(StoreOperation::Seen, || store.seen(id))) {
            Ok(false) => {}
            Ok(true) => {
                report(Decision::Skipped, id);
                return Ok(());
            }
            Err(error) => return store_failed(id, error),
        }

        // A panic or a drop inside the handler leaves before `remember`: unmarked.
        if let Err(error) = handler.await {
            report(Decision::Failed, id);
            return Err(error);
        }

        match store_answer!(timed::<S, _>(StoreOperation::Remember, || store.remember(id))) {
            Ok(()) => {
                report(Decision::Ran, id);
                Ok(())
            }
            Err(error) => mark_failed(id, error, on_remember_failure),
        }
    }
}
