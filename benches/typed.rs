//! What a typed handler costs over an envelope handler: `Router::dispatch`
//! of the same bytes to `async fn(OrderCreated)`, whose `data` dispatch
//! decodes into the type, against `async fn(Envelope)`, which reads the
//! same members out of the envelope's `data` itself; and the two shapes
//! that also take the `Delivery`. Both handlers read every member, so the
//! difference is the typed decode (and, with the `Delivery`, moving the
//! envelope's `meta` into it).
//!
//! Each round times `BENCH_DISPATCHES` dispatches (default 100,000) of each
//! path, the paths in alternating order from round to round, on one
//! current-thread Tokio runtime (no handler waits); `BENCH_ROUNDS` rounds
//! (default 15). Prints each path's median time per dispatch and the ratio
//! typed / envelope of the medians, then the per-round ratios' median,
//! lowest and highest (a round's two paths ran back to back, so its ratio
//! shares their moment's noise).
//!
//! Run: `cargo bench --bench typed`.

use std::hint::black_box;
use std::time::Instant;

use babel_idem::{Delivery, Envelope, Message, Router, urn};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

#[derive(Serialize, Deserialize, Message)]
#[message(urn = "urn:babel:orders:created")]
struct OrderCreated {
    order_id: u64,
    amount: String,
    currency: String,
    lines: Vec<Line>,
}

#[derive(Serialize, Deserialize)]
struct Line {
    sku: String,
    qty: u32,
}

/// The members both handlers read: the typed one from its value, the
/// envelope one from `data`.
fn read_typed(order: &OrderCreated) {
    black_box(order.order_id);
    black_box(order.amount.as_str());
    black_box(order.currency.as_str());
    for line in &order.lines {
        black_box((line.sku.as_str(), line.qty));
    }
}

fn read_envelope(env: &Envelope) {
    let data = &env.data;
    black_box(data.get("order_id").and_then(Value::as_u64));
    black_box(data.get("amount").and_then(Value::as_str));
    black_box(data.get("currency").and_then(Value::as_str));
    for line in data
        .get("lines")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        black_box((
            line.get("sku").and_then(Value::as_str),
            line.get("qty").and_then(Value::as_u64),
        ));
    }
}

async fn typed(order: OrderCreated) -> Result<(), std::io::Error> {
    read_typed(&order);
    Ok(())
}

async fn typed_with_delivery(
    order: OrderCreated,
    delivery: Delivery,
) -> Result<(), std::io::Error> {
    read_typed(&order);
    black_box(delivery.meta().and_then(|meta| meta.id.as_deref()));
    Ok(())
}

async fn envelope(env: Envelope) -> Result<(), std::io::Error> {
    read_envelope(&env);
    Ok(())
}

async fn envelope_with_delivery(env: Envelope, delivery: Delivery) -> Result<(), std::io::Error> {
    read_envelope(&env);
    black_box(env.meta.id.as_deref());
    black_box(delivery.attempts());
    Ok(())
}

/// The order the consumer benchmarks' payload grows into: three scalars
/// and two lines.
fn bytes() -> Vec<u8> {
    Envelope::new(
        "urn:babel:orders:created",
        json!({
            "order_id": 1042,
            "amount": "12.50",
            "currency": "EUR",
            "lines": [{"sku": "A-1", "qty": 2}, {"sku": "B-7", "qty": 1}],
        }),
    )
    .with_queue("orders")
    .encode_for_publish()
    .expect("the envelope encodes")
}

fn setting(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Err(_) => default,
        Ok(value) => match value.parse() {
            Ok(count) if count > 0 => count,
            _ => {
                eprintln!("{name}={value:?}: expected a count above 0");
                std::process::exit(2);
            }
        },
    }
}

/// Nanoseconds per dispatch of `count` dispatches of `bytes` through `router`.
fn time(runtime: &tokio::runtime::Runtime, router: &Router, bytes: &[u8], count: usize) -> f64 {
    runtime.block_on(async {
        let started = Instant::now();
        for _ in 0..count {
            let disposition = router.dispatch(black_box(bytes), Delivery::new()).await;
            assert!(disposition.is_ack(), "got {disposition}");
        }
        started.elapsed().as_nanos() as f64 / count as f64
    })
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    // `cargo bench` passes `--bench`; this bench has no other flag.
    let rounds = setting("BENCH_ROUNDS", 15);
    let count = setting("BENCH_DISPATCHES", 100_000);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a current-thread runtime");
    let bytes = bytes();
    let created = urn!("urn:babel:orders:created");
    let pairs = [
        (
            "typed, (M) / (Envelope)",
            Router::builder().handle(typed).build().unwrap(),
            Router::builder()
                .route(created.clone(), envelope)
                .build()
                .unwrap(),
        ),
        (
            "typed, (M, Delivery) / (Envelope, Delivery)",
            Router::builder()
                .handle(typed_with_delivery)
                .build()
                .unwrap(),
            Router::builder()
                .route(created, envelope_with_delivery)
                .build()
                .unwrap(),
        ),
    ];
    println!("{rounds} rounds of {count} dispatches per path, alternating");
    for (name, typed, envelope) in &pairs {
        // Warm both paths (allocator, caches) before the first round.
        time(&runtime, typed, &bytes, count / 10);
        time(&runtime, envelope, &bytes, count / 10);
        let (mut typed_ns, mut envelope_ns, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..rounds {
            let (t, e) = if round % 2 == 0 {
                let t = time(&runtime, typed, &bytes, count);
                (t, time(&runtime, envelope, &bytes, count))
            } else {
                let e = time(&runtime, envelope, &bytes, count);
                (time(&runtime, typed, &bytes, count), e)
            };
            typed_ns.push(t);
            envelope_ns.push(e);
            ratios.push(t / e);
        }
        let (t, e) = (median(&mut typed_ns), median(&mut envelope_ns));
        let per_round = median(&mut ratios);
        println!(
            "{name}: typed {t:.0} ns, envelope {e:.0} ns per dispatch (medians): \
             {:.2}x the time; per round {per_round:.2}x (median), {:.2}x to {:.2}x",
            t / e,
            ratios[0],
            ratios[ratios.len() - 1]
        );
    }
}
