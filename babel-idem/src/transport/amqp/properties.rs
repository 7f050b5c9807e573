//! The AMQP properties and headers of a BabelQueue message, derived from its
//! body as the Python SDK's `PikaTransport._properties` derives them (1.24),
//! and the header table read back as the strings a handler sees.
//!
//! | property / header | value |
//! |---|---|
//! | `content_type`, `content_encoding` | `application/json`, `utf-8` |
//! | `delivery_mode` | 2 (persistent) |
//! | `message_id` | `meta.id` |
//! | `correlation_id` | `trace_id` |
//! | `type` | `job` (the URN) |
//! | `app_id` | `babelqueue` |
//! | header `x-schema-version` | `meta.schema_version` |
//! | header `x-source-lang` | `meta.lang` |
//! | header `x-attempts` | `attempts` (0 when absent) |
//!
//! Out-of-band headers (a `traceparent`, `bq-replay-bypass`) go in the same
//! table; the contract headers win a collision. A body that is not a JSON
//! object gets `content_type` and `delivery_mode` only, as in Python.

use std::collections::BTreeMap;

use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use serde_json::Value;

use super::header_guard::UNREADABLE_HEADERS;

/// The contract headers, recomputed from the body on every publish.
const CONTRACT_HEADERS: [&str; 3] = ["x-schema-version", "x-source-lang", "x-attempts"];

/// The properties to publish `body` with; `extra` are out-of-band headers
/// (kept as typed, so a republish carries a header as it came).
pub(crate) fn for_body(body: &[u8], extra: &FieldTable) -> BasicProperties {
    let persistent = BasicProperties::default()
        .with_content_type("application/json".into())
        .with_delivery_mode(2);
    let Ok(Value::Object(envelope)) = serde_json::from_slice::<Value>(body) else {
        return persistent;
    };
    let empty = serde_json::Map::new();
    let meta = match envelope.get("meta") {
        Some(Value::Object(meta)) => meta,
        _ => &empty,
    };
    let mut headers: BTreeMap<ShortString, AMQPValue> = extra
        .inner()
        .iter()
        .filter(|(name, value)| !name.as_str().is_empty() && !matches!(value, AMQPValue::Void))
        .map(|(name, value)| (name.clone(), value.clone()))
        .collect();
    let contract = [
        meta.get("schema_version").cloned(),
        meta.get("lang").cloned(),
        // Python: `envelope.get("attempts", 0)`.
        Some(envelope.get("attempts").cloned().unwrap_or(Value::from(0))),
    ];
    for (name, value) in CONTRACT_HEADERS.into_iter().zip(contract) {
        match value.as_ref().and_then(header_value) {
            Some(value) => headers.insert(name.into(), value),
            // A null contract value is left out, as Python filters `None`;
            // it must not let an out-of-band header of that name through.
            None => headers.remove(name),
        };
    }
    let mut properties = persistent
        .with_content_encoding("utf-8".into())
        .with_app_id("babelqueue".into())
        .with_headers(FieldTable::from(headers));
    if let Some(id) = short(meta.get("id")) {
        properties = properties.with_message_id(id);
    }
    if let Some(trace_id) = short(envelope.get("trace_id")) {
        properties = properties.with_correlation_id(trace_id);
    }
    if let Some(urn) = short(envelope.get("job")) {
        properties = properties.with_type(urn);
    }
    properties
}

/// The deepest nesting of tables and arrays a delivery's headers may have:
/// its out-of-band headers are copied onto every retry, release and
/// dead-letter record, and a copy of unbounded depth is unbounded work.
pub(super) const MAX_HEADER_DEPTH: usize = 16;

/// Why the transport cannot hand this delivery over, or `None` when it can:
/// its headers nest deeper than [`MAX_HEADER_DEPTH`].
pub(super) fn unrepresentable(properties: &BasicProperties) -> Option<String> {
    let headers = properties.headers().as_ref()?;
    // Put there, in place of the headers, when they nested deeper still.
    if let Some(why) = headers.inner().get(UNREADABLE_HEADERS) {
        return Some(match why {
            AMQPValue::LongString(why) => why.to_string(),
            _ => format!("its headers nest tables or arrays deeper than {MAX_HEADER_DEPTH}"),
        });
    }
    let too_deep = headers
        .inner()
        .values()
        .any(|value| !within_depth(value, MAX_HEADER_DEPTH));
    too_deep.then(|| format!("its headers nest tables or arrays deeper than {MAX_HEADER_DEPTH}"))
}

/// Whether `value` nests tables and arrays at most `depth` levels deep,
/// looking no deeper than that.
fn within_depth(value: &AMQPValue, depth: usize) -> bool {
    let mut inner: Box<dyn Iterator<Item = &AMQPValue>> = match value {
        AMQPValue::FieldTable(table) => Box::new(table.inner().values()),
        AMQPValue::FieldArray(array) => Box::new(array.as_slice().iter()),
        _ => return true,
    };
    depth > 0 && inner.all(|value| within_depth(value, depth - 1))
}

/// The properties of a message the transport copies to `<queue>.dlq`
/// because it cannot hand it over: persistent, with headers naming the
/// queue it came from and why.
pub(super) fn dead_letter(queue: &str, reason: &str) -> BasicProperties {
    let mut headers = FieldTable::default();
    headers.insert(
        DEAD_LETTER_QUEUE_HEADER.into(),
        AMQPValue::LongString(queue.into()),
    );
    headers.insert(
        DEAD_LETTER_REASON_HEADER.into(),
        AMQPValue::LongString(reason.into()),
    );
    BasicProperties::default()
        .with_delivery_mode(2)
        .with_headers(headers)
}

/// The header of such a copy that names the queue it came from.
pub(super) const DEAD_LETTER_QUEUE_HEADER: &str = "x-babel-idem-original-queue";
/// The header of such a copy that says why it was dead-lettered.
pub(super) const DEAD_LETTER_REASON_HEADER: &str = "x-babel-idem-dead-letter-reason";

/// The out-of-band headers given as strings, as a table (blank names and
/// values dropped, like Python's `publish_with_headers`).
pub(super) fn table(headers: &[(String, String)]) -> FieldTable {
    let mut table = FieldTable::default();
    for (name, value) in headers {
        if value.is_empty() {
            continue;
        }
        if let Ok(name) = ShortString::try_new(name.as_str())
            && !name.as_str().is_empty()
        {
            table.insert(name, AMQPValue::LongString(value.as_str().into()));
        }
    }
    table
}

/// The delivery's headers without the contract ones: what travels with a
/// retry, a release or a dead-letter record (the contract headers are
/// recomputed from the new body).
pub(super) fn out_of_band(properties: &BasicProperties) -> FieldTable {
    let mut table = FieldTable::default();
    if let Some(headers) = properties.headers() {
        for (name, value) in headers.inner() {
            if !CONTRACT_HEADERS.contains(&name.as_str()) {
                table.insert(name.clone(), value.clone());
            }
        }
    }
    table
}

/// The delivery's headers as the handler sees them: every scalar value as a
/// string (as Python's `_delivery_headers` does: bytes decoded, the rest
/// through `str`); tables, arrays and voids are left out.
pub(super) fn as_strings(properties: &BasicProperties) -> Vec<(String, String)> {
    let Some(headers) = properties.headers() else {
        return Vec::new();
    };
    headers
        .inner()
        .iter()
        .filter_map(|(name, value)| Some((name.to_string(), string_value(value)?)))
        .collect()
}

fn string_value(value: &AMQPValue) -> Option<String> {
    Some(match value {
        AMQPValue::LongString(text) => String::from_utf8_lossy(text.as_bytes()).into_owned(),
        AMQPValue::ShortString(text) => text.to_string(),
        AMQPValue::ByteArray(bytes) => String::from_utf8_lossy(bytes.as_slice()).into_owned(),
        AMQPValue::Boolean(true) => "True".to_owned(),
        AMQPValue::Boolean(false) => "False".to_owned(),
        AMQPValue::ShortShortInt(n) => n.to_string(),
        AMQPValue::ShortShortUInt(n) => n.to_string(),
        AMQPValue::ShortInt(n) => n.to_string(),
        AMQPValue::ShortUInt(n) => n.to_string(),
        AMQPValue::LongInt(n) => n.to_string(),
        AMQPValue::LongUInt(n) => n.to_string(),
        AMQPValue::LongLongInt(n) => n.to_string(),
        AMQPValue::Timestamp(n) => n.to_string(),
        AMQPValue::Float(n) => n.to_string(),
        AMQPValue::Double(n) => n.to_string(),
        _ => return None,
    })
}

/// A JSON value as pika encodes it: a bool as `t`, an int as a signed 32-bit
/// `I` when it fits, else a 64-bit `l`, a float as `d`, a string as `S`.
fn header_value(value: &Value) -> Option<AMQPValue> {
    match value {
        Value::Bool(flag) => Some(AMQPValue::Boolean(*flag)),
        Value::Number(number) => match number.as_i64() {
            Some(n) => Some(match i32::try_from(n) {
                Ok(small) => AMQPValue::LongInt(small),
                Err(_) => AMQPValue::LongLongInt(n),
            }),
            None => number.as_f64().map(AMQPValue::Double),
        },
        Value::String(text) => Some(AMQPValue::LongString(LongString::from(text.as_str()))),
        // Null is filtered; nested values are not part of the contract.
        _ => None,
    }
}

/// A string member as an AMQP short string; `None` when absent, not a
/// string, or over the 255-byte limit of the property.
fn short(value: Option<&Value>) -> Option<ShortString> {
    ShortString::try_new(value?.as_str()?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header<'p>(properties: &'p BasicProperties, name: &str) -> Option<&'p AMQPValue> {
        properties.headers().as_ref()?.inner().get(name)
    }

    #[test]
    fn an_envelope_gives_the_contract_properties_and_headers() {
        let body = br#"{"job":"urn:babel:orders:created","trace_id":"t-1","data":{},"meta":{"id":"m-1","queue":"q","lang":"rust","schema_version":1,"created_at":0},"attempts":2}"#;
        let mut extra = FieldTable::default();
        extra.insert("traceparent".into(), AMQPValue::LongString("00-ab".into()));
        extra.insert("x-attempts".into(), AMQPValue::LongString("99".into()));
        let properties = for_body(body, &extra);
        assert_eq!(
            properties.kind().as_ref().unwrap().as_str(),
            "urn:babel:orders:created"
        );
        assert_eq!(properties.message_id().as_ref().unwrap().as_str(), "m-1");
        assert_eq!(
            properties.correlation_id().as_ref().unwrap().as_str(),
            "t-1"
        );
        assert_eq!(properties.app_id().as_ref().unwrap().as_str(), "babelqueue");
        assert_eq!(*properties.delivery_mode(), Some(2));
        assert_eq!(
            header(&properties, "x-attempts"),
            Some(&AMQPValue::LongInt(2)),
            "the contract wins"
        );
        assert_eq!(
            header(&properties, "x-schema-version"),
            Some(&AMQPValue::LongInt(1))
        );
        assert_eq!(
            header(&properties, "x-source-lang"),
            Some(&AMQPValue::LongString("rust".into()))
        );
        assert!(header(&properties, "traceparent").is_some());
    }

    #[test]
    fn a_body_that_is_no_json_object_is_persistent_json_and_nothing_else() {
        for body in [&b"not json"[..], b"[1,2]", b"\xff"] {
            let properties = for_body(body, &table(&[("traceparent".into(), "00".into())]));
            assert_eq!(*properties.delivery_mode(), Some(2));
            assert!(properties.headers().is_none());
            assert!(properties.message_id().is_none());
        }
        // No attempts member: x-attempts 0; an over-long id is left out, not a panic.
        let long_id = format!(r#"{{"meta":{{"id":"{}"}}}}"#, "i".repeat(300));
        let properties = for_body(long_id.as_bytes(), &FieldTable::default());
        assert!(properties.message_id().is_none());
        assert_eq!(
            header(&properties, "x-attempts"),
            Some(&AMQPValue::LongInt(0))
        );
    }

    /// Headers holding one value nested `depth` tables and arrays deep.
    fn nested(depth: usize) -> BasicProperties {
        let mut value = AMQPValue::LongString("bottom".into());
        for level in 0..depth {
            value = if level % 2 == 0 {
                let mut table = FieldTable::default();
                table.insert("n".into(), value);
                AMQPValue::FieldTable(table)
            } else {
                AMQPValue::FieldArray(vec![value].into())
            };
        }
        let mut headers = FieldTable::default();
        headers.insert("deep".into(), value);
        BasicProperties::default().with_headers(headers)
    }

    #[test]
    fn headers_nested_deeper_than_the_limit_are_unrepresentable() {
        assert_eq!(unrepresentable(&BasicProperties::default()), None);
        assert_eq!(unrepresentable(&nested(MAX_HEADER_DEPTH)), None);
        let reason = unrepresentable(&nested(MAX_HEADER_DEPTH + 1)).unwrap();
        assert!(reason.contains("deeper than 16"), "{reason}");
        assert!(unrepresentable(&nested(200)).is_some());
    }

    #[test]
    fn a_dead_letter_copy_names_its_queue_and_why() {
        let properties = dead_letter("orders", "unreadable");
        assert_eq!(*properties.delivery_mode(), Some(2));
        assert_eq!(
            header(&properties, DEAD_LETTER_QUEUE_HEADER),
            Some(&AMQPValue::LongString("orders".into()))
        );
        assert_eq!(
            header(&properties, DEAD_LETTER_REASON_HEADER),
            Some(&AMQPValue::LongString("unreadable".into()))
        );
    }

    #[test]
    fn headers_read_back_as_python_prints_them() {
        let mut table = FieldTable::default();
        table.insert("a".into(), AMQPValue::LongString("x".into()));
        table.insert("b".into(), AMQPValue::LongLongInt(7));
        table.insert("c".into(), AMQPValue::Boolean(true));
        table.insert("d".into(), AMQPValue::FieldTable(FieldTable::default()));
        let properties = BasicProperties::default().with_headers(table);
        assert_eq!(
            as_strings(&properties),
            [
                ("a".into(), "x".into()),
                ("b".into(), "7".into()),
                ("c".into(), "True".into())
            ]
        );
    }
}
