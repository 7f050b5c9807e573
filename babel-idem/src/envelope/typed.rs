//! The envelope of a [`Message`] value: the type's URN as `job`, the value
//! serialized as `data`. What a typed publish and a typed outbox save write.

use std::any::type_name;

use serde_json::Value;

use super::Envelope;
use super::decode::kind;
use crate::message::Message;

/// Why a value of a [`Message`] type cannot be the `data` of an envelope:
/// its `Serialize` fails, or writes something other than a JSON object.
/// Nothing was published or saved.
///
/// ```
/// use babel_idem::envelope::DataError;
/// use babel_idem::{Envelope, Message};
/// use serde::{Deserialize, Serialize};
///
/// /// A newtype serializes as what it wraps: a number, not an object.
/// #[derive(Serialize, Deserialize, Message)]
/// #[message(urn = "urn:babel:orders:counted")]
/// struct OrderCount(u64);
///
/// let error = Envelope::from_message(&OrderCount(3)).unwrap_err();
/// assert!(matches!(error, DataError::NotAnObject { found: "number", .. }));
/// let text = error.to_string();
/// assert!(text.starts_with("the data of urn:babel:orders:counted must be a JSON object, and `"));
/// assert!(text.ends_with("OrderCount` serializes to a number"));
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DataError {
    /// The value serializes, but not to a JSON object.
    #[error(
        "the data of {urn} must be a JSON object, and `{type_name}` serializes to {}",
        with_article(found)
    )]
    NotAnObject {
        /// The URN of the message type.
        urn: String,
        /// The message type ([`std::any::type_name`]).
        type_name: &'static str,
        /// The JSON type it serializes to: `array`, `string`, `number`,
        /// `boolean` or `null`.
        found: &'static str,
    },
    /// The value's `Serialize` failed, or wrote what JSON cannot hold (a
    /// map whose keys are not strings, an integer beyond 64 bits).
    #[error("the data of {urn} does not serialize to JSON (`{type_name}`): {source}")]
    Serialize {
        /// The URN of the message type.
        urn: String,
        /// The message type ([`std::any::type_name`]).
        type_name: &'static str,
        /// serde_json's error.
        #[source]
        source: serde_json::Error,
    },
}

/// `an array`, `a string`, `null`: a JSON type's name as a sentence uses it.
fn with_article(found: &str) -> String {
    match found {
        "null" => found.to_owned(),
        _ if found.starts_with(['a', 'o']) => format!("an {found}"),
        _ => format!("a {found}"),
    }
}

impl Envelope {
    /// A new producer envelope (as [`Envelope::new`] mints one: fresh
    /// `meta.id` and `trace_id`, `created_at` now, on the queue `default`)
    /// for `message`: `job` is the type's [`Message::URN`], `data` the value
    /// as `serde_json::to_value` writes it (a non-finite float becomes
    /// `null`, as serde_json writes one). Set the queue with
    /// [`with_queue`](Envelope::with_queue), continue a causal chain with
    /// [`with_trace_id`](Envelope::with_trace_id).
    ///
    /// ```
    /// use babel_idem::{Envelope, Message};
    /// use serde::{Deserialize, Serialize};
    ///
    /// #[derive(Serialize, Deserialize, Message)]
    /// #[message(urn = "urn:babel:orders:created")]
    /// struct OrderCreated {
    ///     order_id: u64,
    /// }
    ///
    /// let envelope = Envelope::from_message(&OrderCreated { order_id: 7 })?.with_queue("orders");
    /// assert_eq!(envelope.urn(), "urn:babel:orders:created");
    /// assert_eq!(envelope.data["order_id"], 7);
    /// assert_eq!(envelope.destination(), "orders");
    /// # Ok::<(), babel_idem::envelope::DataError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`DataError`] when the value does not serialize to a JSON object:
    /// an envelope's `data` is always one.
    pub fn from_message<M: Message>(message: &M) -> Result<Envelope, DataError> {
        let urn = M::URN;
        let urn = urn.as_str();
        match serde_json::to_value(message) {
            Ok(Value::Object(data)) => Ok(Envelope::new(urn, Value::Object(data))),
            Ok(other) => Err(DataError::NotAnObject {
                urn: urn.to_owned(),
                type_name: type_name::<M>(),
                found: kind(&other),
            }),
            Err(source) => Err(DataError::Serialize {
                urn: urn.to_owned(),
                type_name: type_name::<M>(),
                source,
            }),
        }
    }
}

/// The envelope a typed publish or a typed outbox save writes: `message`'s
/// ([`Envelope::from_message`]) on `queue`.
pub(crate) fn on_queue<M: Message>(queue: &str, message: &M) -> Result<Envelope, DataError> {
    Envelope::from_message(message).map(|envelope| envelope.with_queue(queue))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Serialize};
    use serde_json::json;

    use super::*;
    use crate::message::MessageId;

    #[derive(Serialize, Deserialize, crate::Message)]
    #[message(urn = "urn:babel:orders:created")]
    struct OrderCreated {
        order_id: u64,
        lines: Vec<String>,
    }

    #[derive(Serialize, Deserialize, crate::Message)]
    #[message(urn = "urn:babel:orders:tagged")]
    struct Tags(Vec<String>);

    #[derive(Serialize, Deserialize, crate::Message)]
    #[message(urn = "urn:babel:orders:indexed")]
    struct ByPair {
        index: BTreeMap<(u8, u8), u8>,
    }

    #[test]
    fn a_message_becomes_a_fresh_envelope_of_its_urn_and_value() {
        let order = OrderCreated {
            order_id: 7,
            lines: vec!["a".into()],
        };
        let first = Envelope::from_message(&order).unwrap();
        let second = Envelope::from_message(&order).unwrap();
        assert_eq!(first.urn(), "urn:babel:orders:created");
        assert_eq!(
            serde_json::Value::Object(first.data.clone()),
            json!({"order_id": 7, "lines": ["a"]})
        );
        assert_eq!(first.attempts, 0);
        assert_eq!(first.meta.lang, super::super::LANG);
        assert_ne!(first.message_id(), second.message_id(), "a fresh id each");
        assert_ne!(first.trace_id, second.trace_id, "a fresh trace each");
    }

    #[test]
    fn a_value_that_is_not_an_object_is_refused_with_its_json_type() {
        let error = Envelope::from_message(&Tags(vec!["x".into()])).unwrap_err();
        match &error {
            DataError::NotAnObject {
                urn,
                type_name,
                found,
            } => {
                assert_eq!(urn, "urn:babel:orders:tagged");
                assert!(type_name.ends_with("::Tags"), "{type_name}");
                assert_eq!(*found, "array");
            }
            other => panic!("expected NotAnObject, got {other:?}"),
        }
        assert!(error.to_string().ends_with("serializes to an array"));
    }

    #[test]
    fn a_value_json_cannot_hold_is_refused_with_serdes_reason() {
        let value = ByPair {
            index: BTreeMap::from([((1, 2), 3)]),
        };
        let error = Envelope::from_message(&value).unwrap_err();
        assert!(
            matches!(&error, DataError::Serialize { urn, .. } if urn == "urn:babel:orders:indexed"),
            "{error:?}"
        );
        assert!(
            error.to_string().contains("key must be a string"),
            "{error}"
        );
    }
}
