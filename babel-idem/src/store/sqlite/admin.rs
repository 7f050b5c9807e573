//! [`Admin`] for [`SqliteStore`], and what an operator's tool needs
//! beside it: open a file without creating it, check the table.
//!
//! Each operation is one statement (a batch of ids is split into statements
//! of at most [`MAX_BATCH`] ids), by the database clock like the store's own.

use std::path::Path;

use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};

use super::{BACKEND, SqliteStore, SqliteStoreBuilder, numbered};
use crate::store::admin::{Admin, IdState, StoreStats};
use crate::store::settings::{
    run_count, run_purge, run_stats, sql_claims_table_exists, sql_expiry_admin,
};
use crate::store::{Store, StoreError, StoreFuture, StoreOperation, failed};

/// The most ids one statement binds: far under SQLite's parameter limit
/// (32,766 since 3.32, 999 before).
const MAX_BATCH: usize = 500;

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
            .max_connections(self.sql.max_connections)
            .connect_lazy_with(options);
        Ok(SqliteStore::assemble(pool, settings))
    }

    /// A store over the existing database at `path`, opened read-only: no
    /// file is created, no migration runs and no setting is written (not
    /// even the journal mode), so a file the process may not write (a
    /// read-only mount, a copy kept for inspection) still answers `seen`,
    /// `states` and the counts. Every write fails with SQLite's
    /// `attempt to write a readonly database`.
    ///
    /// A database in WAL mode needs its shared-memory file beside it; where
    /// the folder cannot be written either, the file is read as immutable
    /// (SQLite then takes no lock: a writer elsewhere would not be seen).
    ///
    /// ```
    /// use babel_idem::Store;
    /// use babel_idem::store::SqliteStore;
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// # let dir = std::env::temp_dir().join(format!("babel-idem-doc-ro-{}", std::process::id()));
    /// # std::fs::create_dir_all(&dir).unwrap();
    /// let path = dir.join("seen.db");
    /// SqliteStore::open(&path).await?.remember("id-A").await?;
    /// let store = SqliteStore::builder().open_read_only(&path).await?;
    /// assert!(store.seen("id-A").await?);
    /// assert!(store.remember("id-B").await.is_err(), "read-only");
    /// # std::fs::remove_dir_all(&dir).unwrap();
    /// # Ok::<(), babel_idem::StoreError>(())
    /// # }).unwrap();
    /// ```
    pub async fn open_read_only(self, path: impl AsRef<Path>) -> Result<SqliteStore, StoreError> {
        let settings = self.checked()?;
        let options = SqliteConnectOptions::new()
            .filename(path)
            .read_only(true)
            .busy_timeout(self.busy_timeout);
        let pool_options = SqlitePoolOptions::new().max_connections(self.sql.max_connections);
        let opened = match pool_options.clone().connect_with(options.clone()).await {
            Ok(pool) => match sqlx::query("SELECT count(*) FROM sqlite_master")
                .execute(&pool)
                .await
            {
                Ok(_) => Ok(pool),
                Err(error) => Err(error),
            },
            Err(error) => Err(error),
        };
        let pool = match opened {
            Ok(pool) => pool,
            // SQLITE_READONLY_DIRECTORY: no shared-memory file can be made.
            Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some("1544") => {
                pool_options.connect_lazy_with(options.immutable(true))
            }
            Err(error) => return Err(failed(BACKEND, StoreOperation::Open)(error)),
        };
        Ok(SqliteStore::assemble(pool, settings))
    }
}

impl SqliteStore {
    sql_claims_table_exists!();

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
        self.has_table(&self.settings.table).await
    }

    async fn has_table(&self, name: &str) -> Result<bool, StoreError> {
        sqlx::query_scalar::<_, bool>(
            "SELECT EXISTS (SELECT 1 FROM sqlite_master
                 WHERE type = 'table' AND name = ?1 COLLATE NOCASE)",
        )
        .bind(name)
        .fetch_one(&self.pool)
        .await
        .map_err(failed(BACKEND, StoreOperation::Open))
    }
}

/// # Admin operations
///
/// | operation | statement |
/// |---|---|
/// | `stats` | `SELECT COUNT(*), COUNT(<expired>), MIN(created_at), MAX(created_at) ... WHERE substr(message_id, 1, length(?1)) = ?1`, then the retention: `SELECT expires_at - created_at ... ORDER BY created_at DESC LIMIT 1` |
/// | `states` | the live marks among the ids; with claim mode's table, one `SELECT ... UNION ALL SELECT` of marks and claims |
/// | `forget_ids` | `DELETE ... WHERE message_id IN (?1, ...)` |
/// | `count_expired`, `purge_expired` | `SELECT COUNT(*)`, `DELETE ... WHERE message_id IN (SELECT ... WHERE expires_at <= <now> LIMIT ?1)` |
/// | `count_finished_claims`, `purge_finished_claims` | the same over `<table>_claims`, for leases that lapsed (a commit or a release deletes its claim row) |
///
/// A purge batch holds the write lock for one statement, so consumers
/// writing to the file wait for one batch, never the whole purge.
///
/// ```
/// use babel_idem::Store;
/// use babel_idem::store::{Admin, Retention, SqliteStore};
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let store = SqliteStore::in_memory().await?;
/// store.remember("id-A").await?;
/// store.remember("7:billing:id-B").await?;
/// let all = store.stats("").await?;
/// assert_eq!((all.marks, all.expired), (2, 0));
/// assert!(all.oldest_ms <= all.newest_ms);
/// assert_eq!(all.retention, Retention::Forever, "in_memory() sets no TTL");
/// assert_eq!(store.stats("7:billing:").await?.marks, 1);
/// assert_eq!(store.forget_ids(&["id-A", "id-C"]).await?, 1);
/// while store.purge_expired(10_000).await? == 10_000 {}
/// assert_eq!(store.count_finished_claims().await?, 0, "no claims table: none");
/// # Ok::<(), babel_idem::StoreError>(())
/// # }).unwrap();
/// ```
impl Admin for SqliteStore {
    fn stats<'a>(&'a self, key_prefix: &'a str) -> StoreFuture<'a, StoreStats> {
        StoreFuture::new(run_stats(
            &self.pool,
            BACKEND,
            &self.settings.sql,
            key_prefix,
        ))
    }

    fn states<'a>(&'a self, ids: &'a [&'a str]) -> StoreFuture<'a, Vec<IdState>> {
        StoreFuture::new(async move {
            if !self.claims_table_exists().await? {
                let done = self.seen_many(ids).await?;
                return Ok(done
                    .into_iter()
                    .map(|done| if done { IdState::Done } else { IdState::Absent })
                    .collect());
            }
            let mut connection = self
                .pool
                .acquire()
                .await
                .map_err(failed(BACKEND, StoreOperation::Seen))?;
            let looks = self.look_many(&mut connection, ids).await?;
            Ok(ids.iter().map(|id| looks.state(id)).collect())
        })
    }

    fn forget_ids<'a>(&'a self, ids: &'a [&'a str]) -> StoreFuture<'a, u64> {
        StoreFuture::new(async move {
            let table = &self.settings.table;
            let mut removed = 0;
            for batch in ids.chunks(MAX_BATCH) {
                let sql = format!(
                    "DELETE FROM {table} WHERE message_id IN ({})",
                    numbered(1, batch.len())
                );
                let query = batch
                    .iter()
                    .fold(sqlx::query(&sql), |query, id| query.bind(*id));
                let done = query
                    .execute(&self.pool)
                    .await
                    .map_err(failed(BACKEND, StoreOperation::Forget))?;
                removed += done.rows_affected();
            }
            Ok(removed)
        })
    }

    sql_expiry_admin!();

    fn count_finished_claims(&self) -> StoreFuture<'_, u64> {
        StoreFuture::new(async move {
            if !self.claims_table_exists().await? {
                return Ok(0);
            }
            run_count(&self.pool, BACKEND, &self.claims.count_finished).await
        })
    }

    fn purge_finished_claims(&self, limit: u32) -> StoreFuture<'_, u64> {
        StoreFuture::new(async move {
            if !self.claims_table_exists().await? {
                return Ok(0);
            }
            run_purge(&self.pool, BACKEND, &self.claims.purge_finished, limit).await
        })
    }
}
