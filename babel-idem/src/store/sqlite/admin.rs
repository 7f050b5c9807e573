//! Admin operations of [`SqliteStore`], for operators and the `babel-idem`
//! CLI: open without creating, check the table, stats, batched lookups and
//! forgets, counting and purging expired marks in batches.
//!
//! Each is one statement (a batch of ids is split into statements of at
//! most [`MAX_BATCH`] ids), by the database clock like the store's own.

use std::collections::HashSet;
use std::path::Path;

use sqlx::sqlite::SqlitePoolOptions;

use super::{BACKEND, NOW_MS, SqliteStore, SqliteStoreBuilder};
use crate::store::{StoreError, StoreOperation, StoreStats, failed};

/// The most ids one statement binds: far under SQLite's parameter limit
/// (32,766 since 3.32, 999 before).
const MAX_BATCH: usize = 500;

/// `?1, ?2, ... ?n`.
fn placeholders(n: usize) -> String {
    (1..=n)
        .map(|i| format!("?{i}"))
        .collect::<Vec<_>>()
        .join(", ")
}

impl SqliteStoreBuilder {
    /// Opens the database file at `path` as it is: unlike
    /// [`open`](Self::open), a missing file is not created and the table is
    /// not migrated, so an operator's typo does not leave an empty database
    /// behind. Nothing is read until the first operation; check with
    /// [`SqliteStore::table_exists`].
    ///
    /// ```
    /// use babel_idem::store::SqliteStore;
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// # let dir = std::env::temp_dir().join(format!("babel-idem-doc-existing-{}", std::process::id()));
    /// # std::fs::create_dir_all(&dir).unwrap();
    /// let path = dir.join("seen.db");
    /// SqliteStore::open(&path).await?; // creates the file and the table
    /// let store = SqliteStore::builder().open_existing(&path)?;
    /// assert!(store.table_exists().await?);
    ///
    /// let missing = SqliteStore::builder().open_existing(dir.join("typo.db"))?;
    /// assert!(missing.table_exists().await.is_err(), "no file is created");
    /// assert!(!dir.join("typo.db").exists());
    /// # std::fs::remove_dir_all(&dir).unwrap();
    /// # Ok::<(), babel_idem::StoreError>(())
    /// # }).unwrap();
    /// ```
    pub fn open_existing(self, path: impl AsRef<Path>) -> Result<SqliteStore, StoreError> {
        let settings = self.checked()?;
        let options = self.file_options(path, false);
        let pool = SqlitePoolOptions::new()
            .max_connections(self.max_connections)
            .connect_lazy_with(options);
        Ok(SqliteStore::assemble(pool, settings))
    }
}

/// # Admin operations
///
/// | operation | statement |
/// |---|---|
/// | [`table_exists`](Self::table_exists) | `SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1)` |
/// | [`stats`](Self::stats) | `SELECT COUNT(*), COUNT(<expired>), MIN(created_at), MAX(created_at) ... WHERE substr(message_id, 1, length(?1)) = ?1` |
/// | [`stored_many`](Self::stored_many) | `SELECT message_id ... WHERE message_id IN (?1, ...)` |
/// | [`forget_many`](Self::forget_many) | `DELETE ... WHERE message_id IN (?1, ...)` |
/// | [`count_expired`](Self::count_expired) | `SELECT COUNT(*) ... WHERE expires_at <= <now>` |
/// | [`purge_expired_batch`](Self::purge_expired_batch) | `DELETE ... WHERE message_id IN (SELECT message_id ... WHERE expires_at <= <now> LIMIT ?1)` |
impl SqliteStore {
    /// Whether the store's table is there (a database that was never
    /// migrated has none). Fails when the database cannot be opened.
    ///
    /// ```
    /// use babel_idem::store::SqliteStore;
    /// use sqlx::sqlite::SqlitePoolOptions;
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// let pool = SqlitePoolOptions::new().max_connections(1).connect("sqlite::memory:").await.unwrap();
    /// let store = SqliteStore::from_pool(pool)?;
    /// assert!(!store.table_exists().await?);
    /// store.migrate().await?;
    /// assert!(store.table_exists().await?);
    /// # Ok::<(), babel_idem::StoreError>(())
    /// # }).unwrap();
    /// ```
    pub async fn table_exists(&self) -> Result<bool, StoreError> {
        sqlx::query_scalar::<_, bool>(
            "SELECT EXISTS (SELECT 1 FROM sqlite_master
                 WHERE type = 'table' AND name = ?1 COLLATE NOCASE)",
        )
        .bind(&self.settings.table)
        .fetch_one(&self.pool)
        .await
        .map_err(failed(BACKEND, StoreOperation::Open))
    }

    /// Counts the marks whose key starts with `key_prefix` (`""`: all of
    /// them; a [`Guard::scope`](crate::guard::Guard::scope)'s keys start with
    /// `<length>:<scope>:`), how many have expired, and when the oldest and
    /// newest were written.
    ///
    /// ```
    /// use babel_idem::Store;
    /// use babel_idem::store::SqliteStore;
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// let store = SqliteStore::in_memory().await?;
    /// store.remember("id-A").await?;
    /// store.remember("7:billing:id-B").await?;
    /// let all = store.stats("").await?;
    /// assert_eq!((all.marks, all.expired), (2, 0));
    /// assert!(all.oldest_ms <= all.newest_ms);
    /// assert_eq!(store.stats("7:billing:").await?.marks, 1);
    /// # Ok::<(), babel_idem::StoreError>(())
    /// # }).unwrap();
    /// ```
    pub async fn stats(&self, key_prefix: &str) -> Result<StoreStats, StoreError> {
        let table = &self.settings.table;
        let (marks, expired, oldest_ms, newest_ms) =
            sqlx::query_as::<_, (i64, i64, Option<i64>, Option<i64>)>(&format!(
                "SELECT COUNT(*),
                        COUNT(CASE WHEN expires_at IS NOT NULL AND expires_at <= {NOW_MS} THEN 1 END),
                        MIN(created_at), MAX(created_at)
                 FROM {table} WHERE substr(message_id, 1, length(?1)) = ?1"
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
    /// [`forget_many`](Self::forget_many) would delete.
    ///
    /// ```
    /// use babel_idem::Store;
    /// use babel_idem::store::SqliteStore;
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// let store = SqliteStore::in_memory().await?;
    /// store.remember("id-A").await?;
    /// assert_eq!(store.stored_many(&["id-A", "id-B"]).await?, [true, false]);
    /// # Ok::<(), babel_idem::StoreError>(())
    /// # }).unwrap();
    /// ```
    pub async fn stored_many(&self, keys: &[&str]) -> Result<Vec<bool>, StoreError> {
        let table = &self.settings.table;
        let mut stored = HashSet::new();
        for batch in keys.chunks(MAX_BATCH) {
            let sql = format!(
                "SELECT message_id FROM {table} WHERE message_id IN ({})",
                placeholders(batch.len())
            );
            let mut query = sqlx::query_scalar::<_, String>(&sql);
            for key in batch {
                query = query.bind(*key);
            }
            let found = query
                .fetch_all(&self.pool)
                .await
                .map_err(failed(BACKEND, StoreOperation::Seen))?;
            stored.extend(found);
        }
        Ok(keys.iter().map(|key| stored.contains(*key)).collect())
    }

    /// Forgets every key in `keys`, 500 to a statement, and returns
    /// how many rows went (unknown keys are not an error, as with
    /// [`forget`](crate::store::Store::forget)).
    ///
    /// ```
    /// use babel_idem::Store;
    /// use babel_idem::store::SqliteStore;
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// let store = SqliteStore::in_memory().await?;
    /// store.remember("id-A").await?;
    /// store.remember("id-B").await?;
    /// assert_eq!(store.forget_many(&["id-A", "id-B", "id-C"]).await?, 2);
    /// assert!(!store.seen("id-A").await?);
    /// # Ok::<(), babel_idem::StoreError>(())
    /// # }).unwrap();
    /// ```
    pub async fn forget_many(&self, keys: &[&str]) -> Result<u64, StoreError> {
        let table = &self.settings.table;
        let mut removed = 0;
        for batch in keys.chunks(MAX_BATCH) {
            let sql = format!(
                "DELETE FROM {table} WHERE message_id IN ({})",
                placeholders(batch.len())
            );
            let mut query = sqlx::query(&sql);
            for key in batch {
                query = query.bind(*key);
            }
            let done = query
                .execute(&self.pool)
                .await
                .map_err(failed(BACKEND, StoreOperation::Forget))?;
            removed += done.rows_affected();
        }
        Ok(removed)
    }

    /// How many rows have expired: what [`purge_expired`](Self::purge_expired)
    /// would delete now.
    ///
    /// ```
    /// use babel_idem::store::SqliteStore;
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// let store = SqliteStore::in_memory().await?;
    /// assert_eq!(store.count_expired().await?, 0);
    /// # Ok::<(), babel_idem::StoreError>(())
    /// # }).unwrap();
    /// ```
    pub async fn count_expired(&self) -> Result<u64, StoreError> {
        let table = &self.settings.table;
        let count = sqlx::query_scalar::<_, i64>(&format!(
            "SELECT COUNT(*) FROM {table} WHERE expires_at IS NOT NULL AND expires_at <= {NOW_MS}"
        ))
        .fetch_one(&self.pool)
        .await
        .map_err(failed(BACKEND, StoreOperation::Maintenance))?;
        Ok(count.max(0) as u64)
    }

    /// Deletes at most `limit` expired rows and returns how many went: a
    /// purge in short write transactions (call it until it returns 0), so
    /// consumers writing to the file wait for one batch, not the whole purge.
    ///
    /// ```
    /// use babel_idem::store::SqliteStore;
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// let store = SqliteStore::in_memory().await?;
    /// while store.purge_expired_batch(10_000).await? > 0 {}
    /// # Ok::<(), babel_idem::StoreError>(())
    /// # }).unwrap();
    /// ```
    pub async fn purge_expired_batch(&self, limit: u32) -> Result<u64, StoreError> {
        let table = &self.settings.table;
        let done = sqlx::query(&format!(
            "DELETE FROM {table} WHERE message_id IN (
                 SELECT message_id FROM {table}
                 WHERE expires_at IS NOT NULL AND expires_at <= {NOW_MS} LIMIT ?1)"
        ))
        .bind(i64::from(limit))
        .execute(&self.pool)
        .await
        .map_err(failed(BACKEND, StoreOperation::Maintenance))?;
        Ok(done.rows_affected())
    }
}
