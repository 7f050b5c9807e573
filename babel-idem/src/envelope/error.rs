use std::fmt;

use super::integer::{IntegerProblem, MAX_INTEGER};

/// Why an envelope was rejected. Each variant names the rule that failed.
///
/// ```
/// use babel_idem::{Envelope, EnvelopeError};
///
/// let err = Envelope::from_slice(b"[1, 2]").unwrap_err();
/// assert!(matches!(err, EnvelopeError::NotAnObject { found: "array" }));
/// assert_eq!(err.to_string(), "envelope is not a JSON object (found array)");
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum EnvelopeError {
    /// The bytes are not JSON at all.
    NotJson(serde_json::Error),
    /// The JSON is not an object.
    NotAnObject {
        /// The JSON type that was found instead.
        found: &'static str,
    },
    /// `meta.schema_version` is absent.
    MissingSchemaVersion,
    /// `meta.schema_version` is a version this crate does not read.
    UnsupportedSchemaVersion(u64),
    /// Neither `job` nor its alias `urn` carries a URN: the message has no identity.
    MissingUrn,
    /// `trace_id` is absent, empty or only white space.
    BlankTraceId,
    /// `data` is absent or not a JSON object.
    DataNotObject {
        /// The JSON type that was found instead (`"absent"` when missing).
        found: &'static str,
    },
    /// A required object (`meta`) is absent.
    MissingField(&'static str),
    /// An integer field holds a number that is not an integer literal from 0
    /// to [`MAX_INTEGER`](crate::envelope::MAX_INTEGER); [`IntegerProblem`]
    /// states the rule.
    InvalidInteger {
        /// The field's path, such as `meta.created_at`.
        field: &'static str,
        /// What is wrong with the number.
        problem: IntegerProblem,
    },
    /// A field holds a value of the wrong JSON type.
    WrongType {
        /// The field's path, such as `meta.created_at`.
        field: &'static str,
        /// What the contract expects there.
        expected: &'static str,
        /// The JSON type that was found.
        found: &'static str,
    },
}

impl fmt::Display for EnvelopeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EnvelopeError::NotJson(err) => write!(f, "envelope is not valid JSON: {err}"),
            EnvelopeError::NotAnObject { found } => {
                write!(f, "envelope is not a JSON object (found {found})")
            }
            EnvelopeError::MissingSchemaVersion => {
                f.write_str("envelope has no meta.schema_version")
            }
            EnvelopeError::UnsupportedSchemaVersion(version) => write!(
                f,
                "meta.schema_version {version} is not supported (this consumer reads version {})",
                super::SCHEMA_VERSION
            ),
            EnvelopeError::MissingUrn => {
                f.write_str("envelope has no `job` or `urn`: the message has no identity")
            }
            EnvelopeError::BlankTraceId => f.write_str("envelope has a blank or missing trace_id"),
            EnvelopeError::DataNotObject { found } => {
                write!(f, "envelope `data` must be a JSON object (found {found})")
            }
            EnvelopeError::MissingField(field) => write!(f, "envelope has no `{field}`"),
            EnvelopeError::InvalidInteger { field, problem } => write!(
                f,
                "envelope field `{field}` must be an integer from 0 to {MAX_INTEGER} \
                 written without fraction or exponent, and {problem}"
            ),
            EnvelopeError::WrongType {
                field,
                expected,
                found,
            } => write!(
                f,
                "envelope field `{field}` must be {expected} (found {found})"
            ),
        }
    }
}

impl std::error::Error for EnvelopeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            EnvelopeError::NotJson(err) => Some(err),
            _ => None,
        }
    }
}
