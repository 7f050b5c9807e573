//! [`Schema`]: one schema, read once into the rules its checks apply.

use serde_json::{Map, Number, Value};

use super::compile::{self, Rules, TooDeep};
use super::error::{SchemaError, what_is};
use super::instance::{Instance, Kind};
use super::text::{self, Infinite, Json};
use super::validate;
use super::violation::Violation;

/// One payload schema: a JSON object in the family's subset of JSON Schema
/// (see the [module docs](super) for the keywords and how each is read).
///
/// ```
/// use babel_idem::schema::Schema;
/// use serde_json::json;
///
/// let schema = Schema::from_value(json!({"type": "string", "minLength": 2}))?;
/// assert!(schema.check(&json!("ab")).is_ok());
/// assert_eq!(schema.check(&json!("a")).unwrap_err().to_string(), "<root>: below_min_length");
/// # Ok::<(), babel_idem::schema::SchemaError>(())
/// ```
#[derive(Debug, Clone)]
pub struct Schema {
    source: Value,
    rules: Rules,
}

impl Schema {
    /// The schema `schema`, which must be a JSON object.
    ///
    /// ```
    /// use babel_idem::schema::Schema;
    /// use serde_json::json;
    ///
    /// let schema = Schema::from_value(json!({"type": "integer", "minimum": 1}))?;
    /// assert_eq!(schema.as_value()["minimum"], 1);
    /// assert!(Schema::from_value(json!("integer")).is_err());
    /// # Ok::<(), babel_idem::schema::SchemaError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`SchemaError::NotAnObject`] when `schema` is not an object;
    /// [`SchemaError::TooDeep`] when its `properties` and `items` nest
    /// deeper than 128 levels.
    pub fn from_value(schema: Value) -> Result<Schema, SchemaError> {
        let Value::Object(node) = &schema else {
            return Err(SchemaError::NotAnObject {
                found: what_is(&schema),
            });
        };
        let rules = compile::rules(node).map_err(|TooDeep| SchemaError::TooDeep {
            limit: compile::MAX_DEPTH,
        })?;
        Ok(Schema {
            source: schema,
            rules,
        })
    }

    /// The schema in the JSON text `text`, which must hold an object.
    ///
    /// Its numbers are read as Python reads them: `-0` is the integer 0,
    /// where `serde_json` reads a float.
    ///
    /// ```
    /// use babel_idem::schema::Schema;
    ///
    /// let schema = Schema::from_json(r#"{"const": -0}"#)?;
    /// assert_eq!(schema.as_value()["const"].as_i64(), Some(0));
    /// assert!(Schema::from_json("{\"type\": ").is_err());
    /// # Ok::<(), babel_idem::schema::SchemaError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`SchemaError::SchemaText`] when `text` is not JSON or holds a number
    /// beyond `f64`; otherwise as [`Schema::from_value`].
    pub fn from_json(text: &str) -> Result<Schema, SchemaError> {
        let json =
            text::parse(text, Infinite::Refuse).map_err(|error| SchemaError::SchemaText {
                offset: error.offset,
                reason: error.reason,
            })?;
        Schema::from_value(to_value(json))
    }

    /// The schema as it was given.
    ///
    /// ```
    /// use babel_idem::schema::Schema;
    /// use serde_json::json;
    ///
    /// let schema = Schema::from_value(json!({"type": "null", "x-note": "kept"}))?;
    /// assert_eq!(schema.as_value(), &json!({"type": "null", "x-note": "kept"}));
    /// # Ok::<(), babel_idem::schema::SchemaError>(())
    /// ```
    pub fn as_value(&self) -> &Value {
        &self.source
    }

    /// The first violation of `data`, or `Ok(())` when it is valid.
    ///
    /// The members of an object are visited in the order of its
    /// [`Map`], sorted by name; [`Schema::check_json`] follows the
    /// document's order, as the Python SDK does. The numbers are the
    /// value's: `serde_json` reads the literal `-0` as a float, where
    /// Python (and [`Schema::check_json`]) read an integer.
    ///
    /// ```
    /// use babel_idem::schema::Schema;
    /// use serde_json::json;
    ///
    /// let schema = Schema::from_value(json!({"type": "object", "required": ["id"]}))?;
    /// assert!(schema.check(&json!({"id": 1})).is_ok());
    /// assert_eq!(schema.check(&json!({})).unwrap_err().to_string(), "id: missing_required");
    /// # Ok::<(), babel_idem::schema::SchemaError>(())
    /// ```
    pub fn check(&self, data: &Value) -> Result<(), Violation> {
        validate::check(&self.rules, data.kind())
    }

    /// [`Schema::check`] of an object given as its [`Map`], such as an
    /// envelope's `data`.
    ///
    /// ```
    /// use babel_idem::schema::Schema;
    /// use serde_json::{Map, json};
    ///
    /// let schema = Schema::from_value(json!({"type": "object", "additionalProperties": false}))?;
    /// let mut data = Map::new();
    /// assert!(schema.check_map(&data).is_ok());
    /// data.insert("extra".into(), json!(1));
    /// assert_eq!(schema.check_map(&data).unwrap_err().to_string(), "extra: additional_not_allowed");
    /// # Ok::<(), babel_idem::schema::SchemaError>(())
    /// ```
    pub fn check_map(&self, data: &Map<String, Value>) -> Result<(), Violation> {
        validate::check::<Value>(&self.rules, Kind::Object(data))
    }

    /// The first violation of the data in the JSON text `data`, its
    /// objects' members visited in document order, as the Python SDK
    /// visits them; `Ok(Ok(()))` when it is valid.
    ///
    /// Its numbers are read as Python reads them (`-0` is an integer,
    /// `1e400` an infinite float); a member named twice counts once, in
    /// its first place with its last value.
    ///
    /// ```
    /// use babel_idem::schema::Schema;
    ///
    /// let schema = Schema::from_json(r#"{"type": "object", "properties": {
    ///     "a": {"type": "string"}, "b": {"type": "string"}
    /// }}"#)?;
    /// let first = schema.check_json(r#"{"b": 2, "a": 1}"#)?.unwrap_err();
    /// assert_eq!(first.to_string(), "b: not_a_string");
    /// assert!(schema.check_json("{\"a\": ").is_err());
    /// # Ok::<(), babel_idem::schema::SchemaError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`SchemaError::DataText`] when `data` is not JSON (or nests deeper
    /// than 128 levels).
    pub fn check_json(&self, data: &str) -> Result<Result<(), Violation>, SchemaError> {
        let json = text::parse(data, Infinite::Read).map_err(|error| SchemaError::DataText {
            offset: error.offset,
            reason: error.reason,
        })?;
        Ok(validate::check(&self.rules, json.kind()))
    }
}

/// The value of a tree read with [`Infinite::Refuse`]: every float is finite.
fn to_value(json: Json<'_>) -> Value {
    match json {
        Json::Null => Value::Null,
        Json::Bool(b) => Value::Bool(b),
        Json::Int(i) => match (u64::try_from(i), i64::try_from(i)) {
            (Ok(u), _) => Value::from(u),
            (_, Ok(i)) => Value::from(i),
            // The reader keeps integers within i64 or u64.
            _ => Value::from(i as f64),
        },
        Json::Float(f) => Number::from_f64(f).map_or(Value::Null, Value::Number),
        Json::Str(s) => Value::String(s.into_owned()),
        Json::Array(items) => Value::Array(items.into_iter().map(to_value).collect()),
        Json::Object(members) => Value::Object(
            members
                .into_iter()
                .map(|(name, value)| (name.into_owned(), to_value(value)))
                .collect(),
        ),
    }
}
