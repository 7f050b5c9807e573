//! Adapters that put babel-idem into other frameworks, each behind its cargo
//! feature, each built on the guard and nothing beside it (see [`guide`](crate::guide)):
//!
//! - `tower` (feature `tower`): `tower::IdempotencyLayer`,
//!   the guard as a tower `Layer` in front of any `Service` whose request
//!   carries a [`MessageId`](crate::message::MessageId).
//!
//! The consumer span is opened by [`Router::dispatch`](crate::router::Router::dispatch)
//! (W3C `traceparent` continuation with the feature `opentelemetry`), and the
//! `metrics` facade is fed by [`metrics`](crate::telemetry::metrics) (feature `metrics`):
//! both record where the delivery is dispatched and decided, not here.

#[cfg(feature = "tower")]
pub mod tower;
