//! Dead-letter redrive: moving dead-lettered messages back to work, by the
//! BabelQueue family's contract (feature `redrive`), on any broker's
//! [`DeadLetters`]: [`Redrive`] is written once over it, and a broker
//! binding only translates a run's operations into its own commands.
//!
//! A redriven message is the dead-letter record reset for reprocessing: its
//! `dead_letter` block removed and `attempts` set to 0, with `job`,
//! `trace_id`, `data` and `meta` (so `meta.id`) kept, in exactly the bytes
//! the Python SDK's `redrive` writes. It goes to the queue the record names
//! (`dead_letter.original_queue`, or the queue the broker dead-lettered it
//! from) unless [`RedriveOptions::to`] names another, such as a sandbox.
//!
//! The rules, for every transport (the decisions are made here; a transport
//! only looks at, republishes and puts back messages of its dead-letter
//! queue in its own broker's commands):
//!
//! - A message leaves the dead-letter queue only once its republish
//!   succeeded: on Redis both happen in one script; on RabbitMQ the copy is
//!   confirmed by the broker before the original is acked. A run that stops
//!   (a crash, a lost broker) leaves each message in the dead-letter queue,
//!   on the target queue, or (RabbitMQ, between the confirm and the ack) in
//!   both with the same `meta.id`, never nowhere; running it again is safe.
//! - A message that is not moved (not selected, a dry run, poison, a body
//!   that does not decode) is left as it is, untouched.
//! - Poison records (`dead_letter.reason` `poison`, or a body that does not
//!   decode as an envelope) are never redriven as envelopes. With
//!   [`RedriveOptions::include_poison`] the payload the record kept is
//!   republished as the record holds it.
//! - A dry run changes nothing: the dead-letter queue stays as it was (the
//!   Python and Go SDKs' dry runs pop and re-append each message instead).
//! - [`RedriveOptions::max`] counts the messages moved (or, in a dry run,
//!   that would move), not the messages looked at.
//! - Each run looks at the messages the queue held when it started, once:
//!   a redriven message that fails again and is dead-lettered anew waits
//!   for the next run.
//!
//! ```no_run
//! # #[cfg(feature = "redis-transport")]
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use babel_idem::redrive::{Redrive, RedriveOptions, Selection};
//! use babel_idem::transport::RedisTransport;
//!
//! let transport = RedisTransport::connect("redis://127.0.0.1:6379/0").await?;
//! let options = RedriveOptions::new()
//!     .select(Selection::new().reason("failed").urn("urn:babel:orders:created"))
//!     .bypass(true);
//! let report = transport.redrive("orders.dlq", &options).await?;
//! println!("moved {}, skipped {}, left {}", report.moved, report.skipped, report.left);
//! # Ok(())
//! # }
//! ```

mod record;
mod rewrite;

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::broker::{
    BoxedRun, DeadLetterMessage, DeadLetterRun, DeadLetters, Outgoing, TransportError,
};
use crate::envelope::Envelope;
use crate::router::HEADER_REPLAY_BYPASS;

/// A predicate over the envelope of a dead-lettered message, as
/// [`Selection::filter`] keeps it.
///
/// ```
/// use babel_idem::redrive::Predicate;
/// use std::sync::Arc;
///
/// let orders: Predicate = Arc::new(|envelope| envelope.urn().starts_with("urn:babel:orders:"));
/// # let _ = orders;
/// ```
pub type Predicate = Arc<dyn Fn(&Envelope) -> bool + Send + Sync>;

/// Which dead-lettered messages a redrive moves: every condition given must
/// hold (an empty selection takes every message).
///
/// ```
/// use babel_idem::redrive::Selection;
///
/// let selection = Selection::new()
///     .urn("urn:babel:orders:created")
///     .reason("failed")
///     .since(1_796_000_000_000)
///     .id("5b9e2c47-8d1a-4f63-a0b7-c3d2e1f0a9b8");
/// assert!(!selection.is_empty());
/// ```
#[derive(Clone, Default)]
pub struct Selection {
    urns: Vec<String>,
    reasons: Vec<String>,
    since: Option<u64>,
    until: Option<u64>,
    ids: HashSet<String>,
    predicate: Option<Predicate>,
}

impl Selection {
    /// Every message.
    pub fn new() -> Self {
        Selection::default()
    }

    /// Messages whose URN (`job`) is `urn`; given more than once, any of them.
    pub fn urn(mut self, urn: impl Into<String>) -> Self {
        self.urns.push(urn.into());
        self
    }

    /// Messages dead-lettered for `reason`: `failed`, `unknown_urn`,
    /// `poison`, or the reason RabbitMQ wrote in `x-death` (`rejected`,
    /// `expired`, `maxlen`, `delivery_limit`); given more than once, any.
    pub fn reason(mut self, reason: impl Into<String>) -> Self {
        self.reasons.push(reason.into());
        self
    }

    /// Messages dead-lettered at or after `millis` (Unix milliseconds, UTC;
    /// `dead_letter.failed_at`, or the time in `x-death`). A message that
    /// says no time does not match.
    pub fn since(self, millis: u64) -> Self {
        Self {
            since: Some(millis),
            ..self
        }
    }

    /// Messages dead-lettered at or before `millis` (as [`since`](Self::since)).
    pub fn until(self, millis: u64) -> Self {
        Self {
            until: Some(millis),
            ..self
        }
    }

    /// The message whose `meta.id` is `id`; given more than once, any.
    pub fn id(mut self, id: impl Into<String>) -> Self {
        self.ids.insert(id.into());
        self
    }

    /// Messages whose envelope `predicate` accepts (a record that is not an
    /// envelope never matches, nor one holding a number an `Envelope`'s
    /// `serde_json::Value` cannot hold, such as `1e400`).
    ///
    /// ```
    /// use babel_idem::redrive::Selection;
    ///
    /// let big_orders = Selection::new().filter(|envelope| {
    ///     envelope.data.get("total").and_then(|t| t.as_u64()).is_some_and(|t| t > 1000)
    /// });
    /// # let _ = big_orders;
    /// ```
    pub fn filter(mut self, predicate: impl Fn(&Envelope) -> bool + Send + Sync + 'static) -> Self {
        self.predicate = Some(Arc::new(predicate));
        self
    }

    /// Whether the selection takes every message.
    pub fn is_empty(&self) -> bool {
        self.urns.is_empty()
            && self.reasons.is_empty()
            && self.since.is_none()
            && self.until.is_none()
            && self.ids.is_empty()
            && self.predicate.is_none()
    }

    fn matches(&self, reading: &record::Reading) -> bool {
        let envelope = reading.envelope.as_ref();
        let any = |wanted: &[String], got: Option<&str>| {
            wanted.is_empty() || got.is_some_and(|got| wanted.iter().any(|w| w == got))
        };
        any(&self.urns, reading.urn.as_deref())
            && any(&self.reasons, Some(reading.reason.as_str()))
            && self
                .since
                .is_none_or(|since| reading.failed_at.is_some_and(|at| at >= since))
            && self
                .until
                .is_none_or(|until| reading.failed_at.is_some_and(|at| at <= until))
            && (self.ids.is_empty()
                || reading
                    .id
                    .as_deref()
                    .is_some_and(|id| self.ids.contains(id)))
            && self
                .predicate
                .as_ref()
                .is_none_or(|predicate| envelope.is_some_and(|e| predicate(e)))
    }
}

impl fmt::Debug for Selection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Selection")
            .field("urns", &self.urns)
            .field("reasons", &self.reasons)
            .field("since", &self.since)
            .field("until", &self.until)
            .field("ids", &self.ids)
            .field("predicate", &self.predicate.is_some())
            .finish()
    }
}

/// How a redrive runs: the family's options (target queue, maximum, dry
/// run, selection, bypass, wait) and babel-idem's own (poison, rate).
///
/// ```
/// use babel_idem::redrive::{RedriveOptions, Selection};
/// use std::time::Duration;
///
/// let options = RedriveOptions::new()
///     .to("orders.sandbox")
///     .max(100)
///     .select(Selection::new().reason("unknown_urn"))
///     .rate(50)
///     .wait(Duration::from_secs(1))
///     .dry_run(true);
/// # let _ = options;
/// ```
#[derive(Debug, Clone, Default)]
pub struct RedriveOptions {
    to: Option<String>,
    max: Option<usize>,
    dry_run: bool,
    selection: Selection,
    bypass: bool,
    include_poison: bool,
    rate: Option<u32>,
    wait: Duration,
}

impl RedriveOptions {
    /// Every message back to its own queue, no limit, no bypass.
    pub fn new() -> Self {
        RedriveOptions::default()
    }

    /// Republishes every message to `queue` instead of the queue it was
    /// dead-lettered from (a sandbox, to replay safely).
    pub fn to(self, queue: impl Into<String>) -> Self {
        Self {
            to: Some(queue.into()),
            ..self
        }
    }

    /// Moves at most `max` messages.
    pub fn max(self, max: usize) -> Self {
        Self {
            max: Some(max),
            ..self
        }
    }

    /// Moves nothing and changes nothing; the report says what would move where.
    pub fn dry_run(self, dry_run: bool) -> Self {
        Self { dry_run, ..self }
    }

    /// Moves only the messages `selection` takes; the others stay.
    pub fn select(self, selection: Selection) -> Self {
        Self { selection, ..self }
    }

    /// Stamps the `bq-replay-bypass` header on every redriven message, so
    /// its handler sees an intended replay
    /// ([`is_replay`](crate::consumer::is_replay)) and can skip external
    /// effects that already fired.
    pub fn bypass(self, bypass: bool) -> Self {
        Self { bypass, ..self }
    }

    /// Also republishes poison records: the payload each kept, as it holds
    /// it (never rewritten as an envelope), to its original queue or
    /// [`to`](Self::to). A body that does not decode at all, and names no
    /// queue, moves only with `to`.
    pub fn include_poison(self, include: bool) -> Self {
        Self {
            include_poison: include,
            ..self
        }
    }

    /// Moves at most `per_second` messages a second.
    pub fn rate(self, per_second: u32) -> Self {
        Self {
            rate: Some(per_second).filter(|r| *r > 0),
            ..self
        }
    }

    /// How long to watch an empty dead-letter queue for a first message
    /// before reporting nothing to redrive (default: not at all).
    pub fn wait(self, wait: Duration) -> Self {
        Self { wait, ..self }
    }
}

/// What a dead-letter queue message is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RecordKind {
    /// An envelope a redrive can reset: with a `dead_letter` block, or
    /// dead-lettered by the broker itself (RabbitMQ's `x-death`).
    Envelope,
    /// A poison record: `dead_letter.reason` is `poison`, or the record
    /// wraps a body that was never an envelope.
    Poison,
    /// A body that does not decode as an envelope or a record.
    Undecodable,
}

impl RecordKind {
    /// `envelope`, `poison` or `undecodable`.
    ///
    /// ```
    /// assert_eq!(babel_idem::redrive::RecordKind::Poison.as_str(), "poison");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            RecordKind::Envelope => "envelope",
            RecordKind::Poison => "poison",
            RecordKind::Undecodable => "undecodable",
        }
    }
}

/// One message of a dead-letter queue, as a look reads it.
///
/// ```
/// use babel_idem::redrive::{DlqRecord, RecordKind};
///
/// fn describe(record: &DlqRecord) -> String {
///     match record.kind {
///         RecordKind::Envelope => format!("{:?} {} ({})", record.id, record.urn.as_deref().unwrap_or(""), record.reason),
///         _ => format!("{} record at {}", record.kind.as_str(), record.position),
///     }
/// }
/// # let _ = describe;
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct DlqRecord {
    /// Its place in the queue, 0 at the head.
    pub position: usize,
    /// What it is.
    pub kind: RecordKind,
    /// `meta.id`, when it has one.
    pub id: Option<String>,
    /// The URN (`job`), when it decodes.
    pub urn: Option<String>,
    /// `trace_id`, when it decodes.
    pub trace_id: Option<String>,
    /// Why it was dead-lettered (`failed`, `unknown_urn`, `poison`, an
    /// `x-death` reason), or empty when it does not say.
    pub reason: String,
    /// When, in Unix milliseconds, when it says.
    pub failed_at: Option<u64>,
    /// The queue it was dead-lettered from, when it says.
    pub original_queue: Option<String>,
    /// The error it records, if any.
    pub error: Option<String>,
    /// The body as it sits in the queue.
    pub body: Vec<u8>,
    /// The transport headers beside it.
    pub headers: Vec<(String, String)>,
}

/// What happened to one message in a redrive.
///
/// ```
/// use babel_idem::redrive::{LeftReason, Outcome};
///
/// let outcome = Outcome::Left(LeftReason::Poison);
/// assert!(matches!(outcome, Outcome::Left(_)));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// Republished to `to` and removed from the dead-letter queue.
    Moved,
    /// A dry run: it would have moved to `to`.
    WouldMove,
    /// Not selected; left where it was.
    Skipped,
    /// Left in the dead-letter queue, untouched, for the reason given.
    Left(LeftReason),
}

/// Why a selected message was left in the dead-letter queue.
///
/// ```
/// use babel_idem::redrive::LeftReason;
///
/// assert!(LeftReason::NoTarget.to_string().contains("give a target queue"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LeftReason {
    /// A poison record, without [`RedriveOptions::include_poison`].
    #[error("poison record (use include_poison to republish its payload)")]
    Poison,
    /// A body that does not decode, without
    /// [`RedriveOptions::include_poison`] (or with it but no queue to go to).
    #[error("the body does not decode as an envelope")]
    Undecodable,
    /// It names no queue to go back to, and no target was given.
    #[error("it names no queue to go back to; give a target queue")]
    NoTarget,
    /// The queue it names cannot be held by the transport's layout.
    #[error("its queue cannot be used: {0}")]
    InvalidTarget(String),
    /// It cannot be rewritten (the text says why).
    #[error("it cannot be rewritten: {0}")]
    Unencodable(String),
    /// It left the dead-letter queue while the redrive ran (another tool
    /// took it); nothing was republished.
    #[error("it left the dead-letter queue while the redrive ran")]
    Gone,
}

/// One message of a redrive's report.
///
/// ```
/// use babel_idem::redrive::{Outcome, RedriveItem};
///
/// fn moved_ids(items: &[RedriveItem]) -> Vec<&str> {
///     items
///         .iter()
///         .filter(|item| item.outcome == Outcome::Moved)
///         .filter_map(|item| item.id.as_deref())
///         .collect()
/// }
/// assert!(moved_ids(&[]).is_empty());
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RedriveItem {
    /// `meta.id`, when it has one.
    pub id: Option<String>,
    /// `trace_id`, when it decodes.
    pub trace_id: Option<String>,
    /// The URN, when it decodes.
    pub urn: Option<String>,
    /// Why it was dead-lettered.
    pub reason: String,
    /// What it is.
    pub kind: RecordKind,
    /// The dead-letter queue it was read from.
    pub from: String,
    /// The queue it went (or, in a dry run, would go) to.
    pub to: Option<String>,
    /// What happened to it.
    pub outcome: Outcome,
    /// Whether it carried the `bq-replay-bypass` header when republished.
    pub bypassed: bool,
}

/// What a redrive moved, skipped and left.
///
/// ```
/// use babel_idem::redrive::RedriveReport;
///
/// let report = RedriveReport::default();
/// assert_eq!((report.moved, report.skipped, report.left), (0, 0, 0));
/// ```
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct RedriveReport {
    /// Messages republished and removed from the dead-letter queue.
    pub moved: usize,
    /// A dry run: messages that would have moved.
    pub would_move: usize,
    /// Messages not selected, left where they were.
    pub skipped: usize,
    /// Selected messages left in the dead-letter queue (poison,
    /// undecodable, no queue to go to).
    pub left: usize,
    /// Whether it was a dry run.
    pub dry_run: bool,
    /// Every message looked at, in queue order.
    pub items: Vec<RedriveItem>,
}

impl RedriveReport {
    fn push(&mut self, item: RedriveItem) {
        match item.outcome {
            Outcome::Moved => self.moved += 1,
            Outcome::WouldMove => self.would_move += 1,
            Outcome::Skipped => self.skipped += 1,
            Outcome::Left(_) => self.left += 1,
        }
        self.items.push(item);
    }
}

/// Why a redrive did not finish.
///
/// ```no_run
/// # #[cfg(feature = "redis-transport")]
/// # async fn run(transport: babel_idem::transport::RedisTransport) {
/// use babel_idem::redrive::{Redrive, RedriveError, RedriveOptions};
///
/// match transport.redrive("orders.dlq", &RedriveOptions::new()).await {
///     Ok(report) => println!("moved {}", report.moved),
///     Err(RedriveError::Stopped { report, error }) => {
///         eprintln!("stopped after {}: {error}; run it again", report.moved)
///     }
///     Err(error) => eprintln!("nothing moved: {error}"),
/// }
/// # }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RedriveError {
    /// It could not start (a bad queue name, an unreachable broker);
    /// nothing moved.
    #[error("{0}")]
    Transport(#[from] TransportError),
    /// The dead-letter queue does not exist (RabbitMQ); nothing moved.
    #[error("the dead-letter queue {0:?} does not exist")]
    MissingQueue(String),
    /// The broker failed part way: `report` says what moved before it did.
    /// Every message not moved is still in the dead-letter queue; running
    /// the redrive again picks up where this one stopped.
    #[error(
        "the redrive stopped after moving {} message(s): {error}; the rest are still in the dead-letter queue",
        .report.moved
    )]
    Stopped {
        /// What was done before the failure.
        report: RedriveReport,
        /// The failure.
        #[source]
        error: TransportError,
    },
}

/// Redrive and look over any broker's dead-letter queues: written once over
/// [`DeadLetters`], for every broker binding (`RedisTransport`,
/// `AmqpTransport`) and for a `Box<dyn ErasedDeadLetters>` chosen at run
/// time. See the [module](self) for the rules.
///
/// [`ErasedDeadLetters`]: crate::broker::ErasedDeadLetters
///
/// ```no_run
/// # #[cfg(feature = "redis-transport")]
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use babel_idem::broker::ErasedDeadLetters;
/// use babel_idem::redrive::{Redrive, RedriveOptions};
/// use babel_idem::transport::RedisTransport;
///
/// let broker: Box<dyn ErasedDeadLetters> =
///     Box::new(RedisTransport::connect("redis://127.0.0.1:6379/0").await?);
/// for record in broker.dead_letters("orders.dlq", Some(10)).await? {
///     println!("{:?} {}", record.id, record.reason);
/// }
/// let plan = broker.redrive("orders.dlq", &RedriveOptions::new().dry_run(true)).await?;
/// println!("{} would move", plan.would_move);
/// # Ok(())
/// # }
/// ```
pub trait Redrive: DeadLetters {
    /// Redrives the dead-letter queue `dlq` by `options`: each selected
    /// record, reset, goes back to its original queue (or the target), and
    /// leaves `dlq` once it is there. A queue the broker says does not
    /// exist is [`RedriveError::MissingQueue`], and is not created; on
    /// Redis a missing list is an empty queue.
    fn redrive<'a>(
        &'a self,
        dlq: &'a str,
        options: &'a RedriveOptions,
    ) -> impl Future<Output = Result<RedriveReport, RedriveError>> + Send + 'a {
        self.redrive_with(dlq, options, |_| {})
    }

    /// [`redrive`](Self::redrive), calling `on_item` for each message as it
    /// is decided (for a progress bar).
    fn redrive_with<'a>(
        &'a self,
        dlq: &'a str,
        options: &'a RedriveOptions,
        mut on_item: impl FnMut(&RedriveItem) + Send + 'a,
    ) -> impl Future<Output = Result<RedriveReport, RedriveError>> + Send + 'a {
        async move {
            let mut run = open(self, dlq).await?;
            run_over(&mut *run, dlq, options, &mut on_item).await
        }
    }

    /// Reads up to `max` (all with `None`) messages of the dead-letter
    /// queue `dlq` from its head, and leaves them all in place (on
    /// RabbitMQ a look takes and puts back: see the transport's notes on
    /// quorum queues).
    fn dead_letters<'a>(
        &'a self,
        dlq: &'a str,
        max: Option<usize>,
    ) -> impl Future<Output = Result<Vec<DlqRecord>, RedriveError>> + Send + 'a {
        async move {
            let mut run = open(self, dlq).await?;
            Ok(look(&mut *run, max).await?)
        }
    }
}

impl<D: DeadLetters + ?Sized> Redrive for D {}

/// The run over `dlq`, or [`RedriveError::MissingQueue`].
async fn open<D: DeadLetters + ?Sized>(
    broker: &D,
    dlq: &str,
) -> Result<BoxedRun<D::Handle>, RedriveError> {
    broker
        .open_dead_letters(dlq)
        .await?
        .ok_or_else(|| RedriveError::MissingQueue(dlq.to_owned()))
}

/// Messages looked at per broker round trip.
const PAGE: usize = 100;

/// A redrive over `queue`, which the broker opened on `dlq`.
async fn run_over<H: Send + 'static>(
    queue: &mut dyn DeadLetterRun<Handle = H>,
    dlq: &str,
    options: &RedriveOptions,
    on_item: &mut (dyn FnMut(&RedriveItem) + Send),
) -> Result<RedriveReport, RedriveError> {
    if let Some(to) = &options.to
        && let Err(error) = queue.check_queue(to)
    {
        // Nothing was looked at: closing gives nothing back but the channel.
        let _ = queue.close().await;
        return Err(RedriveError::Transport(error));
    }
    let mut report = RedriveReport {
        dry_run: options.dry_run,
        ..RedriveReport::default()
    };
    let outcome = drive(queue, dlq, options, on_item, &mut report).await;
    let closed = queue.close().await;
    match (outcome, closed) {
        (Ok(()), Ok(())) => Ok(report),
        (Err(error), _) | (Ok(()), Err(error)) => {
            if report.moved == 0 && report.items.is_empty() {
                Err(RedriveError::Transport(error))
            } else {
                Err(RedriveError::Stopped { report, error })
            }
        }
    }
}

async fn drive<H: Send + 'static>(
    queue: &mut dyn DeadLetterRun<Handle = H>,
    dlq: &str,
    options: &RedriveOptions,
    on_item: &mut (dyn FnMut(&RedriveItem) + Send),
    report: &mut RedriveReport,
) -> Result<(), TransportError> {
    let mut depth = queue.depth().await?;
    let watching = Instant::now();
    while depth == 0 && watching.elapsed() < options.wait {
        tokio::time::sleep(Duration::from_millis(50).min(options.wait)).await;
        depth = queue.depth().await?;
    }
    let max = options.max.unwrap_or(usize::MAX);
    let started = Instant::now();
    let mut looked = 0;
    while looked < depth && report.moved + report.would_move < max {
        let page = queue.look(PAGE.min(depth - looked)).await?;
        if page.is_empty() {
            break;
        }
        for message in page {
            looked += 1;
            if report.moved + report.would_move >= max {
                queue.put_back(message);
                continue;
            }
            let (mut item, plan) = decide(&message, dlq, options, queue);
            match plan {
                Some((target, body)) if !options.dry_run => {
                    if let Some(rate) = options.rate {
                        let due = started
                            + Duration::from_secs_f64(report.moved as f64 / f64::from(rate));
                        tokio::time::sleep_until(due.into()).await;
                    }
                    let headers = bypass_headers(options.bypass);
                    let copy = Outgoing::new(&target, &body).with_headers(&headers);
                    match queue.republish(message, copy).await {
                        Ok(true) => item.outcome = Outcome::Moved,
                        Ok(false) => {
                            item.outcome = Outcome::Left(LeftReason::Gone);
                            item.bypassed = false;
                        }
                        Err(error) => return Err(error),
                    }
                }
                Some(_) => {
                    item.outcome = Outcome::WouldMove;
                    queue.put_back(message);
                }
                None => queue.put_back(message),
            }
            on_item(&item);
            report.push(item);
        }
    }
    Ok(())
}

fn bypass_headers(bypass: bool) -> Vec<(String, String)> {
    if bypass {
        vec![(HEADER_REPLAY_BYPASS.to_owned(), "1".to_owned())]
    } else {
        Vec::new()
    }
}

/// The item for `message`, and where it goes with which body when it moves.
fn decide<H: Send + 'static>(
    message: &DeadLetterMessage<H>,
    dlq: &str,
    options: &RedriveOptions,
    queue: &dyn DeadLetterRun<Handle = H>,
) -> (RedriveItem, Option<(String, Vec<u8>)>) {
    let reading = record::read(message);
    let mut item = RedriveItem {
        id: reading.id.clone(),
        trace_id: reading.trace_id.clone(),
        urn: reading.urn.clone(),
        reason: reading.reason.clone(),
        kind: reading.kind,
        from: dlq.to_owned(),
        to: None,
        outcome: Outcome::Skipped,
        bypassed: false,
    };
    if !options.selection.matches(&reading) {
        return (item, None);
    }
    let left = |mut item: RedriveItem, why: LeftReason| {
        item.outcome = Outcome::Left(why);
        (item, None)
    };
    let body = match reading.kind {
        RecordKind::Envelope => {
            let rewritten = std::str::from_utf8(&message.body)
                .map_err(|_| rewrite::Unencodable::NotAnObject)
                .and_then(rewrite::redriven);
            match rewritten {
                Ok(body) => body,
                Err(why) => return left(item, LeftReason::Unencodable(why.to_string())),
            }
        }
        RecordKind::Poison | RecordKind::Undecodable if !options.include_poison => {
            let why = match reading.kind {
                RecordKind::Poison => LeftReason::Poison,
                _ => LeftReason::Undecodable,
            };
            return left(item, why);
        }
        RecordKind::Poison | RecordKind::Undecodable => match &reading.payload {
            Some(payload) => payload.clone(),
            None => {
                return left(
                    item,
                    LeftReason::Unencodable("the record keeps no payload".into()),
                );
            }
        },
    };
    let Some(target) = options.to.clone().or(reading.original_queue.clone()) else {
        let why = match reading.kind {
            RecordKind::Undecodable => LeftReason::Undecodable,
            _ => LeftReason::NoTarget,
        };
        return left(item, why);
    };
    if let Err(error) = queue.check_queue(&target) {
        return left(item, LeftReason::InvalidTarget(error.to_string()));
    }
    item.to = Some(target.clone());
    item.bypassed = options.bypass;
    (item, Some((target, body)))
}

/// Reads up to `max` messages of the dead-letter queue `queue`, from
/// the head, and leaves them all in place.
async fn look<H: Send + 'static>(
    queue: &mut dyn DeadLetterRun<Handle = H>,
    max: Option<usize>,
) -> Result<Vec<DlqRecord>, TransportError> {
    let looked = look_all(queue, max).await;
    let closed = queue.close().await;
    let records = looked?;
    closed?;
    Ok(records)
}

async fn look_all<H: Send + 'static>(
    queue: &mut dyn DeadLetterRun<Handle = H>,
    max: Option<usize>,
) -> Result<Vec<DlqRecord>, TransportError> {
    let depth = queue.depth().await?;
    let wanted = max.map_or(depth, |max| max.min(depth));
    let mut records = Vec::with_capacity(wanted);
    while records.len() < wanted {
        let page = queue.look(PAGE.min(wanted - records.len())).await?;
        if page.is_empty() {
            break;
        }
        for message in page {
            let reading = record::read(&message);
            records.push(DlqRecord {
                position: records.len(),
                kind: reading.kind,
                id: reading.id.clone(),
                urn: reading.urn.clone(),
                trace_id: reading.trace_id.clone(),
                reason: reading.reason.clone(),
                failed_at: reading.failed_at,
                original_queue: reading.original_queue.clone(),
                error: reading.error.clone(),
                body: message.body.clone(),
                headers: message.headers.clone(),
            });
            queue.put_back(message);
        }
    }
    Ok(records)
}
