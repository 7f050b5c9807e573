//! One test's queue on a RabbitMQ broker, for the tests that run a consumer
//! on RabbitMQ (in process or as the worker example).

use std::time::Duration;

use babel_idem::transport::AmqpTransport;
use lapin::options::{BasicGetOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Connection, ConnectionProperties};

use crate::store_contract::servers::unique_suffix;

/// The variable that names the shared broker.
pub const AMQP_URL: &str = "BABEL_IDEM_AMQP_URL";

/// One test's queue and its `.dlq` on the broker: a unique name, both
/// deleted on drop.
pub struct Queue {
    pub url: String,
    pub name: String,
}

impl Queue {
    pub fn new(url: &str) -> Self {
        Queue {
            url: url.to_owned(),
            name: format!("bi-amqp-{}", unique_suffix()),
        }
    }

    pub fn dlq(&self) -> String {
        format!("{}.dlq", self.name)
    }

    pub async fn transport(&self, prefetch: u16) -> AmqpTransport {
        AmqpTransport::builder()
            .prefetch(prefetch)
            .reserve_wait(Duration::from_millis(50))
            .connect(&self.url)
            .await
            .expect("connect the transport")
    }

    /// Every message of `queue` as it sits in the broker, taken off it.
    pub async fn drain(&self, queue: &str) -> Vec<(BasicProperties, Vec<u8>)> {
        let connection = raw_connection(&self.url).await;
        let channel = connection.create_channel().await.unwrap();
        let mut messages = Vec::new();
        while let Some(message) = channel
            .basic_get(queue.into(), BasicGetOptions { no_ack: true })
            .await
            .unwrap()
        {
            messages.push((message.delivery.properties, message.delivery.data));
        }
        messages
    }

    /// How many ready messages `queue` holds (0 when it does not exist).
    pub async fn ready(&self, queue: &str) -> u32 {
        let connection = raw_connection(&self.url).await;
        let channel = connection.create_channel().await.unwrap();
        let passive = QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        };
        match channel
            .queue_declare(queue.into(), passive, FieldTable::default())
            .await
        {
            Ok(declared) => declared.message_count(),
            Err(_) => 0,
        }
    }
}

impl Drop for Queue {
    fn drop(&mut self) {
        let (url, names) = (self.url.clone(), [self.name.clone(), self.dlq()]);
        // Drop cannot await: a thread of its own, with a runtime of its own.
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async {
                let Ok(connection) =
                    Connection::connect(&url, ConnectionProperties::default()).await
                else {
                    return;
                };
                for name in names {
                    if let Ok(channel) = connection.create_channel().await {
                        let _ = channel
                            .queue_delete(name.as_str().into(), QueueDeleteOptions::default())
                            .await;
                    }
                }
                let _ = connection.close(200, "test done".into()).await;
            });
        })
        .join();
    }
}

/// A plain lapin connection to the test's broker.
pub async fn raw_connection(url: &str) -> Connection {
    Connection::connect(url, ConnectionProperties::default())
        .await
        .expect("connect to the test's broker")
}
