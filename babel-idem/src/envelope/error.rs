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
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EnvelopeError {
    /// The bytes are not JSON at all.
    #[error("envelope is not valid JSON: {0}")]
    NotJson(#[source] serde_json::Error),
    /// The JSON is not an object.
    #[error("envelope is not a JSON object (found {found})")]
    NotAnObject {
        /// The JSON type that was found instead.
        found: &'static str,
    },
    /// `meta.schema_version` is absent.
    #[error("envelope has no meta.schema_version")]
    MissingSchemaVersion,
    /// `meta.schema_version` is a version this crate does not read.
    #[error(
        "meta.schema_version {0} is not supported (this consumer reads version {ours})",
        ours = super::SCHEMA_VERSION
    )]
    UnsupportedSchemaVersion(u64),
    /// Neither `job` nor its alias `urn` carries a URN: the message has no identity.
    #[error("envelope has no `job` or `urn`: the message has no identity")]
    MissingUrn,
    /// `trace_id` is absent, empty or only white space.
    #[error("envelope has a blank or missing trace_id")]
    BlankTraceId,
    /// `data` is absent or not a JSON object.
    #[error("envelope `data` must be a JSON object (found {found})")]
    DataNotObject {
        /// The JSON type that was found instead (`"absent"` when missing).
        found: &'static str,
    },
    /// A required object (`meta`) is absent.
    #[error("envelope has no `{0}`")]
    MissingField(&'static str),
    /// An integer field holds a number that is not an integer literal from 0
    /// to [`MAX_INTEGER`](crate::envelope::MAX_INTEGER); [`IntegerProblem`]
    /// states the rule.
    #[error(
        "envelope field `{field}` must be an integer from 0 to {MAX_INTEGER} \
         written without fraction or exponent, and {problem}"
    )]
    InvalidInteger {
        /// The field's path, such as `meta.created_at`.
        field: &'static str,
        /// What is wrong with the number.
        problem: IntegerProblem,
    },
    /// A field holds a value of the wrong JSON type.
    #[error("envelope field `{field}` must be {expected} (found {found})")]
    WrongType {
        /// The field's path, such as `meta.created_at`.
        field: &'static str,
        /// What the contract expects there.
        expected: &'static str,
        /// The JSON type that was found.
        found: &'static str,
    },
}
