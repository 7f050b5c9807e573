//! Delayed publishing: [`KafkaTransport::publish_delayed`] parks a message
//! on the smallest retry tier that covers the delay, for the
//! [`Reinjector`](super::Reinjector) to write to its work topic once due.

use std::time::Duration;

use super::headers::{self, DELAY, ORIGINAL_TOPIC};
use super::produce::{self, Record};
use super::tiers::millis;
use super::{KafkaTransport, TierError, check_topic};
use crate::broker::TransportError;

/// Why [`KafkaTransport::publish_delayed`] published nothing, or failed.
///
/// ```
/// use babel_idem::transport::kafka::{DelayError, TierError};
///
/// let error = DelayError::from(TierError::None);
/// assert_eq!(
///     error.to_string(),
///     "cannot park a delayed message: no retry tiers are configured"
/// );
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DelayError {
    /// No tier holds the delay (none configured, or the delay exceeds the
    /// largest); nothing was produced.
    #[error("cannot park a delayed message: {0}")]
    Tiers(#[from] TierError),
    /// The topic name cannot be held, or the broker did not take the record.
    #[error("{0}")]
    Transport(#[from] TransportError),
}

impl KafkaTransport {
    /// Publishes `body` to `queue` so that it reaches the work topic no
    /// earlier than `delay` from now: it is parked on the smallest retry
    /// tier whose delay covers `delay` (`<queue>.retry.<n>`), with the
    /// envelope's `bq-` headers, `bq-delay` (the delay asked for, in
    /// milliseconds) and `bq-original-topic` (`queue`), and the record
    /// timestamp `meta.created_at`, as the Python SDK's `publish_delayed`
    /// writes it. Returns once the broker confirmed the write; a
    /// [`Reinjector`](super::Reinjector) moves it on.
    ///
    /// No tiers, or a delay above the largest, is
    /// [`DelayError::Tiers`]: nothing is produced (a delay is never cut
    /// down to fit).
    ///
    /// ```no_run
    /// use babel_idem::transport::KafkaTransport;
    /// use babel_idem::transport::kafka::RetryTiers;
    /// use std::time::Duration;
    ///
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let transport = KafkaTransport::builder()
    ///     .retry_tiers(RetryTiers::recommended())
    ///     .connect("kafka://127.0.0.1:9092")
    ///     .await?;
    /// let body = br#"{"job":"urn:babel:orders:remind","data":{},"meta":{"id":"m-1"}}"#;
    /// // Parked on orders.retry.2 (30 s), the smallest tier covering 20 s.
    /// transport.publish_delayed("orders", body, Duration::from_secs(20)).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn publish_delayed(
        &self,
        queue: &str,
        body: &[u8],
        delay: Duration,
    ) -> Result<(), DelayError> {
        check_topic(queue)?;
        let tiers = self.retry_tiers();
        let (n, _) = tiers.for_delay(delay)?;
        let topic = tiers.topic(queue, n);
        check_topic(&topic)?;
        let mut parked = produce::envelope_headers(body, &[]);
        parked.retain(|(name, _)| name != DELAY && name != ORIGINAL_TOPIC);
        parked.push((DELAY.to_owned(), millis(delay).to_string().into_bytes()));
        parked.push((ORIGINAL_TOPIC.to_owned(), queue.as_bytes().to_vec()));
        let parked: Vec<(&str, &[u8])> = parked
            .iter()
            .map(|(name, value)| (name.as_str(), value.as_slice()))
            .collect();
        produce::confirmed(
            &self.inner.producer,
            Record {
                topic: &topic,
                key: None,
                value: body,
                headers: &parked,
                timestamp: headers::timestamp(body),
            },
        )
        .await?;
        Ok(())
    }
}
