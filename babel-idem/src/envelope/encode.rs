//! Writing an envelope as JSON: the canonical layout for an envelope built in
//! code, the source's own text for a decoded one (the rule is on
//! [`Envelope::to_vec`]).
//!
//! A decoded envelope is written member by member against its source: the
//! source is decoded again (encoding is off the hot path, so decoding does
//! not pay to remember anything), and a member whose field still equals what
//! the source decodes to is copied from the source text.

use std::collections::HashSet;

use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::raw::{self, Member};
use super::{DeadLetter, Envelope, Meta, decode};

pub(super) fn envelope(envelope: &Envelope) -> Vec<u8> {
    envelope
        .source
        .0
        .as_deref()
        .and_then(|source| faithful(envelope, source))
        .unwrap_or_else(|| canonical(envelope))
}

fn canonical<T: Serialize + ?Sized>(value: &T) -> Vec<u8> {
    // Strings, integers and JSON values always serialize.
    serde_json::to_vec(value).unwrap_or_default()
}

/// `None` only if the source no longer decodes, which cannot happen: it
/// decoded once, and decoding is deterministic.
fn faithful(envelope: &Envelope, source: &str) -> Option<Vec<u8>> {
    let original = decode::text(source).ok()?;
    let mut members = raw::members(source)?;
    // The `urn` alias carried the URN: `job` takes its place.
    if !members.iter().any(|member| member.key == "job")
        && let Some(alias) = members.iter_mut().find(|member| member.key == "urn")
    {
        alias.key = "job".to_owned();
    }
    let mut out = Vec::with_capacity(source.len() + 16);
    write_object(&mut out, envelope, &original, &members);
    Some(out)
}

/// How one known member is written.
enum Write {
    /// Unchanged: as the source has it (or, absent there, not at all).
    Keep,
    /// Changed: this JSON instead.
    Replace(Vec<u8>),
    /// Removed: not at all.
    Omit,
}

/// One JSON object of the envelope: known members held in fields, unknown
/// ones in `extra`.
trait Block {
    /// The keys of the known members.
    const KNOWN: &'static [&'static str];

    fn extra(&self) -> &Map<String, Value>;

    /// How to write the known member `key` of `self`, given `was`, the block
    /// as the source decodes, and `raw`, the member's source text (`None`
    /// when the source lacks the member). Asked only for keys in `KNOWN`.
    fn known(&self, was: &Self, key: &str, raw: Option<&RawValue>) -> Write;
}

/// Writes `now` as a JSON object in the order of the source's `members`;
/// known members the source lacks and new unknown fields come last.
fn write_object<B: Block>(out: &mut Vec<u8>, now: &B, was: &B, members: &[Member<'_>]) {
    let mut object = ObjectWriter::new(out);
    for member in members {
        let write = if B::KNOWN.contains(&member.key.as_str()) {
            now.known(was, &member.key, Some(member.value))
        } else {
            match (now.extra().get(&member.key), was.extra().get(&member.key)) {
                (Some(value), was) => unchanged_or(Some(value) == was, value),
                (None, _) => Write::Omit,
            }
        };
        match write {
            Write::Keep => object.raw(&member.key, member.value),
            Write::Replace(json) => object.json(&member.key, &json),
            Write::Omit => {}
        }
    }
    let in_source: HashSet<&str> = members.iter().map(|member| member.key.as_str()).collect();
    for key in B::KNOWN.iter().filter(|key| !in_source.contains(*key)) {
        if let Write::Replace(json) = now.known(was, key, None) {
            object.json(key, &json);
        }
    }
    for (key, value) in now.extra() {
        if !in_source.contains(key.as_str()) {
            object.json(key, &canonical(value));
        }
    }
    object.end();
}

/// Writes one object's members: `{"key":value,...}`, compact.
struct ObjectWriter<'a> {
    out: &'a mut Vec<u8>,
    first: bool,
}

impl<'a> ObjectWriter<'a> {
    fn new(out: &'a mut Vec<u8>) -> Self {
        out.push(b'{');
        ObjectWriter { out, first: true }
    }

    fn key(&mut self, key: &str) {
        if !self.first {
            self.out.push(b',');
        }
        self.first = false;
        self.out.extend_from_slice(&canonical(key));
        self.out.push(b':');
    }

    fn raw(&mut self, key: &str, value: &RawValue) {
        self.key(key);
        raw::push_compact(self.out, value.get());
    }

    fn json(&mut self, key: &str, json: &[u8]) {
        self.key(key);
        self.out.extend_from_slice(json);
    }

    fn end(self) {
        self.out.push(b'}');
    }
}

fn unchanged_or<T: Serialize + ?Sized>(unchanged: bool, now: &T) -> Write {
    if unchanged {
        Write::Keep
    } else {
        Write::Replace(canonical(now))
    }
}

/// A member that is always written, `null` included.
fn scalar<T: PartialEq + Serialize + ?Sized>(now: &T, was: &T) -> Write {
    unchanged_or(now == was, now)
}

/// A member the canonical layout leaves out when it is `None`: set to `None`
/// by the code, it is left out here too.
fn omitted_when_none<T: PartialEq + Serialize>(now: &Option<T>, was: &Option<T>) -> Write {
    match now {
        None if was.is_some() => Write::Omit,
        _ => scalar(now, was),
    }
}

/// A nested block, written member by member against its own source text.
fn nested<B: Block + Serialize>(now: &B, was: &B, raw: Option<&RawValue>) -> Write {
    match raw.and_then(|raw| raw::members(raw.get())) {
        Some(members) => {
            let mut json = Vec::new();
            write_object(&mut json, now, was, &members);
            Write::Replace(json)
        }
        None => Write::Replace(canonical(now)),
    }
}

/// Writes a block of the envelope from its known members, listed once in
/// the canonical layout's order: its `Serialize` (the canonical encoding:
/// the known members, then every member of its `extra`) and its [`Block`]
/// (the faithful one). A member is `always` written (`null` included),
/// `optional` (left out when `None`), `text` (written as its `as_str()`),
/// `nested` (a block of its own), or `optional_nested` (a block of its own,
/// left out when `None`).
macro_rules! block {
    ($block:ty { $($kind:ident $member:ident),+ $(,)? }) => {
        impl Serialize for $block {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                let mut map = serializer.serialize_map(None)?;
                $(block!(@serialize $kind map, self, $member);)+
                for (key, value) in &self.extra {
                    map.serialize_entry(key, value)?;
                }
                map.end()
            }
        }

        impl Block for $block {
            const KNOWN: &'static [&'static str] = &[$(stringify!($member)),+];

            fn extra(&self) -> &Map<String, Value> {
                &self.extra
            }

            #[allow(unused_variables, reason = "only a nested member reads `raw`")]
            fn known(&self, was: &Self, key: &str, raw: Option<&RawValue>) -> Write {
                match key {
                    $(stringify!($member) => block!(@$kind self, was, raw, $member),)+
                    _ => Write::Keep,
                }
            }
        }
    };
    (@serialize text $map:ident, $block:ident, $member:ident) => {
        $map.serialize_entry(stringify!($member), $block.$member.as_str())?
    };
    (@serialize optional $map:ident, $block:ident, $member:ident) => {
        if let Some(value) = &$block.$member {
            $map.serialize_entry(stringify!($member), value)?;
        }
    };
    (@serialize optional_nested $map:ident, $block:ident, $member:ident) => {
        block!(@serialize optional $map, $block, $member)
    };
    (@serialize $kind:ident $map:ident, $block:ident, $member:ident) => {
        $map.serialize_entry(stringify!($member), &$block.$member)?
    };
    (@always $now:ident, $was:ident, $raw:ident, $member:ident) => {
        scalar(&$now.$member, &$was.$member)
    };
    (@optional $now:ident, $was:ident, $raw:ident, $member:ident) => {
        omitted_when_none(&$now.$member, &$was.$member)
    };
    (@text $now:ident, $was:ident, $raw:ident, $member:ident) => {
        scalar($now.$member.as_str(), $was.$member.as_str())
    };
    (@nested $now:ident, $was:ident, $raw:ident, $member:ident) => {
        nested(&$now.$member, &$was.$member, $raw)
    };
    (@optional_nested $now:ident, $was:ident, $raw:ident, $member:ident) => {
        match (&$now.$member, &$was.$member) {
            (Some(now), Some(was)) => nested(now, was, $raw),
            (now, was) => omitted_when_none(now, was),
        }
    };
}

block!(Envelope {
    always job,
    always trace_id,
    always data,
    nested meta,
    always attempts,
    optional_nested dead_letter,
});

block!(Meta {
    optional id,
    always queue,
    always lang,
    always schema_version,
    always created_at,
});

block!(DeadLetter {
    text reason,
    always error,
    always exception,
    always failed_at,
    always original_queue,
    always attempts,
    optional lang,
});
