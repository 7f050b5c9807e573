//! Per-URN payload schemas: a message's `data` checked against the JSON
//! Schema registered for its URN, with the BabelQueue family's verdicts and
//! the Python SDK's violation texts (feature `schema`).
//!
//! Validation is opt-in, as in every SDK of the family: a [`SchemaProvider`]
//! answers the [`Schema`] of a URN, and a URN it has none for is never
//! checked. [`Schemas`] holds schemas given in code; [`Registry`] reads a
//! babelqueue-registry manifest (`registry.json`) and every schema file it
//! names, once, when it is opened.
//!
//! [`Schemas::write_registry`] writes schemas out as such a folder. With
//! the feature `schemars`, `Schema::of::<T>()` exports the schema of a Rust
//! type that derives `schemars::JsonSchema`, and
//! `Schemas::with_message::<M>()` registers it for a message type's URN
//! (each documents how schemars' output reads in the subset).
//!
//! The schema language is the family's subset of JSON Schema (draft-07):
//! `type`, `required`, `properties`, `additionalProperties`, `items`,
//! `enum`, `const`, `minLength` and `minimum`; every other keyword is
//! ignored. A check reports the first [`Violation`] it meets, in the order
//! the Python SDK's `babelqueue.schema` meets it, with the same text:
//!
//! - a node's `const` first, then its `enum`, then its `type` (with
//!   `minLength` or `minimum`);
//! - for an object, the schema's `required` names in their list order, then
//!   the members of the data in the data's document order;
//! - the path of a member is `a.b`, of an array item `items[3]`, and the
//!   root's is written `<root>`.
//!
//! [`Schema::check_json`] reads the data's text and so follows its document
//! order; [`Schema::check`] takes a [`serde_json::Value`], whose objects are
//! sorted by key, and follows that order (the verdict is the same; with
//! several violations the first reported may differ).
//!
//! Numbers follow Python's reading of JSON: `1.0` is an integer, a boolean
//! is neither a number nor an integer, `const` and `enum` tell `1`, `1.0`
//! and `true` apart at the top of a value (but inside an array or object
//! `[1]` equals `[1.0]` and `[true]` equals `[1]`), and `minimum` compares
//! both sides as floats. Integers are read within the 64-bit range (signed
//! or unsigned); one beyond it is read as the nearest float, where Python
//! keeps an integer.
//!
//! ```
//! use babel_idem::schema::{Rule, Schema};
//! use serde_json::json;
//!
//! let schema = Schema::from_json(r#"{
//!     "type": "object",
//!     "required": ["order_id"],
//!     "properties": {
//!         "order_id": {"type": "integer", "minimum": 1},
//!         "currency": {"enum": ["USD", "EUR", "TRY"]}
//!     },
//!     "additionalProperties": false
//! }"#)?;
//!
//! assert_eq!(schema.check(&json!({"order_id": 1042, "currency": "EUR"})), Ok(()));
//!
//! let violation = schema.check(&json!({"order_id": 0})).unwrap_err();
//! assert_eq!(violation.rule(), Rule::BelowMinimum);
//! assert_eq!(violation.path(), "order_id");
//! assert_eq!(violation.to_string(), "order_id: below_minimum");
//!
//! // The text's document order decides which of two violations comes first.
//! let first = schema.check_json(r#"{"extra": 1, "order_id": "x"}"#)?.unwrap_err();
//! assert_eq!(first.to_string(), "extra: additional_not_allowed");
//!
//! let root = schema.check(&json!([1, 2])).unwrap_err();
//! assert_eq!(root.to_string(), "<root>: not_an_object");
//! # Ok::<(), babel_idem::schema::SchemaError>(())
//! ```

mod compile;
mod definition;
mod equal;
mod error;
mod export;
mod instance;
mod provider;
mod registry;
mod text;
mod validate;
mod violation;

pub use definition::Schema;
pub use error::SchemaError;
pub use provider::{SchemaProvider, Schemas};
pub use registry::Registry;
pub use violation::{Rule, Violation};
