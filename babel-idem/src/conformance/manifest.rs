//! The parts of a conformance `manifest.json` this runner reads: the envelope
//! `cases`, the `idempotency` block, the blocks of the bindings
//! babel-idem implements (`redis`, `rabbitmq`, `kafka`) and `payload_schema`.
//! The names of the other top-level blocks are kept, so the report can list
//! each as not applicable.

use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

/// The manifest, reduced to the blocks this runner checks.
#[derive(Debug, Deserialize)]
pub(super) struct Manifest {
    /// Absent and empty are told apart: an absent block is a manifest error.
    pub(super) cases: Option<Vec<EnvelopeCase>>,
    pub(super) idempotency: Option<Idempotency>,
    /// The Redis binding's block; absent in manifests older than it.
    #[serde(default)]
    pub(super) redis: Option<RedisBlock>,
    /// The RabbitMQ binding's block; absent in manifests older than it.
    #[serde(default)]
    pub(super) rabbitmq: Option<RabbitmqBlock>,
    /// The Kafka binding's block; absent in manifests older than it.
    #[serde(default)]
    pub(super) kafka: Option<KafkaBlock>,
    /// The payload schema block; absent in manifests older than it.
    #[serde(default)]
    pub(super) payload_schema: Option<PayloadSchemaBlock>,
    /// Every other top-level key: the prose, and the blocks of bindings
    /// this runner reports as not applicable.
    #[serde(flatten)]
    pub(super) rest: Map<String, Value>,
}

/// `payload_schema`: one schema, and data that must be valid or not
/// against it. Both are kept as their JSON text, so the check reads their
/// numbers and member order as the Python SDK reads them.
#[derive(Debug, Deserialize)]
pub(super) struct PayloadSchemaBlock {
    pub(super) schema: Box<RawValue>,
    #[serde(default)]
    pub(super) cases: Vec<PayloadSchemaCase>,
}

/// One `payload_schema` case.
#[derive(Debug, Deserialize)]
pub(super) struct PayloadSchemaCase {
    pub(super) name: String,
    pub(super) valid: bool,
    pub(super) data: Box<RawValue>,
    /// An extension of this repository's fixtures: the violation text (the
    /// Python SDK's `path: reason`) a `valid: false` case must report.
    /// Upstream manifests do not carry it, and other runners ignore it.
    #[serde(default)]
    pub(super) violation: Option<String>,
}

/// `redis`: the one static invariant of the Redis binding.
#[derive(Debug, Deserialize)]
pub(super) struct RedisBlock {
    pub(super) payload_identity: Option<PayloadIdentity>,
}

/// `redis.payload_identity`: the envelope that must be stored and reserved
/// byte for byte.
#[derive(Debug, Deserialize)]
pub(super) struct PayloadIdentity {
    pub(super) envelope_file: String,
}

/// `rabbitmq`: the RabbitMQ binding's property projection.
#[derive(Debug, Deserialize)]
pub(super) struct RabbitmqBlock {
    pub(super) property_projection: Option<PropertyProjection>,
}

/// `kafka`: the Kafka binding's header projection and its attempts
/// reconciliation.
#[derive(Debug, Deserialize)]
pub(super) struct KafkaBlock {
    pub(super) property_projection: Option<KafkaProjection>,
    pub(super) attempts_reconciliation: Option<Reconciliation>,
}

/// `kafka.property_projection`: the `bq-` record headers (UTF-8 text) a
/// producer writes beside the envelope.
#[derive(Debug, Deserialize)]
#[cfg_attr(
    not(feature = "kafka-transport"),
    allow(dead_code, reason = "only the Kafka binding compares them")
)]
pub(super) struct KafkaProjection {
    pub(super) envelope_file: String,
    #[serde(default)]
    pub(super) headers: Map<String, Value>,
}

/// `kafka.attempts_reconciliation`: the attempts a consumer counts with,
/// from the body's and the `bq-attempts` header's.
#[derive(Debug, Deserialize)]
pub(super) struct Reconciliation {
    #[serde(default)]
    pub(super) cases: Vec<ReconciliationCase>,
}

/// One reconciliation case; a `null` `header_attempts` is an absent header.
#[derive(Debug, Deserialize)]
#[cfg_attr(
    not(feature = "kafka-transport"),
    allow(dead_code, reason = "only the Kafka binding reconciles")
)]
pub(super) struct ReconciliationCase {
    pub(super) name: String,
    pub(super) body_attempts: u64,
    pub(super) header_attempts: Option<u64>,
    pub(super) expected_attempts: u64,
}

/// `rabbitmq.property_projection`: the AMQP properties and native-typed
/// headers a producer publishes the envelope with.
#[derive(Debug, Deserialize)]
#[cfg_attr(
    not(feature = "amqp-transport"),
    allow(dead_code, reason = "only the RabbitMQ binding compares them")
)]
pub(super) struct PropertyProjection {
    pub(super) envelope_file: String,
    #[serde(default)]
    pub(super) properties: Map<String, Value>,
    #[serde(default)]
    pub(super) headers: Map<String, Value>,
}

/// One entry of `cases`: a fixture file that must decode (and match `expect`)
/// or must be rejected.
#[derive(Debug, Deserialize)]
pub(super) struct EnvelopeCase {
    pub(super) name: String,
    pub(super) file: String,
    pub(super) valid: bool,
    #[serde(default)]
    pub(super) expect: Option<Expect>,
    /// The manifest's prose reason for a rejection; shown, never matched.
    #[serde(default)]
    pub(super) reason: Option<String>,
    /// An extension of this repository's fixtures: the rejection rule a
    /// `valid: false` case must trip, as [`super::rule_of`] names it.
    /// Upstream manifests do not carry it, and other runners ignore it.
    #[serde(default)]
    pub(super) rejected_by: Option<String>,
}

/// The values a valid envelope must decode to. Every field is optional; a
/// field the runner does not know lands in `unknown` and fails the case, so a
/// newer manifest is never passed without being checked.
#[derive(Debug, Deserialize)]
pub(super) struct Expect {
    pub(super) urn: Option<String>,
    pub(super) data: Option<Map<String, Value>>,
    pub(super) attempts: Option<u64>,
    pub(super) lang: Option<String>,
    pub(super) schema_version: Option<u64>,
    pub(super) dead_letter: Option<ExpectDeadLetter>,
    #[serde(flatten)]
    pub(super) unknown: Map<String, Value>,
}

/// The expected `dead_letter` block; each field is checked only when present.
#[derive(Debug, Deserialize)]
pub(super) struct ExpectDeadLetter {
    pub(super) reason: Option<String>,
    pub(super) error: Option<String>,
    pub(super) exception: Option<String>,
    pub(super) failed_at: Option<u64>,
    pub(super) original_queue: Option<String>,
    pub(super) attempts: Option<u64>,
    pub(super) lang: Option<String>,
    #[serde(flatten)]
    pub(super) unknown: Map<String, Value>,
}

/// The `idempotency` block: the dedupe key and the delivery sequences.
#[derive(Debug, Deserialize)]
pub(super) struct Idempotency {
    pub(super) dedup_key: Option<DedupKey>,
    pub(super) sequences: Option<Sequences>,
}

/// `idempotency.dedup_key`: which id a consumer must key its seen-set on.
#[derive(Debug, Deserialize)]
pub(super) struct DedupKey {
    pub(super) envelope_file: String,
    #[serde(default = "meta_id_field")]
    pub(super) key_field: String,
    pub(super) expected_key: String,
}

fn meta_id_field() -> String {
    "meta.id".to_owned()
}

/// `idempotency.sequences`.
#[derive(Debug, Deserialize)]
pub(super) struct Sequences {
    pub(super) cases: Vec<Sequence>,
}

/// One sequence: ordered deliveries through one wrapped handler and one store.
#[derive(Debug, Deserialize)]
pub(super) struct Sequence {
    pub(super) name: String,
    pub(super) deliveries: Vec<Delivery>,
    pub(super) expected_effects: u64,
}

/// One delivery of a sequence.
#[derive(Debug, Deserialize)]
pub(super) struct Delivery {
    /// Three states, because the envelope the runner builds differs for each:
    /// `None` (no `meta_id` key: no `meta.id` on the envelope), `Some(None)`
    /// (`"meta_id": null`: `"id": null`) and `Some(Some(id))`, `""` included.
    #[serde(default, deserialize_with = "present")]
    pub(super) meta_id: Option<Option<String>>,
    pub(super) expect_effect: Effect,
    /// The handler's result when it runs; a delivery without one succeeds.
    #[serde(default)]
    pub(super) outcome: Option<Outcome>,
    #[serde(default)]
    pub(super) forget_before: bool,
}

/// Whether the guard must invoke the handler for a delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum Effect {
    Run,
    Skip,
}

/// What the handler returns when it is invoked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum Outcome {
    Ok,
    Throw,
}

/// Reached only when the key is present, so a present `null` becomes
/// `Some(None)` while `#[serde(default)]` turns an absent key into `None`.
fn present<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Option<String>>, D::Error> {
    Option::<String>::deserialize(deserializer).map(Some)
}
