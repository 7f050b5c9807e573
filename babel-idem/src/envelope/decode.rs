//! Taking an envelope's members apart into an [`Envelope`], one rule at a time.

use serde_json::{Map, Value};

use super::members::{Members, MetaBlock, MetaMembers};
use super::{
    DeadLetter, DeadLetterReason, Envelope, EnvelopeError, Meta, SCHEMA_VERSION, Source, integer,
    raw,
};

/// Decodes JSON `text`: an object is read member by member (see
/// [`members`](super::members)); anything else is parsed whole for the error
/// that names what it is.
pub(super) fn text(text: &str) -> Result<Envelope, EnvelopeError> {
    if text.trim_start().starts_with('{') {
        let members = serde_json::from_str(text).map_err(EnvelopeError::NotJson)?;
        from_members(members, Some(text))
    } else {
        let value: Value = serde_json::from_str(text).map_err(EnvelopeError::NotJson)?;
        envelope(value, Some(text))
    }
}

/// Takes a parsed `value` apart.
pub(super) fn envelope(value: Value, source: Option<&str>) -> Result<Envelope, EnvelopeError> {
    match value {
        Value::Object(object) => from_members(Members::from_object(object), source),
        other => Err(EnvelopeError::NotAnObject {
            found: kind(&other),
        }),
    }
}

/// Checks the members one rule at a time. `source` is the text they were
/// read from, when there is one: the integer rule reads a rejected number's
/// spelling from it.
fn from_members(members: Members, source: Option<&str>) -> Result<Envelope, EnvelopeError> {
    let integer = |value: Option<Value>, field: &'static str| integer_field(value, field, source);
    let Members {
        job,
        urn,
        trace_id,
        data,
        meta,
        attempts,
        dead_letter,
        mut extra,
    } = members;

    // The version decides how everything else reads, so it is checked first.
    let meta = match meta {
        Some(MetaBlock::Object(meta)) => meta_block(meta, source)?,
        Some(MetaBlock::Other(other)) => return Err(wrong_type("meta", "an object", &other)),
        None => return Err(EnvelopeError::MissingField("meta")),
    };

    // `job` wins; an `urn` beside it is kept as an unknown member.
    let job = match (job, urn) {
        (Some(job), urn) => {
            if let Some(urn) = urn {
                extra.insert("urn".to_owned(), urn);
            }
            non_empty_string(job, "job")?
        }
        (None, Some(urn)) => non_empty_string(urn, "urn")?,
        (None, None) => None,
    }
    .ok_or(EnvelopeError::MissingUrn)?;

    let trace_id = match trace_id {
        Some(Value::String(trace_id)) if !trace_id.trim().is_empty() => trace_id,
        Some(Value::String(_)) | Some(Value::Null) | None => {
            return Err(EnvelopeError::BlankTraceId);
        }
        Some(other) => return Err(wrong_type("trace_id", "a string", &other)),
    };

    let data = match data {
        Some(Value::Object(data)) => data,
        Some(other) => {
            return Err(EnvelopeError::DataNotObject {
                found: kind(&other),
            });
        }
        None => return Err(EnvelopeError::DataNotObject { found: "absent" }),
    };

    let attempts = integer(attempts, "attempts")?.unwrap_or(0);

    let dead_letter = match dead_letter {
        None | Some(Value::Null) => None,
        Some(Value::Object(block)) => Some(dead_letter_block(block, source)?),
        Some(other) => return Err(wrong_type("dead_letter", "an object", &other)),
    };

    Ok(Envelope {
        job,
        trace_id,
        data,
        meta,
        attempts,
        dead_letter,
        extra,
        source: Source::default(),
    })
}

fn meta_block(meta: MetaMembers, source: Option<&str>) -> Result<Meta, EnvelopeError> {
    let integer = |value: Option<Value>, field: &'static str| integer_field(value, field, source);
    let schema_version = integer(meta.schema_version, "meta.schema_version")?
        .ok_or(EnvelopeError::MissingSchemaVersion)?;
    if schema_version != SCHEMA_VERSION {
        return Err(EnvelopeError::UnsupportedSchemaVersion(schema_version));
    }
    // An absent, null or empty id is legal on the wire: the guard fails open on it.
    let id = optional_string(meta.id, "meta.id")?;
    Ok(Meta {
        id,
        queue: optional_string(meta.queue, "meta.queue")?.unwrap_or_default(),
        lang: optional_string(meta.lang, "meta.lang")?.unwrap_or_default(),
        schema_version,
        created_at: integer(meta.created_at, "meta.created_at")?.unwrap_or(0),
        extra: meta.extra,
    })
}

fn dead_letter_block(
    mut fields: Map<String, Value>,
    source: Option<&str>,
) -> Result<DeadLetter, EnvelopeError> {
    let integer = |value: Option<Value>, field: &'static str| integer_field(value, field, source);
    let reason = optional_string(fields.remove("reason"), "dead_letter.reason")?.ok_or(
        EnvelopeError::WrongType {
            field: "dead_letter.reason",
            expected: "a string",
            found: "absent",
        },
    )?;
    Ok(DeadLetter {
        reason: DeadLetterReason::from_wire(&reason),
        error: optional_string(fields.remove("error"), "dead_letter.error")?,
        exception: optional_string(fields.remove("exception"), "dead_letter.exception")?,
        failed_at: integer(fields.remove("failed_at"), "dead_letter.failed_at")?.unwrap_or(0),
        original_queue: optional_string(
            fields.remove("original_queue"),
            "dead_letter.original_queue",
        )?
        .unwrap_or_default(),
        attempts: integer(fields.remove("attempts"), "dead_letter.attempts")?.unwrap_or(0),
        lang: optional_string(fields.remove("lang"), "dead_letter.lang")?,
        extra: fields,
    })
}

fn non_empty_string(value: Value, field: &'static str) -> Result<Option<String>, EnvelopeError> {
    Ok(optional_string(Some(value), field)?.filter(|s| !s.is_empty()))
}

fn optional_string(
    value: Option<Value>,
    field: &'static str,
) -> Result<Option<String>, EnvelopeError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(wrong_type(field, "a string", &other)),
    }
}

/// An integer field, by the rule stated on [`integer::IntegerProblem`].
fn integer_field(
    value: Option<Value>,
    field: &'static str,
    source: Option<&str>,
) -> Result<Option<u64>, EnvelopeError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(number)) => integer::read(&number, || {
            source.and_then(|text| raw::value_at(text, field))
        })
        .map(Some)
        .map_err(|problem| EnvelopeError::InvalidInteger { field, problem }),
        Some(other) => Err(wrong_type(field, "an integer", &other)),
    }
}

fn wrong_type(field: &'static str, expected: &'static str, found: &Value) -> EnvelopeError {
    EnvelopeError::WrongType {
        field,
        expected,
        found: kind(found),
    }
}

pub(super) fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        // The JSON type only: a parsed value cannot tell `1e2`, `-0` or `2^64`
        // from a fraction, and the integer rule says what is wrong with those.
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}
