//! [`ClaimStore`] for [`SqliteStore`]: claims in a table beside the
//! seen-set table (`claims.sql`).

use std::time::Duration;

use super::{BACKEND, NOW_MS, SqliteStore};
use crate::store::claim::{Claim, ClaimStore, ClaimToken, server_lease_ms};
use crate::store::settings::DEFAULT_TABLE;
use crate::store::{StoreFuture, StoreOperation, failed};

/// The claims DDL, for the default table names.
const DDL: &str = include_str!("claims.sql");

/// The claim statements for one seen-set table, written out once.
#[derive(Debug, Clone)]
pub(super) struct ClaimStatements {
    pub(super) create: String,
    look: String,
    take: String,
    mark: String,
    release: String,
    renew: String,
}

impl ClaimStatements {
    pub(super) fn for_table(table: &str) -> Self {
        let claims = format!("{table}_claims");
        let expired =
            format!("{table}.expires_at IS NOT NULL AND {table}.expires_at <= excluded.created_at");
        ClaimStatements {
            // The DDL names the default seen-set table only inside the
            // names of the claims table, its counter and triggers.
            create: DDL.replace(DEFAULT_TABLE, table),
            // Whether the id is done, and how long a claim on it has left.
            look: format!(
                "SELECT EXISTS (SELECT 1 FROM {table} WHERE message_id = ?1
                            AND (expires_at IS NULL OR expires_at > {NOW_MS})),
                        (SELECT lease_until - {NOW_MS} FROM {claims} WHERE message_id = ?1)"
            ),
            // The decision: SQLite runs a writing statement under its write
            // lock on the newest data, so this wins only when the id is not
            // done and nobody holds a live lease. The fence is the store's
            // counter plus one; the triggers move the counter along.
            take: format!(
                "INSERT INTO {claims} (message_id, owner, fence, lease_until)
                 SELECT ?1, ?2, last + 1, {NOW_MS} + ?3 FROM {claims}_fence
                 WHERE counter = 1 AND NOT EXISTS (
                     SELECT 1 FROM {table} WHERE message_id = ?1
                         AND (expires_at IS NULL OR expires_at > {NOW_MS}))
                 ON CONFLICT (message_id) DO UPDATE
                     SET owner = excluded.owner, fence = excluded.fence,
                         lease_until = excluded.lease_until
                     WHERE {claims}.lease_until <= {NOW_MS}
                 RETURNING fence"
            ),
            // Commit's decision, one statement under the write lock: while
            // the owner's lease is live, mark the id done as `remember` does
            // (an expired row is taken over, a live one keeps its expiry and
            // is written back unchanged), answering a row exactly then.
            mark: format!(
                "INSERT INTO {table} (message_id, created_at, expires_at)
                 SELECT ?1, {NOW_MS}, {NOW_MS} + ?3
                 WHERE EXISTS (SELECT 1 FROM {claims} WHERE message_id = ?1 AND owner = ?2
                                   AND lease_until > {NOW_MS})
                 ON CONFLICT (message_id) DO UPDATE
                     SET created_at = iif({expired}, excluded.created_at, {table}.created_at),
                         expires_at = iif({expired}, excluded.expires_at, {table}.expires_at)
                 RETURNING 1"
            ),
            release: format!("DELETE FROM {claims} WHERE message_id = ?1 AND owner = ?2"),
            renew: format!(
                "UPDATE {claims} SET lease_until = {NOW_MS} + ?3
                 WHERE message_id = ?1 AND owner = ?2 AND lease_until > {NOW_MS}"
            ),
        }
    }
}

/// # Claim mode
///
/// Claims live in `<table>_claims` (`babelqueue_idempotency_claims`), beside
/// the seen-set table, with a one-row counter for the fences;
/// [`migrate`](SqliteStore::migrate) (so [`open`](SqliteStore::open) too)
/// creates them:
///
/// ```sql
#[doc = include_str!("claims.sql")]
/// ```
///
/// | operation | statements |
/// |---|---|
/// | `claim` | a read (done? a live lease?); only when the id looks free, one `INSERT ... ON CONFLICT DO UPDATE ... RETURNING fence` decides |
/// | `commit` | one `INSERT ... SELECT ... WHERE` the owner's lease is live decides and marks the id done; the table's triggers drop the claim row in that statement |
/// | `release` | `DELETE` the owner's claim row |
/// | `renew` | `UPDATE` the owner's live claim row |
///
/// Each statement runs alone under the database's single write lock, which
/// it holds only while it runs (a transaction over several statements would
/// hold it across their round trips to sqlx's worker thread, and every other
/// writer would wait). Marking an id done, by commit or by `remember`,
/// drops its claim row (the triggers above), so a first delivery writes
/// twice (claim, commit) and a duplicate of a done id costs one read.
impl ClaimStore for SqliteStore {
    fn claim<'a>(
        &'a self,
        id: &'a str,
        owner: ClaimToken,
        lease: Duration,
    ) -> StoreFuture<'a, Claim> {
        StoreFuture::new(async move {
            let operation = StoreOperation::Claim;
            let lease_ms = server_lease_ms(BACKEND, operation, lease)?;
            let (done, left_ms) = sqlx::query_as::<_, (bool, Option<i64>)>(&self.claims.look)
                .bind(id)
                .fetch_one(&self.pool)
                .await
                .map_err(failed(BACKEND, operation))?;
            let held = |left_ms: Option<i64>| Claim::Held {
                retry_after: left_ms
                    .and_then(|ms| u64::try_from(ms).ok())
                    .map(Duration::from_millis),
            };
            match (done, left_ms) {
                (true, _) => return Ok(Claim::Done),
                (false, Some(ms)) if ms > 0 => return Ok(held(Some(ms))),
                _ => {}
            }
            let fence: Option<i64> = sqlx::query_scalar(&self.claims.take)
                .bind(id)
                .bind(owner.to_hex())
                .bind(lease_ms)
                .fetch_optional(&self.pool)
                .await
                .map_err(failed(BACKEND, operation))?;
            // Lost a race since the read: another worker claimed (or
            // finished) the id; its next delivery sees which.
            Ok(fence.map_or(held(None), |fence| Claim::Won {
                fence: fence.unsigned_abs(),
            }))
        })
    }

    fn commit<'a>(&'a self, id: &'a str, owner: ClaimToken) -> StoreFuture<'a, bool> {
        StoreFuture::new(async move {
            let operation = StoreOperation::Commit;
            let marked = sqlx::query(&self.claims.mark)
                .bind(id)
                .bind(owner.to_hex())
                .bind(self.settings.ttl_ms)
                .fetch_optional(&self.pool)
                .await
                .map_err(failed(BACKEND, operation))?;
            // The row's triggers dropped the claim in the same statement.
            Ok(marked.is_some())
        })
    }

    fn release<'a>(&'a self, id: &'a str, owner: ClaimToken) -> StoreFuture<'a, bool> {
        StoreFuture::new(async move {
            let dropped = sqlx::query(&self.claims.release)
                .bind(id)
                .bind(owner.to_hex())
                .execute(&self.pool)
                .await
                .map_err(failed(BACKEND, StoreOperation::Release))?;
            Ok(dropped.rows_affected() == 1)
        })
    }

    fn renew<'a>(
        &'a self,
        id: &'a str,
        owner: ClaimToken,
        lease: Duration,
    ) -> StoreFuture<'a, bool> {
        StoreFuture::new(async move {
            let operation = StoreOperation::Renew;
            let lease_ms = server_lease_ms(BACKEND, operation, lease)?;
            let done = sqlx::query(&self.claims.renew)
                .bind(id)
                .bind(owner.to_hex())
                .bind(lease_ms)
                .execute(&self.pool)
                .await
                .map_err(failed(BACKEND, operation))?;
            Ok(done.rows_affected() == 1)
        })
    }
}
