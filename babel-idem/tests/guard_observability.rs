//! The guard's decisions are observable: one counter and one tracing event
//! per delivery. Alone in its own test binary, so the process-wide counters
//! move only by what this test does.

mod support;

use babel_idem::telemetry::metrics;
use babel_idem::{Envelope, InMemoryStore, StoreError, run_once};
use serde_json::json;
use support::{Captured, FailingStore, Failure};

fn order(id: &str) -> Envelope {
    Envelope::new("urn:babel:orders:created", json!({})).with_id(id)
}

#[tokio::test]
async fn every_decision_is_counted_and_traced() {
    let log = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_writer(log.clone())
        .with_ansi(false)
        .finish();
    let _default = tracing::subscriber::set_default(subscriber);
    let before = metrics::counts();

    let store = InMemoryStore::new();
    let ok = || async { Ok::<(), StoreError>(()) };
    run_once(&store, &order("id-ran"), ok()).await.unwrap();
    run_once(&store, &order("id-ran"), ok()).await.unwrap();
    run_once(&store, &order("id-ran"), ok()).await.unwrap();
    let declined = StoreError::new(
        babel_idem::store::StoreOperation::Seen,
        "handler",
        "declined",
    );
    assert!(
        run_once(&store, &order("id-failed"), async {
            Err::<(), _>(declined)
        })
        .await
        .is_err()
    );
    run_once(&store, &order("").without_id(), ok())
        .await
        .unwrap();
    let broken_seen = FailingStore::new(Failure::Seen);
    assert!(run_once(&broken_seen, &order("id-x"), ok()).await.is_err());
    let broken_remember = FailingStore::new(Failure::Remember);
    run_once(&broken_remember, &order("id-mark"), ok())
        .await
        .unwrap();

    let moved = metrics::counts().since(&before);
    assert_eq!(
        (
            moved.ran,
            moved.skipped,
            moved.failed,
            moved.fail_open,
            moved.store_failed,
            moved.mark_failed
        ),
        (1, 2, 1, 1, 1, 1)
    );

    let log = log.text();
    for (id, decision) in [
        ("id-ran", "ran"),
        ("id-ran", "skipped"),
        ("id-failed", "failed"),
        ("id-x", "store_failed"),
        ("id-mark", "mark_failed"),
    ] {
        let wanted = format!("message_id=\"{id}\" decision=\"{decision}\"");
        assert!(log.contains(&wanted), "no event {wanted} in:\n{log}");
    }
    assert!(log.contains("decision=\"fail_open\""));
    let mark_failed_line = log
        .lines()
        .find(|line| line.contains("mark_failed"))
        .unwrap();
    assert!(mark_failed_line.contains("WARN"), "{mark_failed_line}");
}
