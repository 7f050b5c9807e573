//! Typed handlers behind the router: the envelope's `data` decoded into a
//! `#[derive(Message)]` type, the rest of the envelope moved into the
//! `Delivery`, `data` the type refuses failed as `InvalidPayloadError` (retried,
//! then dead-lettered with reason `failed`) without running the handler, and
//! registration by the type's URN (`.handle`, `routes!` type rows), with a
//! typed handler under another URN refused by `build`.

mod support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, LazyLock, Mutex};

use babel_idem::envelope::DeadLetterReason;
use babel_idem::router::{DispatchError, HEADER_REPLAY_BYPASS, InvalidPayloadError, RouterError};
use babel_idem::{
    Delivery, Envelope, InMemoryStore, Message, Router, StoreError, idempotent, routes, urn,
};
use serde::{Deserialize, Serialize};
use serde_json::json;
use support::{expect_dead_letter, expect_retry};

const CREATED: &str = "urn:babel:orders:created";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Message)]
#[message(urn = "urn:babel:orders:created")]
struct OrderCreated {
    order_id: u64,
    items: Vec<Item>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Item {
    sku: String,
    qty: u32,
}

#[derive(Debug, Serialize, Deserialize, Message)]
#[message(urn = "urn:babel:orders:paid")]
struct OrderPaid {
    order_id: u64,
}

fn created(data: serde_json::Value) -> Envelope {
    Envelope::new(CREATED, data)
        .with_id("f1e2d3c4-b5a6-4789-90ab-cdef01234567")
        .with_trace_id("7b3f9c2a-e41d-4f88-9b2a-1c0d5e6f7a8b")
        .with_queue("orders")
}

fn valid() -> serde_json::Value {
    json!({"order_id": 1042, "items": [{"sku": "a-1", "qty": 2}]})
}

/// A typed handler that records what it got, and how often it ran.
#[derive(Clone, Default)]
struct Recorder {
    runs: Arc<AtomicU32>,
    seen: Arc<Mutex<Vec<(OrderCreated, Delivery)>>>,
}

impl Recorder {
    fn handler(
        &self,
    ) -> impl Fn(OrderCreated, Delivery) -> std::future::Ready<Result<(), anyhow::Error>>
    + Send
    + Sync
    + 'static {
        let recorder = self.clone();
        move |order, delivery| {
            recorder.runs.fetch_add(1, Ordering::SeqCst);
            recorder.seen.lock().unwrap().push((order, delivery));
            std::future::ready(Ok(()))
        }
    }

    fn runs(&self) -> u32 {
        self.runs.load(Ordering::SeqCst)
    }
}

#[tokio::test]
async fn a_valid_message_is_decoded_handled_once_and_acked() {
    let recorder = Recorder::default();
    let router = Router::builder()
        .handle(recorder.handler())
        .build()
        .unwrap();

    let disposition = router
        .dispatch(&created(valid()).to_vec(), Delivery::new())
        .await;

    assert!(disposition.is_ack(), "got {disposition}");
    assert_eq!(recorder.runs(), 1);
    let seen = recorder.seen.lock().unwrap();
    assert_eq!(
        seen[0].0,
        OrderCreated {
            order_id: 1042,
            items: vec![Item {
                sku: "a-1".into(),
                qty: 2
            }],
        }
    );
}

#[tokio::test]
async fn the_delivery_carries_what_the_envelope_said_beside_data() {
    let recorder = Recorder::default();
    let router = Router::builder()
        .handle(recorder.handler())
        .build()
        .unwrap();
    let delivery = Delivery::new()
        .with_queue("orders-q")
        .with_attempts(1)
        .with_header(HEADER_REPLAY_BYPASS, "1");

    let disposition = router.dispatch(&created(valid()).to_vec(), delivery).await;

    assert!(disposition.is_ack(), "got {disposition}");
    let seen = recorder.seen.lock().unwrap();
    let delivery = &seen[0].1;
    assert_eq!(delivery.urn(), Some(CREATED));
    assert_eq!(
        delivery.trace_id(),
        Some("7b3f9c2a-e41d-4f88-9b2a-1c0d5e6f7a8b")
    );
    let meta = delivery
        .meta()
        .expect("dispatch moves the envelope's meta in");
    assert_eq!(
        meta.id.as_deref(),
        Some("f1e2d3c4-b5a6-4789-90ab-cdef01234567")
    );
    assert_eq!(meta.queue, "orders");
    assert_eq!(delivery.queue(), Some("orders-q"));
    assert_eq!(delivery.attempts(), 1);
    assert!(delivery.is_replay());
}

#[tokio::test]
async fn data_the_type_refuses_is_retried_then_dead_lettered_without_running_the_handler() {
    let recorder = Recorder::default();
    let router = Router::builder()
        .handle(recorder.handler())
        .build()
        .unwrap();
    // `items[0].sku` is a number: the type wants a string.
    let mut bytes = created(json!({"order_id": 1042, "items": [{"sku": 7, "qty": 2}]})).to_vec();
    let expected = "data for 'urn:babel:orders:created' does not match its URN schema: \
                    items[0].sku: invalid type: integer `7`, expected a string";

    for attempts in 1..=2 {
        let retry = expect_retry(router.dispatch(&bytes, Delivery::new()).await);
        assert_eq!(retry.attempts, attempts);
        let DispatchError::Handler(error) = &retry.error else {
            panic!("expected the handler path's error, got {:?}", retry.error);
        };
        assert_eq!(error.name(), "InvalidPayloadError");
        let invalid = error
            .error()
            .downcast_ref::<InvalidPayloadError>()
            .expect("the error is an InvalidPayloadError");
        assert_eq!(invalid.path(), "items[0].sku");
        assert_eq!(invalid.to_string(), expected);
        bytes = retry.body();
    }
    let dead = expect_dead_letter(router.dispatch(&bytes, Delivery::new()).await);

    assert_eq!(dead.reason, DeadLetterReason::Failed);
    let block = Envelope::from_slice(&dead.body)
        .unwrap()
        .dead_letter
        .expect("a dead-letter block");
    assert_eq!(block.reason, DeadLetterReason::Failed);
    assert_eq!(block.exception.as_deref(), Some("InvalidPayloadError"));
    assert_eq!(block.error.as_deref(), Some(expected));
    assert_eq!(block.attempts, 3);
    assert_eq!(recorder.runs(), 0, "the handler never ran");
}

#[tokio::test]
async fn a_one_argument_handler_refuses_data_the_same_way() {
    static RUNS: AtomicU32 = AtomicU32::new(0);
    async fn on_created(_: OrderCreated) -> Result<(), anyhow::Error> {
        RUNS.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
    let router = Router::builder()
        .handle(on_created)
        .max_attempts(1)
        .build()
        .unwrap();

    let missing = created(json!({"items": []})).to_vec();
    let dead = expect_dead_letter(router.dispatch(&missing, Delivery::new()).await);
    let block = Envelope::from_slice(&dead.body)
        .unwrap()
        .dead_letter
        .unwrap();
    assert_eq!(block.exception.as_deref(), Some("InvalidPayloadError"));
    assert_eq!(
        block.error.as_deref(),
        Some(
            "data for 'urn:babel:orders:created' does not match its URN schema: \
             <root>: missing field `order_id`"
        )
    );
    assert_eq!(RUNS.load(Ordering::SeqCst), 0);

    let ok = created(valid()).to_vec();
    assert!(router.dispatch(&ok, Delivery::new()).await.is_ack());
    assert_eq!(RUNS.load(Ordering::SeqCst), 1);
}

#[derive(Debug, thiserror::Error)]
#[error("payment declined")]
struct PaymentDeclined;

#[tokio::test]
async fn a_typed_handlers_own_error_is_named_by_its_type() {
    async fn declines(_: OrderCreated, _: Delivery) -> Result<(), PaymentDeclined> {
        Err(PaymentDeclined)
    }
    let router = Router::builder()
        .handle(declines)
        .max_attempts(1)
        .build()
        .unwrap();

    let dead = expect_dead_letter(
        router
            .dispatch(&created(valid()).to_vec(), Delivery::new())
            .await,
    );
    let block = Envelope::from_slice(&dead.body)
        .unwrap()
        .dead_letter
        .unwrap();
    assert_eq!(block.exception.as_deref(), Some("PaymentDeclined"));
    assert_eq!(block.error.as_deref(), Some("payment declined"));
}

#[tokio::test]
async fn typed_and_envelope_handlers_share_a_router_each_getting_its_own_argument() {
    let recorder = Recorder::default();
    let envelopes = Arc::new(Mutex::new(Vec::new()));
    let router = Router::builder()
        .handle(recorder.handler())
        .route(urn!("urn:babel:orders:shipped"), {
            let envelopes = Arc::clone(&envelopes);
            move |env: Envelope| {
                envelopes.lock().unwrap().push(env);
                async { Ok::<(), anyhow::Error>(()) }
            }
        })
        .build()
        .unwrap();
    let shipped = Envelope::new("urn:babel:orders:shipped", json!({"carrier": "dhl"}));

    assert!(
        router
            .dispatch(&shipped.to_vec(), Delivery::new())
            .await
            .is_ack()
    );
    assert!(
        router
            .dispatch(&created(valid()).to_vec(), Delivery::new())
            .await
            .is_ack()
    );

    // The envelope handler got the whole envelope, unchanged.
    let envelopes = envelopes.lock().unwrap();
    assert_eq!(envelopes[0].urn(), "urn:babel:orders:shipped");
    assert_eq!(envelopes[0].data["carrier"], "dhl");
    assert_eq!(envelopes[0].meta.id, shipped.meta.id);
    assert_eq!(recorder.runs(), 1);
}

#[test]
fn a_typed_handler_under_another_urn_is_refused_when_built() {
    async fn on_created(_: OrderCreated) -> Result<(), anyhow::Error> {
        Ok(())
    }
    let error = Router::builder()
        .route(urn!("urn:babel:orders:paid"), on_created)
        .build()
        .unwrap_err();

    let RouterError::UrnMismatch {
        urn,
        message_urn,
        type_name,
    } = &error
    else {
        panic!("expected UrnMismatch, got {error:?}");
    };
    assert_eq!(urn.as_str(), "urn:babel:orders:paid");
    assert_eq!(message_urn.as_str(), CREATED);
    assert!(type_name.ends_with("OrderCreated"), "{type_name}");
    assert_eq!(
        error.to_string(),
        format!(
            "the handler registered for urn:babel:orders:paid takes `{type_name}`, whose URN is \
             urn:babel:orders:created: register it with `.handle(handler)`, which reads the URN \
             from its message type"
        )
    );

    // Under its own URN, `.route` takes it as `.handle` does.
    let router = Router::builder()
        .route(urn!("urn:babel:orders:created"), on_created)
        .build()
        .unwrap();
    assert!(router.handles(CREATED));
}

#[test]
fn two_typed_handlers_of_one_type_are_one_urn_twice() {
    async fn first(_: OrderCreated) -> Result<(), anyhow::Error> {
        Ok(())
    }
    async fn second(_: OrderCreated, _: Delivery) -> Result<(), anyhow::Error> {
        Ok(())
    }
    let error = Router::builder()
        .handle(first)
        .handle(second)
        .build()
        .unwrap_err();
    assert!(
        matches!(&error, RouterError::DuplicateUrn { urn } if urn == CREATED),
        "{error:?}"
    );
}

#[tokio::test]
async fn a_routes_table_with_type_rows_dispatches_each_to_its_handler() {
    static PAID: AtomicU32 = AtomicU32::new(0);
    async fn on_paid(order: OrderPaid) -> Result<(), anyhow::Error> {
        PAID.fetch_add(u32::try_from(order.order_id)?, Ordering::SeqCst);
        Ok(())
    }
    async fn on_shipped(_: Envelope) -> Result<(), anyhow::Error> {
        Ok(())
    }
    let recorder = Recorder::default();
    let router = routes! {
        OrderCreated => recorder.handler(),
        OrderPaid => on_paid,
        "urn:babel:orders:shipped" => on_shipped,
    }
    .build()
    .unwrap();

    let paid = Envelope::new("urn:babel:orders:paid", json!({"order_id": 5}));
    assert!(
        router
            .dispatch(&paid.to_vec(), Delivery::new())
            .await
            .is_ack()
    );
    assert!(
        router
            .dispatch(&created(valid()).to_vec(), Delivery::new())
            .await
            .is_ack()
    );
    assert_eq!(PAID.load(Ordering::SeqCst), 5);
    assert_eq!(recorder.runs(), 1);
    assert!(router.handles("urn:babel:orders:shipped"));
}

#[test]
fn a_type_row_whose_handler_takes_another_type_is_refused_when_built() {
    async fn on_created(_: OrderCreated) -> Result<(), anyhow::Error> {
        Ok(())
    }
    let error = routes! {
        OrderPaid => on_created,
    }
    .build()
    .unwrap_err();
    assert!(
        matches!(&error, RouterError::UrnMismatch { urn, message_urn, .. }
            if urn == "urn:babel:orders:paid" && message_urn == CREATED),
        "{error:?}"
    );
}

static STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);
static CHARGES: AtomicU32 = AtomicU32::new(0);

// No `message = ...`: the attribute dedupes on the `Delivery` parameter.
#[idempotent(store = STORE, scope = "typed-router-test")]
async fn charge_once(order: OrderCreated, delivery: Delivery) -> Result<(), StoreError> {
    assert!(delivery.meta().is_some());
    CHARGES.fetch_add(u32::try_from(order.order_id).unwrap_or(0), Ordering::SeqCst);
    Ok(())
}

#[tokio::test]
async fn an_idempotent_typed_handler_runs_once_per_meta_id() {
    let router = Router::builder().handle(charge_once).build().unwrap();
    let first = created(json!({"order_id": 3, "items": []})).with_id("typed-idem-1");
    let other = created(json!({"order_id": 4, "items": []})).with_id("typed-idem-2");

    for bytes in [first.to_vec(), first.to_vec(), other.to_vec()] {
        let disposition = router.dispatch(&bytes, Delivery::new()).await;
        assert!(disposition.is_ack(), "got {disposition}");
    }

    // The redelivery of `typed-idem-1` was skipped.
    assert_eq!(CHARGES.load(Ordering::SeqCst), 3 + 4);
    // Remembered under the envelope's id, as an envelope handler's guard would.
    let key = babel_idem::key::DedupeKey::new(Some("typed-router-test"), &first);
    let key = key.as_str().expect("the envelope has an id");
    assert!(babel_idem::Store::seen(&*STORE, key).await.unwrap());
}
