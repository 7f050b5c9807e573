//! Publishing for producers on real brokers: an `Envelope` in the canonical
//! encoding, batches in one round trip with one outcome per message, and
//! the PRODUCER span with its W3C `traceparent` header.
//!
//! Environment: `BABEL_IDEM_REDIS_URL`, `BABEL_IDEM_AMQP_URL`; without them
//! the tests print `skipped:`, and with `BABEL_IDEM_REQUIRE_SERVERS=1` fail.
#![cfg(all(feature = "redis-transport", feature = "amqp-transport"))]

mod outbox_support;
mod store_contract;

use babel_idem::Envelope;
use babel_idem::broker::Publisher;
use babel_idem::envelope::ProduceError;
use babel_idem::transport::{AmqpTransport, Outgoing, PublishError, RedisTransport};
use outbox_support::{AMQP_URL, Broker};
use serde_json::json;
use store_contract::servers::{REDIS_URL, server_url, unique_suffix};

fn order(queue: &str) -> Envelope {
    Envelope::new(
        "urn:babel:orders:created",
        json!({"order_id": 7, "note": "é/ü"}),
    )
    .with_queue(queue)
}

#[tokio::test]
async fn an_envelope_lands_on_redis_as_its_canonical_bytes() {
    let Some(url) = server_url(REDIS_URL, "publish_redis_canonical") else {
        return;
    };
    let queue = format!("bi-pub-{}", unique_suffix());
    let transport = RedisTransport::connect(&url).await.unwrap();
    let env = order(&queue);
    transport.publish_envelope(&env).await.unwrap();
    let landed = Broker::Redis(url).drain(&queue).await;
    assert_eq!(landed.len(), 1);
    assert_eq!(landed[0].body, env.encode_for_publish().unwrap());
    assert!(
        String::from_utf8_lossy(&landed[0].body).contains("é/ü"),
        "Unicode and slashes unescaped, as the Python SDK writes them"
    );
}

#[tokio::test]
async fn an_envelope_that_does_not_encode_is_refused_before_anything_is_sent() {
    let Some(url) = server_url(REDIS_URL, "publish_refused_envelope") else {
        return;
    };
    let queue = format!("bi-pub-{}", unique_suffix());
    let transport = RedisTransport::connect(&url).await.unwrap();
    let error = transport
        .publish_envelope(&order(&queue).without_id())
        .await
        .unwrap_err();
    assert!(
        matches!(error, PublishError::Envelope(ProduceError::MissingId)),
        "{error}"
    );
    assert_eq!(Broker::Redis(url).len(&queue).await, 0);
}

#[tokio::test]
async fn a_redis_batch_reports_a_refused_message_without_failing_the_others() {
    let Some(url) = server_url(REDIS_URL, "publish_redis_batch") else {
        return;
    };
    let suffix = unique_suffix();
    let (good, wrong_type) = (format!("bi-pub-{suffix}"), format!("bi-pub-{suffix}-hash"));
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut raw = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("HSET")
        .arg(&wrong_type)
        .arg("f")
        .arg("v")
        .query_async(&mut raw)
        .await
        .unwrap();
    let transport = RedisTransport::connect(&url).await.unwrap();
    let headers = vec![("traceparent".to_owned(), "00-abc".to_owned())];
    let outcome = transport
        .publish_batch(&[
            Outgoing::new(&good, b"{\"n\":1}"),
            Outgoing::new("bad queue", b"{\"n\":2}"),
            Outgoing::new(&wrong_type, b"{\"n\":3}"),
            Outgoing::new(&good, b"{\"n\":4}").with_headers(&headers),
        ])
        .await
        .unwrap();
    assert!(outcome[0].is_ok());
    assert!(
        outcome[1]
            .as_ref()
            .unwrap_err()
            .to_string()
            .contains("whitespace")
    );
    assert!(
        outcome[2]
            .as_ref()
            .unwrap_err()
            .to_string()
            .contains("WRONGTYPE")
    );
    assert!(outcome[3].is_ok());
    let broker = Broker::Redis(url);
    let landed = broker.drain(&good).await;
    assert_eq!(landed.len(), 2);
    assert_eq!(landed[0].body, b"{\"n\":1}");
    assert_eq!(landed[1].body, b"{\"n\":4}");
    assert_eq!(landed[1].header("traceparent"), Some("00-abc"));
    broker.delete(&[wrong_type]).await;
}

#[tokio::test]
async fn an_amqp_batch_spans_queues_and_reports_each_message() {
    let Some(url) = server_url(AMQP_URL, "publish_amqp_batch") else {
        return;
    };
    let suffix = unique_suffix();
    let (a, b) = (format!("bi-pub-{suffix}-a"), format!("bi-pub-{suffix}-b"));
    let transport = AmqpTransport::connect(&url).await.unwrap();
    let env = order(&a);
    let body = env.encode_for_publish().unwrap();
    let headers = vec![("traceparent".to_owned(), "00-abc".to_owned())];
    let outcome = transport
        .publish_batch(&[
            Outgoing::new(&a, &body).with_headers(&headers),
            Outgoing::new("amq.refused", b"{}"),
            Outgoing::new(&b, b"{\"n\":2}"),
        ])
        .await
        .unwrap();
    assert!(outcome[0].is_ok() && outcome[2].is_ok(), "{outcome:?}");
    assert!(
        outcome[1]
            .as_ref()
            .unwrap_err()
            .to_string()
            .contains("reserved")
    );
    let broker = Broker::Amqp(url);
    let landed_a = broker.drain(&a).await;
    assert_eq!(landed_a.len(), 1);
    assert_eq!(landed_a[0].body, body);
    assert_eq!(landed_a[0].header("traceparent"), Some("00-abc"));
    assert_eq!(
        landed_a[0].header("x-source-lang"),
        Some("rust"),
        "the contract headers are derived from the body"
    );
    assert_eq!(broker.drain(&b).await.len(), 1);
    transport.publish_envelope(&env).await.unwrap();
    assert_eq!(broker.drain(&a).await[0].body, body);
    transport.close().await;
    broker.delete(&[a, b]).await;
}

#[cfg(feature = "opentelemetry")]
#[tokio::test]
async fn the_producer_span_carries_the_family_attributes_and_its_traceparent_travels() {
    use opentelemetry::trace::{SpanKind, TracerProvider as _};
    use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
    use tracing_subscriber::layer::SubscriberExt;

    let Some(url) = server_url(REDIS_URL, "publish_producer_span") else {
        return;
    };
    let queue = format!("bi-pub-{}", unique_suffix());
    let transport = RedisTransport::connect(&url).await.unwrap();
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("publish")));
    let env = order(&queue);
    {
        let _default = tracing::subscriber::set_default(subscriber);
        transport.publish_envelope(&env).await.unwrap();
    }
    provider.force_flush().unwrap();
    let spans = exporter.get_finished_spans().unwrap();
    let span = spans
        .iter()
        .find(|s| s.name == "publish urn:babel:orders:created")
        .expect("the producer span");
    assert_eq!(span.span_kind, SpanKind::Producer);
    let attribute = |key: &str| {
        span.attributes
            .iter()
            .find(|kv| kv.key.as_str() == key)
            .map(|kv| kv.value.to_string())
    };
    assert_eq!(attribute("messaging.system").as_deref(), Some("babelqueue"));
    assert_eq!(attribute("messaging.operation").as_deref(), Some("publish"));
    assert_eq!(attribute("messaging.destination.name"), Some(queue.clone()));
    assert_eq!(attribute("messaging.message.id"), env.meta.id.clone());
    assert_eq!(
        attribute("messaging.message.conversation_id"),
        Some(env.trace_id.clone())
    );
    let landed = Broker::Redis(url).drain(&queue).await;
    let traceparent = landed[0]
        .header("traceparent")
        .expect("a traceparent header");
    assert_eq!(
        traceparent,
        format!(
            "00-{}-{}-01",
            span.span_context.trace_id(),
            span.span_context.span_id()
        )
    );
    assert_eq!(landed[0].body, env.encode_for_publish().unwrap());
}
