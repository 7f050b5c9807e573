//! Seen-set mode's decision table (DESIGN section 1): `seen`, run, `remember`.

use std::future::Future;

use super::{OnRememberFailure, report};
use crate::metrics::{self, Decision};
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

    match store.seen(id).await {
        Ok(false) => {}
        Ok(true) => {
            report(Decision::Skipped, id);
            return Ok(());
        }
        Err(error) => {
            tracing::warn!(
                target: "babel_idem",
                message_id = id,
                decision = Decision::StoreFailed.as_str(),
                %error,
                "seen-set unavailable; the message was not run and goes back for retry",
            );
            metrics::record(Decision::StoreFailed);
            return Err(E::from(error));
        }
    }

    // A panic or a drop inside the handler leaves before `remember`: unmarked.
    if let Err(error) = handler.await {
        report(Decision::Failed, id);
        return Err(error);
    }

    match store.remember(id).await {
        Ok(()) => {
            report(Decision::Ran, id);
            Ok(())
        }
        Err(error) => {
            tracing::warn!(
                target: "babel_idem",
                message_id = id,
                decision = Decision::MarkFailed.as_str(),
                %error,
                policy = ?on_remember_failure,
                "handler succeeded but its id could not be remembered; a redelivery will run it again",
            );
            metrics::record(Decision::MarkFailed);
            match on_remember_failure {
                OnRememberFailure::AckAndReport => Ok(()),
                OnRememberFailure::ReturnError => Err(E::from(error)),
            }
        }
    }
}
