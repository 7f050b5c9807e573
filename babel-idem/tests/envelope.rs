//! The v1 envelope: decoding, every rejection rule with its own error, the
//! `urn` alias, unknown fields kept, the dead-letter block, the producer
//! builder, and bad input (huge and unusual ids, missing `meta.id`).
//! The property tests are in `envelope_props.rs`.

use std::sync::atomic::{AtomicU32, Ordering};

use babel_idem::envelope::DeadLetter;
use babel_idem::envelope::DeadLetterReason;
use babel_idem::envelope::{IntegerProblem, LANG, MAX_INTEGER, SCHEMA_VERSION};
use babel_idem::{Envelope, EnvelopeError, InMemoryStore, MessageId, StoreError, run_once};
use serde_json::{Value, json};

/// A complete, valid envelope with every optional block present.
fn full() -> Value {
    json!({
        "job": "urn:babel:shipments:dispatched",
        "trace_id": "4c1d9e2a-7f3b-4a5c-9d8e-1f2a3b4c5d6e",
        "data": {"shipment": "SH-9", "parcels": 3},
        "meta": {
            "id": "a7b6c5d4-e3f2-4a1b-8c9d-0e1f2a3b4c5d",
            "queue": "shipping",
            "lang": "go",
            "schema_version": 1,
            "created_at": 1764512400123u64
        },
        "attempts": 2,
        "dead_letter": {
            "reason": "failed",
            "error": "carrier API down",
            "exception": "CarrierError",
            "failed_at": 1764512409999u64,
            "original_queue": "shipping",
            "attempts": 2,
            "lang": "go"
        }
    })
}

/// `full()` with the value at `path` (slash separated) replaced, or removed
/// when `value` is `None`.
fn edited(path: &str, value: Option<Value>) -> Value {
    let mut envelope = full();
    let mut keys: Vec<&str> = path.split('/').collect();
    let last = keys.pop().unwrap();
    let parent = keys.iter().fold(&mut envelope, |node, key| &mut node[*key]);
    let object = parent.as_object_mut().expect("the parent is an object");
    match value {
        Some(value) => object.insert(last.to_owned(), value),
        None => object.remove(last),
    };
    envelope
}

fn with(path: &str, value: Value) -> Value {
    edited(path, Some(value))
}

fn without(path: &str) -> Value {
    edited(path, None)
}

/// Decodes through the byte path, the one a consumer uses.
fn decode(value: &Value) -> Result<Envelope, EnvelopeError> {
    Envelope::from_slice(&serde_json::to_vec(value).unwrap())
}

fn reencoded(envelope: &Envelope) -> Envelope {
    Envelope::from_slice(&envelope.to_vec()).expect("a decoded envelope re-encodes to a valid one")
}

// ---------------------------------------------------------------- decoding

#[test]
fn a_full_envelope_decodes_field_by_field() {
    let envelope = decode(&full()).unwrap();
    assert_eq!(envelope.urn(), "urn:babel:shipments:dispatched");
    assert_eq!(envelope.job, "urn:babel:shipments:dispatched");
    assert_eq!(envelope.trace_id, "4c1d9e2a-7f3b-4a5c-9d8e-1f2a3b4c5d6e");
    assert_eq!(
        Value::Object(envelope.data.clone()),
        json!({"shipment": "SH-9", "parcels": 3})
    );
    assert_eq!(envelope.attempts, 2);
    assert_eq!(
        envelope.meta.id.as_deref(),
        Some("a7b6c5d4-e3f2-4a1b-8c9d-0e1f2a3b4c5d")
    );
    assert_eq!(envelope.meta.queue, "shipping");
    assert_eq!(envelope.meta.lang, "go");
    assert_eq!(envelope.meta.schema_version, SCHEMA_VERSION);
    assert_eq!(envelope.meta.created_at, 1_764_512_400_123);
    assert!(envelope.extra.is_empty() && envelope.meta.extra.is_empty());

    let block = envelope.dead_letter.as_ref().expect("dead_letter decoded");
    assert_eq!(block.reason, DeadLetterReason::Failed);
    assert_eq!(block.error.as_deref(), Some("carrier API down"));
    assert_eq!(block.exception.as_deref(), Some("CarrierError"));
    assert_eq!(block.failed_at, 1_764_512_409_999);
    assert_eq!(block.original_queue, "shipping");
    assert_eq!(block.attempts, 2);
    assert_eq!(block.lang.as_deref(), Some("go"));
}

#[test]
fn every_entry_point_decodes_the_same_envelope() {
    let text = serde_json::to_string(&full()).unwrap();
    let from_slice = Envelope::from_slice(text.as_bytes()).unwrap();
    assert_eq!(text.parse::<Envelope>().unwrap(), from_slice);
    assert_eq!(Envelope::try_from(text.as_bytes()).unwrap(), from_slice);
    assert_eq!(Envelope::from_value(full()).unwrap(), from_slice);
    assert_eq!(serde_json::from_str::<Envelope>(&text).unwrap(), from_slice);
}

#[test]
fn the_deserialize_impl_applies_the_same_rules() {
    let text = serde_json::to_string(&without("job")).unwrap();
    let error = serde_json::from_str::<Envelope>(&text).unwrap_err();
    assert!(error.to_string().contains("no `job` or `urn`"), "{error}");
}

#[test]
fn optional_fields_absent_or_null_take_their_defaults() {
    let mut envelope = full();
    envelope.as_object_mut().unwrap().remove("dead_letter");
    envelope["attempts"] = Value::Null;
    for field in ["queue", "lang", "created_at"] {
        envelope["meta"].as_object_mut().unwrap().remove(field);
    }
    let decoded = decode(&envelope).unwrap();
    assert_eq!(decoded.attempts, 0);
    assert_eq!(decoded.meta.queue, "");
    assert_eq!(decoded.meta.lang, "");
    assert_eq!(decoded.meta.created_at, 0);
    assert_eq!(decoded.dead_letter, None);
    assert_eq!(
        decode(&with("dead_letter", Value::Null))
            .unwrap()
            .dead_letter,
        None
    );
}

// ---------------------------------------------------------- the urn alias

#[test]
fn urn_is_accepted_as_an_alias_of_job() {
    let mut alias = without("job");
    alias["urn"] = json!("urn:babel:shipments:dispatched");
    let envelope = decode(&alias).unwrap();
    assert_eq!(envelope.urn(), "urn:babel:shipments:dispatched");
    assert!(
        !envelope.extra.contains_key("urn"),
        "the alias is consumed, not kept twice"
    );
    assert_eq!(envelope, decode(&full()).unwrap());
}

#[test]
fn the_encoder_writes_job_never_the_alias() {
    let mut alias = without("job");
    alias["urn"] = json!("urn:babel:shipments:dispatched");
    let encoded: Value = serde_json::from_slice(&decode(&alias).unwrap().to_vec()).unwrap();
    assert_eq!(encoded["job"], "urn:babel:shipments:dispatched");
    assert!(encoded.get("urn").is_none());
}

#[test]
fn with_both_job_and_urn_job_wins_and_urn_is_kept() {
    let both = with("urn", json!("urn:babel:shipments:other"));
    let envelope = decode(&both).unwrap();
    assert_eq!(envelope.urn(), "urn:babel:shipments:dispatched");
    assert_eq!(envelope.extra["urn"], "urn:babel:shipments:other");
    let encoded = envelope.to_value();
    assert_eq!(encoded["urn"], "urn:babel:shipments:other");
    assert_eq!(reencoded(&envelope), envelope);
}

// ------------------------------------------------------- rejection rules

#[test]
fn an_unknown_schema_version_is_rejected_naming_the_version() {
    for version in [0u64, 2, 7, MAX_INTEGER] {
        let error = decode(&with("meta/schema_version", json!(version))).unwrap_err();
        assert!(
            matches!(error, EnvelopeError::UnsupportedSchemaVersion(found) if found == version),
            "{version}: {error:?}"
        );
        assert!(
            error
                .to_string()
                .contains(&format!("schema_version {version} is not supported"))
        );
    }
}

#[test]
fn a_missing_schema_version_is_its_own_rule() {
    for envelope in [
        without("meta/schema_version"),
        with("meta/schema_version", Value::Null),
    ] {
        let error = decode(&envelope).unwrap_err();
        assert!(
            matches!(error, EnvelopeError::MissingSchemaVersion),
            "{error:?}"
        );
        assert_eq!(error.to_string(), "envelope has no meta.schema_version");
    }
}

#[test]
fn the_schema_version_is_checked_before_the_other_rules() {
    // An envelope of a future version may be shaped differently: say so, not "no job".
    let mut future = without("job");
    future["meta"]["schema_version"] = json!(2);
    future["data"] = json!("a v2 payload");
    let error = decode(&future).unwrap_err();
    assert!(
        matches!(error, EnvelopeError::UnsupportedSchemaVersion(2)),
        "{error:?}"
    );
}

#[test]
fn no_job_or_urn_is_rejected() {
    let no_urn = without("job");
    let mut empty_urn = without("job");
    empty_urn["urn"] = json!("");
    let mut null_urn = without("job");
    null_urn["urn"] = Value::Null;
    for envelope in [
        no_urn,
        with("job", json!("")),
        with("job", Value::Null),
        empty_urn,
        null_urn,
    ] {
        let error = decode(&envelope).unwrap_err();
        assert!(
            matches!(error, EnvelopeError::MissingUrn),
            "{envelope}: {error:?}"
        );
        assert!(error.to_string().contains("no `job` or `urn`"));
    }
}

#[test]
fn a_blank_trace_id_is_rejected() {
    let blanks =
        ["", " ", "\t\n", "\u{3000}", "\u{2003}\r"].map(|blank| with("trace_id", json!(blank)));
    for envelope in blanks
        .into_iter()
        .chain([without("trace_id"), with("trace_id", Value::Null)])
    {
        let error = decode(&envelope).unwrap_err();
        assert!(
            matches!(error, EnvelopeError::BlankTraceId),
            "{envelope}: {error:?}"
        );
        assert!(error.to_string().contains("trace_id"));
    }
}

#[test]
fn data_that_is_not_an_object_is_rejected_naming_what_it_was() {
    for (data, found) in [
        (Some(json!([1, 2])), "array"),
        (Some(json!("text")), "string"),
        (Some(json!(42)), "number"),
        (Some(json!(1.5)), "number"),
        (Some(json!(-1)), "number"),
        (Some(json!(true)), "boolean"),
        (Some(Value::Null), "null"),
        (None, "absent"),
    ] {
        let error = decode(&edited("data", data)).unwrap_err();
        assert!(
            matches!(error, EnvelopeError::DataNotObject { found: f } if f == found),
            "{found}: {error:?}"
        );
        assert!(error.to_string().contains(&format!("(found {found})")));
    }
}

#[test]
fn bytes_that_are_not_json_are_rejected() {
    let not_json: [&[u8]; 8] = [
        b"",
        b"   ",
        b"{",
        b"{\"job\": \"urn:x\",}",
        b"nul",
        b"{} trailing",
        b"\xff\xfe{}",
        b"{\"job\": \"\xc3\x28\"}",
    ];
    for bytes in not_json {
        let error = Envelope::from_slice(bytes).unwrap_err();
        assert!(
            matches!(error, EnvelopeError::NotJson(_)),
            "{bytes:?}: {error:?}"
        );
        assert!(
            std::error::Error::source(&error).is_some(),
            "the parser's error is the source"
        );
        assert!(error.to_string().starts_with("envelope is not valid JSON"));
    }
}

#[test]
fn json_that_is_not_an_object_is_rejected_naming_its_type() {
    for (text, found) in [
        ("[]", "array"),
        ("\"envelope\"", "string"),
        ("12", "number"),
        ("-12", "number"),
        ("1e2", "number"),
        ("null", "null"),
        ("false", "boolean"),
    ] {
        let error = text.parse::<Envelope>().unwrap_err();
        assert!(
            matches!(error, EnvelopeError::NotAnObject { found: f } if f == found),
            "{text}: {error:?}"
        );
    }
}

#[test]
fn a_missing_meta_block_is_rejected() {
    // No meta means no schema_version: the consumer cannot know how to read it.
    let error = decode(&without("meta")).unwrap_err();
    assert!(
        matches!(error, EnvelopeError::MissingField("meta")),
        "{error:?}"
    );
    assert_eq!(error.to_string(), "envelope has no `meta`");
}

#[test]
fn a_wrong_type_in_any_field_names_the_field() {
    let table: Vec<(&str, Value, &str, &str)> = vec![
        ("job", json!(5), "job", "number"),
        ("job", json!(["urn:x"]), "job", "array"),
        ("trace_id", json!(7), "trace_id", "number"),
        ("trace_id", json!({"id": "t"}), "trace_id", "object"),
        ("trace_id", json!(true), "trace_id", "boolean"),
        ("meta", json!("shipping"), "meta", "string"),
        ("meta", json!([]), "meta", "array"),
        ("attempts", json!("2"), "attempts", "string"),
        ("meta/id", json!(42), "meta.id", "number"),
        ("meta/id", json!(false), "meta.id", "boolean"),
        ("meta/id", json!({"uuid": "x"}), "meta.id", "object"),
        ("meta/id", json!(["x"]), "meta.id", "array"),
        ("meta/queue", json!(1), "meta.queue", "number"),
        ("meta/lang", json!(["go"]), "meta.lang", "array"),
        (
            "meta/schema_version",
            json!("1"),
            "meta.schema_version",
            "string",
        ),
        (
            "meta/schema_version",
            json!(true),
            "meta.schema_version",
            "boolean",
        ),
        (
            "meta/created_at",
            json!("2025-06-05"),
            "meta.created_at",
            "string",
        ),
        ("dead_letter", json!("failed"), "dead_letter", "string"),
        ("dead_letter", json!([]), "dead_letter", "array"),
        (
            "dead_letter/reason",
            json!(1),
            "dead_letter.reason",
            "number",
        ),
        (
            "dead_letter/error",
            json!(500),
            "dead_letter.error",
            "number",
        ),
        (
            "dead_letter/exception",
            json!(false),
            "dead_letter.exception",
            "boolean",
        ),
        (
            "dead_letter/failed_at",
            json!("yesterday"),
            "dead_letter.failed_at",
            "string",
        ),
        (
            "dead_letter/original_queue",
            json!(3),
            "dead_letter.original_queue",
            "number",
        ),
        ("dead_letter/lang", json!(5), "dead_letter.lang", "number"),
    ];
    for (path, value, field, found) in table {
        let error = decode(&with(path, value.clone())).unwrap_err();
        match &error {
            EnvelopeError::WrongType {
                field: f,
                found: got,
                ..
            } => {
                assert_eq!((*f, *got), (field, found), "{path} = {value}");
            }
            other => panic!("{path} = {value}: expected WrongType, got {other:?}"),
        }
        let message = error.to_string();
        assert!(
            message.contains(&format!("`{field}`")) && message.contains(found),
            "{message}"
        );
    }

    let mut alias = without("job");
    alias["urn"] = json!(true);
    let error = decode(&alias).unwrap_err();
    assert!(
        matches!(
            error,
            EnvelopeError::WrongType {
                field: "urn",
                found: "boolean",
                ..
            }
        ),
        "{error:?}"
    );
}

#[test]
fn a_dead_letter_block_without_a_reason_is_rejected() {
    let error = decode(&without("dead_letter/reason")).unwrap_err();
    assert!(
        matches!(
            error,
            EnvelopeError::WrongType {
                field: "dead_letter.reason",
                found: "absent",
                ..
            }
        ),
        "{error:?}"
    );
}

// ------------------------------------------------------ integer fields

/// Every integer field, as a path for `with` and as its error names it.
const INTEGER_FIELDS: [(&str, &str); 5] = [
    ("attempts", "attempts"),
    ("meta/schema_version", "meta.schema_version"),
    ("meta/created_at", "meta.created_at"),
    ("dead_letter/failed_at", "dead_letter.failed_at"),
    ("dead_letter/attempts", "dead_letter.attempts"),
];

/// `full()` as text with the integer at `path` spelled `literal`.
fn with_literal(path: &str, literal: &str) -> String {
    const MARK: &str = "\"__literal__\"";
    serde_json::to_string(&with(path, json!("__literal__")))
        .unwrap()
        .replace(MARK, literal)
}

#[test]
fn the_largest_counters_decode() {
    let envelope = decode(&with("attempts", json!(MAX_INTEGER))).unwrap();
    assert_eq!(envelope.attempts, u64::MAX);
    let envelope = decode(&with("meta/created_at", json!(MAX_INTEGER))).unwrap();
    assert_eq!(envelope.meta.created_at, MAX_INTEGER);
    assert_eq!(reencoded(&envelope), envelope);
}

#[test]
fn each_refused_integer_says_what_is_wrong_with_it() {
    // The issue's three cases were all reported as "found fractional number".
    for (literal, problem) in [
        ("18446744073709551616", IntegerProblem::OutOfRange),
        ("123456789012345678901234567890", IntegerProblem::OutOfRange),
        ("1e2", IntegerProblem::Exponent),
        ("1E+2", IntegerProblem::Exponent),
        ("1.0", IntegerProblem::Fraction),
        ("2.5", IntegerProblem::Fraction),
        ("-0.0", IntegerProblem::Fraction),
        ("-1", IntegerProblem::Negative),
        ("-18446744073709551617", IntegerProblem::Negative),
    ] {
        for (path, field) in INTEGER_FIELDS {
            let error = with_literal(path, literal).parse::<Envelope>().unwrap_err();
            assert!(
                matches!(
                    error,
                    EnvelopeError::InvalidInteger { field: f, problem: p } if f == field && p == problem
                ),
                "{path} = {literal}: {error:?}"
            );
            let message = error.to_string();
            assert!(
                message.contains(&format!("`{field}`"))
                    && message.contains(&problem.to_string())
                    && message.contains("from 0 to 18446744073709551615"),
                "{message}"
            );
        }
    }
}

#[test]
fn negative_zero_reads_as_zero_as_the_python_sdk_reads_it() {
    type Read = fn(&Envelope) -> u64;
    let fields: [(&str, Read); 4] = [
        ("attempts", |e| e.attempts),
        ("meta/created_at", |e| e.meta.created_at),
        ("dead_letter/failed_at", |e| {
            e.dead_letter.as_ref().unwrap().failed_at
        }),
        ("dead_letter/attempts", |e| {
            e.dead_letter.as_ref().unwrap().attempts
        }),
    ];
    for (path, field) in fields {
        let text = with_literal(path, "-0");
        let decoded = text.parse::<Envelope>().unwrap();
        assert_eq!(field(&decoded), 0, "{path}");
        assert_eq!(
            decoded.to_vec(),
            text.as_bytes(),
            "{path}: written back as it came"
        );
    }
    // 0 passes the integer rule; the version rule then refuses it.
    assert!(matches!(
        with_literal("meta/schema_version", "-0").parse::<Envelope>(),
        Err(EnvelopeError::UnsupportedSchemaVersion(0))
    ));
}

#[test]
fn a_number_in_a_parsed_value_is_refused_as_it_prints() {
    // A `Value` has read `-0` as the float -0.0 already: nothing tells it from `-0.0`.
    let text = with_literal("attempts", "-0");
    let value: Value = serde_json::from_str(&text).unwrap();
    assert!(matches!(
        Envelope::from_value(value),
        Err(EnvelopeError::InvalidInteger {
            field: "attempts",
            problem: IntegerProblem::Fraction
        })
    ));
}

// ------------------------------------------------- unknown fields are kept

#[test]
fn unknown_top_level_meta_and_dead_letter_fields_are_written_back() {
    let mut envelope = full();
    envelope["priority"] = json!(5);
    envelope["x-tenant"] = json!({"id": 12, "tags": ["eu", "b2b"]});
    envelope["meta"]["region"] = json!("eu-west-1");
    envelope["meta"]["producer"] = json!({"name": "shipping-api", "version": "2.4.0"});
    envelope["dead_letter"]["worker"] = json!("worker-7");

    let decoded = decode(&envelope).unwrap();
    assert_eq!(decoded.extra["priority"], 5);
    assert_eq!(decoded.meta.extra["region"], "eu-west-1");
    assert_eq!(
        decoded.dead_letter.as_ref().unwrap().extra["worker"],
        "worker-7"
    );

    let written: Value = serde_json::from_slice(&decoded.to_vec()).unwrap();
    assert_eq!(
        written, envelope,
        "every field, known or not, is written back as it came"
    );
    assert_eq!(reencoded(&decoded), decoded);
}

// ------------------------------------------------------ dead-letter block

#[test]
fn every_dead_letter_reason_round_trips() {
    for (wire, reason) in [
        ("failed", DeadLetterReason::Failed),
        ("unknown_urn", DeadLetterReason::UnknownUrn),
        ("poison", DeadLetterReason::Poison),
        (
            "quarantined",
            DeadLetterReason::Other("quarantined".to_owned()),
        ),
    ] {
        let envelope = decode(&with("dead_letter/reason", json!(wire))).unwrap();
        let block = envelope.dead_letter.as_ref().unwrap();
        assert_eq!(block.reason, reason);
        assert_eq!(block.reason.as_str(), wire);
        assert_eq!(envelope.to_value()["dead_letter"]["reason"], wire);
        assert_eq!(reencoded(&envelope), envelope);
    }
}

#[test]
fn a_sparse_dead_letter_block_round_trips() {
    let sparse = with(
        "dead_letter",
        json!({"reason": "unknown_urn", "error": null, "failed_at": 1, "original_queue": "q", "attempts": 0}),
    );
    let envelope = decode(&sparse).unwrap();
    let block = envelope.dead_letter.as_ref().unwrap();
    assert_eq!(
        (
            block.error.as_deref(),
            block.exception.as_deref(),
            block.lang.as_deref()
        ),
        (None, None, None)
    );
    assert_eq!(reencoded(&envelope), envelope);
}

#[test]
fn a_dead_letter_block_built_by_the_consumer_round_trips() {
    let mut envelope = decode(&without("dead_letter")).unwrap();
    envelope.dead_letter = Some(
        DeadLetter::new(DeadLetterReason::Poison, "shipping", 4)
            .with_error("bad payload")
            .with_exception("serde_json::Error"),
    );
    let again = reencoded(&envelope);
    assert_eq!(again, envelope);
    let block = again.dead_letter.unwrap();
    assert_eq!(block.lang.as_deref(), Some(LANG));
    assert_eq!(block.attempts, 4);
}

// ------------------------------------------------- faithful re-encoding

/// An envelope as the Python SDK writes one: compact, keys in insertion
/// order (not sorted), `1e-07` as Python spells it, a null `meta.id`, big
/// integers, unknown fields at every level.
const PYTHON_MADE: &str = concat!(
    r#"{"job":"urn:babel:orders:created","trace_id":"7b3f9c2a-e41d-4f88-9b2a-1c0d5e6f7a8b","#,
    r#""data":{"zeta":1e-07,"alpha":{"y":[1.5,-0.0,1e+16],"b":null},"big":123456789012345678901234567890,"text":"Café ☕ \u0000\n"},"#,
    r#""meta":{"id":null,"queue":"orders","lang":"python","schema_version":1,"created_at":1749132727000,"ext":{"z":1,"a":2}},"#,
    r#""attempts":0,"x-tenant":"eu","priority":5}"#
);

#[test]
fn an_envelope_decoded_from_bytes_re_encodes_to_the_same_bytes() {
    let envelope: Envelope = PYTHON_MADE.parse().unwrap();
    assert_eq!(envelope.meta.id, None);
    assert_eq!(String::from_utf8(envelope.to_vec()).unwrap(), PYTHON_MADE);
    // The clone carries the source too.
    assert_eq!(envelope.clone().to_vec(), PYTHON_MADE.as_bytes());
}

#[test]
fn changing_attempts_changes_only_the_attempts_bytes() {
    let envelope: Envelope = PYTHON_MADE.parse().unwrap();
    let retried = envelope.with_attempts(1);
    assert_eq!(
        String::from_utf8(retried.to_vec()).unwrap(),
        PYTHON_MADE.replace(r#""attempts":0"#, r#""attempts":1"#)
    );
}

#[test]
fn a_new_dead_letter_block_is_appended_and_nothing_else_moves() {
    let mut envelope: Envelope = PYTHON_MADE.parse().unwrap();
    let mut block = DeadLetter::new(DeadLetterReason::Failed, "orders", 0).with_error("boom");
    block.failed_at = 1_749_132_730_000;
    envelope.dead_letter = Some(block);
    let expected = format!(
        "{},{}}}",
        PYTHON_MADE.strip_suffix('}').unwrap(),
        r#""dead_letter":{"reason":"failed","error":"boom","exception":null,"failed_at":1749132730000,"original_queue":"orders","attempts":0,"lang":"rust"}"#
    );
    assert_eq!(String::from_utf8(envelope.to_vec()).unwrap(), expected);

    // Decoded again, that block too is kept as written; removing it drops only it.
    let mut dead: Envelope = expected.parse().unwrap();
    assert_eq!(dead.to_vec(), expected.as_bytes());
    dead.dead_letter = None;
    assert_eq!(dead.to_vec(), PYTHON_MADE.as_bytes());
}

#[test]
fn a_changed_member_is_rewritten_in_its_own_place() {
    let mut envelope: Envelope = PYTHON_MADE.parse().unwrap();
    envelope.meta.id = Some("m-1".to_owned());
    envelope.meta.extra.remove("ext");
    envelope.extra.insert("priority".to_owned(), json!(9));
    envelope.extra.remove("x-tenant");
    envelope.extra.insert("added".to_owned(), json!([1]));
    envelope.data.insert("new".to_owned(), json!(true));
    let written = String::from_utf8(envelope.to_vec()).unwrap();
    // `data` changed, so it is re-encoded (serde_json's order and spelling).
    let data = serde_json::to_string(&envelope.data).unwrap();
    assert_eq!(
        written,
        format!(
            r#"{{"job":"urn:babel:orders:created","trace_id":"7b3f9c2a-e41d-4f88-9b2a-1c0d5e6f7a8b","data":{data},"meta":{{"id":"m-1","queue":"orders","lang":"python","schema_version":1,"created_at":1749132727000}},"attempts":0,"priority":9,"added":[1]}}"#
        )
    );
}

#[test]
fn null_and_absent_members_stay_as_they_came() {
    let text = r#"{"data":{},"meta":{"lang":null,"schema_version":1,"queue":null},"job":"urn:x:y","trace_id":"t","dead_letter":null}"#;
    let envelope: Envelope = text.parse().unwrap();
    assert_eq!((envelope.meta.queue.as_str(), envelope.attempts), ("", 0));
    assert_eq!(envelope.to_vec(), text.as_bytes());

    // A default that the code sets on purpose is appended.
    let mut envelope = envelope.with_attempts(1);
    envelope.meta.id = Some("m".to_owned());
    assert_eq!(
        String::from_utf8(envelope.to_vec()).unwrap(),
        r#"{"data":{},"meta":{"lang":null,"schema_version":1,"queue":null,"id":"m"},"job":"urn:x:y","trace_id":"t","dead_letter":null,"attempts":1}"#
    );
}

#[test]
fn the_urn_alias_is_written_back_as_job_in_its_place() {
    let text = r#"{"urn":"urn:babel:orders:created","trace_id":"t","data":{"b":1,"a":2},"meta":{"schema_version":1},"attempts":0}"#;
    let envelope: Envelope = text.parse().unwrap();
    assert_eq!(
        envelope.to_vec(),
        text.replacen(r#""urn""#, r#""job""#, 1).as_bytes()
    );
}

#[test]
fn a_pretty_printed_source_comes_back_compact_with_its_own_spelling() {
    let pretty = "{\n  \"job\": \"urn:babel:orders:created\",\n  \"trace_id\": \"t\",\n  \"data\": {\n    \"z\": 1E+2,\n    \"a\": [ 0.50 ]\n  },\n  \"meta\": { \"schema_version\": 1, \"id\": \"i\" },\n  \"attempts\": 0\n}\n";
    let envelope: Envelope = pretty.parse().unwrap();
    let compact: String = pretty.split_whitespace().collect();
    assert_eq!(String::from_utf8(envelope.to_vec()).unwrap(), compact);
}

#[test]
fn a_repeated_key_is_written_once_where_it_first_appeared() {
    // As Python's json.loads reads it: first position, last value.
    let text = r#"{"job":"urn:a:b","attempts":1,"trace_id":"t","data":{},"meta":{"schema_version":1},"attempts":2}"#;
    let envelope: Envelope = text.parse().unwrap();
    assert_eq!(envelope.attempts, 2);
    assert_eq!(
        String::from_utf8(envelope.to_vec()).unwrap(),
        r#"{"job":"urn:a:b","attempts":2,"trace_id":"t","data":{},"meta":{"schema_version":1}}"#
    );
}

#[test]
fn an_envelope_without_source_text_is_written_in_the_canonical_layout() {
    let envelope = Envelope::from_value(serde_json::from_str(PYTHON_MADE).unwrap()).unwrap();
    let written = String::from_utf8(envelope.to_vec()).unwrap();
    assert!(written.starts_with(r#"{"job":"urn:babel:orders:created","trace_id":"#));
    assert_eq!(written.as_bytes(), serde_json::to_vec(&envelope).unwrap());
    assert_eq!(Envelope::from_slice(written.as_bytes()).unwrap(), envelope);
}

// ------------------------------------------------------- producer builder

#[test]
fn the_builder_mints_fresh_uuid_v4_ids_distinct_from_the_trace() {
    let first = Envelope::new("urn:babel:orders:created", json!({"order_id": 1}));
    let second = Envelope::new("urn:babel:orders:created", json!({"order_id": 1}));
    for envelope in [&first, &second] {
        let id = uuid::Uuid::parse_str(envelope.message_id().unwrap()).unwrap();
        let trace = uuid::Uuid::parse_str(&envelope.trace_id).unwrap();
        assert_eq!(id.get_version_num(), 4);
        assert_eq!(trace.get_version_num(), 4);
        assert_ne!(id, trace);
        assert_eq!(envelope.meta.lang, LANG);
        assert_eq!(envelope.meta.schema_version, SCHEMA_VERSION);
        assert_eq!(envelope.attempts, 0);
        // Unix milliseconds, not seconds: later than 2020-01-01 in ms.
        assert!(envelope.meta.created_at > 1_577_836_800_000);
    }
    assert_ne!(first.message_id(), second.message_id());
    assert_ne!(first.trace_id, second.trace_id);
    assert_eq!(reencoded(&first), first);
}

#[test]
fn the_builder_setters_and_a_non_object_payload() {
    let envelope = Envelope::new("urn:babel:orders:created", json!([1, 2]))
        .with_id("order-1")
        .with_trace_id("trace-1")
        .with_queue("orders")
        .with_attempts(3);
    assert_eq!(
        Value::Object(envelope.data.clone()),
        json!({"value": [1, 2]})
    );
    assert_eq!(envelope.message_id(), Some("order-1"));
    assert_eq!(envelope.trace_id, "trace-1");
    assert_eq!(envelope.meta.queue, "orders");
    assert_eq!(envelope.attempts, 3);
    assert_eq!(envelope.clone().without_id().message_id(), None);
    assert_eq!(reencoded(&envelope), envelope);
}

// -------------------------------------------------------------- bad input

async fn deliveries_that_ran(envelope: &Envelope, deliveries: u32) -> u32 {
    let store = InMemoryStore::new();
    let runs = AtomicU32::new(0);
    for _ in 0..deliveries {
        run_once(&store, envelope, async {
            runs.fetch_add(1, Ordering::Relaxed);
            Ok::<(), StoreError>(())
        })
        .await
        .unwrap();
    }
    runs.load(Ordering::Relaxed)
}

#[tokio::test]
async fn a_one_megabyte_id_decodes_round_trips_and_dedupes() {
    let id = "x".repeat(1 << 20);
    let envelope = decode(&with("meta/id", json!(id))).unwrap();
    assert_eq!(envelope.message_id(), Some(id.as_str()));
    assert_eq!(reencoded(&envelope), envelope);
    assert_eq!(deliveries_that_ran(&envelope, 3).await, 1);
}

#[tokio::test]
async fn ids_with_nul_newline_and_unusual_unicode_are_kept_verbatim() {
    let unusual = [
        "nul\0inside",
        "\0",
        "line\nbreak\r\n",
        "tab\tand \"quotes\" and \\backslash",
        "\u{feff}bom-prefixed",
        "zero\u{200b}width\u{200d}joiner",
        "e\u{301} combining",
        "\u{202e}right-to-left override",
        "\u{10ffff}\u{fffd}\u{fffe}",
        "👩‍👩‍👧‍👦 family",
        " ",
    ];
    for id in unusual {
        let envelope = decode(&with("meta/id", json!(id))).unwrap();
        assert_eq!(envelope.message_id(), Some(id), "{id:?}");
        assert_eq!(reencoded(&envelope), envelope, "{id:?}");
        assert_eq!(deliveries_that_ran(&envelope, 2).await, 1, "{id:?} dedupes");
    }
}

#[test]
fn escaped_ids_decode_to_the_characters_they_escape() {
    let text = serde_json::to_string(&full()).unwrap().replace(
        "a7b6c5d4-e3f2-4a1b-8c9d-0e1f2a3b4c5d",
        r"\u0000\n\ud83d\ude80",
    );
    let envelope = text.parse::<Envelope>().unwrap();
    assert_eq!(envelope.message_id(), Some("\0\n🚀"));
}

#[test]
fn a_lone_surrogate_or_invalid_utf8_in_an_id_is_a_typed_error() {
    let json = serde_json::to_string(&full()).unwrap();
    let lone = json.replace("a7b6c5d4-e3f2-4a1b-8c9d-0e1f2a3b4c5d", r"\ud800");
    assert!(matches!(
        lone.parse::<Envelope>(),
        Err(EnvelopeError::NotJson(_))
    ));

    let mut bytes = json.into_bytes();
    let at = bytes.windows(8).position(|w| w == b"a7b6c5d4").unwrap();
    bytes[at] = 0xc0; // never valid in UTF-8
    assert!(matches!(
        Envelope::from_slice(&bytes),
        Err(EnvelopeError::NotJson(_))
    ));
}

#[test]
fn deeply_nested_data_is_a_typed_error_not_a_stack_overflow() {
    let depth = 100_000;
    let text = serde_json::to_string(&full()).unwrap().replace(
        r#"{"parcels":3,"shipment":"SH-9"}"#,
        &format!("{{\"deep\": {}{}}}", "[".repeat(depth), "]".repeat(depth)),
    );
    assert!(text.len() > 2 * depth, "the payload was replaced");
    assert!(matches!(
        text.parse::<Envelope>(),
        Err(EnvelopeError::NotJson(_))
    ));
}

#[tokio::test]
async fn a_missing_null_or_empty_meta_id_decodes_and_fails_open() {
    for envelope in [
        without("meta/id"),
        with("meta/id", Value::Null),
        with("meta/id", json!("")),
    ] {
        let decoded = decode(&envelope).unwrap();
        assert_eq!(decoded.message_id(), None, "{envelope}");
        assert_eq!(decoded.meta.message_id(), None);
        assert_eq!(reencoded(&decoded).message_id(), None);
        assert_eq!(
            deliveries_that_ran(&decoded, 3).await,
            3,
            "no id, no dedupe: every delivery runs"
        );
    }
}

#[test]
fn the_message_id_is_meta_id_never_the_trace_id() {
    let envelope = decode(&full()).unwrap();
    assert_eq!(
        envelope.message_id(),
        Some("a7b6c5d4-e3f2-4a1b-8c9d-0e1f2a3b4c5d")
    );
    let no_id = decode(&without("meta/id")).unwrap();
    assert_eq!(
        no_id.message_id(),
        None,
        "a missing id does not fall back to the trace_id"
    );
}
