//! Publishing on the Kafka binding: its [`Publisher`](crate::broker::Publisher) operations. Every
//! record carries the envelope byte for byte, the `bq-` header projection,
//! the timestamp of `meta.created_at` and a null key, and counts as
//! published once the broker's delivery report says so.

use rdkafka::producer::FutureRecord;

use super::produce::{self, Record};
use super::{KafkaTransport, check_topic, headers};
use crate::broker::outgoing::batch_publisher;
use crate::broker::{BatchOutcome, Outgoing, TransportError};

/// One message as the producer writes it: the value and its headers.
struct Prepared<'m> {
    topic: &'m str,
    value: &'m [u8],
    headers: Vec<(String, Vec<u8>)>,
    timestamp: Option<i64>,
}

impl<'m> Prepared<'m> {
    fn new(topic: &'m str, value: &'m [u8], extra: &[(String, String)]) -> Self {
        Prepared {
            topic,
            value,
            headers: produce::envelope_headers(value, extra),
            timestamp: headers::timestamp(value),
        }
    }

    fn header_refs(&self) -> Vec<(&str, &[u8])> {
        self.headers
            .iter()
            .map(|(name, value)| (name.as_str(), value.as_slice()))
            .collect()
    }
}

batch_publisher! {
    /// Publishes every message of `messages`, each to its own topic: all
    /// are handed to the producer first, then every delivery report is
    /// awaited, so the batch costs one round of the broker's
    /// acknowledgements. One outcome per message, in order (see
    /// [`BatchOutcome`]); a topic name Kafka cannot hold fails that
    /// message only, before anything is sent, and a full local queue
    /// fails it with [`TransportError::Backpressure`].
    ///
    /// ```no_run
    /// use babel_idem::transport::{KafkaTransport, Outgoing};
    ///
    /// # async fn run() -> Result<(), babel_idem::transport::TransportError> {
    /// let transport = KafkaTransport::connect("kafka://127.0.0.1:9092").await?;
    /// let outcome = transport
    ///     .publish_batch(&[Outgoing::new("orders", b"{}"), Outgoing::new("no/slash", b"{}")])
    ///     .await?;
    /// assert!(outcome[0].is_ok() && outcome[1].is_err());
    /// # Ok(())
    /// # }
    /// ```
    KafkaTransport {
        /// A Kafka topic name: 1 to 249 characters of `a-z A-Z 0-9 . _ -`, and
        /// not `.` or `..`.
        check: |_: &KafkaTransport, topic: &str| check_topic(topic),
        /// Writes `body` byte for byte to the topic `queue`, with the `bq-`
        /// projection and `headers` beside it, the record timestamp from
        /// `meta.created_at`, a null key; returns once the broker's delivery
        /// report confirms it (a topic that does not exist fails with
        /// [`TransportError::Unroutable`] once the producer gives up on it).
        one: publish_one,
        send: publish_each,
    }
}

impl KafkaTransport {
    /// Hands every message of `sendable` to the producer, then awaits every
    /// delivery report: one outcome per message, in order.
    async fn publish_each(
        &self,
        sendable: Vec<&Outgoing<'_>>,
    ) -> Result<BatchOutcome, TransportError> {
        let prepared: Vec<Prepared<'_>> = sendable
            .iter()
            .map(|message| Prepared::new(message.queue, message.body, message.headers))
            .collect();
        // Every record is queued before any report is awaited: the
        // producer batches them, and the reports come back together.
        let mut pending = Vec::with_capacity(prepared.len());
        for message in &prepared {
            let header_refs = message.header_refs();
            let mut record = FutureRecord::<[u8], [u8]>::to(message.topic)
                .payload(message.value)
                .headers(produce::owned_headers(&header_refs));
            if let Some(timestamp) = message.timestamp {
                record = record.timestamp(timestamp);
            }
            pending.push(
                self.inner
                    .producer
                    .send_result(record)
                    .map_err(|(error, _)| produce::delivery_error(message.topic, error)),
            );
        }
        let mut outcome = Vec::with_capacity(pending.len());
        for (sent, message) in pending.into_iter().zip(&prepared) {
            let result = match sent {
                Err(error) => Err(error),
                Ok(delivery) => match delivery.await {
                    Ok(Ok(_)) => Ok(()),
                    Ok(Err((error, _))) => Err(produce::delivery_error(message.topic, error)),
                    Err(canceled) => Err(TransportError::Broker(Box::new(canceled))),
                },
            };
            outcome.push(result);
        }
        Ok(outcome)
    }

    /// Publishes `body` to the topic `queue` with `extra` headers (a
    /// `traceparent`) after the `bq-` projection, and waits for the
    /// broker's delivery report.
    async fn publish_one(
        &self,
        queue: &str,
        body: &[u8],
        extra: &[(String, String)],
    ) -> Result<(), TransportError> {
        check_topic(queue)?;
        let prepared = Prepared::new(queue, body, extra);
        let header_refs = prepared.header_refs();
        let record = Record {
            topic: queue,
            key: None,
            value: body,
            headers: &header_refs,
            timestamp: prepared.timestamp,
        };
        produce::confirmed(&self.inner.producer, record)
            .await
            .map(drop)
    }
}
