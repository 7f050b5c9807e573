//! The consumer span of `Router::dispatch`, exported through
//! `tracing-opentelemetry` to the OpenTelemetry SDK's in-memory exporter:
//! its name (`process <urn>`, the family's), kind and every attribute, the
//! guard's decision (ran, then skipped for a redelivery), the W3C
//! `traceparent` continuation, and without one the remote parent derived
//! from the envelope's `trace_id` exactly as the Python SDK derives it
//! (its own `trace_id_of` and `_span_id_of`, asked through
//! `BABEL_IDEM_PYTHON`).
#![cfg(feature = "opentelemetry")]

mod family_python;

use std::sync::LazyLock;

use babel_idem::{
    Delivery, Disposition, Envelope, InMemoryStore, Router, StoreError, idempotent, urn,
};
use opentelemetry::trace::{SpanId, SpanKind, TraceId, TracerProvider as _};
use opentelemetry::{Key, Value};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use serde_json::json;
use tracing_subscriber::layer::SubscriberExt;

static STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);

#[idempotent(store = STORE)]
async fn on_order_created(_env: Envelope) -> Result<(), StoreError> {
    Ok(())
}

/// A producer's span: trace `4bf9...4736`, span `00f0...02b7`, sampled.
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_SPAN_ID: &str = "00f067aa0ba902b7";

fn traceparent() -> String {
    format!("00-{TRACE_ID}-{PARENT_SPAN_ID}-01")
}

fn router() -> Router {
    Router::builder()
        .route(urn!("urn:babel:orders:created"), on_order_created)
        .build()
        .unwrap()
}

fn order(queue: &str, attempts: u64) -> (String, Vec<u8>) {
    let id = uuid::Uuid::new_v4().to_string();
    let mut env = Envelope::new("urn:babel:orders:created", json!({"order_id": 7})).with_id(&id);
    env.meta.queue = queue.to_owned();
    env.trace_id = format!("trace-{id}");
    env.attempts = attempts;
    (id, env.to_vec())
}

/// Dispatches each delivery with an OpenTelemetry-exporting subscriber
/// installed, and returns the finished spans in order.
async fn export(deliveries: Vec<(Vec<u8>, Delivery)>) -> Vec<SpanData> {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("spans_otel")));
    let router = router();
    {
        let _default = tracing::subscriber::set_default(subscriber);
        for (bytes, delivery) in deliveries {
            let disposition = router.dispatch(&bytes, delivery).await;
            assert!(matches!(disposition, Disposition::Ack), "{disposition:?}");
        }
    }
    provider.force_flush().unwrap();
    exporter.get_finished_spans().unwrap()
}

fn attribute(span: &SpanData, key: &str) -> Option<Value> {
    span.attributes
        .iter()
        .find(|kv| kv.key == Key::from(key.to_owned()))
        .map(|kv| kv.value.clone())
}

fn text(span: &SpanData, key: &str) -> String {
    match attribute(span, key) {
        Some(Value::String(value)) => value.as_str().to_owned(),
        other => panic!("attribute {key}: expected a string, got {other:?} in {span:#?}"),
    }
}

fn assert_consumer_span(span: &SpanData, queue: &str, id: &str, attempts: i64, decision: &str) {
    assert_eq!(span.name, "process urn:babel:orders:created");
    assert_eq!(span.span_kind, SpanKind::Consumer);
    assert_eq!(text(span, "messaging.system"), "babelqueue");
    assert_eq!(text(span, "messaging.operation"), "process");
    assert_eq!(text(span, "messaging.destination.name"), queue);
    assert_eq!(text(span, "messaging.message.id"), id);
    assert_eq!(
        text(span, "messaging.message.conversation_id"),
        format!("trace-{id}")
    );
    assert_eq!(
        attribute(span, "messaging.babelqueue.attempts"),
        Some(Value::I64(attempts))
    );
    assert_eq!(
        text(span, "messaging.babelqueue.idempotency.decision"),
        decision
    );
}

#[tokio::test]
async fn a_delivery_runs_in_a_consumer_span_that_records_the_decision() {
    let (id, bytes) = order("orders", 2);
    let spans = export(vec![
        (bytes.clone(), Delivery::new()),
        (bytes, Delivery::new().with_queue("orders")),
    ])
    .await;

    assert_eq!(spans.len(), 2, "{spans:#?}");
    assert_consumer_span(&spans[0], "orders", &id, 2, "ran");
    assert_consumer_span(&spans[1], "orders", &id, 2, "skipped");
    for span in &spans {
        // No traceparent: the remote parent derived from `trace_id`.
        assert!(span.parent_span_is_remote);
        assert_ne!(span.parent_span_id, SpanId::INVALID);
        assert_ne!(
            span.span_context.trace_id(),
            TraceId::from_hex(TRACE_ID).unwrap()
        );
    }
    // Both deliveries of one `trace_id` are in one trace, under one parent.
    assert_eq!(
        spans[0].span_context.trace_id(),
        spans[1].span_context.trace_id()
    );
    assert_eq!(spans[0].parent_span_id, spans[1].parent_span_id);
    assert_ne!(
        spans[0].span_context.span_id(),
        spans[1].span_context.span_id()
    );
}

#[tokio::test]
async fn a_traceparent_header_continues_the_producers_trace() {
    let (id, bytes) = order("billing", 0);
    let spans = export(vec![(
        bytes,
        Delivery::new()
            .with_attempts(3)
            .with_header("traceparent", traceparent()),
    )])
    .await;

    assert_eq!(spans.len(), 1, "{spans:#?}");
    let span = &spans[0];
    // The transport's attempts win over the envelope's.
    assert_consumer_span(span, "billing", &id, 3, "ran");
    assert_eq!(
        span.span_context.trace_id(),
        TraceId::from_hex(TRACE_ID).unwrap()
    );
    assert_eq!(
        span.parent_span_id,
        SpanId::from_hex(PARENT_SPAN_ID).unwrap()
    );
    assert!(span.parent_span_is_remote);
    assert_ne!(
        span.span_context.span_id(),
        SpanId::from_hex(PARENT_SPAN_ID).unwrap()
    );
}

#[tokio::test]
async fn a_malformed_traceparent_falls_back_to_the_trace_id_parent() {
    let (id, bytes) = order("orders", 0);
    let spans = export(vec![
        (
            bytes.clone(),
            Delivery::new().with_header("traceparent", format!("00-{TRACE_ID}-not-a-span-01")),
        ),
        (bytes, Delivery::new()),
    ])
    .await;

    assert_eq!(spans.len(), 2, "{spans:#?}");
    assert_consumer_span(&spans[0], "orders", &id, 0, "ran");
    assert_ne!(
        spans[0].span_context.trace_id(),
        TraceId::from_hex(TRACE_ID).unwrap()
    );
    // The same parent as the delivery that carried no header at all.
    assert!(spans[0].parent_span_is_remote);
    assert_eq!(
        spans[0].span_context.trace_id(),
        spans[1].span_context.trace_id()
    );
    assert_eq!(spans[0].parent_span_id, spans[1].parent_span_id);
}

/// `trace_id`s of every form the family's derivation tells apart: UUIDs
/// (with and without dashes, upper case), the nil UUID (hashed), text that
/// is no UUID, non-ASCII text, and hex pairs with spaces (which Python's
/// `bytes.fromhex` accepts).
fn trace_ids() -> Vec<String> {
    let uuid = uuid::Uuid::new_v4();
    vec![
        uuid.to_string(),
        uuid.simple().to_string().to_uppercase(),
        "00000000-0000-0000-0000-000000000000".to_owned(),
        format!("trace-{uuid}"),
        format!("commande-é-{}", uuid.simple()),
        " 0102030405060708090a0b0c0d0e0f ".to_owned(),
        "x".to_owned(),
    ]
}

#[tokio::test]
async fn without_a_traceparent_the_parent_is_the_one_the_python_sdk_derives() {
    let trace_ids = trace_ids();
    let Some(python) = family_python::ask(
        "without_a_traceparent_the_parent_is_the_one_the_python_sdk_derives",
        "trace-parent",
        &json!(trace_ids),
    ) else {
        return;
    };
    let deliveries = trace_ids
        .iter()
        .map(|trace_id| {
            let mut env = Envelope::new("urn:babel:orders:created", json!({"order_id": 7}))
                .with_id(uuid::Uuid::new_v4().to_string());
            env.trace_id = trace_id.clone();
            (env.to_vec(), Delivery::new().with_queue("orders"))
        })
        .collect();
    let spans = export(deliveries).await;

    assert_eq!(spans.len(), trace_ids.len(), "{spans:#?}");
    for ((span, trace_id), expected) in spans.iter().zip(&trace_ids).zip(python.as_array().unwrap())
    {
        let expected_trace = TraceId::from_hex(expected["trace_id"].as_str().unwrap()).unwrap();
        let expected_parent = SpanId::from_hex(expected["span_id"].as_str().unwrap()).unwrap();
        assert_eq!(span.span_context.trace_id(), expected_trace, "{trace_id:?}");
        assert_eq!(span.parent_span_id, expected_parent, "{trace_id:?}");
        assert!(span.parent_span_is_remote, "{trace_id:?}");
        assert!(span.span_context.is_sampled(), "{trace_id:?}");
        assert_eq!(
            text(span, "messaging.message.conversation_id"),
            *trace_id,
            "the attribute carries the envelope's own trace_id"
        );
    }
    // A UUID is its own trace id.
    assert_eq!(
        spans[0].span_context.trace_id(),
        TraceId::from_bytes(*uuid::Uuid::parse_str(&trace_ids[0]).unwrap().as_bytes())
    );
}

#[tokio::test]
async fn without_a_queue_in_the_envelope_the_transports_queue_names_the_span() {
    let (id, bytes) = order("", 0);
    let spans = export(vec![(bytes, Delivery::new().with_queue("fallback"))]).await;
    assert_eq!(spans.len(), 1, "{spans:#?}");
    assert_consumer_span(&spans[0], "fallback", &id, 0, "ran");
}
