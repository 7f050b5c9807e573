//! [`KafkaTransport`]: the BabelQueue Apache Kafka binding (feature
//! `kafka-transport`), byte-compatible with the Python SDK's
//! `babelqueue.kafka_transport` and `kafka_retry` (1.24), on librdkafka.
//!
//! # Layout
//!
//! | where | what |
//! |---|---|
//! | topic `<queue>` | work records; the value is the envelope byte for byte |
//! | headers `bq-job`, `bq-trace-id`, `bq-message-id`, `bq-schema-version`, `bq-source-lang`, `bq-attempts` | the envelope's projection, UTF-8 text; `bq-attempts` is authoritative on consume |
//! | record timestamp | `meta.created_at` (Unix ms) |
//! | record key | kept as written on every settle write (retry, dead letter, redrive); never made up |
//! | topics `<queue>.retry.<n>` | [`RetryTiers`]: records parked for tier `n`'s delay, with `bq-delay` (ms) and `bq-original-topic` |
//! | topic `<queue>.dlq` | dead-letter records |
//! | consumer group `babelqueue` | the workers' offsets; `babelqueue-retry-reinject` the re-injector's |
//!
//! Topics are not created by the binding: create them (work, `.dlq`, and
//! each tier's) as the cluster's owner does.
//!
//! # Delivery
//!
//! - A record is reserved by polling; its offset is committed only once it
//!   is settled, and a partition's committed offset never passes its
//!   lowest unsettled record.
//! - Records with the same key run one at a time, in order; different
//!   keys of a partition run side by side, up to the consumer's
//!   concurrency.
//! - A settle that writes (a retry, a dead letter) waits for the broker's
//!   delivery report before the offset may move; a failed write leaves the
//!   record unsettled, and the consumer tries the settle again.
//! - On a rebalance, what is settled is committed before a partition is
//!   given up; what is not is dropped uncommitted, for its next owner.

mod consume;
mod ledger;
mod produce;
mod publish;
mod url;

mod dead_letters;
mod delayed;
pub(crate) mod headers;
mod reinject;
mod tiers;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::producer::FutureProducer;

use self::consume::Consumers;
use super::TransportBuilder;
use super::binding::QueueNames;
use crate::broker::TransportError;

pub use self::consume::KafkaHandle;
pub use self::dead_letters::DeadLetterHandle;
pub use self::delayed::DelayError;
pub use self::reinject::{DEFAULT_REINJECT_GROUP, ReinjectError, Reinjector, ReinjectorBuilder};
pub use self::tiers::{DEFAULT_RETRY_TIERS, RetryTiers, TierError};

/// `Ok` when `topic` follows Kafka's rules for a topic name, else the
/// first it breaks ([`TransportError::InvalidQueue`]).
fn check_topic(topic: &str) -> Result<(), TransportError> {
    QUEUE_NAMES.check(topic)
}

/// The topic names Kafka can hold: 1 to 249 characters of `a-z A-Z 0-9 .
/// _ -`, and neither `.` nor `..`.
const QUEUE_NAMES: QueueNames = QueueNames {
    max_len: 249,
    too_long: "a Kafka topic name is at most 249 characters",
    refused: |c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')),
    refused_reason: "a Kafka topic name holds only a-z, A-Z, 0-9, '.', '_' and '-'",
    own_rule: |queue| {
        matches!(queue, "." | "..").then_some("'.' and '..' are not Kafka topic names")
    },
};

/// The consumer group the workers share, as in every SDK of the family.
pub const DEFAULT_GROUP: &str = "babelqueue";

/// How long a settle write waits for the broker's delivery report: the
/// Python SDK's default (30 s).
const DEFAULT_DELIVERY_TIMEOUT: Duration = Duration::from_secs(30);

/// How long the group waits for a silent member before it rebalances its
/// partitions away: short, so a worker that died hands its partitions on
/// within seconds.
const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(6);

/// The Kafka binding's own settings; set through [`KafkaTransportBuilder`].
#[derive(Debug, Clone)]
pub struct KafkaOptions {
    group: String,
    tiers: RetryTiers,
    delivery_timeout: Duration,
    session_timeout: Duration,
    client: Vec<(String, String)>,
}

impl Default for KafkaOptions {
    fn default() -> Self {
        KafkaOptions {
            group: DEFAULT_GROUP.to_owned(),
            tiers: RetryTiers::none(),
            delivery_timeout: DEFAULT_DELIVERY_TIMEOUT,
            session_timeout: DEFAULT_SESSION_TIMEOUT,
            client: Vec::new(),
        }
    }
}

/// Configures a [`KafkaTransport`]; made by [`KafkaTransport::builder`].
///
/// ```no_run
/// use babel_idem::transport::KafkaTransport;
/// use babel_idem::transport::kafka::RetryTiers;
///
/// # async fn run() -> Result<(), babel_idem::transport::TransportError> {
/// let transport = KafkaTransport::builder()
///     .group("billing")
///     .retry_tiers(RetryTiers::recommended())
///     .client_setting("client.id", "billing-worker")
///     .connect("kafka://127.0.0.1:9092")
///     .await?;
/// # let _ = transport;
/// # Ok(())
/// # }
/// ```
pub type KafkaTransportBuilder = TransportBuilder<KafkaOptions>;

impl TransportBuilder<KafkaOptions> {
    /// The consumer group (default [`DEFAULT_GROUP`], `babelqueue`).
    pub fn group(self, group: impl Into<String>) -> Self {
        let group = group.into();
        self.with_options(|options| options.group = group)
    }

    /// The retry tiers (default none: a retry goes straight back to the
    /// work topic). The re-injector must be given the same tiers.
    pub fn retry_tiers(self, tiers: RetryTiers) -> Self {
        self.with_options(|options| options.tiers = tiers)
    }

    /// How long a settle write waits for the broker's delivery report
    /// (default 30 s) before it fails and the record stays unsettled.
    pub fn delivery_timeout(self, timeout: Duration) -> Self {
        self.with_options(|options| options.delivery_timeout = timeout)
    }

    /// The group's session timeout (default 6 s): how long a silent worker
    /// keeps its partitions before the group hands them on.
    pub fn session_timeout(self, timeout: Duration) -> Self {
        self.with_options(|options| options.session_timeout = timeout)
    }

    /// A librdkafka setting for every client the transport makes (SASL,
    /// TLS, `client.id`); applied after the binding's own, so it wins.
    pub fn client_setting(self, name: impl Into<String>, value: impl Into<String>) -> Self {
        let setting = (name.into(), value.into());
        self.with_options(|options| options.client.push(setting))
    }

    /// Connects to the cluster `url` (`kafka://host:port[,host:port]`):
    /// makes the producer and checks that a broker answers within the
    /// timeout, asking again
    /// [`reconnect_attempts`](TransportBuilder::reconnect_attempts) times
    /// with backoff (librdkafka re-opens connections lost later on its
    /// own). Consumers are made per queue, on the first reserve.
    pub async fn connect(self, url: &str) -> Result<KafkaTransport, TransportError> {
        let settings = Settings {
            brokers: url::bootstrap_servers(url)?,
            timeout: self.timeout,
            options: self.options,
        };
        let producer: FutureProducer = settings
            .producer_config()
            .create()
            .map_err(|error| TransportError::Connect(Box::new(error)))?;
        // librdkafka re-opens lost connections on its own; the attempts
        // count here is how often a broker that does not answer yet is
        // asked again, with backoff, before connecting fails.
        let mut backoff = Duration::from_millis(50);
        let mut attempts_left = self.reconnect_attempts;
        loop {
            match produce::check_reachable(&producer, settings.timeout).await {
                Ok(()) => break,
                Err(error) if attempts_left == 0 => return Err(error),
                Err(_) => {
                    attempts_left -= 1;
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
            }
        }
        Ok(KafkaTransport {
            inner: Arc::new(Inner {
                settings,
                producer,
                consumers: Consumers::default(),
            }),
        })
    }
}

/// The BabelQueue Kafka binding: consumes work topics in a consumer group,
/// publishes envelopes with the `bq-` header projection, retries through
/// tier topics and dead-letters to `<queue>.dlq`. See the [module
/// docs](self) for the layout and the delivery rules.
///
/// ```no_run
/// use babel_idem::broker::Publisher;
/// use babel_idem::transport::KafkaTransport;
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let transport = KafkaTransport::connect("kafka://127.0.0.1:9092").await?;
/// transport
///     .publish_body("orders", br#"{"job":"urn:babel:orders:created"}"#, &[])
///     .await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct KafkaTransport {
    inner: Arc<Inner>,
}

struct Inner {
    settings: Settings,
    producer: FutureProducer,
    /// One group consumer per work topic, made on its first reserve;
    /// dropped with the transport, committing what is settled.
    consumers: Consumers,
}

impl fmt::Debug for KafkaTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaTransport")
            .field("brokers", &self.inner.settings.brokers)
            .field("group", &self.inner.settings.options.group)
            .finish_non_exhaustive()
    }
}

impl KafkaTransport {
    /// A builder with the default settings.
    pub fn builder() -> KafkaTransportBuilder {
        TransportBuilder::default()
    }

    /// Connects with the default settings; see
    /// [`KafkaTransportBuilder::connect`].
    pub async fn connect(url: &str) -> Result<Self, TransportError> {
        Self::builder().connect(url).await
    }

    /// The retry tiers this transport parks retries on.
    pub fn retry_tiers(&self) -> &RetryTiers {
        &self.inner.settings.options.tiers
    }

    /// The consumer group.
    pub fn group(&self) -> &str {
        &self.inner.settings.options.group
    }
}

/// What every client of one transport is made from.
#[derive(Debug, Clone)]
struct Settings {
    brokers: String,
    timeout: Duration,
    options: KafkaOptions,
}

impl Settings {
    /// The user's settings over `base`.
    fn with_user_settings(&self, mut base: ClientConfig) -> ClientConfig {
        for (name, value) in &self.options.client {
            base.set(name, value);
        }
        base
    }

    /// The producer's: idempotent (no duplicate or reordering from its
    /// own retries), every in-sync replica acknowledges, a delivery report
    /// within the delivery timeout.
    fn producer_config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", &self.brokers)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set(
                "message.timeout.ms",
                tiers::millis(self.options.delivery_timeout)
                    .max(1)
                    .to_string(),
            )
            .set(
                "socket.timeout.ms",
                tiers::millis(self.timeout).max(10).to_string(),
            );
        self.with_user_settings(config)
    }

    /// A consumer's in `group`: offsets committed by hand only, from the
    /// earliest record when the group has none, the session timeout.
    fn consumer_config(&self, group: &str) -> ClientConfig {
        let session = tiers::millis(self.options.session_timeout).max(1);
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", &self.brokers)
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .set("session.timeout.ms", session.to_string())
            .set("heartbeat.interval.ms", (session / 3).max(1).to_string())
            .set(
                "socket.timeout.ms",
                tiers::millis(self.timeout).max(10).to_string(),
            );
        self.with_user_settings(config)
    }
}

#[cfg(test)]
mod tests {
    use super::QUEUE_NAMES;

    #[test]
    fn topic_names_kafka_cannot_hold_are_refused() {
        for bad in ["", ".", "..", "a b", "a/b", "é", "a:b"] {
            assert!(QUEUE_NAMES.check(bad).is_err(), "{bad:?}");
        }
        assert!(QUEUE_NAMES.check(&"t".repeat(250)).is_err());
        for good in ["orders", "orders.dlq", "orders.retry.1", "a_b-C.9", "..."] {
            QUEUE_NAMES.check(good).unwrap();
        }
        QUEUE_NAMES.check(&"t".repeat(249)).unwrap();
    }
}
