//! Schemas written out: a registry folder ([`Schemas::write_registry`]),
//! and (feature `schemars`) a schema exported from a Rust type
//! ([`Schema::of`], [`Schemas::with_message`]).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::error::SchemaError;
use super::provider::{SchemaProvider, Schemas};

/// The manifest's file name in a registry folder.
const MANIFEST: &str = "registry.json";

impl Schemas {
    /// Writes these schemas as a babelqueue-registry folder that
    /// [`Registry::open`](super::Registry::open) (and the Python SDK's
    /// `DirProvider`) reads back: `folder/registry.json`, and one file per
    /// URN beside it, each schema pretty-printed as it was given
    /// ([`Schema::as_value`](super::Schema::as_value)). Returns the
    /// manifest's path. The folder is created if it is missing; files of
    /// the same names are replaced, others are left alone; the manifest is
    /// written last.
    ///
    /// A URN's file is named after it: the text after `urn:`, `:` written
    /// as `.`, and every byte other than an ASCII letter, digit, `-` or
    /// `_` as `%XX` (`urn:babel:orders:created` is
    /// `babel.orders.created.json`). The manifest lists the URNs in
    /// lexical order.
    ///
    /// ```
    /// use babel_idem::schema::{Registry, SchemaProvider, Schemas};
    /// use serde_json::json;
    ///
    /// let dir = std::env::temp_dir().join(format!("babel-idem-write-doc-{}", std::process::id()));
    /// let schemas = Schemas::from_json_map([
    ///     ("urn:babel:orders:created", r#"{"type": "object", "required": ["order_id"]}"#),
    /// ])?;
    /// let manifest = schemas.write_registry(&dir)?;
    /// assert_eq!(manifest, dir.join("registry.json"));
    /// assert!(dir.join("babel.orders.created.json").is_file());
    ///
    /// let registry = Registry::open(&manifest)?;
    /// std::fs::remove_dir_all(&dir)?;
    /// let violation = registry.check("urn:babel:orders:created", &json!({})).unwrap_err();
    /// assert_eq!(violation.to_string(), "order_id: missing_required");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`SchemaError::UnwritableUrn`], before anything is written, for an
    /// empty URN or two URNs whose files would differ only in case (one
    /// file on a case-insensitive file system);
    /// [`SchemaError::RegistryWrite`], naming the path, when the folder or
    /// a file cannot be written.
    pub fn write_registry(&self, folder: impl AsRef<Path>) -> Result<PathBuf, SchemaError> {
        let folder = folder.as_ref();
        let files = file_names(self.urns())?;
        std::fs::create_dir_all(folder).map_err(written(folder))?;
        let mut entries = Vec::with_capacity(files.len());
        for (urn, file) in &files {
            let schema = self
                .schema_for(urn)
                .map(|schema| schema.as_value())
                .unwrap_or(&Value::Null);
            let path = folder.join(file);
            std::fs::write(&path, pretty(schema)).map_err(written(&path))?;
            entries.push(json!({"urn": urn, "schema": file}));
        }
        let manifest = folder.join(MANIFEST);
        std::fs::write(&manifest, pretty(&json!({"schemas": entries})))
            .map_err(written(&manifest))?;
        Ok(manifest)
    }
}

/// Each of `urns` with its file name, in lexical order of the URNs;
/// refused for an empty URN or two names equal but for case (the
/// manifest's own name counts as taken).
fn file_names<'a>(
    urns: impl Iterator<Item = &'a str>,
) -> Result<Vec<(&'a str, String)>, SchemaError> {
    let mut urns: Vec<&str> = urns.collect();
    urns.sort_unstable();
    let mut taken: HashMap<String, &str> = HashMap::new();
    let mut files = Vec::with_capacity(urns.len());
    for urn in urns {
        if urn.is_empty() {
            return Err(SchemaError::UnwritableUrn {
                urn: String::new(),
                reason: "a registry skips an entry with an empty URN".to_owned(),
            });
        }
        let file = file_name(urn);
        let folded = file.to_ascii_lowercase();
        if folded == MANIFEST {
            return Err(SchemaError::UnwritableUrn {
                urn: urn.to_owned(),
                reason: format!("its file would be the manifest, {MANIFEST}"),
            });
        }
        if let Some(other) = taken.insert(folded, urn) {
            return Err(SchemaError::UnwritableUrn {
                urn: urn.to_owned(),
                reason: format!(
                    "its file {file} differs only in case from that of {other:?}, \
                     one file on a case-insensitive file system"
                ),
            });
        }
        files.push((urn, file));
    }
    Ok(files)
}

/// The schema file of `urn`: see [`Schemas::write_registry`].
fn file_name(urn: &str) -> String {
    let name = match urn.get(..4) {
        Some(scheme) if scheme.eq_ignore_ascii_case("urn:") => &urn[4..],
        _ => urn,
    };
    let mut file = String::with_capacity(name.len() + 5);
    for byte in name.bytes() {
        match byte {
            b':' => file.push('.'),
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' => file.push(char::from(byte)),
            other => {
                let _ = write!(file, "%{other:02X}");
            }
        }
    }
    file.push_str(".json");
    file
}

/// `value` pretty-printed, with a final newline.
fn pretty(value: &Value) -> String {
    // A `Value` always serializes.
    let mut text = serde_json::to_string_pretty(value).unwrap_or_default();
    text.push('\n');
    text
}

/// `map_err` for a write to `path`.
fn written(path: &Path) -> impl FnOnce(io::Error) -> SchemaError + '_ {
    move |source| SchemaError::RegistryWrite {
        path: path.to_owned(),
        source,
    }
}

#[cfg(feature = "schemars")]
mod from_type {
    use schemars::JsonSchema;
    use schemars::generate::SchemaSettings;
    use serde_json::{Map, Value};

    use super::super::definition::Schema;
    use super::super::error::SchemaError;
    use super::super::provider::Schemas;
    use crate::message::Message;

    impl Schema {
        /// The schema of the Rust type `T`, from its `schemars::JsonSchema`
        /// (schemars 1; derive it with `#[derive(schemars::JsonSchema)]`):
        /// the JSON Schema draft-07 document schemars writes for what `T`
        /// deserializes, with every nested type written in place (no
        /// `$ref`), so the family's subset checks it; kept whole in
        /// [`as_value`](Schema::as_value), so a registry file written from
        /// it is a complete draft-07 schema for any other validator too.
        ///
        /// How schemars' output reads in the family's subset (its keywords
        /// are `type`, `required`, `properties`, `additionalProperties`,
        /// `items`, `enum`, `const`, `minLength`, `minimum`):
        ///
        /// - a struct is an object with its fields as `properties`; the
        ///   fields without a default and not an `Option` are `required`;
        ///   `additionalProperties: false` only when the type has
        ///   `#[serde(deny_unknown_fields)]`. `#[serde(rename)]`,
        ///   `rename_all`, `flatten` and `default` are followed;
        /// - nested structs, `Vec`s and arrays are checked in place; an
        ///   enum of unit variants is a string `enum`; unsigned integers
        ///   carry `minimum: 0`; `#[schemars(range(min = ...))]` and
        ///   `#[schemars(length(min = ...))]` give `minimum` and
        ///   `minLength`;
        /// - a member of type `serde_json::Value` (schemars writes `true`)
        ///   is written as `{}`, the same schema as an object: the subset
        ///   (and the Python SDK) count a member whose schema is not an
        ///   object as unnamed, which `additionalProperties: false` would
        ///   refuse.
        ///
        /// What the subset cannot read is written but not checked: an
        /// `Option<T>`'s `type` is a list (`["string", "null"]`), which
        /// the subset reads as no type, so any value passes there; an enum
        /// with data is a `oneOf` (or `anyOf`); a map's value schema is an
        /// `additionalProperties` object; a recursive type refers to itself
        /// with a `$ref` (to `definitions`), the one reference schemars
        /// keeps; `maximum`, `maxLength`, `pattern` and `format` are not in
        /// the subset.
        ///
        /// ```
        /// use babel_idem::schema::{Rule, Schema};
        /// use schemars::JsonSchema;
        /// use serde::Deserialize;
        /// use serde_json::json;
        ///
        /// #[derive(Deserialize, JsonSchema)]
        /// struct OrderCreated {
        ///     order_id: u64,
        ///     lines: Vec<Line>,
        /// }
        ///
        /// #[derive(Deserialize, JsonSchema)]
        /// #[serde(deny_unknown_fields)]
        /// struct Line {
        ///     sku: String,
        ///     #[schemars(range(min = 1))]
        ///     qty: u32,
        /// }
        ///
        /// let schema = Schema::of::<OrderCreated>()?;
        /// assert_eq!(schema.check(&json!({"order_id": 7, "lines": [{"sku": "a", "qty": 2}]})), Ok(()));
        /// let violation = schema.check(&json!({"order_id": 7, "lines": [{"sku": "a", "qty": 0}]})).unwrap_err();
        /// assert_eq!(violation.to_string(), "lines[0].qty: below_minimum");
        /// let violation = schema.check(&json!({"lines": []})).unwrap_err();
        /// assert_eq!(violation.rule(), Rule::MissingRequired);
        /// # Ok::<(), babel_idem::schema::SchemaError>(())
        /// ```
        ///
        /// # Errors
        ///
        /// As [`Schema::from_value`], which cannot refuse what schemars
        /// writes for a type but a schema nested deeper than 128 levels.
        pub fn of<T: JsonSchema + ?Sized>() -> Result<Schema, SchemaError> {
            let generator = SchemaSettings::draft07()
                .with(|settings| settings.inline_subschemas = true)
                .into_generator();
            let mut schema = generator.into_root_schema_for::<T>().to_value();
            open_true_schemas(&mut schema);
            Schema::from_value(schema)
        }
    }

    impl Schemas {
        /// These schemas and the schema of the message type `M`
        /// ([`Schema::of`]) for its URN ([`Message::URN`]), in place of any
        /// it had.
        ///
        /// ```
        /// use babel_idem::Message;
        /// use babel_idem::schema::{SchemaProvider, Schemas};
        /// use schemars::JsonSchema;
        /// use serde::{Deserialize, Serialize};
        /// use serde_json::json;
        ///
        /// #[derive(Serialize, Deserialize, JsonSchema, Message)]
        /// #[message(urn = "urn:babel:orders:created")]
        /// struct OrderCreated {
        ///     order_id: u64,
        /// }
        ///
        /// let schemas = Schemas::new().with_message::<OrderCreated>()?;
        /// let violation = schemas.check("urn:babel:orders:created", &json!({"order_id": -1})).unwrap_err();
        /// assert_eq!(violation.to_string(), "order_id: below_minimum");
        /// # Ok::<(), babel_idem::schema::SchemaError>(())
        /// ```
        ///
        /// # Errors
        ///
        /// [`SchemaError::ForUrn`], naming the URN, when [`Schema::of`]
        /// fails.
        pub fn with_message<M: Message + JsonSchema>(self) -> Result<Self, SchemaError> {
            match Schema::of::<M>() {
                Ok(schema) => Ok(self.with(M::URN.as_str(), schema)),
                Err(error) => Err(SchemaError::ForUrn {
                    urn: M::URN.to_string(),
                    source: Box::new(error),
                }),
            }
        }
    }

    /// Writes `{}` for every `true` schema where the subset reads a schema
    /// (a member of `properties`, `items`), at any depth: the same schema
    /// in JSON Schema, and an object, which the subset reads as a named
    /// member.
    fn open_true_schemas(schema: &mut Value) {
        let Value::Object(node) = schema else {
            return;
        };
        if let Some(Value::Object(properties)) = node.get_mut("properties") {
            properties.values_mut().for_each(open);
        }
        if let Some(items) = node.get_mut("items") {
            open(items);
        }
    }

    fn open(schema: &mut Value) {
        if *schema == Value::Bool(true) {
            *schema = Value::Object(Map::new());
        }
        open_true_schemas(schema);
    }
}
