//! The problem and the cure, in one run.
//!
//! An in-process at-least-once broker delivers five orders with the failures
//! real brokers produce: a worker that crashes after charging but before its
//! ack, a redelivery storm, a payment gateway that times out once, and a
//! producer that forgot `meta.id`. The charge handler is guarded by
//! `#[idempotent]`, so every order with an id is charged exactly once.
//!
//! The seen-set is SQLite (the embedded default), so running the example a
//! second time charges nothing: every delivery is recognised as a replay.
//!
//! ```text
//! cargo run --example orders            # SQLite file in target/, survives restarts
//! cargo run --example orders -- --memory
//! cargo run --example orders -- --fresh # delete the SQLite file first
//! ```

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use babel_idem::{Envelope, InMemoryStore, Store, StoreError, idempotent};

use babel_idem::store::SqliteStore;
use serde_json::json;
use tokio::sync::{mpsc, oneshot};

/// The five orders, with fixed ids so a second run replays the same messages.
const ORDERS: [(&str, Option<&str>, Trouble); 5] = [
    (
        "A-100",
        Some("6f1c0a52-5d0e-4c57-9a55-0c2b7f1a0001"),
        Trouble::None,
    ),
    (
        "B-200",
        Some("6f1c0a52-5d0e-4c57-9a55-0c2b7f1a0002"),
        Trouble::CrashBeforeAck,
    ),
    (
        "C-300",
        Some("6f1c0a52-5d0e-4c57-9a55-0c2b7f1a0003"),
        Trouble::RedeliveryStorm,
    ),
    (
        "D-400",
        Some("6f1c0a52-5d0e-4c57-9a55-0c2b7f1a0004"),
        Trouble::GatewayTimesOutOnce,
    ),
    ("E-500", None, Trouble::NoMessageId),
];

#[derive(Clone, Copy, PartialEq)]
enum Trouble {
    None,
    CrashBeforeAck,
    RedeliveryStorm,
    GatewayTimesOutOnce,
    NoMessageId,
}

impl Trouble {
    fn describe(self) -> &'static str {
        match self {
            Trouble::None => "plain delivery",
            Trouble::CrashBeforeAck => "worker crashed before ack",
            Trouble::RedeliveryStorm => "redelivered 3 extra times",
            Trouble::GatewayTimesOutOnce => "gateway timed out once",
            Trouble::NoMessageId => "no meta.id: cannot dedupe",
        }
    }
}

#[derive(Debug, thiserror::Error)]
enum BillingError {
    #[error("payment gateway timed out")]
    GatewayTimeout,
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What happened to each order, for the table at the end.
#[derive(Default, Clone, Copy)]
struct Tally {
    delivered: u32,
    ran: u32,
    failed: u32,
    charged: u32,
}

struct Billing {
    store: Arc<dyn Store>,
    tallies: Mutex<BTreeMap<String, Tally>>,
}

impl Billing {
    /// Charges the order's customer. Without the attribute, every redelivery
    /// below would charge again.
    #[idempotent(store = self.store)]
    async fn charge(&self, env: Envelope) -> Result<(), BillingError> {
        let order = env.data["order"].as_str().unwrap_or("?").to_owned();
        self.tally(&order, |t| t.ran += 1);
        if env.data["gateway_times_out_once"] == true && env.attempts == 0 {
            self.tally(&order, |t| t.failed += 1);
            return Err(BillingError::GatewayTimeout);
        }
        self.tally(&order, |t| t.charged += 1);
        Ok(())
    }

    fn tally(&self, order: &str, update: impl FnOnce(&mut Tally)) {
        update(
            self.tallies
                .lock()
                .unwrap()
                .entry(order.to_owned())
                .or_default(),
        );
    }
}

/// One delivery from the broker; the worker answers on `ack` (true = ack,
/// false = nack and retry). Dropping it unanswered is a crash before ack.
struct Delivery {
    bytes: Vec<u8>,
    ack: oneshot::Sender<bool>,
}

/// At-least-once: a message stays in the queue until a worker acks it.
async fn broker(mut queue: VecDeque<Vec<u8>>, deliveries: mpsc::Sender<Delivery>) {
    while let Some(bytes) = queue.pop_front() {
        let (ack, acked) = oneshot::channel();
        if deliveries
            .send(Delivery {
                bytes: bytes.clone(),
                ack,
            })
            .await
            .is_err()
        {
            return;
        }
        match acked.await {
            Ok(true) => {}
            Ok(false) => {
                // A nack: redeliver with one more attempt on the counter.
                if let Ok(mut env) = Envelope::from_slice(&bytes) {
                    env.attempts += 1;
                    queue.push_back(env.to_vec());
                }
            }
            // No answer: the worker died holding the message; redeliver it as is.
            Err(_) => queue.push_back(bytes),
        }
    }
}

async fn worker(billing: Arc<Billing>, mut deliveries: mpsc::Receiver<Delivery>) {
    let mut crashed_once = false;
    while let Some(delivery) = deliveries.recv().await {
        let env = match Envelope::from_slice(&delivery.bytes) {
            Ok(env) => env,
            Err(error) => {
                eprintln!("poison message: {error}");
                let _ = delivery.ack.send(true);
                continue;
            }
        };
        let order = env.data["order"].as_str().unwrap_or("?").to_owned();
        billing.tally(&order, |t| t.delivered += 1);
        let outcome = billing.charge(env).await;

        if order == "B-200" && !crashed_once {
            // The charge went through, then the process died before the ack.
            crashed_once = true;
            drop(delivery);
            continue;
        }
        let _ = delivery.ack.send(outcome.is_ok());
    }
}

fn produce() -> VecDeque<Vec<u8>> {
    let mut queue = VecDeque::new();
    for (order, id, trouble) in ORDERS {
        let data = json!({
            "order": order,
            "amount_cents": 4200,
            "gateway_times_out_once": trouble == Trouble::GatewayTimesOutOnce,
        });
        let env = Envelope::new("urn:babel:orders:created", data).with_queue("orders");
        let env = match id {
            Some(id) => env.with_id(id),
            None => env.without_id(),
        };
        let copies = if trouble == Trouble::RedeliveryStorm {
            4
        } else {
            1
        };
        for _ in 0..copies {
            queue.push_back(env.to_vec());
        }
    }
    queue
}

async fn open_store(args: &[String]) -> Result<(Arc<dyn Store>, String), StoreError> {
    if args.iter().any(|arg| arg == "--memory") {
        return Ok((
            Arc::new(InMemoryStore::new()),
            "in memory (forgotten at exit)".into(),
        ));
    }
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/babel-idem-orders.sqlite3");
    if args.iter().any(|arg| arg == "--fresh") {
        let _ = std::fs::remove_file(&path);
    }
    let store = SqliteStore::open(&path).await?;
    Ok((Arc::new(store), format!("SQLite at {}", path.display())))
}

#[tokio::main]
async fn main() -> Result<(), StoreError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (store, described) = open_store(&args).await?;
    let billing = Arc::new(Billing {
        store,
        tallies: Mutex::default(),
    });

    let (deliveries, inbox) = mpsc::channel(1);
    let worker = tokio::spawn(worker(billing.clone(), inbox));
    broker(produce(), deliveries).await;
    worker.await.expect("the worker does not panic");

    println!("seen-set: {described}\n");
    println!(
        "{:<7} {:<27} {:>9} {:>4} {:>7} {:>6} {:>7}",
        "order", "what the broker did", "delivered", "ran", "skipped", "failed", "charged"
    );
    let tallies = billing.tallies.lock().unwrap();
    let mut total_charged = 0;
    for (order, _, trouble) in ORDERS {
        let t = tallies.get(order).copied().unwrap_or_default();
        total_charged += t.charged;
        println!(
            "{order:<7} {:<27} {:>9} {:>4} {:>7} {:>6} {:>7}",
            trouble.describe(),
            t.delivered,
            t.ran,
            t.delivered - t.ran,
            t.failed,
            t.charged
        );
    }
    let deliveries: u32 = tallies.values().map(|t| t.delivered).sum();
    println!("\n{deliveries} deliveries, {total_charged} charges.");
    if total_charged <= 1 {
        println!(
            "Nothing with an id was charged again: this run replayed messages the seen-set \
             already holds. Only E-500, which has no meta.id, cannot be recognised."
        );
    } else {
        println!(
            "Every order with an id was charged once. Run again: the seen-set survives, \
             and the replay charges nothing (but E-500, which has no id)."
        );
    }
    Ok(())
}
