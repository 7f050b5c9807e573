// Typed handlers register: async fns and closures, with and without the
// Delivery, through `.handle` (the URN from the type), `.route` under the
// type's own URN, an #[idempotent] typed handler deduped on its Delivery,
// and `routes!` tables that mix type rows with literal rows.
use std::sync::LazyLock;

use babel_idem::{
    Delivery, Envelope, InMemoryStore, Message, Router, StoreError, idempotent, routes, urn,
};
use serde::{Deserialize, Serialize};

static STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);

#[derive(Serialize, Deserialize, Message)]
#[message(urn = "urn:babel:orders:created")]
struct OrderCreated {
    order_id: u64,
}

#[derive(Serialize, Deserialize, Message)]
#[message(urn = "urn:babel:orders:paid")]
struct OrderPaid {
    order_id: u64,
}

mod shipping {
    use babel_idem::Message;
    use serde::{Deserialize, Serialize};

    #[derive(Serialize, Deserialize, Message)]
    #[message(urn = "urn:babel:orders:shipped")]
    pub struct OrderShipped {
        pub carrier: String,
    }
}

async fn on_created(order: OrderCreated) -> Result<(), anyhow::Error> {
    println!("{}", order.order_id);
    Ok(())
}

async fn on_paid(order: OrderPaid, delivery: Delivery) -> Result<(), std::io::Error> {
    println!("{} {:?} {:?}", order.order_id, delivery.trace_id(), delivery.meta());
    Ok(())
}

#[idempotent(store = STORE)]
async fn charge_once(order: OrderPaid, delivery: Delivery) -> Result<(), StoreError> {
    println!("{} {}", order.order_id, delivery.is_replay());
    Ok(())
}

#[idempotent(store = STORE, message = delivery)]
async fn charge_by_reference(order: OrderCreated, delivery: Delivery) -> Result<(), StoreError> {
    println!("{} {:?}", order.order_id, delivery.urn());
    Ok(())
}

async fn on_envelope(_env: Envelope) -> Result<(), anyhow::Error> {
    Ok(())
}

fn main() {
    let _router = Router::builder()
        .handle(on_created)
        .handle(on_paid)
        .handle(|shipped: shipping::OrderShipped| async move {
            println!("{}", shipped.carrier);
            Ok::<(), anyhow::Error>(())
        })
        .route(urn!("urn:babel:a:envelope"), on_envelope)
        .build()
        .unwrap();

    let _by_route = Router::builder()
        .route(urn!("urn:babel:orders:paid"), charge_once)
        .route(
            urn!("urn:babel:orders:created"),
            |_order: OrderCreated, delivery: Delivery| async move {
                let _ = delivery.meta();
                Ok::<(), StoreError>(())
            },
        )
        .build()
        .unwrap();

    let _table = routes! {
        OrderCreated => charge_by_reference,
        OrderPaid => charge_once,
        shipping::OrderShipped => on_envelope,
        "urn:babel:orders:refunded" => on_envelope,
    }
    .build()
    .unwrap();
}
