//! The dispatch matrix: every disposition, attempts counting, the dead-letter
//! block read back by the envelope decoder, each unknown-URN strategy, every
//! kind of poison, panics, and an `#[idempotent]` handler behind the router.

mod support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use babel_idem::envelope::DeadLetterReason;
use babel_idem::router::{Backoff, DispatchError, RouterError, UnknownUrnStrategy, UrnError};
use babel_idem::{
    Delivery, Disposition, Envelope, EnvelopeError, InMemoryStore, MessageId, Router, StoreError,
    Urn, idempotent, routes, urn,
};
use serde_json::json;
use support::{expect_dead_letter, expect_retry};

const CREATED: &str = "urn:babel:orders:created";

fn order(attempts: u64) -> Envelope {
    Envelope::new(CREATED, json!({"order_id": 1042}))
        .with_id("f1e2d3c4-b5a6-4789-90ab-cdef01234567")
        .with_queue("orders")
        .with_attempts(attempts)
}

async fn succeeds(_: Envelope) -> Result<(), anyhow::Error> {
    Ok(())
}

#[derive(Debug)]
struct GatewayTimeout;

impl std::fmt::Display for GatewayTimeout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("payment gateway timeout")
    }
}

impl std::error::Error for GatewayTimeout {}

async fn times_out(_: Envelope) -> Result<(), GatewayTimeout> {
    Err(GatewayTimeout)
}

fn failing_router(max_attempts: u64) -> Router {
    Router::builder()
        .route(urn!("urn:babel:orders:created"), times_out)
        .max_attempts(max_attempts)
        .build()
        .expect("one route, max_attempts >= 1")
}

// --- ack --------------------------------------------------------------------

#[tokio::test]
async fn a_handler_that_succeeds_is_acked_and_sees_the_envelope() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let router = Router::builder()
        .route(urn!("urn:babel:orders:created"), {
            let seen = Arc::clone(&seen);
            move |env: Envelope| {
                let seen = Arc::clone(&seen);
                async move {
                    seen.lock().unwrap().push(env.data["order_id"].clone());
                    Ok::<(), anyhow::Error>(())
                }
            }
        })
        .build()
        .unwrap();

    let disposition = router.dispatch(&order(0).to_vec(), Delivery::new()).await;

    assert!(disposition.is_ack(), "got {disposition}");
    assert_eq!(*seen.lock().unwrap(), vec![json!(1042)]);
}

#[tokio::test]
async fn a_two_argument_handler_sees_the_attempts_and_the_transport_headers() {
    let seen = Arc::new(Mutex::new(None));
    let router = Router::builder()
        .route(urn!("urn:babel:orders:created"), {
            let seen = Arc::clone(&seen);
            move |env: Envelope, delivery: Delivery| {
                let seen = Arc::clone(&seen);
                async move {
                    *seen.lock().unwrap() = Some((
                        env.attempts,
                        delivery.attempts(),
                        delivery.header("TraceParent").map(str::to_owned),
                        delivery.queue().map(str::to_owned),
                    ));
                    Ok::<(), anyhow::Error>(())
                }
            }
        })
        .build()
        .unwrap();
    let delivery = Delivery::new()
        .with_queue("orders")
        .with_attempts(2)
        .with_header("traceparent", "00-abc-def-01");

    let disposition = router.dispatch(&order(0).to_vec(), delivery).await;

    assert!(disposition.is_ack());
    assert_eq!(
        seen.lock().unwrap().clone(),
        Some((
            2,
            2,
            Some("00-abc-def-01".to_owned()),
            Some("orders".to_owned())
        )),
        "the transport's attempts win over the body's and reach both arguments"
    );
}

#[tokio::test]
async fn the_urn_alias_routes_like_job() {
    let router = Router::builder()
        .route(urn!("urn:babel:orders:created"), succeeds)
        .build()
        .unwrap();
    let mut value = order(0).to_value();
    let job = value.as_object_mut().unwrap().remove("job").unwrap();
    value["urn"] = job;

    let disposition = router
        .dispatch(&serde_json::to_vec(&value).unwrap(), Delivery::new())
        .await;

    assert!(disposition.is_ack(), "got {disposition}");
}

// --- retry and attempts counting ---------------------------------------------

#[tokio::test]
async fn a_failure_is_retried_with_attempts_plus_one_until_the_third_is_dead_lettered() {
    let router = failing_router(3);
    let mut bytes = order(0).to_vec();

    for expected in 1..=2 {
        let retry = expect_retry(router.dispatch(&bytes, Delivery::new()).await);
        assert_eq!(retry.attempts, expected);
        assert_eq!(
            retry.envelope.attempts, expected,
            "the body to republish carries the count"
        );
        assert_eq!(retry.backoff, None, "no backoff unless configured");
        assert!(
            matches!(&retry.error, DispatchError::Handler(error) if error.to_string() == "payment gateway timeout"),
            "got {:?}",
            retry.error
        );
        let republished = Envelope::from_slice(&retry.body()).unwrap();
        assert_eq!(
            republished.message_id(),
            order(0).message_id(),
            "the id survives a retry"
        );
        assert_eq!(republished.dead_letter, None);
        bytes = retry.body();
    }

    let dead = expect_dead_letter(router.dispatch(&bytes, Delivery::new()).await);
    assert_eq!(dead.reason, DeadLetterReason::Failed);
    assert_eq!(dead.envelope.as_ref().map(|env| env.attempts), Some(3));
}

#[tokio::test]
async fn the_envelope_attempts_count_when_the_transport_gives_none() {
    let router = failing_router(5);

    let retry = expect_retry(router.dispatch(&order(3).to_vec(), Delivery::new()).await);
    assert_eq!(retry.attempts, 4);

    let retry = expect_retry(
        router
            .dispatch(&order(3).to_vec(), Delivery::new().with_attempts(1))
            .await,
    );
    assert_eq!(
        retry.attempts, 2,
        "the transport's reconciled count is used as given"
    );
}

#[tokio::test]
async fn max_attempts_is_configurable() {
    let dead = expect_dead_letter(
        failing_router(1)
            .dispatch(&order(0).to_vec(), Delivery::new())
            .await,
    );
    assert_eq!(
        dead.envelope.unwrap().attempts,
        1,
        "one attempt, then the DLQ"
    );

    let router = failing_router(5);
    assert_eq!(router.max_attempts(), 5);
    let retry = expect_retry(router.dispatch(&order(3).to_vec(), Delivery::new()).await);
    assert_eq!(retry.attempts, 4);
    let dead = expect_dead_letter(router.dispatch(&order(4).to_vec(), Delivery::new()).await);
    assert_eq!(dead.envelope.unwrap().attempts, 5);
}

#[test]
fn zero_max_attempts_is_rejected_when_built() {
    let error = Router::builder().max_attempts(0).build().unwrap_err();
    assert_eq!(error, RouterError::ZeroMaxAttempts);
}

#[tokio::test]
async fn a_retry_carries_the_configured_backoff() {
    let fixed = Router::builder()
        .route(urn!("urn:babel:orders:created"), times_out)
        .backoff(Backoff::fixed(Duration::from_millis(250)))
        .build()
        .unwrap();
    let retry = expect_retry(fixed.dispatch(&order(1).to_vec(), Delivery::new()).await);
    assert_eq!(retry.backoff, Some(Duration::from_millis(250)));

    let exponential = Router::builder()
        .route(urn!("urn:babel:orders:created"), times_out)
        .max_attempts(10)
        .backoff(Backoff::exponential(
            Duration::from_millis(100),
            Duration::from_millis(300),
        ))
        .build()
        .unwrap();
    let mut delays = Vec::new();
    for attempts in 0..4 {
        let retry = expect_retry(
            exponential
                .dispatch(&order(attempts).to_vec(), Delivery::new())
                .await,
        );
        delays.push(retry.backoff.unwrap().as_millis());
    }
    assert_eq!(delays, [100, 200, 300, 300]);
}

// --- dead letter -------------------------------------------------------------

#[tokio::test]
async fn the_dead_letter_block_round_trips_through_the_envelope_decoder() {
    let router = failing_router(3);
    let mut value = order(2).to_value();
    value["x_custom"] = json!({"kept": true});
    value["meta"]["tenant"] = json!("acme");
    let original = Envelope::from_value(value).unwrap();

    let dead = expect_dead_letter(router.dispatch(&original.to_vec(), Delivery::new()).await);
    let decoded = Envelope::from_slice(&dead.body).expect("another SDK can read the DLQ body");

    let block = decoded.dead_letter.as_ref().expect("a dead_letter block");
    assert_eq!(block.reason, DeadLetterReason::Failed);
    assert_eq!(block.error.as_deref(), Some("payment gateway timeout"));
    assert_eq!(block.exception.as_deref(), Some("GatewayTimeout"));
    assert_eq!(block.original_queue, "orders");
    assert_eq!(block.attempts, 3);
    assert_eq!(decoded.attempts, 3);
    assert_eq!(block.lang.as_deref(), Some("rust"));
    assert!(block.failed_at > 0);

    // Everything else is the original message, unknown fields included.
    assert_eq!(decoded.job, original.job);
    assert_eq!(decoded.trace_id, original.trace_id);
    assert_eq!(decoded.data, original.data);
    assert_eq!(decoded.meta, original.meta);
    assert_eq!(decoded.extra, original.extra);
    assert_eq!(Some(&decoded), dead.envelope.as_ref());

    // The wire shape of the block, field by field.
    let wire: serde_json::Value = serde_json::from_slice(&dead.body).unwrap();
    let mut keys: Vec<&str> = wire["dead_letter"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "attempts",
            "error",
            "exception",
            "failed_at",
            "lang",
            "original_queue",
            "reason"
        ]
    );
    assert_eq!(wire["dead_letter"]["reason"], "failed");
}

/// A handler's error type, dead-lettered with `max_attempts(1)`; what the
/// block's `exception` says.
async fn exception_of<H, Args>(handler: H) -> Option<String>
where
    H: babel_idem::router::Handler<Args>,
    Args: 'static,
{
    let router = Router::builder()
        .route(urn!("urn:babel:orders:created"), handler)
        .max_attempts(1)
        .build()
        .unwrap();
    let dead = expect_dead_letter(router.dispatch(&order(0).to_vec(), Delivery::new()).await);
    let decoded = Envelope::from_slice(&dead.body).unwrap();
    decoded.dead_letter.unwrap().exception
}

#[derive(Debug)]
struct PaymentDeclined<T>(T);

impl<T: std::fmt::Debug> std::fmt::Display for PaymentDeclined<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "declined: {:?}", self.0)
    }
}

impl<T: std::fmt::Debug> std::error::Error for PaymentDeclined<T> {}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[tokio::test]
async fn the_exception_is_the_error_types_short_name_never_a_path_or_box() {
    // A concrete type: its own name, no module path, no generics.
    assert_eq!(
        exception_of(|_: Envelope| async { Err::<(), _>(PaymentDeclined(42_u32)) }).await,
        Some("PaymentDeclined".to_owned())
    );
    // `std::io::Error` is named `Error` in its own module.
    assert_eq!(
        exception_of(|_: Envelope| async { Err::<(), _>(std::io::Error::other("down")) }).await,
        Some("Error".to_owned())
    );
    // Boxed: the boxed value's type where it can be known, else `Error`.
    assert_eq!(
        exception_of(|_: Envelope| async {
            Err::<(), BoxError>(std::io::Error::other("down").into())
        })
        .await,
        Some("Error".to_owned())
    );
    assert_eq!(
        exception_of(|_: Envelope| async {
            let parsed: u8 = "four".parse()?;
            Err::<(), BoxError>(format!("unexpected {parsed}").into())
        })
        .await,
        Some("ParseIntError".to_owned())
    );
    assert_eq!(
        exception_of(|_: Envelope| async {
            let declined = babel_idem::router::HandlerError::new(PaymentDeclined("card"));
            Err::<(), BoxError>(Box::new(declined))
        })
        .await,
        Some("PaymentDeclined".to_owned())
    );
    assert_eq!(
        exception_of(|_: Envelope| async { Err::<(), BoxError>(Box::new(PaymentDeclined(1_u8))) })
            .await,
        Some("Error".to_owned())
    );
    assert_eq!(
        exception_of(|_: Envelope| async { Err::<(), anyhow::Error>(anyhow::anyhow!("gone")) })
            .await,
        Some("Error".to_owned())
    );
}

#[tokio::test]
async fn original_queue_falls_back_to_the_delivery_queue() {
    let router = failing_router(1);
    let bytes = order(0).with_queue("").to_vec();

    let dead = expect_dead_letter(
        router
            .dispatch(&bytes, Delivery::new().with_queue("orders-eu"))
            .await,
    );

    let block = dead.envelope.unwrap().dead_letter.unwrap();
    assert_eq!(block.original_queue, "orders-eu");
}

// --- unknown URN ---------------------------------------------------------------

fn router_without_paid(strategy: UnknownUrnStrategy) -> Router {
    Router::builder()
        .route(urn!("urn:babel:orders:created"), succeeds)
        .on_unknown_urn(strategy)
        .build()
        .unwrap()
}

fn paid(attempts: u64) -> Vec<u8> {
    Envelope::new("urn:babel:orders:paid", json!({"order_id": 7}))
        .with_queue("orders")
        .with_attempts(attempts)
        .to_vec()
}

#[tokio::test]
async fn unknown_urn_fail_retries_then_dead_letters_with_reason_unknown_urn() {
    let router = router_without_paid(UnknownUrnStrategy::Fail);
    assert_eq!(
        Router::builder().build().unwrap().unknown_urn_strategy(),
        UnknownUrnStrategy::Fail,
        "Fail is the default, as in the Go SDK"
    );

    let retry = expect_retry(router.dispatch(&paid(0), Delivery::new()).await);
    assert_eq!(retry.attempts, 1);
    assert!(
        matches!(&retry.error, DispatchError::UnknownUrn { urn } if urn == "urn:babel:orders:paid")
    );

    let dead = expect_dead_letter(router.dispatch(&paid(2), Delivery::new()).await);
    assert_eq!(dead.reason, DeadLetterReason::UnknownUrn);
    let block = Envelope::from_slice(&dead.body)
        .unwrap()
        .dead_letter
        .unwrap();
    assert_eq!(block.reason, DeadLetterReason::UnknownUrn);
    assert_eq!(block.attempts, 3);
}

#[tokio::test]
async fn unknown_urn_dead_letter_goes_to_the_dlq_at_once() {
    let router = router_without_paid(UnknownUrnStrategy::DeadLetter);

    let dead = expect_dead_letter(router.dispatch(&paid(0), Delivery::new()).await);

    assert_eq!(dead.reason, DeadLetterReason::UnknownUrn);
    let decoded = Envelope::from_slice(&dead.body).unwrap();
    let block = decoded.dead_letter.unwrap();
    assert_eq!(block.reason, DeadLetterReason::UnknownUrn);
    assert_eq!(block.original_queue, "orders");
    assert_eq!(
        block.error.as_deref(),
        Some("no handler is registered for urn:babel:orders:paid")
    );
    assert_eq!(decoded.attempts, 0, "no attempt was made");
}

#[tokio::test]
async fn unknown_urn_delete_and_release_say_so() {
    let deleted = router_without_paid(UnknownUrnStrategy::Delete)
        .dispatch(&paid(0), Delivery::new())
        .await;
    assert!(
        matches!(&deleted, Disposition::Delete { urn } if urn == "urn:babel:orders:paid"),
        "got {deleted}"
    );

    let released = router_without_paid(UnknownUrnStrategy::Release)
        .dispatch(&paid(0), Delivery::new())
        .await;
    assert!(
        matches!(&released, Disposition::Release { urn, .. } if urn == "urn:babel:orders:paid"),
        "got {released}"
    );
}

// --- poison --------------------------------------------------------------------

#[tokio::test]
async fn poison_bytes_of_every_kind_are_dead_lettered_unchanged() {
    let runs = Arc::new(AtomicU32::new(0));
    let router = Router::builder()
        .route(urn!("urn:babel:orders:created"), {
            let runs = Arc::clone(&runs);
            move |_: Envelope| {
                runs.fetch_add(1, Ordering::SeqCst);
                async { Ok::<(), anyhow::Error>(()) }
            }
        })
        .build()
        .unwrap();

    let mut schema_v2 = order(0).to_value();
    schema_v2["meta"]["schema_version"] = json!(2);
    let mut missing_job = order(0).to_value();
    missing_job.as_object_mut().unwrap().remove("job");
    let mut blank_trace = order(0).to_value();
    blank_trace["trace_id"] = json!("   ");
    let mut data_list = order(0).to_value();
    data_list["data"] = json!([1, 2]);

    type Check = fn(&EnvelopeError) -> bool;
    let cases: Vec<(&str, Vec<u8>, Check)> = vec![
        ("empty", Vec::new(), |e| {
            matches!(e, EnvelopeError::NotJson(_))
        }),
        ("not json", b"{not json".to_vec(), |e| {
            matches!(e, EnvelopeError::NotJson(_))
        }),
        ("json array", b"[1, 2, 3]".to_vec(), |e| {
            matches!(e, EnvelopeError::NotAnObject { found: "array" })
        }),
        (
            "schema_version 2",
            serde_json::to_vec(&schema_v2).unwrap(),
            |e| matches!(e, EnvelopeError::UnsupportedSchemaVersion(2)),
        ),
        (
            "missing job",
            serde_json::to_vec(&missing_job).unwrap(),
            |e| matches!(e, EnvelopeError::MissingUrn),
        ),
        (
            "blank trace_id",
            serde_json::to_vec(&blank_trace).unwrap(),
            |e| matches!(e, EnvelopeError::BlankTraceId),
        ),
        (
            "data not an object",
            serde_json::to_vec(&data_list).unwrap(),
            |e| matches!(e, EnvelopeError::DataNotObject { .. }),
        ),
    ];

    for (name, bytes, expected_error) in cases {
        let dead = expect_dead_letter(
            router
                .dispatch(&bytes, Delivery::new().with_queue("orders"))
                .await,
        );
        assert_eq!(dead.reason, DeadLetterReason::Poison, "{name}");
        assert_eq!(dead.body, bytes, "{name}: the DLQ gets the bytes unchanged");
        assert!(dead.envelope.is_none(), "{name}");
        match &dead.error {
            DispatchError::Poison(error) => assert!(expected_error(error), "{name}: {error}"),
            other => panic!("{name}: expected a poison error, got {other}"),
        }
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0, "no handler ran for poison");
}

// --- panics --------------------------------------------------------------------

async fn panics(_: Envelope) -> Result<(), anyhow::Error> {
    panic!("boom: order 1042 has no customer")
}

#[tokio::test]
async fn a_panicking_handler_is_a_failure_not_a_crashed_consumer() {
    let router = Router::builder()
        .route(urn!("urn:babel:orders:created"), panics)
        .route(urn!("urn:babel:orders:paid"), |env: Envelope| {
            // Panics while building the future, before any `.await`.
            let amount = env
                .data
                .get("amount")
                .and_then(serde_json::Value::as_u64)
                .expect("no amount on the order");
            assert!(amount > 0);
            async { Ok::<(), anyhow::Error>(()) }
        })
        .max_attempts(2)
        .build()
        .unwrap();

    let retry = expect_retry(router.dispatch(&order(0).to_vec(), Delivery::new()).await);
    assert!(
        matches!(&retry.error, DispatchError::Panicked { message } if message == "boom: order 1042 has no customer"),
        "got {:?}",
        retry.error
    );

    let dead = expect_dead_letter(router.dispatch(&order(1).to_vec(), Delivery::new()).await);
    assert_eq!(dead.reason, DeadLetterReason::Failed);
    let block = dead.envelope.unwrap().dead_letter.unwrap();
    assert_eq!(block.exception.as_deref(), Some("panic"));

    let retry = expect_retry(router.dispatch(&paid(0), Delivery::new()).await);
    assert!(
        matches!(&retry.error, DispatchError::Panicked { message } if message == "no amount on the order"),
        "got {:?}",
        retry.error
    );

    // The router still works after the panics.
    let ok = Router::builder()
        .route(urn!("urn:babel:orders:created"), succeeds)
        .build()
        .unwrap();
    assert!(
        ok.dispatch(&order(0).to_vec(), Delivery::new())
            .await
            .is_ack()
    );
}

// --- registration --------------------------------------------------------------

#[test]
fn the_same_urn_twice_is_rejected_when_built_naming_the_urn() {
    let error = Router::builder()
        .route(urn!("urn:babel:orders:created"), succeeds)
        .route(urn!("urn:babel:orders:paid"), succeeds)
        .route(
            Urn::parse("urn:babel:orders:created".to_owned()).unwrap(),
            times_out,
        )
        .build()
        .unwrap_err();

    assert_eq!(
        error,
        RouterError::DuplicateUrn {
            urn: urn!("urn:babel:orders:created")
        }
    );
    assert!(error.to_string().contains("urn:babel:orders:created"));
}

#[tokio::test]
async fn a_routes_table_registers_every_row() {
    let router = routes! {
        "urn:babel:orders:created" => succeeds,
        "urn:babel:orders:failed" => times_out,
    }
    .build()
    .unwrap();

    let mut urns: Vec<&str> = router.urns().map(Urn::as_str).collect();
    urns.sort_unstable();
    assert_eq!(
        urns,
        ["urn:babel:orders:created", "urn:babel:orders:failed"]
    );
    assert!(
        router
            .dispatch(&order(0).to_vec(), Delivery::new())
            .await
            .is_ack()
    );
    let failed = Envelope::new("urn:babel:orders:failed", json!({})).to_vec();
    expect_retry(router.dispatch(&failed, Delivery::new()).await);
}

#[test]
fn urn_literals_and_parsed_urns_agree() {
    assert_eq!(
        urn!("urn:babel:orders:created"),
        Urn::parse(CREATED).unwrap()
    );
    assert_eq!(
        Urn::parse("babel:orders:created").unwrap_err(),
        UrnError::MissingScheme
    );
    assert_eq!(
        "urn:babel:orders created".parse::<Urn>().unwrap_err(),
        UrnError::InvalidNssChar { at: 16 }
    );
}

#[test]
fn a_router_can_be_shared_across_tasks() {
    fn assert_send_sync<T: Send + Sync>(_: &T) {}
    fn assert_send<T: Send>(_: &T) {}

    let router = Router::builder()
        .route(urn!("urn:babel:orders:created"), succeeds)
        .build()
        .unwrap();
    assert_send_sync(&router);
    let dispatching = router.dispatch(b"{}", Delivery::new());
    assert_send(&dispatching);
    drop(dispatching);
}

// --- #[idempotent] -------------------------------------------------------------

static PAYMENTS: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);
static CHARGES: AtomicU32 = AtomicU32::new(0);

/// Charges a paid order once, however often the broker delivers it.
#[idempotent(store = PAYMENTS)]
async fn on_order_paid(env: Envelope) -> Result<(), StoreError> {
    let _order = &env.data["order_id"];
    CHARGES.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

#[tokio::test]
async fn an_idempotent_handler_registers_like_a_plain_one_and_runs_once_per_id() {
    let router = Router::builder()
        .route(urn!("urn:babel:orders:paid"), on_order_paid)
        .route(urn!("urn:babel:orders:created"), succeeds)
        .build()
        .unwrap();
    let delivery = Envelope::new("urn:babel:orders:paid", json!({"order_id": 7}))
        .with_id("idempotent-router-paid-1")
        .to_vec();

    let first = router.dispatch(&delivery, Delivery::new()).await;
    let redelivery = router.dispatch(&delivery, Delivery::new()).await;

    assert!(first.is_ack(), "got {first}");
    assert!(
        redelivery.is_ack(),
        "a duplicate is acked: got {redelivery}"
    );
    assert_eq!(
        CHARGES.load(Ordering::SeqCst),
        1,
        "the redelivery was skipped by the guard, not run again"
    );
}
