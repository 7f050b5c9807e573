//! What the broker bindings share: the queue-name rules, where a settlement
//! appends a body, and URLs kept out of error messages without their
//! password.

use crate::broker::Settlement;
use crate::broker::TransportError;
use crate::store::{check_url_credentials, redact_url_secrets};

impl Settlement {
    /// Where the settlement appends a body, and which: `None` for an ack,
    /// `origin` (the queue the delivery came from) for a requeue, the
    /// dead-letter queue for a dead-letter record.
    pub(super) fn destination<'a>(&'a self, origin: &'a str) -> Option<(&'a str, &'a [u8])> {
        match self {
            Settlement::Ack => None,
            Settlement::Requeue(body) => Some((origin, body)),
            Settlement::DeadLetter { queue, body } => Some((queue, body)),
        }
    }
}

impl TransportError {
    /// [`TransportError::InvalidUrl`] for `url`, without its password: not
    /// in the URL shown, nor in the reason (a parser's message may quote
    /// the part of the URL it stumbled on).
    pub(super) fn invalid_url(url: &str, reason: impl Into<String>) -> Self {
        TransportError::InvalidUrl {
            url: redact(url),
            reason: redact_url_secrets(&reason.into(), url),
        }
    }
}

/// `Err` for a URL whose user info sits where no parser looks for it: a
/// client would take its password for a host or a path, and quote it back.
pub(super) fn check_credentials(url: &str) -> Result<(), TransportError> {
    check_url_credentials(url).map_err(|reason| TransportError::invalid_url(url, reason))
}

/// The queue names a binding's layout can hold: never empty, at most
/// `max_len` bytes, no character `refused` matches, and whatever the
/// binding's `own_rule` adds. Each refusal says which rule the name broke.
pub(super) struct QueueNames {
    /// The longest name, in bytes.
    pub(super) max_len: usize,
    /// The reason given for a longer name.
    pub(super) too_long: &'static str,
    /// The characters a name cannot hold.
    pub(super) refused: fn(char) -> bool,
    /// The reason given for a name holding one.
    pub(super) refused_reason: &'static str,
    /// The binding's own rule: why `queue` breaks it, if it does.
    pub(super) own_rule: fn(&str) -> Option<&'static str>,
}

impl QueueNames {
    /// `Ok` when `queue` follows every rule, else the first it breaks.
    pub(super) fn check(&self, queue: &str) -> Result<(), TransportError> {
        let broken = if queue.is_empty() {
            Some("a queue name cannot be empty")
        } else if queue.len() > self.max_len {
            Some(self.too_long)
        } else if queue.chars().any(self.refused) {
            Some(self.refused_reason)
        } else {
            (self.own_rule)(queue)
        };
        match broken {
            None => Ok(()),
            Some(reason) => Err(TransportError::InvalidQueue {
                queue: queue.to_owned(),
                reason,
            }),
        }
    }
}

/// `url` with every secret it may carry replaced, for error messages.
fn redact(url: &str) -> String {
    redact_url_secrets(url, url)
}

#[cfg(test)]
mod tests {
    use super::{QueueNames, redact};
    use crate::broker::Settlement;
    use crate::broker::TransportError;

    #[test]
    fn a_refused_queue_name_says_which_rule_it_broke() {
        let names = QueueNames {
            max_len: 3,
            too_long: "too long",
            refused: char::is_whitespace,
            refused_reason: "whitespace",
            own_rule: |queue| queue.starts_with('x').then_some("the binding's own"),
        };
        for (queue, reason) in [
            ("", "a queue name cannot be empty"),
            ("abcd", "too long"),
            ("a b", "whitespace"),
            ("xy", "the binding's own"),
        ] {
            match names.check(queue) {
                Err(TransportError::InvalidQueue {
                    queue: name,
                    reason: got,
                }) => {
                    assert_eq!((name.as_str(), got), (queue, reason));
                }
                other => panic!("{queue:?} refused: {other:?}"),
            }
        }
        names.check("abc").unwrap();
    }

    #[test]
    fn a_settlement_appends_its_body_to_the_queue_it_names() {
        let body = b"{}".to_vec();
        assert_eq!(Settlement::Ack.destination("orders"), None);
        assert_eq!(
            Settlement::Requeue(body.clone()).destination("orders"),
            Some(("orders", &body[..]))
        );
        let dead_letter = Settlement::DeadLetter {
            queue: "orders.dlq".to_owned(),
            body: body.clone(),
        };
        assert_eq!(
            dead_letter.destination("orders"),
            Some(("orders.dlq", &body[..]))
        );
    }

    #[test]
    fn passwords_never_reach_error_messages() {
        assert_eq!(
            redact("redis://user:secret@h:6379/0"),
            "redis://user:***@h:6379/0"
        );
        assert_eq!(
            redact("amqp://guest:guest@h:5672/%2f"),
            "amqp://guest:***@h:5672/%2f"
        );
        assert_eq!(redact("redis://h:6379/0"), "redis://h:6379/0");
        for malformed in [
            "redis:/:s3cr3t@h",
            "amqp:/user:s3cr3t@h",
            "amqp//user:s3cr3t@h",
            "redis://user:s3c/r3t@h",
        ] {
            let error = TransportError::invalid_url(malformed, format!("{malformed} is malformed"));
            for shown in [error.to_string(), format!("{error:?}")] {
                assert!(
                    !shown.contains("s3cr3t") && !shown.contains("s3c/r3t"),
                    "{shown}"
                );
            }
        }
    }
}
