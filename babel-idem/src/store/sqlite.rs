//! [`SqliteStore`]: the embedded, persistent seen-set (feature `sqlite`).
//! The commands, the layout and the limits are documented on the type.

use std::fmt;
use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

use super::settings::{Drivers, SqlBuilder, SqlSettings, Statements, sql_builder_setters};
use super::{Store, StoreError, StoreFuture, StoreOperation, failed};
use crate::builders::setters;

mod admin;
mod claim;
mod transaction;

const BACKEND: &str = "sqlite";

/// The DDL, shipped as `sqlite.sql` for users who run their own migrations.
const DDL: &str = include_str!("sqlite.sql");

/// The database clock in Unix milliseconds; `'now'` is fixed within a statement.
const NOW_MS: &str = "CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)";

/// A seen-set in a SQLite database: a file that survives restarts, or memory.
///
/// One table, the same shape as the PostgreSQL one, with times as Unix
/// milliseconds (`sqlite.sql`, which the store runs):
///
/// ```sql
#[doc = include_str!("sqlite.sql")]
/// ```
///
/// The table name is checked when the store is built: it must match
/// `[A-Za-z_][A-Za-z0-9_]{0,47}`, the same rule as `PostgresStore`'s.
/// The TTL must be at least 1 ms and at most
/// [`MAX_TTL`](crate::store::MAX_TTL), counted in whole milliseconds. The
/// store needs a Tokio runtime with timers (its pool times out waiting for a
/// connection); building it on one without fails with an error that says so.
///
/// A file database runs in WAL mode with a busy timeout, so workers in one
/// process and processes sharing the file all read and write it safely.
///
/// `seen_many` is one `SELECT ... WHERE message_id IN (...)` and
/// `remember_many` one multi-row `INSERT` with `remember`'s upsert, each for
/// up to 32,766 bound variables (SQLite's default limit); a larger batch
/// takes one statement per 32,766 ids.
///
/// ```
/// use babel_idem::Store;
/// use babel_idem::store::SqliteStore;
/// use std::time::Duration;
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// # let dir = std::env::temp_dir().join(format!("babel-idem-doc-{}", std::process::id()));
/// # std::fs::create_dir_all(&dir).unwrap();
/// let path = dir.join("seen.db");
/// let store = SqliteStore::builder()
///     .ttl(Duration::from_secs(7 * 24 * 3600))
///     .open(&path)
///     .await?;
/// store.remember("f1e2d3c4-b5a6-4789-90ab-cdef01234567").await?;
///
/// // Another process (or this one, after a restart) opening the file sees it.
/// let reopened = SqliteStore::open(&path).await?;
/// assert!(reopened.seen("f1e2d3c4-b5a6-4789-90ab-cdef01234567").await?);
/// # std::fs::remove_dir_all(&dir).unwrap();
/// # Ok::<(), babel_idem::StoreError>(())
/// # }).unwrap();
/// ```
#[derive(Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
    settings: SqlSettings,
    claims: claim::ClaimStatements,
}

/// Configures a [`SqliteStore`]; made by [`SqliteStore::builder`].
#[derive(Debug, Clone)]
pub struct SqliteStoreBuilder {
    sql: SqlBuilder,
    busy_timeout: Duration,
}

impl Default for SqliteStoreBuilder {
    fn default() -> Self {
        SqliteStoreBuilder {
            sql: SqlBuilder::new(4),
            busy_timeout: Duration::from_secs(5),
        }
    }
}

impl SqliteStoreBuilder {
    sql_builder_setters!(4);

    setters! {
        /// How long a write waits for another connection's lock (default 5 s).
        pub fn busy_timeout(timeout: Duration) => self.busy_timeout;
    }

    /// Opens (creating if missing) the database file at `path`, in WAL mode,
    /// and creates the seen-set table if it is not there
    /// ([`SqliteStore::migrate`]; claim mode also needs
    /// [`SqliteStore::migrate_claims`]).
    pub async fn open(self, path: impl AsRef<Path>) -> Result<SqliteStore, StoreError> {
        let options = self.file_options(path, true);
        let pool_options = SqlitePoolOptions::new().max_connections(self.sql.max_connections);
        self.connect(pool_options, options).await
    }

    /// How every connection to a database file is opened: WAL, so readers
    /// never wait on the writer, and this builder's busy timeout.
    fn file_options(&self, path: impl AsRef<Path>, create: bool) -> SqliteConnectOptions {
        SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(create)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(self.busy_timeout)
    }

    /// Opens a private in-memory database, gone when the store is dropped,
    /// with the seen-set table ([`SqliteStore::migrate`]).
    pub async fn in_memory(self) -> Result<SqliteStore, StoreError> {
        // Each connection to `:memory:` is its own database: keep exactly one, forever.
        let options = SqliteConnectOptions::new().in_memory(true);
        let pool_options = SqlitePoolOptions::new()
            .min_connections(1)
            .max_connections(1)
            .idle_timeout(None)
            .max_lifetime(None);
        self.connect(pool_options, options).await
    }

    /// A store over a pool the caller already has. The table is not created:
    /// call [`SqliteStore::migrate`] (and [`SqliteStore::migrate_claims`] for
    /// claim mode) or run `sqlite.sql` (in the type's docs).
    /// The store never closes the pool. Must be called inside a Tokio
    /// runtime with timers.
    pub fn from_pool(self, pool: SqlitePool) -> Result<SqliteStore, StoreError> {
        Ok(SqliteStore::assemble(pool, self.checked()?))
    }

    /// Every setting checked, and the runtime, before anything is built.
    fn checked(&self) -> Result<SqlSettings, StoreError> {
        self.sql.check(BACKEND, sqlite_statements, Drivers::Time)
    }

    async fn connect(
        self,
        pool_options: SqlitePoolOptions,
        options: SqliteConnectOptions,
    ) -> Result<SqliteStore, StoreError> {
        // Check the settings before a pool starts or the file system is touched.
        let settings = self.checked()?;
        let store = SqliteStore::assemble(pool_options.connect_lazy_with(options), settings);
        // Processes that open one new file at the same instant race to
        // switch it to WAL, a change SQLite makes under an exclusive lock
        // that the busy timeout does not wait on: the loser's first
        // connection fails with SQLITE_BUSY. Opening waits that out, within
        // the busy timeout, as every later statement does.
        let deadline = tokio::time::Instant::now() + self.busy_timeout;
        let mut pause = Duration::from_millis(5);
        loop {
            match store.try_ddl(&store.settings.sql.create).await {
                Ok(()) => return Ok(store),
                Err(error) if is_busy(&error) && tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(200));
                }
                Err(error) => return Err(failed(BACKEND, StoreOperation::Open)(error)),
            }
        }
    }
}

impl SqliteStore {
    fn assemble(pool: SqlitePool, settings: SqlSettings) -> Self {
        let claims = claim::ClaimStatements::for_table(&settings.table);
        SqliteStore {
            pool,
            settings,
            claims,
        }
    }

    /// Opens the database file at `path` with the default settings; see
    /// [`SqliteStoreBuilder::open`].
    pub async fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        Self::builder().open(path).await
    }

    /// A private in-memory database with the default settings.
    ///
    /// ```
    /// use babel_idem::Store;
    /// use babel_idem::store::SqliteStore;
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// let store = SqliteStore::in_memory().await?;
    /// store.remember("id-A").await?;
    /// assert!(store.seen("id-A").await?);
    /// # Ok::<(), babel_idem::StoreError>(())
    /// # }).unwrap();
    /// ```
    pub async fn in_memory() -> Result<Self, StoreError> {
        Self::builder().in_memory().await
    }

    /// A store over an existing pool, default table, no TTL; see
    /// [`SqliteStoreBuilder::from_pool`].
    ///
    /// ```
    /// use babel_idem::Store;
    /// use babel_idem::store::SqliteStore;
    /// use sqlx::sqlite::SqlitePoolOptions;
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// let pool = SqlitePoolOptions::new().max_connections(1).connect("sqlite::memory:").await.unwrap();
    /// let store = SqliteStore::from_pool(pool.clone())?;
    /// store.migrate().await?;
    /// store.remember("id-A").await?;
    /// drop(store);
    /// assert!(!pool.is_closed(), "the caller's pool stays open");
    /// # Ok::<(), babel_idem::StoreError>(())
    /// # }).unwrap();
    /// ```
    pub fn from_pool(pool: SqlitePool) -> Result<Self, StoreError> {
        Self::builder().from_pool(pool)
    }

    /// Configures a store: table, TTL, busy timeout, connections.
    pub fn builder() -> SqliteStoreBuilder {
        SqliteStoreBuilder::default()
    }

    /// Creates the seen-set table and its `expires_at` index if they do not
    /// exist (the statements of `sqlite.sql`, for this store's table), and
    /// nothing else.
    ///
    /// Safe when many processes run it at once: it runs in a `BEGIN
    /// IMMEDIATE` transaction, so each waits for the write lock (up to the
    /// busy timeout) and then finds the table made or makes it.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        self.run_ddl(&self.settings.sql.create).await
    }

    /// Creates what claim mode needs beside the seen-set table, if it is not
    /// there (`sqlite/claims.sql`: the claims table, its fence counter, and
    /// the triggers that drop a claim when its id is marked done). Run
    /// [`migrate`](Self::migrate) first (the triggers are on the seen-set
    /// table; [`open`](Self::open) runs it). Safe to run at once from many
    /// processes, like `migrate`.
    ///
    /// ```
    /// use babel_idem::store::{Claim, ClaimStore, ClaimToken, SqliteStore};
    /// use std::time::Duration;
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// let store = SqliteStore::in_memory().await?;
    /// store.migrate_claims().await?;
    /// let claim = store.claim("id-A", ClaimToken::random(), Duration::from_secs(30)).await?;
    /// assert!(matches!(claim, Claim::Won { .. }));
    /// # Ok::<(), babel_idem::StoreError>(())
    /// # }).unwrap();
    /// ```
    pub async fn migrate_claims(&self) -> Result<(), StoreError> {
        self.run_ddl(&self.claims.create).await
    }

    /// Runs `ddl` under the write lock: `BEGIN IMMEDIATE` takes it before
    /// the first statement, so concurrent migrations run one after another.
    async fn run_ddl(&self, ddl: &str) -> Result<(), StoreError> {
        self.try_ddl(ddl)
            .await
            .map_err(failed(BACKEND, StoreOperation::Open))
    }

    async fn try_ddl(&self, ddl: &str) -> Result<(), sqlx::Error> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        sqlx::Executor::execute(&mut *tx, ddl).await?;
        tx.commit().await
    }

    /// The pool the store runs on.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// The table the store uses.
    pub fn table(&self) -> &str {
        &self.settings.table
    }

    /// The statement `seen` runs, with the id bound to `?1`: to `EXPLAIN` it,
    /// or to issue exactly it as a baseline.
    pub fn seen_statement(&self) -> &str {
        &self.settings.sql.seen
    }

    /// The statement `remember` runs, with the id bound to `?1` and the TTL
    /// in milliseconds (or `NULL`) to the second parameter.
    pub fn remember_statement(&self) -> &str {
        &self.settings.sql.remember
    }
}

impl Store for SqliteStore {
    /// A batch is one round trip here: a consumer's concurrent calls meet.
    fn batch_target(&self) -> Option<super::BatchTarget> {
        super::BatchTarget::of(self)
    }

    fn seen<'a>(&'a self, id: &'a str) -> StoreFuture<'a, bool> {
        StoreFuture::new(async move {
            sqlx::query_scalar::<_, bool>(&self.settings.sql.seen)
                .bind(id)
                .fetch_one(&self.pool)
                .await
                .map_err(failed(BACKEND, StoreOperation::Seen))
        })
    }

    fn remember<'a>(&'a self, id: &'a str) -> StoreFuture<'a, ()> {
        StoreFuture::new(async move {
            sqlx::query(&self.settings.sql.remember)
                .bind(id)
                .bind(self.settings.ttl_ms)
                .execute(&self.pool)
                .await
                .map_err(failed(BACKEND, StoreOperation::Remember))?;
            Ok(())
        })
    }

    fn seen_many<'a>(&'a self, ids: &'a [&'a str]) -> StoreFuture<'a, Vec<bool>> {
        StoreFuture::new(async move {
            let mut found: Vec<String> = Vec::new();
            for chunk in ids.chunks(MAX_VARIABLES) {
                let sql = seen_many_sql(&self.settings.table, chunk.len());
                let query = chunk
                    .iter()
                    .fold(sqlx::query_scalar(&sql), |query, id| query.bind(*id));
                let rows: Vec<String> = query
                    .persistent(chunk.len() <= CACHED_BATCH)
                    .fetch_all(&self.pool)
                    .await
                    .map_err(failed(BACKEND, StoreOperation::Seen))?;
                found.extend(rows);
            }
            Ok(super::batch::answers(ids, &found))
        })
    }

    fn remember_many<'a>(&'a self, ids: &'a [&'a str]) -> StoreFuture<'a, ()> {
        StoreFuture::new(async move {
            // The TTL takes one variable, the ids the rest.
            for chunk in ids.chunks(MAX_VARIABLES - 1) {
                let sql = remember_many_sql(&self.settings.table, chunk.len());
                let query = sqlx::query(&sql).bind(self.settings.ttl_ms);
                chunk
                    .iter()
                    .fold(query, |query, id| query.bind(*id))
                    .persistent(chunk.len() <= CACHED_BATCH)
                    .execute(&self.pool)
                    .await
                    .map_err(failed(BACKEND, StoreOperation::Remember))?;
            }
            Ok(())
        })
    }

    fn forget<'a>(&'a self, id: &'a str) -> StoreFuture<'a, ()> {
        StoreFuture::new(async move {
            sqlx::query(&self.settings.sql.forget)
                .bind(id)
                .execute(&self.pool)
                .await
                .map_err(failed(BACKEND, StoreOperation::Forget))?;
            Ok(())
        })
    }
}

impl fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteStore")
            .field("table", &self.settings.table)
            .field("ttl_ms", &self.settings.ttl_ms)
            .finish_non_exhaustive()
    }
}

/// SQLite's statements for one checked table name.
/// The most variables one statement may bind: SQLite's default
/// `SQLITE_MAX_VARIABLE_NUMBER` since 3.32. A larger batch is cut into
/// statements of at most this many variables.
const MAX_VARIABLES: usize = 32_766;

/// Batches up to this size keep their prepared statement in the connection's
/// cache; a larger one is prepared for its one use (its SQL is long).
const CACHED_BATCH: usize = 1024;

/// `?first, ?first+1, ...`: `count` numbered variables, `row` wrapping each.
fn variables(first: usize, count: usize, row: fn(&mut String, usize)) -> String {
    let mut list = String::with_capacity(count * 9);
    for n in first..first + count {
        if n > first {
            list.push(',');
        }
        row(&mut list, n);
    }
    list
}

/// `?first,?first+1,...`: `count` numbered variables, for an `IN (...)` list.
fn numbered(first: usize, count: usize) -> String {
    variables(first, count, |list, n| {
        let _ = write!(list, "?{n}");
    })
}

/// `seen` over `count` ids (`?1..`): the ids that are remembered and live.
fn seen_many_sql(table: &str, count: usize) -> String {
    let ids = numbered(1, count);
    format!(
        "SELECT message_id FROM {table} WHERE message_id IN ({ids})
             AND (expires_at IS NULL OR expires_at > {NOW_MS})"
    )
}

/// `remember` over `count` ids (`?2..`, the TTL is `?1`). The clock is read
/// once, in a one-row subquery, to keep the statement short; rows are
/// inserted one after the other, so a repeated id meets its own live row and
/// is left alone. (`WHERE true` tells the parser the `ON CONFLICT` is the
/// upsert's, not a join's.)
fn remember_many_sql(table: &str, count: usize) -> String {
    mark_many_sql(
        table,
        count,
        &format!(
            "DO UPDATE SET created_at = excluded.created_at, expires_at = excluded.expires_at
                 WHERE {table}.expires_at IS NOT NULL AND {table}.expires_at <= excluded.created_at"
        ),
    )
}

/// The seen-set rows of `count` ids (`?2..`, the TTL is `?1`), an existing
/// row of one handled by `on_conflict` (`DO ...`): `remember_many`'s
/// statement, and claim mode's commit of a batch.
fn mark_many_sql(table: &str, count: usize, on_conflict: &str) -> String {
    let rows = variables(2, count, |list, n| {
        let _ = write!(list, "(?{n})");
    });
    format!(
        "INSERT INTO {table} (message_id, created_at, expires_at)
             SELECT ids.column1, clock.now, clock.now + ?1
             FROM (VALUES {rows}) AS ids, (SELECT {NOW_MS} AS now) AS clock WHERE true
         ON CONFLICT (message_id) {on_conflict}"
    )
}

pub(crate) fn sqlite_statements(table: &str) -> Statements {
    Statements {
        create: Statements::ddl_for(DDL, table),
        seen: format!(
            "SELECT EXISTS (SELECT 1 FROM {table} WHERE message_id = ?1
                 AND (expires_at IS NULL OR expires_at > {NOW_MS}))"
        ),
        // Set-if-absent, like `SET NX`: a live row keeps its first expiry,
        // an expired one is taken over, in one statement.
        remember: format!(
            "INSERT INTO {table} (message_id, created_at, expires_at)
                 VALUES (?1, {NOW_MS}, {NOW_MS} + ?2)
             ON CONFLICT (message_id) DO UPDATE
                 SET created_at = excluded.created_at, expires_at = excluded.expires_at
                 WHERE {table}.expires_at IS NOT NULL AND {table}.expires_at <= excluded.created_at"
        ),
        forget: format!("DELETE FROM {table} WHERE message_id = ?1"),
        stats: format!(
            "SELECT COUNT(*),
                    COUNT(CASE WHEN expires_at IS NOT NULL AND expires_at <= {NOW_MS} THEN 1 END),
                    MIN(created_at), MAX(created_at)
             FROM {table} WHERE substr(message_id, 1, length(?1)) = ?1"
        ),
        retention: format!(
            "SELECT expires_at - created_at FROM {table}
             WHERE substr(message_id, 1, length(?1)) = ?1
             ORDER BY created_at DESC LIMIT 1"
        ),
        count_expired: format!(
            "SELECT COUNT(*) FROM {table} WHERE expires_at IS NOT NULL AND expires_at <= {NOW_MS}"
        ),
        purge_expired: format!(
            "DELETE FROM {table} WHERE message_id IN (
                 SELECT message_id FROM {table}
                 WHERE expires_at IS NOT NULL AND expires_at <= {NOW_MS} LIMIT ?1)"
        ),
    }
}

/// Whether `error` is SQLite's `SQLITE_BUSY` (any of its extended codes:
/// the primary code is the low byte).
fn is_busy(error: &sqlx::Error) -> bool {
    const SQLITE_BUSY: i32 = 5;
    error
        .as_database_error()
        .and_then(|error| error.code())
        .and_then(|code| code.parse::<i32>().ok())
        .is_some_and(|code| code & 0xff == SQLITE_BUSY)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_statements_number_their_variables() {
        let seen = seen_many_sql("t", 3);
        assert!(seen.contains("IN (?1,?2,?3)"), "{seen}");
        let remember = remember_many_sql("t", 2);
        assert!(remember.contains("VALUES (?2),(?3))"), "{remember}");
        assert!(remember.contains("clock.now + ?1"), "{remember}");
    }

    #[test]
    fn the_table_keeps_no_rowid() {
        assert!(
            sqlite_statements("seen_ids")
                .create
                .contains(") WITHOUT ROWID;")
        );
    }
}
