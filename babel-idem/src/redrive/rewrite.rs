//! The redriven body: the dead-letter record reset for reprocessing, written
//! exactly as the Python SDK's `redrive` writes it (1.24).
//!
//! The Python SDK decodes the record with `json.loads` (leniently: the
//! non-canonical keys of the contract's §10 dropped, the `urn` alias folded
//! into `job`), removes `dead_letter`, sets `attempts` to 0 and encodes the
//! result with `json.dumps(ensure_ascii=False, separators=(",", ":"))`. So
//! the bytes follow Python's reading and writing of JSON, not the record's
//! own spelling:
//!
//! - an object keeps the first position of a repeated key and its last
//!   value; `attempts` stays where it was (appended when absent), a `job`
//!   taken from the `urn` alias is appended unless a `job` key was there;
//! - an integer keeps its digits at any size (`-0` is `0`); any other number
//!   is a float written as Python's `repr` writes it (`2.50` is `2.5`,
//!   `1E2` is `100.0`, `1e-7` is `1e-07`, `1e16` is `1e+16`);
//! - a string is written with only `"`, `\` and the control characters
//!   escaped (`\n`, `\u001f`), everything else as UTF-8 (`\u00e9` is `é`,
//!   `\/` is `/`).
//!
//! A number too large for a float is refused ([`Unencodable`]): Python
//! would write `Infinity`, which is not JSON and which no consumer reads.

use std::fmt;

use serde::Deserializer;
use serde::de::{MapAccess, Visitor};
use serde_json::value::RawValue;

/// Why a record cannot be rewritten into a redriven body.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Unencodable {
    /// Not one JSON object that Python and serde_json both read.
    #[error("the record is not one JSON object")]
    NotAnObject,
    /// No string `job` (nor `urn` alias) after the lenient decode.
    #[error("the record has no string job or urn")]
    NoJob,
    /// A number overflows a float (Python would write `Infinity`).
    #[error("a number in the record is too large for a float and would be written as Infinity")]
    InfiniteNumber,
}

/// The non-canonical keys the lenient decode drops: top-level `timestamp`,
/// and `max_retries`, `attempts`, `source`, `ts` inside `meta`.
const FORBIDDEN_TOP: &[&str] = &["timestamp"];
const FORBIDDEN_META: &[&str] = &["max_retries", "attempts", "source", "ts"];

/// The record `text` reset for reprocessing: `dead_letter` removed,
/// `attempts` 0, everything else kept, in the Python SDK's bytes.
pub(crate) fn redriven(text: &str) -> Result<Vec<u8>, Unencodable> {
    let Json::Object(mut members) = parse(text).ok_or(Unencodable::NotAnObject)? else {
        return Err(Unencodable::NotAnObject);
    };
    members.retain(|(key, _)| !FORBIDDEN_TOP.contains(&key.as_str()));
    if let Some((_, Json::Object(meta))) = members.iter_mut().find(|(key, _)| key == "meta") {
        meta.retain(|(key, _)| !FORBIDDEN_META.contains(&key.as_str()));
    }
    fold_urn(&mut members);
    if !matches!(get(&members, "job"), Some(Json::String(_))) {
        return Err(Unencodable::NoJob);
    }
    members.retain(|(key, _)| key != "dead_letter");
    set(&mut members, "attempts", Json::Integer("0".to_owned()));
    let mut out = Vec::with_capacity(text.len());
    write(&mut out, &Json::Object(members))?;
    Ok(out)
}

/// The `urn` alias, as `EnvelopeCodec._fold_identity` folds it: removed;
/// when `job` is not a usable string and the alias is, it becomes `job`.
fn fold_urn(members: &mut Vec<(String, Json)>) {
    let Some(at) = members.iter().position(|(key, _)| key == "urn") else {
        return;
    };
    let (_, alias) = members.remove(at);
    if usable(get(members, "job")) {
        return;
    }
    if usable(Some(&alias)) {
        set(members, "job", alias);
    }
}

/// A string that is not blank under the ASCII white space set.
fn usable(value: Option<&Json>) -> bool {
    matches!(value, Some(Json::String(text))
        if !text.trim_matches([' ', '\t', '\n', '\x0b', '\x0c', '\r']).is_empty())
}

fn get<'a>(members: &'a [(String, Json)], key: &str) -> Option<&'a Json> {
    members.iter().find(|(k, _)| k == key).map(|(_, v)| v)
}

/// Python's `dict[key] = value`: in place when present, else appended.
fn set(members: &mut Vec<(String, Json)>, key: &str, value: Json) {
    match members.iter_mut().find(|(k, _)| k == key) {
        Some((_, slot)) => *slot = value,
        None => members.push((key.to_owned(), value)),
    }
}

/// A JSON value as Python's `json.loads` holds it.
#[derive(Debug, Clone, PartialEq)]
enum Json {
    Null,
    Bool(bool),
    /// An integer's digits, as written (Python's ints have any size).
    Integer(String),
    Float(f64),
    String(String),
    Array(Vec<Json>),
    /// Members in the order of their first key; a repeated key's last value.
    Object(Vec<(String, Json)>),
}

fn parse(text: &str) -> Option<Json> {
    let raw: &RawValue = serde_json::from_str(text).ok()?;
    value(raw)
}

fn value(raw: &RawValue) -> Option<Json> {
    let text = raw.get();
    Some(match text.as_bytes().first()? {
        b'{' => {
            let mut deserializer = serde_json::Deserializer::from_str(text);
            let members = deserializer.deserialize_map(MembersVisitor).ok()?;
            let mut object: Vec<(String, Json)> = Vec::with_capacity(members.len());
            for (key, raw) in members {
                let value = value(raw)?;
                match object.iter_mut().find(|(k, _)| *k == key) {
                    Some((_, slot)) => *slot = value,
                    None => object.push((key, value)),
                }
            }
            Json::Object(object)
        }
        b'[' => {
            let items: Vec<&RawValue> = serde_json::from_str(text).ok()?;
            Json::Array(items.into_iter().map(value).collect::<Option<_>>()?)
        }
        b'"' => Json::String(serde_json::from_str(text).ok()?),
        b't' => Json::Bool(true),
        b'f' => Json::Bool(false),
        b'n' => Json::Null,
        _ if text.contains(['.', 'e', 'E']) => Json::Float(text.parse().ok()?),
        _ => Json::Integer(text.to_owned()),
    })
}

/// An object's members in order, repeats included.
pub(super) struct MembersVisitor;

impl<'de> Visitor<'de> for MembersVisitor {
    type Value = Vec<(String, &'de RawValue)>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut members = Vec::new();
        while let Some(key) = map.next_key::<String>()? {
            members.push((key, map.next_value()?));
        }
        Ok(members)
    }
}

fn write(out: &mut Vec<u8>, json: &Json) -> Result<(), Unencodable> {
    match json {
        Json::Null => out.extend_from_slice(b"null"),
        Json::Bool(true) => out.extend_from_slice(b"true"),
        Json::Bool(false) => out.extend_from_slice(b"false"),
        Json::Integer(digits) if digits == "-0" => out.push(b'0'),
        Json::Integer(digits) => out.extend_from_slice(digits.as_bytes()),
        Json::Float(number) => out.extend_from_slice(python_repr(*number)?.as_bytes()),
        Json::String(text) => string(out, text),
        Json::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write(out, item)?;
            }
            out.push(b']');
        }
        Json::Object(members) => {
            out.push(b'{');
            for (i, (key, value)) in members.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                string(out, key);
                out.push(b':');
                write(out, value)?;
            }
            out.push(b'}');
        }
    }
    Ok(())
}

/// serde_json escapes exactly what Python's `json.dumps(ensure_ascii=False)`
/// escapes: `"`, `\`, `\b \f \n \r \t` by name, other control characters as
/// `\u00XX` in lowercase hex; nothing else.
fn string(out: &mut Vec<u8>, text: &str) {
    // Writing a `&str` into a `Vec` cannot fail.
    let _ = serde_json::to_writer(&mut *out, text);
}

/// `repr(number)` as Python 3 writes a float: the shortest digits that read
/// back the same; positional with at least one decimal when the decimal
/// exponent is in -4..16, else `d.ddde±XX`.
fn python_repr(number: f64) -> Result<String, Unencodable> {
    if !number.is_finite() {
        return Err(Unencodable::InfiniteNumber);
    }
    let sign = if number.is_sign_negative() { "-" } else { "" };
    // `{:e}` writes the shortest round-trip digits: `1.2345e-7`, `1e16`, `0e0`.
    let scientific = format!("{:e}", number.abs());
    let (mantissa, exponent) = scientific
        .split_once('e')
        .expect("`{:e}` always writes an exponent");
    let exponent: i32 = exponent.parse().expect("the exponent is an integer");
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if number == 0.0 {
        return Ok(format!("{sign}0.0"));
    }
    // The decimal point sits after `point` digits: 0.d1d2... x 10^point.
    let point = exponent + 1;
    let n = digits.len() as i32;
    let body = if point <= -4 || point > 16 {
        let (first, rest) = digits.split_at(1);
        let fraction = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        let e = point - 1;
        format!(
            "{first}{fraction}e{}{:02}",
            if e < 0 { '-' } else { '+' },
            e.abs()
        )
    } else if point <= 0 {
        format!("0.{}{digits}", "0".repeat((-point) as usize))
    } else if point >= n {
        format!("{digits}{}.0", "0".repeat((point - n) as usize))
    } else {
        let (whole, fraction) = digits.split_at(point as usize);
        format!("{whole}.{fraction}")
    };
    Ok(format!("{sign}{body}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(input: &str) -> String {
        String::from_utf8(redriven(input).unwrap()).unwrap()
    }

    #[test]
    fn floats_are_written_as_python_repr_writes_them() {
        for (number, python) in [
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (1.0, "1.0"),
            (100.0, "100.0"),
            (2.5, "2.5"),
            (0.1, "0.1"),
            (1e-7, "1e-07"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (1e15, "1000000000000000.0"),
            (1e16, "1e+16"),
            (1.5e300, "1.5e+300"),
            (123456789.125, "123456789.125"),
            (-3.25e-10, "-3.25e-10"),
            (5e-324, "5e-324"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
            (0.30000000000000004, "0.30000000000000004"),
        ] {
            assert_eq!(python_repr(number).unwrap(), python, "{number:e}");
        }
        assert_eq!(python_repr(f64::INFINITY), Err(Unencodable::InfiniteNumber));
    }

    #[test]
    fn the_dead_letter_block_goes_and_attempts_is_reset_in_place() {
        assert_eq!(
            text(
                r#"{"job":"urn:a:b","trace_id":"t","data":{},"meta":{"id":"1"},"attempts":3,"dead_letter":{"reason":"failed"}}"#
            ),
            r#"{"job":"urn:a:b","trace_id":"t","data":{},"meta":{"id":"1"},"attempts":0}"#
        );
        assert_eq!(
            text(r#"{"attempts":2,"job":"urn:a:b"}"#),
            r#"{"attempts":0,"job":"urn:a:b"}"#
        );
        assert_eq!(
            text(r#"{"job":"urn:a:b"}"#),
            r#"{"job":"urn:a:b","attempts":0}"#
        );
    }

    #[test]
    fn spelling_follows_python_not_the_record() {
        assert_eq!(
            text(
                "{ \"job\" : \"urn:a:b\", \"data\": {\"x\": 2.50, \"y\": 1E2, \"z\": -0, \"big\": 123456789012345678901234567890, \"s\": \"\\u00e9\\/\\u001F\"}, \"d\": 1, \"d\": 2}"
            ),
            "{\"job\":\"urn:a:b\",\"data\":{\"x\":2.5,\"y\":100.0,\"z\":0,\"big\":123456789012345678901234567890,\"s\":\"é/\\u001f\"},\"d\":2,\"attempts\":0}"
        );
    }

    #[test]
    fn non_canonical_keys_go_and_the_urn_alias_folds_into_job() {
        assert_eq!(
            text(
                r#"{"urn":"urn:a:b","timestamp":1,"meta":{"id":"1","ts":2,"max_retries":3},"attempts":1}"#
            ),
            r#"{"meta":{"id":"1"},"attempts":0,"job":"urn:a:b"}"#
        );
        assert_eq!(
            text(r#"{"job":"","urn":"urn:a:b"}"#),
            r#"{"job":"urn:a:b","attempts":0}"#
        );
        assert_eq!(
            text(r#"{"job":"urn:a:b","urn":"urn:c:d"}"#),
            r#"{"job":"urn:a:b","attempts":0}"#
        );
    }

    #[test]
    fn records_python_would_not_redrive_are_refused() {
        assert_eq!(redriven("[1]"), Err(Unencodable::NotAnObject));
        assert_eq!(redriven("{"), Err(Unencodable::NotAnObject));
        assert_eq!(redriven(r#"{"job":7}"#), Err(Unencodable::NoJob));
        assert_eq!(
            redriven(r#"{"job":"urn:a:b","data":{"x":1e400}}"#),
            Err(Unencodable::InfiniteNumber)
        );
    }
}
