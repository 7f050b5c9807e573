//! [`AmqpTransport`]: the BabelQueue RabbitMQ binding over AMQP 0-9-1
//! (feature `amqp-transport`), byte-compatible with the Python SDK's
//! `babelqueue.pika_transport` (1.24).

mod acks;
mod dlq;
mod header_guard;
pub(crate) mod properties;
mod publish;
mod raw;
mod session;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use lapin::Acker;
use lapin::options::QueueDeleteOptions;
use lapin::types::FieldTable;
use lapin::uri::{AMQPScheme, AMQPUri};

use self::acks::{AckWindow, Acked};
use self::session::{Connector, Sessions};
use super::TransportBuilder;
use super::binding::QueueNames;
use crate::broker::{Reserved, Settlement, Transport};
use crate::broker::{TransportError, TransportFuture};

/// The queue names AMQP can carry: at most 255 bytes (a short string), no
/// control characters, and none starting with `amq.`, the broker's own.
const QUEUE_NAMES: QueueNames = QueueNames {
    max_len: 255,
    too_long: "an AMQP queue name is at most 255 bytes",
    refused: char::is_control,
    refused_reason: "a queue name cannot hold control characters",
    own_rule: |queue| {
        queue
            .starts_with("amq.")
            .then_some("queue names starting with amq. are reserved by the broker")
    },
};

/// The BabelQueue RabbitMQ binding, shared with the Python (and PHP, Go)
/// SDKs' workers and producers on the same queue:
///
/// - A queue that exists is used as it is, whatever its arguments (a quorum
///   queue, a message TTL, a length limit): it is declared passively first,
///   on a throwaway channel; a missing one is declared durable. Messages are published to
///   the default exchange, persistent, with the contract's properties
///   (`type` = URN, `correlation_id` = trace_id, `message_id` = meta.id) and
///   headers (`x-schema-version`, `x-source-lang`, `x-attempts`), derived from
///   the body as the Python SDK derives them. Every publish waits for the
///   broker's publisher confirm. Every publish is mandatory: a message no
///   queue took (its queue deleted since this connection declared it)
///   comes back, and the publish fails with
///   [`TransportError::Unroutable`] instead of succeeding; the queue is
///   declared again on the next publish to it. A nack (a full queue's
///   `x-overflow: reject-publish`) fails it with
///   [`TransportError::Backpressure`].
/// - Consuming is push-based with manual ack: one `basic.consume` per queue
///   on its own channel, with [`prefetch`](TransportBuilder::prefetch)
///   deliveries unacked at most (`basic.qos`). (The Python worker polls with
///   `basic.get`, one round trip per message; both share a queue fine.)
/// - Deliveries that settle together are acked with one `basic.ack`
///   (`multiple`), once every delivery before them on the channel has
///   settled; one that settles behind a delivery still running is acked on
///   its own after at most 10 ms. An ack is only sent after the delivery's
///   settlement is complete, so a crash never acks unfinished work.
/// - Retry and release republish the body (the retry's with `attempts + 1`,
///   so its `x-attempts` follows) and then ack the original; a dead-letter
///   record is published to the dead-letter queue, then the original acked:
///   the Python SDK's order. A crash between the two leaves a duplicate,
///   never a loss; the seen-set or the claim makes its effect single. The
///   delivery's out-of-band headers (a `traceparent`) travel with it.
/// - Every header of a delivery reaches the handler as a string, the contract
///   ones included, as Python's `pop` maps them.
/// - A refused declare or publish (a channel error) closes its channel
///   only; a nack (a full queue's `x-overflow: reject-publish`) and a
///   returned copy (a dead-letter queue deleted while the consumer runs)
///   close nothing. Each fails the settlement, counted in the consumer's
///   `broker_errors` and tried again with backoff (a deleted queue is
///   declared again on the next try), and the connection and its
///   deliveries stay. The delivery is not acked, and stays in its queue,
///   until its copy is in a queue.
/// - A message whose properties lapin cannot parse (a header name or a
///   `message_id` that is not UTF-8) fails lapin's whole connection. The
///   transport then takes it off the head of the queue with a minimal client
///   of its own that reads frames by their length alone, copies its body,
///   byte for byte, to `<queue>.dlq` with the headers
///   `x-babel-idem-original-queue` and `x-babel-idem-dead-letter-reason`,
///   and acks it; the messages behind it run on the next connection.
/// - A delivery whose headers nest tables or arrays deeper than 16 levels is
///   copied to `<queue>.dlq` the same way and acked, never handed to the
///   consumer. The transport checks every content header before lapin
///   parses it, with a walk that does not recurse: headers nested deeper
///   reach lapin as one header, `x-babel-idem-unreadable-headers`, so no
///   depth can exhaust the stack of lapin's I/O thread.
/// - A dropped connection is re-opened by the next operation (with backoff,
///   [`reconnect_attempts`](TransportBuilder::reconnect_attempts) times,
///   and the consumer's own backoff beyond). The broker puts every unacked
///   delivery of the lost connection back; settling one of them afterwards
///   touches nothing and answers `Ok(false)` (counted as lapsed). The broker
///   does not answer an ack, so one written before the client has seen the
///   connection close counts as acked, and its delivery comes back all the
///   same: the seen-set or the claim makes that a skip.
///
/// Plain `amqp://` only: this build has no TLS.
///
/// ```no_run
/// use babel_idem::transport::AmqpTransport;
///
/// # async fn run() -> Result<(), babel_idem::transport::TransportError> {
/// let transport = AmqpTransport::builder()
///     .prefetch(64)
///     .connect("amqp://guest:guest@127.0.0.1:5672/%2f")
///     .await?;
/// transport.publish("orders", br#"{"job": "urn:babel:orders:created"}"#).await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct AmqpTransport {
    sessions: Arc<Sessions>,
    reserve_wait: Duration,
    consumer_timeout: Option<Duration>,
}

/// Configures an [`AmqpTransport`]; made by [`AmqpTransport::builder`]. The
/// settings every binding shares are [`TransportBuilder`]'s; the AMQP
/// binding's own are [`prefetch`](TransportBuilder::prefetch),
/// [`reserve_wait`](TransportBuilder::reserve_wait),
/// [`consumer_timeout`](TransportBuilder::consumer_timeout) and
/// [`no_consumer_timeout`](TransportBuilder::no_consumer_timeout).
pub type AmqpTransportBuilder = TransportBuilder<AmqpOptions>;

/// The AMQP binding's own settings in an [`AmqpTransportBuilder`], set by its
/// [`prefetch`](TransportBuilder::prefetch),
/// [`reserve_wait`](TransportBuilder::reserve_wait) and
/// [`consumer_timeout`](TransportBuilder::consumer_timeout).
#[derive(Debug, Clone)]
pub struct AmqpOptions {
    prefetch: u16,
    reserve_wait: Duration,
    consumer_timeout: Option<Duration>,
}

impl Default for AmqpOptions {
    fn default() -> Self {
        AmqpOptions {
            prefetch: 64,
            reserve_wait: Duration::from_millis(200),
            consumer_timeout: Some(RABBITMQ_CONSUMER_TIMEOUT),
        }
    }
}

/// RabbitMQ's own default `consumer_timeout` (since 3.8.15).
const RABBITMQ_CONSUMER_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// What [`AmqpTransport`] needs to settle one delivery: its acker on the
/// channel it came on, the connection it came on, and its headers.
pub struct AmqpHandle {
    generation: u64,
    queue: Arc<str>,
    acker: Acker,
    acks: Arc<AckWindow<Acker>>,
    delivery_tag: u64,
    redelivered: bool,
    headers: FieldTable,
}

impl AmqpHandle {
    /// The delivery tag on its channel.
    pub fn delivery_tag(&self) -> u64 {
        self.delivery_tag
    }

    /// Whether the broker flagged the delivery as a redelivery (it was
    /// delivered before and not acked: a lost connection, a nack).
    pub fn redelivered(&self) -> bool {
        self.redelivered
    }
}

impl fmt::Debug for AmqpHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AmqpHandle")
            .field("queue", &self.queue)
            .field("delivery_tag", &self.delivery_tag)
            .field("redelivered", &self.redelivered)
            .finish_non_exhaustive()
    }
}

impl TransportBuilder<AmqpOptions> {
    /// How many deliveries the broker pushes ahead of their acks (`basic.qos`
    /// per consumer; default 64, at least 1). Keep it at or above the
    /// consumer's concurrency, or handlers wait for deliveries.
    pub fn prefetch(self, prefetch: u16) -> Self {
        self.with_options(|options| options.prefetch = prefetch.max(1))
    }

    /// How long [`reserve`](Transport::reserve) waits for the broker to push
    /// a first delivery before it answers "empty" (default 200 ms). Longer
    /// saves idle polls; a graceful stop may wait this long once.
    pub fn reserve_wait(self, wait: Duration) -> Self {
        self.with_options(|options| options.reserve_wait = wait)
    }

    /// The broker's delivery acknowledgement timeout (RabbitMQ's
    /// `consumer_timeout`, or a queue's `x-consumer-timeout`; default 30
    /// minutes, RabbitMQ's own): a delivery unacked for longer closes its
    /// channel, and the broker delivers it again. It is the transport's
    /// [`reservation_lifetime`](Transport::reservation_lifetime), so a
    /// consumer whose retry backoff is as long is refused when it is built.
    ///
    /// ```no_run
    /// use babel_idem::transport::{AmqpTransport, Transport};
    /// use std::time::Duration;
    ///
    /// # async fn run() -> Result<(), babel_idem::transport::TransportError> {
    /// // A broker configured with `consumer_timeout = 300000` (5 minutes).
    /// let transport = AmqpTransport::builder()
    ///     .consumer_timeout(Duration::from_secs(300))
    ///     .connect("amqp://guest:guest@127.0.0.1:5672/%2f")
    ///     .await?;
    /// assert_eq!(transport.reservation_lifetime(), Some(Duration::from_secs(300)));
    /// # Ok(())
    /// # }
    /// ```
    pub fn consumer_timeout(self, timeout: Duration) -> Self {
        self.with_options(|options| options.consumer_timeout = Some(timeout))
    }

    /// The broker has no delivery acknowledgement timeout
    /// (`consumer_timeout = 0` or `undefined`): a delivery stays with its
    /// channel until it is settled.
    pub fn no_consumer_timeout(self) -> Self {
        self.with_options(|options| options.consumer_timeout = None)
    }

    /// Connects to `url` (`amqp://user:password@host:port/vhost`, the vhost
    /// percent-encoded: `%2f` for `/`). Fails at once, with an error that
    /// says why, on a malformed URL, an `amqps://` URL (no TLS in this build)
    /// or a broker that cannot be reached or refuses the login. Must be
    /// called inside a Tokio runtime.
    ///
    /// ```
    /// use babel_idem::transport::{AmqpTransport, TransportError};
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// // A malformed URL is refused before anything connects.
    /// let error = AmqpTransport::connect("amqp://127.0.0.1:notaport/%2f").await.unwrap_err();
    /// assert!(matches!(error, TransportError::InvalidUrl { .. }), "{error}");
    /// # });
    /// ```
    pub async fn connect(self, url: &str) -> Result<AmqpTransport, TransportError> {
        let uri = parse_url(url)?;
        let connector = Connector {
            uri,
            prefetch: self.options.prefetch,
            timeout: self.timeout,
            reconnect_attempts: self.reconnect_attempts,
        };
        let sessions = Sessions::open(connector).await?;
        Ok(AmqpTransport {
            sessions: Arc::new(sessions),
            reserve_wait: self.options.reserve_wait,
            consumer_timeout: self.options.consumer_timeout,
        })
    }
}

impl AmqpTransport {
    /// A transport with the default settings; see `connect`
    /// on [`AmqpTransportBuilder`].
    pub async fn connect(url: &str) -> Result<Self, TransportError> {
        Self::builder().connect(url).await
    }

    /// Configures a transport: prefetch, timeouts, reconnects.
    pub fn builder() -> AmqpTransportBuilder {
        AmqpTransportBuilder::default()
    }

    /// Publishes `body` to `queue` (declared durable on first use unless it
    /// exists) with the
    /// contract's properties and headers, persistent, and waits for the
    /// broker's confirm: the Python SDK's `publish`. A message no queue
    /// took is [`TransportError::Unroutable`] (the queue was deleted since
    /// it was declared; the next publish declares it again), a nack
    /// [`TransportError::Backpressure`].
    pub async fn publish(&self, queue: &str, body: &[u8]) -> Result<(), TransportError> {
        self.publish_many(queue, std::slice::from_ref(&body)).await
    }

    /// Publishes `body` with out-of-band headers (a `traceparent`,
    /// `bq-replay-bypass`) in the AMQP header table beside the contract ones,
    /// which win a collision: the Python SDK's `publish_with_headers`. Blank
    /// names and values are dropped.
    pub async fn publish_with_headers(
        &self,
        queue: &str,
        body: &[u8],
        headers: &[(String, String)],
    ) -> Result<(), TransportError> {
        self.check_queue(queue)?;
        let table = properties::table(headers);
        self.sessions
            .publish(queue, std::iter::once((body, &table)), None)
            .await
    }

    /// Publishes every body of `bodies` to `queue` as [`publish`](Self::publish)
    /// does, then waits for all their confirms at once: one round trip for
    /// the batch instead of one per message. An error is the first body's
    /// that was not taken; the others may have been.
    pub async fn publish_many<B: AsRef<[u8]>>(
        &self,
        queue: &str,
        bodies: &[B],
    ) -> Result<(), TransportError> {
        self.check_queue(queue)?;
        let none = FieldTable::default();
        self.sessions
            .publish(queue, bodies.iter().map(|b| (b.as_ref(), &none)), None)
            .await
    }

    /// How many connections to the broker this transport has opened, the
    /// first one included: each one after the first replaced a lost
    /// connection.
    ///
    /// ```no_run
    /// use babel_idem::transport::AmqpTransport;
    ///
    /// # async fn run() -> Result<(), babel_idem::transport::TransportError> {
    /// let transport = AmqpTransport::connect("amqp://guest:guest@127.0.0.1:5672/%2f").await?;
    /// assert_eq!(transport.connections_opened(), 1);
    /// # Ok(())
    /// # }
    /// ```
    pub fn connections_opened(&self) -> u64 {
        self.sessions.connections()
    }

    /// Deletes `queue` and the messages it holds (for tools and tests); the
    /// next publish to it declares it again.
    pub async fn delete_queue(&self, queue: &str) -> Result<(), TransportError> {
        self.check_queue(queue)?;
        self.sessions
            .with_channel(|channel| async move {
                channel
                    .queue_delete(queue.into(), QueueDeleteOptions::default())
                    .await
                    .map(drop)
            })
            .await?;
        // The next publish to it declares it again.
        self.sessions.forget(queue).await;
        Ok(())
    }

    /// Closes the connection: deliveries pushed but not yet reserved, and
    /// reservations not settled, go back to the queue at once. The next
    /// operation connects again.
    pub async fn close(&self) {
        self.sessions.close().await;
    }

    async fn reserve_batch(
        &self,
        queue: &str,
        max: usize,
    ) -> Result<Vec<Reserved<AmqpHandle>>, TransportError> {
        let (generation, acks, deliveries) =
            self.sessions.take(queue, max, self.reserve_wait).await?;
        let queue: Arc<str> = Arc::from(queue);
        let mut reserved = Vec::with_capacity(deliveries.len());
        for delivery in deliveries {
            let unrepresentable = properties::unrepresentable(&delivery.properties);
            let mut handle = AmqpHandle {
                generation,
                queue: Arc::clone(&queue),
                acker: delivery.acker,
                acks: Arc::clone(&acks),
                delivery_tag: delivery.delivery_tag,
                redelivered: delivery.redelivered,
                headers: FieldTable::default(),
            };
            match unrepresentable {
                None => {
                    handle.headers = properties::out_of_band(&delivery.properties);
                    reserved.push(Reserved {
                        headers: properties::as_strings(&delivery.properties),
                        attempts: None,
                        poison: false,
                        handle,
                        body: delivery.data,
                    });
                }
                Some(reason) => {
                    self.dead_letter_unrepresentable(handle, delivery.data, &reason)
                        .await
                }
            }
        }
        Ok(reserved)
    }

    /// Copies a delivery the transport cannot hand over, body byte for byte,
    /// to `<queue>.dlq` with headers saying why, then acks it. A failure
    /// leaves it with the broker, which delivers it again once its channel
    /// is gone.
    async fn dead_letter_unrepresentable(
        &self,
        mut handle: AmqpHandle,
        body: Vec<u8>,
        reason: &str,
    ) {
        tracing::warn!(
            queue = &*handle.queue,
            %reason,
            "babel-idem: dead-lettering a delivery the transport cannot hand over"
        );
        let dead_letter_properties = properties::dead_letter(&handle.queue, reason);
        if let Some(headers) = dead_letter_properties.headers() {
            handle.headers = headers.clone();
        }
        let settlement = Settlement::DeadLetter {
            queue: format!("{}.dlq", handle.queue),
            body,
        };
        if let Err(error) = self.settle_one(&handle, &settlement).await {
            tracing::warn!(
                queue = &*handle.queue,
                %error,
                "babel-idem: dead-lettering failed; the broker delivers the message again"
            );
            self.sessions.discard(handle.generation).await;
        }
    }

    async fn settle_one(
        &self,
        handle: &AmqpHandle,
        settlement: &Settlement,
    ) -> Result<bool, TransportError> {
        if let Some((target, body)) = settlement.destination(&handle.queue) {
            // Publish first, on the delivery's own connection: once that is
            // gone the broker has put the delivery back, and a copy
            // published now would be a second one.
            let published = self
                .sessions
                .publish(
                    target,
                    std::iter::once((body, &handle.headers)),
                    Some(handle.generation),
                )
                .await;
            // A copy no queue took (its queue deleted since it was
            // declared) or a nack is an error like any other: the original
            // is not acked, and the next try declares the queue again.
            match published {
                Err(error) if self.sessions.is_gone(handle.generation) => {
                    return Ok(self.lapsed(handle, &error));
                }
                Err(error) => return Err(error),
                Ok(()) => {}
            }
        }
        // With the deliveries that settle beside it, in one `multiple` ack
        // where they can share one. Bounded: an ack on a connection whose
        // I/O loop has died may never be answered.
        let ack = handle.acks.ack(handle.delivery_tag, &handle.acker);
        match tokio::time::timeout(self.sessions.timeout(), ack).await {
            Ok(Ok(Acked::Sent)) => Ok(true),
            Ok(Ok(Acked::ChannelGone)) => {
                Ok(self.lapsed(handle, &"the delivery's channel is gone"))
            }
            Ok(Err(error)) => {
                // The channel or connection failed: the broker takes the
                // delivery back once it sees it closed, so make sure it is.
                self.sessions.discard(handle.generation).await;
                Ok(self.lapsed(handle, &error))
            }
            Err(_) => {
                self.sessions.discard(handle.generation).await;
                Ok(self.lapsed(handle, &"the ack was not sent in time"))
            }
        }
    }

    fn lapsed(&self, handle: &AmqpHandle, cause: &dyn fmt::Display) -> bool {
        tracing::warn!(
            queue = &*handle.queue,
            %cause,
            "babel-idem: the AMQP connection of this delivery was lost before it was settled; the broker delivers it again. Nothing was touched."
        );
        false
    }
}

impl Transport for AmqpTransport {
    type Handle = AmqpHandle;

    /// A queue name must be non-empty and at most 255 bytes (an AMQP short
    /// string), with no control characters; names starting with `amq.` are
    /// the broker's own.
    fn check_queue(&self, queue: &str) -> Result<(), TransportError> {
        QUEUE_NAMES.check(queue)
    }

    /// The builder's [`consumer_timeout`](TransportBuilder::consumer_timeout):
    /// 30 minutes unless set, `None` with
    /// [`no_consumer_timeout`](TransportBuilder::no_consumer_timeout).
    fn reservation_lifetime(&self) -> Option<Duration> {
        self.consumer_timeout
    }

    fn reserve<'a>(
        &'a self,
        queue: &'a str,
        max: usize,
    ) -> TransportFuture<'a, Vec<Reserved<AmqpHandle>>> {
        Box::pin(async move {
            if max == 0 {
                return Ok(Vec::new());
            }
            self.reserve_batch(queue, max).await
        })
    }

    fn settle<'a>(
        &'a self,
        handle: &'a AmqpHandle,
        settlement: &'a Settlement,
    ) -> TransportFuture<'a, bool> {
        Box::pin(self.settle_one(handle, settlement))
    }
}

impl fmt::Debug for AmqpTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AmqpTransport")
            .field("reserve_wait", &self.reserve_wait)
            .field("consumer_timeout", &self.consumer_timeout)
            .finish_non_exhaustive()
    }
}

/// Parses an `amqp://` URL; the reason says what is wrong with it.
fn parse_url(url: &str) -> Result<AMQPUri, TransportError> {
    let invalid = |reason: String| TransportError::invalid_url(url, reason);
    if !(url.starts_with("amqp://") || url.starts_with("amqps://")) {
        return Err(invalid(
            "expected amqp://user:password@host:port/vhost".to_owned(),
        ));
    }
    super::binding::check_credentials(url)?;
    let uri: AMQPUri = url.parse().map_err(invalid)?;
    if uri.scheme == AMQPScheme::AMQPS {
        return Err(invalid(
            "amqps:// needs TLS, which this build of babel-idem does not include".to_owned(),
        ));
    }
    Ok(uri)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_names_amqp_cannot_hold_are_refused() {
        for bad in ["", "line\nbreak", "amq.gen-1"] {
            assert!(QUEUE_NAMES.check(bad).is_err(), "{bad:?}");
        }
        assert!(QUEUE_NAMES.check(&"q".repeat(256)).is_err());
        for good in [
            "orders",
            "orders.dlq",
            "queues:orders",
            "é-queue",
            "two words",
        ] {
            QUEUE_NAMES.check(good).unwrap();
        }
    }

    #[test]
    fn urls_are_checked_before_connecting() {
        let uri = parse_url("amqp://guest:guest@127.0.0.1:5672/%2f").unwrap();
        assert_eq!(uri.vhost, "/");
        assert_eq!(uri.authority.port, 5672);
        for bad in [
            "not a url",
            "redis://127.0.0.1/",
            "amqp://127.0.0.1:notaport/%2f",
            "amqps://127.0.0.1/%2f",
        ] {
            let error = parse_url(bad).unwrap_err();
            assert!(matches!(error, TransportError::InvalidUrl { .. }), "{bad}");
        }
        let secret = parse_url("amqps://user:secret@h/%2f").unwrap_err();
        assert!(!secret.to_string().contains("secret"), "{secret}");
    }
}
