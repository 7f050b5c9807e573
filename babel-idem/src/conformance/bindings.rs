//! The broker-binding blocks: `redis` (payload identity), `rabbitmq`
//! (property projection) and `kafka` (header projection, attempts
//! reconciliation), checked offline against the encoding and the
//! projection the transports publish with. The live round trips are the
//! transports' own tests; these lock what the suite states statically.
//!
//! A block whose binding this build lacks (its feature is off, or
//! babel-idem has no such binding) is reported as not applicable, by name.

use serde_json::{Map, Value};

use super::manifest::{KafkaProjection, PayloadIdentity, PropertyProjection, ReconciliationCase};
use super::report::CaseOutcome;

/// The blocks of the upstream suite that name a broker binding or a layer
/// babel-idem does not implement, with what a report says of each.
pub(super) const NOT_IMPLEMENTED: [(&str, &str); 4] = [
    ("sqs", "babel-idem has no Amazon SQS binding"),
    ("asb", "babel-idem has no Azure Service Bus binding"),
    ("pulsar", "babel-idem has no Apache Pulsar binding"),
    ("artemis", "babel-idem has no ActiveMQ Artemis binding"),
];

/// `redis.payload_identity`: the queue element is the envelope byte for
/// byte (no frame when no header travels), and reserving it gives back the
/// same bytes with no header.
#[cfg(feature = "redis-transport")]
pub(super) fn redis_payload_identity(
    _: &PayloadIdentity,
    envelope: &[u8],
) -> Result<CaseOutcome, &'static str> {
    use crate::transport::redis::frame;

    let mut problems = Vec::new();
    match frame::frame(envelope, &[]) {
        Some(stored) if stored == envelope => {
            let (body, headers) = frame::unframe(stored);
            if body != envelope {
                problems.push("reserve changed the stored bytes".to_owned());
            }
            if !headers.is_empty() {
                problems.push(format!(
                    "reserve found headers in a bare envelope: {headers:?}"
                ));
            }
        }
        Some(_) => problems.push("produce stores other bytes than the envelope".to_owned()),
        None => problems.push("produce cannot store the envelope".to_owned()),
    }
    Ok(CaseOutcome::from_problems(
        super::report::Block::Redis,
        "payload_identity",
        problems,
    ))
}

/// Without the Redis binding: why the block is not applicable.
#[cfg(not(feature = "redis-transport"))]
pub(super) fn redis_payload_identity(
    _: &PayloadIdentity,
    _: &[u8],
) -> Result<CaseOutcome, &'static str> {
    Err("built without the feature redis-transport")
}

/// `rabbitmq.property_projection`: the AMQP properties and the native-typed
/// headers published with the envelope equal the block's, each of them.
#[cfg(feature = "amqp-transport")]
pub(super) fn rabbitmq_property_projection(
    expected: &PropertyProjection,
    envelope: &[u8],
) -> Result<CaseOutcome, &'static str> {
    use crate::transport::amqp::properties;
    use lapin::types::{AMQPValue, FieldTable};

    let published = properties::for_body(envelope, &FieldTable::default());
    let text =
        |value: Option<&lapin::types::ShortString>| value.map(|value| Value::from(value.as_str()));
    let mut problems = Vec::new();
    for (name, want) in &expected.properties {
        let got = match name.as_str() {
            "type" => text(published.kind().as_ref()),
            "correlation_id" => text(published.correlation_id().as_ref()),
            "message_id" => text(published.message_id().as_ref()),
            "app_id" => text(published.app_id().as_ref()),
            "content_type" => text(published.content_type().as_ref()),
            "content_encoding" => text(published.content_encoding().as_ref()),
            "delivery_mode" => published.delivery_mode().map(Value::from),
            other => {
                problems.push(format!("property {other:?} is not one this runner knows"));
                continue;
            }
        };
        if got.as_ref() != Some(want) {
            problems.push(format!(
                "property {name}: expected {want}, published {got:?}"
            ));
        }
    }
    let headers = published.headers().clone().unwrap_or_default();
    for (name, want) in &expected.headers {
        let got = headers.inner().get(name.as_str());
        // Native-typed: a number stays an integer header, a string a long string.
        let matches = match (got, want) {
            (Some(AMQPValue::LongString(got)), Value::String(want)) => {
                got.as_bytes() == want.as_bytes()
            }
            (Some(got), Value::Number(want)) => integer(got).is_some_and(|got| {
                want.as_i64() == Some(got)
                    || want
                        .as_u64()
                        .is_some_and(|want| Some(want) == u64::try_from(got).ok())
            }),
            _ => false,
        };
        if !matches {
            problems.push(format!("header {name}: expected {want}, published {got:?}"));
        }
    }
    Ok(CaseOutcome::from_problems(
        super::report::Block::Rabbitmq,
        "property_projection",
        problems,
    ))
}

/// An AMQP header value that is an integer of any width.
#[cfg(feature = "amqp-transport")]
fn integer(value: &lapin::types::AMQPValue) -> Option<i64> {
    use lapin::types::AMQPValue;
    match *value {
        AMQPValue::ShortShortInt(n) => Some(n.into()),
        AMQPValue::ShortShortUInt(n) => Some(n.into()),
        AMQPValue::ShortInt(n) => Some(n.into()),
        AMQPValue::ShortUInt(n) => Some(n.into()),
        AMQPValue::LongInt(n) => Some(n.into()),
        AMQPValue::LongUInt(n) => Some(n.into()),
        AMQPValue::LongLongInt(n) => Some(n),
        _ => None,
    }
}

/// Without the RabbitMQ binding: why the block is not applicable.
#[cfg(not(feature = "amqp-transport"))]
pub(super) fn rabbitmq_property_projection(
    _: &PropertyProjection,
    _: &[u8],
) -> Result<CaseOutcome, &'static str> {
    Err("built without the feature amqp-transport")
}

/// `kafka.property_projection`: the headers the binding writes beside the
/// envelope equal the block's, each of them, and no `bq-` header beyond
/// them; the record timestamp is `meta.created_at`.
#[cfg(feature = "kafka-transport")]
pub(super) fn kafka_property_projection(
    expected: &KafkaProjection,
    envelope: &[u8],
) -> Result<CaseOutcome, &'static str> {
    use crate::transport::kafka::headers;

    let written = headers::projection(envelope);
    let mut problems = Vec::new();
    for (name, want) in &expected.headers {
        let got = written.iter().find(|(key, _)| key == name).map(|(_, v)| v);
        match (got, want.as_str()) {
            (Some(got), Some(want)) if got == want => {}
            _ => problems.push(format!("header {name}: expected {want}, written {got:?}")),
        }
    }
    for (name, value) in &written {
        if !expected.headers.contains_key(*name) {
            problems.push(format!(
                "header {name}: written ({value:?}) but not in the block"
            ));
        }
    }
    let created_at = serde_json::from_slice::<Value>(envelope)
        .ok()
        .and_then(|envelope| envelope.pointer("/meta/created_at").and_then(Value::as_i64));
    if created_at.is_some() && headers::timestamp(envelope) != created_at {
        problems.push(format!(
            "record timestamp: expected meta.created_at {created_at:?}, written {:?}",
            headers::timestamp(envelope)
        ));
    }
    Ok(CaseOutcome::from_problems(
        super::report::Block::Kafka,
        "property_projection",
        problems,
    ))
}

/// Without the Kafka binding: why the block is not applicable.
#[cfg(not(feature = "kafka-transport"))]
pub(super) fn kafka_property_projection(
    _: &KafkaProjection,
    _: &[u8],
) -> Result<CaseOutcome, &'static str> {
    Err("built without the feature kafka-transport")
}

/// One `kafka.attempts_reconciliation` case: a record whose body says
/// `body_attempts` and whose `bq-attempts` header (absent when `null`)
/// says `header_attempts` is dispatched with `expected_attempts`. Runs the
/// binding's own path: the header read into the reservation, and dispatch
/// counting with it over the body's.
#[cfg(feature = "kafka-transport")]
pub(super) fn kafka_attempts_reconciliation(
    case: &ReconciliationCase,
) -> Result<CaseOutcome, &'static str> {
    use crate::router::Delivery;
    use crate::transport::kafka::headers;

    let header = case.header_attempts.map(|n| n.to_string());
    let record_headers = header
        .as_deref()
        .map(|value| (headers::ATTEMPTS, value.as_bytes()));
    let counted = match headers::attempts(record_headers.into_iter()) {
        Some(attempts) => Delivery::new().with_attempts(attempts),
        None => Delivery::new(),
    };
    let dispatched = counted.transport_attempts().unwrap_or(case.body_attempts);
    let problems = if dispatched == case.expected_attempts {
        Vec::new()
    } else {
        vec![format!(
            "body {} with header {:?}: dispatched with {dispatched}, expected {}",
            case.body_attempts, case.header_attempts, case.expected_attempts
        )]
    };
    Ok(CaseOutcome::from_problems(
        super::report::Block::Kafka,
        &format!("attempts_reconciliation/{}", case.name),
        problems,
    ))
}

/// Without the Kafka binding: why the block is not applicable.
#[cfg(not(feature = "kafka-transport"))]
pub(super) fn kafka_attempts_reconciliation(
    _: &ReconciliationCase,
) -> Result<CaseOutcome, &'static str> {
    Err("built without the feature kafka-transport")
}

/// The names of a manifest's top-level blocks that this runner does not
/// read, in name order, without its prose keys.
pub(super) fn other_blocks(rest: &Map<String, Value>) -> impl Iterator<Item = &str> {
    rest.keys()
        .map(String::as_str)
        .filter(|key| !matches!(*key, "description" | "schema_version" | "$schema"))
}
