//! The guard's decisions and store calls through the [`metrics`](::metrics)
//! facade (feature `metrics`), so whatever recorder the application installs
//! (a Prometheus exporter, StatsD, ...) picks them up.

use std::borrow::Cow;
use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::sync::LazyLock;
use std::task::{Context, Poll};
use std::time::Instant;

use ::metrics::{Key, Label, Level, Metadata};

use crate::store::StoreError;
use crate::store::StoreFuture;
use crate::store::StoreOperation;
use crate::telemetry::metrics::Decision;

/// Counter: one per guard decision, labelled `decision` ([`Decision::as_str`])
/// and `mode` (`seen_set` or `claim`).
pub const DECISIONS_TOTAL: &str = "babel_idem_decisions_total";

/// Histogram, in seconds: how long each store call the guard awaited took,
/// labelled `operation` ([`StoreOperation::as_str`]: `seen`, `remember`,
/// `claim`, `commit`, `release`, `renew`, and `seen_many`, `remember_many`
/// from [`Guard::run_batch`](crate::guard::Guard::run_batch)) and `backend` (`memory`, `sqlite`,
/// `redis`, `postgres`; `dyn` for a `dyn Store`; another store's type name).
pub const STORE_DURATION_SECONDS: &str = "babel_idem_store_duration_seconds";

/// Counter: store calls the guard awaited that failed, labelled `operation`
/// and `backend` as [`STORE_DURATION_SECONDS`] is.
pub const STORE_ERRORS_TOTAL: &str = "babel_idem_store_errors_total";

/// Counter: attempts refused because a message's `data` does not match what
/// its URN expects (the router's payload schema for it, or the message type
/// a typed handler takes), labelled `urn`. A message retried until it is
/// dead-lettered counts once per attempt.
pub const INVALID_PAYLOADS_TOTAL: &str = "babel_idem_invalid_payloads_total";

/// Gauge, in seconds: how long the oldest pending row of the outbox a
/// relay drains has waited (0 when none is pending).
pub const OUTBOX_LAG_SECONDS: &str = "babel_idem_outbox_lag_seconds";

/// Gauge: the rows of the outbox a relay drains, labelled `status`
/// (`pending`, `published`, `failed`).
pub const OUTBOX_ROWS: &str = "babel_idem_outbox_rows";

/// Counter: rows a relay published and marked.
pub const OUTBOX_PUBLISHED_TOTAL: &str = "babel_idem_outbox_published_total";

/// Counter: refusals a relay recorded on rows (each an attempt).
pub const OUTBOX_REFUSED_TOTAL: &str = "babel_idem_outbox_refused_total";

/// Records an outbox's lag (the age of its oldest pending row, none when no
/// row is pending) and its rows by status.
#[cfg(feature = "outbox")]
pub(crate) fn record_outbox(
    oldest_pending_age: Option<std::time::Duration>,
    pending: u64,
    published: u64,
    failed: u64,
) {
    let lag = oldest_pending_age.unwrap_or_default().as_secs_f64();
    ::metrics::gauge!(OUTBOX_LAG_SECONDS).set(lag);
    for (status, count) in [
        ("pending", pending),
        ("published", published),
        ("failed", failed),
    ] {
        ::metrics::gauge!(OUTBOX_ROWS, "status" => status).set(count as f64);
    }
}

/// Counts one attempt refused for an invalid payload of `urn`.
pub(super) fn invalid_payload(urn: &str) {
    ::metrics::counter!(INVALID_PAYLOADS_TOTAL, "urn" => urn.to_owned()).increment(1);
}

/// Registers a description and unit for each of the crate's metrics with the
/// installed recorder (a Prometheus exporter prints them as `# HELP`). Call it
/// once after installing the recorder; recording works without it.
///
/// ```
/// babel_idem::telemetry::metrics::describe();
/// ```
pub fn describe() {
    use ::metrics::Unit::{Count, Seconds};
    /// One registration per line: the `metrics` macro, the metric, its unit
    /// and its description.
    macro_rules! describe {
        ($($kind:ident $name:ident $unit:ident $text:literal;)+) => {
            $(::metrics::$kind!($name, $unit, $text);)+
        };
    }
    describe! {
        describe_counter DECISIONS_TOTAL Count "babel-idem guard decisions (ran, skipped, failed, fail_open, mark_failed, store_failed, parked, lost_claim)";
        describe_histogram STORE_DURATION_SECONDS Seconds "latency of the seen-set store calls a babel-idem guard awaited";
        describe_counter STORE_ERRORS_TOTAL Count "failed seen-set store calls a babel-idem guard awaited";
        describe_counter INVALID_PAYLOADS_TOTAL Count "attempts a babel-idem router refused because the data does not match what its URN expects";
        describe_gauge OUTBOX_LAG_SECONDS Seconds "age of the oldest pending row of the outbox a babel-idem relay drains";
        describe_gauge OUTBOX_ROWS Count "rows of the outbox a babel-idem relay drains, by status";
        describe_counter OUTBOX_PUBLISHED_TOTAL Count "outbox rows a babel-idem relay published";
        describe_counter OUTBOX_REFUSED_TOTAL Count "refusals a babel-idem relay recorded on outbox rows";
    }
}

thread_local! {
    /// Set only for the synchronous span of a claim-mode report.
    static CLAIM_MODE: Cell<bool> = const { Cell::new(false) };
}

/// Runs `report`, whose decisions are claim mode's. The flag covers only
/// this synchronous call, so it never leaks into another task's decisions.
pub(crate) fn claim_mode<T>(report: impl FnOnce() -> T) -> T {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            let _ = CLAIM_MODE.try_with(|mode| mode.set(self.0));
        }
    }
    let _restore = Restore(
        CLAIM_MODE
            .try_with(|mode| mode.replace(true))
            .unwrap_or(false),
    );
    report()
}

/// What `metrics`' own macros pass with every registration.
static METADATA: Metadata<'static> =
    Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

// The label sets are static tables, so recording costs no allocation (a
// duplicate delivery allocates nothing, with or without the feature).
macro_rules! decision_labels {
    ($($decision:literal),+) => {[$([
        [Label::from_static_parts("decision", $decision), Label::from_static_parts("mode", "seen_set")],
        [Label::from_static_parts("decision", $decision), Label::from_static_parts("mode", "claim")],
    ]),+]};
}

/// By `Decision as usize`, then seen-set / claim.
static DECISION_LABELS: [[[Label; 2]; 2]; Decision::ALL.len()] = decision_labels!(
    "ran",
    "skipped",
    "failed",
    "fail_open",
    "mark_failed",
    "store_failed",
    "parked",
    "lost_claim"
);

/// The crate's own backends' labels, in the order of [`STORE_LABELS`]' columns.
const BACKENDS: [&str; 5] = ["memory", "sqlite", "redis", "postgres", "dyn"];

/// The end of the type name of each of the crate's own stores, in the order
/// of [`BACKENDS`] (the last, `dyn`, is no type of its own).
const BACKEND_TYPES: [&str; 4] = [
    "::InMemoryStore",
    "::SqliteStore",
    "::RedisStore",
    "::PostgresStore",
];

macro_rules! store_labels {
    ([$($operation:literal),+], $backends:tt) => {[$(store_labels!(@row $operation, $backends)),+]};
    (@row $operation:literal, [$($backend:literal),+]) => {[$(
        [Label::from_static_parts("operation", $operation), Label::from_static_parts("backend", $backend)]
    ),+]};
}

/// [`StoreOperation`]'s variants.
const OPERATIONS: usize = 11;

/// By `StoreOperation as usize`, then [`BACKENDS`].
static STORE_LABELS: [[[Label; 2]; BACKENDS.len()]; OPERATIONS] = store_labels!(
    [
        "seen",
        "remember",
        "forget",
        "open",
        "maintenance",
        "claim",
        "commit",
        "release",
        "renew",
        "seen_many",
        "remember_many"
    ],
    ["memory", "sqlite", "redis", "postgres", "dyn"]
);

// Building a `Key` hashes its name and labels, which cost a duplicate
// delivery more than its store lookup: the tables' keys are built once, on
// first use.

/// [`DECISION_LABELS`]' keys.
static DECISION_KEYS: LazyLock<[[Key; 2]; Decision::ALL.len()]> = LazyLock::new(|| {
    DECISION_LABELS.each_ref().map(|modes| {
        modes
            .each_ref()
            .map(|labels| Key::from_static_parts(DECISIONS_TOTAL, labels))
    })
});

/// The keys of one store metric: its name and [`STORE_LABELS`]' keys of it.
struct StoreKeys {
    name: &'static str,
    keys: [[Key; BACKENDS.len()]; OPERATIONS],
}

impl StoreKeys {
    fn new(name: &'static str) -> Self {
        let keys = STORE_LABELS.each_ref().map(|backends| {
            backends
                .each_ref()
                .map(|labels| Key::from_static_parts(name, labels))
        });
        StoreKeys { name, keys }
    }

    /// The key of a call of `operation` on `backend`: from the table for
    /// the crate's own backends, built (one allocation) for a store type of
    /// the user's own.
    fn get(&self, operation: StoreOperation, backend: Backend) -> Cow<'_, Key> {
        match backend {
            Backend::Column(column) => Cow::Borrowed(&self.keys[operation as usize][column]),
            Backend::Named(backend) => Cow::Owned(Key::from_parts(
                self.name,
                vec![
                    Label::from_static_parts("operation", operation.as_str()),
                    Label::from_static_parts("backend", backend),
                ],
            )),
        }
    }
}

static DURATION_KEYS: LazyLock<StoreKeys> =
    LazyLock::new(|| StoreKeys::new(STORE_DURATION_SECONDS));

static ERROR_KEYS: LazyLock<StoreKeys> = LazyLock::new(|| StoreKeys::new(STORE_ERRORS_TOTAL));

pub(super) fn decision(decision: Decision) {
    let claim = CLAIM_MODE.try_with(Cell::get).unwrap_or(false);
    let key = &DECISION_KEYS[decision as usize][usize::from(claim)];
    ::metrics::with_recorder(|recorder| recorder.register_counter(key, &METADATA).increment(1));
}

/// Makes the store call `call` of `operation` on a store of type `S`, timing
/// it from before the call (a store that answers from memory does its work
/// in the call itself) to the end of its future.
pub(crate) fn timed<S: ?Sized, F>(operation: StoreOperation, call: impl FnOnce() -> F) -> Timed<F> {
    let timing = StoreCall::starting::<S>(operation);
    Timed {
        future: call(),
        call: timing,
    }
}

/// [`timed`] for a call that answers at once or not at all (`None`, which
/// records nothing: the call is made again, and timed, as a future).
pub(crate) fn timed_now<S: ?Sized, T>(
    operation: StoreOperation,
    call: impl FnOnce() -> Option<Result<T, StoreError>>,
) -> Option<Result<T, StoreError>> {
    let timing = StoreCall::starting::<S>(operation);
    let answer = call();
    if let Some(answer) = &answer {
        timing.completed(answer.is_err());
    }
    answer
}

/// A store call's future that records its latency, and its failure, when it
/// completes. A call dropped before it completes records nothing.
pub(crate) struct Timed<F> {
    future: F,
    call: StoreCall,
}

/// What a [`Timed`] call records: which call, and since when.
struct StoreCall {
    operation: StoreOperation,
    backend: fn() -> Backend,
    start: Instant,
}

impl StoreCall {
    /// A call of `operation` on a store of type `S`, starting now.
    fn starting<S: ?Sized>(operation: StoreOperation) -> Self {
        StoreCall {
            operation,
            backend: backend_label::<S>,
            start: Instant::now(),
        }
    }

    /// Records the call's latency, and its failure, now that it completed.
    fn completed(&self, failed: bool) {
        let (operation, backend) = (self.operation, (self.backend)());
        let elapsed = self.start.elapsed().as_secs_f64();
        ::metrics::with_recorder(|recorder| {
            let duration = DURATION_KEYS.get(operation, backend);
            recorder
                .register_histogram(&duration, &METADATA)
                .record(elapsed);
            if failed {
                let errors = ERROR_KEYS.get(operation, backend);
                recorder.register_counter(&errors, &METADATA).increment(1);
            }
        });
    }
}

impl<F, T> Future for Timed<F>
where
    F: Future<Output = Result<T, StoreError>> + Unpin,
{
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let result = match Pin::new(&mut self.future).poll(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(result) => result,
        };
        self.call.completed(result.is_err());
        Poll::Ready(result)
    }
}

impl<T> Timed<StoreFuture<'_, T>> {
    /// [`StoreFuture::into_ready`], recording a ready answer as `poll` would.
    #[inline]
    pub(crate) fn into_ready(self) -> Result<Result<T, StoreError>, Self> {
        match self.future.into_ready() {
            Ok(answer) => {
                self.call.completed(answer.is_err());
                Ok(answer)
            }
            Err(future) => Err(Timed {
                future,
                call: self.call,
            }),
        }
    }
}

/// The `backend` label of a store type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    /// One of [`BACKENDS`], by its column in [`STORE_LABELS`].
    Column(usize),
    /// A store type of the user's own, by its name.
    Named(&'static str),
}

/// The `backend` label of a store type: the crate's stores by their
/// [`StoreError::backend`] word, `dyn` for a trait object (its concrete type
/// is not known here), else the innermost type's own name.
///
/// It runs on every store call, so the crate's stores are told by the end of
/// their type's name alone: a search of the name (`rsplit("::")`, even
/// `rfind(':')`) cost a duplicate delivery more than its store lookup.
fn backend_label<S: ?Sized>() -> Backend {
    // `&S`, `Arc<S>`, `Box<S>` name the store innermost.
    let innermost = std::any::type_name::<S>().trim_end_matches('>');
    if let Some(column) = BACKEND_TYPES
        .iter()
        .position(|own| innermost.ends_with(own))
    {
        return Backend::Column(column);
    }
    if innermost.contains("dyn ") {
        return Backend::Column(BACKENDS.len() - 1);
    }
    Backend::Named(innermost.rsplit("::").next().unwrap_or(innermost))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{InMemoryStore, Store};
    use std::sync::Arc;

    #[test]
    fn a_store_type_names_its_backend() {
        let label = |backend| match backend {
            Backend::Column(column) => BACKENDS[column],
            Backend::Named(name) => name,
        };
        assert_eq!(label(backend_label::<InMemoryStore>()), "memory");
        assert_eq!(label(backend_label::<&InMemoryStore>()), "memory");
        assert_eq!(label(backend_label::<Arc<InMemoryStore>>()), "memory");
        assert_eq!(label(backend_label::<Arc<dyn Store>>()), "dyn");
        assert_eq!(label(backend_label::<dyn Store>()), "dyn");
        #[cfg(feature = "sqlite")]
        assert_eq!(
            label(backend_label::<crate::store::SqliteStore>()),
            "sqlite"
        );
        #[cfg(feature = "redis")]
        assert_eq!(
            label(backend_label::<Arc<crate::store::RedisStore>>()),
            "redis"
        );
        #[cfg(feature = "postgres")]
        assert_eq!(
            label(backend_label::<&crate::store::PostgresStore>()),
            "postgres"
        );
        struct TinyStore;
        assert_eq!(backend_label::<TinyStore>(), Backend::Named("TinyStore"));
        assert_eq!(
            backend_label::<Arc<TinyStore>>(),
            Backend::Named("TinyStore")
        );
        struct NotAnInMemoryStore;
        assert_eq!(
            backend_label::<NotAnInMemoryStore>(),
            Backend::Named("NotAnInMemoryStore")
        );
    }

    #[test]
    fn the_static_label_tables_spell_the_names_they_stand_for() {
        for decision in Decision::ALL {
            for (mode, labels) in ["seen_set", "claim"]
                .iter()
                .zip(&DECISION_LABELS[decision as usize])
            {
                assert_eq!(labels[0].value(), decision.as_str());
                assert_eq!(labels[1].value(), *mode);
            }
        }
        let operations = [
            StoreOperation::Seen,
            StoreOperation::Remember,
            StoreOperation::Forget,
            StoreOperation::Open,
            StoreOperation::Maintenance,
            StoreOperation::Claim,
            StoreOperation::Commit,
            StoreOperation::Release,
            StoreOperation::Renew,
            StoreOperation::SeenMany,
            StoreOperation::RememberMany,
        ];
        for operation in operations {
            for (backend, labels) in BACKENDS.iter().zip(&STORE_LABELS[operation as usize]) {
                assert_eq!(labels[0].value(), operation.as_str());
                assert_eq!(labels[1].value(), *backend);
            }
        }
        let key = ERROR_KEYS.get(StoreOperation::Seen, Backend::Named("TinyStore"));
        let labels: Vec<_> = key.labels().map(|l| (l.key(), l.value())).collect();
        assert_eq!(labels, [("operation", "seen"), ("backend", "TinyStore")]);
    }

    #[test]
    fn the_prebuilt_keys_are_their_names_and_labels() {
        for (labels, keys) in DECISION_LABELS.iter().zip(DECISION_KEYS.iter()) {
            for (labels, key) in labels.iter().zip(keys) {
                assert_eq!(*key, Key::from_parts(DECISIONS_TOTAL, labels.to_vec()));
            }
        }
        for (name, table) in [
            (STORE_DURATION_SECONDS, &*DURATION_KEYS),
            (STORE_ERRORS_TOTAL, &*ERROR_KEYS),
        ] {
            assert_eq!(table.name, name);
            for (labels, keys) in STORE_LABELS.iter().zip(&table.keys) {
                for (labels, key) in labels.iter().zip(keys) {
                    let built = Key::from_parts(name, labels.to_vec());
                    assert_eq!((key, key.get_hash()), (&built, built.get_hash()));
                }
            }
        }
        let known = DURATION_KEYS.get(StoreOperation::Claim, backend_label::<InMemoryStore>());
        assert!(
            matches!(known, Cow::Borrowed(_)),
            "no key built for a known backend"
        );
        let labels: Vec<_> = known.labels().map(|l| (l.key(), l.value())).collect();
        assert_eq!(labels, [("operation", "claim"), ("backend", "memory")]);
    }

    #[test]
    fn the_claim_flag_covers_only_its_call() {
        let inside = claim_mode(|| CLAIM_MODE.with(Cell::get));
        assert!(inside);
        assert!(!CLAIM_MODE.with(Cell::get));
    }
}
