//! From a [`Disposition`] to the [`Settlement`] a transport carries out, and
//! the counters that say what happened.

use std::sync::PoisonError;
use std::sync::atomic::Ordering;

use crate::broker::Settlement;
use crate::broker::TransportError;
use crate::envelope::DeadLetter;
use crate::envelope::DeadLetterReason;
use crate::router::DispatchError;
use crate::router::Disposition;

use super::Counters;
use super::poison::poison_record;

/// The settlement for `disposition`; `body` is the delivery's body, `queue`
/// the queue it came from.
pub(super) fn settlement_for(
    disposition: Disposition,
    body: &[u8],
    queue: &str,
    dead_letter_queue: &str,
) -> (Outcome, Settlement) {
    match disposition {
        Disposition::Ack => (Outcome::Acked, Settlement::Ack),
        Disposition::Delete { .. } => (Outcome::Deleted, Settlement::Ack),
        Disposition::Retry(retry) => (Outcome::Retried, Settlement::Requeue(retry.body())),
        // Released unchanged: no attempt is counted.
        Disposition::Release { .. } => (Outcome::Released, Settlement::Requeue(body.to_vec())),
        Disposition::DeadLetter(dead) => {
            let record = match (&dead.envelope, &dead.error) {
                (None, DispatchError::Poison(error)) => {
                    poison_record(body, &poison_block(queue, &error.to_string()))
                }
                _ => dead.body,
            };
            (
                Outcome::DeadLettered,
                Settlement::DeadLetter {
                    queue: dead_letter_queue.to_owned(),
                    body: record,
                },
            )
        }
    }
}

/// The settlement of a body over the size limit: poison, never decoded.
pub(super) fn oversized(
    body: &[u8],
    limit: usize,
    queue: &str,
    dead_letter_queue: &str,
) -> Settlement {
    let cause = format!(
        "the body is {} bytes, over the limit of {limit}",
        body.len()
    );
    tracing::warn!(
        queue,
        len = body.len(),
        limit,
        "babel-idem: dead-lettering a body over the size limit"
    );
    Settlement::DeadLetter {
        queue: dead_letter_queue.to_owned(),
        body: poison_record(body, &poison_block(queue, &cause)),
    }
}

/// The settlement of a body the broker reserved undecoded: poison, never
/// decoded here either.
pub(super) fn undecoded(body: &[u8], queue: &str, dead_letter_queue: &str) -> Settlement {
    tracing::warn!(
        queue,
        len = body.len(),
        "babel-idem: dead-lettering a delivery the broker could not decode"
    );
    Settlement::DeadLetter {
        queue: dead_letter_queue.to_owned(),
        body: poison_record(
            body,
            &poison_block(
                queue,
                "the broker reserved it undecoded (no JSON object with a numeric attempts)",
            ),
        ),
    }
}

/// The `dead_letter` block of a poison record, shaped as the Python SDK's
/// Redis worker writes it (`attempts` 0: a poison body is never retried).
fn poison_block(queue: &str, cause: &str) -> DeadLetter {
    DeadLetter::new(DeadLetterReason::Poison, queue, 0)
        .with_error(format!("Undecodable BabelQueue body: {cause}"))
        .with_exception("EnvelopeError")
}

/// What became of one delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Outcome {
    Acked,
    Deleted,
    Retried,
    Released,
    DeadLettered,
}

impl Counters {
    pub(super) fn count(&self, outcome: Outcome) {
        let counter = match outcome {
            Outcome::Acked => &self.acked,
            Outcome::Deleted => &self.deleted,
            Outcome::Retried => &self.retried,
            Outcome::Released => &self.released,
            Outcome::DeadLettered => &self.dead_lettered,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// A reservation succeeded (`empty`: with nothing in it).
    pub(super) fn reserved(&self, empty: bool) {
        if empty {
            self.empty_reserves.fetch_add(1, Ordering::Relaxed);
        }
        if self.reserve_failing.swap(false, Ordering::Relaxed) {
            *self
                .reserve_error
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = None;
        }
    }

    /// A reservation failed with `error`.
    pub(super) fn reserve_failed(&self, error: &TransportError) {
        self.broker_errors.fetch_add(1, Ordering::Relaxed);
        *self
            .reserve_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(error.to_string());
        self.reserve_failing.store(true, Ordering::Relaxed);
    }
}
