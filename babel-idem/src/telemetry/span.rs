//! The CONSUMER span each routed delivery's handler runs in and the PRODUCER
//! span each publish runs in (their attributes: [`telemetry`](super)).

use std::fmt;

use tracing::Span;

use crate::envelope::Envelope;
use crate::message::MessageId;

/// The spans' `tracing` target, the name a subscriber filters them by; it
/// stays the same wherever this module sits.
const TARGET: &str = "babel_idem::router::span";

/// A BabelQueue messaging span named `$name` (OpenTelemetry name
/// `$otel_name`, kind `$kind`): `$operation` on `$queue` of `$envelope`,
/// with the attributes every such span carries, then `$extra` fields.
macro_rules! messaging_span {
    (
        $name:literal,
        $otel_name:expr,
        $kind:literal,
        $operation:literal,
        $queue:expr,
        $envelope:expr
        $(, $($extra:tt)+)?
    ) => {
        tracing::info_span!(
            target: TARGET,
            $name,
            otel.name = %$otel_name,
            otel.kind = $kind,
            messaging.system = "babelqueue",
            messaging.operation = $operation,
            messaging.destination.name = $queue,
            messaging.message.id = $envelope.message_id(),
            messaging.message.conversation_id = $envelope.trace_id.as_str(),
            // OpenTelemetry integers are i64 (a u64 would be exported as text).
            messaging.babelqueue.attempts = i64::try_from($envelope.attempts).unwrap_or(i64::MAX),
            $($($extra)+)?
        )
    };
}

/// Opens (but does not enter) the consumer span of one delivery from
/// `transport_queue` (the queue the transport names, if any) whose transport
/// headers `headers` lists. Its fields are computed only when a subscriber
/// wants the span.
pub(crate) fn consumer<'h, H>(
    envelope: &Envelope,
    transport_queue: Option<&str>,
    headers: impl Fn() -> H,
) -> Span
where
    H: Iterator<Item = (&'h str, &'h str)>,
{
    let queue = if envelope.meta.queue.is_empty() {
        transport_queue.unwrap_or_default()
    } else {
        envelope.meta.queue.as_str()
    };
    // The last two fields' names are `metrics::DECISION_FIELD`, which the
    // guard records, and `metrics::INVALID_PAYLOAD_FIELD`, which dispatch
    // records for a refused payload.
    let span = messaging_span!(
        "babelqueue.process",
        ProcessName(envelope.urn()),
        "consumer",
        "process",
        queue,
        envelope,
        messaging.babelqueue.idempotency.decision = tracing::field::Empty,
        messaging.babelqueue.payload.violation = tracing::field::Empty
    );
    #[cfg(feature = "opentelemetry")]
    super::carrier::continue_trace(&span, headers, &envelope.trace_id);
    #[cfg(not(feature = "opentelemetry"))]
    let _ = headers;
    span
}

/// Opens (but does not enter) the producer span of one publish of
/// `envelope` to `queue`.
#[cfg_attr(
    not(any(feature = "redis-transport", feature = "amqp-transport")),
    allow(dead_code, reason = "only a broker binding publishes")
)]
pub(crate) fn producer(envelope: &Envelope, queue: &str) -> Span {
    messaging_span!(
        "babelqueue.publish",
        PublishName(envelope.urn()),
        "producer",
        "publish",
        queue,
        envelope
    )
}

/// `publish <urn>`, the family's producer span name.
struct PublishName<'a>(&'a str);

impl fmt::Display for PublishName<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "publish {}", self.0)
    }
}

/// `process <urn>`, the family's consumer span name (the Python SDK's
/// `otel.wrap_handler`).
struct ProcessName<'a>(&'a str);

impl fmt::Display for ProcessName<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "process {}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::metrics::{DECISION_FIELD, INVALID_PAYLOAD_FIELD};

    #[test]
    fn the_span_names_are_the_familys() {
        let urn = "urn:babel:orders:created";
        assert_eq!(
            ProcessName(urn).to_string(),
            "process urn:babel:orders:created"
        );
        assert_eq!(
            PublishName(urn).to_string(),
            "publish urn:babel:orders:created"
        );
    }

    #[test]
    fn the_span_declares_the_fields_the_guard_and_dispatch_record() {
        let subscriber = tracing_subscriber_stub::Enabled;
        tracing::subscriber::with_default(subscriber, || {
            let envelope = Envelope::new("urn:babel:orders:created", serde_json::json!({}));
            let span = consumer(&envelope, None, std::iter::empty);
            let metadata = span.metadata().expect("the span is enabled");
            assert_eq!(metadata.target(), "babel_idem::router::span");
            assert!(metadata.fields().field(DECISION_FIELD).is_some());
            assert!(metadata.fields().field(INVALID_PAYLOAD_FIELD).is_some());
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
