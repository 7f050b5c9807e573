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
    drop_owned: String,
    release: String,
    renew: String,
}

impl ClaimStatements {
    pub(super) fn for_table(table: &str) -> Self {
        let claims = format!("{table}_claims");
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
            drop_owned: format!(
                "DELETE FROM {claims} WHERE message_id = ?1 AND owner = ?2
                     AND lease_until > {NOW_MS}"
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
/// | `commit` | one `BEGIN IMMEDIATE` transaction: delete the owner's live claim, then the seen-set's `remember` statement |
/// | `release` | `DELETE` the owner's claim row |
/// | `renew` | `UPDATE` the owner's live claim row |
///
/// SQLite has no data-modifying CTEs, so commit's two writes share one
/// transaction; it runs in-process under the database's single write lock.
/// A duplicate of a done id costs one read.
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
            let mut transaction = self
                .pool
                .begin_with("BEGIN IMMEDIATE")
                .await
                .map_err(failed(BACKEND, operation))?;
            let dropped = sqlx::query(&self.claims.drop_owned)
                .bind(id)
                .bind(owner.to_hex())
                .execute(&mut *transaction)
                .await
                .map_err(failed(BACKEND, operation))?;
            if dropped.rows_affected() == 0 {
                // Dropping the transaction rolls it back; it wrote nothing.
                return Ok(false);
            }
            sqlx::query(&self.settings.sql.remember)
                .bind(id)
                .bind(self.settings.ttl_ms)
                .execute(&mut *transaction)
                .await
                .map_err(failed(BACKEND, operation))?;
            transaction
                .commit()
                .await
                .map_err(failed(BACKEND, operation))?;
            Ok(true)
        })
    }

    fn release<'a>(&'a self, id: &'a str, owner: ClaimToken) -> StoreFuture<'a, bool> {
        StoreFuture::new(async move {
            let done = sqlx::query(&self.claims.release)
                .bind(id)
                .bind(owner.to_hex())
                .execute(&self.pool)
                .await
                .map_err(failed(BACKEND, StoreOperation::Release))?;
            Ok(done.rows_affected() == 1)
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
