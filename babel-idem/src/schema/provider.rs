//! Where the schema of a URN comes from: [`SchemaProvider`], and
//! [`Schemas`], the schemas given in code.

use std::collections::HashMap;

use foldhash::fast::RandomState;
use serde_json::Value;

use super::definition::Schema;
use super::error::SchemaError;
use super::violation::Violation;

/// A source of per-URN payload schemas.
///
/// Lookups cannot fail: a provider reads everything it serves before it is
/// used ([`Registry::open`](super::Registry::open) reads every file), so a
/// running consumer never meets an I/O error here. A URN without a schema
/// is not checked: validation is opt-in.
///
/// ```
/// use babel_idem::schema::{Schema, SchemaProvider};
///
/// /// Every URN of one domain shares one schema.
/// struct Orders(Schema);
///
/// impl SchemaProvider for Orders {
///     fn schema_for(&self, urn: &str) -> Option<&Schema> {
///         urn.starts_with("urn:babel:orders:").then_some(&self.0)
///     }
/// }
///
/// let orders = Orders(Schema::from_json(r#"{"type": "object", "required": ["order_id"]}"#)?);
/// assert!(orders.schema_for("urn:babel:orders:created").is_some());
/// assert!(orders.check("urn:babel:invoices:paid", &serde_json::json!({})).is_ok());
/// # Ok::<(), babel_idem::schema::SchemaError>(())
/// ```
pub trait SchemaProvider: Send + Sync + 'static {
    /// The schema registered for `urn`, or `None` when there is none.
    fn schema_for(&self, urn: &str) -> Option<&Schema>;

    /// The first violation of `data` against `urn`'s schema; `Ok(())` when
    /// it is valid or when `urn` has no schema (the Python SDK's `check`).
    ///
    /// ```
    /// use babel_idem::schema::{Schema, SchemaProvider, Schemas};
    /// use serde_json::json;
    ///
    /// let schemas = Schemas::new().with(
    ///     "urn:babel:orders:created",
    ///     Schema::from_value(json!({"type": "object", "required": ["order_id"]}))?,
    /// );
    /// let violation = schemas.check("urn:babel:orders:created", &json!({})).unwrap_err();
    /// assert_eq!(violation.to_string(), "order_id: missing_required");
    /// assert!(schemas.check("urn:babel:orders:voided", &json!({})).is_ok());
    /// # Ok::<(), babel_idem::schema::SchemaError>(())
    /// ```
    fn check(&self, urn: &str, data: &Value) -> Result<(), Violation> {
        self.schema_for(urn)
            .map_or(Ok(()), |schema| schema.check(data))
    }

    /// [`SchemaProvider::check`] of the data in the JSON text `data`, in
    /// document order ([`Schema::check_json`]). The text of a URN without
    /// a schema is not read.
    ///
    /// ```
    /// use babel_idem::schema::{SchemaProvider, Schemas};
    ///
    /// let schemas = Schemas::from_json_map([("urn:babel:orders:created", r#"{"type": "object"}"#)])?;
    /// assert!(schemas.check_json("urn:babel:orders:created", "[]")?.is_err());
    /// assert!(schemas.check_json("urn:babel:orders:voided", "[]")?.is_ok());
    /// # Ok::<(), babel_idem::schema::SchemaError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`SchemaError::DataText`] when `urn` has a schema and `data` is not
    /// JSON.
    fn check_json(&self, urn: &str, data: &str) -> Result<Result<(), Violation>, SchemaError> {
        self.schema_for(urn)
            .map_or(Ok(Ok(())), |schema| schema.check_json(data))
    }
}

/// Schemas given in code, by URN: the in-memory [`SchemaProvider`].
///
/// ```
/// use babel_idem::schema::{Schema, SchemaProvider, Schemas};
/// use serde_json::json;
///
/// let schemas = Schemas::new()
///     .with("urn:babel:orders:created", Schema::from_value(json!({"type": "object"}))?)
///     .with("urn:babel:orders:voided", Schema::from_value(json!({"type": "object"}))?);
/// assert!(schemas.schema_for("urn:babel:orders:voided").is_some());
/// assert!(schemas.schema_for("urn:babel:orders:paid").is_none());
/// # Ok::<(), babel_idem::schema::SchemaError>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct Schemas {
    by_urn: HashMap<String, Schema, RandomState>,
}

impl Schemas {
    /// No schemas: every URN is left unchecked.
    ///
    /// ```
    /// use babel_idem::schema::{SchemaProvider, Schemas};
    ///
    /// assert!(Schemas::new().schema_for("urn:babel:orders:created").is_none());
    /// ```
    pub fn new() -> Self {
        Schemas::default()
    }

    /// These schemas and `schema` for `urn`, in place of any it had.
    ///
    /// ```
    /// use babel_idem::schema::{Schema, SchemaProvider, Schemas};
    /// use serde_json::json;
    ///
    /// let schemas = Schemas::new()
    ///     .with("urn:babel:orders:created", Schema::from_value(json!({"type": "array"}))?)
    ///     .with("urn:babel:orders:created", Schema::from_value(json!({"type": "object"}))?);
    /// assert!(schemas.check("urn:babel:orders:created", &json!({})).is_ok());
    /// # Ok::<(), babel_idem::schema::SchemaError>(())
    /// ```
    #[must_use]
    pub fn with(mut self, urn: impl Into<String>, schema: Schema) -> Self {
        self.by_urn.insert(urn.into(), schema);
        self
    }

    /// The schemas of `(urn, JSON text)` pairs, each read with
    /// [`Schema::from_json`]; a URN given twice keeps its last schema (the
    /// Python SDK's `MapProvider.from_json`).
    ///
    /// ```
    /// use babel_idem::schema::{SchemaError, Schemas};
    ///
    /// let schemas = Schemas::from_json_map([
    ///     ("urn:babel:orders:created", r#"{"type": "object", "required": ["order_id"]}"#),
    ///     ("urn:babel:orders:voided", r#"{"type": "object"}"#),
    /// ])?;
    /// assert_eq!(schemas.urns().count(), 2);
    ///
    /// let error = Schemas::from_json_map([("urn:babel:orders:paid", "[]")]).unwrap_err();
    /// assert!(matches!(&error, SchemaError::ForUrn { urn, .. } if urn == "urn:babel:orders:paid"));
    /// # Ok::<(), SchemaError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`SchemaError::ForUrn`], naming the URN, when a text is not a usable
    /// schema.
    pub fn from_json_map<I, U, T>(entries: I) -> Result<Self, SchemaError>
    where
        I: IntoIterator<Item = (U, T)>,
        U: Into<String>,
        T: AsRef<str>,
    {
        let mut schemas = Schemas::new();
        for (urn, text) in entries {
            let urn = urn.into();
            match Schema::from_json(text.as_ref()) {
                Ok(schema) => schemas = schemas.with(urn, schema),
                Err(error) => {
                    return Err(SchemaError::ForUrn {
                        urn,
                        source: Box::new(error),
                    });
                }
            }
        }
        Ok(schemas)
    }

    /// The URNs that have a schema, in no particular order.
    ///
    /// ```
    /// use babel_idem::schema::Schemas;
    ///
    /// let schemas = Schemas::from_json_map([("urn:babel:orders:created", "{}")])?;
    /// assert_eq!(schemas.urns().collect::<Vec<_>>(), ["urn:babel:orders:created"]);
    /// # Ok::<(), babel_idem::schema::SchemaError>(())
    /// ```
    pub fn urns(&self) -> impl Iterator<Item = &str> {
        self.by_urn.keys().map(String::as_str)
    }
}

impl SchemaProvider for Schemas {
    fn schema_for(&self, urn: &str) -> Option<&Schema> {
        self.by_urn.get(urn)
    }
}
