//! One test's queue on a Redis server, for the tests that run a consumer on
//! Redis (in process or as the worker example).

use redis::AsyncCommands;

use babel_idem::transport::RedisTransport;

use crate::store_contract::servers::unique_suffix;

use super::envelope_with_id;

/// One test's queue on a Redis server: a unique name, its keys deleted on drop.
pub struct Queue {
    pub url: String,
    pub name: String,
}

impl Queue {
    pub fn new(url: &str) -> Self {
        Queue {
            url: url.to_owned(),
            name: format!("bi-consumer-{}", unique_suffix()),
        }
    }

    pub fn processing(&self) -> String {
        format!("{}:processing", self.name)
    }

    pub fn deadlines(&self) -> String {
        format!("{}:processing:deadlines", self.name)
    }

    pub fn dlq(&self) -> String {
        format!("{}.dlq", self.name)
    }

    /// A key of this test's own, deleted with the queue.
    pub fn key(&self, what: &str) -> String {
        format!("{}:{what}", self.name)
    }

    pub async fn raw(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.url.as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .expect("connect to the test's Redis")
    }

    pub async fn len(&self, key: &str) -> usize {
        let mut raw = self.raw().await;
        let kind: String = redis::cmd("TYPE")
            .arg(key)
            .query_async(&mut raw)
            .await
            .unwrap();
        match kind.as_str() {
            "zset" => raw.zcard(key).await.unwrap(),
            "hash" => raw.hlen(key).await.unwrap(),
            _ => raw.llen(key).await.unwrap(),
        }
    }

    /// Whether the queue, its reservations and their deadlines are all empty.
    pub async fn drained(&self) -> bool {
        self.len(&self.name).await == 0
            && self.len(&self.processing()).await == 0
            && self.len(&self.deadlines()).await == 0
    }

    pub async fn transport(&self) -> RedisTransport {
        RedisTransport::connect(&self.url)
            .await
            .expect("connect the transport")
    }
}

impl Drop for Queue {
    /// Deletes every key of this test's queue.
    fn drop(&mut self) {
        super::delete_keys(&self.url, &[&format!("{}*", self.name)]);
    }
}

/// Publishes `count` envelopes with the ids `<prefix>-0`, `<prefix>-1`, ...
pub async fn publish_numbered(transport: &RedisTransport, queue: &str, prefix: &str, count: u64) {
    for n in 0..count {
        let body = envelope_with_id(&format!("{prefix}-{n}"), queue, n).to_vec();
        transport.publish(queue, &body).await.unwrap();
    }
}
