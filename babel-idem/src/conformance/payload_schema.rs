//! The `payload_schema` block: each case's `data` checked against the
//! block's one schema with [`crate::schema`]; the verdict must equal the
//! case's `valid`, and a case that names the `violation` it expects must
//! report exactly that text.

use super::manifest::PayloadSchemaBlock;
use super::report::{Block, CaseOutcome};
use crate::schema::Schema;

/// One outcome per case of the block, in manifest order.
pub(super) fn check(block: &PayloadSchemaBlock) -> Vec<CaseOutcome> {
    let schema = Schema::from_json(block.schema.get());
    block
        .cases
        .iter()
        .map(|case| {
            let fail = |reason: String| CaseOutcome::fail(Block::PayloadSchema, &case.name, reason);
            let schema = match &schema {
                Ok(schema) => schema,
                Err(error) => return fail(format!("the block's schema is unusable: {error}")),
            };
            let verdict = match schema.check_json(case.data.get()) {
                Ok(verdict) => verdict,
                Err(error) => return fail(format!("the case's data is unusable: {error}")),
            };
            match (case.valid, verdict) {
                (true, Ok(())) => CaseOutcome::pass(Block::PayloadSchema, &case.name, None),
                (true, Err(violation)) => fail(format!("rejected valid data: {violation}")),
                (false, Ok(())) => fail("accepted data that must be rejected".to_owned()),
                (false, Err(violation)) => match &case.violation {
                    Some(expected) if *expected != violation.to_string() => fail(format!(
                        "rejected with {violation:?}, but the case expects {expected:?}",
                        violation = violation.to_string()
                    )),
                    _ => CaseOutcome::pass(
                        Block::PayloadSchema,
                        &case.name,
                        Some(format!("rejected: {violation}")),
                    ),
                },
            }
        })
        .collect()
}
