//! The `__bq_frame` header frame of the Redis legacy layout: headers stored
//! beside the envelope in one list value, as the Python SDK writes them:
//!
//! ```text
//! {"__bq_frame":1,"headers":{"traceparent":"00-…"},"body":"<the wire envelope>"}
//! ```
//!
//! An envelope never carries `__bq_frame`, so its presence tells a frame from
//! a bare envelope.

use serde_json::Value;

const FRAME_KEY: &str = "__bq_frame";

/// The exact value to store for `body` with `headers`: `body` itself when no
/// header survives (blank names and values are dropped), else the frame.
/// `None` when a frame is needed but `body` is not UTF-8 (a frame holds the
/// body as a JSON string).
pub(crate) fn frame(body: &[u8], headers: &[(String, String)]) -> Option<Vec<u8>> {
    let mut kept = headers
        .iter()
        .filter(|(name, value)| !name.is_empty() && !value.is_empty())
        .peekable();
    if kept.peek().is_none() {
        return Some(body.to_vec());
    }
    let body = std::str::from_utf8(body).ok()?;
    // Written by hand, not through a `serde_json::Map`, to keep the Python
    // SDK's key order (`__bq_frame`, `headers`, `body`) and the headers' order.
    let mut out = Vec::with_capacity(body.len() + 64);
    out.extend_from_slice(b"{\"__bq_frame\":1,\"headers\":{");
    for (i, (name, value)) in kept.enumerate() {
        if i > 0 {
            out.push(b',');
        }
        push_json_string(&mut out, name);
        out.push(b':');
        push_json_string(&mut out, value);
    }
    out.extend_from_slice(b"},\"body\":");
    push_json_string(&mut out, body);
    out.push(b'}');
    Some(out)
}

/// A stored value read back: the body and the headers when it is a frame,
/// else the value itself with no headers.
pub(crate) fn unframe(value: Vec<u8>) -> (Vec<u8>, Vec<(String, String)>) {
    // Cheap reject: most values are bare envelopes.
    if value.first() != Some(&b'{') || !contains(&value, b"\"__bq_frame\"") {
        return (value, Vec::new());
    }
    let Ok(Value::Object(mut frame)) = serde_json::from_slice::<Value>(&value) else {
        return (value, Vec::new());
    };
    if !frame.get(FRAME_KEY).is_some_and(truthy) {
        return (value, Vec::new());
    }
    let Some(Value::String(body)) = frame.remove("body") else {
        return (value, Vec::new());
    };
    let headers = match frame.remove("headers") {
        Some(Value::Object(headers)) => headers
            .into_iter()
            .filter_map(|(name, value)| Some((name, header_text(value)?)))
            .filter(|(name, value)| !name.is_empty() && !value.is_empty())
            .collect(),
        _ => Vec::new(),
    };
    (body.into_bytes(), headers)
}

/// A header value as text, the way the Python SDK's `str(value)` reads the
/// scalars a frame can carry; `None` for a null or a nested value.
fn header_text(value: Value) -> Option<String> {
    match value {
        Value::String(text) => Some(text),
        Value::Number(number) => Some(number.to_string()),
        Value::Bool(true) => Some("True".to_owned()),
        Value::Bool(false) => Some("False".to_owned()),
        Value::Null | Value::Array(_) | Value::Object(_) => None,
    }
}

/// JSON truthiness as Python reads it: `__bq_frame` must be set to something.
fn truthy(value: &Value) -> bool {
    match value {
        Value::Null => false,
        Value::Bool(flag) => *flag,
        Value::Number(number) => number.as_f64().is_some_and(|n| n != 0.0),
        Value::String(text) => !text.is_empty(),
        Value::Array(items) => !items.is_empty(),
        Value::Object(members) => !members.is_empty(),
    }
}

fn push_json_string(out: &mut Vec<u8>, text: &str) {
    // Writing a `&str` into a `Vec` cannot fail.
    let _ = serde_json::to_writer(&mut *out, text);
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn no_usable_header_stores_the_body_itself() {
        let body = br#"{"job":"urn:babel:a:b"}"#;
        assert_eq!(frame(body, &[]).unwrap(), body);
        assert_eq!(
            frame(body, &headers(&[("", "x"), ("k", "")])).unwrap(),
            body
        );
    }

    #[test]
    fn a_frame_keeps_the_python_key_order_and_round_trips() {
        let body = "{\"job\":\"urn:babel:a:b\",\"data\":{\"text\":\"é\\n\"}}";
        let stored = frame(
            body.as_bytes(),
            &headers(&[("traceparent", "00-1"), ("bq-replay-bypass", "1")]),
        )
        .unwrap();
        let expected = format!(
            "{{\"__bq_frame\":1,\"headers\":{{\"traceparent\":\"00-1\",\"bq-replay-bypass\":\"1\"}},\"body\":{}}}",
            serde_json::to_string(body).unwrap()
        );
        assert_eq!(String::from_utf8(stored.clone()).unwrap(), expected);
        let (unframed, read) = unframe(stored);
        assert_eq!(unframed, body.as_bytes());
        assert_eq!(read.len(), 2);
        assert_eq!(
            read.iter()
                .find(|(n, _)| n == "bq-replay-bypass")
                .unwrap()
                .1,
            "1"
        );
    }

    #[test]
    fn values_that_are_not_frames_are_bodies() {
        for value in [
            &b"not json"[..],
            b"{\"__bq_frame\":0,\"body\":\"x\"}",
            b"{\"__bq_frame\":1,\"body\":7}",
            b"{\"job\":\"urn:babel:a:b\",\"note\":\"\\\"__bq_frame\\\"\"}",
            b"\xff\xfe",
        ] {
            let (body, headers) = unframe(value.to_vec());
            assert_eq!(body, value);
            assert!(headers.is_empty());
        }
    }

    #[test]
    fn a_non_utf8_body_cannot_be_framed() {
        assert!(frame(b"\xff", &headers(&[("k", "v")])).is_none());
    }
}
