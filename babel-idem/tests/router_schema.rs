//! A router with payload schemas (`RouterBuilder::schemas`): `data` checked
//! against its URN's schema, in document order, before the handler runs
//! (typed or not, and before a typed decode); a violation fails the attempt
//! with `InvalidPayloadError`, retried then dead-lettered with the Python
//! SDK's block, the handler never run; a URN without a schema is not
//! checked. The feature `metrics` counts refused attempts per URN (the
//! consumer span's record of the violation is `router_schema_span.rs`).
#![cfg(feature = "schema")]

mod support;

use babel_idem::envelope::DeadLetterReason;
use babel_idem::router::{DeadLettered, DispatchError, InvalidPayloadError, Retry};
use babel_idem::schema::SchemaProvider;
use babel_idem::{Delivery, Disposition, Envelope, Router, urn};
use serde_json::json;
use support::{expect_dead_letter, expect_retry};

mod router_schema_support;

use router_schema_support::{CREATED, NOTED, Runs, SCHEMAS, envelope_bytes, typed_router};

/// The `InvalidPayloadError` an attempt failed with.
fn invalid_payload(error: &DispatchError) -> &InvalidPayloadError {
    match error {
        DispatchError::Handler(error) => error
            .error()
            .downcast_ref::<InvalidPayloadError>()
            .unwrap_or_else(|| panic!("not an InvalidPayloadError: {error}")),
        other => panic!("not a handler's error: {other}"),
    }
}

/// Dispatches `bytes` until they are dead-lettered (each retry's body
/// dispatched again); the retries' errors, and the dead letter.
async fn until_dead_lettered(router: &Router, bytes: Vec<u8>) -> (Vec<Retry>, DeadLettered) {
    let mut retries = Vec::new();
    let mut bytes = bytes;
    loop {
        match router.dispatch(&bytes, Delivery::new()).await {
            Disposition::Retry(retry) => {
                bytes = retry.body();
                retries.push(retry);
            }
            other => return (retries, expect_dead_letter(other)),
        }
    }
}

#[tokio::test]
async fn a_valid_typed_message_runs_once_and_is_acked() {
    let runs = Runs::default();
    let router = typed_router(&runs);
    let bytes = envelope_bytes(CREATED, r#"{"order_id": 1042, "currency": "EUR"}"#);

    let disposition = router.dispatch(&bytes, Delivery::new()).await;

    assert!(disposition.is_ack(), "got {disposition}");
    assert_eq!(
        runs.handed(),
        [json!({"order_id": 1042, "currency": "EUR"})]
    );
}

#[tokio::test]
async fn schema_invalid_data_is_retried_then_dead_lettered_with_its_violation_and_never_handled() {
    let runs = Runs::default();
    let router = typed_router(&runs);
    let bytes = envelope_bytes(CREATED, r#"{"order_id": 0, "currency": "EUR"}"#);

    let (retries, dead) = until_dead_lettered(&router, bytes).await;

    assert_eq!(runs.count(), 0, "the handler never ran");
    assert_eq!(
        retries.iter().map(|r| r.attempts).collect::<Vec<_>>(),
        [1, 2]
    );
    let expected = "data for 'urn:babel:orders:created' does not match its URN schema: \
                    order_id: below_minimum";
    for retry in &retries {
        let invalid = invalid_payload(&retry.error);
        assert_eq!(
            (invalid.path(), invalid.reason()),
            ("order_id", "below_minimum")
        );
        assert_eq!(invalid.to_string(), expected);
    }
    assert_eq!(dead.reason, DeadLetterReason::Failed);
    assert_eq!(invalid_payload(&dead.error).urn(), CREATED);
    let record = Envelope::from_slice(&dead.body).unwrap();
    let block = record.dead_letter.unwrap();
    assert_eq!(block.reason, DeadLetterReason::Failed);
    assert_eq!(block.exception.as_deref(), Some("InvalidPayloadError"));
    assert_eq!(block.error.as_deref(), Some(expected));
    assert_eq!(block.attempts, 3);
    assert_eq!(block.original_queue, "orders");
    assert_eq!(record.data["order_id"], 0, "the record keeps the data");
}

#[tokio::test]
async fn the_dead_letter_block_of_a_schema_violation_is_the_one_of_a_typed_decode_failure() {
    let runs = Runs::default();
    let router = typed_router(&runs);
    // `order_id` 1.0 is an integer to the schema, not a `u64` to serde.
    let decode = envelope_bytes(CREATED, r#"{"order_id": 1.0, "currency": "EUR"}"#);
    let schema = envelope_bytes(CREATED, r#"{"order_id": 1, "currency": "GBP"}"#);

    let (_, by_decode) = until_dead_lettered(&router, decode).await;
    let (_, by_schema) = until_dead_lettered(&router, schema).await;

    assert_eq!(runs.count(), 0);
    let block = |dead: &DeadLettered| {
        let block = dead.envelope.as_ref().unwrap().dead_letter.clone().unwrap();
        (block.reason, block.exception, block.attempts, block.error)
    };
    let (decode, schema) = (block(&by_decode), block(&by_schema));
    assert_eq!(
        (&decode.0, &decode.1, decode.2),
        (&schema.0, &schema.1, schema.2)
    );
    assert_eq!(
        decode.3.as_deref(),
        Some(
            "data for 'urn:babel:orders:created' does not match its URN schema: \
             order_id: invalid type: floating point `1.0`, expected u64"
        )
    );
    assert_eq!(
        schema.3.as_deref(),
        Some(
            "data for 'urn:babel:orders:created' does not match its URN schema: \
             currency: not_in_enum"
        )
    );
}

#[tokio::test]
async fn the_first_violation_is_the_first_in_the_datas_document_order() {
    let router = typed_router(&Runs::default());
    // Sorted by key, `order_id` (not an integer) would come before `zeta`.
    let zeta_first = envelope_bytes(
        CREATED,
        r#"{"zeta": 1, "order_id": "x", "currency": "EUR"}"#,
    );
    let order_id_first = envelope_bytes(
        CREATED,
        r#"{"order_id": "x", "zeta": 1, "currency": "EUR"}"#,
    );

    let first = expect_retry(router.dispatch(&zeta_first, Delivery::new()).await);
    let second = expect_retry(router.dispatch(&order_id_first, Delivery::new()).await);

    assert_eq!(
        invalid_payload(&first.error).violation(),
        "zeta: additional_not_allowed"
    );
    assert_eq!(
        invalid_payload(&second.error).violation(),
        "order_id: not_an_integer"
    );
}

#[tokio::test]
async fn the_schema_is_checked_before_the_typed_decode() {
    let router = typed_router(&Runs::default());
    // Both refuse a string `order_id`: the schema answers first.
    let bytes = envelope_bytes(CREATED, r#"{"order_id": "7", "currency": "EUR"}"#);

    let retry = expect_retry(router.dispatch(&bytes, Delivery::new()).await);

    assert_eq!(
        invalid_payload(&retry.error).violation(),
        "order_id: not_an_integer"
    );
}

#[tokio::test]
async fn a_urn_without_a_schema_is_not_checked() {
    let runs = Runs::default();
    let router = typed_router(&runs);
    assert!(SCHEMAS.schema_for(NOTED).is_none());
    // Members no schema names, which `orders:created`'s schema would refuse.
    let bytes = envelope_bytes(NOTED, r#"{"order_id": 3, "extra": [1, "x"]}"#);

    let disposition = router.dispatch(&bytes, Delivery::new()).await;

    assert!(disposition.is_ack(), "got {disposition}");
    assert_eq!(runs.handed(), [json!({"order_id": 3})]);
}

#[tokio::test]
async fn an_untyped_handler_gets_the_same_check() {
    let runs = Runs::default();
    let counted = runs.clone();
    let router = Router::builder()
        .route(urn!("urn:babel:orders:created"), move |env: Envelope| {
            counted.ran(&env.data)
        })
        .schemas(SCHEMAS.clone())
        .max_attempts(2)
        .build()
        .unwrap();

    let valid = envelope_bytes(CREATED, r#"{"order_id": 9, "currency": "USD"}"#);
    assert!(router.dispatch(&valid, Delivery::new()).await.is_ack());
    let invalid = envelope_bytes(CREATED, r#"{"currency": "USD"}"#);
    let (retries, dead) = until_dead_lettered(&router, invalid).await;

    assert_eq!(
        runs.handed(),
        [json!({"order_id": 9, "currency": "USD"})],
        "only the valid message ran"
    );
    assert_eq!(retries.len(), 1);
    assert_eq!(
        invalid_payload(&dead.error).violation(),
        "order_id: missing_required"
    );
}

#[tokio::test]
async fn a_router_without_schemas_checks_nothing() {
    let runs = Runs::default();
    let counted = runs.clone();
    let router = Router::builder()
        .route(urn!("urn:babel:orders:created"), move |env: Envelope| {
            counted.ran(&env.data)
        })
        .build()
        .unwrap();
    assert!(router.schemas().is_none());

    let bytes = envelope_bytes(CREATED, r#"{"order_id": 0, "currency": "GBP", "zeta": 1}"#);
    assert!(router.dispatch(&bytes, Delivery::new()).await.is_ack());
    assert_eq!(runs.count(), 1);
}

#[cfg(feature = "metrics")]
#[test]
fn refused_attempts_are_counted_per_urn() {
    use babel_idem::telemetry::metrics::INVALID_PAYLOADS_TOTAL;
    use metrics_util::MetricKind;
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let router = typed_router(&Runs::default());
    metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            // Three attempts each: by the schema, and by the typed decode.
            let by_schema = envelope_bytes(CREATED, r#"{"currency": "EUR"}"#);
            let by_decode = envelope_bytes(NOTED, r#"{"order_id": "one"}"#);
            until_dead_lettered(&router, by_schema).await;
            until_dead_lettered(&router, by_decode).await;
            let valid = envelope_bytes(CREATED, r#"{"order_id": 2, "currency": "EUR"}"#);
            assert!(router.dispatch(&valid, Delivery::new()).await.is_ack());
        })
    });

    let counters: Vec<(String, u64)> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, ..)| {
            key.kind() == MetricKind::Counter && key.key().name() == INVALID_PAYLOADS_TOTAL
        })
        .map(|(key, _, _, value)| {
            let labels: Vec<String> = key
                .key()
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            let DebugValue::Counter(count) = value else {
                panic!("not a counter: {value:?}");
            };
            (labels.join(","), count)
        })
        .collect();
    let mut counters = counters;
    counters.sort();
    assert_eq!(
        counters,
        [(format!("urn={CREATED}"), 3), (format!("urn={NOTED}"), 3)]
    );
}
