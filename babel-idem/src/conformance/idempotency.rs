//! The `idempotency` block: the dedupe key, and the delivery sequences driven
//! through one [`wrap`]ped handler over one [`InMemoryStore`].

use std::cell::Cell;

use serde_json::{Map, Value, json};

use super::block_on::block_on;
use super::manifest::{DedupKey, Delivery, Effect, Outcome, Sequence};
use super::report::{Block, CaseOutcome};
use crate::envelope::Envelope;
use crate::guard::wrap;
use crate::message::MessageId;
use crate::store::{InMemoryStore, Store, StoreError};

/// The trace every envelope of a sequence shares. One trace for all of them
/// is deliberate: distinct ids in one causal chain must still run each.
const SEQUENCE_TRACE_ID: &str = "0c6f3d8e-2b1a-4e5f-9a7b-3c2d1e0f9a8b";

/// What the conformance handler returns: a deliberate failure (`outcome:
/// throw`), or a store error the guard passed through.
#[derive(Debug)]
enum HandlerError {
    Thrown,
    Store(StoreError),
}

impl From<StoreError> for HandlerError {
    fn from(error: StoreError) -> Self {
        HandlerError::Store(error)
    }
}

/// `idempotency.dedup_key`: the key is `meta.id` verbatim and never
/// `trace_id`, checked both on the value and on what a guard does with it.
pub(super) fn check_dedup_key(dedup: &DedupKey, bytes: &[u8]) -> CaseOutcome {
    const NAME: &str = "dedup_key";
    if dedup.key_field != "meta.id" {
        return CaseOutcome::fail(
            Block::DedupKey,
            NAME,
            format!(
                "the manifest keys on `{}`; babel-idem keys on `meta.id`",
                dedup.key_field
            ),
        );
    }
    let envelope = match Envelope::from_slice(bytes) {
        Ok(envelope) => envelope,
        Err(error) => {
            return CaseOutcome::fail(
                Block::DedupKey,
                NAME,
                format!("{} is rejected: {error}", dedup.envelope_file),
            );
        }
    };

    let mut problems = Vec::new();
    let expected = dedup.expected_key.as_str();
    if envelope.message_id() != Some(expected) {
        problems.push(format!(
            "message_id() is {:?}, expected {expected:?}",
            envelope.message_id()
        ));
    }
    if envelope.message_id() == Some(envelope.trace_id.as_str()) {
        problems.push("message_id() is the trace_id".to_owned());
    }
    let guard_key = crate::guard::Guard::new(InMemoryStore::new()).key(&envelope);
    if guard_key.as_str() != Some(expected) {
        problems.push(format!(
            "the guard keys on {:?}, expected {expected:?}",
            guard_key.as_str()
        ));
    }
    problems.extend(same_trace_problem(&envelope));
    CaseOutcome::from_problems(Block::DedupKey, NAME, problems)
}

/// Delivers the envelope twice, then a copy with the same `trace_id` and a
/// new `meta.id`: the redelivery dedupes, the new message runs.
fn same_trace_problem(envelope: &Envelope) -> Option<String> {
    let runs = Cell::new(0u32);
    let handler = wrap(InMemoryStore::new(), |_: Envelope| async {
        runs.set(runs.get() + 1);
        Ok::<(), HandlerError>(())
    });
    let sibling_id = format!("{}-sibling", envelope.message_id().unwrap_or("none"));
    let sibling = envelope.clone().with_id(sibling_id);
    for delivery in [envelope.clone(), envelope.clone(), sibling] {
        if let Err(error) = block_on(handler.call(delivery)) {
            return Some(format!("a delivery failed: {error:?}"));
        }
    }
    (runs.get() != 2).then(|| {
        format!(
            "a redelivery plus a same-trace message with a new meta.id ran {} times, expected 2",
            runs.get()
        )
    })
}

/// Replays one sequence: one store, one wrapped handler, every delivery in
/// order, then the count of effects.
pub(super) fn run_sequence(sequence: &Sequence) -> CaseOutcome {
    let store = InMemoryStore::new();
    // Every invocation is an effect, a throwing one too: the side effect
    // fires before the handler fails (upstream `throw-leaves-id-unmarked`
    // counts three effects for two throws and a success).
    let effects = Cell::new(0u64);
    let next_outcome = Cell::new(Outcome::Ok);
    let handler = wrap(&store, |_: Envelope| {
        // `call` makes the future right before its decision, after the
        // delivery loop below set this delivery's outcome.
        let outcome = next_outcome.get();
        let effects = &effects;
        async move {
            effects.set(effects.get() + 1);
            match outcome {
                Outcome::Ok => Ok(()),
                Outcome::Throw => Err(HandlerError::Thrown),
            }
        }
    });

    let mut problems = Vec::new();
    for (index, delivery) in sequence.deliveries.iter().enumerate() {
        let label = format!(
            "delivery {} (meta_id {})",
            index + 1,
            describe_id(&delivery.meta_id)
        );
        let envelope = match Envelope::from_value(delivery_envelope(index, delivery)) {
            Ok(envelope) => envelope,
            Err(error) => {
                problems.push(format!(
                    "{label}: the runner's envelope is rejected: {error}"
                ));
                continue;
            }
        };
        if delivery.forget_before {
            // Forget exactly what the guard remembers for this message.
            if let Some(key) = handler.guard().key(&envelope).as_str()
                && let Err(error) = block_on(store.forget(key))
            {
                problems.push(format!("{label}: forget failed: {error}"));
            }
        }

        let outcome = delivery.outcome.unwrap_or(Outcome::Ok);
        next_outcome.set(outcome);
        let before = effects.get();
        let result = block_on(handler.call(envelope));
        let runs = effects.get() - before;
        if let Some(problem) = delivery_problem(delivery.expect_effect, outcome, runs, &result) {
            problems.push(format!("{label}: {problem}"));
        }
    }

    if effects.get() != sequence.expected_effects {
        problems.push(format!(
            "{} effects, expected {}",
            effects.get(),
            sequence.expected_effects
        ));
    }
    CaseOutcome::from_problems(Block::Sequence, &sequence.name, problems)
}

/// What went wrong with one delivery, if anything: the handler must run
/// exactly once for `run` and not at all for `skip`, and the guard must pass
/// a thrown error through and ack everything else.
fn delivery_problem(
    expected: Effect,
    outcome: Outcome,
    runs: u64,
    result: &Result<(), HandlerError>,
) -> Option<String> {
    if let Err(HandlerError::Store(error)) = result {
        return Some(format!("the store failed: {error}"));
    }
    match (expected, runs) {
        (Effect::Run, 0) => return Some("expected run, but the handler was skipped".to_owned()),
        (Effect::Skip, 1..) => return Some("expected skip, but the handler ran".to_owned()),
        (Effect::Run, 2..) => return Some(format!("the handler ran {runs} times")),
        _ => {}
    }
    match (runs, outcome, result) {
        (1, Outcome::Throw, Ok(())) => {
            Some("the handler threw, but the guard returned Ok".to_owned())
        }
        (0, _, Err(_)) => Some("skipped, but the guard returned an error".to_owned()),
        (1, Outcome::Ok, Err(_)) => {
            Some("the handler succeeded, but the guard returned an error".to_owned())
        }
        _ => None,
    }
}

/// The wire envelope of one delivery, built as JSON so the sequence goes
/// through the decoder like a real delivery, `meta.id` exactly as the
/// manifest states it: absent, `null`, empty or an id.
fn delivery_envelope(index: usize, delivery: &Delivery) -> Value {
    let mut meta = Map::new();
    match &delivery.meta_id {
        None => {}
        Some(None) => {
            meta.insert("id".to_owned(), Value::Null);
        }
        Some(Some(id)) => {
            meta.insert("id".to_owned(), Value::from(id.as_str()));
        }
    }
    meta.insert("queue".to_owned(), json!("conformance"));
    meta.insert("lang".to_owned(), json!(crate::envelope::LANG));
    meta.insert(
        "schema_version".to_owned(),
        json!(crate::envelope::SCHEMA_VERSION),
    );
    meta.insert("created_at".to_owned(), json!(1_749_132_727_000u64));
    json!({
        "job": "urn:babel:conformance:delivered",
        "trace_id": SEQUENCE_TRACE_ID,
        "data": { "delivery": index + 1 },
        "meta": meta,
        "attempts": 0,
    })
}

fn describe_id(meta_id: &Option<Option<String>>) -> String {
    match meta_id {
        None => "absent".to_owned(),
        Some(None) => "null".to_owned(),
        Some(Some(id)) => format!("{id:?}"),
    }
}
