//! The text of a decoded envelope, read member by member.
//!
//! A parsed [`Value`](serde_json::Value) forgets how a value was spelled:
//! the order of an object's keys, `1e-07` against `1e-7`, `-0`, an integer
//! beyond 64 bits. The faithful encoder and the integer rule need that
//! spelling back, and a router's payload schema check reads `data` in its
//! document order, so they read it here from the source text. All run off
//! the hot path (re-encoding, a rejected integer, a check a router opted
//! into), so this module scans on demand instead of making every decode
//! record it.

use std::collections::HashMap;
use std::fmt;

use serde::Deserializer;
use serde::de::{DeserializeSeed, MapAccess, Visitor};
use serde_json::value::RawValue;

/// One member of a JSON object: its (unescaped) key and its value's text.
pub(super) struct Member<'a> {
    pub(super) key: String,
    pub(super) value: &'a RawValue,
}

/// The members of the JSON object `text`, in the order their keys first
/// appear; a repeated key keeps its first position and its last value, the
/// way the decoder (and Python's `json.loads`) reads it. `None` when `text`
/// is not an object.
pub(super) fn members(text: &str) -> Option<Vec<Member<'_>>> {
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let members = deserializer.deserialize_map(MembersVisitor).ok()?;
    deserializer.end().ok()?;
    Some(members)
}

struct MembersVisitor;

/// Up to this many members, a repeated key is found by a linear search
/// (envelope blocks are small); beyond, through a hash index.
const SEARCHED: usize = 16;

impl<'de> Visitor<'de> for MembersVisitor {
    type Value = Vec<Member<'de>>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut members: Vec<Member<'de>> = Vec::new();
        // A key's position, indexed once the object is too large to search.
        let mut position: HashMap<String, usize> = HashMap::new();
        while let Some(key) = map.next_key::<String>()? {
            let value: &'de RawValue = map.next_value()?;
            let seen = if members.len() < SEARCHED {
                members.iter().position(|member| member.key == key)
            } else {
                if position.is_empty() {
                    position.extend(
                        members
                            .iter()
                            .enumerate()
                            .map(|(at, m)| (m.key.clone(), at)),
                    );
                }
                position.get(&key).copied()
            };
            match seen {
                Some(at) => members[at].value = value,
                None => {
                    if !position.is_empty() {
                        position.insert(key.clone(), members.len());
                    }
                    members.push(Member { key, value });
                }
            }
        }
        Ok(members)
    }
}

/// The text of the value at `path` (keys joined by `.`, such as
/// `meta.created_at`) inside the JSON object `text`.
pub(super) fn value_at<'a>(text: &'a str, path: &str) -> Option<&'a str> {
    path.split('.').try_fold(text, member)
}

/// The text of the member `key` of the JSON object `text`: its last value
/// when the key is repeated, the one the decoder keeps. `None` when `text`
/// is not an object or has no such member. Keys are compared unescaped
/// (`"\u0064ata"` is `data`) and none is allocated.
pub(crate) fn member<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let found = deserializer.deserialize_map(MemberVisitor { key }).ok()?;
    deserializer.end().ok()?;
    found.map(RawValue::get)
}

/// Finds one member's value while reading an object.
struct MemberVisitor<'k> {
    key: &'k str,
}

impl<'de> Visitor<'de> for MemberVisitor<'_> {
    type Value = Option<&'de RawValue>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut found = None;
        while let Some(is_key) = map.next_key_seed(IsKey(self.key))? {
            let value: &'de RawValue = map.next_value()?;
            if is_key {
                found = Some(value);
            }
        }
        Ok(found)
    }
}

/// Reads a key as whether it is the one wanted, without keeping it.
struct IsKey<'k>(&'k str);

impl<'de> DeserializeSeed<'de> for IsKey<'_> {
    type Value = bool;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<bool, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl Visitor<'_> for IsKey<'_> {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a member name")
    }

    fn visit_str<E: serde::de::Error>(self, key: &str) -> Result<bool, E> {
        Ok(key == self.0)
    }
}

/// Appends the JSON text `json` without its insignificant white space, so a
/// pretty-printed source comes back in the compact form every SDK writes;
/// strings, numbers and key order stay exactly as spelled.
pub(super) fn push_compact(out: &mut Vec<u8>, json: &str) {
    let mut in_string = false;
    let mut escaped = false;
    for &byte in json.as_bytes() {
        if in_string {
            if escaped {
                escaped = false;
            } else if byte == b'\\' {
                escaped = true;
            } else if byte == b'"' {
                in_string = false;
            }
        } else if matches!(byte, b' ' | b'\n' | b'\r' | b'\t') {
            continue;
        } else if byte == b'"' {
            in_string = true;
        }
        out.push(byte);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys_and_values(text: &str) -> Vec<(String, String)> {
        members(text)
            .unwrap()
            .into_iter()
            .map(|member| (member.key, member.value.get().to_owned()))
            .collect()
    }

    #[test]
    fn members_keep_the_source_order_and_spelling() {
        assert_eq!(
            keys_and_values(r#"{"z": 1e-07, "a": {"y": -0, "b": []}, "\u006b": "v"}"#),
            [
                ("z".to_owned(), "1e-07".to_owned()),
                ("a".to_owned(), r#"{"y": -0, "b": []}"#.to_owned()),
                ("k".to_owned(), r#""v""#.to_owned()),
            ]
        );
    }

    #[test]
    fn a_repeated_key_keeps_its_first_position_and_its_last_value() {
        assert_eq!(
            keys_and_values(r#"{"a": 1, "b": 2, "a": 3}"#),
            [
                ("a".to_owned(), "3".to_owned()),
                ("b".to_owned(), "2".to_owned())
            ]
        );
    }

    #[test]
    fn a_repeated_key_in_a_large_object_is_found_too() {
        let keys: Vec<String> = (0..40).map(|i| format!(r#""k{i}":{i}"#)).collect();
        let text = format!(r#"{{{},"k3":"late","k39":"last"}}"#, keys.join(","));
        let members = keys_and_values(&text);
        assert_eq!(members.len(), 40);
        assert_eq!(members[3], ("k3".to_owned(), r#""late""#.to_owned()));
        assert_eq!(members[39], ("k39".to_owned(), r#""last""#.to_owned()));
    }

    #[test]
    fn only_an_object_has_members() {
        for text in ["[]", "1", "\"a\"", "null", "{", "{} {}"] {
            assert!(members(text).is_none(), "{text}");
        }
    }

    #[test]
    fn value_at_follows_a_dotted_path() {
        let text = r#"{"meta": {"created_at": 1e2, "id": null}, "attempts": -0}"#;
        assert_eq!(value_at(text, "meta.created_at"), Some("1e2"));
        assert_eq!(value_at(text, "attempts"), Some("-0"));
        assert_eq!(value_at(text, "meta.queue"), None);
        assert_eq!(value_at(text, "attempts.x"), None);
    }

    #[test]
    fn a_member_is_its_last_value_found_by_its_unescaped_key() {
        let text = r#"{"data": {"a": 1}, "d\u0061ta": [2], "job": "x", "data" : {"b" : 2} }"#;
        assert_eq!(member(text, "data"), Some(r#"{"b" : 2}"#));
        assert_eq!(member(text, "job"), Some(r#""x""#));
        assert_eq!(member(text, "meta"), None);
        for not_an_object in ["[]", "1", "{", r#"{"data": 1} x"#] {
            assert_eq!(member(not_an_object, "data"), None, "{not_an_object}");
        }
    }

    #[test]
    fn compacting_drops_white_space_outside_strings_only() {
        let mut out = Vec::new();
        push_compact(
            &mut out,
            "{\n  \"a b\": [1 , 2.50],\t\"c\\\" d\": \"e \\\\\" , \"f\": 1E+2\r\n}",
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{"a b":[1,2.50],"c\" d":"e \\","f":1E+2}"#
        );
    }
}
