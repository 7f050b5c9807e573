//! What the batch operations of every backend share: the default loops of
//! [`Store::seen_many`] / [`Store::remember_many`] and of
//! [`ClaimStore::claim_many`] / [`ClaimStore::commit_many`], and turning the
//! ids a SQL store found into answers in the batch's order.

#[cfg(any(feature = "sqlite", feature = "postgres"))]
use std::collections::HashSet;
use std::time::Duration;

use super::claim::{Claim, ClaimStore, ClaimToken};
use super::{Store, StoreError};

/// The default [`Store::seen_many`]: one [`Store::seen`] per id, in order.
pub(super) async fn seen_each<S: Store + ?Sized>(
    store: &S,
    ids: &[&str],
) -> Result<Vec<bool>, StoreError> {
    let mut answers = Vec::with_capacity(ids.len());
    for id in ids {
        answers.push(store.seen(id).await?);
    }
    Ok(answers)
}

/// The default [`Store::remember_many`]: one [`Store::remember`] per id.
pub(super) async fn remember_each<S: Store + ?Sized>(
    store: &S,
    ids: &[&str],
) -> Result<(), StoreError> {
    for id in ids {
        store.remember(id).await?;
    }
    Ok(())
}

/// The default [`ClaimStore::claim_many`]: one claim per entry, in order.
pub(crate) async fn claim_each<S: ClaimStore + ?Sized>(
    store: &S,
    claims: &[(&str, ClaimToken)],
    lease: Duration,
) -> Result<Vec<Claim>, StoreError> {
    let mut answers = Vec::with_capacity(claims.len());
    for &(id, owner) in claims {
        answers.push(store.claim(id, owner, lease).await?);
    }
    Ok(answers)
}

/// The default [`ClaimStore::commit_many`]: one commit per entry, in order.
pub(crate) async fn commit_each<S: ClaimStore + ?Sized>(
    store: &S,
    commits: &[(&str, ClaimToken)],
) -> Result<Vec<bool>, StoreError> {
    let mut answers = Vec::with_capacity(commits.len());
    for &(id, owner) in commits {
        answers.push(store.commit(id, owner).await?);
    }
    Ok(answers)
}

/// The answers to `seen_many(ids)` from the ids a query `found` live: `true`
/// where the id is among them, in the batch's order.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(super) fn answers(ids: &[&str], found: &[String]) -> Vec<bool> {
    let found: HashSet<&str> = found.iter().map(String::as_str).collect();
    ids.iter().map(|id| found.contains(id)).collect()
}

#[cfg(all(test, any(feature = "sqlite", feature = "postgres")))]
mod tests {
    use super::*;

    #[test]
    fn answers_follow_the_batch_order_and_repeat_for_repeated_ids() {
        let found = ["b".to_owned(), "a".to_owned()];
        assert_eq!(
            answers(&["a", "c", "b", "a"], &found),
            [true, false, true, true]
        );
        assert!(answers(&[], &found).is_empty());
    }
}
