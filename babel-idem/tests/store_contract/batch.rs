//! The batch section of the store contract: `seen_many` and `remember_many`
//! answer as the single-id operations do, for every store.

use std::sync::Arc;
use std::time::Duration;

use babel_idem::{Guard, Store};

use super::{Backend, envelope};

/// More ids than any backend binds in one statement: SQLite's 32,766
/// variables, PostgreSQL's 65,535 parameters (its batches bind one array).
pub const OVER_THE_PARAMETER_LIMIT: usize = 70_000;

/// An empty batch answers nothing and writes nothing; a repeated id inside
/// one batch is remembered once and answered at each of its places.
pub async fn batch_empty_and_repeated_ids<B: Backend>(backend: &B) {
    let store = backend.open("batch_repeated", None).await;
    assert!(store.seen_many(&[]).await.unwrap().is_empty());
    store.remember_many(&[]).await.unwrap();

    store
        .remember_many(&["id-A", "id-A", "id-B", "id-A"])
        .await
        .unwrap();
    assert_eq!(
        store
            .seen_many(&["id-A", "id-C", "id-B", "id-A"])
            .await
            .unwrap(),
        [true, false, true, true]
    );
    store.forget("id-A").await.unwrap();
    assert!(!store.seen("id-A").await.unwrap(), "one id, one entry");
}

/// Ids remembered one at a time are seen by a batch, ids remembered by a
/// batch are seen one at a time, and remembering a batch that holds seen
/// ids succeeds and keeps them.
pub async fn batch_and_single_operations_agree<B: Backend>(backend: &B) {
    let store: Arc<dyn Store> = Arc::new(backend.open("batch_agree", None).await);
    store.remember("single").await.unwrap();
    store.remember_many(&["batch", "single"]).await.unwrap();
    let ids = ["single", "batch", "never", "single\n", "batc"];
    let batch = store.seen_many(&ids).await.unwrap();
    let mut one_by_one = Vec::new();
    for id in ids {
        one_by_one.push(store.seen(id).await.unwrap());
    }
    assert_eq!(batch, one_by_one);
    assert_eq!(batch, [true, true, false, false, false]);

    // A scoped guard's keys are plain strings to the store: a batch of them
    // is the single operations' keys, byte for byte.
    let guard = Guard::new(Arc::clone(&store)).scope("billing");
    let keys: Vec<_> = ["id-A", "id-B"]
        .map(|id| guard.key(&envelope(id)))
        .into_iter()
        .collect();
    let keys: Vec<&str> = keys.iter().map(|key| key.as_str().unwrap()).collect();
    store.remember_many(&keys).await.unwrap();
    assert!(store.seen("7:billing:id-A").await.unwrap());
    assert!(store.seen("7:billing:id-B").await.unwrap());
    assert!(!store.seen("id-A").await.unwrap(), "scopes stay apart");

    // An id with NUL: stored verbatim where the backend can, refused (the
    // whole batch, with a reason) where it cannot, as one at a time.
    let nul = ["nul\0a", "plain"];
    if backend.stores_nul() {
        store.remember_many(&nul[..1]).await.unwrap();
        assert_eq!(
            store.seen_many(&["nul\0a", "nul\0b", "nul"]).await.unwrap(),
            [true, false, false]
        );
    } else {
        for result in [
            store.seen_many(&nul).await.map(drop),
            store.remember_many(&nul).await,
        ] {
            let error = result.expect_err("a batch with a NUL id is refused");
            assert!(error.to_string().contains("NUL"), "{error}");
        }
        assert!(
            !store.seen("plain").await.unwrap(),
            "nothing of it was kept"
        );
    }
}

/// With a TTL, `remember_many` keeps a live id's first expiry, its ids
/// expire, and an expired id is taken over, as `remember` does.
pub async fn batch_ttl_keeps_the_first_expiry_and_takes_over_expired_ids<B: Backend>(backend: &B) {
    // `late` must be remembered before `early` expires, and checked between
    // the two expiries: 2 s leaves margins of 0.8 s and 0.9 s for a loaded
    // machine's pauses.
    let ttl = Duration::from_secs(2);
    let store = backend.open("batch_ttl", Some(ttl)).await;
    store.remember_many(&["early"]).await.unwrap();
    tokio::time::sleep(ttl * 6 / 10).await;
    store.remember_many(&["early", "late"]).await.unwrap(); // must not push `early` back
    tokio::time::sleep(ttl * 55 / 100).await;
    assert_eq!(
        store.seen_many(&["early", "late"]).await.unwrap(),
        [false, true],
        "`early` outlived its first expiry, or `late` expired with it"
    );
    assert!(!store.seen("early").await.unwrap());
    store.remember_many(&["early"]).await.unwrap();
    assert!(
        store.seen_many(&["early"]).await.unwrap()[0],
        "an expired id is taken over by the next batch"
    );
}

/// A batch larger than any statement's parameter limit is answered whole
/// and in order.
pub async fn batch_over_the_parameter_limit<B: Backend>(backend: &B) {
    let store = backend.open("batch_large", None).await;
    let ids: Vec<String> = (0..OVER_THE_PARAMETER_LIMIT)
        .map(|n| format!("id-{n}"))
        .collect();
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    let odd: Vec<&str> = ids.iter().copied().skip(1).step_by(2).collect();
    store.remember_many(&odd).await.unwrap();
    let answers = store.seen_many(&ids).await.unwrap();
    assert_eq!(answers.len(), ids.len());
    for (n, seen) in answers.iter().enumerate() {
        assert_eq!(*seen, n % 2 == 1, "id-{n}");
    }
    let last = OVER_THE_PARAMETER_LIMIT - 1;
    assert!(store.seen(&format!("id-{last}")).await.unwrap());
}
