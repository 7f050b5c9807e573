//! The dead-letter contract: what a broker binding does to the messages of
//! a dead-letter queue, in its own commands, for the decisions made over
//! it (which to move, where, with which body: `redrive`).
//!
//! A binding implements [`DeadLetters`] (open a run over a queue) and
//! [`DeadLetterRun`] (depth, look, republish, put back, close). A tool that
//! picks the broker at run time holds a `Box<dyn ErasedDeadLetters>`,
//! which is itself [`DeadLetters`]: every binding is an
//! [`ErasedDeadLetters`], its handles boxed as [`ErasedHandle`].

use std::any::Any;

use super::{Outgoing, TransportError, TransportFuture};
use crate::builders::setters;

/// The broker's own account of a message it dead-lettered itself (on
/// RabbitMQ, the latest `x-death` entry): why, from which queue, and when.
///
/// ```
/// use babel_idem::broker::Death;
///
/// let death = Death::new("rejected", "orders").at(1_796_000_000_000);
/// assert_eq!((death.reason.as_str(), death.time_ms), ("rejected", Some(1_796_000_000_000)));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Death {
    /// Why (`rejected`, `expired`, `maxlen`, `delivery_limit`), or empty.
    pub reason: String,
    /// The queue it was dead-lettered from, or empty.
    pub queue: String,
    /// When, in Unix milliseconds, when the broker says.
    pub time_ms: Option<u64>,
}

impl Death {
    /// A death for `reason` from `queue`, at no stated time.
    pub fn new(reason: impl Into<String>, queue: impl Into<String>) -> Self {
        Death {
            reason: reason.into(),
            queue: queue.into(),
            time_ms: None,
        }
    }

    setters! {
        /// The same death at `millis` (Unix milliseconds).
        pub fn at(millis: u64) => self.time_ms = Some(millis);
    }
}

/// A message a [`DeadLetterRun`] looked at, still in the dead-letter queue:
/// its body and headers as stored, the broker's [`Death`] when it
/// dead-lettered the message itself, and the run's `handle` on it (a
/// stored value, a delivery tag) to republish or put it back.
///
/// ```
/// use babel_idem::broker::DeadLetterMessage;
///
/// let message = DeadLetterMessage::new(b"{}".to_vec(), Vec::new(), 7_u64);
/// assert!(message.death.is_none());
/// assert_eq!(message.handle, 7);
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub struct DeadLetterMessage<H> {
    /// The body, unframed when the broker carries headers beside it.
    pub body: Vec<u8>,
    /// The transport headers beside it, in the order stored.
    pub headers: Vec<(String, String)>,
    /// The broker's account, when it dead-lettered the message itself.
    pub death: Option<Death>,
    /// What the run needs to take or put back this message.
    pub handle: H,
}

impl<H> DeadLetterMessage<H> {
    /// A message with `body` and `headers`, held by `handle`, with no death.
    pub fn new(body: Vec<u8>, headers: Vec<(String, String)>, handle: H) -> Self {
        DeadLetterMessage {
            body,
            headers,
            death: None,
            handle,
        }
    }

    setters! {
        /// The same message with the broker's account of its death.
        pub fn with_death(death: Option<Death>) => self.death;
    }

    fn map_handle<G>(self, map: impl FnOnce(H) -> G) -> DeadLetterMessage<G> {
        DeadLetterMessage {
            body: self.body,
            headers: self.headers,
            death: self.death,
            handle: map(self.handle),
        }
    }
}

/// One run over a dead-letter queue, in the broker's own commands. A
/// message looked at stays in the queue until it is republished: whatever
/// the run does, a message is never lost.
///
/// ```
/// use babel_idem::broker::DeadLetterRun;
///
/// // Counts what a queue holds, whatever the broker.
/// async fn depth<H: Send + 'static>(run: &mut dyn DeadLetterRun<Handle = H>) -> usize {
///     let depth = run.depth().await.unwrap_or(0);
///     let _ = run.close().await;
///     depth
/// }
/// # let _ = depth::<u64>;
/// ```
pub trait DeadLetterRun: Send {
    /// The run's hold on a looked-at message.
    type Handle: Send + 'static;

    /// How many messages the queue holds now.
    fn depth(&mut self) -> TransportFuture<'_, usize>;

    /// The next `max` messages after those looked at so far, in queue
    /// order, without taking them.
    fn look(&mut self, max: usize) -> TransportFuture<'_, Vec<DeadLetterMessage<Self::Handle>>>;

    /// Takes `message` off the queue once `copy` (the body to republish,
    /// with its headers) is on `copy.queue`: `Ok(false)` when the message
    /// was no longer there.
    fn republish<'a>(
        &'a mut self,
        message: DeadLetterMessage<Self::Handle>,
        copy: Outgoing<'a>,
    ) -> TransportFuture<'a, bool>;

    /// Leaves `message` in the queue as it was.
    fn put_back(&mut self, message: DeadLetterMessage<Self::Handle>);

    /// Ends the run: every message put back is in the queue again.
    fn close(&mut self) -> TransportFuture<'_, ()>;

    /// Checks that `queue` can be held by the broker's layout.
    fn check_queue(&self, queue: &str) -> Result<(), TransportError>;
}

/// A broker's dead-letter queues: opens a [`DeadLetterRun`] over one.
/// `redrive`'s operations (look, redrive) are written once over it.
///
/// ```
/// use babel_idem::broker::DeadLetters;
///
/// // A tool takes any broker's dead letters.
/// fn takes<D: DeadLetters + ?Sized>(_: &D) {}
/// # let _ = takes::<Box<dyn babel_idem::broker::ErasedDeadLetters>>;
/// ```
pub trait DeadLetters: Send + Sync {
    /// A run's hold on a looked-at message (a stored value, a delivery tag).
    type Handle: Send + 'static;

    /// Opens a run over the dead-letter queue `dlq`: `Ok(None)` when the
    /// queue does not exist (a broker that holds an empty queue as no
    /// queue at all, as Redis, opens it anyway). A name the layout cannot
    /// hold is [`TransportError::InvalidQueue`].
    fn open_dead_letters<'a>(
        &'a self,
        dlq: &'a str,
    ) -> TransportFuture<'a, Option<BoxedRun<Self::Handle>>>;
}

impl<D: DeadLetters + ?Sized> DeadLetters for Box<D> {
    type Handle = D::Handle;

    fn open_dead_letters<'a>(
        &'a self,
        dlq: &'a str,
    ) -> TransportFuture<'a, Option<BoxedRun<Self::Handle>>> {
        (**self).open_dead_letters(dlq)
    }
}

/// A run over a dead-letter queue whose handles are `H`, whatever its broker.
pub type BoxedRun<H> = Box<dyn DeadLetterRun<Handle = H>>;

/// A run's hold on a message, its type erased: what an [`ErasedRun`] hands
/// out and takes back.
pub type ErasedHandle = Box<dyn Any + Send>;

/// A run of any broker, its handles erased.
pub type ErasedRun = BoxedRun<ErasedHandle>;

/// [`DeadLetters`] in object-safe form: every [`DeadLetters`] is one, and
/// `dyn ErasedDeadLetters` is [`DeadLetters`] again, with [`ErasedRun`]s.
/// What a tool holds when the broker is chosen at run time.
///
/// ```
/// use babel_idem::broker::{DeadLetters, ErasedDeadLetters};
///
/// fn takes(_: &impl DeadLetters) {}
/// fn holds(broker: Box<dyn ErasedDeadLetters>) {
///     takes(&broker);
/// }
/// # let _ = holds;
/// ```
pub trait ErasedDeadLetters: Send + Sync {
    /// [`DeadLetters::open_dead_letters`], the run boxed.
    fn open_erased<'a>(&'a self, dlq: &'a str) -> TransportFuture<'a, Option<ErasedRun>>;
}

impl<D: DeadLetters> ErasedDeadLetters for D {
    fn open_erased<'a>(&'a self, dlq: &'a str) -> TransportFuture<'a, Option<ErasedRun>> {
        Box::pin(async move {
            let run = self.open_dead_letters(dlq).await?;
            Ok(run.map(|run| Box::new(Erased(run)) as ErasedRun))
        })
    }
}

impl DeadLetters for dyn ErasedDeadLetters {
    type Handle = ErasedHandle;

    fn open_dead_letters<'a>(&'a self, dlq: &'a str) -> TransportFuture<'a, Option<ErasedRun>> {
        self.open_erased(dlq)
    }
}

/// A run whose handles go out boxed and come back unboxed: a handle
/// another run made is refused, never taken for one of its own.
struct Erased<H>(BoxedRun<H>);

impl<H: Send + 'static> Erased<H> {
    fn own(message: DeadLetterMessage<ErasedHandle>) -> Option<DeadLetterMessage<H>> {
        let DeadLetterMessage {
            body,
            headers,
            death,
            handle,
        } = message;
        let handle = handle.downcast::<H>().ok()?;
        Some(DeadLetterMessage {
            body,
            headers,
            death,
            handle: *handle,
        })
    }
}

impl<H: Send + 'static> DeadLetterRun for Erased<H> {
    type Handle = ErasedHandle;

    fn depth(&mut self) -> TransportFuture<'_, usize> {
        self.0.depth()
    }

    fn look(&mut self, max: usize) -> TransportFuture<'_, Vec<DeadLetterMessage<Self::Handle>>> {
        Box::pin(async move {
            let page = self.0.look(max).await?;
            Ok(page
                .into_iter()
                .map(|message| message.map_handle(|handle| Box::new(handle) as ErasedHandle))
                .collect())
        })
    }

    fn republish<'a>(
        &'a mut self,
        message: DeadLetterMessage<Self::Handle>,
        copy: Outgoing<'a>,
    ) -> TransportFuture<'a, bool> {
        match Self::own(message) {
            Some(message) => self.0.republish(message, copy),
            None => Box::pin(async {
                Err(TransportError::Unsupported {
                    operation: "republishing another transport's message",
                })
            }),
        }
    }

    fn put_back(&mut self, message: DeadLetterMessage<Self::Handle>) {
        if let Some(message) = Self::own(message) {
            self.0.put_back(message);
        }
    }

    fn close(&mut self) -> TransportFuture<'_, ()> {
        self.0.close()
    }

    fn check_queue(&self, queue: &str) -> Result<(), TransportError> {
        self.0.check_queue(queue)
    }
}
