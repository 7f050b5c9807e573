//! [`Admin`] for [`PostgresStore`], and what an operator's tool needs beside
//! it: check the table.
//!
//! Each operation is one statement, by the database clock like the store's
//! own. A batch of ids is bound as one `text[]` parameter.

use std::collections::HashSet;

use super::{BACKEND, PostgresStore, UnstorableId};
use crate::store::admin::{Admin, IdState, StoreStats};
use crate::store::settings::{
    run_count, run_purge, run_stats, sql_claims_table_exists, sql_expiry_admin,
};
use crate::store::{StoreError, StoreFuture, StoreOperation, failed};

/// # Admin operations
///
/// | operation | statement |
/// |---|---|
/// | `stats` | `SELECT count(*), count(*) FILTER (WHERE <expired>), min(created_at), max(created_at) ... WHERE left(message_id, length($1)) = $1`, then the retention: `SELECT expires_at - created_at ... ORDER BY created_at DESC LIMIT 1` |
/// | `states` | `SELECT message_id ... WHERE message_id = ANY($1) AND <live>`; with claim mode's table, the same for live leases |
/// | `forget_ids` | `DELETE ... WHERE message_id = ANY($1)` |
/// | `count_expired`, `purge_expired` | `SELECT count(*)`, `DELETE ... WHERE message_id IN (SELECT ... WHERE expires_at <= now() LIMIT $1 FOR UPDATE SKIP LOCKED)` |
/// | `count_finished_claims`, `purge_finished_claims` | the same over `<table>_claims`: lapsed leases and commits' tombstones, once a minute old |
///
/// A purge skips rows another transaction holds, so it never waits on a
/// consumer.
///
/// ```no_run
/// use babel_idem::store::{Admin, IdState, PostgresStore};
///
/// # async fn run() -> Result<(), babel_idem::StoreError> {
/// let store = PostgresStore::connect_lazy("postgres://app@db.internal/app")?;
/// if !store.table_exists().await? {
///     store.migrate().await?;
/// }
/// let stats = store.stats("").await?;
/// println!("{} marks, {} expired", stats.marks, stats.expired);
/// let states = store.states(&["id-A", "id-B"]).await?;
/// let done = states.iter().filter(|state| **state == IdState::Done).count();
/// let removed = store.forget_ids(&["id-A", "id-B"]).await?;
/// assert!(removed >= done as u64);
/// while store.purge_expired(10_000).await? == 10_000 {}
/// while store.purge_finished_claims(10_000).await? == 10_000 {}
/// # Ok(())
/// # }
/// ```
impl PostgresStore {
    sql_claims_table_exists!();

    /// Whether the store's table is there, on the connection's search
    /// path. Fails when the server cannot be reached or refuses the login:
    /// the first round trip an operator's tool makes.
    pub async fn table_exists(&self) -> Result<bool, StoreError> {
        self.has_table(&self.settings.table).await
    }

    async fn has_table(&self, name: &str) -> Result<bool, StoreError> {
        sqlx::query_scalar::<_, bool>("SELECT to_regclass($1) IS NOT NULL")
            .bind(name)
            .fetch_one(&self.pool)
            .await
            .map_err(failed(BACKEND, StoreOperation::Open))
    }

    /// The claim statements, once claim mode's table is there.
    async fn claims_made(&self) -> Result<Option<&super::claim::Statements>, StoreError> {
        let operation = StoreOperation::Maintenance;
        if !self.claims_table_exists().await? {
            return Ok(None);
        }
        self.claims.ready(operation).map(Some)
    }

    /// The ids of `ids` that `sql` (over a `text[]`) answers.
    async fn found(&self, sql: &str, ids: &[&str]) -> Result<HashSet<String>, StoreError> {
        let found = sqlx::query_scalar::<_, String>(sql)
            .bind(ids)
            .fetch_all(&self.pool)
            .await
            .map_err(failed(BACKEND, StoreOperation::Seen))?;
        Ok(found.into_iter().collect())
    }
}

impl Admin for PostgresStore {
    fn stats<'a>(&'a self, key_prefix: &'a str) -> StoreFuture<'a, StoreStats> {
        StoreFuture::new(async move {
            UnstorableId::check(key_prefix)
                .map_err(failed(BACKEND, StoreOperation::Maintenance))?;
            run_stats(&self.pool, BACKEND, &self.settings.sql, key_prefix).await
        })
    }

    /// An id PostgreSQL cannot hold (NUL) is absent.
    fn states<'a>(&'a self, ids: &'a [&'a str]) -> StoreFuture<'a, Vec<IdState>> {
        StoreFuture::new(async move {
            let storable = storable(ids);
            let done = self.found(&self.batch.seen, &storable).await?;
            let claimed = match self.claims_made().await? {
                Some(statements) => self.found(&statements.claimed, &storable).await?,
                None => HashSet::new(),
            };
            Ok(ids
                .iter()
                .map(|id| {
                    if done.contains(*id) {
                        IdState::Done
                    } else if claimed.contains(*id) {
                        IdState::Claimed
                    } else {
                        IdState::Absent
                    }
                })
                .collect())
        })
    }

    fn forget_ids<'a>(&'a self, ids: &'a [&'a str]) -> StoreFuture<'a, u64> {
        StoreFuture::new(async move {
            let table = &self.settings.table;
            let done = sqlx::query(&format!(
                "DELETE FROM {table} WHERE message_id = ANY($1::text[])"
            ))
            .bind(storable(ids))
            .execute(&self.pool)
            .await
            .map_err(failed(BACKEND, StoreOperation::Forget))?;
            Ok(done.rows_affected())
        })
    }

    sql_expiry_admin!();

    fn count_finished_claims(&self) -> StoreFuture<'_, u64> {
        StoreFuture::new(async move {
            match self.claims_made().await? {
                Some(statements) => {
                    run_count(&self.pool, BACKEND, &statements.count_finished).await
                }
                None => Ok(0),
            }
        })
    }

    fn purge_finished_claims(&self, limit: u32) -> StoreFuture<'_, u64> {
        StoreFuture::new(async move {
            match self.claims_made().await? {
                Some(statements) => {
                    run_purge(&self.pool, BACKEND, &statements.purge_finished, limit).await
                }
                None => Ok(0),
            }
        })
    }
}

/// The ids a PostgreSQL `TEXT` can hold: one with a NUL is never stored,
/// and binding it would fail the whole batch.
fn storable<'a>(ids: &[&'a str]) -> Vec<&'a str> {
    ids.iter()
        .copied()
        .filter(|id| UnstorableId::check(id).is_ok())
        .collect()
}
