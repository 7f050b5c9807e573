//! Reading one dead-letter queue message: an envelope with its
//! `dead_letter` block, a message the broker dead-lettered itself, a poison
//! record, or a body that does not decode (and why).
//!
//! Every record the family writes is read, numbers included: a poison
//! record keeps its body's numbers as written (`1e400`, a 400-digit
//! integer), and Python reads them (as `inf`, as an `int`), so this reader
//! never parses a record into a `serde_json::Value`, which holds neither.
//! An envelope whose numbers only a `Value` refuses is read through a
//! stand-in copy with those numbers replaced: its strings, and so its ids,
//! URN and block, are the record's own.

use serde::Deserializer as _;
use serde_json::value::RawValue;

use super::RecordKind;
use super::rewrite::MembersVisitor;
use crate::broker::{DeadLetterMessage, Death};
use crate::envelope::{DeadLetterReason, Envelope};

/// The header the AMQP transport writes on a message it copied to the
/// dead-letter queue because it could not hand it over.
const UNREADABLE_REASON_HEADER: &str = "x-babel-idem-dead-letter-reason";
const UNREADABLE_QUEUE_HEADER: &str = "x-babel-idem-original-queue";

/// What a dead-letter queue message says about itself.
pub(crate) struct Reading {
    pub(crate) kind: RecordKind,
    /// The envelope as decoded, for a selection's predicate; `None` when
    /// it is not one, or holds numbers a `serde_json::Value` cannot.
    pub(crate) envelope: Option<Envelope>,
    /// `meta.id`, the URN and `trace_id` of an envelope.
    pub(crate) id: Option<String>,
    pub(crate) urn: Option<String>,
    pub(crate) trace_id: Option<String>,
    pub(crate) reason: String,
    pub(crate) failed_at: Option<u64>,
    pub(crate) original_queue: Option<String>,
    /// The error the record keeps or, for a body that does not decode,
    /// why it does not.
    pub(crate) error: Option<String>,
    /// For a poison record: the payload it kept, as it holds it.
    pub(crate) payload: Option<Vec<u8>>,
}

pub(crate) fn read<H>(message: &DeadLetterMessage<H>) -> Reading {
    let header = |name: &str| {
        message
            .headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    };
    let (decoded, exact) = match Envelope::from_slice(&message.body) {
        Ok(envelope) => (Ok(envelope), true),
        Err(error) => match beyond_float(&message.body) {
            Some(stand_in) => (Envelope::from_slice(&stand_in), false),
            None => (Err(error), false),
        },
    };
    let envelope = match decoded {
        Ok(envelope) => envelope,
        Err(error) => {
            return poison_record(&message.body).unwrap_or_else(|| Reading {
                kind: RecordKind::Undecodable,
                envelope: None,
                id: None,
                urn: None,
                trace_id: None,
                reason: header(UNREADABLE_REASON_HEADER)
                    .map(|_| DeadLetterReason::Poison.as_str().to_owned())
                    .unwrap_or_default(),
                failed_at: None,
                original_queue: header(UNREADABLE_QUEUE_HEADER),
                error: header(UNREADABLE_REASON_HEADER).or_else(|| Some(error.to_string())),
                payload: Some(message.body.clone()),
            });
        }
    };
    let mut reading = Reading {
        kind: RecordKind::Envelope,
        envelope: None,
        id: envelope.meta.id.clone(),
        urn: Some(envelope.job.clone()),
        trace_id: Some(envelope.trace_id.clone()),
        reason: String::new(),
        failed_at: None,
        original_queue: None,
        error: None,
        payload: None,
    };
    match (
        &envelope.dead_letter,
        &message.death,
        header(UNREADABLE_REASON_HEADER),
    ) {
        (Some(block), _, _) => {
            let poison = block.reason == DeadLetterReason::Poison;
            if poison {
                reading.kind = RecordKind::Poison;
                reading.payload = spliced_payload(&message.body);
            }
            reading.reason = block.reason.as_str().to_owned();
            reading.failed_at = Some(block.failed_at).filter(|at| *at > 0);
            reading.original_queue = Some(block.original_queue.clone()).filter(|q| !q.is_empty());
            reading.error = block.error.clone();
        }
        (None, _, Some(why)) => {
            reading.kind = RecordKind::Poison;
            reading.reason = DeadLetterReason::Poison.as_str().to_owned();
            reading.original_queue = header(UNREADABLE_QUEUE_HEADER);
            reading.error = Some(why);
            reading.payload = Some(message.body.clone());
        }
        (
            None,
            Some(Death {
                reason,
                queue,
                time_ms,
            }),
            None,
        ) => {
            reading.reason = reason.clone();
            reading.failed_at = *time_ms;
            reading.original_queue = Some(queue.clone()).filter(|q| !q.is_empty());
        }
        // The Python SDK's fallback: the queue the producer named.
        (None, None, None) => {
            reading.original_queue = Some(envelope.meta.queue.clone()).filter(|q| !q.is_empty());
        }
    }
    reading.envelope = exact.then_some(envelope);
    reading
}

/// `body` with every number no `f64` holds (`1e400`, a 400-digit integer)
/// replaced by `1e300` (or `-1e300`): what a `serde_json::Value` reads
/// where it refuses the original. `1e300` is no integer, so an integer
/// field holding such a number is still refused. `None` when `body` is not
/// UTF-8 or holds no such number.
fn beyond_float(body: &[u8]) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(body).ok()?;
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let (mut copied, mut i, mut replaced) = (0, 0, false);
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                // Past the string literal, escapes included.
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
            }
            b'-' | b'0'..=b'9' => {
                let start = i;
                while i < bytes.len()
                    && matches!(bytes[i], b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9')
                {
                    i += 1;
                }
                let number = &text[start..i];
                if number.parse::<f64>().is_ok_and(f64::is_infinite) {
                    out.push_str(&text[copied..start]);
                    out.push_str(if number.starts_with('-') {
                        "-1e300"
                    } else {
                        "1e300"
                    });
                    copied = i;
                    replaced = true;
                }
            }
            _ => i += 1,
        }
    }
    if !replaced {
        return None;
    }
    out.push_str(&text[copied.min(text.len())..]);
    Some(out.into_bytes())
}

/// The members of the JSON object `text`, in order, repeats included,
/// each value as written; `None` when `text` is not one JSON object.
fn members(text: &str) -> Option<Vec<(String, &RawValue)>> {
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let members = deserializer.deserialize_map(MembersVisitor).ok()?;
    deserializer.end().ok()?;
    Some(members)
}

/// The value of `key`, as Python's `json.loads` keeps it: the last one.
fn member<'a>(members: &[(String, &'a RawValue)], key: &str) -> Option<&'a RawValue> {
    members
        .iter()
        .rev()
        .find(|(name, _)| name == key)
        .map(|(_, value)| *value)
}

/// The string `key` holds, if it holds a string.
fn string(members: &[(String, &RawValue)], key: &str) -> Option<String> {
    serde_json::from_str(member(members, key)?.get()).ok()
}

/// A record that is not an envelope but carries a `dead_letter` block: the
/// poison record of the contract, `{"raw": ..., "dead_letter": ...}` or a
/// body with the block spliced in, its numbers as written.
fn poison_record(body: &[u8]) -> Option<Reading> {
    let record = members(std::str::from_utf8(body).ok()?)?;
    let block = members(member(&record, "dead_letter")?.get())?;
    let keys = {
        let mut keys: Vec<&str> = record.iter().map(|(name, _)| name.as_str()).collect();
        keys.sort_unstable();
        keys.dedup();
        keys.len()
    };
    let payload = match (string(&record, "raw"), string(&record, "raw_encoding")) {
        (Some(raw), Some(encoding)) if encoding == "base64" => base64_decode(&raw),
        (Some(raw), None) if keys == 2 => Some(raw.into_bytes()),
        _ => spliced_payload(body),
    };
    Some(Reading {
        kind: RecordKind::Poison,
        envelope: None,
        id: None,
        urn: None,
        trace_id: None,
        reason: string(&block, "reason")
            .unwrap_or_else(|| DeadLetterReason::Poison.as_str().to_owned()),
        failed_at: member(&block, "failed_at").and_then(|at| at.get().parse().ok()),
        original_queue: string(&block, "original_queue").filter(|q| !q.is_empty()),
        error: string(&block, "error"),
        payload,
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
    members(block)?;
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

    fn message(
        body: &[u8],
        headers: &[(&str, &str)],
        death: Option<Death>,
    ) -> DeadLetterMessage<()> {
        let headers = headers
            .iter()
            .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
            .collect();
        DeadLetterMessage::new(body.to_vec(), headers, ()).with_death(death)
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

    /// A 400-digit integer: no `f64` holds it.
    fn huge_integer() -> String {
        format!("1{}", "7".repeat(399))
    }

    #[test]
    fn a_poison_record_holding_numbers_beyond_a_float_reads_as_poison_with_its_body() {
        let body = format!(
            "{{\"order\": \"p-1\", \"amount\": 1e400, \"n\": {}, \"n\": -1E+400, \"x\": [2.5e-400]}}",
            huge_integer()
        );
        // The family's splice: the body's closing brace replaced by the block.
        let record = format!(
            "{},\"dead_letter\":{{\"reason\":\"poison\",\"error\":\"no identity\",\"exception\":null,\"failed_at\":1796093299000,\"original_queue\":\"orders\",\"attempts\":0,\"lang\":\"python\"}}}}",
            &body[..body.len() - 1]
        );
        let reading = read(&message(record.as_bytes(), &[], None));
        assert_eq!(reading.kind, RecordKind::Poison);
        assert_eq!(reading.reason, "poison");
        assert_eq!(reading.original_queue.as_deref(), Some("orders"));
        assert_eq!(reading.error.as_deref(), Some("no identity"));
        assert_eq!(reading.failed_at, Some(1_796_093_299_000));
        assert_eq!(reading.payload.as_deref(), Some(body.as_bytes()));

        // Wrapped as text: the body kept as written, numbers and all.
        let wrapped = format!(
            "{{\"raw\":{},\"dead_letter\":{{\"reason\":\"poison\",\"original_queue\":\"orders\",\"failed_at\":7}}}}",
            serde_json::to_string("[1e400").unwrap()
        );
        let reading = read(&message(wrapped.as_bytes(), &[], None));
        assert_eq!(reading.kind, RecordKind::Poison);
        assert_eq!(reading.payload.as_deref(), Some(&b"[1e400"[..]));
    }

    #[test]
    fn an_envelope_holding_numbers_beyond_a_float_reads_as_an_envelope() {
        let record = format!(
            r#"{{"job":"urn:babel:a:b","trace_id":"t","data":{{"n":{},"f":1e400}},"meta":{{"id":"big-1","queue":"meta-queue","schema_version":1}},"attempts":3,"dead_letter":{{"reason":"failed","original_queue":"orders","failed_at":5,"error":"boom"}}}}"#,
            huge_integer()
        );
        let reading = read(&message(record.as_bytes(), &[], None));
        assert_eq!(reading.kind, RecordKind::Envelope);
        assert_eq!(reading.reason, "failed");
        assert_eq!(reading.original_queue.as_deref(), Some("orders"));
        assert_eq!(reading.failed_at, Some(5));
        assert_eq!(reading.error.as_deref(), Some("boom"));
        // The same envelope, poison for its consumer, is poison with its body.
        let poison = record.replace(r#""reason":"failed""#, r#""reason":"poison""#);
        let reading = read(&message(poison.as_bytes(), &[], None));
        assert_eq!(reading.kind, RecordKind::Poison);
        let body = &poison[..poison.find(r#","dead_letter""#).unwrap()];
        assert_eq!(reading.payload.unwrap(), format!("{body}}}").into_bytes());
    }

    #[test]
    fn an_undecodable_body_says_why() {
        let reading = read(&message(b"not json", &[], None));
        assert_eq!(reading.kind, RecordKind::Undecodable);
        let why = reading.error.expect("a reason");
        assert!(why.contains("not valid JSON"), "{why}");
        // Its numbers are JSON; what it lacks is said.
        let reading = read(&message(br#"{"amount":1e400}"#, &[], None));
        assert_eq!(reading.kind, RecordKind::Undecodable);
        let why = reading.error.expect("a reason");
        assert!(why.contains("envelope has no"), "{why}");
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
