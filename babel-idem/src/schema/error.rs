//! Why a schema, a data text or a registry could not be used.

use std::io;
use std::path::PathBuf;

/// Why a schema, a data text or a schema registry could not be used. Each
/// variant says what was read and where it went wrong. (Data that breaks
/// its schema is not an error: it is a [`Violation`](super::Violation).)
///
/// ```
/// use babel_idem::schema::{Schema, SchemaError};
///
/// let error = Schema::from_json(r#"["type", "object"]"#).unwrap_err();
/// assert!(matches!(error, SchemaError::NotAnObject { found: "an array" }));
/// assert_eq!(error.to_string(), "a schema must be a JSON object, not an array");
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SchemaError {
    /// A schema's text is not JSON, or holds a number beyond `f64` (such as
    /// `1e400`, which no [`serde_json::Value`] holds).
    #[error("cannot read the schema's JSON text: {reason} at byte {offset}")]
    SchemaText {
        /// The byte offset in the text where reading stopped.
        offset: usize,
        /// What was wrong there.
        reason: &'static str,
    },
    /// A schema is JSON, but not an object.
    #[error("a schema must be a JSON object, not {found}")]
    NotAnObject {
        /// What it is: `an array`, `a string`, `a number`, `a boolean` or `null`.
        found: &'static str,
    },
    /// A schema nests `properties` and `items` deeper than the check walks.
    #[error("the schema nests `properties` and `items` deeper than {limit} levels")]
    TooDeep {
        /// How many levels a schema may nest.
        limit: usize,
    },
    /// The data's text is not JSON.
    #[error("cannot read the data's JSON text: {reason} at byte {offset}")]
    DataText {
        /// The byte offset in the text where reading stopped.
        offset: usize,
        /// What was wrong there.
        reason: &'static str,
    },
    /// The schema given for a URN is unusable.
    #[error("the schema for {urn:?} is unusable: {source}")]
    ForUrn {
        /// The URN the schema was given for.
        urn: String,
        /// Why it is unusable.
        source: Box<SchemaError>,
    },
    /// A registry manifest cannot be read (missing, unreadable, not UTF-8).
    #[error("cannot read the schema registry {}: {source}", path.display())]
    RegistryUnreadable {
        /// The manifest.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// A registry manifest is not JSON.
    #[error("the schema registry {} is not JSON: {source}", path.display())]
    RegistryNotJson {
        /// The manifest.
        path: PathBuf,
        /// Where and why parsing failed.
        source: serde_json::Error,
    },
    /// A registry manifest is JSON, but not an object.
    #[error("the schema registry {} must be a JSON object, not {found}", path.display())]
    RegistryNotAnObject {
        /// The manifest.
        path: PathBuf,
        /// What it is: `an array`, `a string`, `a number`, `a boolean` or `null`.
        found: &'static str,
    },
    /// A schema file a registry names cannot be read.
    #[error("cannot read the schema file {} for {urn:?}: {source}", path.display())]
    SchemaFileUnreadable {
        /// The URN the registry names the file for.
        urn: String,
        /// The file, joined to the manifest's folder when relative.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// A schema file a registry names holds no usable schema.
    #[error("the schema file {} for {urn:?} is unusable: {source}", path.display())]
    SchemaFileUnusable {
        /// The URN the registry names the file for.
        urn: String,
        /// The file, joined to the manifest's folder when relative.
        path: PathBuf,
        /// Why its schema is unusable.
        source: Box<SchemaError>,
    },
    /// A registry folder or one of its files cannot be written
    /// ([`Schemas::write_registry`](super::Schemas::write_registry)).
    #[error("cannot write the schema registry's {}: {source}", path.display())]
    RegistryWrite {
        /// The folder or file.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// A URN cannot have a schema file of its own in a registry folder
    /// ([`Schemas::write_registry`](super::Schemas::write_registry));
    /// nothing was written.
    #[error("cannot write a schema file for {urn:?}: {reason}")]
    UnwritableUrn {
        /// The URN.
        urn: String,
        /// Why not.
        reason: String,
    },
}

/// What a JSON value that should have been an object is, for a message.
pub(super) fn what_is(value: &serde_json::Value) -> &'static str {
    use serde_json::Value;
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
