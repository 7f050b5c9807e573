//! [`Router::dispatch`]: from raw bytes to a [`Disposition`].
//!
//! Decode and check the envelope (else `poison`), route by URN (else the
//! unknown-URN strategy), check `data` against the URN's payload schema when
//! the router has schemas (a violation fails the attempt without running the
//! handler), run the handler with panics caught and its claim
//! decisions recorded, and turn a failure into a release when the
//! handler's claim was parked (see `parked`), else into a retry or, once
//! the attempts run out, a dead letter.
//! Deduplication is not decided here: it belongs to the handler's guard
//! (`#[idempotent]`, [`wrap`](crate::guard::wrap)), which reports a duplicate as
//! success, so a duplicate is simply acked.

use std::any::Any;
use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::task::{Context, Poll};

use tracing::Instrument;

use crate::envelope::DeadLetterReason;
use crate::envelope::{DeadLetter, Envelope, EnvelopeError};
use crate::telemetry::span;

#[cfg(feature = "schema")]
use super::handler::HandlerError;
use super::handler::HandlerFuture;
use super::parked;
use super::payload;
#[cfg(feature = "schema")]
use super::payload::InvalidPayloadError;
use super::routes::Route;
use super::{
    DeadLettered, Delivery, DispatchError, Disposition, ReleaseReason, Retry, Router,
    UnknownUrnStrategy,
};
use crate::guard::context;
use crate::guard::outcome::Guarded;

impl Router {
    /// Handles one delivery: `bytes` is the message body as the broker gave
    /// it, `delivery` what the transport knows besides. Never panics, even
    /// when the handler does; the [`Disposition`] says what the broker loop
    /// must do next.
    ///
    /// | the delivery | disposition |
    /// |---|---|
    /// | not a valid envelope | `DeadLetter`, reason `poison`, the bytes unchanged |
    /// | no handler for its URN | by [`UnknownUrnStrategy`] |
    /// | with `RouterBuilder::schemas` (feature `schema`): `data` breaks its URN's schema | the handler does not run; failed with [`InvalidPayloadError`](crate::router::InvalidPayloadError), retried or dead-lettered as a handler's `Err` below |
    /// | the handler returns `Ok` | `Ack` |
    /// | claim mode: the handler returns `Err` after its last claim-mode guard found the id held by another owner (whatever the error type keeps of the parked [`StoreError`](crate::store::StoreError)) | `Release`, reason `Parked`, `delay` the other lease's time left (1 s if the store does not know it), at most [`max_park_delay`](crate::router::RouterBuilder::max_park_delay); no attempt counted |
    /// | the handler returns `Err` or panics, attempts + 1 < max | `Retry` with attempts + 1 |
    /// | the same, attempts + 1 reaches max | `DeadLetter`, reason `failed` |
    ///
    /// A parked claim is read from the delivery, not from the error: each
    /// claim-mode guard polled in the handler's future records its decision
    /// for this dispatch, and the last one counts. A guard whose future the
    /// handler does not poll itself (one in a spawned task) records nothing,
    /// so a parked error it returns is an ordinary failure here; a handler
    /// that swallows a park and then fails with no claim decided since is
    /// released as parked.
    ///
    /// The handler runs in a CONSUMER span (`tracing`, level INFO) with the
    /// BabelQueue SDKs' `messaging.*` attributes and the guard's decision;
    /// with the feature `opentelemetry` a W3C `traceparent` header continues
    /// the producer's trace (see [`guide::observability`](crate::guide::observability)).
    ///
    /// "attempts" are the attempts made before this delivery:
    /// [`Delivery::with_attempts`] when the transport gave them, else the
    /// envelope's `attempts` field.
    ///
    /// ```
    /// use babel_idem::{Delivery, Disposition, Envelope, Router, urn};
    /// use babel_idem::envelope::DeadLetterReason;
    /// use serde_json::json;
    ///
    /// async fn always_fails(_: Envelope) -> Result<(), std::io::Error> {
    ///     Err(std::io::Error::other("payment gateway timeout"))
    /// }
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let router = Router::builder()
    ///     .route(urn!("urn:babel:orders:created"), always_fails)
    ///     .build()?;
    /// let mut bytes = Envelope::new("urn:babel:orders:created", json!({})).to_vec();
    ///
    /// // Attempts 1 and 2 are retried; the third failure is dead-lettered.
    /// for expected in 1..=2 {
    ///     let Disposition::Retry(retry) = router.dispatch(&bytes, Delivery::new()).await else {
    ///         panic!("expected a retry");
    ///     };
    ///     assert_eq!(retry.attempts, expected);
    ///     bytes = retry.body();
    /// }
    /// let Disposition::DeadLetter(dead) = router.dispatch(&bytes, Delivery::new()).await else {
    ///     panic!("expected a dead letter");
    /// };
    /// assert_eq!(dead.reason, DeadLetterReason::Failed);
    /// let redrivable = Envelope::from_slice(&dead.body)?;
    /// assert_eq!(redrivable.dead_letter.unwrap().attempts, 3);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub async fn dispatch(&self, bytes: &[u8], delivery: Delivery) -> Disposition {
        self.dispatch_decoded(bytes, Envelope::from_slice(bytes), delivery)
            .await
    }

    /// [`dispatch`](Self::dispatch) of `bytes` already decoded as `decoded`
    /// (by a consumer that reads the id first).
    pub(crate) async fn dispatch_decoded(
        &self,
        bytes: &[u8],
        decoded: Result<Envelope, EnvelopeError>,
        mut delivery: Delivery,
    ) -> Disposition {
        let mut envelope = match decoded {
            Ok(envelope) => envelope,
            Err(error) => return poison(bytes, error),
        };
        let attempts = delivery.transport_attempts().unwrap_or(envelope.attempts);
        envelope.attempts = attempts;
        delivery.set_attempts(attempts);

        let Some(route) = self.routes.get(envelope.urn()) else {
            let fallback_queue = delivery.queue().map(str::to_owned);
            return self.unknown_urn(envelope, fallback_queue);
        };
        // The handler takes the delivery; keep its queue only when the
        // envelope has none of its own for the dead-letter block.
        let fallback_queue = if envelope.meta.queue.is_empty() {
            delivery.queue().map(str::to_owned)
        } else {
            None
        };
        // Checked before anything of the handler runs, a typed handler's
        // decode included; a router without schemas reads nothing here.
        #[cfg(feature = "schema")]
        if let Some(schemas) = self.schemas.as_deref() {
            match payload::check_schema(schemas, envelope.urn(), bytes) {
                Ok(None) => {}
                Ok(Some(invalid)) => {
                    let span = span::consumer(&envelope, delivery.queue(), || delivery.headers());
                    let error = span.in_scope(|| refused(invalid));
                    return self.fail(envelope, error, fallback_queue);
                }
                Err(error) => return poison(bytes, error),
            }
        }

        // The handler (and so its guard) runs in the delivery's consumer span.
        let span = span::consumer(&envelope, delivery.queue(), || delivery.headers());
        let ((result, last), _) = context::ensure(run_catching_panics(route, envelope, delivery))
            .instrument(span)
            .await;
        let error = match result {
            Ok(()) => return Disposition::Ack,
            Err(error) => error,
        };
        // The handler owned the envelope; on this (rare) failure path decode
        // the original bytes again rather than clone on every delivery. They
        // decoded a moment ago, so this cannot fail, and if it somehow did the
        // bytes would be poison.
        match Envelope::from_slice(bytes) {
            Ok(envelope) if parked::store_failed(last, &error) => {
                parked::store_unavailable(envelope.job)
            }
            Ok(mut envelope) => match parked::parked_delay(last, &error, self.max_park_delay) {
                Some(delay) => parked::release(envelope.job, delay),
                None => {
                    envelope.attempts = attempts;
                    self.fail(envelope, error, fallback_queue)
                }
            },
            Err(error) => poison(bytes, error),
        }
    }

    /// The disposition of a delivery whose handler ran longer than `after`
    /// and was dropped: a failed attempt, retried or dead-lettered as any
    /// other failure.
    #[cfg(feature = "consumer")]
    pub(crate) fn timed_out(
        &self,
        bytes: &[u8],
        delivery: &Delivery,
        after: std::time::Duration,
    ) -> Disposition {
        let mut envelope = match Envelope::from_slice(bytes) {
            Ok(envelope) => envelope,
            Err(error) => return poison(bytes, error),
        };
        envelope.attempts = delivery.transport_attempts().unwrap_or(envelope.attempts);
        let fallback_queue = if envelope.meta.queue.is_empty() {
            delivery.queue().map(str::to_owned)
        } else {
            None
        };
        tracing::warn!(
            urn = envelope.urn(),
            ?after,
            "babel-idem: a handler ran longer than its timeout and was dropped"
        );
        self.fail(envelope, DispatchError::TimedOut { after }, fallback_queue)
    }

    /// A valid envelope nobody handles, by the configured strategy.
    fn unknown_urn(&self, envelope: Envelope, fallback_queue: Option<String>) -> Disposition {
        let urn = envelope.job.clone();
        match self.unknown_urn {
            UnknownUrnStrategy::Fail => {
                self.fail(envelope, DispatchError::UnknownUrn { urn }, fallback_queue)
            }
            UnknownUrnStrategy::DeadLetter => dead_letter(
                envelope,
                DeadLetterReason::UnknownUrn,
                DispatchError::UnknownUrn { urn },
                fallback_queue,
            ),
            UnknownUrnStrategy::Delete => Disposition::Delete { urn },
            UnknownUrnStrategy::Release => Disposition::Release {
                urn,
                reason: ReleaseReason::UnknownUrn,
                delay: None,
            },
        }
    }

    /// Counts the failed attempt, then retries or dead-letters.
    fn fail(
        &self,
        mut envelope: Envelope,
        error: DispatchError,
        fallback_queue: Option<String>,
    ) -> Disposition {
        let attempts = envelope.attempts.saturating_add(1);
        envelope.attempts = attempts;
        if attempts < self.max_attempts {
            tracing::debug!(urn = envelope.urn(), attempts, %error, "babel-idem: delivery failed, retrying");
            return Disposition::Retry(Retry {
                envelope,
                error,
                attempts,
                backoff: self.backoff.delay(attempts),
            });
        }
        let reason = match error {
            DispatchError::UnknownUrn { .. } => DeadLetterReason::UnknownUrn,
            _ => DeadLetterReason::Failed,
        };
        dead_letter(envelope, reason, error, fallback_queue)
    }
}

/// The original envelope plus its `dead_letter` block, encoded for the DLQ.
fn dead_letter(
    mut envelope: Envelope,
    reason: DeadLetterReason,
    error: DispatchError,
    fallback_queue: Option<String>,
) -> Disposition {
    let original_queue = if envelope.meta.queue.is_empty() {
        fallback_queue.unwrap_or_default()
    } else {
        envelope.meta.queue.clone()
    };
    let mut block = DeadLetter::new(reason.clone(), original_queue, envelope.attempts)
        .with_error(block_error(&error));
    if let Some(exception) = error.exception() {
        block = block.with_exception(exception);
    }
    envelope.dead_letter = Some(block);
    tracing::warn!(urn = envelope.urn(), %reason, %error, "babel-idem: dead-lettering a delivery");
    let body = envelope.to_vec();
    Disposition::DeadLetter(DeadLettered {
        reason,
        error,
        envelope: Some(envelope),
        body,
    })
}

/// The `dead_letter.error` text: the handler's own message, as other SDKs
/// write their exception's message.
fn block_error(error: &DispatchError) -> String {
    match error {
        DispatchError::Handler(error) => error.to_string(),
        other => other.to_string(),
    }
}

/// Bytes that are not an envelope go to the DLQ unchanged: there is no
/// envelope to add a block to, and retrying cannot repair them.
fn poison(bytes: &[u8], error: EnvelopeError) -> Disposition {
    tracing::warn!(%error, len = bytes.len(), "babel-idem: dead-lettering a poison delivery");
    Disposition::DeadLetter(DeadLettered {
        reason: DeadLetterReason::Poison,
        error: DispatchError::Poison(error),
        envelope: None,
        body: bytes.to_vec(),
    })
}

/// The failed attempt of a payload its URN's schema refused: the handler's
/// failure a typed decode gives, reported as it is (in the current span,
/// the delivery's consumer span).
#[cfg(feature = "schema")]
#[cold]
fn refused(invalid: InvalidPayloadError) -> DispatchError {
    let error = DispatchError::Handler(HandlerError::new(invalid));
    payload::observe_failure(&error);
    error
}

/// Runs the handler; a panic while building or polling its future becomes
/// [`DispatchError::Panicked`] instead of unwinding through the consumer.
/// Beside the result, the last outcome a guard recorded in the handler's
/// future (a claim decision, a store failure). A failure for an invalid
/// payload (a typed handler's decode) is reported while the consumer span
/// is still the current one.
async fn run_catching_panics(
    route: &Route,
    envelope: Envelope,
    delivery: Delivery,
) -> (Result<(), DispatchError>, Option<Guarded>) {
    let future = match catch_unwind(AssertUnwindSafe(|| route.call(envelope, delivery))) {
        Ok(future) => future,
        Err(payload) => return (Err(panicked(payload)), None),
    };
    let watched = Watched { future, last: None };
    match watched.await {
        (Ok(Ok(())), last) => (Ok(()), last),
        (Ok(Err(error)), last) => {
            let error = DispatchError::Handler(error);
            payload::observe_failure(&error);
            (Err(error), last)
        }
        (Err(payload), last) => (Err(panicked(payload)), last),
    }
}

/// Polls a handler future inside `catch_unwind`, with the delivery's
/// record of its guards' outcomes watched ([`context::watching`]). The future is dropped after a
/// panic (it is never polled again); `AssertUnwindSafe` is sound here
/// because nothing of it is observed afterwards.
struct Watched {
    future: HandlerFuture,
    last: Option<Guarded>,
}

impl Future for Watched {
    type Output = (
        Result<<HandlerFuture as Future>::Output, Box<dyn Any + Send>>,
        Option<Guarded>,
    );

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Watched { future, last } = self.get_mut();
        let polled = context::watching(last, || {
            catch_unwind(AssertUnwindSafe(|| future.as_mut().poll(cx)))
        });
        match polled {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(output)) => Poll::Ready((Ok(output), *last)),
            Err(payload) => Poll::Ready((Err(payload), *last)),
        }
    }
}

fn panicked(payload: Box<dyn Any + Send>) -> DispatchError {
    let message = if let Some(text) = payload.downcast_ref::<&str>() {
        (*text).to_owned()
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text.clone()
    } else {
        "a panic with a payload that is not a string".to_owned()
    };
    DispatchError::Panicked { message }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_message_is_kept_whatever_its_string_type() {
        let message = |payload: Box<dyn Any + Send>| match panicked(payload) {
            DispatchError::Panicked { message } => message,
            other => panic!("expected Panicked, got {other:?}"),
        };
        assert_eq!(message(Box::new("static text")), "static text");
        assert_eq!(
            message(Box::new(String::from("formatted 7"))),
            "formatted 7"
        );
        assert_eq!(
            message(Box::new(42_u8)),
            "a panic with a payload that is not a string"
        );
    }
}
