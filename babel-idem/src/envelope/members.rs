//! The members decoding takes apart, each known one in a slot of its own,
//! read straight from the JSON text or moved out of an already parsed object.
//!
//! Read from text, a known member's name is matched where it lies in the
//! text and never allocated, and no map is built only to be taken apart
//! again: this is most of what decoding costs a consumer per delivery. As in
//! a parsed object, a member named twice keeps its last value.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// Declares a struct of [`Slots`]: a field of `Option<Value>` for each
/// known member, named as the member, any other fields given after the
/// braces, and `extra` for every other member.
macro_rules! slots {
    (
        $(#[$doc:meta])*
        $name:ident { $($slot:ident),+ }
        $($(#[$field_doc:meta])* $field:ident: $ty:ty,)*
    ) => {
        $(#[$doc])*
        #[derive(Default)]
        pub(super) struct $name {
            $(pub(super) $slot: Option<Value>,)+
            $($(#[$field_doc])* pub(super) $field: $ty,)*
            /// Every other member.
            pub(super) extra: Map<String, Value>,
        }

        impl Slots for $name {
            fn slot(&mut self, name: &str) -> Option<&mut Option<Value>> {
                Some(match name {
                    $(stringify!($slot) => &mut self.$slot,)+
                    _ => return None,
                })
            }

            fn extra(&mut self) -> &mut Map<String, Value> {
                &mut self.extra
            }
        }
    };
}

slots! {
    /// The envelope's top-level members.
    Members { job, urn, trace_id, data, attempts, dead_letter }
    /// `meta`, moved in on its own.
    meta: Option<MetaBlock>,
}

slots! {
    /// The members of `meta`.
    MetaMembers { id, queue, lang, schema_version, created_at }
}

/// `meta`, which must be an object: its members, or the value found instead
/// (for the error that names its type).
pub(super) enum MetaBlock {
    Object(MetaMembers),
    Other(Value),
}

/// Slots filled one named member at a time.
trait Slots: Default {
    /// The slot for a known `name`, or `None` to keep the member in `extra`.
    fn slot(&mut self, name: &str) -> Option<&mut Option<Value>>;
    fn extra(&mut self) -> &mut Map<String, Value>;

    /// Puts `value` in `name`'s slot, or in `extra`.
    fn put(&mut self, name: Cow<'_, str>, value: Value) {
        match self.slot(&name) {
            Some(slot) => *slot = Some(value),
            None => {
                self.extra().insert(name.into_owned(), value);
            }
        }
    }

    /// Moves the members of a parsed object into their slots.
    fn from_map(map: Map<String, Value>) -> Self {
        let mut slots = Self::default();
        for (name, value) in map {
            slots.put(Cow::Owned(name), value);
        }
        slots
    }
}

impl Members {
    /// The members of a parsed top-level object.
    pub(super) fn from_object(mut map: Map<String, Value>) -> Self {
        let meta = map.remove("meta").map(MetaBlock::from_value);
        Members {
            meta,
            ..Slots::from_map(map)
        }
    }
}

impl MetaBlock {
    fn from_value(value: Value) -> Self {
        match value {
            Value::Object(map) => MetaBlock::Object(MetaMembers::from_map(map)),
            other => MetaBlock::Other(other),
        }
    }
}

impl<'de> Deserialize<'de> for Members {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct TopLevel;

        impl<'de> Visitor<'de> for TopLevel {
            type Value = Members;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Members, A::Error> {
                let mut members = Members::default();
                while let Some(Name(name)) = map.next_key()? {
                    if name == "meta" {
                        members.meta = Some(map.next_value()?);
                    } else {
                        members.put(name, map.next_value()?);
                    }
                }
                Ok(members)
            }
        }

        deserializer.deserialize_map(TopLevel)
    }
}

impl<'de> Deserialize<'de> for MetaBlock {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct MetaVisitor;

        /// Any value other than an object is kept whole, for the error.
        macro_rules! other {
            ($($method:ident($type:ty) => $value:expr;)*) => {$(
                fn $method<E: de::Error>(self, v: $type) -> Result<Self::Value, E> {
                    Ok(MetaBlock::Other($value(v)))
                }
            )*};
        }

        impl<'de> Visitor<'de> for MetaVisitor {
            type Value = MetaBlock;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut meta = MetaMembers::default();
                while let Some(Name(name)) = map.next_key()? {
                    meta.put(name, map.next_value()?);
                }
                Ok(MetaBlock::Object(meta))
            }

            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
                Value::deserialize(de::value::SeqAccessDeserializer::new(seq)).map(MetaBlock::Other)
            }

            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(MetaBlock::Other(Value::Null))
            }

            other! {
                visit_bool(bool) => Value::Bool;
                visit_i64(i64) => Value::from;
                visit_u64(u64) => Value::from;
                visit_f64(f64) => Value::from;
                visit_str(&str) => Value::from;
                visit_string(String) => Value::String;
            }
        }

        deserializer.deserialize_any(MetaVisitor)
    }
}

/// A member's name, borrowed from the text when it holds no escape.
struct Name<'de>(Cow<'de, str>);

impl<'de> Deserialize<'de> for Name<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct NameVisitor;

        impl<'de> Visitor<'de> for NameVisitor {
            type Value = Name<'de>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a member name")
            }

            fn visit_borrowed_str<E: de::Error>(self, name: &'de str) -> Result<Name<'de>, E> {
                Ok(Name(Cow::Borrowed(name)))
            }

            fn visit_str<E: de::Error>(self, name: &str) -> Result<Name<'de>, E> {
                Ok(Name(Cow::Owned(name.to_owned())))
            }

            fn visit_string<E: de::Error>(self, name: String) -> Result<Name<'de>, E> {
                Ok(Name(Cow::Owned(name)))
            }
        }

        deserializer.deserialize_str(NameVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &str) -> Members {
        serde_json::from_str(text).unwrap()
    }

    #[test]
    fn text_and_parsed_object_fill_the_same_slots() {
        let text = r#"{"job":"j","urn":"u","trace_id":"t","data":{"a":1},"x":[1],"meta":{"id":"i","queue":"q","lang":"go","schema_version":1,"created_at":2,"y":null},"attempts":3,"dead_letter":null}"#;
        let Value::Object(object) = serde_json::from_str(text).unwrap() else {
            unreachable!()
        };
        for members in [read(text), Members::from_object(object)] {
            assert_eq!(members.job, Some(Value::from("j")));
            assert_eq!(members.urn, Some(Value::from("u")));
            assert_eq!(members.trace_id, Some(Value::from("t")));
            assert_eq!(members.data, Some(serde_json::json!({"a": 1})));
            assert_eq!(members.attempts, Some(Value::from(3)));
            assert_eq!(members.dead_letter, Some(Value::Null));
            assert_eq!(
                members.extra,
                serde_json::json!({"x": [1]}).as_object().unwrap().clone()
            );
            let Some(MetaBlock::Object(meta)) = members.meta else {
                panic!("meta is an object")
            };
            assert_eq!(meta.id, Some(Value::from("i")));
            assert_eq!(meta.queue, Some(Value::from("q")));
            assert_eq!(meta.lang, Some(Value::from("go")));
            assert_eq!(meta.schema_version, Some(Value::from(1)));
            assert_eq!(meta.created_at, Some(Value::from(2)));
            assert_eq!(
                meta.extra,
                serde_json::json!({"y": null}).as_object().unwrap().clone()
            );
        }
    }

    #[test]
    fn a_member_named_twice_keeps_its_last_value_as_a_parsed_object_does() {
        let members =
            read(r#"{"job":"first","meta":{"id":"a","id":"b"},"job":"last","x":1,"x":2}"#);
        assert_eq!(members.job, Some(Value::from("last")));
        assert_eq!(members.extra["x"], 2);
        let Some(MetaBlock::Object(meta)) = members.meta else {
            panic!("meta is an object")
        };
        assert_eq!(meta.id, Some(Value::from("b")));
    }

    #[test]
    fn escaped_names_are_matched_by_their_text() {
        let members = read(r#"{"j\u006fb":"urn:x","\u00e9":1}"#);
        assert_eq!(members.job, Some(Value::from("urn:x")));
        assert_eq!(members.extra["é"], 1);
    }

    #[test]
    fn a_meta_that_is_not_an_object_is_kept_whole() {
        for (text, expected) in [
            (r#"{"meta":[1,{"a":2}]}"#, serde_json::json!([1, {"a": 2}])),
            (r#"{"meta":"m"}"#, Value::from("m")),
            (r#"{"meta":null}"#, Value::Null),
            (r#"{"meta":-1.5}"#, Value::from(-1.5)),
            (r#"{"meta":true}"#, Value::Bool(true)),
            (r#"{"meta":18446744073709551615}"#, Value::from(u64::MAX)),
        ] {
            match read(text).meta {
                Some(MetaBlock::Other(value)) => assert_eq!(value, expected, "{text}"),
                _ => panic!("{text}: meta kept whole"),
            }
        }
    }
}
