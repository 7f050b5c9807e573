//! The binding's record headers: the `bq-` projection a producer writes
//! beside the envelope, and the attempts a consumer reads back from them.
//!
//! The projection is a redundant, routable view of the body (a peer routes
//! on `bq-job` without parsing it); the body stays the envelope byte for
//! byte. Kafka has no delivery count of its own, so `bq-attempts` is the
//! authoritative retry counter on consume, the body's `attempts` the
//! fallback for a record no BabelQueue producer wrote.

use std::panic::{AssertUnwindSafe, catch_unwind};

use rdkafka::message::{Headers, Message};
use serde_json::Value;

/// The URN (`job`).
pub(crate) const JOB: &str = "bq-job";
/// `trace_id`.
pub(crate) const TRACE_ID: &str = "bq-trace-id";
/// `meta.id`.
pub(crate) const MESSAGE_ID: &str = "bq-message-id";
/// `meta.schema_version`.
pub(crate) const SCHEMA_VERSION: &str = "bq-schema-version";
/// `meta.lang`.
pub(crate) const SOURCE_LANG: &str = "bq-source-lang";
/// `attempts`: authoritative on consume.
pub(crate) const ATTEMPTS: &str = "bq-attempts";
/// On a record parked on a retry tier: the delay asked for, in
/// milliseconds.
pub(crate) const DELAY: &str = "bq-delay";
/// On a record parked on a retry tier: the work topic it goes back to.
pub(crate) const ORIGINAL_TOPIC: &str = "bq-original-topic";

/// The header that stands in for a record's headers when they cannot be
/// read (a header name that is not UTF-8); the same name the RabbitMQ
/// binding gives headers it cannot read.
pub(crate) const UNREADABLE: &str = "x-babel-idem-unreadable-headers";

/// A stored header: its name and its value (`None`: a null value).
pub(crate) type Stored = (String, Option<Vec<u8>>);

/// The headers of a consumed `record` as stored, in order, a null value
/// kept null.
///
/// The rdkafka crate panics on a header name that is not UTF-8 (it
/// unwraps the name's conversion), and any producer can write one. That
/// panic is caught here, so a foreign record never takes a worker down nor
/// wedges its partition: the record's headers are then the one header
/// [`UNREADABLE`], saying why, and its value and key go on as they are.
pub(crate) fn stored<M: Message>(record: &M) -> Vec<Stored> {
    caught(|| {
        record.headers().map_or_else(Vec::new, |headers| {
            headers
                .iter()
                .map(|header| (header.key.to_owned(), header.value.map(<[u8]>::to_vec)))
                .collect()
        })
    })
    .unwrap_or_else(|unreadable| {
        tracing::warn!(
            target: "babel_idem::transport::kafka",
            topic = record.topic(),
            partition = record.partition(),
            offset = record.offset(),
            "babel-idem: a Kafka record's header names are not UTF-8; it goes on without its headers"
        );
        unreadable
    })
}

/// What `read` gives, or, when it panics, `Err` with the one header
/// [`UNREADABLE`] in place of those it could not read.
fn caught(read: impl FnOnce() -> Vec<Stored>) -> Result<Vec<Stored>, Vec<Stored>> {
    catch_unwind(AssertUnwindSafe(read)).map_err(|_| {
        vec![(
            UNREADABLE.to_owned(),
            Some(b"a header name is not UTF-8".to_vec()),
        )]
    })
}

/// The `bq-` headers of `body`, in the order the Python SDK writes them:
/// `bq-job`, `bq-trace-id`, `bq-message-id`, `bq-schema-version`,
/// `bq-source-lang`, `bq-attempts`. A member that is absent, `null` or an
/// empty string gives no header; a body that is not a JSON object gives
/// none at all; an `attempts` that is not a count (a string of letters, a
/// boolean) gives no `bq-attempts`, and the body stays authoritative.
pub(crate) fn projection(body: &[u8]) -> Vec<(&'static str, String)> {
    let Ok(Value::Object(envelope)) = serde_json::from_slice::<Value>(body) else {
        return Vec::new();
    };
    let meta = envelope.get("meta").and_then(Value::as_object);
    let meta_member = |name: &str| meta.and_then(|meta| meta.get(name));
    let mut headers = Vec::with_capacity(6);
    let mut add = |name: &'static str, value: Option<&Value>| {
        if let Some(text) = value.and_then(text_of).filter(|text| !text.is_empty()) {
            headers.push((name, text));
        }
    };
    add(JOB, envelope.get("job"));
    add(TRACE_ID, envelope.get("trace_id"));
    add(MESSAGE_ID, meta_member("id"));
    add(SCHEMA_VERSION, meta_member("schema_version"));
    add(SOURCE_LANG, meta_member("lang"));
    if let Some(attempts) = body_attempts(envelope.get("attempts")) {
        headers.push((ATTEMPTS, attempts.to_string()));
    }
    headers
}

/// The record timestamp a producer writes: `meta.created_at` (Unix
/// milliseconds) when it is an integer, else none (the broker's clock).
pub(crate) fn timestamp(body: &[u8]) -> Option<i64> {
    let Ok(Value::Object(envelope)) = serde_json::from_slice::<Value>(body) else {
        return None;
    };
    let created_at = envelope.get("meta")?.get("created_at")?;
    created_at
        .as_i64()
        .or_else(|| created_at.as_str().and_then(|text| text.parse().ok()))
        .filter(|millis| *millis > 0)
}

/// The attempts a consumer counts with: `bq-attempts` when present and a
/// count (authoritative, even when lower than the body's), else `None`
/// (the body's own `attempts` stands). Never a maximum of the two.
pub(crate) fn attempts<'a>(mut headers: impl Iterator<Item = (&'a str, &'a [u8])>) -> Option<u64> {
    let (_, value) = headers.find(|(name, _)| *name == ATTEMPTS)?;
    std::str::from_utf8(value).ok()?.trim().parse().ok()
}

/// An envelope member as the header text Python's `str()` gives it: a
/// string as it is, a number in its shortest decimal form, a boolean as
/// `True` / `False`; `null`, arrays and objects give nothing.
fn text_of(value: &Value) -> Option<String> {
    match value {
        Value::String(text) => Some(text.clone()),
        Value::Number(number) => Some(number.to_string()),
        Value::Bool(true) => Some("True".to_owned()),
        Value::Bool(false) => Some("False".to_owned()),
        Value::Null | Value::Array(_) | Value::Object(_) => None,
    }
}

/// The body's `attempts` as the runtime reads it: absent or `null` is 0, an
/// integer (or an integer written as a string) is itself, a float is
/// truncated; a boolean or anything else is no count.
fn body_attempts(value: Option<&Value>) -> Option<i64> {
    match value {
        None | Some(Value::Null) => Some(0),
        Some(Value::Number(number)) => number
            .as_i64()
            .or_else(|| number.as_f64().filter(|f| f.is_finite()).map(|f| f as i64)),
        Some(Value::String(text)) => text.trim().parse().ok(),
        Some(Value::Bool(_) | Value::Array(_) | Value::Object(_)) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ENVELOPE: &[u8] = br#"{"job":"urn:babel:orders:created","trace_id":"t-1","data":{},"attempts":2,"meta":{"id":"m-1","lang":"php","schema_version":1,"created_at":1796000000000}}"#;

    #[test]
    fn the_projection_names_every_contract_field_in_the_python_order() {
        assert_eq!(
            projection(ENVELOPE),
            vec![
                (JOB, "urn:babel:orders:created".to_owned()),
                (TRACE_ID, "t-1".to_owned()),
                (MESSAGE_ID, "m-1".to_owned()),
                (SCHEMA_VERSION, "1".to_owned()),
                (SOURCE_LANG, "php".to_owned()),
                (ATTEMPTS, "2".to_owned()),
            ]
        );
        assert_eq!(timestamp(ENVELOPE), Some(1_796_000_000_000));
    }

    #[test]
    fn absent_and_empty_members_give_no_header_and_attempts_defaults_to_zero() {
        let body = br#"{"job":"urn:babel:a:b","trace_id":"","meta":{}}"#;
        assert_eq!(
            projection(body),
            vec![
                (JOB, "urn:babel:a:b".to_owned()),
                (ATTEMPTS, "0".to_owned())
            ]
        );
        assert_eq!(timestamp(body), None);
    }

    #[test]
    fn a_body_that_is_not_an_object_gives_no_header() {
        assert!(projection(b"[1,2]").is_empty());
        assert!(projection(b"\xff").is_empty());
    }

    #[test]
    fn an_attempts_that_is_no_count_leaves_the_header_out() {
        let body = br#"{"job":"urn:babel:a:b","attempts":"three"}"#;
        assert!(projection(body).iter().all(|(name, _)| *name != ATTEMPTS));
        let body = br#"{"job":"urn:babel:a:b","attempts":true}"#;
        assert!(projection(body).iter().all(|(name, _)| *name != ATTEMPTS));
    }

    #[test]
    fn headers_whose_reading_panics_are_replaced_by_the_unreadable_marker() {
        let read = || vec![("bq-job".to_owned(), Some(b"urn:babel:a:b".to_vec()))];
        assert_eq!(caught(read), Ok(read()));
        let unreadable =
            caught(|| panic!("called `Result::unwrap()` on an `Err` value: Utf8Error"));
        let marker = unreadable.unwrap_err();
        assert_eq!(marker.len(), 1);
        assert_eq!(marker[0].0, UNREADABLE);
    }

    #[test]
    fn the_attempts_header_is_authoritative_and_never_a_maximum() {
        let header = |value: &'static [u8]| vec![("bq-job", &b"x"[..]), (ATTEMPTS, value)];
        assert_eq!(attempts(header(b"1").into_iter()), Some(1));
        assert_eq!(attempts(header(b"4").into_iter()), Some(4));
        assert_eq!(attempts(header(b"x").into_iter()), None);
        assert_eq!(attempts(std::iter::empty()), None);
    }
}
