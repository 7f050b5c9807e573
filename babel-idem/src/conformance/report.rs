//! What a conformance run found: one [`CaseOutcome`] per case, printed as
//! one line each and a summary.

use std::fmt;

/// The manifest block a case comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Block {
    /// `cases`: an envelope fixture that must decode or be rejected.
    Envelope,
    /// `idempotency.dedup_key`: the id a consumer keys its seen-set on.
    DedupKey,
    /// `idempotency.sequences.cases`: deliveries through one wrapped handler.
    Sequence,
    /// `redis.payload_identity`: the Redis binding stores and reserves the
    /// envelope byte for byte.
    Redis,
    /// `rabbitmq.property_projection`: the AMQP properties and headers the
    /// RabbitMQ binding publishes an envelope with.
    Rabbitmq,
    /// `kafka.property_projection` and `kafka.attempts_reconciliation`:
    /// the `bq-` headers the Kafka binding writes, and the attempts it
    /// reads back from them.
    Kafka,
    /// `payload_schema`: data that must be valid, or not, against the
    /// block's schema.
    PayloadSchema,
}

crate::names::named_variants! {
    /// The block's place in the manifest: `cases`, `idempotency`,
    /// `idempotency.sequences`, `redis`, `rabbitmq`, `kafka`,
    /// `payload_schema`.
    ///
    /// ```
    /// use babel_idem::conformance::Block;
    ///
    /// assert_eq!(Block::Sequence.as_str(), "idempotency.sequences");
    /// ```
    Block {
        Envelope => "cases",
        DedupKey => "idempotency",
        Sequence => "idempotency.sequences",
        Redis => "redis",
        Rabbitmq => "rabbitmq",
        Kafka => "kafka",
        PayloadSchema => "payload_schema",
    }
}

/// The result of one case.
///
/// `reason` says why a case failed; on a passing rejection case it holds the
/// rejection the decoder gave, and on any other pass it is `None`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CaseOutcome {
    /// The block the case belongs to.
    pub block: Block,
    /// The case's name in the manifest (`dedup_key` for the dedupe-key check).
    pub name: String,
    /// Whether babel-idem honoured the case.
    pub passed: bool,
    /// Why it failed, or what a passing rejection rejected.
    pub reason: Option<String>,
}

impl CaseOutcome {
    pub(super) fn pass(block: Block, name: &str, note: Option<String>) -> Self {
        CaseOutcome {
            block,
            name: name.to_owned(),
            passed: true,
            reason: note,
        }
    }

    pub(super) fn fail(block: Block, name: &str, reason: String) -> Self {
        CaseOutcome {
            block,
            name: name.to_owned(),
            passed: false,
            reason: Some(reason),
        }
    }

    /// A case passes when nothing went wrong; otherwise every problem is listed.
    pub(super) fn from_problems(block: Block, name: &str, problems: Vec<String>) -> Self {
        if problems.is_empty() {
            Self::pass(block, name, None)
        } else {
            Self::fail(block, name, problems.join("; "))
        }
    }
}

impl fmt::Display for CaseOutcome {
    /// `pass <block>/<name>`, with the rejection after a colon for a passing
    /// rejection case, or `FAIL <block>/<name>: <reason>`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verdict = if self.passed { "pass" } else { "FAIL" };
        write!(f, "{verdict} {}/{}", self.block, self.name)?;
        match &self.reason {
            Some(reason) => write!(f, ": {reason}"),
            None => Ok(()),
        }
    }
}

/// Every case of a run, in manifest order.
///
/// Its `Display` prints one line per case, one `n/a` line per block that
/// does not apply, and then the summary line `N passed, M failed`:
///
/// ```text
/// pass cases/order-created
/// pass cases/invalid-missing-urn: rejected (missing_urn): envelope has no `job` or `urn`: ...
/// FAIL idempotency.sequences/duplicate-delivery-runs-once: delivery 2 (meta_id "id-A"): expected skip, but the handler ran; ...
/// pass redis/payload_identity
/// n/a kafka: babel-idem has no Apache Kafka binding
/// 14 passed, 1 failed
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    outcomes: Vec<CaseOutcome>,
    not_applicable: Vec<(String, String)>,
}

impl Report {
    pub(super) fn push(&mut self, outcome: CaseOutcome) {
        self.outcomes.push(outcome);
    }

    /// The outcome of the binding `block`'s check, or why it does not apply.
    pub(super) fn push_binding(&mut self, block: &str, checked: Result<CaseOutcome, &str>) {
        match checked {
            Ok(outcome) => self.push(outcome),
            Err(why) => self.not_applicable(block, why),
        }
    }

    /// Records `block` as not applicable, once however many of its cases
    /// say so.
    pub(super) fn not_applicable(&mut self, block: &str, why: &str) {
        if !self.not_applicable.iter().any(|(name, _)| name == block) {
            self.not_applicable.push((block.to_owned(), why.to_owned()));
        }
    }

    /// The manifest's blocks that were not checked, by name, each with why
    /// it does not apply (a binding babel-idem lacks, or one this build
    /// left out).
    ///
    /// ```no_run
    /// let report = babel_idem::conformance::run("tests/fixtures/conformance")?;
    /// for (block, why) in report.skipped_blocks() {
    ///     println!("{block}: {why}");
    /// }
    /// # Ok::<(), babel_idem::conformance::ConformanceError>(())
    /// ```
    pub fn skipped_blocks(&self) -> impl Iterator<Item = (&str, &str)> {
        self.not_applicable
            .iter()
            .map(|(block, why)| (block.as_str(), why.as_str()))
    }

    /// Every case's outcome, in manifest order.
    pub fn outcomes(&self) -> &[CaseOutcome] {
        &self.outcomes
    }

    /// The cases that failed.
    pub fn failures(&self) -> impl Iterator<Item = &CaseOutcome> {
        self.outcomes.iter().filter(|outcome| !outcome.passed)
    }

    /// How many cases passed.
    pub fn passed(&self) -> usize {
        self.outcomes
            .iter()
            .filter(|outcome| outcome.passed)
            .count()
    }

    /// How many cases failed.
    pub fn failed(&self) -> usize {
        self.outcomes.len() - self.passed()
    }

    /// Whether the run checked at least one case and none failed. A manifest
    /// whose blocks are all empty checks nothing, and that is not a success.
    pub fn is_success(&self) -> bool {
        !self.outcomes.is_empty() && self.failed() == 0
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for outcome in &self.outcomes {
            writeln!(f, "{outcome}")?;
        }
        for (block, why) in &self.not_applicable {
            writeln!(f, "n/a {block}: {why}")?;
        }
        write!(f, "{} passed, {} failed", self.passed(), self.failed())
    }
}
