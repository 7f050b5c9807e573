//! [`Disposition`]: what a broker loop does with a delivery once dispatch
//! is done with it.

use std::fmt;
use std::time::Duration;

use crate::envelope::DeadLetterReason;
use crate::envelope::{Envelope, EnvelopeError};

use super::HandlerError;

/// The outcome of [`Router::dispatch`](crate::router::Router::dispatch), and the
/// broker loop's instructions. Every variant ends with the original delivery
/// acknowledged; they differ in what is published first.
///
/// | variant | the loop must |
/// |---|---|
/// | [`Ack`](Disposition::Ack) | ack the delivery |
/// | [`Retry`](Disposition::Retry) | wait [`Retry::backoff`] (or schedule a delayed publish), publish [`Retry::body`] to the queue the message came from, then ack the delivery |
/// | [`DeadLetter`](Disposition::DeadLetter) | publish [`DeadLettered::body`] to the dead-letter queue (by convention the queue name plus `.dlq`), then ack the delivery |
/// | [`Release`](Disposition::Release) | put the delivery back unchanged (requeue / nack, or republish the original bytes and ack), after its `delay` if any, with no attempt counted |
/// | [`Delete`](Disposition::Delete) | ack the delivery: it is dropped on purpose |
///
/// Publishing before acking keeps the at-least-once promise: a crash in
/// between delivers the message twice (which the idempotent handler absorbs),
/// never zero times.
///
/// ```
/// use babel_idem::Disposition;
///
/// fn act(disposition: Disposition) {
///     match disposition {
///         Disposition::Ack | Disposition::Delete { .. } => { /* ack */ }
///         Disposition::Retry(retry) => {
///             let _republish = retry.body();
///             let _after = retry.backoff;
///         }
///         Disposition::DeadLetter(dead) => {
///             let _to_dlq = &dead.body;
///         }
///         Disposition::Release { .. } => { /* requeue unchanged */ }
///     }
/// }
/// act(Disposition::Ack);
/// ```
#[derive(Debug)]
#[must_use = "a broker loop must act on the disposition: ack, republish or dead-letter the delivery"]
pub enum Disposition {
    /// The handler succeeded (or skipped a duplicate): ack the delivery.
    Ack,
    /// The delivery failed and has attempts left: publish it again.
    Retry(Retry),
    /// The delivery goes to the dead-letter queue.
    DeadLetter(DeadLettered),
    /// Put the delivery back unchanged, with no attempt counted, because
    /// of [`reason`](ReleaseReason):
    ///
    /// - [`UnknownUrn`](ReleaseReason::UnknownUrn): no handler for the URN,
    ///   and the router releases such messages, so another consumer (say, a
    ///   newer version during a rolling deploy) can take it. A release with
    ///   no consumer that knows the URN repeats forever.
    /// - [`Parked`](ReleaseReason::Parked): in claim mode another owner is
    ///   running this message; hand it back after `delay`, by when that run
    ///   has committed (the redelivery is then skipped) or released.
    /// - [`StoreUnavailable`](ReleaseReason::StoreUnavailable): the
    ///   handler's guard could not reach its store, so it did not run; hand
    ///   it back and pause until the store answers.
    Release {
        /// The envelope's URN.
        urn: String,
        /// Why the delivery goes back.
        reason: ReleaseReason,
        /// How long to wait before the delivery is handled again; `None`:
        /// at once.
        delay: Option<Duration>,
    },
    /// No handler for the URN, and the router deletes such messages: ack and
    /// drop it.
    Delete {
        /// The URN no handler is registered for.
        urn: String,
    },
}

impl Disposition {
    /// A short name for logs and metrics: `ack`, `retry`, `dead_letter`,
    /// `release` or `delete`.
    ///
    /// ```
    /// assert_eq!(babel_idem::Disposition::Ack.kind(), "ack");
    /// ```
    pub fn kind(&self) -> &'static str {
        match self {
            Disposition::Ack => "ack",
            Disposition::Retry(_) => "retry",
            Disposition::DeadLetter(_) => "dead_letter",
            Disposition::Release { .. } => "release",
            Disposition::Delete { .. } => "delete",
        }
    }

    /// Whether the handler succeeded.
    pub fn is_ack(&self) -> bool {
        matches!(self, Disposition::Ack)
    }
}

impl fmt::Display for Disposition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Disposition::Ack => f.write_str("ack"),
            Disposition::Retry(retry) => {
                write!(f, "retry (attempts {}", retry.attempts)?;
                if let Some(backoff) = retry.backoff {
                    write!(f, ", after {backoff:?}")?;
                }
                write!(f, "): {}", retry.error)
            }
            Disposition::DeadLetter(dead) => {
                write!(f, "dead_letter ({}): {}", dead.reason, dead.error)
            }
            Disposition::Release {
                urn,
                reason: ReleaseReason::UnknownUrn,
                ..
            } => write!(f, "release: no handler for {urn}"),
            Disposition::Release {
                urn,
                reason: ReleaseReason::Parked,
                delay,
            } => {
                write!(f, "release: {urn} is being run by another owner")?;
                match delay {
                    Some(delay) => write!(f, "; again after {delay:?}"),
                    None => Ok(()),
                }
            }
            Disposition::Release {
                urn,
                reason: ReleaseReason::StoreUnavailable,
                ..
            } => write!(f, "release: the store could not say whether {urn} ran"),
            Disposition::Delete { urn } => write!(f, "delete: no handler for {urn}"),
        }
    }
}

/// Why a [`Disposition::Release`] puts a delivery back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ReleaseReason {
    /// No handler is registered for the URN
    /// ([`UnknownUrnStrategy::Release`](crate::router::UnknownUrnStrategy::Release)).
    UnknownUrn,
    /// Claim mode: the handler failed after its last claim-mode guard found
    /// the message's id held by another owner (the guard returned a
    /// [`StoreError::is_parked`](crate::store::StoreError::is_parked) error
    /// and recorded the park for the delivery, so what the handler's error
    /// type keeps of that error does not matter).
    Parked,
    /// The handler's guard could not ask its store whether the message
    /// already ran (the store is down or failing), so the handler did not
    /// run: an outage, not a failed attempt. The consumer stops reserving
    /// until the store answers again, or, while only a part of the store
    /// fails, holds the delivery back and goes on with the others.
    StoreUnavailable,
}

/// A delivery to publish again, one attempt later.
#[derive(Debug)]
pub struct Retry {
    /// The envelope to publish, its `attempts` already set to [`Retry::attempts`].
    pub envelope: Envelope,
    /// Why this delivery failed.
    pub error: DispatchError,
    /// The attempts made so far, this one included (the previous count + 1).
    pub attempts: u64,
    /// How long to wait before the message is handled again, when the
    /// router has a [`Backoff`](crate::router::Backoff).
    pub backoff: Option<Duration>,
}

impl Retry {
    /// The bytes to publish: the envelope with its new `attempts`.
    pub fn body(&self) -> Vec<u8> {
        self.envelope.to_vec()
    }
}

/// A delivery bound for the dead-letter queue.
#[derive(Debug)]
pub struct DeadLettered {
    /// The contract's reason: `failed`, `unknown_urn` or `poison`.
    pub reason: DeadLetterReason,
    /// What went wrong, in full.
    pub error: DispatchError,
    /// The original envelope plus its `dead_letter` block; `None` for poison,
    /// which has no envelope.
    pub envelope: Option<Envelope>,
    /// The bytes to publish on the dead-letter queue: the encoded
    /// [`envelope`](Self::envelope), which any BabelQueue SDK can read and
    /// redrive, or for poison the original bytes unchanged.
    pub body: Vec<u8>,
}

/// Why a delivery was not acked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DispatchError {
    /// The bytes are not a valid envelope (reason `poison`).
    #[error("poison message: {0}")]
    Poison(#[source] EnvelopeError),
    /// No handler is registered for the envelope's URN.
    #[error("no handler is registered for {urn}")]
    UnknownUrn {
        /// The URN the envelope carries.
        urn: String,
    },
    /// The handler returned an error.
    #[error("handler failed: {0}")]
    Handler(#[source] HandlerError),
    /// The handler panicked; the panic was caught.
    #[error("handler panicked: {message}")]
    Panicked {
        /// The panic message, when it was a string.
        message: String,
    },
    /// The handler ran longer than the consumer's per-delivery timeout and
    /// was dropped (its guard left the id unmarked).
    #[error("handler ran longer than the timeout of {after:?}")]
    TimedOut {
        /// The timeout it ran into.
        after: std::time::Duration,
    },
}

impl DispatchError {
    /// What goes in the dead-letter block's `exception` field: the short
    /// name of the handler's error type ([`HandlerError::name`](crate::router::HandlerError::name):
    /// no module path, no generics, as the Python SDK writes its exception's
    /// class name), `panic` or `timeout`.
    pub fn exception(&self) -> Option<&str> {
        match self {
            DispatchError::Handler(error) => Some(error.name()),
            DispatchError::Panicked { .. } => Some("panic"),
            DispatchError::TimedOut { .. } => Some("timeout"),
            DispatchError::Poison(_) | DispatchError::UnknownUrn { .. } => None,
        }
    }
}
