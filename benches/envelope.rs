//! What decoding an envelope costs: `Envelope::from_slice` on the envelopes
//! the BabelQueue SDKs write, against parsing the same bytes into a
//! `serde_json::Value` (the parse alone, no rule checked, nothing kept for
//! re-encoding), in the same run.
//!
//! Run: `cargo bench --bench envelope` (add
//! `-- --warm-up-time 1 --measurement-time 3` for a shorter run).

use std::hint::black_box;

use babel_idem::Envelope;
use criterion::Criterion;
use serde_json::{Value, json};

/// An envelope as the Python SDK writes it, and one made by this crate with
/// the payload the consumer benchmarks carry.
fn envelopes() -> [(&'static str, Vec<u8>); 2] {
    let python = br#"{"job": "urn:babel:orders:created", "trace_id": "7b3f9c2a-e41d-4f88-9b2a-1c0d5e6f7a8b", "data": {"order_id": 1042, "amount": "12.50", "currency": "EUR"}, "meta": {"id": "f1e2d3c4-b5a6-4789-90ab-cdef01234567", "queue": "orders", "lang": "python", "schema_version": 1, "created_at": 1749132727000}, "attempts": 0}"#;
    let ours = Envelope::new("urn:babel:interop:created", json!({"n": 1042}))
        .with_queue("orders")
        .to_vec();
    [("python", python.to_vec()), ("babel-idem", ours)]
}

fn main() {
    let mut criterion = Criterion::default().configure_from_args();
    for (producer, bytes) in envelopes() {
        let mut group = criterion.benchmark_group(format!("decode/{producer}"));
        group.bench_function("Envelope::from_slice", |b| {
            b.iter(|| Envelope::from_slice(black_box(&bytes)).unwrap())
        });
        group.bench_function("serde_json::Value (baseline)", |b| {
            b.iter(|| serde_json::from_slice::<Value>(black_box(&bytes)).unwrap())
        });
        group.finish();
    }
    criterion.final_summary();
}
