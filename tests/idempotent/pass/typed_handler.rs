//! A typed handler: its message id is the envelope's `meta.id`, which
//! dispatch moves into its `Delivery` parameter; without `message = ...`
//! the attribute picks that parameter, by value or by reference.

#[path = "../support.rs"]
mod support;

use std::sync::LazyLock;
use std::sync::atomic::{AtomicU32, Ordering};

use babel_idem::{Delivery, Envelope, InMemoryStore, Message, Router, idempotent};
use serde::{Deserialize, Serialize};
use support::HandlerError;

static STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);
static CHARGES: AtomicU32 = AtomicU32::new(0);

#[derive(Serialize, Deserialize, Message)]
#[message(urn = "urn:babel:orders:created")]
struct OrderCreated {
    cents: u32,
}

#[idempotent(store = STORE)]
async fn charge(order: OrderCreated, delivery: Delivery) -> Result<(), HandlerError> {
    if order.cents == 0 {
        return Err(HandlerError::Refused);
    }
    assert!(delivery.meta().is_some());
    CHARGES.fetch_add(order.cents, Ordering::SeqCst);
    Ok(())
}

#[idempotent(store = STORE, scope = "by-reference")]
async fn charge_by_reference(order: OrderCreated, delivery: &Delivery) -> Result<(), HandlerError> {
    assert!(delivery.urn().is_some());
    CHARGES.fetch_add(order.cents * 10, Ordering::SeqCst);
    Ok(())
}

fn order(id: &str, cents: u32) -> Envelope {
    Envelope::new("urn:babel:orders:created", serde_json::json!({ "cents": cents })).with_id(id)
}

pub async fn exercise() {
    let router = Router::builder().handle(charge).build().unwrap();
    let id = support::fresh_id();
    let before = CHARGES.load(Ordering::SeqCst);

    // A failure leaves the id unmarked; the redelivery that succeeds is
    // remembered, and the one after it skipped.
    assert!(!router.dispatch(&order(&id, 0).to_vec(), Delivery::new()).await.is_ack());
    for _ in 0..2 {
        assert!(router.dispatch(&order(&id, 7).to_vec(), Delivery::new()).await.is_ack());
    }
    assert_eq!(CHARGES.load(Ordering::SeqCst), before + 7, "charged once");

    // By hand, with the envelope's members moved into the delivery.
    let other = support::fresh_id();
    for _ in 0..2 {
        let (data, delivery) = Delivery::new().take_envelope(order(&other, 1));
        let order: OrderCreated = serde_json::from_value(data.into()).unwrap();
        charge_by_reference(order, &delivery).await.unwrap();
    }
    assert_eq!(CHARGES.load(Ordering::SeqCst), before + 17, "charged once more");
}

fn main() {
    support::block_on(exercise());
}
