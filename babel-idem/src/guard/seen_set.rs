//! Seen-set mode's decision table (DESIGN section 1): `seen`, run, `remember`.

use std::future::Future;

use super::{OnRememberFailure, mark_failed, report, store_failed};
use crate::metrics::{Decision, timed};
use crate::store::StoreOperation;
use crate::{DedupeKey, Store, StoreError};

/// The decision itself; every public entry point ends here.
pub(super) async fn decide<S, F, E>(
    store: &S,
    key: &DedupeKey,
    on_remember_failure: OnRememberFailure,
    handler: F,
) -> Result<(), E>
where
    S: Store + ?Sized,
    F: Future<Output = Result<(), E>>,
    E: From<StoreError>,
{
    let Some(id) = key.as_str() else {
        report(Decision::FailOpen, "");
        return handler.await;
    };

    match timed::<S, _>(StoreOperation::Seen, || store.seen(id)).await {
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

    match timed::<S, _>(StoreOperation::Remember, || store.remember(id)).await {
        Ok(()) => {
            report(Decision::Ran, id);
            Ok(())
        }
        Err(error) => mark_failed(id, error, on_remember_failure),
    }
}
