//! The producer's side of the envelope: the bytes a producer publishes or
//! stores in an outbox, checked before they leave, and the envelopes a
//! handler emits in answer to the one it received.

use serde_json::{Map, Value};

use super::{DataError, Envelope, EnvelopeError};
use crate::message::MessageId;

/// The keys the contract forbids a producer to write (message-envelope.md
/// §10, as the Python SDK's `EnvelopeCodec.encode` refuses them): top-level
/// `timestamp` and the inbound-only alias `urn`; `meta.max_retries`,
/// `meta.attempts`, `meta.source`, `meta.ts`.
const FORBIDDEN_TOP: [&str; 2] = ["timestamp", "urn"];
const FORBIDDEN_META: [&str; 4] = ["max_retries", "attempts", "source", "ts"];

/// Why an envelope cannot be published: nothing was written anywhere.
///
/// ```
/// use babel_idem::Envelope;
/// use babel_idem::envelope::ProduceError;
/// use serde_json::json;
///
/// let env = Envelope::new("urn:babel:orders:created", json!({})).without_id();
/// assert!(matches!(env.encode_for_publish(), Err(ProduceError::MissingId)));
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProduceError {
    /// The envelope has no `meta.id`: consumers could not tell a redelivery
    /// from a new message.
    #[error(
        "the envelope has no meta.id, so consumers could not deduplicate it; \
         nothing was published"
    )]
    MissingId,
    /// The envelope carries a key the contract forbids producers to write.
    #[error(
        "the envelope carries {pointer}, a key producers must not write \
         (message-envelope.md §10); nothing was published"
    )]
    ForbiddenKey {
        /// Where, as a JSON pointer (`/timestamp`, `/meta/ts`).
        pointer: String,
    },
    /// The encoded bytes would not decode as a valid envelope (a blank URN
    /// or `trace_id`, an unsupported `schema_version`); says which rule
    /// failed.
    #[error(
        "the envelope would not decode on the consumer side ({0}); \
         nothing was published"
    )]
    Invalid(#[source] EnvelopeError),
    /// A [`Message`](crate::Message) value cannot be an envelope's `data`
    /// (see [`Envelope::from_message`]); says why.
    #[error("{0}; nothing was published")]
    Data(#[from] DataError),
}

impl Envelope {
    /// The bytes a producer publishes: the canonical encoding the Python
    /// SDK's `EnvelopeCodec.encode` writes (compact JSON, unescaped Unicode,
    /// `job`, `trace_id`, `data`, `meta`, `attempts` in that order) for an
    /// envelope built in code, the decoded text for one that was decoded
    /// (see [`Envelope::to_vec`]). Refused, before anything is written,
    /// when the envelope has no `meta.id`, carries a key producers must not
    /// write, or would not decode back.
    ///
    /// ```
    /// use babel_idem::Envelope;
    /// use serde_json::json;
    ///
    /// let env = Envelope::new("urn:babel:orders:created", json!({"order_id": 7}))
    ///     .with_queue("orders");
    /// let bytes = env.encode_for_publish()?;
    /// assert!(bytes.starts_with(br#"{"job":"urn:babel:orders:created","trace_id":""#));
    ///
    /// let blank = Envelope::new("   ", json!({}));
    /// assert!(blank.encode_for_publish().is_err());
    /// # Ok::<(), babel_idem::envelope::ProduceError>(())
    /// ```
    pub fn encode_for_publish(&self) -> Result<Vec<u8>, ProduceError> {
        if self.message_id().is_none() {
            return Err(ProduceError::MissingId);
        }
        if let Some(pointer) = forbidden_key(&self.extra, &self.meta.extra) {
            return Err(ProduceError::ForbiddenKey { pointer });
        }
        if self.job.trim().is_empty() {
            return Err(ProduceError::Invalid(EnvelopeError::MissingUrn));
        }
        let bytes = self.to_vec();
        Envelope::from_slice(&bytes).map_err(ProduceError::Invalid)?;
        Ok(bytes)
    }

    /// The queue a producer sends this envelope to: `meta.queue`, else
    /// `default` (the family's rule for an outbox row's queue).
    ///
    /// ```
    /// use babel_idem::Envelope;
    /// use serde_json::json;
    ///
    /// let env = Envelope::new("urn:babel:orders:created", json!({}));
    /// assert_eq!(env.with_queue("").destination(), "default");
    /// ```
    pub fn destination(&self) -> &str {
        if self.meta.queue.is_empty() {
            "default"
        } else {
            &self.meta.queue
        }
    }

    /// A new message caused by this one: a fresh `meta.id` (a deliberate
    /// re-run of the handler emits new messages), this envelope's
    /// `trace_id` (the causal chain continues), `created_at` now and
    /// `attempts` 0, on the queue `default` until
    /// [`with_queue`](Envelope::with_queue) says otherwise.
    ///
    /// ```
    /// use babel_idem::{Envelope, MessageId};
    /// use serde_json::json;
    ///
    /// let incoming = Envelope::new("urn:babel:orders:created", json!({"order_id": 7}));
    /// let outgoing = incoming
    ///     .follow_up("urn:babel:ledger:credited", json!({"amount": 5}))
    ///     .with_queue("ledger");
    /// assert_eq!(outgoing.trace_id, incoming.trace_id);
    /// assert_ne!(outgoing.message_id(), incoming.message_id());
    /// ```
    pub fn follow_up(&self, urn: impl Into<String>, data: Value) -> Envelope {
        Envelope::new(urn, data).with_trace_id(self.trace_id.clone())
    }
}

fn forbidden_key(top: &Map<String, Value>, meta: &Map<String, Value>) -> Option<String> {
    FORBIDDEN_TOP
        .iter()
        .find(|key| top.contains_key(**key))
        .map(|key| format!("/{key}"))
        .or_else(|| {
            FORBIDDEN_META
                .iter()
                .find(|key| meta.contains_key(**key))
                .map(|key| format!("/meta/{key}"))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_forbidden_meta_key_is_refused_with_its_pointer() {
        let mut env = Envelope::new("urn:babel:orders:created", json!({}));
        env.meta.extra.insert("ts".to_owned(), json!(1));
        match env.encode_for_publish() {
            Err(ProduceError::ForbiddenKey { pointer }) => assert_eq!(pointer, "/meta/ts"),
            other => panic!("expected a forbidden key, got {other:?}"),
        }
    }

    #[test]
    fn a_blank_trace_id_is_refused_as_the_consumer_would() {
        let env = Envelope::new("urn:babel:orders:created", json!({})).with_trace_id(" ");
        assert!(matches!(
            env.encode_for_publish(),
            Err(ProduceError::Invalid(EnvelopeError::BlankTraceId))
        ));
    }

    #[test]
    fn a_schema_version_consumers_do_not_read_is_refused() {
        let mut env = Envelope::new("urn:babel:orders:created", json!({}));
        env.meta.schema_version = 2;
        assert!(matches!(
            env.encode_for_publish(),
            Err(ProduceError::Invalid(
                EnvelopeError::UnsupportedSchemaVersion(2)
            ))
        ));
    }

    #[test]
    fn a_decoded_envelope_publishes_as_its_own_bytes() {
        let text = r#"{"job":"urn:babel:a:b","trace_id":"t","data":{"z":1e-07},"meta":{"id":"x","queue":"q","lang":"php","schema_version":1,"created_at":1},"attempts":0}"#;
        let env: Envelope = text.parse().unwrap();
        assert_eq!(env.encode_for_publish().unwrap(), text.as_bytes());
    }
}
