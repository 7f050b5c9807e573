//! Typed messages end to end: two message types, their payload schemas in a
//! registry folder (`examples/schemas`, exported from the types), a typed
//! handler deduplicated by `#[idempotent]`, an envelope checked against the
//! registry before it is published, and a typed publish.
//!
//! ```text
//! cargo run --example typed --features schemars,redis-transport
//! BABEL_IDEM_REDIS_URL=redis://127.0.0.1:6379 cargo run --example typed --features schemars,redis-transport
//! cargo run --example typed --features schemars,redis-transport -- --export examples/schemas
//! ```
//!
//! With `BABEL_IDEM_REDIS_URL` set (a Redis server) the example publishes to
//! a queue of its own there and drains it with a `Consumer`; without it, the
//! same bytes go through `Router::dispatch` in this process. Either way it
//! publishes an order twice (a redelivery: the same `meta.id`, which
//! `#[idempotent]` skips) and a shipment, prints what happened, and ends
//! with one JSON line of counts; it exits 0 when the order was charged once
//! and the shipment handled once. `--export DIR` writes the registry
//! folder from the types instead (how `examples/schemas` is made).

use std::path::{Path, PathBuf};
use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use babel_idem::broker::Publisher;
use babel_idem::schema::{Registry, SchemaError, SchemaProvider, Schemas};
use babel_idem::transport::RedisTransport;
use babel_idem::{
    Consumer, Delivery, Envelope, InMemoryStore, Message, Router, StoreError, idempotent, routes,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// An order placed: charged once per message.
#[derive(Debug, Serialize, Deserialize, JsonSchema, Message)]
#[message(urn = "urn:babel:orders:placed")]
struct OrderPlaced {
    order_id: u64,
    lines: Vec<Line>,
    currency: Currency,
}

/// One line of an order: its schema refuses an empty SKU, a quantity below
/// 1 and any member it does not name.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Line {
    #[schemars(length(min = 1))]
    sku: String,
    #[schemars(range(min = 1))]
    qty: u32,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "UPPERCASE")]
enum Currency {
    Eur,
    Usd,
}

/// An order handed to a carrier.
#[derive(Debug, Serialize, Deserialize, JsonSchema, Message)]
#[message(urn = "urn:babel:orders:shipped")]
struct OrderShipped {
    order_id: u64,
    carrier: String,
}

/// The seen-set of the charging handler. Process-local here; a fleet would
/// share one (the `redis` or `postgres` feature's store).
static CHARGES: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);
static CHARGED: AtomicU64 = AtomicU64::new(0);
static SHIPPED: AtomicU64 = AtomicU64::new(0);

/// Charges an order. The handler takes the decoded `OrderPlaced`; the
/// `Delivery` beside it carries the envelope's `meta`, whose `id` is what
/// `#[idempotent]` dedupes on, so a redelivery does not charge twice.
#[idempotent(store = CHARGES)]
async fn charge(order: OrderPlaced, delivery: Delivery) -> Result<(), StoreError> {
    let units: u32 = order.lines.iter().map(|line| line.qty).sum();
    let id = delivery.meta().and_then(|meta| meta.id.as_deref());
    println!(
        "    charged order {} ({units} units in {:?}), message {}",
        order.order_id,
        order.currency,
        id.unwrap_or("?")
    );
    CHARGED.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

/// Notes a shipment; running it twice would be harmless, so no dedupe.
async fn ship(shipment: OrderShipped) -> Result<(), std::io::Error> {
    println!(
        "    order {} ships with {}",
        shipment.order_id, shipment.carrier
    );
    SHIPPED.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

/// The schemas of both message types, exported from their `JsonSchema`.
fn exported() -> Result<Schemas, SchemaError> {
    Schemas::new()
        .with_message::<OrderPlaced>()?
        .with_message::<OrderShipped>()
}

/// `examples/schemas`, the registry folder checked in beside this file.
fn schemas_folder() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/schemas")
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [] => {}
        [flag, folder] if flag == "--export" => {
            let manifest = exported()?.write_registry(folder)?;
            println!("wrote {}", manifest.display());
            return Ok(());
        }
        _ => {
            eprintln!("usage: typed [--export DIR]");
            std::process::exit(2);
        }
    }

    let registry = Registry::open(schemas_folder().join("registry.json"))?;
    for urn in [OrderPlaced::URN, OrderShipped::URN] {
        if registry.schema_for(urn.as_str()).is_none() {
            return Err(format!(
                "examples/schemas has no schema for {urn}: write it with --export"
            )
            .into());
        }
    }
    println!(
        "schemas of {} and {} read from examples/schemas/registry.json",
        OrderPlaced::URN,
        OrderShipped::URN
    );

    let router = routes! {
        OrderPlaced => charge,
        OrderShipped => ship,
    }
    .build()?;

    let queue = format!("typed-example-{}", uuid::Uuid::new_v4().simple());
    let placed = OrderPlaced {
        order_id: 1042,
        lines: vec![
            Line {
                sku: "A-1".into(),
                qty: 2,
            },
            Line {
                sku: "B-7".into(),
                qty: 1,
            },
        ],
        currency: Currency::Eur,
    };
    // The order's envelope, checked against the registry before it leaves.
    let order = Envelope::from_message(&placed)?.with_queue(&queue);
    order.check_schema(&registry)?;

    // A line of quantity 0 decodes as an `OrderPlaced`, but the registry's
    // schema refuses it: it is never published.
    let zero = OrderPlaced {
        order_id: 1043,
        lines: vec![Line {
            sku: "A-1".into(),
            qty: 0,
        }],
        currency: Currency::Usd,
    };
    let refused = match Envelope::from_message(&zero)?.check_schema(&registry) {
        Err(invalid) => invalid,
        Ok(()) => return Err("the registry took a line of quantity 0".into()),
    };
    println!("refused before publishing: {refused}");

    let shipment = OrderShipped {
        order_id: 1042,
        carrier: "PostNL".into(),
    };
    let (broker, delivered) = match std::env::var("BABEL_IDEM_REDIS_URL") {
        Ok(url) if !url.trim().is_empty() => {
            println!("BABEL_IDEM_REDIS_URL is set: publishing to {queue} on Redis");
            (
                "redis",
                on_redis(&url, router, &queue, &order, &shipment).await?,
            )
        }
        _ => {
            println!("BABEL_IDEM_REDIS_URL is not set: dispatching in this process");
            (
                "none",
                in_process(&router, &queue, &order, &shipment).await?,
            )
        }
    };

    let (charged, shipped) = (
        CHARGED.load(Ordering::SeqCst),
        SHIPPED.load(Ordering::SeqCst),
    );
    println!(
        "charged {charged} order for two deliveries of it (the redelivery was skipped), \
         shipped {shipped}"
    );
    println!(
        "{}",
        json!({
            "broker": broker,
            "delivered": delivered,
            "charged": charged,
            "shipped": shipped,
            "refused": refused.to_string(),
        })
    );
    if (charged, shipped) != (1, 1) {
        return Err(
            format!("expected one charge and one shipment, got {charged} and {shipped}").into(),
        );
    }
    Ok(())
}

/// Publishes the order twice and the shipment once to `queue` on the Redis
/// at `url`, then drains the queue with a `Consumer` of `router`; how many
/// deliveries it reserved.
async fn on_redis(
    url: &str,
    router: Router,
    queue: &str,
    order: &Envelope,
    shipment: &OrderShipped,
) -> Result<u64, Box<dyn std::error::Error>> {
    let transport = RedisTransport::connect(url).await?;
    // The order, and a redelivery of it: the same bytes, the same meta.id.
    transport.publish_envelope(order).await?;
    transport.publish_envelope(order).await?;
    // A typed publish: a new envelope of `OrderShipped` on `queue`.
    transport.publish_message(queue, shipment).await?;

    let consumer = Consumer::builder(router, transport, queue).build()?;
    let progress = consumer.progress();
    let report = consumer
        .run_until(progress.idle_for(Duration::from_secs(1)))
        .await;
    println!(
        "    the consumer reserved {} and acked {}",
        report.delivered, report.acked
    );
    Ok(report.delivered)
}

/// The same deliveries through `Router::dispatch`, as a broker loop would
/// hand them over; how many were dispatched.
async fn in_process(
    router: &Router,
    queue: &str,
    order: &Envelope,
    shipment: &OrderShipped,
) -> Result<u64, Box<dyn std::error::Error>> {
    let order = order.encode_for_publish()?;
    let shipment = Envelope::from_message(shipment)?
        .with_queue(queue)
        .encode_for_publish()?;
    let mut delivered = 0;
    for bytes in [&order, &order, &shipment] {
        let disposition = router.dispatch(bytes, Delivery::new()).await;
        println!("    dispatched: {disposition}");
        delivered += 1;
    }
    Ok(delivered)
}
