//! Where a decision, a store call and a refused payload leave the process,
//! beside the counters of [`counts`](super::counts): the decision and the
//! payload's violation on the current consumer span (through `tracing`),
//! and with the feature `metrics` the `metrics` facade.
//!
//! With the feature off, [`timed`] and [`claim_mode`] are the identity and
//! inline away, so the guard's code is what it was.

use crate::telemetry::metrics::Decision;

/// The consumer span's field that carries the guard's decision (the span is
/// opened by [`Router::dispatch`](crate::router::Router::dispatch)).
pub(crate) const DECISION_FIELD: &str = "messaging.babelqueue.idempotency.decision";

/// Records `decision` on the current span, and in the `metrics` facade;
/// `listened` runs first, where a listener takes INFO (a caller's own
/// event, which checks its own level).
#[inline(always)]
pub(super) fn decision(decision: Decision, listened: impl FnOnce()) {
    // With nobody listening at INFO this is one relaxed load: no span
    // lookup, and no second load for the caller's event (the compiler does
    // not merge two atomic loads of the level).
    if tracing::level_enabled!(tracing::Level::INFO) {
        listened();
        on_current_span(decision);
    }
    #[cfg(feature = "metrics")]
    super::facade::decision(decision);
}

/// Out of line, so that the check above stays small where it is inlined.
/// A current span without the field (not a consumer span) ignores it.
#[inline(never)]
fn on_current_span(decision: Decision) {
    tracing::Span::current().record(DECISION_FIELD, decision.as_str());
}

/// The consumer span's field that carries the violation (`path: reason`)
/// of a payload refused for its URN (the span is opened by
/// [`Router::dispatch`](crate::router::Router::dispatch)).
pub(crate) const INVALID_PAYLOAD_FIELD: &str = "messaging.babelqueue.payload.violation";

/// Records an attempt refused because the `data` of a message of `urn`
/// broke what its URN expects at `violation`: on the current span, and in
/// the `metrics` facade. Off the hot path: only a refused attempt calls it.
#[cold]
pub(crate) fn invalid_payload(urn: &str, violation: &dyn std::fmt::Display) {
    if tracing::level_enabled!(tracing::Level::INFO) {
        tracing::Span::current().record(INVALID_PAYLOAD_FIELD, tracing::field::display(violation));
    }
    #[cfg(feature = "metrics")]
    super::facade::invalid_payload(urn);
    #[cfg(not(feature = "metrics"))]
    let _ = urn;
}

#[cfg(feature = "metrics")]
pub(crate) use super::facade::{Timed, claim_mode, timed, timed_now};

/// Without the feature `metrics`: the store call itself.
#[cfg(not(feature = "metrics"))]
pub(crate) type Timed<F> = F;

/// Makes the store call `call` of `operation` on a store of type `S`; with
/// the feature `metrics` its latency and failure are recorded.
#[cfg(not(feature = "metrics"))]
#[inline(always)]
// `S` labels the backend when the feature is on; one signature for both.
#[allow(clippy::extra_unused_type_parameters)]
pub(crate) fn timed<S: ?Sized, F>(
    _operation: crate::store::StoreOperation,
    call: impl FnOnce() -> F,
) -> Timed<F> {
    call()
}

/// Makes the store call `call` of `operation` on a store of type `S`, which
/// answers at once or not at all (`None`); with the feature `metrics` an
/// answer's latency and failure are recorded.
#[cfg(not(feature = "metrics"))]
#[inline(always)]
#[allow(clippy::extra_unused_type_parameters)]
pub(crate) fn timed_now<S: ?Sized, T>(
    _operation: crate::store::StoreOperation,
    call: impl FnOnce() -> Option<Result<T, crate::store::StoreError>>,
) -> Option<Result<T, crate::store::StoreError>> {
    call()
}

/// Runs `report`, whose decisions are claim mode's (the facade's `mode` label).
#[cfg(not(feature = "metrics"))]
#[inline(always)]
pub(crate) fn claim_mode<T>(report: impl FnOnce() -> T) -> T {
    report()
}
