//! The store contract against `RedisStore` on the shared server
//! (`BABEL_IDEM_REDIS_URL`), plus the Go SDK's key layout read back from
//! Redis directly.
#![cfg(feature = "redis")]

#[macro_use]
mod store_contract;

use std::time::Duration;

use babel_idem::Store;
use babel_idem::store::RedisStore;
use babel_idem::store::StoreOperation;
use redis::AsyncCommands;
use store_contract::{Backend, RedisBackend, assert_refused_when_built};

store_contract_tests!(RedisBackend::create);
admin_contract_tests!(RedisBackend::create);
store_settings_tests!(server RedisBackend::create);

/// A key written by `RedisStore` is the one the Go SDK's store reads:
/// `bq:idemp:` + id, value `1`, a millisecond expiry when a TTL is set.
#[tokio::test]
async fn keys_follow_the_go_sdk_layout() {
    let Some(backend) = RedisBackend::create("keys_follow_the_go_sdk_layout") else {
        return;
    };
    let mut raw = backend.raw().await;
    // The default prefix, so a unique id keeps this run apart from others.
    let id = format!("go-compat-{}", uuid::Uuid::new_v4());
    let key = format!("bq:idemp:{id}");

    let store = RedisStore::connect_lazy(&backend.url).unwrap();
    store.remember(&id).await.unwrap();
    let value: Option<String> = raw.get(&key).await.unwrap();
    let pttl: i64 = raw.pttl(&key).await.unwrap();
    let _: i64 = raw.del(&key).await.unwrap();
    assert_eq!(value.as_deref(), Some("1"));
    assert_eq!(pttl, -1, "no TTL: the key does not expire");

    let ttl = Duration::from_secs(3600);
    let expiring = RedisStore::builder()
        .ttl(ttl)
        .connect_lazy(&backend.url)
        .unwrap();
    expiring.remember(&id).await.unwrap();
    let value: Option<String> = raw.get(&key).await.unwrap();
    let pttl: i64 = raw.pttl(&key).await.unwrap();
    assert_eq!(value.as_deref(), Some("1"));
    assert!(
        pttl > 0 && pttl <= 3_600_000,
        "PX in milliseconds, got {pttl}"
    );

    // The other direction: a key the Go SDK wrote (SET key 1 NX) is seen.
    let _: i64 = raw.del(&key).await.unwrap();
    assert!(!store.seen(&id).await.unwrap());
    let _: () = raw.set(&key, "1").await.unwrap();
    assert!(store.seen(&id).await.unwrap());
    store.forget(&id).await.unwrap();
    let exists: bool = raw.exists(&key).await.unwrap();
    assert!(!exists, "forget is DEL");
}

/// A prefix is configurable and keys are binary safe: a NUL byte reaches
/// Redis verbatim.
#[tokio::test]
async fn a_custom_prefix_and_binary_ids_are_kept_verbatim() {
    let Some(backend) = RedisBackend::create("a_custom_prefix_and_binary_ids_are_kept_verbatim")
    else {
        return;
    };
    let store = backend.open("binary", None).await;
    assert_eq!(store.prefix(), backend.prefix("binary"));
    store.remember("a\0b").await.unwrap();
    let mut raw = backend.raw().await;
    let mut key = backend.prefix("binary").into_bytes();
    key.extend_from_slice(b"a\0b");
    let value: Option<Vec<u8>> = raw.get(&key).await.unwrap();
    assert_eq!(value.as_deref(), Some(&b"1"[..]));
    assert_eq!(store.key("a\0b"), key);
}

/// Several hosts in a `redis://` URL name no one server: refused, with the
/// cluster URL to use instead. Without the `redis-cluster` feature a
/// `redis+cluster://` URL is refused too, saying the feature is needed.
#[tokio::test]
async fn a_url_with_several_hosts_or_a_cluster_without_the_feature_is_refused() {
    let mut urls = vec!["redis://10.0.0.1:7000,10.0.0.2:7000/"];
    if !cfg!(feature = "redis-cluster") {
        urls.push("redis+cluster://10.0.0.1:7000/");
    }
    for url in urls {
        let error = RedisStore::connect_lazy(url).expect_err(url);
        assert_eq!(error.operation(), StoreOperation::Open);
        assert_eq!(error.backend(), "redis");
        assert!(error.to_string().contains("redis+cluster://"), "{error}");
    }
}

#[tokio::test]
async fn a_malformed_url_is_an_open_error() {
    let error = RedisStore::connect_lazy("http://example.invalid/").expect_err("not redis");
    assert_eq!(error.operation(), StoreOperation::Open);
    assert!(
        error.to_string().contains("not a usable Redis URL"),
        "{error}"
    );
}

#[test]
fn building_outside_a_tokio_runtime_is_an_error_not_a_panic() {
    let error = RedisStore::connect_lazy("redis://127.0.0.1:6379/").expect_err("no runtime");
    assert!(error.to_string().contains("Tokio runtime"), "{error}");
}

/// A prefix that is empty, does not end with `:`, holds spaces, control or
/// glob characters, or nests with the Go SDK's default `bq:idemp:` (so one
/// store's key is another's id) is refused when the store is built, with
/// the rule.
#[tokio::test]
async fn an_ambiguous_prefix_is_refused_when_built() {
    for prefix in [
        "",
        ":",
        "bq:idemp",
        "bq:",
        "bq:idemp:x:",
        "billing idemp:",
        "billing\nidemp:",
        "billing*:",
        "billing?:",
        "billing[1]:",
        "billing\\:",
        "caché:",
        &format!("{}:", "p".repeat(128)),
    ] {
        let built = RedisStore::builder()
            .prefix(prefix)
            .connect_lazy("redis://127.0.0.1:6379/");
        let quoted = format!("{prefix:?}");
        assert_refused_when_built(
            built,
            prefix,
            &["redis store", &quoted, "must end with ':'"],
        );
    }
    for prefix in [
        "bq:idemp:",
        "bq:idem:",
        "billing:idemp:",
        "x:",
        &format!("{}:", "p".repeat(127)),
    ] {
        let store = RedisStore::builder()
            .prefix(prefix)
            .connect_lazy("redis://127.0.0.1:6379/")
            .expect(prefix);
        assert_eq!(store.prefix(), prefix);
    }
}

/// With the empty prefix an application key `user:42` read as an id: seen
/// was true and forget deleted it. The store cannot be built that way now,
/// and a store on a valid prefix leaves the application's key alone.
#[tokio::test]
async fn application_keys_outside_the_prefix_are_never_touched() {
    let Some(backend) =
        RedisBackend::create("application_keys_outside_the_prefix_are_never_touched")
    else {
        return;
    };
    let mut raw = backend.raw().await;
    let app_key = format!("{}app:user:42", backend.run_prefix());
    let _: () = raw.set(&app_key, "alice").await.unwrap();
    assert!(
        RedisStore::builder()
            .prefix("")
            .connect_lazy(&backend.url)
            .is_err()
    );
    let store = backend.open("seen", None).await;
    assert!(!store.seen(&app_key).await.unwrap());
    store.forget(&app_key).await.unwrap();
    let value: Option<String> = raw.get(&app_key).await.unwrap();
    assert_eq!(value.as_deref(), Some("alice"));
}
