//! [`PostgresStore`]: a seen-set shared by a fleet, in PostgreSQL (feature `postgres`).
//! The commands, the layout and the limits are documented on the type.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

use super::settings::{
    Drivers, InvalidUrl, SqlBuilder, SqlSettings, Statements, sql_builder_setters,
};
use super::{Store, StoreError, StoreFuture, StoreOperation, failed};
use crate::builders::setters;

mod admin;
mod claim;
mod transaction;

const BACKEND: &str = "postgres";

/// The DDL, shipped as `postgres.sql` for users who run their own migrations.
const DDL: &str = include_str!("postgres.sql");

/// SQLSTATE `program_limit_exceeded`: here, an index entry over the btree limit.
const PROGRAM_LIMIT_EXCEEDED: &str = "54000";

/// A seen-set in a PostgreSQL table, shared by every consumer that points at it.
///
/// The table is the Go SDK's, so Go and Rust consumers can share it:
///
/// ```sql
#[doc = include_str!("postgres.sql")]
/// ```
///
/// | operation | statement (one each, in one round trip) |
/// |---|---|
/// | `seen` | `SELECT EXISTS (... WHERE message_id = $1 AND (expires_at IS NULL OR expires_at > now()))` |
/// | `remember` | `INSERT ... ON CONFLICT (message_id) DO UPDATE ... WHERE` the existing row has expired |
/// | `forget` | `DELETE ... WHERE message_id = $1` |
/// | `seen_many` | `SELECT message_id ... WHERE message_id = ANY($1::text[]) AND` live |
/// | `remember_many` | `remember`'s `INSERT`, from `SELECT DISTINCT ... FROM unnest($1::text[])` |
///
/// Expiry is computed by the database clock (`now() + interval`), never the
/// client's, so consumers with skewed clocks agree on it.
///
/// The pool (sqlx's) also pings each connection as it takes it back, one
/// more round trip per operation that the delivery does not wait for.
///
/// # Ids PostgreSQL cannot hold
///
/// - An id containing NUL (`\0`): PostgreSQL `TEXT` cannot store it. All three
///   operations fail with a [`StoreError`] saying so, before any round trip;
///   the guard then does not run the handler and the message goes to retry or
///   dead-letter, rather than running on every redelivery.
/// - A very long id: the primary-key index holds entries up to about 2.7 KB
///   after compression. A longer id is seen as unseen, and `remember` fails
///   with a [`StoreError`] that says the id is too long for the index.
///
/// # Settings, checked when the store is built
///
/// - The table name must match `[A-Za-z_][A-Za-z0-9_]{0,47}`: a plain
///   identifier that needs no quoting, short enough that the index name
///   `<table>_expires_at_idx` fits PostgreSQL's 63-byte identifiers (a
///   truncated one would make `CREATE INDEX IF NOT EXISTS` skip the index).
///   Unquoted, PostgreSQL folds it to lower case.
/// - The TTL must be at least 1 ms and at most
///   [`MAX_TTL`](crate::store::MAX_TTL) (about 100 years; PostgreSQL's
///   intervals end near 292,000 years), counted in whole milliseconds.
/// - The store needs a Tokio runtime with timers and I/O (its pool times
///   out waiting for a connection, and connects over Tokio sockets);
///   building it on one without fails with an error that says so (how it
///   is checked: see `RedisStore`'s docs, the check is the same).
///
/// The store connects lazily: building it needs no server, and each operation
/// fails with a [`StoreError`] until the server answers.
///
/// ```no_run
/// use babel_idem::Store;
/// use babel_idem::store::PostgresStore;
/// use std::time::Duration;
///
/// # async fn run() -> Result<(), babel_idem::StoreError> {
/// let store = PostgresStore::builder()
///     .ttl(Duration::from_secs(7 * 24 * 3600))
///     .connect_lazy("postgres://app@db.internal/app")?;
/// store.migrate().await?; // or run postgres.sql with your migrations
/// store.remember("f1e2d3c4-b5a6-4789-90ab-cdef01234567").await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct PostgresStore {
    pool: PgPool,
    settings: SqlSettings,
    claims: claim::ClaimStatements,
    claims_purge: Arc<claim::PurgeSchedule>,
    batch: BatchStatements,
}

/// Configures a [`PostgresStore`]; made by [`PostgresStore::builder`].
#[derive(Debug, Clone)]
pub struct PostgresStoreBuilder {
    sql: SqlBuilder,
    acquire_timeout: Duration,
    purge_claims_every: Option<Duration>,
}

impl Default for PostgresStoreBuilder {
    fn default() -> Self {
        PostgresStoreBuilder {
            sql: SqlBuilder::new(10),
            acquire_timeout: Duration::from_secs(5),
            purge_claims_every: Some(Duration::from_secs(60)),
        }
    }
}

impl PostgresStoreBuilder {
    sql_builder_setters!(10);

    setters! {
        /// How long an operation waits for a connection, including connecting,
        /// before it fails (default 5 s). While the server is down every
        /// operation takes this long to fail.
        pub fn acquire_timeout(timeout: Duration) => self.acquire_timeout;

        /// How often claim mode deletes its finished claim rows on its own
        /// (default every minute; `None`: never, leave it to
        /// [`Admin::purge_finished_claims`](crate::store::Admin::purge_finished_claims)
        /// or `babel-idem purge-expired --claims`). A commit that finds the last
        /// purge this long ago starts the next one beside it; each deletes the
        /// tombstones and lapsed claims older than a minute. Seen-set mode has
        /// no claim rows and never purges.
        ///
        /// ```no_run
        /// use std::time::Duration;
        /// use babel_idem::store::PostgresStore;
        ///
        /// # fn run() -> Result<(), babel_idem::StoreError> {
        /// let store = PostgresStore::builder()
        ///     .purge_finished_claims_every(Some(Duration::from_secs(300)))
        ///     .connect_lazy("postgres://app@db.internal/app")?;
        /// # Ok(())
        /// # }
        /// ```
        pub fn purge_finished_claims_every(every: Option<Duration>) => self.purge_claims_every;
    }

    /// A store with its own pool for `url` (`postgres://user:password@host/db`).
    /// Nothing connects until the first operation. Must be called inside a
    /// Tokio runtime with timers and I/O.
    ///
    /// Connections are not pinged before use, which would cost a round trip
    /// per operation. After a server restart each pooled connection fails
    /// one operation (a [`StoreError`]: the message is retried) and is
    /// replaced.
    pub fn connect_lazy(self, url: &str) -> Result<PostgresStore, StoreError> {
        // A password where the driver reads a database name would be
        // quoted back by the server: such a URL is refused unread.
        InvalidUrl::check(url).map_err(failed(BACKEND, StoreOperation::Open))?;
        let options: PgConnectOptions =
            url.parse().map_err(failed(BACKEND, StoreOperation::Open))?;
        let settings = self.checked()?;
        let pool = PgPoolOptions::new()
            .max_connections(self.sql.max_connections)
            .acquire_timeout(self.acquire_timeout)
            .test_before_acquire(false)
            .connect_lazy_with(options);
        Ok(PostgresStore::assemble(
            pool,
            settings,
            self.purge_claims_every,
        ))
    }

    /// A store over a pool the caller already has, with the pool's own
    /// settings. The store never closes it. Must be called inside a Tokio
    /// runtime with timers and I/O.
    pub fn from_pool(self, pool: PgPool) -> Result<PostgresStore, StoreError> {
        Ok(PostgresStore::assemble(
            pool,
            self.checked()?,
            self.purge_claims_every,
        ))
    }

    /// Every setting checked, and the runtime, before anything is built.
    fn checked(&self) -> Result<SqlSettings, StoreError> {
        self.sql
            .check(BACKEND, postgres_statements, Drivers::TimeAndIo)
    }
}

impl PostgresStore {
    fn assemble(pool: PgPool, settings: SqlSettings, purge_claims_every: Option<Duration>) -> Self {
        let claims = claim::ClaimStatements::for_table(&settings.table);
        let batch = BatchStatements::for_table(&settings.table);
        PostgresStore {
            pool,
            settings,
            claims,
            claims_purge: claim::PurgeSchedule::new(purge_claims_every),
            batch,
        }
    }

    /// A store with its own lazily connected pool, default settings; see
    /// [`PostgresStoreBuilder::connect_lazy`].
    pub fn connect_lazy(url: &str) -> Result<Self, StoreError> {
        Self::builder().connect_lazy(url)
    }

    /// A store over an existing pool, default table, no TTL.
    ///
    /// ```no_run
    /// use babel_idem::store::PostgresStore;
    /// use sqlx::postgres::PgPoolOptions;
    ///
    /// # async fn run() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    /// let pool = PgPoolOptions::new().connect("postgres://app@db.internal/app").await?;
    /// let store = PostgresStore::from_pool(pool.clone())?;
    /// store.migrate().await?;
    /// drop(store);
    /// assert!(!pool.is_closed(), "the caller's pool stays open");
    /// # Ok(())
    /// # }
    /// ```
    pub fn from_pool(pool: PgPool) -> Result<Self, StoreError> {
        Self::builder().from_pool(pool)
    }

    /// Configures a store: table, TTL, timeouts, connections.
    pub fn builder() -> PostgresStoreBuilder {
        PostgresStoreBuilder::default()
    }

    /// Creates the seen-set table and its `expires_at` index if they do not
    /// exist (the statements of `postgres.sql`, for this store's table), and
    /// nothing else: the Go SDK's layout.
    ///
    /// Safe when a whole fleet runs it at once: `CREATE ... IF NOT EXISTS`
    /// alone races (two connections both find the table missing, and one fails
    /// on a catalog's unique index), so the statements run in a transaction
    /// that first takes a transaction-scoped advisory lock keyed by the
    /// table's name; the others wait, then find the table made.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        self.run_ddl(&self.settings.table, &self.settings.sql.create)
            .await
    }

    /// Creates what claim mode needs beside the seen-set table, if it is not
    /// there (`claims.sql`: `<table>_claims` and its fence sequence), and
    /// nothing else. Serialized like [`migrate`](Self::migrate), so a fleet
    /// may run it at once. Fails when the table name leaves no room for the
    /// sequence's name (at most 50 bytes).
    ///
    /// ```no_run
    /// use babel_idem::store::PostgresStore;
    ///
    /// # async fn run() -> Result<(), babel_idem::StoreError> {
    /// let store = PostgresStore::connect_lazy("postgres://app@db.internal/app")?;
    /// store.migrate().await?;
    /// store.migrate_claims().await?; // claim mode only
    /// # Ok(())
    /// # }
    /// ```
    pub async fn migrate_claims(&self) -> Result<(), StoreError> {
        let ddl = self.claims.create(StoreOperation::Open)?;
        let name = format!("{}_claims", self.settings.table);
        self.run_ddl(&name, ddl).await
    }

    /// Runs `ddl` in a transaction holding the advisory lock of `name`.
    async fn run_ddl(&self, name: &str, ddl: &str) -> Result<(), StoreError> {
        let open = |e| failed(BACKEND, StoreOperation::Open)(e);
        let mut tx = self.pool.begin().await.map_err(open)?;
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(migration_lock_key(name))
            .execute(&mut *tx)
            .await
            .map_err(open)?;
        sqlx::Executor::execute(&mut *tx, ddl).await.map_err(open)?;
        tx.commit().await.map_err(open)
    }

    /// The pool the store runs on.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The table the store uses.
    pub fn table(&self) -> &str {
        &self.settings.table
    }

    /// The statement `seen` runs, with the id bound to `$1`: to `EXPLAIN` it,
    /// or to issue exactly it as a baseline.
    pub fn seen_statement(&self) -> &str {
        &self.settings.sql.seen
    }

    /// The statement `remember` runs, with the id bound to `$1` and the TTL
    /// in milliseconds (or `NULL`) to the second parameter.
    pub fn remember_statement(&self) -> &str {
        &self.settings.sql.remember
    }
}

impl Store for PostgresStore {
    /// A batch is one round trip here: a consumer's concurrent calls meet.
    fn batch_target(&self) -> Option<super::BatchTarget> {
        super::BatchTarget::of(self)
    }

    fn seen<'a>(&'a self, id: &'a str) -> StoreFuture<'a, bool> {
        StoreFuture::new(async move {
            UnstorableId::check(id).map_err(failed(BACKEND, StoreOperation::Seen))?;
            sqlx::query_scalar::<_, bool>(&self.settings.sql.seen)
                .bind(id)
                .fetch_one(&self.pool)
                .await
                .map_err(failed(BACKEND, StoreOperation::Seen))
        })
    }

    fn remember<'a>(&'a self, id: &'a str) -> StoreFuture<'a, ()> {
        StoreFuture::new(async move {
            let remember = StoreOperation::Remember;
            UnstorableId::check(id).map_err(failed(BACKEND, remember))?;
            sqlx::query(&self.settings.sql.remember)
                .bind(id)
                .bind(self.settings.ttl_ms)
                .execute(&self.pool)
                .await
                .map_err(|e| remember_failed(e, id.len()))?;
            Ok(())
        })
    }

    fn seen_many<'a>(&'a self, ids: &'a [&'a str]) -> StoreFuture<'a, Vec<bool>> {
        StoreFuture::new(async move {
            if ids.is_empty() {
                return Ok(Vec::new());
            }
            let seen = StoreOperation::Seen;
            for id in ids {
                UnstorableId::check(id).map_err(failed(BACKEND, seen))?;
            }
            let found: Vec<String> = sqlx::query_scalar(&self.batch.seen)
                .bind(ids)
                .fetch_all(&self.pool)
                .await
                .map_err(failed(BACKEND, seen))?;
            Ok(super::batch::answers(ids, &found))
        })
    }

    fn remember_many<'a>(&'a self, ids: &'a [&'a str]) -> StoreFuture<'a, ()> {
        StoreFuture::new(async move {
            if ids.is_empty() {
                return Ok(());
            }
            let remember = StoreOperation::Remember;
            for id in ids {
                UnstorableId::check(id).map_err(failed(BACKEND, remember))?;
            }
            let longest = ids.iter().map(|id| id.len()).max().unwrap_or(0);
            sqlx::query(&self.batch.remember)
                .bind(ids)
                .bind(self.settings.ttl_ms)
                .execute(&self.pool)
                .await
                .map_err(|e| remember_failed(e, longest))?;
            Ok(())
        })
    }

    fn forget<'a>(&'a self, id: &'a str) -> StoreFuture<'a, ()> {
        StoreFuture::new(async move {
            UnstorableId::check(id).map_err(failed(BACKEND, StoreOperation::Forget))?;
            sqlx::query(&self.settings.sql.forget)
                .bind(id)
                .execute(&self.pool)
                .await
                .map_err(failed(BACKEND, StoreOperation::Forget))?;
            Ok(())
        })
    }
}

impl fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresStore")
            .field("table", &self.settings.table)
            .field("ttl_ms", &self.settings.ttl_ms)
            .finish_non_exhaustive()
    }
}

/// A failed `remember` (of ids up to `bytes` long): the index's size
/// limit is reported as the id being too long.
fn remember_failed(error: sqlx::Error, bytes: usize) -> StoreError {
    let remember = StoreOperation::Remember;
    if is_index_limit(&error) {
        let too_long = UnstorableId::TooLong {
            bytes,
            source: error,
        };
        StoreError::new(remember, BACKEND, too_long)
    } else {
        StoreError::new(remember, BACKEND, error)
    }
}

fn is_index_limit(error: &sqlx::Error) -> bool {
    error
        .as_database_error()
        .and_then(|db| db.code())
        .is_some_and(|code| code == PROGRAM_LIMIT_EXCEEDED)
}

/// An id this store cannot keep in a PostgreSQL `TEXT` primary key.
#[derive(Debug, thiserror::Error)]
enum UnstorableId {
    #[error("the message id contains a NUL character, which PostgreSQL TEXT cannot store")]
    ContainsNul,
    #[error(
        "the message id ({bytes} bytes) is too long for the primary-key index \
         (about 2.7 KB after compression)"
    )]
    TooLong { bytes: usize, source: sqlx::Error },
}

impl UnstorableId {
    fn check(id: &str) -> Result<(), UnstorableId> {
        if id.contains('\0') {
            return Err(UnstorableId::ContainsNul);
        }
        Ok(())
    }
}

/// PostgreSQL's statements for one checked table name.
/// `seen_many` and `remember_many`: `seen` and `remember` over a `text[]`
/// of ids, one statement each whatever the batch's size.
#[derive(Debug, Clone)]
struct BatchStatements {
    /// The ids (`$1`) that are remembered and live.
    seen: String,
    /// `remember` for each distinct id of `$1` (TTL `$2`), in key order so
    /// two batches lock shared rows in one order and cannot deadlock; one
    /// `INSERT` may not touch a row twice, hence `DISTINCT`.
    remember: String,
}

impl BatchStatements {
    fn for_table(table: &str) -> Self {
        BatchStatements {
            seen: format!(
                "SELECT message_id FROM {table} WHERE message_id = ANY($1::text[])
                     AND (expires_at IS NULL OR expires_at > now())"
            ),
            remember: format!(
                "INSERT INTO {table} (message_id, expires_at)
                     SELECT DISTINCT id, now() + $2::bigint * interval '1 millisecond'
                     FROM unnest($1::text[]) AS ids(id) ORDER BY id
                 ON CONFLICT (message_id) DO UPDATE
                     SET created_at = now(), expires_at = EXCLUDED.expires_at
                     WHERE {table}.expires_at IS NOT NULL AND {table}.expires_at <= now()"
            ),
        }
    }
}

/// The advisory lock a migration of `name` takes: FNV-1a (64 bits) of the
/// name, under a namespace of this crate's, so every process that migrates
/// one table takes one lock, whatever its version.
fn migration_lock_key(name: &str) -> i64 {
    let hash = format!("babel-idem migrate {name}")
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
            (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
        });
    i64::from_ne_bytes(hash.to_ne_bytes())
}

pub(crate) fn postgres_statements(table: &str) -> Statements {
    Statements {
        create: Statements::ddl_for(DDL, table),
        seen: format!(
            "SELECT EXISTS (SELECT 1 FROM {table} WHERE message_id = $1
                 AND (expires_at IS NULL OR expires_at > now()))"
        ),
        // Set-if-absent, like `SET NX`: a live row keeps its first expiry,
        // an expired one is taken over, in one statement. A NULL TTL makes
        // a NULL expiry (never expires).
        remember: format!(
            "INSERT INTO {table} (message_id, expires_at)
                 VALUES ($1, now() + $2::bigint * interval '1 millisecond')
             ON CONFLICT (message_id) DO UPDATE
                 SET created_at = now(), expires_at = EXCLUDED.expires_at
                 WHERE {table}.expires_at IS NOT NULL AND {table}.expires_at <= now()"
        ),
        forget: format!("DELETE FROM {table} WHERE message_id = $1"),
        stats: format!(
            "SELECT count(*),
                    count(*) FILTER (WHERE expires_at IS NOT NULL AND expires_at <= now()),
                    floor(extract(epoch FROM min(created_at)) * 1000)::bigint,
                    floor(extract(epoch FROM max(created_at)) * 1000)::bigint
             FROM {table} WHERE left(message_id, length($1)) = $1"
        ),
        retention: format!(
            "SELECT round(extract(epoch FROM expires_at - created_at) * 1000)::bigint
             FROM {table} WHERE left(message_id, length($1)) = $1
             ORDER BY created_at DESC LIMIT 1"
        ),
        count_expired: format!(
            "SELECT count(*) FROM {table} WHERE expires_at IS NOT NULL AND expires_at <= now()"
        ),
        // Rows another transaction holds are skipped: a purge never waits
        // on a consumer.
        purge_expired: format!(
            "DELETE FROM {table} WHERE message_id IN (
                 SELECT message_id FROM {table}
                 WHERE expires_at IS NOT NULL AND expires_at <= now()
                 LIMIT $1 FOR UPDATE SKIP LOCKED)"
        ),
    }
}
