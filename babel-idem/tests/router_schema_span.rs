//! The consumer span of a delivery refused for its payload records the
//! violation (`messaging.babelqueue.payload.violation`). Alone in its own
//! test binary: a subscriber set for one thread sees every span only when
//! no other test registers the same callsites at the same moment.
#![cfg(feature = "schema")]

#[allow(dead_code)]
mod router_schema_support;
mod support;

use babel_idem::Delivery;
use router_schema_support::{CREATED, NOTED, Runs, envelope_bytes, typed_router};
use support::Captured;

#[tokio::test]
async fn the_consumer_span_records_the_violation_of_a_refused_payload() {
    let log = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_span_events(tracing_subscriber::fmt::format::FmtSpan::CLOSE)
        .with_writer(log.clone())
        .with_ansi(false)
        .finish();
    let _default = tracing::subscriber::set_default(subscriber);
    let router = typed_router(&Runs::default());

    let by_schema = envelope_bytes(CREATED, r#"{"order_id": 1, "currency": "GBP"}"#);
    let by_decode = envelope_bytes(NOTED, r#"{"order_id": -4}"#);
    let valid = envelope_bytes(CREATED, r#"{"order_id": 1, "currency": "USD"}"#);
    for bytes in [by_schema, by_decode, valid] {
        let _ = router.dispatch(&bytes, Delivery::new()).await;
    }

    let log = log.text();
    let closed: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("babelqueue.process{") && line.contains(" close "))
        .collect();
    assert_eq!(closed.len(), 3, "one consumer span a delivery:\n{log}");
    assert!(
        closed[0].contains("messaging.babelqueue.payload.violation=currency: not_in_enum"),
        "{log}"
    );
    assert!(
        closed[1].contains(
            "messaging.babelqueue.payload.violation=order_id: invalid value: integer `-4`, expected u64"
        ),
        "{log}"
    );
    assert!(
        !closed[2].contains("payload.violation"),
        "a valid payload records no violation: {log}"
    );
}
