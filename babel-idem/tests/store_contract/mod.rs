//! The store contract: one suite, written once, run against every store.
//!
//! Each `tests/store_<backend>.rs` calls [`store_contract_tests!`] with the
//! constructor of its fixture ([`backends`]); the macro turns every check
//! below into a `#[tokio::test]`. A fixture whose server is not configured
//! returns `None` and the test prints a `skipped:` line (or fails, with
//! `BABEL_IDEM_REQUIRE_SERVERS=1`).
#![allow(dead_code, unused_imports, unreachable_pub)]

#[macro_use]
pub mod admin;
pub mod backends;
pub mod batch;
#[macro_use]
pub mod claim;
#[cfg(feature = "postgres")]
pub mod postgres_locks;
pub mod servers;
#[cfg(any(feature = "redis", feature = "postgres"))]
pub mod spawned;

pub use backends::*;
pub use batch::*;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use babel_idem::store::MAX_TTL;
use babel_idem::store::StoreOperation;
use babel_idem::{Envelope, Guard, MessageId, Store, StoreError, run_once, wrap};
use serde_json::{Value, json};

/// Expands to one `#[tokio::test]` per contract check, each opening its own
/// fixture with `$create(test_name) -> Option<impl Backend>`.
#[allow(unused_macros)]
macro_rules! store_contract_tests {
    ($create:path) => {
        store_contract_tests!(@current_thread $create:
            conformance_sequences,
            operations_are_idempotent,
            ttl_is_optional_keeps_the_first_expiry_and_expired_ids_are_taken_over,
            forget_allows_a_rerun,
            spaces_are_isolated,
            scopes_are_isolated,
            unusual_ids_round_trip,
            batch_empty_and_repeated_ids,
            batch_and_single_operations_agree,
            batch_ttl_keeps_the_first_expiry_and_takes_over_expired_ids,
            batch_over_the_parameter_limit,
        );

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn concurrent_remembers_of_one_id() {
            if let Some(backend) = $create("concurrent_remembers_of_one_id") {
                crate::store_contract::concurrent_remembers_of_one_id(&backend).await;
            }
        }
    };
    (@current_thread $create:path: $($check:ident),+ $(,)?) => {$(
        #[tokio::test]
        async fn $check() {
            if let Some(backend) = $create(stringify!($check)) {
                crate::store_contract::$check(&backend).await;
            }
        }
    )+};
}

/// Expands to the settings checks every persistent store shares: the TTL
/// range and the Tokio runtime it needs, each checked when the store is built.
#[allow(unused_macros)]
macro_rules! store_settings_tests {
    ($create:path) => {
        #[tokio::test]
        async fn ttls_out_of_range_are_refused_when_built() {
            if let Some(backend) = $create("ttls_out_of_range_are_refused_when_built") {
                crate::store_contract::ttls_out_of_range_are_refused_when_built(&backend).await;
            }
        }

        #[tokio::test]
        async fn the_longest_ttl_allowed_is_accepted_by_the_server() {
            if let Some(backend) = $create("the_longest_ttl_allowed_is_accepted_by_the_server") {
                crate::store_contract::the_longest_ttl_allowed_is_accepted_by_the_server(&backend)
                    .await;
            }
        }

        #[test]
        fn a_runtime_without_timers_is_refused_when_built() {
            if let Some(backend) = $create("a_runtime_without_timers_is_refused_when_built") {
                crate::store_contract::a_runtime_without_timers_is_refused_when_built(&backend);
            }
        }
    };
    // A store whose client talks over Tokio sockets.
    (server $create:path) => {
        store_settings_tests!($create);

        #[test]
        fn a_runtime_without_io_is_refused_when_built() {
            if let Some(backend) = $create("a_runtime_without_io_is_refused_when_built") {
                crate::store_contract::a_runtime_without_io_is_refused_when_built(&backend);
            }
        }
    };
}

/// What a guarded test handler returns: its own failure, or the store's.
#[derive(Debug)]
pub enum DeliveryError {
    Handler,
    Store(StoreError),
}

impl From<StoreError> for DeliveryError {
    fn from(error: StoreError) -> Self {
        DeliveryError::Store(error)
    }
}

/// An envelope with `id` as its `meta.id` (no usable id when `id` is empty).
pub fn envelope(id: &str) -> Envelope {
    Envelope::new("urn:babel:orders:created", json!({"order_id": 1042})).with_id(id)
}

/// `babel-idem/tests`, whose fixtures and Python peers the suites read, from
/// whichever package's test includes this module: babel-idem's own tests,
/// or the workspace root's (which run the CLI and the examples).
pub fn library_tests_dir() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    match env!("CARGO_PKG_NAME") {
        "babel-idem" => manifest.join("tests"),
        _ => manifest.join("babel-idem/tests"),
    }
}

/// The conformance folders whose idempotency sequences every store replays:
/// this repository's own fixtures, and the upstream BabelQueue suite when
/// `BABEL_IDEM_CONFORMANCE_DIR` names its folder (a visible line says when
/// it does not).
fn conformance_dirs() -> Vec<PathBuf> {
    let mut dirs = vec![library_tests_dir().join("fixtures/conformance")];
    match std::env::var_os("BABEL_IDEM_CONFORMANCE_DIR") {
        Some(dir) => dirs.push(PathBuf::from(dir)),
        None => {
            // Straight to stderr, past the harness's capture: shown when the test passes.
            let _ = std::io::Write::write_all(
                &mut std::io::stderr(),
                b"skipping upstream conformance: BABEL_IDEM_CONFORMANCE_DIR is unset\n",
            );
        }
    }
    dirs
}

/// Every idempotency sequence of each conformance manifest, replayed through
/// `guard` over a store of this backend, one fresh seen-set per sequence.
/// Each handler invocation is an effect, a throwing one included.
pub async fn conformance_sequences<B: Backend>(backend: &B) {
    for (suite, dir) in conformance_dirs().iter().enumerate() {
        conformance_sequences_of(backend, &dir.join("manifest.json"), suite).await;
    }
}

async fn conformance_sequences_of<B: Backend>(backend: &B, path: &std::path::Path, suite: usize) {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("read the conformance manifest {}: {e}", path.display()));
    let manifest: Value = serde_json::from_str(&text).expect("the manifest is JSON");
    let cases = manifest["idempotency"]["sequences"]["cases"]
        .as_array()
        .expect("idempotency.sequences.cases is a list");
    assert!(
        !cases.is_empty(),
        "the manifest has no idempotency sequence"
    );

    for case in cases {
        let name = case["name"].as_str().expect("a sequence has a name");
        let store = backend.open(&format!("seq{suite}_{name}"), None).await;
        let effects = AtomicUsize::new(0);
        let deliveries = case["deliveries"].as_array().expect("deliveries");
        for (at, delivery) in deliveries.iter().enumerate() {
            let id = delivery["meta_id"].as_str().unwrap_or("");
            if delivery["forget_before"] == Value::Bool(true) {
                store.forget(id).await.expect("forget before the delivery");
            }
            let throws = delivery["outcome"] == "throw";
            let before = effects.load(Ordering::SeqCst);
            let result = run_once(&store, &envelope(id), async {
                effects.fetch_add(1, Ordering::SeqCst);
                if throws {
                    Err(DeliveryError::Handler)
                } else {
                    Ok(())
                }
            })
            .await;
            let ran = effects.load(Ordering::SeqCst) > before;
            let expected_run = match delivery["expect_effect"].as_str() {
                Some("run") => true,
                Some("skip") => false,
                other => panic!("{name}: unknown expect_effect {other:?}"),
            };
            assert_eq!(ran, expected_run, "{name}, delivery {at}: ran");
            match (ran && throws, result) {
                (true, Err(DeliveryError::Handler)) | (false, Ok(())) => {}
                (_, other) => panic!("{name}, delivery {at}: unexpected result {other:?}"),
            }
        }
        let expected = case["expected_effects"].as_u64().expect("expected_effects");
        assert_eq!(
            effects.load(Ordering::SeqCst) as u64,
            expected,
            "{name}: effects"
        );
    }
}

/// `seen`, `remember` and `forget` are idempotent, per id, and work through
/// `Arc<dyn Store>` as well as the concrete type.
pub async fn operations_are_idempotent<B: Backend>(backend: &B) {
    let store = backend.open("idempotent", None).await;
    assert!(!store.seen("id-A").await.unwrap());
    store.remember("id-A").await.unwrap();
    store.remember("id-A").await.unwrap();
    assert!(store.seen("id-A").await.unwrap());
    assert!(store.seen("id-A").await.unwrap(), "seen does not consume");
    assert!(!store.seen("id-B").await.unwrap(), "ids are not collapsed");
    store.forget("id-A").await.unwrap();
    store.forget("id-A").await.unwrap();
    assert!(!store.seen("id-A").await.unwrap());
    store
        .forget("never-remembered")
        .await
        .expect("forgetting an unknown id succeeds");

    let dynamic: Arc<dyn Store> = Arc::new(store);
    let runs = AtomicUsize::new(0);
    let handler = wrap(Arc::clone(&dynamic), |env: Envelope| {
        let runs = &runs;
        async move {
            assert_eq!(env.message_id(), Some("id-C"));
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<(), StoreError>(())
        }
    });
    handler.call(envelope("id-C")).await.unwrap();
    handler.call(envelope("id-C")).await.unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert!(dynamic.seen("id-C").await.unwrap());
}

/// Without a TTL an id stays; with one, a second `remember` keeps the first
/// expiry (set-if-absent), the id expires, and an expired id is taken over.
pub async fn ttl_is_optional_keeps_the_first_expiry_and_expired_ids_are_taken_over<B: Backend>(
    backend: &B,
) {
    // The second remember must land before the first expiry, and the check
    // between the two expiries: a few hundred ms of margin each way is not
    // enough on a loaded machine, so the TTL is 2 s (margins of 0.8 s, 0.9 s).
    let ttl = Duration::from_secs(2);
    let forever = backend.open("ttl_none", None).await;
    let expiring = backend.open("ttl_2s", Some(ttl)).await;

    forever.remember("id-A").await.unwrap();
    expiring.remember("id-A").await.unwrap();
    tokio::time::sleep(ttl * 6 / 10).await;
    expiring.remember("id-A").await.unwrap(); // must not push the expiry back
    tokio::time::sleep(ttl * 55 / 100).await;

    assert!(
        !expiring.seen("id-A").await.unwrap(),
        "the id outlived its first expiry: a second remember extended it"
    );
    assert!(forever.seen("id-A").await.unwrap(), "no TTL: never expires");

    expiring.remember("id-A").await.unwrap();
    assert!(
        expiring.seen("id-A").await.unwrap(),
        "an expired id is taken over by the next remember"
    );
}

/// `forget` makes the next delivery of a handled id run again.
pub async fn forget_allows_a_rerun<B: Backend>(backend: &B) {
    let store = backend.open("forget", None).await;
    let runs = AtomicUsize::new(0);
    let deliver = || {
        run_once(&store, &envelope("id-A"), async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<(), StoreError>(())
        })
    };
    deliver().await.unwrap();
    deliver().await.unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    store.forget("id-A").await.unwrap();
    deliver().await.unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 2, "a forgotten id runs again");
    deliver().await.unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 2, "and is remembered again");
}

/// Two stores on two spaces (prefixes, tables) do not see each other's ids.
pub async fn spaces_are_isolated<B: Backend>(backend: &B) {
    let billing = backend.open("space_billing", None).await;
    let shipping = backend.open("space_shipping", None).await;
    billing.remember("id-A").await.unwrap();
    assert!(billing.seen("id-A").await.unwrap());
    assert!(!shipping.seen("id-A").await.unwrap());
    shipping.forget("id-A").await.unwrap();
    assert!(
        billing.seen("id-A").await.unwrap(),
        "forget stays in its space"
    );
}

/// Two guard scopes over one store do not skip each other's messages.
pub async fn scopes_are_isolated<B: Backend>(backend: &B) {
    let store = backend.open("scopes", None).await;
    let billing = Guard::new(&store).scope("billing");
    let shipping = Guard::new(&store).scope("shipping");
    let runs = AtomicUsize::new(0);
    let handler = || async {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok::<(), StoreError>(())
    };
    let env = envelope("id-A");
    billing.run(&env, handler()).await.unwrap();
    shipping.run(&env, handler()).await.unwrap();
    billing.run(&env, handler()).await.unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert!(store.seen("7:billing:id-A").await.unwrap());
    assert!(!store.seen("id-A").await.unwrap());
}

/// 64 concurrent `remember` calls of one id all succeed and leave it seen
/// once; 64 concurrent ids are all kept.
pub async fn concurrent_remembers_of_one_id<B: Backend>(backend: &B) {
    let store = Arc::new(backend.open("concurrent", None).await);
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let store = Arc::clone(&store);
            tokio::spawn(async move { store.remember("id-A").await })
        })
        .collect();
    for task in tasks {
        task.await
            .expect("the task ran")
            .expect("remember succeeded");
    }
    assert!(store.seen("id-A").await.unwrap());
    store.forget("id-A").await.unwrap();
    assert!(!store.seen("id-A").await.unwrap(), "one id, one entry");

    let tasks: Vec<_> = (0..64)
        .map(|n| {
            let store = Arc::clone(&store);
            tokio::spawn(async move { store.remember(&format!("id-{n}")).await })
        })
        .collect();
    for task in tasks {
        task.await
            .expect("the task ran")
            .expect("remember succeeded");
    }
    for n in 0..64 {
        assert!(store.seen(&format!("id-{n}")).await.unwrap(), "id-{n}");
    }
}

/// A 10 KB id (compressible: a long composite key, as real long ids are).
pub fn long_id() -> String {
    let mut id = String::from("long:");
    while id.len() < 10 * 1024 {
        id.push_str("tenant-é☕🦀:order ");
    }
    id.push_str("end");
    id
}

/// Ids are stored verbatim, whatever they contain, and a near miss is a
/// different id. An id with NUL round-trips where the backend stores NUL;
/// elsewhere every operation on it fails with a `StoreError` saying why and
/// the guard does not run the handler.
pub async fn unusual_ids_round_trip<B: Backend>(backend: &B) {
    let store = backend.open("unusual", None).await;
    let ids = [
        long_id(),
        "заказ-注文-🦀".to_owned(),
        "order 42 created".to_owned(),
        "tenant:eu:order:42".to_owned(),
        r#"it's "quoted" \ '; DROP TABLE users; --"#.to_owned(),
        "line one\nline two\r\n".to_owned(),
        "glob*[?]{}%_".to_owned(),
    ];
    for id in &ids {
        assert!(!store.seen(id).await.unwrap(), "{id:.40}");
        store.remember(id).await.unwrap();
        assert!(store.seen(id).await.unwrap(), "{id:.40}");
        let near_miss = format!("{id}x");
        assert!(!store.seen(&near_miss).await.unwrap(), "{id:.40}");
        let shorter = &id[..id.len() - id.chars().last().unwrap().len_utf8()];
        assert!(!store.seen(shorter).await.unwrap(), "{id:.40}");
    }
    for id in &ids {
        store.forget(id).await.unwrap();
        assert!(!store.seen(id).await.unwrap(), "{id:.40}");
    }

    if backend.stores_nul() {
        store.remember("nul\0a").await.unwrap();
        assert!(store.seen("nul\0a").await.unwrap());
        assert!(!store.seen("nul\0b").await.unwrap());
        assert!(!store.seen("nul").await.unwrap());
        store.forget("nul\0a").await.unwrap();
        assert!(!store.seen("nul\0a").await.unwrap());
    } else {
        for result in [
            store.seen("nul\0a").await.map(drop),
            store.remember("nul\0a").await,
            store.forget("nul\0a").await,
        ] {
            let error = result.expect_err("an id with NUL is refused");
            assert!(error.to_string().contains("NUL"), "{error}");
        }
        let runs = AtomicUsize::new(0);
        let result = run_once(&store, &envelope("nul\0a"), async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<(), DeliveryError>(())
        })
        .await;
        assert!(matches!(result, Err(DeliveryError::Store(_))), "{result:?}");
        assert_eq!(runs.load(Ordering::SeqCst), 0, "the handler did not run");
    }
}

/// Asserts that building a store with `setting` failed as an `open` error
/// whose text contains every one of `rule` (the rule it broke).
#[track_caller]
pub fn assert_refused_when_built<S>(
    result: Result<S, StoreError>,
    setting: impl std::fmt::Debug,
    rule: &[&str],
) {
    let Err(error) = result else {
        panic!("{setting:?} was accepted");
    };
    assert_eq!(
        error.operation(),
        StoreOperation::Open,
        "{setting:?}: {error}"
    );
    let text = error.to_string();
    for part in rule {
        assert!(text.contains(part), "{setting:?}: {text:?} lacks {part:?}");
    }
}

/// Zero, under a millisecond, or longer than [`MAX_TTL`] (up to what the
/// servers reject on every call: PostgreSQL's interval range, Redis's `PX`
/// limit) is refused when the store is built, with the allowed range.
pub async fn ttls_out_of_range_are_refused_when_built<B: Backend>(backend: &B) {
    for ttl in [
        Duration::ZERO,
        Duration::from_nanos(1),
        Duration::from_micros(999),
        MAX_TTL + Duration::from_millis(1),
        Duration::from_millis(10_000_000_000_000_000), // PostgreSQL: interval out of range
        Duration::from_millis(i64::MAX as u64),        // Redis: invalid expire time
        Duration::MAX,
    ] {
        let built = backend.build("ttl_refused", Some(ttl)).await;
        assert_refused_when_built(built, ttl, &["at least 1 ms", "at most 36500 days"]);
    }
}

/// The range's ends are real: a store with a 1 ms TTL and one with
/// [`MAX_TTL`] both remember, and the long one's id is seen.
pub async fn the_longest_ttl_allowed_is_accepted_by_the_server<B: Backend>(backend: &B) {
    let longest = backend.build("ttl_longest", Some(MAX_TTL)).await.unwrap();
    longest
        .remember("id-A")
        .await
        .expect("the server takes MAX_TTL");
    assert!(longest.seen("id-A").await.unwrap());
    let shortest = backend
        .build("ttl_shortest", Some(Duration::from_millis(1)))
        .await
        .unwrap();
    shortest
        .remember("id-A")
        .await
        .expect("the server takes 1 ms");
}

/// A Tokio runtime without its time driver (`enable_time` not called):
/// building the store fails with an error that says so, rather than the
/// first `seen` panicking inside the client.
pub fn a_runtime_without_timers_is_refused_when_built<B: Backend>(backend: &B) {
    let mut runtime = tokio::runtime::Builder::new_current_thread();
    runtime.enable_io();
    assert_refused_on(runtime, backend, "enable_time");
}

/// A Tokio runtime with timers but without its I/O driver (`enable_io` not
/// called): a server store's build fails with an error that says so, rather
/// than the first `seen` panicking inside the client.
pub fn a_runtime_without_io_is_refused_when_built<B: Backend>(backend: &B) {
    let mut runtime = tokio::runtime::Builder::new_current_thread();
    runtime.enable_time();
    assert_refused_on(runtime, backend, "enable_io");
}

/// Builds a store on the runtime `builder` makes, and asserts that it was
/// refused with an error naming `missing`, the builder call it lacks.
fn assert_refused_on<B: Backend>(mut builder: tokio::runtime::Builder, backend: &B, missing: &str) {
    let runtime = builder.build().expect("a runtime");
    let built = runtime.block_on(backend.build("unfit_runtime", None));
    assert_refused_when_built(built, format!("a runtime without {missing}"), &[missing]);
}

/// A fleet starting at once: `calls` concurrent runs of `migrate` (each
/// given one of `stores`, in turn), each of which must succeed.
pub async fn migrate_concurrently<S, F, Fut>(stores: &[Arc<S>], calls: usize, migrate: F)
where
    S: Send + Sync + 'static,
    F: Fn(Arc<S>) -> Fut,
    Fut: std::future::Future<Output = Result<(), StoreError>> + Send + 'static,
{
    let runs: Vec<_> = (0..calls)
        .map(|n| tokio::spawn(migrate(Arc::clone(&stores[n % stores.len()]))))
        .collect();
    for (n, run) in runs.into_iter().enumerate() {
        run.await
            .expect("the migration task ran")
            .unwrap_or_else(|e| panic!("migration {n} of {calls}: {e}"));
    }
}
