//! Below DEBUG the guard writes no event of its own, but at INFO it still
//! puts its decision on the current span (the consumer span's field): the
//! guard checks the level once for both.

mod support;

use babel_idem::{Envelope, InMemoryStore, StoreError, run_once};
use serde_json::json;
use support::Captured;

/// The log of two deliveries of one id, each in a span with the decision
/// field, under a subscriber at `level`.
async fn two_deliveries_at(level: tracing::Level) -> String {
    let log = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(log.clone())
        .with_ansi(false)
        .finish();
    let _default = tracing::subscriber::set_default(subscriber);

    let store = InMemoryStore::new();
    let env = Envelope::new("urn:babel:orders:created", json!({}))
        .with_id("1b4e28ba-2fa1-4d2f-883f-0016d3cca427");
    for delivery in ["first", "second"] {
        let span = tracing::info_span!(
            "delivery",
            delivery,
            messaging.babelqueue.idempotency.decision = tracing::field::Empty,
        );
        let _entered = span.enter();
        run_once(&store, &env, async { Ok::<(), StoreError>(()) })
            .await
            .unwrap();
        tracing::info!("handled");
    }
    log.text()
}

#[tokio::test]
async fn at_info_the_decision_is_on_the_span_and_no_debug_event_is_written() {
    let log = two_deliveries_at(tracing::Level::INFO).await;
    let handled: Vec<_> = log
        .lines()
        .filter(|line| line.contains("handled"))
        .collect();
    assert_eq!(handled.len(), 2, "{log}");
    assert!(
        handled[0].contains("delivery=\"first\"")
            && handled[0].contains("messaging.babelqueue.idempotency.decision=\"ran\""),
        "{log}"
    );
    assert!(
        handled[1].contains("delivery=\"second\"")
            && handled[1].contains("messaging.babelqueue.idempotency.decision=\"skipped\""),
        "{log}"
    );
    assert!(
        !log.contains("message_id="),
        "a debug event at INFO:\n{log}"
    );
}

#[tokio::test]
async fn at_debug_the_span_has_the_decision_and_the_event_the_id() {
    let log = two_deliveries_at(tracing::Level::DEBUG).await;
    for decision in ["ran", "skipped"] {
        let event =
            format!("message_id=\"1b4e28ba-2fa1-4d2f-883f-0016d3cca427\" decision=\"{decision}\"");
        assert!(log.contains(&event), "no event {event} in:\n{log}");
        let span = format!("messaging.babelqueue.idempotency.decision=\"{decision}\"");
        assert!(log.contains(&span), "no span field {span} in:\n{log}");
    }
}

#[tokio::test]
async fn below_info_nothing_is_written() {
    let log = two_deliveries_at(tracing::Level::WARN).await;
    assert_eq!(log, "");
}
