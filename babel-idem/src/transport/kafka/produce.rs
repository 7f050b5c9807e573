//! The binding's writes: one record with the `bq-` projection, confirmed
//! by the broker's delivery report before it counts as written.

use std::time::Duration;

use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::util::Timeout;

use super::headers;
use crate::broker::TransportError;

/// One record to write.
#[derive(Debug, Clone, Copy)]
pub(super) struct Record<'a> {
    /// The topic.
    pub(super) topic: &'a str,
    /// The key, kept as the consumed record had it (`None`: a null key).
    pub(super) key: Option<&'a [u8]>,
    /// The value, written byte for byte.
    pub(super) value: &'a [u8],
    /// The headers, in order.
    pub(super) headers: &'a [(&'a str, &'a [u8])],
    /// The record timestamp (Unix ms), else the producer's clock.
    pub(super) timestamp: Option<i64>,
}

/// The headers a produced envelope carries: the `bq-` projection of
/// `body`, then `extra` (a `traceparent`), blank names and values dropped.
pub(super) fn envelope_headers(body: &[u8], extra: &[(String, String)]) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, Vec<u8>)> = headers::projection(body)
        .into_iter()
        .map(|(name, value)| (name.to_owned(), value.into_bytes()))
        .collect();
    out.extend(
        extra
            .iter()
            .filter(|(name, value)| !name.trim().is_empty() && !value.trim().is_empty())
            .map(|(name, value)| (name.clone(), value.clone().into_bytes())),
    );
    out
}

/// `headers` as librdkafka's.
pub(super) fn owned_headers(headers: &[(&str, &[u8])]) -> OwnedHeaders {
    header_list(headers.iter().map(|(name, value)| (*name, Some(*value))))
}

/// Headers as a record stored them, a null value kept null.
pub(super) fn stored_headers(headers: &[headers::Stored]) -> OwnedHeaders {
    header_list(
        headers
            .iter()
            .map(|(name, value)| (name.as_str(), value.as_deref())),
    )
}

/// `headers` in order, as librdkafka takes them.
fn header_list<'h>(
    headers: impl ExactSizeIterator<Item = (&'h str, Option<&'h [u8]>)>,
) -> OwnedHeaders {
    let all = OwnedHeaders::new_with_capacity(headers.len());
    headers.fold(all, |all, (key, value)| all.insert(Header { key, value }))
}

/// Writes `record` and waits for its delivery report: `Ok` with the
/// partition and offset once the broker holds it; an error when the
/// broker refused it or did not confirm it within the producer's
/// `message.timeout.ms`.
pub(super) async fn confirmed(
    producer: &FutureProducer,
    record: Record<'_>,
) -> Result<(i32, i64), TransportError> {
    let headers = owned_headers(record.headers);
    let stored = Stored {
        key: record.key,
        value: Some(record.value),
        headers,
        timestamp: record.timestamp,
    };
    send(producer, record.topic, stored).await
}

/// A record as librdkafka takes it: a null key or value stays null.
pub(super) struct Stored<'a> {
    pub(super) key: Option<&'a [u8]>,
    pub(super) value: Option<&'a [u8]>,
    pub(super) headers: OwnedHeaders,
    pub(super) timestamp: Option<i64>,
}

/// Writes `record` to `topic` and waits for its delivery report; see
/// [`confirmed`].
pub(super) async fn send(
    producer: &FutureProducer,
    topic: &str,
    record: Stored<'_>,
) -> Result<(i32, i64), TransportError> {
    let mut future = FutureRecord::<[u8], [u8]>::to(topic).headers(record.headers);
    if let Some(value) = record.value {
        future = future.payload(value);
    }
    if let Some(key) = record.key {
        future = future.key(key);
    }
    if let Some(timestamp) = record.timestamp {
        future = future.timestamp(timestamp);
    }
    match producer.send(future, Timeout::Never).await {
        Ok(delivery) => Ok((delivery.partition, delivery.offset)),
        Err((error, _)) => Err(delivery_error(topic, error)),
    }
}

/// A failed delivery as the transport reports it: a full local queue is
/// back-pressure, anything else the broker's failure.
pub(super) fn delivery_error(topic: &str, error: rdkafka::error::KafkaError) -> TransportError {
    use rdkafka::types::RDKafkaErrorCode;
    match error.rdkafka_error_code() {
        Some(RDKafkaErrorCode::QueueFull) => TransportError::Backpressure(Box::new(error)),
        Some(RDKafkaErrorCode::UnknownTopicOrPartition | RDKafkaErrorCode::UnknownTopic) => {
            TransportError::Unroutable {
                queue: topic.to_owned(),
            }
        }
        _ => TransportError::Broker(Box::new(error)),
    }
}

/// Checks that a broker answers within `timeout`: a metadata request, off
/// the async runtime (librdkafka blocks for it).
pub(super) async fn check_reachable(
    producer: &FutureProducer,
    timeout: Duration,
) -> Result<(), TransportError> {
    let client = producer.clone();
    tokio::task::spawn_blocking(move || {
        client
            .client()
            .fetch_metadata(None, Timeout::After(timeout))
            .map(drop)
            .map_err(|error| TransportError::Connect(Box::new(error)))
    })
    .await
    .map_err(|error| TransportError::Connect(Box::new(error)))?
}
