//! What the producer tests share: a queue on the test's broker (Redis or
//! RabbitMQ) with a unique name, read back as it sits there and deleted on
//! drop.
#![allow(dead_code, unreachable_pub)]

#[cfg(all(feature = "outbox", feature = "sqlite", feature = "postgres"))]
pub mod db;

use std::time::Duration;

use lapin::options::{BasicGetOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Connection, ConnectionProperties};
use redis::AsyncCommands;

pub const AMQP_URL: &str = "BABEL_IDEM_AMQP_URL";

/// Which broker a test talks to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Broker {
    Redis(String),
    Amqp(String),
}

/// One message as it sits on the broker: its body (unframed on Redis) and
/// its transport headers.
#[derive(Debug, Clone)]
pub struct Landed {
    pub body: Vec<u8>,
    pub headers: Vec<(String, String)>,
}

impl Broker {
    /// Every message of `queue`, taken off it, oldest first.
    pub async fn drain(&self, queue: &str) -> Vec<Landed> {
        match self {
            Broker::Redis(url) => {
                let client = redis::Client::open(url.as_str()).unwrap();
                let mut connection = client.get_multiplexed_async_connection().await.unwrap();
                let values: Vec<Vec<u8>> = connection.lrange(queue, 0, -1).await.unwrap();
                let _: () = connection.del(queue).await.unwrap();
                values.into_iter().map(unframe).collect()
            }
            Broker::Amqp(url) => {
                let connection = Connection::connect(url, ConnectionProperties::default())
                    .await
                    .unwrap();
                let channel = connection.create_channel().await.unwrap();
                let mut landed = Vec::new();
                while let Ok(Some(message)) = channel
                    .basic_get(queue.into(), BasicGetOptions { no_ack: true })
                    .await
                {
                    landed.push(Landed {
                        headers: amqp_headers(&message.delivery.properties),
                        body: message.delivery.data,
                    });
                }
                let _ = connection.close(200, "read".into()).await;
                landed
            }
        }
    }

    /// How many messages `queue` holds (0 when it does not exist).
    pub async fn len(&self, queue: &str) -> usize {
        match self {
            Broker::Redis(url) => {
                let client = redis::Client::open(url.as_str()).unwrap();
                let mut connection = client.get_multiplexed_async_connection().await.unwrap();
                connection.llen(queue).await.unwrap()
            }
            Broker::Amqp(url) => {
                let connection = Connection::connect(url, ConnectionProperties::default())
                    .await
                    .unwrap();
                let channel = connection.create_channel().await.unwrap();
                let passive = QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                };
                let count = match channel
                    .queue_declare(queue.into(), passive, FieldTable::default())
                    .await
                {
                    Ok(declared) => declared.message_count() as usize,
                    Err(_) => 0,
                };
                let _ = connection.close(200, "read".into()).await;
                count
            }
        }
    }

    /// Waits (up to two minutes, a guard against hanging, never a timing
    /// assertion) until `queue` holds at least `count` messages.
    pub async fn wait_for(&self, queue: &str, count: usize) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
        while self.len(queue).await < count {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{queue} never held {count} messages"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Deletes `queues` (for cleanup).
    pub async fn delete(&self, queues: &[String]) {
        match self {
            Broker::Redis(url) => {
                let client = redis::Client::open(url.as_str()).unwrap();
                let mut connection = client.get_multiplexed_async_connection().await.unwrap();
                for queue in queues {
                    let _: () = connection.del(queue).await.unwrap();
                }
            }
            Broker::Amqp(url) => {
                let Ok(connection) =
                    Connection::connect(url, ConnectionProperties::default()).await
                else {
                    return;
                };
                for queue in queues {
                    if let Ok(channel) = connection.create_channel().await {
                        let _ = channel
                            .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
                            .await;
                    }
                }
                let _ = connection.close(200, "cleanup".into()).await;
            }
        }
    }
}

/// A Redis value's body and headers (a `__bq_frame` frame is opened).
fn unframe(value: Vec<u8>) -> Landed {
    if let Ok(serde_json::Value::Object(frame)) = serde_json::from_slice(&value)
        && frame.get("__bq_frame").is_some()
        && let Some(serde_json::Value::String(body)) = frame.get("body")
    {
        let headers = frame
            .get("headers")
            .and_then(|h| h.as_object())
            .map(|h| {
                h.iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                    .collect()
            })
            .unwrap_or_default();
        return Landed {
            body: body.as_bytes().to_vec(),
            headers,
        };
    }
    Landed {
        body: value,
        headers: Vec::new(),
    }
}

fn amqp_headers(properties: &BasicProperties) -> Vec<(String, String)> {
    let Some(table) = properties.headers() else {
        return Vec::new();
    };
    table
        .inner()
        .iter()
        .map(|(name, value)| {
            let value = match value {
                AMQPValue::LongString(s) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
                other => format!("{other:?}"),
            };
            (name.to_string(), value)
        })
        .collect()
}

impl Landed {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The body's `meta.id`.
    pub fn id(&self) -> String {
        let value: serde_json::Value = serde_json::from_slice(&self.body).unwrap();
        value["meta"]["id"].as_str().unwrap().to_owned()
    }
}

/// A TCP proxy to a broker, owned by one test: `down` drops every
/// connection through it and refuses new ones (the broker is unreachable)
/// until `up`.
pub struct Proxy {
    pub port: u16,
    down: std::sync::Arc<std::sync::atomic::AtomicBool>,
    connections: std::sync::Arc<std::sync::Mutex<Vec<tokio::task::AbortHandle>>>,
    accept: tokio::task::JoinHandle<()>,
}

impl Proxy {
    pub async fn start(upstream: String) -> Self {
        use std::sync::atomic::Ordering;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let down = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let connections: std::sync::Arc<std::sync::Mutex<Vec<tokio::task::AbortHandle>>> =
            Default::default();
        let (registry, refusing) = (connections.clone(), down.clone());
        let accept = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                if refusing.load(Ordering::SeqCst) {
                    drop(client);
                    continue;
                }
                let upstream = upstream.clone();
                let task = tokio::spawn(async move {
                    if let Ok(mut server) = tokio::net::TcpStream::connect(upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
                registry.lock().unwrap().push(task.abort_handle());
            }
        });
        Proxy {
            port,
            down,
            connections,
            accept,
        }
    }

    /// Cuts every connection and refuses new ones.
    pub fn down(&self) {
        self.down.store(true, std::sync::atomic::Ordering::SeqCst);
        let cut: Vec<_> = self.connections.lock().unwrap().drain(..).collect();
        cut.iter().for_each(tokio::task::AbortHandle::abort);
    }

    /// Accepts connections again.
    pub fn up(&self) {
        self.down.store(false, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.down();
    }
}
