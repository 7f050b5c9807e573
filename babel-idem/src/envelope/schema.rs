//! A producer's schema check of an envelope's `data` (feature `schema`),
//! on the text a consumer will read.

use super::{Envelope, raw};
use crate::router::InvalidPayloadError;
use crate::schema::{Schema, SchemaProvider, Violation};

impl Envelope {
    /// Checks `data` against the schema `schemas` holds for this envelope's
    /// URN, as the Python SDK's producer-side `schema.validate` does before
    /// a publish: `Ok(())` when it is valid or when the URN has no schema
    /// (validation is opt-in), else the first violation as the family's
    /// [`InvalidPayloadError`]. Nothing is sent or saved: call it before
    /// [`Publisher::publish_envelope`](crate::broker::Publisher::publish_envelope)
    /// or an outbox's `save`.
    ///
    /// The data is checked as it will be written: the text of `data` in
    /// the envelope's own encoding ([`Envelope::to_vec`]), its members in
    /// that document order, which decides the first of several violations
    /// just as it does for a consumer reading the bytes.
    ///
    /// ```
    /// use babel_idem::Envelope;
    /// use babel_idem::schema::{Schema, Schemas};
    /// use serde_json::json;
    ///
    /// let schemas = Schemas::new().with(
    ///     "urn:babel:orders:created",
    ///     Schema::from_value(json!({
    ///         "type": "object",
    ///         "required": ["order_id"],
    ///         "properties": {"order_id": {"type": "integer", "minimum": 1}}
    ///     }))?,
    /// );
    ///
    /// let valid = Envelope::new("urn:babel:orders:created", json!({"order_id": 7}));
    /// assert_eq!(valid.check_schema(&schemas), Ok(()));
    ///
    /// let invalid = Envelope::new("urn:babel:orders:created", json!({"order_id": 0}));
    /// let error = invalid.check_schema(&schemas).unwrap_err();
    /// assert_eq!(error.violation(), "order_id: below_minimum");
    /// assert_eq!(
    ///     error.to_string(),
    ///     "data for 'urn:babel:orders:created' does not match its URN schema: order_id: below_minimum"
    /// );
    ///
    /// // A URN without a schema is not checked.
    /// let other = Envelope::new("urn:babel:orders:voided", json!({}));
    /// assert_eq!(other.check_schema(&schemas), Ok(()));
    /// # Ok::<(), babel_idem::schema::SchemaError>(())
    /// ```
    pub fn check_schema<S>(&self, schemas: &S) -> Result<(), InvalidPayloadError>
    where
        S: SchemaProvider + ?Sized,
    {
        match schemas.schema_for(self.urn()) {
            None => Ok(()),
            Some(schema) => self
                .check_data(schema)
                .map_err(|violation| InvalidPayloadError::from_violation(self.urn(), &violation)),
        }
    }

    /// The first violation of `data` against `schema`, on the text of
    /// `data` as [`Envelope::to_vec`] writes it. A text the reader cannot
    /// walk (nested deeper than it reads) is checked as the decoded map:
    /// the same verdict, its members visited in key order.
    fn check_data(&self, schema: &Schema) -> Result<(), Violation> {
        let encoded = self.to_vec();
        let text = std::str::from_utf8(&encoded)
            .ok()
            .and_then(|envelope| raw::value_at(envelope, "data"));
        match text.map(|data| schema.check_json(data)) {
            Some(Ok(verdict)) => verdict,
            Some(Err(_)) | None => schema.check_map(&self.data),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::schema::Schemas;

    fn schemas() -> Schemas {
        Schemas::from_json_map([(
            "urn:babel:orders:created",
            r#"{"type": "object", "properties": {
                "a": {"type": "string"}, "b": {"type": "string"}
            }}"#,
        )])
        .unwrap()
    }

    #[test]
    fn the_first_violation_follows_the_order_the_envelope_is_written_in() {
        // Decoded from text: `data` is written back as it came, `b` first.
        let decoded: Envelope = r#"{"job":"urn:babel:orders:created","trace_id":"t","data":{"b":2,"a":1},"meta":{"id":"x","queue":"q","lang":"php","schema_version":1,"created_at":1},"attempts":0}"#
            .parse()
            .unwrap();
        let error = decoded.check_schema(&schemas()).unwrap_err();
        assert_eq!(error.violation(), "b: not_a_string");

        // Built in code: the canonical encoding writes `data` in the map's
        // own order (by key, unless serde_json preserves insertion order).
        let built = Envelope::new("urn:babel:orders:created", json!({"b": 2, "a": 1}));
        let error = built.check_schema(&schemas()).unwrap_err();
        assert_eq!(
            Some(error.path()),
            built.data.keys().next().map(String::as_str)
        );
    }

    #[test]
    fn a_changed_member_is_checked_as_it_now_is() {
        let mut decoded: Envelope = r#"{"job":"urn:babel:orders:created","trace_id":"t","data":{"a":"x"},"meta":{"id":"x","queue":"q","lang":"php","schema_version":1,"created_at":1},"attempts":0}"#
            .parse()
            .unwrap();
        assert_eq!(decoded.check_schema(&schemas()), Ok(()));
        decoded.data.insert("a".into(), json!(5));
        assert_eq!(
            decoded.check_schema(&schemas()).unwrap_err().violation(),
            "a: not_a_string"
        );
    }

    #[test]
    fn data_nested_deeper_than_the_text_reader_walks_still_gets_a_verdict() {
        let mut deep = json!("leaf");
        for _ in 0..200 {
            deep = json!([deep]);
        }
        let envelope = Envelope::new("urn:babel:orders:created", json!({"a": deep}));
        assert_eq!(
            envelope.check_schema(&schemas()).unwrap_err().violation(),
            "a: not_a_string"
        );
    }

    #[test]
    fn a_provider_behind_a_trait_object_checks_the_same() {
        let provider: &dyn SchemaProvider = &schemas();
        let valid = Envelope::new("urn:babel:orders:created", json!({"a": "x"}));
        assert_eq!(valid.check_schema(provider), Ok(()));
        let invalid = Envelope::new("urn:babel:orders:created", json!({"a": 1}));
        assert_eq!(
            invalid.check_schema(provider).unwrap_err().violation(),
            "a: not_a_string"
        );
    }
}
