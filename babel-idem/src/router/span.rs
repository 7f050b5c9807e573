//! The CONSUMER span each routed delivery's handler runs in, with the
//! BabelQueue SDKs' attribute names, through `tracing` (so
//! `tracing-opentelemetry` exports it as an OpenTelemetry span):
//!
//! | attribute | value |
//! |---|---|
//! | `otel.name` | `<queue> process` (`process` when the queue is unknown) |
//! | `otel.kind` | `consumer` |
//! | `messaging.system` | `babelqueue` |
//! | `messaging.operation` | `process` |
//! | `messaging.destination.name` | `meta.queue` (else the transport's queue) |
//! | `messaging.message.id` | `meta.id` (absent when the message has none) |
//! | `messaging.message.conversation_id` | `trace_id` |
//! | `messaging.babelqueue.attempts` | the attempts made before this delivery |
//! | `messaging.babelqueue.idempotency.decision` | recorded by the guard when it decides (`ran`, `skipped`, ...) |
//!
//! With the feature `opentelemetry`, a W3C `traceparent` (and `tracestate`)
//! transport header makes the span a child of the producer's span.
//!
//! The PRODUCER span a publish runs in has the same attributes, with
//! `otel.name` `publish <urn>`, `otel.kind` `producer` and
//! `messaging.operation` `publish`; with the feature `opentelemetry` its
//! context travels as the W3C `traceparent` header of the message.

use std::fmt;

use tracing::Span;

use crate::envelope::Envelope;

use crate::message::MessageId;

use crate::router::Delivery;

/// Opens (but does not enter) the consumer span of one delivery. Its fields
/// are computed only when a subscriber wants the span.
pub(super) fn consumer(envelope: &Envelope, delivery: &Delivery) -> Span {
    let queue = if envelope.meta.queue.is_empty() {
        delivery.queue().unwrap_or_default()
    } else {
        envelope.meta.queue.as_str()
    };
    // The last field's name is `metrics::DECISION_FIELD`, which the guard records.
    let span = tracing::info_span!(
        "babelqueue.process",
        otel.name = %OperationName(queue),
        otel.kind = "consumer",
        messaging.system = "babelqueue",
        messaging.operation = "process",
        messaging.destination.name = queue,
        messaging.message.id = envelope.message_id(),
        messaging.message.conversation_id = envelope.trace_id.as_str(),
        // OpenTelemetry integers are i64 (a u64 would be exported as text).
        messaging.babelqueue.attempts = i64::try_from(envelope.attempts).unwrap_or(i64::MAX),
        messaging.babelqueue.idempotency.decision = tracing::field::Empty,
    );
    #[cfg(feature = "opentelemetry")]
    continue_trace(&span, delivery);
    span
}

/// Opens (but does not enter) the producer span of one publish of
/// `envelope` to `queue`.
#[cfg_attr(
    not(any(feature = "redis-transport", feature = "amqp-transport")),
    allow(dead_code, reason = "only a broker binding publishes")
)]
pub(crate) fn producer(envelope: &Envelope, queue: &str) -> Span {
    tracing::info_span!(
        "babelqueue.publish",
        otel.name = %PublishName(envelope.urn()),
        otel.kind = "producer",
        messaging.system = "babelqueue",
        messaging.operation = "publish",
        messaging.destination.name = queue,
        messaging.message.id = envelope.message_id(),
        messaging.message.conversation_id = envelope.trace_id.as_str(),
        messaging.babelqueue.attempts = i64::try_from(envelope.attempts).unwrap_or(i64::MAX),
    )
}

/// `publish <urn>`, the family's producer span name.
struct PublishName<'a>(&'a str);

impl fmt::Display for PublishName<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "publish {}", self.0)
    }
}

/// The W3C `traceparent` (and `tracestate`, when there is one) naming
/// `span`, as transport headers; none when the span has no OpenTelemetry
/// context (disabled, or a subscriber without the OpenTelemetry layer).
#[cfg(feature = "opentelemetry")]
#[cfg_attr(
    not(any(
        feature = "redis-transport",
        feature = "amqp-transport",
        all(feature = "outbox", any(feature = "sqlite", feature = "postgres"))
    )),
    allow(dead_code, reason = "only a producer carries a trace context")
)]
pub(crate) fn trace_headers(span: &Span) -> Vec<(String, String)> {
    use opentelemetry::propagation::{Injector, TextMapPropagator};
    use opentelemetry::trace::TraceContextExt;
    use opentelemetry_sdk::propagation::TraceContextPropagator;
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    struct Headers(Vec<(String, String)>);

    impl Injector for Headers {
        fn set(&mut self, key: &str, value: String) {
            if !value.is_empty() {
                self.0.push((key.to_owned(), value));
            }
        }
    }

    if span.is_disabled() {
        return Vec::new();
    }
    let context = span.context();
    if !context.span().span_context().is_valid() {
        return Vec::new();
    }
    let mut headers = Headers(Vec::new());
    TraceContextPropagator::new().inject_context(&context, &mut headers);
    headers.0
}

/// Without the feature `opentelemetry` no span has a W3C context to carry.
#[cfg(not(feature = "opentelemetry"))]
#[cfg_attr(
    not(any(
        feature = "redis-transport",
        feature = "amqp-transport",
        all(feature = "outbox", any(feature = "sqlite", feature = "postgres"))
    )),
    allow(dead_code, reason = "only a producer carries a trace context")
)]
pub(crate) fn trace_headers(_span: &Span) -> Vec<(String, String)> {
    Vec::new()
}

/// `<queue> process`, the OpenTelemetry messaging span name.
struct OperationName<'a>(&'a str);

impl fmt::Display for OperationName<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            f.write_str("process")
        } else {
            write!(f, "{} process", self.0)
        }
    }
}

/// Makes `span` a child of the producer's span named by the delivery's W3C
/// `traceparent` header. A missing or malformed header, or a subscriber
/// without the OpenTelemetry layer, leaves the span as it was.
#[cfg(feature = "opentelemetry")]
fn continue_trace(span: &Span, delivery: &Delivery) {
    use opentelemetry::propagation::{Extractor, TextMapPropagator};
    use opentelemetry::trace::TraceContextExt;
    use opentelemetry_sdk::propagation::TraceContextPropagator;
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    struct Headers<'a>(&'a Delivery);

    impl Extractor for Headers<'_> {
        fn get(&self, key: &str) -> Option<&str> {
            self.0.header(key)
        }
        fn keys(&self) -> Vec<&str> {
            self.0.headers().map(|(name, _)| name).collect()
        }
    }

    if span.is_disabled() || delivery.header("traceparent").is_none() {
        return;
    }
    let producer = TraceContextPropagator::new()
        .extract_with_context(&opentelemetry::Context::new(), &Headers(delivery));
    if producer.span().span_context().is_valid() {
        // Err only when the subscriber has no OpenTelemetry layer: nothing to continue.
        let _ = span.set_parent(producer);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_operation_name_falls_back_without_a_queue() {
        assert_eq!(OperationName("orders").to_string(), "orders process");
        assert_eq!(OperationName("").to_string(), "process");
    }

    #[test]
    fn the_span_declares_the_field_the_guard_records() {
        let subscriber = tracing_subscriber_stub::Enabled;
        tracing::subscriber::with_default(subscriber, || {
            let envelope = Envelope::new("urn:babel:orders:created", serde_json::json!({}));
            let span = consumer(&envelope, &Delivery::new());
            let fields = span.metadata().expect("the span is enabled").fields();
            assert!(fields.field(crate::metrics::DECISION_FIELD).is_some());
        });
    }

    /// A subscriber that enables everything and records nothing.
    mod tracing_subscriber_stub {
        use tracing::span::{Attributes, Id, Record};
        use tracing::{Event, Metadata, Subscriber};

        pub(super) struct Enabled;

        impl Subscriber for Enabled {
            fn enabled(&self, _: &Metadata<'_>) -> bool {
                true
            }
            fn new_span(&self, _: &Attributes<'_>) -> Id {
                Id::from_u64(1)
            }
            fn record(&self, _: &Id, _: &Record<'_>) {}
            fn record_follows_from(&self, _: &Id, _: &Id) {}
            fn event(&self, _: &Event<'_>) {}
            fn enter(&self, _: &Id) {}
            fn exit(&self, _: &Id) {}
        }
    }
}
