//! What claim mode keeps after its handlers finish: 300,000 deliveries
//! through `Guard::lease` with an hour's lease on an `InMemoryStore`, each
//! handler pending once (so the guard registers its lease renewal with the
//! process-wide timer) and then finishing at once, long before its first
//! renewal would fall due.
//!
//! Printed: the process's resident memory (`VmRSS`) and its peak
//! (`VmHWM`) from `/proc/self/status`, and the timer's queue length, before
//! and after two runs of the same deliveries on two stores:
//!
//! - `ready`: handlers that finish on their first poll (no renewal is ever
//!   registered): what the store's done marks cost;
//! - `pending once`: handlers pending once: the same plus whatever the
//!   renewal timer keeps of a finished handler.
//!
//! The queue length after `pending once` is the number of renewals the timer
//! still holds; the growth of `pending once` over `ready` is their memory.
//!
//! Run: `cargo bench --bench claim_memory` (`BABEL_IDEM_CLAIM_DELIVERIES=N`
//! for another count). Linux only for the memory figures (others print
//! `n/a`).

use std::time::{Duration, Instant};

use babel_idem::__private::queued_lease_timers;
use babel_idem::{Guard, InMemoryStore, MessageId, StoreError};

const DELIVERIES: usize = 300_000;
/// An hour: the first renewal would wait twenty minutes.
const LEASE: Duration = Duration::from_secs(3_600);

struct Delivery(String);

impl MessageId for Delivery {
    fn message_id(&self) -> Option<&str> {
        Some(&self.0)
    }
}

/// A `/proc/self/status` field in KiB, if the file has it.
fn status_kib(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with(field))?;
    line[field.len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

struct Snapshot {
    rss: Option<u64>,
    hwm: Option<u64>,
    queued: usize,
}

fn snapshot() -> Snapshot {
    Snapshot {
        rss: status_kib("VmRSS:"),
        hwm: status_kib("VmHWM:"),
        queued: queued_lease_timers(),
    }
}

fn kib(value: Option<u64>) -> String {
    value.map_or_else(|| "n/a".to_owned(), |kib| format!("{kib} KiB"))
}

fn growth(before: Option<u64>, after: Option<u64>) -> String {
    match (before, after) {
        (Some(before), Some(after)) => {
            let bytes = (after as i64 - before as i64) * 1024;
            format!("{:+.1} MiB", bytes as f64 / (1024.0 * 1024.0))
        }
        _ => "n/a".to_owned(),
    }
}

fn print(label: &str, snapshot: &Snapshot) {
    println!(
        "  {label:<7} VmRSS {:>12}  VmHWM {:>12}  timer queue {:>7}",
        kib(snapshot.rss),
        kib(snapshot.hwm),
        snapshot.queued
    );
}

fn main() {
    let deliveries = std::env::var("BABEL_IDEM_CLAIM_DELIVERIES")
        .ok()
        .and_then(|count| count.parse().ok())
        .unwrap_or(DELIVERIES);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a current-thread runtime");
    println!("claim mode, lease {LEASE:?}, {deliveries} deliveries on InMemoryStore");

    let mut stores = Vec::new();
    for (run, pending_once) in [("ready", false), ("pending once", true)] {
        let guard = Guard::new(InMemoryStore::new())
            .lease(LEASE)
            .expect("an hour is a valid lease");
        let before = snapshot();
        let started = Instant::now();
        runtime.block_on(async {
            for n in 0..deliveries {
                let delivery = Delivery(format!("{run}-{n}"));
                guard
                    .run(&delivery, async {
                        if pending_once {
                            tokio::task::yield_now().await;
                        }
                        Ok::<(), StoreError>(())
                    })
                    .await
                    .expect("the handler succeeds");
            }
        });
        let elapsed = started.elapsed();
        let after = snapshot();
        println!("{run}: {elapsed:.2?}");
        print("before", &before);
        print("after", &after);
        println!(
            "  growth  VmRSS {}, {:.1} B per delivery",
            growth(before.rss, after.rss),
            match (before.rss, after.rss) {
                (Some(b), Some(a)) => (a as f64 - b as f64) * 1024.0 / deliveries as f64,
                _ => f64::NAN,
            }
        );
        // Kept alive: the next run's growth is its own, not freed memory reused.
        stores.push(guard);
    }
}
