//! Property tests of the envelope decoder: every valid envelope survives
//! encode then decode, a decoded envelope re-encodes to the bytes it came
//! from (apart from what the code changed), and no input at all makes the
//! decoder panic. The same, against envelopes the Python SDK writes, is in
//! `envelope_python.rs`.

mod envelope_gen;

use babel_idem::envelope::DeadLetter;
use babel_idem::envelope::DeadLetterReason;
use babel_idem::{Envelope, EnvelopeError};
use envelope_gen::{DEAD_LETTER_FIELDS, META_FIELDS, TOP_LEVEL_FIELDS, finite_float, text};
use proptest::collection::{btree_map, vec};
use proptest::option;
use proptest::prelude::*;
use serde_json::{Map, Number, Value, json};

/// Numbers at and near the edges: u64::MAX, i64::MIN and the finite floats
/// of [`finite_float`].
fn number() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<u64>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        Just(Value::from(u64::MAX)),
        Just(Value::from(i64::MIN)),
        finite_float().prop_filter_map("JSON has no NaN or infinity", |float| {
            Number::from_f64(float).map(Value::Number)
        }),
    ]
}

/// Any JSON value, nested a few levels deep.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        number(),
        text().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..6).prop_map(Value::Array),
            btree_map(text(), inner, 0..6).prop_map(|map| Value::Object(map.into_iter().collect())),
        ]
    })
}

fn json_object() -> impl Strategy<Value = Map<String, Value>> {
    btree_map(text(), json_value(), 0..6).prop_map(|map| map.into_iter().collect())
}

/// Unknown fields: any names except the ones the block defines.
fn unknown_fields(known: &'static [&'static str]) -> impl Strategy<Value = Map<String, Value>> {
    btree_map(
        text().prop_filter("a known field", move |key| !known.contains(&key.as_str())),
        json_value(),
        0..3,
    )
    .prop_map(|map| map.into_iter().collect())
}

fn non_empty_text() -> impl Strategy<Value = String> {
    text().prop_filter("empty", |s| !s.is_empty())
}

fn non_blank_text() -> impl Strategy<Value = String> {
    text().prop_filter("blank", |s| !s.trim().is_empty())
}

fn dead_letter_reason() -> impl Strategy<Value = DeadLetterReason> {
    prop_oneof![
        Just(DeadLetterReason::Failed),
        Just(DeadLetterReason::UnknownUrn),
        Just(DeadLetterReason::Poison),
        text()
            .prop_filter("a named reason", |r| !["failed", "unknown_urn", "poison"]
                .contains(&r.as_str()))
            .prop_map(DeadLetterReason::Other),
    ]
}

prop_compose! {
    fn dead_letter()(
        reason in dead_letter_reason(),
        original_queue in text(),
        attempts in any::<u64>(),
        failed_at in any::<u64>(),
        error in option::of(text()),
        exception in option::of(text()),
        lang in option::of(text()),
        extra in unknown_fields(DEAD_LETTER_FIELDS),
    ) -> DeadLetter {
        let mut block = DeadLetter::new(reason, original_queue, attempts);
        block.failed_at = failed_at;
        block.error = error;
        block.exception = exception;
        block.lang = lang;
        block.extra = extra;
        block
    }
}

prop_compose! {
    fn meta_parts()(
        id in option::of(text()),
        queue in text(),
        lang in text(),
        created_at in any::<u64>(),
        extra in unknown_fields(META_FIELDS),
    ) -> (Option<String>, String, String, u64, Map<String, Value>) {
        (id, queue, lang, created_at, extra)
    }
}

prop_compose! {
    /// Any envelope the decoder must accept.
    fn valid_envelope()(
        job in non_empty_text(),
        trace_id in non_blank_text(),
        data in json_object(),
        (id, queue, lang, created_at, meta_extra) in meta_parts(),
        attempts in any::<u64>(),
        dead_letter in option::of(dead_letter()),
        extra in unknown_fields(TOP_LEVEL_FIELDS),
    ) -> Envelope {
        let mut envelope = Envelope::new(job, Value::Object(data))
            .with_trace_id(trace_id)
            .with_queue(queue)
            .with_attempts(attempts);
        envelope.meta.id = id;
        envelope.meta.lang = lang;
        envelope.meta.created_at = created_at;
        envelope.meta.extra = meta_extra;
        envelope.dead_letter = dead_letter;
        envelope.extra = extra;
        envelope
    }
}

/// Every place a field lives, for replacing one with an arbitrary value.
const FIELD_PATHS: &[&[&str]] = &[
    &["job"],
    &["urn"],
    &["trace_id"],
    &["data"],
    &["meta"],
    &["attempts"],
    &["dead_letter"],
    &["meta", "id"],
    &["meta", "queue"],
    &["meta", "lang"],
    &["meta", "schema_version"],
    &["meta", "created_at"],
    &["dead_letter", "reason"],
    &["dead_letter", "error"],
    &["dead_letter", "failed_at"],
    &["dead_letter", "attempts"],
    &["dead_letter", "lang"],
];

fn a_valid_wire_envelope() -> Value {
    json!({
        "job": "urn:babel:orders:created",
        "trace_id": "7e0a4c1f-2b3d-4e5f-8a9b-0c1d2e3f4a5b",
        "data": {"order_id": 5},
        "meta": {"id": "b1c2d3e4-f5a6-4b7c-8d9e-0f1a2b3c4d5e", "queue": "orders", "lang": "go",
                 "schema_version": 1, "created_at": 1764512400123u64},
        "attempts": 0,
        "dead_letter": {"reason": "failed", "error": null, "failed_at": 1, "original_queue": "orders", "attempts": 1}
    })
}

/// Whatever the decoder accepted must re-encode to an envelope it accepts
/// again, unchanged.
fn assert_stable(decoded: Result<Envelope, EnvelopeError>) -> Result<(), TestCaseError> {
    if let Ok(envelope) = decoded {
        let again = Envelope::from_slice(&envelope.to_vec());
        prop_assert!(again.is_ok(), "re-encoded envelope rejected: {:?}", again);
        prop_assert_eq!(again.unwrap(), envelope);
    }
    Ok(())
}

/// `value` as compact JSON with every object's keys in reverse order, so
/// the text is in neither serde_json's (sorted) order nor the canonical one.
fn reversed_text(value: &Value) -> String {
    match value {
        Value::Object(map) => {
            let members: Vec<String> = map
                .iter()
                .rev()
                .map(|(key, value)| {
                    format!(
                        "{}:{}",
                        serde_json::to_string(key).unwrap(),
                        reversed_text(value)
                    )
                })
                .collect();
            format!("{{{}}}", members.join(","))
        }
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(reversed_text).collect();
            format!("[{}]", items.join(","))
        }
        other => serde_json::to_string(other).unwrap(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn a_decoded_envelope_re_encodes_to_its_own_bytes(envelope in valid_envelope()) {
        let value = envelope.to_value();
        let text = reversed_text(&value);
        let decoded: Envelope = text.parse().unwrap();
        prop_assert_eq!(String::from_utf8(decoded.to_vec()).unwrap(), text);

        // Changing one member rewrites that member only, in its place.
        let attempts = decoded.attempts.wrapping_add(1);
        let mut changed = value;
        changed["attempts"] = json!(attempts);
        prop_assert_eq!(
            String::from_utf8(decoded.with_attempts(attempts).to_vec()).unwrap(),
            reversed_text(&changed)
        );
    }

    #[test]
    fn decode_of_encode_is_the_identity(envelope in valid_envelope()) {
        let bytes = envelope.to_vec();
        let decoded = Envelope::from_slice(&bytes);
        prop_assert!(decoded.is_ok(), "rejected {}: {:?}", String::from_utf8_lossy(&bytes), decoded);
        prop_assert_eq!(decoded.unwrap(), envelope.clone());
        // The value path and the string path agree with the byte path.
        prop_assert_eq!(Envelope::from_value(envelope.to_value()).unwrap(), envelope.clone());
        let text = String::from_utf8(bytes).unwrap();
        prop_assert_eq!(text.parse::<Envelope>().unwrap(), envelope);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in vec(any::<u8>(), 0..512)) {
        assert_stable(Envelope::from_slice(&bytes))?;
    }

    #[test]
    fn corrupted_envelope_bytes_never_panic(
        edits in vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
    ) {
        let mut bytes = serde_json::to_vec(&a_valid_wire_envelope()).unwrap();
        for (at, byte) in edits {
            let at = at.index(bytes.len());
            bytes[at] = byte;
        }
        assert_stable(Envelope::from_slice(&bytes))?;
    }

    #[test]
    fn arbitrary_json_values_never_panic(value in json_value()) {
        assert_stable(Envelope::from_value(value.clone()))?;
        let bytes = serde_json::to_vec(&value).unwrap();
        assert_stable(Envelope::from_slice(&bytes))?;
    }

    #[test]
    fn any_value_in_any_field_decodes_or_is_a_typed_error(
        path in prop::sample::select(FIELD_PATHS),
        value in json_value(),
    ) {
        let mut envelope = a_valid_wire_envelope();
        let (last, parents) = path.split_last().unwrap();
        let parent = parents.iter().fold(&mut envelope, |node, key| &mut node[*key]);
        parent.as_object_mut().unwrap().insert((*last).to_owned(), value);
        assert_stable(Envelope::from_value(envelope))?;
    }
}
