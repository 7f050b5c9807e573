//! The guard through the `metrics` facade (feature `metrics`), read back from
//! metrics-util's `DebuggingRecorder` installed for the test's thread only:
//! decisions counted by decision and mode, store latency per operation and
//! backend, store errors counted (an in-memory store, a store whose calls
//! fail, and real Redis: a live server and a closed port).
#![cfg(feature = "metrics")]

mod store_contract;
mod support;

use std::future::Future;
use std::time::Duration;

use babel_idem::store::{ClaimToken, StoreOperation};
use babel_idem::telemetry::metrics::{DECISIONS_TOTAL, STORE_DURATION_SECONDS, STORE_ERRORS_TOTAL};
use babel_idem::{ClaimStore, Envelope, Guard, InMemoryStore, StoreError, run_once};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use metrics_util::{CompositeKey, MetricKind};
use serde_json::json;
use support::{FailingStore, Failure};

fn order(id: &str) -> Envelope {
    Envelope::new("urn:babel:orders:created", json!({})).with_id(id)
}

async fn ok() -> Result<(), StoreError> {
    Ok(())
}

async fn declined() -> Result<(), StoreError> {
    Err(StoreError::new(StoreOperation::Seen, "handler", "declined"))
}

/// What the recorder holds after `deliveries` ran on this thread's runtime.
fn record<F: Future<Output = ()>>(deliveries: impl FnOnce() -> F) -> Recorded {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    metrics::with_local_recorder(&recorder, || runtime.block_on(deliveries()));
    Recorded(
        snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .map(|(key, _, _, value)| (key, value))
            .collect(),
    )
}

struct Recorded(Vec<(CompositeKey, DebugValue)>);

impl Recorded {
    fn find(&self, kind: MetricKind, name: &str, labels: &[(&str, &str)]) -> Option<&DebugValue> {
        let mut wanted: Vec<(&str, &str)> = labels.to_vec();
        wanted.sort();
        self.0.iter().find_map(|(key, value)| {
            let mut have: Vec<(&str, &str)> =
                key.key().labels().map(|l| (l.key(), l.value())).collect();
            have.sort();
            (key.kind() == kind && key.key().name() == name && have == wanted).then_some(value)
        })
    }

    /// A counter's value; 0 when it was never incremented.
    fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        match self.find(MetricKind::Counter, name, labels) {
            Some(DebugValue::Counter(value)) => *value,
            None => 0,
            Some(other) => panic!("{name}: not a counter: {other:?}"),
        }
    }

    /// A histogram's samples; empty when none was recorded.
    fn samples(&self, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
        match self.find(MetricKind::Histogram, name, labels) {
            Some(DebugValue::Histogram(values)) => values.iter().map(|v| v.into_inner()).collect(),
            None => Vec::new(),
            Some(other) => panic!("{name}: not a histogram: {other:?}"),
        }
    }

    fn decisions(&self, decision: &str, mode: &str) -> u64 {
        self.counter(DECISIONS_TOTAL, &[("decision", decision), ("mode", mode)])
    }

    /// How many calls of `operation` on `backend` were timed; each sample
    /// is a real duration.
    fn store_calls(&self, operation: &str, backend: &str) -> usize {
        let samples = self.samples(
            STORE_DURATION_SECONDS,
            &[("operation", operation), ("backend", backend)],
        );
        assert!(
            samples.iter().all(|s| s.is_finite() && *s >= 0.0),
            "{samples:?}"
        );
        samples.len()
    }

    fn store_errors(&self, operation: &str, backend: &str) -> u64 {
        self.counter(
            STORE_ERRORS_TOTAL,
            &[("operation", operation), ("backend", backend)],
        )
    }

    /// Every counter named `name`, summed.
    fn total(&self, name: &str) -> u64 {
        self.0
            .iter()
            .filter(|(key, _)| key.kind() == MetricKind::Counter && key.key().name() == name)
            .map(|(_, value)| match value {
                DebugValue::Counter(value) => *value,
                other => panic!("{name}: not a counter: {other:?}"),
            })
            .sum()
    }
}

#[test]
fn seen_set_decisions_store_latency_and_store_errors_are_recorded() {
    let recorded = record(|| async {
        let store = InMemoryStore::new();
        run_once(&store, &order("id-a"), ok()).await.unwrap();
        run_once(&store, &order("id-a"), ok()).await.unwrap();
        run_once(&store, &order("id-b"), declined())
            .await
            .unwrap_err();
        run_once(&store, &order("").without_id(), ok())
            .await
            .unwrap();
        let broken_seen = FailingStore::new(Failure::Seen);
        run_once(&broken_seen, &order("id-c"), ok())
            .await
            .unwrap_err();
        let broken_remember = FailingStore::new(Failure::Remember);
        run_once(&broken_remember, &order("id-d"), ok())
            .await
            .unwrap();
    });

    for decision in [
        "ran",
        "skipped",
        "failed",
        "fail_open",
        "store_failed",
        "mark_failed",
    ] {
        assert_eq!(recorded.decisions(decision, "seen_set"), 1, "{decision}");
    }
    assert_eq!(
        recorded.total(DECISIONS_TOTAL),
        6,
        "one decision per delivery"
    );

    // seen: id-a twice, id-b; remember: id-a once (a failed handler is not marked).
    assert_eq!(recorded.store_calls("seen", "memory"), 3);
    assert_eq!(recorded.store_calls("remember", "memory"), 1);
    assert_eq!(recorded.store_errors("seen", "memory"), 0);
    // A store type of the user's own is labelled with its type's name.
    assert_eq!(recorded.store_calls("seen", "FailingStore"), 2);
    assert_eq!(recorded.store_calls("remember", "FailingStore"), 1);
    assert_eq!(recorded.store_errors("seen", "FailingStore"), 1);
    assert_eq!(recorded.store_errors("remember", "FailingStore"), 1);
    assert_eq!(recorded.total(STORE_ERRORS_TOTAL), 2);
}

#[test]
fn a_batch_times_one_seen_many_and_one_remember_many() {
    let recorded = record(|| async {
        let store = InMemoryStore::new();
        let guard = Guard::new(&store);
        guard.run_batch(&[order("id-a")], |_| ok()).await;
        let batch = [order("id-a"), order("id-b"), order("id-c")];
        guard.run_batch(&batch, |_| ok()).await;
        let broken = Guard::new(FailingStore::new(Failure::Seen));
        broken.run_batch(&[order("id-d")], |_| ok()).await;
    });

    // Two batches on the in-memory store: one seen_many and one remember_many each.
    assert_eq!(recorded.store_calls("seen_many", "memory"), 2);
    assert_eq!(recorded.store_calls("remember_many", "memory"), 2);
    assert_eq!(recorded.store_calls("seen", "memory"), 0);
    assert_eq!(recorded.decisions("skipped", "seen_set"), 1);
    assert_eq!(recorded.decisions("ran", "seen_set"), 3);
    // A failed seen_many is counted as such; the guard then asks id by id.
    assert_eq!(recorded.store_errors("seen_many", "FailingStore"), 1);
    assert_eq!(recorded.decisions("store_failed", "seen_set"), 1);
}

#[test]
fn claim_mode_decisions_carry_their_mode_and_every_claim_operation_is_timed() {
    let recorded = record(|| async {
        let store = InMemoryStore::new();
        let guard = Guard::new(&store).lease(Duration::from_secs(10)).unwrap();
        guard.run(&order("id-a"), ok()).await.unwrap();
        guard.run(&order("id-a"), ok()).await.unwrap();
        guard.run(&order("id-b"), declined()).await.unwrap_err();
        // Another owner holds id-c: parked.
        store
            .claim("id-c", ClaimToken::random(), Duration::from_secs(10))
            .await
            .unwrap();
        let parked = guard.run(&order("id-c"), ok()).await.unwrap_err();
        assert!(parked.is_parked(), "{parked}");
    });

    for decision in ["ran", "skipped", "failed", "parked"] {
        assert_eq!(recorded.decisions(decision, "claim"), 1, "{decision}");
        assert_eq!(recorded.decisions(decision, "seen_set"), 0, "{decision}");
    }
    assert_eq!(recorded.total(DECISIONS_TOTAL), 4);
    // The test's own claim of id-c went to the store directly: not timed.
    assert_eq!(recorded.store_calls("claim", "memory"), 4);
    assert_eq!(recorded.store_calls("commit", "memory"), 1);
    assert_eq!(recorded.store_calls("release", "memory"), 1);
    assert_eq!(recorded.total(STORE_ERRORS_TOTAL), 0);
}

#[cfg(feature = "redis")]
#[test]
fn real_redis_calls_are_timed_and_an_unreachable_server_is_counted() {
    use babel_idem::store::RedisStore;
    use store_contract::{Backend, RedisBackend};

    let Some(backend) = RedisBackend::create("real_redis_calls_are_timed") else {
        return;
    };
    let recorded = record(|| async {
        let store = backend.open("metrics", None).await;
        run_once(&store, &order("id-a"), ok()).await.unwrap();
        run_once(&store, &order("id-a"), ok()).await.unwrap();
        // Nothing listens on port 1: `seen` fails, the handler does not run.
        let down = RedisStore::builder()
            .timeout(Duration::from_millis(500))
            .reconnect_attempts(0)
            .connect_lazy("redis://127.0.0.1:1/")
            .unwrap();
        let error = run_once(&down, &order("id-b"), ok()).await.unwrap_err();
        assert_eq!(error.backend(), "redis", "{error}");
    });

    assert_eq!(recorded.decisions("ran", "seen_set"), 1);
    assert_eq!(recorded.decisions("skipped", "seen_set"), 1);
    assert_eq!(recorded.decisions("store_failed", "seen_set"), 1);
    assert_eq!(recorded.store_calls("seen", "redis"), 3);
    assert_eq!(recorded.store_calls("remember", "redis"), 1);
    assert_eq!(recorded.store_errors("seen", "redis"), 1);
    assert_eq!(recorded.store_errors("remember", "redis"), 0);
}

#[test]
fn describe_registers_each_metric_with_its_unit() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        babel_idem::telemetry::metrics::describe();
        // A description is reported beside a metric that was recorded.
        metrics::counter!(DECISIONS_TOTAL).increment(0);
        metrics::histogram!(STORE_DURATION_SECONDS).record(0.0);
        metrics::counter!(STORE_ERRORS_TOTAL).increment(0);
    });
    let units: Vec<(String, Option<metrics::Unit>, bool)> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, unit, description, _)| {
            (key.key().name().to_owned(), unit, description.is_some())
        })
        .collect();
    assert!(units.contains(&(DECISIONS_TOTAL.to_owned(), Some(metrics::Unit::Count), true)));
    assert!(units.contains(&(
        STORE_DURATION_SECONDS.to_owned(),
        Some(metrics::Unit::Seconds),
        true
    )));
    assert!(units.contains(&(
        STORE_ERRORS_TOTAL.to_owned(),
        Some(metrics::Unit::Count),
        true
    )));
}
