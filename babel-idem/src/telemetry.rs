//! What babel-idem reports: the spans a delivery and a publish run in, the
//! W3C trace context they carry, and the guards' decisions counted
//! ([`metrics`]).
//!
//! Each routed delivery's handler runs in a CONSUMER span with the
//! BabelQueue SDKs' attribute names, through `tracing` (so
//! `tracing-opentelemetry` exports it as an OpenTelemetry span), target
//! `babel_idem::router::span`:
//!
//! | attribute | value |
//! |---|---|
//! | `otel.name` | `process <urn>` |
//! | `otel.kind` | `consumer` |
//! | `messaging.system` | `babelqueue` |
//! | `messaging.operation` | `process` |
//! | `messaging.destination.name` | `meta.queue` (else the transport's queue) |
//! | `messaging.message.id` | `meta.id` (absent when the message has none) |
//! | `messaging.message.conversation_id` | `trace_id` |
//! | `messaging.babelqueue.attempts` | the attempts made before this delivery |
//! | `messaging.babelqueue.idempotency.decision` | recorded by the guard when it decides (`ran`, `skipped`, ...) |
//! | `messaging.babelqueue.payload.violation` | recorded when the attempt is refused for an invalid payload: `path: reason`, as in [`InvalidPayloadError`](crate::router::InvalidPayloadError) |
//!
//! With the feature `opentelemetry`, a W3C `traceparent` (and `tracestate`)
//! transport header makes the span a child of the producer's span; without
//! one, its remote parent is the one the family derives from the envelope's
//! `trace_id` (see [`guide::observability`](crate::guide::observability)).
//!
//! The PRODUCER span a publish runs in has the same attributes, with
//! `otel.name` `publish <urn>`, `otel.kind` `producer` and
//! `messaging.operation` `publish`; with the feature `opentelemetry` its
//! context travels as the W3C `traceparent` header of the message.
//!
//! ```
//! use babel_idem::telemetry::metrics::{self, Decision};
//!
//! let before = metrics::counts();
//! assert_eq!(metrics::counts().since(&before).get(Decision::Ran), 0);
//! ```
//!
//! This module depends on no broker loop, guard, transport or outbox: they
//! report through it.

pub(crate) mod carrier;
pub mod metrics;
pub(crate) mod span;
