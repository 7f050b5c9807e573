//! Outages, against servers these tests start and kill themselves (their own
//! port and data directory; the shared servers are never touched):
//!
//! 1. the store is built before its server is reachable, and every guarded
//!    delivery fails with `StoreError` without running the handler;
//! 2. the server comes up, and the same store object serves deliveries;
//! 3. the server dies mid-run: deliveries fail with `StoreError` again, the
//!    handler does not run, nothing is remembered (the message is not acked:
//!    nothing is lost);
//! 4. the server is back: the same store recovers, what was remembered before
//!    is still skipped, and the delivery that failed now runs.
#![cfg(any(feature = "redis", feature = "postgres"))]

mod store_contract;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use babel_idem::store::StoreOperation;
use babel_idem::{Store, run_once};
use store_contract::{DeliveryError, envelope};

/// How many times a delivery is retried while a restarted server comes back
/// (the retry a broker would do), and the pause between tries.
const RECOVERY_ATTEMPTS: usize = 100;
const RECOVERY_PAUSE: Duration = Duration::from_millis(100);

/// One guarded delivery of `id` whose handler counts its runs.
async fn deliver<S: Store>(store: &S, id: &str, runs: &AtomicUsize) -> Result<(), DeliveryError> {
    run_once(store, &envelope(id), async {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok(())
    })
    .await
}

/// The delivery fails with the store's error, raised by `seen`, and the
/// handler does not run.
async fn assert_outage<S: Store>(store: &S, id: &str, runs: &AtomicUsize, backend: &str) {
    let before = runs.load(Ordering::SeqCst);
    match deliver(store, id, runs).await {
        Err(DeliveryError::Store(error)) => {
            assert_eq!(error.backend(), backend, "{error}");
            assert_eq!(error.operation(), StoreOperation::Seen, "{error}");
        }
        other => panic!("{id}: expected a StoreError while the server is down, got {other:?}"),
    }
    assert_eq!(runs.load(Ordering::SeqCst), before, "{id}: the handler ran");
}

/// Delivers `id` until the store answers again, as a broker's retries
/// would; fails if it never does.
async fn deliver_after_recovery<S: Store>(store: &S, id: &str, runs: &AtomicUsize) {
    let mut last = None;
    for _ in 0..RECOVERY_ATTEMPTS {
        match deliver(store, id, runs).await {
            Ok(()) => return,
            Err(DeliveryError::Store(error)) => last = Some(error),
            Err(DeliveryError::Handler) => unreachable!("the test handler never fails"),
        }
        tokio::time::sleep(RECOVERY_PAUSE).await;
    }
    panic!("{id}: the store did not recover: {last:?}");
}

/// Steps 1 to 4 for one backend; `migrate` runs once the server is up.
async fn outage_and_recovery<S, M>(
    store: &S,
    backend: &str,
    start: impl Fn(),
    kill: impl Fn(),
    migrate: impl Fn() -> M,
) where
    S: Store,
    M: Future<Output = Result<(), babel_idem::StoreError>>,
{
    let runs = AtomicUsize::new(0);

    // 1. Built before the server exists.
    assert_outage(store, "id-A", &runs, backend).await;

    // 2. The server comes up.
    start();
    let mut migrated = migrate().await;
    for _ in 0..RECOVERY_ATTEMPTS {
        if migrated.is_ok() {
            break;
        }
        tokio::time::sleep(RECOVERY_PAUSE).await;
        migrated = migrate().await;
    }
    migrated.expect("the store reaches the server once it is up");
    deliver_after_recovery(store, "id-A", &runs).await;
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    deliver(store, "id-A", &runs).await.unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 1, "a redelivery is skipped");

    // 3. The server dies mid-run.
    kill();
    assert_outage(store, "id-B", &runs, backend).await;
    assert_outage(store, "id-A", &runs, backend).await;

    // 4. It comes back: the same store object recovers.
    start();
    deliver_after_recovery(store, "id-A", &runs).await;
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "what was remembered before the outage is still skipped"
    );
    deliver_after_recovery(store, "id-B", &runs).await;
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "the failed delivery runs now"
    );
    assert!(store.seen("id-B").await.unwrap());
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn redis_outage_surfaces_store_error_and_the_same_store_recovers() {
    use babel_idem::store::RedisStore;
    use std::cell::RefCell;
    use store_contract::spawned::OwnRedis;

    let Some(server) = OwnRedis::reserve("redis_outage") else {
        return;
    };
    // A dead server refuses at once; the timeout only bounds a call to a live
    // one, and must not cut a slow answer on a loaded machine (the steps
    // that expect one unwrap it).
    let store = RedisStore::builder()
        .timeout(Duration::from_secs(2))
        .reconnect_attempts(1)
        .connect_lazy(&server.url())
        .expect("a store builds before its server is reachable");
    let server = RefCell::new(server);
    outage_and_recovery(
        &store,
        "redis",
        || server.borrow_mut().start(),
        || server.borrow_mut().kill(),
        || async { Ok(()) },
    )
    .await;
}

#[cfg(feature = "postgres")]
#[tokio::test]
async fn postgres_outage_surfaces_store_error_and_the_same_store_recovers() {
    use std::cell::RefCell;
    use store_contract::PostgresBackend;
    use store_contract::spawned::OwnPostgres;

    let Some(server) = OwnPostgres::reserve("postgres_outage") else {
        return;
    };
    let fixture = PostgresBackend::on(server.url(), Duration::from_secs(1));
    let store = fixture.unmigrated("outage", None);
    let server = RefCell::new(server);
    outage_and_recovery(
        &store,
        "postgres",
        || server.borrow_mut().start(),
        || server.borrow_mut().kill(),
        || store.migrate(),
    )
    .await;
    // The fixture drops its table while the server still runs.
    drop(fixture);
}
