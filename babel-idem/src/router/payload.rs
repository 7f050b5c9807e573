//! A typed handler's message, decoded from the envelope's `data`, the
//! router's payload schema check, and [`InvalidPayloadError`], the family's
//! failure for `data` its type (or its schema) does not accept.

use std::fmt;

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use super::DispatchError;
use crate::telemetry::metrics;
#[cfg(feature = "schema")]
use crate::{
    envelope::{EnvelopeError, raw},
    schema::{SchemaProvider, Violation},
};

/// The `path` of a violation at the root of `data`, as the Python SDK writes it.
const ROOT: &str = "<root>";

/// A message's `data` does not match what its URN expects: the type a typed
/// handler takes could not be decoded from it, or (from a schema validator)
/// it breaks the URN's schema. The handler is not run; the attempt fails like
/// a handler's error, so the message is retried and, once its attempts run
/// out, dead-lettered with reason `failed` and `exception`
/// `InvalidPayloadError`, as the other BabelQueue SDKs write it.
///
/// Its text is the Python SDK's: `data for '<urn>' does not match its URN
/// schema: <path>: <reason>`, the URN quoted as Python's `repr` quotes it.
/// `path` is the dotted path to the offending member (`items[0].sku`), or
/// `<root>` for `data` itself; `reason` is serde's message for a decode
/// failure, a rule's name for a schema violation.
///
/// ```
/// use babel_idem::router::InvalidPayloadError;
///
/// let error = InvalidPayloadError::new("urn:babel:orders:created", "order_id", "missing_required");
/// assert_eq!(
///     error.to_string(),
///     "data for 'urn:babel:orders:created' does not match its URN schema: order_id: missing_required",
/// );
/// assert_eq!(error.violation(), "order_id: missing_required");
///
/// // An empty path is the root of `data`.
/// let root = InvalidPayloadError::new("urn:babel:orders:created", "", "not_an_object");
/// assert_eq!(root.path(), "<root>");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "data for {} does not match its URN schema: {path}: {reason}",
    PythonRepr(.urn)
)]
pub struct InvalidPayloadError {
    urn: String,
    path: String,
    reason: String,
}

impl InvalidPayloadError {
    /// The violation `path: reason` of the message routed by `urn`. An empty
    /// `path` means the root of `data` and is kept as `<root>`.
    pub fn new(urn: impl Into<String>, path: impl Into<String>, reason: impl Into<String>) -> Self {
        let path = path.into();
        InvalidPayloadError {
            urn: urn.into(),
            path: if path.is_empty() {
                ROOT.to_owned()
            } else {
                path
            },
            reason: reason.into(),
        }
    }

    /// The URN of the message whose `data` was refused.
    pub fn urn(&self) -> &str {
        &self.urn
    }

    /// Where in `data` the violation is: a dotted path (`items[0].sku`), or
    /// `<root>`.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// What is wrong there.
    pub fn reason(&self) -> &str {
        &self.reason
    }

    /// `path: reason`, the Python SDK's `violation`.
    pub fn violation(&self) -> String {
        format!("{}: {}", self.path, self.reason)
    }

    /// The schema `violation` of the `data` of a message routed by `urn`:
    /// its path, and its rule's name as the reason (feature `schema`).
    ///
    /// ```
    /// use babel_idem::router::InvalidPayloadError;
    /// use babel_idem::schema::Schema;
    /// use serde_json::json;
    ///
    /// let schema = Schema::from_value(json!({"type": "object", "required": ["order_id"]}))?;
    /// let violation = schema.check(&json!({})).unwrap_err();
    /// let error = InvalidPayloadError::from_violation("urn:babel:orders:created", &violation);
    /// assert_eq!(error.violation(), "order_id: missing_required");
    /// assert_eq!(
    ///     error.to_string(),
    ///     "data for 'urn:babel:orders:created' does not match its URN schema: order_id: missing_required",
    /// );
    /// # Ok::<(), babel_idem::schema::SchemaError>(())
    /// ```
    #[cfg(feature = "schema")]
    pub fn from_violation(urn: impl Into<String>, violation: &Violation) -> Self {
        InvalidPayloadError::new(urn, violation.path(), violation.rule().as_str())
    }
}

/// The verdict of the schema `provider` has for `urn` on the `data` of the
/// envelope `bytes`, read in its document order (as the Python SDK reads
/// it): `None` when the URN has no schema (its text is then not read) or
/// the data matches it.
///
/// # Errors
///
/// The bytes are poison when `data`'s text cannot be read. Dispatch checks
/// bytes that just decoded as an envelope, so this does not happen unless
/// the schema reader refuses a text the envelope decoder took.
#[cfg(feature = "schema")]
pub(super) fn check_schema(
    provider: &dyn SchemaProvider,
    urn: &str,
    bytes: &[u8],
) -> Result<Option<InvalidPayloadError>, EnvelopeError> {
    let Some(schema) = provider.schema_for(urn) else {
        return Ok(None);
    };
    let text = std::str::from_utf8(bytes)
        .ok()
        .and_then(|text| raw::member(text, "data"))
        .ok_or_else(|| unreadable("no `data` member in the envelope's text"))?;
    match schema.check_json(text) {
        Ok(Ok(())) => Ok(None),
        Ok(Err(violation)) => Ok(Some(InvalidPayloadError::from_violation(urn, &violation))),
        Err(error) => Err(unreadable(error)),
    }
}

/// The poison error of envelope bytes whose `data` text cannot be read.
#[cfg(feature = "schema")]
#[cold]
fn unreadable(cause: impl fmt::Display) -> EnvelopeError {
    EnvelopeError::NotJson(serde::de::Error::custom(format_args!(
        "its `data` cannot be read for the payload schema check: {cause}"
    )))
}

/// Reports a failed attempt on the consumer span and in the metrics when it
/// failed with an [`InvalidPayloadError`] (the schema check, a typed
/// handler's decode, or a handler that returned one itself).
pub(super) fn observe_failure(error: &DispatchError) {
    if let DispatchError::Handler(error) = error
        && let Some(invalid) = error.error().downcast_ref::<InvalidPayloadError>()
    {
        metrics::invalid_payload(
            invalid.urn(),
            &format_args!("{}: {}", invalid.path(), invalid.reason()),
        );
    }
}

/// Decodes the message `M` from `data`, borrowed so that a failure can be
/// located on the same data: the fast pass tracks no path; only a failed one
/// is decoded again with the path tracked.
pub(super) fn decode<M: DeserializeOwned>(
    data: &Map<String, Value>,
    urn: &str,
) -> Result<M, InvalidPayloadError> {
    M::deserialize(data).map_err(|first| locate::<M>(data, urn, first))
}

/// The path and serde's message of the failure `first` to decode `data`.
fn locate<M: DeserializeOwned>(
    data: &Map<String, Value>,
    urn: &str,
    first: serde_json::Error,
) -> InvalidPayloadError {
    match serde_path_to_error::deserialize::<_, M>(data) {
        Err(located) => {
            let path = located.path().to_string();
            // serde_path_to_error writes the root as `.`.
            let path = if path == "." { String::new() } else { path };
            InvalidPayloadError::new(urn, path, located.into_inner().to_string())
        }
        // A `Deserialize` impl that fails once and not twice has no path to
        // report; its first message still says what was wrong.
        Ok(_) => InvalidPayloadError::new(urn, "", first.to_string()),
    }
}

/// A string as Python's `repr` writes it: in single quotes, or in double
/// quotes when it holds a single quote and no double quote; backslashes,
/// the chosen quote and control characters escaped.
struct PythonRepr<'a>(&'a str);

impl fmt::Display for PythonRepr<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use fmt::Write as _;
        let text = self.0;
        let quote = if text.contains('\'') && !text.contains('"') {
            '"'
        } else {
            '\''
        };
        f.write_char(quote)?;
        for c in text.chars() {
            match c {
                '\\' => f.write_str("\\\\")?,
                '\n' => f.write_str("\\n")?,
                '\r' => f.write_str("\\r")?,
                '\t' => f.write_str("\\t")?,
                c if c == quote => write!(f, "\\{c}")?,
                c if (c as u32) < 0x20 || c == '\u{7f}' => write!(f, "\\x{:02x}", c as u32)?,
                c => f.write_char(c)?,
            }
        }
        f.write_char(quote)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code, reason = "decoded, never read")]
    struct Item {
        sku: String,
        qty: u32,
    }

    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code, reason = "decoded, never read")]
    struct Order {
        order_id: u64,
        items: Vec<Item>,
    }

    const URN: &str = "urn:babel:orders:created";

    fn data(value: Value) -> Map<String, Value> {
        match value {
            Value::Object(map) => map,
            other => panic!("not an object: {other}"),
        }
    }

    #[test]
    fn valid_data_decodes() {
        let order: Order = decode(
            &data(json!({"order_id": 7, "items": [{"sku": "a", "qty": 1}]})),
            URN,
        )
        .unwrap();
        assert_eq!(order.order_id, 7);
    }

    #[test]
    fn a_wrong_member_is_named_by_its_path_with_serdes_message() {
        let error = decode::<Order>(
            &data(json!({"order_id": 7, "items": [{"sku": "a", "qty": 1}, {"sku": 5, "qty": 1}]})),
            URN,
        )
        .unwrap_err();
        assert_eq!(error.path(), "items[1].sku");
        assert_eq!(
            error.reason(),
            "invalid type: integer `5`, expected a string"
        );
        assert_eq!(
            error.to_string(),
            "data for 'urn:babel:orders:created' does not match its URN schema: \
             items[1].sku: invalid type: integer `5`, expected a string"
        );
    }

    #[test]
    fn a_missing_member_is_reported_at_the_object_that_lacks_it() {
        let error = decode::<Order>(&data(json!({"items": []})), URN).unwrap_err();
        assert_eq!(error.violation(), "<root>: missing field `order_id`");
        let nested = decode::<Order>(&data(json!({"order_id": 1, "items": [{"sku": "a"}]})), URN)
            .unwrap_err();
        assert_eq!(nested.violation(), "items[0]: missing field `qty`");
    }

    #[cfg(feature = "schema")]
    mod schema_check {
        use super::super::*;
        use super::URN;
        use crate::schema::{Schema, Schemas};

        const ORDERS: &str = r#"{"type": "object", "required": ["order_id"],
            "properties": {"order_id": {"type": "integer"}}, "additionalProperties": false}"#;

        fn schemas() -> Schemas {
            Schemas::new().with(URN, Schema::from_json(ORDERS).unwrap())
        }

        #[test]
        fn the_data_is_checked_in_its_document_order() {
            let bytes =
                br#"{"job": "urn:babel:orders:created", "data": {"zeta": 1, "order_id": "x"}}"#;
            let invalid = check_schema(&schemas(), URN, bytes).unwrap().unwrap();
            assert_eq!(invalid.violation(), "zeta: additional_not_allowed");
            let swapped = br#"{"data": {"order_id": "x", "zeta": 1}}"#;
            let invalid = check_schema(&schemas(), URN, swapped).unwrap().unwrap();
            assert_eq!(invalid.violation(), "order_id: not_an_integer");
            let valid = br#"{"data": {"order_id": 7}}"#;
            assert_eq!(check_schema(&schemas(), URN, valid).unwrap(), None);
        }

        #[test]
        fn a_urn_without_a_schema_is_not_read() {
            let not_json = b"\xff no envelope";
            assert_eq!(
                check_schema(&schemas(), "urn:babel:orders:voided", not_json).unwrap(),
                None
            );
        }

        #[test]
        fn data_whose_text_cannot_be_read_is_poison() {
            for bytes in [&b"{\"job\": \"x\"}"[..], b"\xff{}", b"[1]"] {
                let error = check_schema(&schemas(), URN, bytes).unwrap_err();
                assert!(matches!(error, EnvelopeError::NotJson(_)), "{error:?}");
                assert!(
                    error
                        .to_string()
                        .contains("cannot be read for the payload schema check"),
                    "{error}"
                );
            }
        }
    }

    #[test]
    fn the_urn_is_quoted_as_python_repr_quotes_it() {
        let quoted = |urn: &str| PythonRepr(urn).to_string();
        assert_eq!(
            quoted("urn:babel:orders:created"),
            "'urn:babel:orders:created'"
        );
        assert_eq!(quoted("urn:babel:o'k"), "\"urn:babel:o'k\"");
        assert_eq!(quoted("a'b\"c"), "'a\\'b\"c'");
        assert_eq!(quoted("a\\b\n\u{1}"), "'a\\\\b\\n\\x01'");
    }
}
