//! The `cases` block: each fixture must decode to its `expect` values, or be
//! rejected when the case says `valid: false`.

use serde_json::{Map, Value};

use super::manifest::{EnvelopeCase, Expect, ExpectDeadLetter};
use super::report::{Block, CaseOutcome};
use crate::envelope::{Envelope, EnvelopeError};

/// Checks one case against the fixture's bytes.
pub(super) fn check(case: &EnvelopeCase, bytes: &[u8]) -> CaseOutcome {
    let decoded = Envelope::from_slice(bytes);
    if case.valid {
        check_accepted(case, bytes, decoded)
    } else {
        check_rejected(case, decoded)
    }
}

/// The name of the rejection rule an error stands for, as a manifest's
/// `rejected_by` spells it: `unsupported_schema_version`, `missing_urn`,
/// `wrong_type(meta.id)`, `invalid_integer(attempts)`, ...
pub(super) fn rule_of(error: &EnvelopeError) -> String {
    match error {
        EnvelopeError::NotJson(_) => "not_json".to_owned(),
        EnvelopeError::NotAnObject { .. } => "not_an_object".to_owned(),
        EnvelopeError::MissingSchemaVersion => "missing_schema_version".to_owned(),
        EnvelopeError::UnsupportedSchemaVersion(_) => "unsupported_schema_version".to_owned(),
        EnvelopeError::MissingUrn => "missing_urn".to_owned(),
        EnvelopeError::BlankTraceId => "blank_trace_id".to_owned(),
        EnvelopeError::DataNotObject { .. } => "data_not_object".to_owned(),
        EnvelopeError::MissingField(field) => format!("missing_field({field})"),
        EnvelopeError::WrongType { field, .. } => format!("wrong_type({field})"),
        EnvelopeError::InvalidInteger { field, .. } => format!("invalid_integer({field})"),
    }
}

fn check_rejected(case: &EnvelopeCase, decoded: Result<Envelope, EnvelopeError>) -> CaseOutcome {
    let error = match decoded {
        Err(error) => error,
        Ok(_) => {
            let why = case
                .reason
                .as_deref()
                .unwrap_or("the case is marked valid: false");
            return CaseOutcome::fail(
                Block::Envelope,
                &case.name,
                format!("accepted an envelope that must be rejected ({why})"),
            );
        }
    };
    let rule = rule_of(&error);
    match &case.rejected_by {
        Some(expected) if *expected != rule => CaseOutcome::fail(
            Block::Envelope,
            &case.name,
            format!("rejected by {rule} ({error}), but the case expects {expected}"),
        ),
        _ => CaseOutcome::pass(
            Block::Envelope,
            &case.name,
            Some(format!("rejected ({rule}): {error}")),
        ),
    }
}

fn check_accepted(
    case: &EnvelopeCase,
    bytes: &[u8],
    decoded: Result<Envelope, EnvelopeError>,
) -> CaseOutcome {
    let envelope = match decoded {
        Ok(envelope) => envelope,
        Err(error) => {
            return CaseOutcome::fail(
                Block::Envelope,
                &case.name,
                format!("rejected a valid envelope: {error}"),
            );
        }
    };
    let mut problems = Vec::new();
    if let Some(expect) = &case.expect {
        expect_problems(&envelope, expect, &mut problems);
    }
    // The bytes decoded, so they are JSON.
    if let Ok(fixture) = serde_json::from_slice::<Value>(bytes) {
        reencoding_problems(&fixture, &envelope, &mut problems);
    }
    CaseOutcome::from_problems(Block::Envelope, &case.name, problems)
}

/// Compares every field `expect` names; a field this runner does not know
/// is a problem too, since passing it unchecked would be a false pass.
fn expect_problems(envelope: &Envelope, expect: &Expect, problems: &mut Vec<String>) {
    let meta = &envelope.meta;
    compare(problems, "urn", expect.urn.as_deref(), envelope.urn());
    if let Some(data) = &expect.data {
        compare_json(
            problems,
            "data",
            &Value::Object(data.clone()),
            &Value::Object(envelope.data.clone()),
        );
    }
    compare(problems, "attempts", expect.attempts, envelope.attempts);
    compare(problems, "lang", expect.lang.as_deref(), meta.lang.as_str());
    compare(
        problems,
        "schema_version",
        expect.schema_version,
        meta.schema_version,
    );
    unknown_fields(problems, "expect", &expect.unknown);

    let Some(expected) = &expect.dead_letter else {
        return;
    };
    match &envelope.dead_letter {
        Some(block) => dead_letter_problems(block, expected, problems),
        None => problems.push("dead_letter: expected a block, the envelope has none".to_owned()),
    }
}

fn dead_letter_problems(
    block: &crate::envelope::DeadLetter,
    expected: &ExpectDeadLetter,
    problems: &mut Vec<String>,
) {
    // The block as it encodes: a field it lacks (`error`, `exception`,
    // `lang`) compares as `null`.
    let actual = serde_json::to_value(block).unwrap_or_default();
    let fields = [
        ("reason", expected.reason.as_deref().map(Value::from)),
        ("error", expected.error.as_deref().map(Value::from)),
        ("exception", expected.exception.as_deref().map(Value::from)),
        ("failed_at", expected.failed_at.map(Value::from)),
        (
            "original_queue",
            expected.original_queue.as_deref().map(Value::from),
        ),
        ("attempts", expected.attempts.map(Value::from)),
        ("lang", expected.lang.as_deref().map(Value::from)),
    ];
    for (field, expected) in fields {
        let found = actual.get(field).cloned().unwrap_or_default();
        compare(problems, &format!("dead_letter.{field}"), expected, found);
    }
    unknown_fields(problems, "expect.dead_letter", &expected.unknown);
}

fn compare<T: Into<Value>>(
    problems: &mut Vec<String>,
    field: &str,
    expected: Option<T>,
    actual: T,
) {
    if let Some(expected) = expected {
        compare_json(problems, field, &expected.into(), &actual.into());
    }
}

fn compare_json(problems: &mut Vec<String>, field: &str, expected: &Value, actual: &Value) {
    if expected != actual {
        problems.push(format!("{field}: expected {expected}, decoded {actual}"));
    }
}

fn unknown_fields(problems: &mut Vec<String>, block: &str, unknown: &Map<String, Value>) {
    for field in unknown.keys() {
        problems.push(format!("{block}.{field} is not a field this runner checks"));
    }
}

/// A decoded envelope must encode back without losing anything: every value
/// of the fixture is in the re-encoded JSON, and decoding that gives the same
/// envelope again.
fn reencoding_problems(fixture: &Value, envelope: &Envelope, problems: &mut Vec<String>) {
    let encoded = envelope.to_value();
    match Envelope::from_value(encoded.clone()) {
        Ok(again) if again == *envelope => {}
        Ok(_) => {
            problems.push("the re-encoded envelope decodes to a different envelope".to_owned())
        }
        Err(error) => problems.push(format!("the re-encoded envelope is rejected: {error}")),
    }
    let mut lost = Vec::new();
    lost_values("", &urn_as_job(fixture), &encoded, &mut lost);
    if !lost.is_empty() {
        problems.push(format!("re-encoding loses {}", lost.join(", ")));
    }
}

/// The encoder writes the URN as `job`, so an alias-only fixture is compared
/// as if it had said `job`.
fn urn_as_job(fixture: &Value) -> Value {
    let mut fixture = fixture.clone();
    if let Value::Object(fields) = &mut fixture
        && !fields.contains_key("job")
        && let Some(urn) = fields.remove("urn")
    {
        fields.insert("job".to_owned(), urn);
    }
    fixture
}

/// Collects the paths of `original` whose value `encoded` does not hold.
/// A `null` in the original claims nothing (an absent field decodes the same),
/// so it is not required to survive.
fn lost_values(path: &str, original: &Value, encoded: &Value, lost: &mut Vec<String>) {
    match (original, encoded) {
        (Value::Null, _) => {}
        (Value::Object(original), Value::Object(encoded)) => {
            for (key, value) in original {
                let child = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                match encoded.get(key) {
                    Some(kept) => lost_values(&child, value, kept, lost),
                    None if value.is_null() => {}
                    None => lost.push(child),
                }
            }
        }
        (original, encoded) if original == encoded => {}
        _ => lost.push(path.to_owned()),
    }
}
