//! The store contract (seen-set, claim, batch and admin sections) against
//! `RedisStore` on a Redis Cluster (`BABEL_IDEM_REDIS_CLUSTER_URL`), and the
//! cluster's own layout read back from the nodes: claim keys beside their
//! done keys in one slot, a fence counter per slot, batches over every master.
#![cfg(feature = "redis-cluster")]

#[macro_use]
mod store_contract;

use std::collections::HashSet;
use std::time::Duration;

use babel_idem::store::{Admin, Claim, ClaimToken, RedisStore};
use babel_idem::{ClaimStore, Store};
use store_contract::{Backend, RedisClusterBackend};

store_contract_tests!(RedisClusterBackend::create);
admin_contract_tests!(RedisClusterBackend::create);
claim_contract_tests!(RedisClusterBackend::create);

const LEASE: Duration = Duration::from_secs(30);

/// The slot of `key` as the cluster computes it.
async fn keyslot(raw: &mut redis::cluster_async::ClusterConnection, key: &[u8]) -> u16 {
    redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(key)
        .query_async(raw)
        .await
        .expect("CLUSTER KEYSLOT")
}

/// The master serving each slot range, from `CLUSTER SLOTS`.
async fn slot_owners(raw: &mut redis::cluster_async::ClusterConnection) -> Vec<(u16, u16, String)> {
    let slots: Vec<redis::Value> = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query_async(raw)
        .await
        .expect("CLUSTER SLOTS");
    slots
        .into_iter()
        .filter_map(|range| {
            let redis::Value::Array(fields) = range else {
                return None;
            };
            let start: i64 = redis::from_redis_value(fields.first()?.clone()).ok()?;
            let end: i64 = redis::from_redis_value(fields.get(1)?.clone()).ok()?;
            let redis::Value::Array(master) = fields.get(2)? else {
                return None;
            };
            let port: i64 = redis::from_redis_value(master.get(1)?.clone()).ok()?;
            Some((start as u16, end as u16, port.to_string()))
        })
        .collect()
}

fn owner_of(owners: &[(u16, u16, String)], slot: u16) -> String {
    owners
        .iter()
        .find(|(start, end, _)| (*start..=*end).contains(&slot))
        .map(|(_, _, master)| master.clone())
        .unwrap_or_default()
}

/// Ids whose done keys land on every master, several per master.
async fn ids_on_every_master(
    backend: &RedisClusterBackend,
    store: &RedisStore,
    per_master: usize,
) -> Vec<String> {
    let mut raw = backend.raw().await;
    let owners = slot_owners(&mut raw).await;
    let masters: HashSet<String> = owners.iter().map(|(_, _, m)| m.clone()).collect();
    let mut taken: std::collections::HashMap<String, usize> = Default::default();
    let mut ids = Vec::new();
    for n in 0.. {
        let id = format!("spread-{n}");
        let master = owner_of(&owners, keyslot(&mut raw, &store.key(&id)).await);
        let count = taken.entry(master).or_default();
        if *count < per_master {
            *count += 1;
            ids.push(id);
        }
        if taken.len() == masters.len() && taken.values().all(|&c| c == per_master) {
            break;
        }
    }
    assert!(
        masters.len() >= 3,
        "a cluster of at least 3 masters: {owners:?}"
    );
    ids
}

/// A batch spread over every master answers as its single calls do, and
/// the admin operations find each id on its own master.
#[tokio::test]
async fn batches_spanning_every_master_answer_as_single_calls() {
    let Some(backend) =
        RedisClusterBackend::create("batches_spanning_every_master_answer_as_single_calls")
    else {
        return;
    };
    let store = backend.open_claims("spread", None).await;
    assert!(store.is_cluster());
    let ids = ids_on_every_master(&backend, &store, 8).await;
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    let (first, rest) = refs.split_at(refs.len() / 2);

    store.remember_many(first).await.unwrap();
    let seen = store.seen_many(&refs).await.unwrap();
    for (id, seen) in refs.iter().zip(&seen) {
        assert_eq!(*seen, first.contains(id), "{id}");
        assert_eq!(store.seen(id).await.unwrap(), *seen, "{id}");
    }

    let owners: Vec<(&str, ClaimToken)> =
        refs.iter().map(|id| (*id, ClaimToken::random())).collect();
    let claims = store.claim_many(&owners, LEASE).await.unwrap();
    for ((id, _), claim) in owners.iter().zip(&claims) {
        if first.contains(id) {
            assert_eq!(*claim, Claim::Done, "{id}");
        } else {
            assert!(matches!(claim, Claim::Won { .. }), "{id}: {claim:?}");
        }
    }
    let states = store.states(&refs).await.unwrap();
    for (id, state) in refs.iter().zip(&states) {
        let expected = if first.contains(id) {
            "done"
        } else {
            "claimed"
        };
        assert_eq!(state.as_str(), expected, "{id}");
    }
    let won: Vec<(&str, ClaimToken)> = owners
        .iter()
        .copied()
        .filter(|(id, _)| rest.contains(id))
        .collect();
    assert!(store.commit_many(&won).await.unwrap().iter().all(|&c| c));
    assert!(store.seen_many(&refs).await.unwrap().iter().all(|&s| s));
    assert_eq!(
        store.stats("spread-").await.unwrap().marks,
        refs.len() as u64
    );
    assert_eq!(store.forget_ids(&refs).await.unwrap(), refs.len() as u64);
    assert!(store.seen_many(&refs).await.unwrap().iter().all(|&s| !s));
}

/// The Go layout stays as it is (`<prefix><id>` holds `1`), the claim key
/// carries the whole done key as its hash tag, and the fence counter is the
/// slot's: every key a claim script touches is in the done key's slot, for
/// ids with braces too.
#[tokio::test]
async fn claim_keys_and_fences_share_their_done_keys_slot() {
    let Some(backend) =
        RedisClusterBackend::create("claim_keys_and_fences_share_their_done_keys_slot")
    else {
        return;
    };
    let store = backend.open_claims("layout", None).await;
    let mut raw = backend.raw().await;
    let prefix = backend.prefix("layout");
    let stem = &prefix[..prefix.len() - 1];
    for id in ["order-42", "a{b}c", "{}", "x}", "{{y}}", "{bqtest}"] {
        let owner = ClaimToken::random();
        let fence = match store.claim(id, owner, LEASE).await.unwrap() {
            Claim::Won { fence } => fence,
            other => panic!("{id}: {other:?}"),
        };
        let claim_key = store.claim_key(id);
        if !id.contains(['{', '}']) {
            assert_eq!(
                claim_key,
                format!("{stem}-claim:{{{prefix}{id}}}").into_bytes()
            );
        }
        let done_slot = keyslot(&mut raw, &store.key(id)).await;
        assert_eq!(keyslot(&mut raw, &claim_key).await, done_slot, "{id}");
        let holder: Option<String> = redis::cmd("GET")
            .arg(&claim_key)
            .query_async(&mut raw)
            .await
            .unwrap();
        assert_eq!(holder, Some(owner.to_hex()), "{id}");
        assert!(store.commit(id, owner).await.unwrap(), "{id}");
        let done: Option<String> = redis::cmd("GET")
            .arg(store.key(id))
            .query_async(&mut raw)
            .await
            .unwrap();
        assert_eq!(done.as_deref(), Some("1"), "{id}: the Go SDK's done marker");
        // The fence rose past the server's clock in microseconds.
        let now_us = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_micros() as u64;
        assert!(
            fence > now_us - 60_000_000 && fence <= now_us + 60_000_000,
            "{id}: fence {fence} is floored at the server's clock ({now_us} µs here)"
        );
    }
}

/// Bad input fails when the store is built, with an error that says what
/// was wrong: nodes that are down, a node that is not in cluster mode, a
/// prefix with a brace, a URL asking for another database.
#[tokio::test]
async fn bad_cluster_urls_fail_when_the_store_is_built() {
    let Some(backend) =
        RedisClusterBackend::create("bad_cluster_urls_fail_when_the_store_is_built")
    else {
        return;
    };
    let down = RedisStore::builder()
        .timeout(Duration::from_millis(300))
        .reconnect_attempts(0)
        .connect("redis+cluster://127.0.0.1:1,127.0.0.1:2/")
        .await
        .unwrap_err();
    assert!(
        down.to_string().contains("no Redis Cluster answered"),
        "{down}"
    );

    if let Some(single) = std::env::var("BABEL_IDEM_REDIS_URL")
        .ok()
        .filter(|u| !u.is_empty())
    {
        let host = single
            .split_once("://")
            .map_or(single.as_str(), |(_, rest)| rest)
            .split('/')
            .next()
            .unwrap_or_default()
            .to_owned();
        let not_cluster = RedisStore::builder()
            .timeout(Duration::from_millis(500))
            .reconnect_attempts(0)
            .connect(&format!("redis+cluster://{host}/"))
            .await
            .unwrap_err();
        assert!(
            not_cluster.to_string().contains("cluster-enabled"),
            "{not_cluster}"
        );
    }

    let braces = RedisStore::builder()
        .prefix("a{b}:")
        .connect_lazy(&backend.url)
        .unwrap_err();
    assert!(braces.to_string().contains("hash tags"), "{braces}");
    let database = RedisStore::connect_lazy("redis+cluster://127.0.0.1:7000/2").unwrap_err();
    assert!(database.to_string().contains("database 0"), "{database}");
    let _ = backend.open("unused", None).await;
}

/// `wait_for_replicas`: a mark, a claim and a commit are confirmed by a
/// replica; asking for more replicas than the cluster has fails the write
/// with `NotReplicated` once the timeout passed.
#[tokio::test]
async fn writes_wait_for_their_replica_and_fail_without_one() {
    let Some(backend) =
        RedisClusterBackend::create("writes_wait_for_their_replica_and_fail_without_one")
    else {
        return;
    };
    let durable = RedisStore::builder()
        .prefix(backend.prefix("durable"))
        .wait_for_replicas(1, Duration::from_secs(2))
        .connect_lazy(&backend.url)
        .unwrap();
    durable.remember("mark").await.unwrap();
    let owner = ClaimToken::random();
    assert!(matches!(
        durable.claim("claimed", owner, LEASE).await.unwrap(),
        Claim::Won { .. }
    ));
    assert!(durable.commit("claimed", owner).await.unwrap());
    durable
        .remember_many(&["m1", "m2", "m3", "m4"])
        .await
        .unwrap();
    assert!(
        durable
            .seen_many(&["mark", "claimed", "m1", "m4"])
            .await
            .unwrap()
            .iter()
            .all(|&s| s)
    );

    let greedy = RedisStore::builder()
        .prefix(backend.prefix("durable"))
        .wait_for_replicas(5, Duration::from_millis(100))
        .connect_lazy(&backend.url)
        .unwrap();
    let error = greedy.remember("never-enough").await.unwrap_err();
    let not_replicated = std::error::Error::source(&error)
        .and_then(|source| source.downcast_ref::<babel_idem::store::NotReplicated>())
        .unwrap_or_else(|| panic!("NotReplicated, got {error}"));
    assert_eq!((not_replicated.acknowledged, not_replicated.wanted), (1, 5));
    assert!(
        greedy.seen("never-enough").await.unwrap(),
        "the master applied it; only the confirmation is missing"
    );
}

/// The PHP SDK's layout on a cluster: a commit sent again after it took
/// effect (its reply lost in a failover) finds the id done and answers
/// true, alone and in a batch; nothing is claimed again.
#[tokio::test]
async fn a_php_layout_commit_retried_after_it_took_effect_answers_true() {
    let Some(backend) = RedisClusterBackend::create(
        "a_php_layout_commit_retried_after_it_took_effect_answers_true",
    ) else {
        return;
    };
    let store = RedisStore::builder()
        .php_claims()
        .prefix(backend.prefix("php_retry"))
        .connect_lazy(&backend.url)
        .unwrap();
    let owner = ClaimToken::random();
    assert_eq!(
        store.claim("id-A", owner, LEASE).await.unwrap(),
        Claim::Won { fence: 0 }
    );
    assert!(store.commit("id-A", owner).await.unwrap());
    assert!(store.commit("id-A", owner).await.unwrap());
    assert_eq!(store.commit_many(&[("id-A", owner)]).await.unwrap(), [true]);
    assert_eq!(
        store
            .claim("id-A", ClaimToken::random(), LEASE)
            .await
            .unwrap(),
        Claim::Done
    );
}
