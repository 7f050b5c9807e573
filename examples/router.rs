//! Registers two handlers by URN (one of them `#[idempotent]`), feeds
//! `Router::dispatch` raw deliveries and prints what a broker loop would do
//! with each.
//!
//! ```text
//! cargo run --example router                      # built-in deliveries + babel-idem/tests/fixtures/conformance
//! cargo run --example router -- path/to/conformance
//! ```
//!
//! The conformance folder is the first argument, else this repository's own
//! fixtures (`babel-idem/tests/fixtures/conformance`); the upstream BabelQueue suite's
//! folder can be passed the same way. When the folder has no manifest only
//! the built-in deliveries run.

use std::path::PathBuf;
use std::sync::LazyLock;

use babel_idem::{
    Delivery, Disposition, Envelope, InMemoryStore, Router, StoreError, idempotent, urn,
};
use serde_json::json;

/// The seen-set of the billing handler. Process-local here; a fleet would use
/// a shared store (see the `redis` and `postgres` features).
static BILLING: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);

/// Charges an order. Brokers deliver at least once, so a redelivery of the
/// same `meta.id` must not charge twice: `#[idempotent]` skips it.
#[idempotent(store = BILLING)]
async fn on_order_created(env: Envelope) -> Result<(), StoreError> {
    println!("    charging order {}", env.data["order_id"]);
    Ok(())
}

#[derive(Debug)]
struct MissingTitle;

impl std::fmt::Display for MissingTitle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("catalog item has no title")
    }
}

impl std::error::Error for MissingTitle {}

/// Indexes a catalog item; reads the delivery too, to log the attempt.
/// Re-indexing is harmless, so it needs no dedupe.
async fn on_item_indexed(env: Envelope, delivery: Delivery) -> Result<(), MissingTitle> {
    let title = env.data.get("title").and_then(|title| title.as_str());
    println!(
        "    indexing {:?} (attempt {})",
        title.unwrap_or("?"),
        delivery.attempts() + 1
    );
    title.map(|_| ()).ok_or(MissingTitle)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let router = Router::builder()
        .route(urn!("urn:babel:orders:created"), on_order_created)
        .route(urn!("urn:babel:catalog:item.indexed"), on_item_indexed)
        .build()?;
    println!("{router:?}");
    println!("(an ack with no \"charging\" line is a duplicate `#[idempotent]` skipped)\n");

    println!("built-in deliveries:");
    let order = Envelope::new("urn:babel:orders:created", json!({"order_id": 1042}))
        .with_queue("orders")
        .to_vec();
    deliver(&router, "an order", &order).await;
    deliver(&router, "the same order, redelivered", &order).await;
    let untitled = Envelope::new("urn:babel:catalog:item.indexed", json!({"sku": "A-1"}))
        .with_queue("catalog")
        .to_vec();
    deliver(&router, "an item without a title", &untitled).await;
    let refund = Envelope::new("urn:babel:orders:refunded", json!({"order_id": 1042})).to_vec();
    deliver(&router, "a URN nobody handles", &refund).await;
    deliver(&router, "bytes that are not JSON", b"\x00\x01 not json").await;

    let dir = conformance_dir();
    let manifest = dir.join("manifest.json");
    if !manifest.is_file() {
        println!("\nno conformance suite at {}: skipped", dir.display());
        return Ok(());
    }
    println!("\nconformance fixtures from {}:", dir.display());
    let manifest: serde_json::Value = serde_json::from_slice(&std::fs::read(manifest)?)?;
    for case in manifest["cases"].as_array().into_iter().flatten() {
        let (Some(name), Some(file)) = (case["name"].as_str(), case["file"].as_str()) else {
            continue;
        };
        let bytes = std::fs::read(dir.join(file))?;
        deliver(&router, name, &bytes).await;
    }
    Ok(())
}

/// One turn of a broker loop: dispatch, then act on the disposition. A
/// failed delivery is fed back in as the broker would redeliver it, until it
/// is acked or dead-lettered.
async fn deliver(router: &Router, label: &str, bytes: &[u8]) {
    println!("  {label}:");
    let mut bytes = bytes.to_vec();
    loop {
        let disposition = router.dispatch(&bytes, Delivery::new()).await;
        println!("    -> {disposition}");
        match disposition {
            Disposition::Ack | Disposition::Delete { .. } => println!("       ack"),
            Disposition::Release { .. } => println!("       requeue unchanged"),
            Disposition::DeadLetter(dead) => {
                println!(
                    "       publish {} bytes to the dead-letter queue, then ack",
                    dead.body.len()
                );
                // Poison has no envelope: its bytes go to the DLQ unchanged.
                if let Some(block) = dead.envelope.and_then(|env| env.dead_letter) {
                    println!("       dead_letter: {}", json!(block));
                }
            }
            Disposition::Retry(retry) => {
                println!(
                    "       republish with attempts {}, then ack",
                    retry.attempts
                );
                bytes = retry.body();
                continue;
            }
        }
        return;
    }
}

fn conformance_dir() -> PathBuf {
    std::env::args_os()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("babel-idem/tests/fixtures/conformance")
        })
}
