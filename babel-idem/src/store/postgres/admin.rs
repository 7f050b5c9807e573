//! Admin operations of [`PostgresStore`], for operators and the
//! `babel-idem` CLI: check the table, stats, batched lookups and forgets,
//! counting and purging expired marks in batches.
//!
//! Each is one statement, by the database clock like the store's own. A
//! batch of ids is bound as one `text[]` parameter.

use std::collections::HashSet;

use super::{BACKEND, PostgresStore, UnstorableId};
use crate::store::{StoreError, StoreOperation, StoreStats, failed};

/// # Admin operations
///
/// | operation | statement |
/// |---|---|
/// | [`table_exists`](Self::table_exists) | `SELECT to_regclass($1) IS NOT NULL` |
/// | [`stats`](Self::stats) | `SELECT count(*), count(*) FILTER (WHERE <expired>), min(created_at), max(created_at) ... WHERE left(message_id, length($1)) = $1` |
/// | [`stored_many`](Self::stored_many) | `SELECT message_id ... WHERE message_id = ANY($1)` |
/// | [`forget_many`](Self::forget_many) | `DELETE ... WHERE message_id = ANY($1)` |
/// | [`count_expired`](Self::count_expired) | `SELECT count(*) ... WHERE expires_at <= now()` |
/// | [`purge_expired_batch`](Self::purge_expired_batch) | `DELETE ... WHERE message_id IN (SELECT message_id ... WHERE expires_at <= now() LIMIT $1 FOR UPDATE SKIP LOCKED)` |
///
/// ```no_run
/// use babel_idem::store::PostgresStore;
///
/// # async fn run() -> Result<(), babel_idem::StoreError> {
/// let store = PostgresStore::connect_lazy("postgres://app@db.internal/app")?;
/// if !store.table_exists().await? {
///     store.migrate().await?;
/// }
/// let stats = store.stats("").await?;
/// println!("{} marks, {} expired", stats.marks, stats.expired);
/// let stored = store.stored_many(&["id-A", "id-B"]).await?;
/// let removed = store.forget_many(&["id-A", "id-B"]).await?;
/// assert!(removed <= stored.len() as u64);
/// while store.purge_expired_batch(10_000).await? > 0 {}
/// # Ok(())
/// # }
/// ```
impl PostgresStore {
    /// Whether the store's table is there, on the connection's search
    /// path. Fails when the server cannot be reached or refuses the login:
    /// the first round trip an operator's tool makes.
    pub async fn table_exists(&self) -> Result<bool, StoreError> {
        sqlx::query_scalar::<_, bool>("SELECT to_regclass($1) IS NOT NULL")
            .bind(&self.settings.table)
            .fetch_one(&self.pool)
            .await
            .map_err(failed(BACKEND, StoreOperation::Open))
    }

    /// Counts the marks whose key starts with `key_prefix` (`""`: all of
    /// them; a [`Guard::scope`](crate::guard::Guard::scope)'s keys start with
    /// `<length>:<scope>:`), how many have expired, and when the oldest and
    /// newest were written (Unix milliseconds).
    pub async fn stats(&self, key_prefix: &str) -> Result<StoreStats, StoreError> {
        let table = &self.settings.table;
        UnstorableId::check(key_prefix).map_err(failed(BACKEND, StoreOperation::Maintenance))?;
        let (marks, expired, oldest_ms, newest_ms) =
            sqlx::query_as::<_, (i64, i64, Option<i64>, Option<i64>)>(&format!(
                "SELECT count(*),
                        count(*) FILTER (WHERE expires_at IS NOT NULL AND expires_at <= now()),
                        floor(extract(epoch FROM min(created_at)) * 1000)::bigint,
                        floor(extract(epoch FROM max(created_at)) * 1000)::bigint
                 FROM {table} WHERE left(message_id, length($1)) = $1"
            ))
            .bind(key_prefix)
            .fetch_one(&self.pool)
            .await
            .map_err(failed(BACKEND, StoreOperation::Maintenance))?;
        Ok(StoreStats {
            marks: marks.max(0) as u64,
            expired: expired.max(0) as u64,
            oldest_ms,
            newest_ms,
        })
    }

    /// For each key, whether a row is stored for it, live or expired: what
    /// [`forget_many`](Self::forget_many) would delete. A key PostgreSQL
    /// cannot hold (NUL) is not stored.
    pub async fn stored_many(&self, keys: &[&str]) -> Result<Vec<bool>, StoreError> {
        let table = &self.settings.table;
        let storable = storable(keys);
        let found = sqlx::query_scalar::<_, String>(&format!(
            "SELECT message_id FROM {table} WHERE message_id = ANY($1)"
        ))
        .bind(&storable)
        .fetch_all(&self.pool)
        .await
        .map_err(failed(BACKEND, StoreOperation::Seen))?;
        let found: HashSet<String> = found.into_iter().collect();
        Ok(keys.iter().map(|key| found.contains(*key)).collect())
    }

    /// Forgets every key in `keys` in one statement and returns how many
    /// rows went (unknown keys are not an error, as with
    /// [`forget`](crate::store::Store::forget)).
    pub async fn forget_many(&self, keys: &[&str]) -> Result<u64, StoreError> {
        let table = &self.settings.table;
        let done = sqlx::query(&format!("DELETE FROM {table} WHERE message_id = ANY($1)"))
            .bind(storable(keys))
            .execute(&self.pool)
            .await
            .map_err(failed(BACKEND, StoreOperation::Forget))?;
        Ok(done.rows_affected())
    }

    /// How many rows have expired: what [`purge_expired`](Self::purge_expired)
    /// would delete now.
    pub async fn count_expired(&self) -> Result<u64, StoreError> {
        let table = &self.settings.table;
        let count = sqlx::query_scalar::<_, i64>(&format!(
            "SELECT count(*) FROM {table} WHERE expires_at IS NOT NULL AND expires_at <= now()"
        ))
        .fetch_one(&self.pool)
        .await
        .map_err(failed(BACKEND, StoreOperation::Maintenance))?;
        Ok(count.max(0) as u64)
    }

    /// Deletes at most `limit` expired rows and returns how many went: a
    /// purge in short transactions (call it until it returns 0), skipping
    /// rows another transaction holds, so it never waits on a consumer.
    pub async fn purge_expired_batch(&self, limit: u32) -> Result<u64, StoreError> {
        let table = &self.settings.table;
        let done = sqlx::query(&format!(
            "DELETE FROM {table} WHERE message_id IN (
                 SELECT message_id FROM {table}
                 WHERE expires_at IS NOT NULL AND expires_at <= now()
                 LIMIT $1 FOR UPDATE SKIP LOCKED)"
        ))
        .bind(i64::from(limit))
        .execute(&self.pool)
        .await
        .map_err(failed(BACKEND, StoreOperation::Maintenance))?;
        Ok(done.rows_affected())
    }
}

/// The keys a PostgreSQL `TEXT` can hold: one with a NUL is never stored,
/// and binding it would fail the whole batch.
fn storable<'a>(keys: &[&'a str]) -> Vec<&'a str> {
    keys.iter()
        .copied()
        .filter(|key| UnstorableId::check(key).is_ok())
        .collect()
}
