//! `Consumer` + `RedisTransport` on a Redis Cluster
//! (`BABEL_IDEM_REDIS_CLUSTER_URL`), with the Python SDK as the peer producer
//! and dead-letter reader (its `RedisTransport` given a
//! `redis.cluster.RedisCluster` client). Every queue name carries a hash
//! tag, so each queue's keys share one slot; the seen-set is `RedisStore` on
//! the same cluster, its ids spread over every master.
#![cfg(all(
    feature = "redis-transport",
    feature = "redis-cluster",
    feature = "sqlite"
))]

mod consumer_support;
mod store_contract;

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use babel_idem::store::RedisStore;
use babel_idem::transport::{RedisTransport, TransportError};
use babel_idem::{Consumer, Delivery, Envelope, Router, Store, run_once, urn};
use serde_json::{Value, json};
use store_contract::servers::{REDIS_CLUSTER_URL, server_url, unique_suffix};

use consumer_support::{
    QUIET, Seen, SeenLog, URN, python, python_publishes, recording_router, run_until_idle,
    seen_as_python_sent,
};

const PEER: &str = "consumer_peer.py";

async fn peer(python: &Path, args: Vec<String>, stdin: Option<Value>) -> Value {
    consumer_support::peer(python, PEER, args, stdin).await
}

/// One test's queue on the cluster: `{bi-cluster-<run>}`, so its layout's
/// keys share the tag's slot; every key of it deleted on drop.
struct ClusterQueue {
    url: String,
    name: String,
}

impl ClusterQueue {
    fn new(url: &str) -> Self {
        ClusterQueue {
            url: url.to_owned(),
            name: format!("{{bi-cluster-{}}}", unique_suffix()),
        }
    }

    fn dlq(&self) -> String {
        format!("{}.dlq", self.name)
    }

    fn keys(&self) -> Vec<String> {
        [
            "",
            ":processing",
            ":processing:deadlines",
            ".dlq",
            ":processing:processing",
        ]
        .iter()
        .map(|suffix| format!("{}{suffix}", self.name))
        .collect()
    }

    fn client(&self) -> redis::cluster::ClusterClient {
        redis::cluster::ClusterClient::new(store_contract::seed_urls(&self.url))
            .expect("a cluster URL")
    }

    async fn raw(&self) -> redis::cluster_async::ClusterConnection {
        self.client()
            .get_async_connection()
            .await
            .expect("connect to the Redis Cluster")
    }

    async fn len(&self, key: &str) -> i64 {
        let mut raw = self.raw().await;
        let kind: String = redis::cmd("TYPE")
            .arg(key)
            .query_async(&mut raw)
            .await
            .unwrap();
        let command = if kind == "zset" { "ZCARD" } else { "LLEN" };
        redis::cmd(command)
            .arg(key)
            .query_async(&mut raw)
            .await
            .unwrap()
    }

    async fn drained(&self) -> bool {
        self.len(&self.name).await == 0
            && self.len(&format!("{}:processing", self.name)).await == 0
            && self
                .len(&format!("{}:processing:deadlines", self.name))
                .await
                == 0
    }

    async fn transport(&self) -> RedisTransport {
        RedisTransport::connect(&self.url)
            .await
            .expect("connect the transport to the cluster")
    }
}

impl Drop for ClusterQueue {
    fn drop(&mut self) {
        let Ok(mut connection) = self.client().get_connection() else {
            return;
        };
        // One slot: a DEL of them all is allowed.
        let _: redis::RedisResult<i64> = redis::cmd("DEL").arg(self.keys()).query(&mut connection);
    }
}

/// A seen-set on the cluster whose keys this test deletes on drop.
struct ClusterSeenSet {
    backend: store_contract::RedisClusterBackend,
    store: RedisStore,
}

impl ClusterSeenSet {
    async fn new(url: &str) -> Self {
        use store_contract::Backend;
        let backend = store_contract::RedisClusterBackend::on(url.to_owned());
        let store = backend.open("seen", None).await;
        ClusterSeenSet { backend, store }
    }
}

/// Python produces on a hash-tagged queue; babel-idem consumes every
/// message with its id, URN, data and headers, each once, though each was
/// sent twice; the guard's seen-set (on the cluster) skips the copies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_publishes_on_a_cluster_queue_and_each_id_runs_once() {
    const TEST: &str = "python_publishes_on_a_cluster_queue_and_each_id_runs_once";
    let (Some(url), Some(python)) = (server_url(REDIS_CLUSTER_URL, TEST), python(TEST)) else {
        return;
    };
    let queue = ClusterQueue::new(&url);
    let sent = python_publishes(&python, PEER, &url, &queue.name, 30).await;
    // Each message again, as a redelivery would bring it.
    let mut raw = queue.raw().await;
    let bodies: Vec<Vec<u8>> = redis::cmd("LRANGE")
        .arg(&queue.name)
        .arg(0)
        .arg(-1)
        .query_async(&mut raw)
        .await
        .unwrap();
    let transport = queue.transport().await;
    for body in &bodies {
        transport.publish(&queue.name, body).await.unwrap();
    }

    let seen_set = ClusterSeenSet::new(&url).await;
    let log = SeenLog::default();
    let store = seen_set.store.clone();
    let recorded = Arc::clone(&log);
    let router = Router::builder()
        .route(
            urn!("urn:babel:interop:created"),
            move |env: Envelope, delivery: Delivery| {
                let (store, recorded) = (store.clone(), Arc::clone(&recorded));
                async move {
                    run_once(store, &env, async {
                        recorded.lock().unwrap().push(Seen {
                            id: env.meta.id.clone().unwrap_or_default(),
                            urn: env.job.clone(),
                            data: Value::Object(env.data.clone()),
                            attempts: delivery.attempts(),
                            headers: delivery
                                .headers()
                                .map(|(n, v)| (n.to_owned(), v.to_owned()))
                                .collect(),
                            replay: false,
                        });
                        Ok::<(), babel_idem::StoreError>(())
                    })
                    .await
                }
            },
        )
        .build()
        .unwrap();
    let consumer = Consumer::builder(router, transport, &queue.name)
        .concurrency(8)
        .build()
        .unwrap();
    let report = run_until_idle(&consumer, QUIET).await;

    assert_eq!(report.acked, 60, "{report:?}");
    seen_as_python_sent(&sent, &log.lock().unwrap());
    let ids: Vec<&str> = sent
        .as_array()
        .unwrap()
        .iter()
        .map(|message| message["id"].as_str().unwrap())
        .collect();
    assert!(
        seen_set
            .store
            .seen_many(&ids)
            .await
            .unwrap()
            .iter()
            .all(|&seen| seen)
    );
    assert!(queue.drained().await);
    drop(seen_set.backend);
}

/// A failing handler is retried, then dead-lettered to `<queue>.dlq` (the
/// queue's slot); Python's dead-letter helpers read the records back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_retried_then_dead_lettered_and_python_reads_the_dlq() {
    const TEST: &str = "failures_are_retried_then_dead_lettered_and_python_reads_the_dlq";
    let (Some(url), Some(python)) = (server_url(REDIS_CLUSTER_URL, TEST), python(TEST)) else {
        return;
    };
    let queue = ClusterQueue::new(&url);
    let transport = queue.transport().await;
    let mut ids = Vec::new();
    for n in 0..3 {
        let envelope = Envelope::new(URN, json!({"n": n})).with_queue(&queue.name);
        ids.push(envelope.meta.id.clone().unwrap());
        transport
            .publish(&queue.name, &envelope.to_vec())
            .await
            .unwrap();
    }
    let attempts: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
    let counted = Arc::clone(&attempts);
    let router = Router::builder()
        .route(
            urn!("urn:babel:interop:created"),
            move |env: Envelope, _: Delivery| {
                *counted
                    .lock()
                    .unwrap()
                    .entry(env.meta.id.clone().unwrap_or_default())
                    .or_default() += 1;
                async { Err::<(), _>(std::io::Error::other("payment gateway timeout")) }
            },
        )
        .max_attempts(3)
        .build()
        .unwrap();
    let consumer = Consumer::builder(router, transport, &queue.name)
        .build()
        .unwrap();
    let report = run_until_idle(&consumer, QUIET).await;
    assert_eq!((report.retried, report.dead_lettered), (6, 3), "{report:?}");
    assert!(attempts.lock().unwrap().values().all(|&runs| runs == 3));

    let out = peer(&python, vec!["dlq".into(), url.clone(), queue.dlq()], None).await;
    let items = out["items"].as_array().unwrap();
    assert_eq!(items.len(), 3, "{out}");
    for item in items {
        assert!(ids.contains(&item["message_id"].as_str().unwrap().to_owned()));
        assert_eq!(item["reason"], "failed");
        assert_eq!(item["to"], queue.name.as_str());
    }
    assert_eq!(out["left"], 3);
    assert!(queue.drained().await);
}

/// Bad input is a clear error when the transport or the consumer is built:
/// a queue name without a hash tag (saying how to name it), seed nodes that
/// are down, a node that is not in cluster mode.
#[tokio::test]
async fn untagged_queues_and_unreachable_clusters_are_refused_when_built() {
    const TEST: &str = "untagged_queues_and_unreachable_clusters_are_refused_when_built";
    let Some(url) = server_url(REDIS_CLUSTER_URL, TEST) else {
        return;
    };
    let transport = RedisTransport::connect(&url).await.unwrap();
    let error = transport.publish("orders", b"{}").await.unwrap_err();
    assert!(
        matches!(&error, TransportError::InvalidQueue { reason, .. } if reason.contains("{orders}")),
        "{error}"
    );
    let router = recording_router(SeenLog::default(), false);
    let refused = Consumer::builder(router, transport, "orders").build();
    assert!(
        refused
            .as_ref()
            .is_err_and(|e| e.to_string().contains("hash tag")),
        "a consumer on an untagged queue"
    );

    let down = RedisTransport::builder()
        .timeout(Duration::from_millis(300))
        .connect("redis+cluster://127.0.0.1:1,127.0.0.1:2/")
        .await
        .unwrap_err();
    assert!(matches!(down, TransportError::Connect(_)), "{down}");
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
        let not_cluster = RedisTransport::builder()
            .timeout(Duration::from_millis(500))
            .connect(&format!("redis+cluster://{host}/"))
            .await
            .unwrap_err();
        assert!(
            not_cluster.to_string().contains("cluster-enabled"),
            "{not_cluster}"
        );
    }
}
