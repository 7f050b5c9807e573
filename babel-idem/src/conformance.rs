//! The BabelQueue conformance runner: checks babel-idem against a
//! conformance folder (`manifest.json` and the `fixtures/` it names).
//!
//! [`run`] checks every block whose binding babel-idem implements and
//! lists each other block by name as not applicable:
//!
//! - `cases`: every fixture marked `valid: true` must decode and match each
//!   field its `expect` names (`urn`, `data`, `attempts`, `lang`,
//!   `schema_version`, `dead_letter.*`), and must encode back without losing
//!   a value; every fixture marked `valid: false` must be rejected, and the
//!   rejection is recorded. An `expect` field the runner does not know fails
//!   the case rather than pass unchecked.
//! - `idempotency`: `dedup_key` (the envelope's `meta.id` is the key, never
//!   its `trace_id`) and every sequence of `sequences.cases`, each replayed
//!   through one [`wrap`](crate::guard::wrap)ped handler over one
//!   [`InMemoryStore`](crate::store::InMemoryStore): `forget_before` forgets the id
//!   first, `expect_effect` is compared with whether the handler ran,
//!   `outcome` is what the handler returns (`ok` or `throw`; `ok` when
//!   absent), a `meta_id` that is empty, `null` or absent makes an envelope
//!   without a usable id, and the handler's invocations (each one is an
//!   effect, a throwing one included) must add up to `expected_effects`.
//! - `redis.payload_identity` (feature `redis-transport`): the Redis
//!   binding stores the envelope as the queue element byte for byte, with
//!   no frame when no header travels, and reserving it gives back the same
//!   bytes.
//! - `rabbitmq.property_projection` (feature `amqp-transport`): the AMQP
//!   properties and native-typed headers the RabbitMQ binding publishes the
//!   envelope with equal the block's, each of them.
//! - `kafka.property_projection` and `kafka.attempts_reconciliation`
//!   (feature `kafka-transport`): the `bq-` record headers the Kafka
//!   binding writes beside the envelope equal the block's, with the record
//!   timestamp from `meta.created_at`; and each reconciliation case's
//!   `bq-attempts` header (or its absence) gives the attempts dispatch
//!   counts with, the header authoritative over the body.
//!
//!   The binding blocks are checked offline, against the encoding and
//!   projection the transports publish with; the live round trips are the
//!   transports' own tests.
//! - `payload_schema`: each case's `data` is checked against the block's
//!   `schema` with [`crate::schema`] (the feature `conformance` pulls in
//!   `schema`), and the verdict must equal the case's `valid`.
//! - Any other block (`sqs`, `asb`, ...), or a binding block in a build
//!   without its feature: reported as not applicable, with why
//!   ([`Report::skipped_blocks`]).
//!
//! This repository's own fixtures add one optional key to a `valid: false`
//! case, `rejected_by`, naming the rule that must reject it:
//! `not_json`, `not_an_object`, `missing_schema_version`,
//! `unsupported_schema_version`, `missing_urn`, `blank_trace_id`,
//! `data_not_object`, `missing_field(<field>)` or `wrong_type(<field>)`.
//! Without it any rejection passes, as upstream manifests expect. In the
//! same way, a `valid: false` case of `payload_schema` may name the
//! `violation` it must report, in the Python SDK's text
//! (`order_id: below_minimum`).
//!
//! The runner needs no async runtime: the in-memory store answers at once,
//! and a small executor of its own (a poll loop that parks the thread while
//! a future is pending) drives the guard.
//!
//! ```
//! use babel_idem::conformance;
//! use std::fs;
//!
//! let dir = std::env::temp_dir().join(format!("babel-idem-doc-{}", std::process::id()));
//! fs::create_dir_all(dir.join("fixtures"))?;
//! fs::write(dir.join("fixtures/paid.json"), r#"{
//!     "job": "urn:babel:invoices:paid", "trace_id": "5d0c8a7e-1f2b-4c3d-8e9f-0a1b2c3d4e5f",
//!     "data": {"invoice": 77},
//!     "meta": {"id": "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d", "queue": "billing",
//!              "lang": "go", "schema_version": 1, "created_at": 1749132727000},
//!     "attempts": 0
//! }"#)?;
//! fs::write(dir.join("fixtures/no-urn.json"),
//!     r#"{"trace_id": "t-1", "data": {}, "meta": {"schema_version": 1}}"#)?;
//! fs::write(dir.join("manifest.json"), r#"{
//!     "cases": [
//!         {"name": "paid", "file": "fixtures/paid.json", "valid": true,
//!          "expect": {"urn": "urn:babel:invoices:paid", "data": {"invoice": 77}}},
//!         {"name": "no-urn", "file": "fixtures/no-urn.json", "valid": false}
//!     ],
//!     "idempotency": {
//!         "dedup_key": {"envelope_file": "fixtures/paid.json", "key_field": "meta.id",
//!                       "expected_key": "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d"},
//!         "sequences": {"cases": [
//!             {"name": "redelivery", "expected_effects": 1, "deliveries": [
//!                 {"meta_id": "inv-77", "expect_effect": "run", "outcome": "ok"},
//!                 {"meta_id": "inv-77", "expect_effect": "skip"}
//!             ]}
//!         ]}
//!     }
//! }"#)?;
//!
//! let report = conformance::run(&dir)?;
//! fs::remove_dir_all(&dir)?;
//! println!("{report}");
//! assert!(report.is_success());
//! assert_eq!(report.to_string().lines().last(), Some("4 passed, 0 failed"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::io;
use std::path::{Component, Path, PathBuf};

mod bindings;
mod block_on;
mod envelope_cases;
mod idempotency;
mod manifest;
mod payload_schema;
mod report;

pub use report::{Block, CaseOutcome, Report};

/// Why a conformance folder could not be run at all. Each variant names the
/// file at fault. (A case that fails is not an error: it is in the [`Report`].)
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConformanceError {
    /// The manifest or a fixture it names cannot be read (missing, unreadable).
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file that could not be read.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// The manifest is not JSON, or a block this runner reads has the wrong shape.
    #[error("{} is not a usable conformance manifest: {source}", path.display())]
    Manifest {
        /// The manifest.
        path: PathBuf,
        /// Where and why parsing failed.
        source: serde_json::Error,
    },
    /// The manifest lacks a block the runner must check.
    #[error("{} has no `{block}` block", path.display())]
    MissingBlock {
        /// The manifest.
        path: PathBuf,
        /// The missing block: `cases`, `idempotency`, `idempotency.dedup_key`
        /// or `idempotency.sequences`.
        block: &'static str,
    },
    /// A fixture path is absolute or leaves the conformance folder.
    #[error("{} names the fixture {file:?}, which is not a path inside its folder", manifest.display())]
    FixtureOutsideFolder {
        /// The manifest.
        manifest: PathBuf,
        /// The fixture path as the manifest wrote it.
        file: String,
    },
}

/// Runs every envelope case and the whole `idempotency` block of the
/// conformance folder `dir`; see the [module docs](self) for what is checked.
///
/// ```no_run
/// let report = babel_idem::conformance::run("tests/fixtures/conformance")?;
/// println!("{report}");
/// assert!(report.is_success());
/// # Ok::<(), babel_idem::conformance::ConformanceError>(())
/// ```
///
/// # Errors
///
/// A [`ConformanceError`] when the folder cannot be run: no readable
/// `manifest.json`, a manifest that is not JSON or lacks a block, or a
/// fixture that is missing or outside the folder.
pub fn run(dir: impl AsRef<Path>) -> Result<Report, ConformanceError> {
    let dir = dir.as_ref();
    let manifest_path = dir.join("manifest.json");
    let manifest: manifest::Manifest =
        serde_json::from_slice(&read(&manifest_path)?).map_err(|source| {
            ConformanceError::Manifest {
                path: manifest_path.clone(),
                source,
            }
        })?;
    let missing = |block| ConformanceError::MissingBlock {
        path: manifest_path.clone(),
        block,
    };
    let cases = manifest.cases.ok_or_else(|| missing("cases"))?;
    let idempotency = manifest.idempotency.ok_or_else(|| missing("idempotency"))?;
    let dedup_key = idempotency
        .dedup_key
        .ok_or_else(|| missing("idempotency.dedup_key"))?;
    let sequences = idempotency
        .sequences
        .ok_or_else(|| missing("idempotency.sequences"))?;

    let mut report = Report::default();
    for case in &cases {
        let bytes = fixture(dir, &manifest_path, &case.file)?;
        report.push(envelope_cases::check(case, &bytes));
    }
    let bytes = fixture(dir, &manifest_path, &dedup_key.envelope_file)?;
    report.push(idempotency::check_dedup_key(&dedup_key, &bytes));
    for sequence in &sequences.cases {
        report.push(idempotency::run_sequence(sequence));
    }
    let redis = manifest.redis.as_ref();
    if let Some(block) = redis.and_then(|b| b.payload_identity.as_ref()) {
        let bytes = fixture(dir, &manifest_path, &block.envelope_file)?;
        report.push_binding("redis", bindings::redis_payload_identity(block, &bytes));
    }
    let rabbitmq = manifest.rabbitmq.as_ref();
    if let Some(block) = rabbitmq.and_then(|b| b.property_projection.as_ref()) {
        let bytes = fixture(dir, &manifest_path, &block.envelope_file)?;
        let outcome = bindings::rabbitmq_property_projection(block, &bytes);
        report.push_binding("rabbitmq", outcome);
    }
    if let Some(block) = manifest.kafka.as_ref() {
        if let Some(projection) = block.property_projection.as_ref() {
            let bytes = fixture(dir, &manifest_path, &projection.envelope_file)?;
            let outcome = bindings::kafka_property_projection(projection, &bytes);
            report.push_binding("kafka", outcome);
        }
        for case in block.attempts_reconciliation.iter().flat_map(|b| &b.cases) {
            report.push_binding("kafka", bindings::kafka_attempts_reconciliation(case));
        }
    }
    if let Some(block) = manifest.payload_schema.as_ref() {
        for outcome in payload_schema::check(block) {
            report.push(outcome);
        }
    }
    for block in bindings::other_blocks(&manifest.rest) {
        let why = bindings::NOT_IMPLEMENTED
            .iter()
            .find(|(name, _)| *name == block)
            .map_or("a block this runner does not know", |(_, why)| why);
        report.not_applicable(block, why);
    }
    Ok(report)
}

fn read(path: &Path) -> Result<Vec<u8>, ConformanceError> {
    std::fs::read(path).map_err(|source| ConformanceError::Read {
        path: path.to_owned(),
        source,
    })
}

/// Reads a fixture the manifest names, refusing paths that leave the folder.
fn fixture(dir: &Path, manifest: &Path, file: &str) -> Result<Vec<u8>, ConformanceError> {
    let relative = Path::new(file);
    let inside = relative
        .components()
        .all(|part| matches!(part, Component::Normal(_) | Component::CurDir));
    if file.is_empty() || !inside {
        return Err(ConformanceError::FixtureOutsideFolder {
            manifest: manifest.to_owned(),
            file: file.to_owned(),
        });
    }
    read(&dir.join(relative))
}
