//! The dead-letter record of a poison body (BabelQueue ADR-0035), written
//! byte for byte as the Python SDK's `build_poison_record` writes it:
//!
//! - a body that is one strict JSON object (valid UTF-8, no top-level
//!   `dead_letter` member, no unpaired `\uD800`-style escape, nested at
//!   most [`MAX_SPLICED_DEPTH`] levels) is *spliced*:
//!   every original byte is kept and a `dead_letter` member is appended
//!   before the closing brace, so no value is re-encoded;
//! - other valid UTF-8 is wrapped: `{"raw":"<the text>","dead_letter":…}`;
//! - anything else is wrapped as base64:
//!   `{"raw":"<base64>","raw_encoding":"base64","dead_letter":…}`.

use std::fmt;

use serde::de::{Deserializer as _, IgnoredAny, MapAccess, Visitor};

use crate::envelope::DeadLetter;

/// The deepest nesting of arrays and objects a spliced body may have,
/// counting its own outermost object as 1; a deeper body is wrapped as
/// `raw` text. The invariant: every record parses with a parser that
/// refuses more than 127 levels (serde_json's limit; Python's is higher).
/// A spliced record is the body's outermost object with one member
/// appended, whose value nests 2 levels, so the record is exactly as deep
/// as the body (and never less than 2); a wrapped record nests 2 levels.
const MAX_SPLICED_DEPTH: usize = 127;

/// JSON's four whitespace characters, the ones the record trims.
const JSON_WHITESPACE: [char; 4] = [' ', '\t', '\r', '\n'];

/// The record for the poison `body` with its `dead_letter` block.
pub(super) fn poison_record(body: &[u8], block: &DeadLetter) -> Vec<u8> {
    // Serializing the block cannot fail: its fields are strings and integers.
    let block = serde_json::to_vec(block).unwrap_or_else(|_| b"{}".to_vec());
    let mut record = Vec::with_capacity(body.len() + block.len() + 48);
    match std::str::from_utf8(body) {
        Ok(text) if is_spliceable_object(text) => {
            let trimmed = text.trim_matches(JSON_WHITESPACE);
            let without_brace = &trimmed[..trimmed.len() - 1];
            if without_brace[1..].trim_matches(JSON_WHITESPACE).is_empty() {
                record.extend_from_slice(b"{\"dead_letter\":");
            } else {
                record.extend_from_slice(without_brace.as_bytes());
                record.extend_from_slice(b",\"dead_letter\":");
            }
        }
        Ok(text) => {
            record.extend_from_slice(b"{\"raw\":");
            // Writing a `&str` into a `Vec` cannot fail.
            let _ = serde_json::to_writer(&mut record, text);
            record.extend_from_slice(b",\"dead_letter\":");
        }
        Err(_) => {
            record.extend_from_slice(b"{\"raw\":\"");
            record.extend_from_slice(base64(body).as_bytes());
            record.extend_from_slice(b"\",\"raw_encoding\":\"base64\",\"dead_letter\":");
        }
    }
    record.extend_from_slice(&block);
    record.push(b'}');
    record
}

/// Whether `text` is one strict JSON object the record may splice into.
fn is_spliceable_object(text: &str) -> bool {
    if !nests_at_most(text, MAX_SPLICED_DEPTH) {
        return false;
    }
    let mut deserializer = serde_json::Deserializer::from_str(text);
    // `IgnoredAny` checks the syntax without converting numbers, so `1e400`
    // and 30-digit integers are accepted, as Python's parser accepts them.
    let top_level_ok = matches!(deserializer.deserialize_map(TopLevelObject), Ok(true));
    top_level_ok && deserializer.end().is_ok() && !has_unpaired_surrogate_escape(text)
}

/// Visits the outermost object; `true` when it has no `dead_letter` member.
struct TopLevelObject;

impl<'de> Visitor<'de> for TopLevelObject {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut members: A) -> Result<bool, A::Error> {
        let mut has_dead_letter = false;
        while let Some(name) = members.next_key::<String>()? {
            has_dead_letter |= name == "dead_letter";
            members.next_value::<IgnoredAny>()?;
        }
        Ok(!has_dead_letter)
    }
}

/// Whether no array or object of `text` lies deeper than `limit` levels,
/// counting brackets outside string literals. One pass, no recursion, so a
/// body nested millions deep costs no stack; any text is accepted
/// (malformed JSON is refused by the strict parse that follows).
fn nests_at_most(text: &str, limit: usize) -> bool {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for &byte in text.as_bytes() {
        if in_string {
            match byte {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > limit {
                    return false;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    true
}

/// Whether a string literal of the (syntactically valid) JSON `text` holds a
/// `\uD800`-range escape that is not half of a high + low pair.
fn has_unpaired_surrogate_escape(text: &str) -> bool {
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'"' {
            i += 1;
            continue;
        }
        // Inside a string literal.
        i += 1;
        let mut pending_high = false;
        while i < bytes.len() && bytes[i] != b'"' {
            if bytes[i] != b'\\' {
                i += 1;
                continue;
            }
            let code = (bytes.get(i + 1) == Some(&b'u'))
                .then(|| text.get(i + 2..i + 6))
                .flatten()
                .and_then(|hex| u16::from_str_radix(hex, 16).ok());
            let is_high = code.is_some_and(|c| (0xD800..=0xDBFF).contains(&c));
            let is_low = code.is_some_and(|c| (0xDC00..=0xDFFF).contains(&c));
            if pending_high != is_low {
                return true;
            }
            pending_high = is_high;
            i += if code.is_some() { 6 } else { 2 };
        }
        if pending_high {
            return true;
        }
        i += 1;
    }
    false
}

/// Standard base64 with padding (RFC 4648 section 4).
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (k, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if k <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> shift) as usize & 63]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envelope::DeadLetterReason;

    fn block() -> DeadLetter {
        let mut block = DeadLetter::new(DeadLetterReason::Poison, "orders", 0)
            .with_error("Undecodable BabelQueue body")
            .with_exception("EnvelopeError");
        block.failed_at = 1;
        block
    }

    fn record(body: &[u8]) -> String {
        String::from_utf8(poison_record(body, &block())).unwrap()
    }

    const BLOCK: &str = r#"{"reason":"poison","error":"Undecodable BabelQueue body","exception":"EnvelopeError","failed_at":1,"original_queue":"orders","attempts":0,"lang":"rust"}"#;

    #[test]
    fn an_object_is_spliced_keeping_every_byte() {
        assert_eq!(
            record(b" {\"attempts\":\"x\", \"n\":1e400 }\n"),
            format!("{{\"attempts\":\"x\", \"n\":1e400 ,\"dead_letter\":{BLOCK}}}")
        );
        assert_eq!(record(b"{ }"), format!("{{\"dead_letter\":{BLOCK}}}"));
    }

    #[test]
    fn other_text_is_wrapped_as_raw() {
        assert_eq!(
            record(b"not json"),
            format!("{{\"raw\":\"not json\",\"dead_letter\":{BLOCK}}}")
        );
        assert_eq!(
            record(b"[1,2]"),
            format!("{{\"raw\":\"[1,2]\",\"dead_letter\":{BLOCK}}}")
        );
        // A top-level dead_letter member, an unpaired surrogate, a NaN, trailing tokens.
        for body in [
            &br#"{"dead_letter":1}"#[..],
            br#"{"a":"\ud800"}"#,
            br#"{"a":"\udc00\ud800"}"#,
            br#"{"a":NaN}"#,
            br#"{"a":1} {}"#,
        ] {
            assert!(record(body).starts_with("{\"raw\":"), "{}", record(body));
        }
        assert!(
            record(br#"{"a":"\ud83d\ude00"}"#).ends_with(&format!(",\"dead_letter\":{BLOCK}}}"))
        );
    }

    #[test]
    fn invalid_utf8_is_wrapped_as_base64() {
        assert_eq!(
            record(b"\xff\xfe{"),
            format!("{{\"raw\":\"//57\",\"raw_encoding\":\"base64\",\"dead_letter\":{BLOCK}}}")
        );
    }

    #[test]
    fn base64_pads_like_rfc_4648() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
    }

    /// An object `depth` levels deep: objects all the way, or one object
    /// holding arrays.
    fn nested(depth: usize, arrays: bool) -> String {
        if arrays {
            format!(
                "{{\"a\":{}{}}}",
                "[".repeat(depth - 1),
                "]".repeat(depth - 1)
            )
        } else {
            format!(
                "{}{{}}{}",
                "{\"a\":".repeat(depth - 1),
                "}".repeat(depth - 1)
            )
        }
    }

    fn parses(record: &str) -> bool {
        serde_json::from_slice::<serde_json::Value>(record.as_bytes()).is_ok()
    }

    #[test]
    fn a_body_at_the_depth_limit_is_spliced_and_its_record_parses() {
        for arrays in [false, true] {
            let body = nested(MAX_SPLICED_DEPTH, arrays);
            let record = record(body.as_bytes());
            assert_eq!(
                record,
                format!("{},\"dead_letter\":{BLOCK}}}", &body[..body.len() - 1])
            );
            assert!(parses(&record), "arrays: {arrays}");
        }
    }

    #[test]
    fn a_body_deeper_than_the_limit_is_wrapped_as_raw_and_its_record_parses() {
        for depth in [MAX_SPLICED_DEPTH + 1, MAX_SPLICED_DEPTH + 2, 200_000] {
            for arrays in [false, true] {
                let body = nested(depth, arrays);
                let record = record(body.as_bytes());
                let raw = serde_json::to_string(&body).unwrap();
                // Compared without printing: the texts run to megabytes.
                assert!(
                    record == format!("{{\"raw\":{raw},\"dead_letter\":{BLOCK}}}"),
                    "depth {depth}, arrays: {arrays}: not wrapped as raw; starts {:?}",
                    &record[..40]
                );
                assert!(parses(&record), "depth {depth}, arrays: {arrays}");
            }
        }
    }

    #[test]
    fn the_depth_limit_is_the_deepest_serde_json_parses() {
        assert!(parses(&nested(MAX_SPLICED_DEPTH, true)));
        assert!(!parses(&nested(MAX_SPLICED_DEPTH + 1, true)));
    }

    #[test]
    fn brackets_inside_strings_do_not_count_as_nesting() {
        let deep_text = "[{".repeat(200_000);
        let body = format!(r#"{{"a":"{deep_text}\"\\[","b":[]}}"#);
        assert!(record(body.as_bytes()).ends_with(&format!(",\"dead_letter\":{BLOCK}}}")));
        assert!(nests_at_most(&body, 2));
        assert!(!nests_at_most(&body, 1));
    }

    #[test]
    fn the_depth_scan_takes_any_text() {
        for text in ["", "]]]}}", "\"unterminated [[[", "\\", "{\"a\\", "[[[[["] {
            assert_eq!(nests_at_most(text, 3), !text.starts_with("[[[["), "{text}");
        }
    }
}
