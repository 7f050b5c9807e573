//! Reading one dead-letter queue message: an envelope with its
//! `dead_letter` block, a message the broker dead-lettered itself, a poison
//! record, or a body that does not decode.

use serde_json::Value;

use super::{Death, DlqMessage, RecordKind};
use crate::envelope::{DeadLetterReason, Envelope};

/// The header the AMQP transport writes on a message it copied to the
/// dead-letter queue because it could not hand it over.
const UNREADABLE_REASON_HEADER: &str = "x-babel-idem-dead-letter-reason";
const UNREADABLE_QUEUE_HEADER: &str = "x-babel-idem-original-queue";

/// What a dead-letter queue message says about itself.
pub(crate) struct Reading {
    pub(crate) kind: RecordKind,
    pub(crate) envelope: Option<Envelope>,
    pub(crate) reason: String,
    pub(crate) failed_at: Option<u64>,
    pub(crate) original_queue: Option<String>,
    pub(crate) error: Option<String>,
    /// For a poison record: the payload it kept, as it holds it.
    pub(crate) payload: Option<Vec<u8>>,
}

pub(crate) fn read(message: &DlqMessage) -> Reading {
    let header = |name: &str| {
        message
            .headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    };
    match Envelope::from_slice(&message.body) {
        Ok(envelope) => match &envelope.dead_letter {
            Some(block) => {
                let poison = block.reason == DeadLetterReason::Poison;
                Reading {
                    kind: if poison {
                        RecordKind::Poison
                    } else {
                        RecordKind::Envelope
                    },
                    reason: block.reason.as_str().to_owned(),
                    failed_at: Some(block.failed_at).filter(|at| *at > 0),
                    original_queue: Some(block.original_queue.clone()).filter(|q| !q.is_empty()),
                    error: block.error.clone(),
                    payload: poison.then(|| spliced_payload(&message.body)).flatten(),
                    envelope: Some(envelope),
                }
            }
            None => match (&message.death, header(UNREADABLE_REASON_HEADER)) {
                (_, Some(why)) => Reading {
                    kind: RecordKind::Poison,
                    reason: DeadLetterReason::Poison.as_str().to_owned(),
                    failed_at: None,
                    original_queue: header(UNREADABLE_QUEUE_HEADER),
                    error: Some(why),
                    payload: Some(message.body.clone()),
                    envelope: Some(envelope),
                },
                (
                    Some(Death {
                        reason,
                        queue,
                        time_ms,
                    }),
                    None,
                ) => Reading {
                    kind: RecordKind::Envelope,
                    reason: reason.clone(),
                    failed_at: *time_ms,
                    original_queue: Some(queue.clone()).filter(|q| !q.is_empty()),
                    error: None,
                    payload: None,
                    envelope: Some(envelope),
                },
                (None, None) => Reading {
                    kind: RecordKind::Envelope,
                    reason: String::new(),
                    failed_at: None,
                    // The Python SDK's fallback: the queue the producer named.
                    original_queue: Some(envelope.meta.queue.clone()).filter(|q| !q.is_empty()),
                    error: None,
                    payload: None,
                    envelope: Some(envelope),
                },
            },
        },
        Err(_) => poison_record(&message.body).unwrap_or_else(|| Reading {
            kind: RecordKind::Undecodable,
            reason: header(UNREADABLE_REASON_HEADER)
                .map(|_| DeadLetterReason::Poison.as_str().to_owned())
                .unwrap_or_default(),
            failed_at: None,
            original_queue: header(UNREADABLE_QUEUE_HEADER),
            error: header(UNREADABLE_REASON_HEADER),
            payload: Some(message.body.clone()),
            envelope: None,
        }),
    }
}

/// A record that is not an envelope but carries a `dead_letter` block: the
/// poison record of the contract, `{"raw": ..., "dead_letter": ...}` or a
/// body with the block spliced in.
fn poison_record(body: &[u8]) -> Option<Reading> {
    let Ok(Value::Object(record)) = serde_json::from_slice::<Value>(body) else {
        return None;
    };
    let Some(Value::Object(block)) = record.get("dead_letter") else {
        return None;
    };
    let text = |key: &str| block.get(key).and_then(Value::as_str).map(str::to_owned);
    let payload = match (record.get("raw"), record.get("raw_encoding")) {
        (Some(Value::String(raw)), Some(Value::String(encoding))) if encoding == "base64" => {
            base64_decode(raw)
        }
        (Some(Value::String(raw)), None) if record.len() == 2 => Some(raw.as_bytes().to_vec()),
        _ => spliced_payload(body),
    };
    Some(Reading {
        kind: RecordKind::Poison,
        reason: text("reason").unwrap_or_else(|| DeadLetterReason::Poison.as_str().to_owned()),
        failed_at: block.get("failed_at").and_then(Value::as_u64),
        original_queue: text("original_queue").filter(|q| !q.is_empty()),
        error: text("error"),
        payload,
        envelope: None,
    })
}

/// The body a spliced record was made from: the record with its last
/// member, `"dead_letter": {...}`, cut off where the splice appended it.
fn spliced_payload(body: &[u8]) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(body).ok()?.trim_end();
    let inner = text.strip_suffix('}')?;
    let marker = "\"dead_letter\":";
    let at = inner.rfind(marker)?;
    let block = &inner[at + marker.len()..];
    let _: serde_json::Map<String, Value> = serde_json::from_str(block).ok()?;
    let before = inner[..at].trim_end();
    let payload = match before.strip_suffix(',') {
        Some(rest) => format!("{rest}}}"),
        None if before.ends_with('{') => format!("{before}}}"),
        None => return None,
    };
    Some(payload.into_bytes())
}

fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let value = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let bytes = text.trim_end_matches('=').as_bytes();
    let mut out = Vec::with_capacity(bytes.len() * 3 / 4);
    for chunk in bytes.chunks(4) {
        let mut acc = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            acc |= value(c)? << (18 - 6 * i);
        }
        let produced = match chunk.len() {
            4 => 3,
            3 => 2,
            2 => 1,
            _ => return None,
        };
        out.extend_from_slice(&acc.to_be_bytes()[1..=produced]);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redrive::DlqHandle;

    fn message(body: &[u8], headers: &[(&str, &str)], death: Option<Death>) -> DlqMessage {
        #[cfg(feature = "redis-transport")]
        let handle = DlqHandle::Redis(body.to_vec());
        #[cfg(not(feature = "redis-transport"))]
        let handle = DlqHandle::Amqp(1);
        DlqMessage {
            body: body.to_vec(),
            headers: headers
                .iter()
                .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
                .collect(),
            death,
            handle,
        }
    }

    const ENVELOPE: &[u8] = br#"{"job":"urn:babel:a:b","trace_id":"t","data":{},"meta":{"id":"1","queue":"meta-queue","schema_version":1},"attempts":2}"#;

    #[test]
    fn a_message_the_broker_dead_lettered_reads_its_reason_queue_and_time_from_x_death() {
        let death = Death {
            reason: "expired".to_owned(),
            queue: "orders".to_owned(),
            time_ms: Some(1_796_093_299_000),
        };
        let reading = read(&message(ENVELOPE, &[], Some(death)));
        assert_eq!(reading.kind, RecordKind::Envelope);
        assert_eq!(reading.reason, "expired");
        assert_eq!(reading.original_queue.as_deref(), Some("orders"));
        assert_eq!(reading.failed_at, Some(1_796_093_299_000));
    }

    #[test]
    fn an_envelope_that_says_nothing_goes_back_to_its_meta_queue() {
        let reading = read(&message(ENVELOPE, &[], None));
        assert_eq!(reading.kind, RecordKind::Envelope);
        assert_eq!(reading.reason, "");
        assert_eq!(reading.original_queue.as_deref(), Some("meta-queue"));
    }

    #[test]
    fn a_copy_the_transport_could_not_hand_over_is_poison_with_its_body_as_payload() {
        let headers = [
            (UNREADABLE_REASON_HEADER, "its headers nest too deep"),
            (UNREADABLE_QUEUE_HEADER, "orders"),
        ];
        let reading = read(&message(ENVELOPE, &headers, None));
        assert_eq!(reading.kind, RecordKind::Poison);
        assert_eq!(reading.payload.as_deref(), Some(ENVELOPE));
        assert_eq!(reading.original_queue.as_deref(), Some("orders"));
        let unreadable = read(&message(b"\xff", &headers, None));
        assert_eq!(unreadable.kind, RecordKind::Undecodable);
        assert_eq!(unreadable.reason, "poison");
    }

    #[test]
    fn a_spliced_record_gives_back_the_body_it_was_made_from() {
        assert_eq!(
            spliced_payload(br#"{"job":7,"dead_letter":{"reason":"poison"}}"#).unwrap(),
            br#"{"job":7}"#
        );
        assert_eq!(
            spliced_payload(br#"{"dead_letter":{"reason":"poison"}}"#).unwrap(),
            b"{}"
        );
        assert!(spliced_payload(b"not json").is_none());
    }

    #[test]
    fn a_wrapped_record_gives_back_its_raw_bytes() {
        let utf8 = poison_record(
            br#"{"raw":"not json","dead_letter":{"reason":"poison","original_queue":"orders"}}"#,
        )
        .unwrap();
        assert_eq!(utf8.payload.unwrap(), b"not json");
        assert_eq!(utf8.original_queue.as_deref(), Some("orders"));
        let binary = poison_record(
            br#"{"raw":"/w==","raw_encoding":"base64","dead_letter":{"reason":"poison"}}"#,
        )
        .unwrap();
        assert_eq!(binary.payload.unwrap(), [0xff]);
        assert_eq!(base64_decode("aGVsbG8=").unwrap(), b"hello");
        assert_eq!(base64_decode("aGVsbA==").unwrap(), b"hell");
    }
}
