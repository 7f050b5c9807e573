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
