//! What a SQL outbox does the same on every database: its settings, `save`,
//! the operator's counts and clean-ups, written once over sqlx's database
//! type; each backend gives the statements' dialect ([`Dialect`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sqlx::{ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, Pool, Type};

use super::{
    Backoff, Batch, DEFAULT_TABLE, Lease, Marks, OutboxError, OutboxFuture, OutboxSource,
    OutboxStats, Wakeup, checked_table, database, headers_json,
};
use crate::envelope::Envelope;
use crate::telemetry::carrier;

/// What differs between the databases in the statements [`SqlTable`] runs.
pub(super) struct Dialect {
    /// The seconds the row has waited since `created_at`, as a float.
    pub(super) age_seconds: &'static str,
    /// A `published_at` older than the first parameter, in seconds.
    pub(super) published_before: &'static str,
    /// The second parameter.
    pub(super) second: &'static str,
    /// What the purge's inner `SELECT` ends with, to pass rows others hold.
    pub(super) skip_locked: &'static str,
    /// The `save` statement for `table`, with or without the `headers`
    /// column: binds the queue, the body and (with headers) the headers'
    /// JSON; returns the row's id.
    pub(super) insert: fn(table: &str, headers: bool) -> String,
    /// The names of the columns of the table named by the first parameter
    /// (none when it does not exist).
    pub(super) columns: &'static str,
    /// Whether `error` says the table is missing.
    pub(super) missing_table: fn(&sqlx::Error) -> bool,
}

/// How many rows a statement changed, whatever the database.
pub trait RowsAffected {
    /// The count.
    fn rows(&self) -> u64;
}

/// An outbox table on a pool of `DB`: the name, whether `save` writes
/// `headers`, whether the table is the family's own, and the dialect of its
/// statements.
pub struct SqlTable<DB: Database> {
    pub(super) pool: Pool<DB>,
    pub(super) name: String,
    pub(super) headers: bool,
    /// Whether the table was made by the family's DDL alone (it has no
    /// `headers` column): learned when a relay is built on it
    /// ([`OutboxSource::has_headers`]) or said by `without_headers`, and
    /// shared by every clone, so the relay's clone marks rows in the
    /// family's time format.
    family: Arc<AtomicBool>,
    dialect: &'static Dialect,
}

impl<DB: Database> Clone for SqlTable<DB> {
    fn clone(&self) -> Self {
        SqlTable {
            pool: self.pool.clone(),
            name: self.name.clone(),
            headers: self.headers,
            family: Arc::clone(&self.family),
            dialect: self.dialect,
        }
    }
}

impl<DB: Database> std::fmt::Debug for SqlTable<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlTable")
            .field("table", &self.name)
            .field("headers", &self.headers)
            .finish_non_exhaustive()
    }
}

impl<DB: Database> SqlTable<DB> {
    /// The table `babelqueue_outbox` on `pool`, with `headers`.
    pub(super) fn new(pool: Pool<DB>, dialect: &'static Dialect) -> Self {
        SqlTable {
            pool,
            name: DEFAULT_TABLE.to_owned(),
            headers: true,
            family: Arc::new(AtomicBool::new(false)),
            dialect,
        }
    }

    /// `save` writes no `headers` column: the table is the family's.
    #[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
    pub(super) fn without_headers(mut self) -> Self {
        self.headers = false;
        self.family = Arc::new(AtomicBool::new(true));
        self
    }

    /// Whether the table is the family's own (no `headers` column), whose
    /// times the family's SDKs write in whole seconds.
    #[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
    pub(super) fn is_family(&self) -> bool {
        self.family.load(Ordering::Relaxed)
    }

    /// The same table under another name, checked: another table, whose
    /// kind is learned on its own.
    pub(super) fn renamed(mut self, table: &str) -> Result<Self, OutboxError> {
        self.name = checked_table(table)?;
        self.family = Arc::new(AtomicBool::new(!self.headers));
        Ok(self)
    }

    /// `error`, or [`OutboxError::MissingTable`] when it says the table is missing.
    pub(super) fn missing_or(&self, error: sqlx::Error, operation: &'static str) -> OutboxError {
        if (self.dialect.missing_table)(&error) {
            OutboxError::MissingTable {
                table: self.name.clone(),
            }
        } else {
            database(operation)(error)
        }
    }
}

impl<DB> SqlTable<DB>
where
    DB: Database,
    DB::QueryResult: RowsAffected,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'q> i64: Type<DB> + Encode<'q, DB> + Decode<'q, DB>,
    for<'q> f64: Type<DB> + Encode<'q, DB> + Decode<'q, DB>,
    for<'q> &'q str: Type<DB> + Encode<'q, DB>,
    for<'q> Option<String>: Type<DB> + Encode<'q, DB>,
    for<'q> String: Type<DB> + Decode<'q, DB>,
    usize: ColumnIndex<DB::Row>,
{
    /// Writes `envelope` on `connection` (see the outboxes' `save`).
    pub(super) async fn save(
        &self,
        connection: &mut DB::Connection,
        envelope: &Envelope,
    ) -> Result<i64, OutboxError> {
        let body = envelope.encode_for_publish()?;
        let body = String::from_utf8_lossy(&body);
        let insert = (self.dialect.insert)(&self.name, self.headers);
        let mut query = sqlx::query_scalar::<_, i64>(&insert)
            .bind(envelope.destination())
            .bind(&*body);
        if self.headers {
            query = query.bind(headers_json(&carrier::trace_headers(
                &tracing::Span::current(),
            )));
        }
        query
            .fetch_one(&mut *connection)
            .await
            .map_err(|error| self.missing_or(error, "save"))
    }

    /// Runs `ddl`, written for the default table, for this table in `tx`
    /// (which holds what keeps concurrent migrations apart), and commits.
    pub(super) async fn create_in(
        &self,
        mut tx: sqlx::Transaction<'_, DB>,
        ddl: &str,
    ) -> Result<(), OutboxError> {
        let ddl = ddl.replace(DEFAULT_TABLE, &self.name);
        sqlx::Executor::execute(&mut *tx, &*ddl)
            .await
            .map_err(database("migrate"))?;
        tx.commit().await.map_err(database("migrate"))
    }

    /// The table's column names; none when it does not exist.
    pub(super) async fn columns(&self) -> Result<Vec<String>, OutboxError> {
        let mut connection = self.connection("open").await?;
        sqlx::query_scalar::<_, String>(self.dialect.columns)
            .bind(self.name.as_str())
            .fetch_all(&mut *connection)
            .await
            .map_err(database("open"))
    }

    /// How many rows each status holds, and the age of the oldest pending row.
    pub(super) async fn stats(&self) -> Result<OutboxStats, OutboxError> {
        let (t, age) = (&self.name, self.dialect.age_seconds);
        let query = format!(
            "SELECT
                 (SELECT count(*) FROM {t} WHERE status = 'pending'),
                 (SELECT count(*) FROM {t} WHERE status = 'published'),
                 (SELECT count(*) FROM {t} WHERE status = 'failed'),
                 (SELECT {age} FROM {t} WHERE status = 'pending' ORDER BY id LIMIT 1)"
        );
        let mut connection = self.connection("stats").await?;
        let (pending, published, failed, age): (i64, i64, i64, Option<f64>) =
            sqlx::query_as(&query)
                .fetch_one(&mut *connection)
                .await
                .map_err(|error| self.missing_or(error, "stats"))?;
        Ok(OutboxStats {
            pending: pending as u64,
            published: published as u64,
            failed: failed as u64,
            oldest_pending_age: age.map(|age| Duration::from_secs_f64(age.max(0.0))),
        })
    }

    /// Makes every `'failed'` row pending again (see `retry_failed`).
    pub(super) async fn retry_failed(&self, dry_run: bool) -> Result<u64, OutboxError> {
        let t = &self.name;
        let mut connection = self.connection("retry-failed").await?;
        let result = if dry_run {
            let count = format!("SELECT count(*) FROM {t} WHERE status = 'failed'");
            sqlx::query_scalar::<_, i64>(&count)
                .fetch_one(&mut *connection)
                .await
                .map(|n| n as u64)
        } else {
            let retry = format!(
                "UPDATE {t} SET status = 'pending', attempts = 0, failed_at = NULL
                 WHERE status = 'failed'"
            );
            sqlx::query(&retry)
                .execute(&mut *connection)
                .await
                .map(|done| done.rows())
        };
        result.map_err(|error| self.missing_or(error, "retry-failed"))
    }

    /// Deletes the rows published longer than `older_than` ago, `batch` at
    /// a time (see `purge_published`).
    pub(super) async fn purge_published(
        &self,
        older_than: Duration,
        batch: u32,
        dry_run: bool,
    ) -> Result<u64, OutboxError> {
        let (t, dialect) = (&self.name, self.dialect);
        let old = format!("status = 'published' AND {}", dialect.published_before);
        let seconds = older_than.as_secs_f64();
        let failed = |error| self.missing_or(error, "purge-published");
        if dry_run {
            let count = format!("SELECT count(*) FROM {t} WHERE {old}");
            let mut connection = self.connection("purge-published").await?;
            return sqlx::query_scalar::<_, i64>(&count)
                .bind(seconds)
                .fetch_one(&mut *connection)
                .await
                .map(|n| n as u64)
                .map_err(failed);
        }
        let delete = format!(
            "DELETE FROM {t} WHERE id IN (
                 SELECT id FROM {t} WHERE {old} ORDER BY id LIMIT {}{})",
            dialect.second, dialect.skip_locked
        );
        let batch = batch.max(1);
        let mut deleted = 0;
        // Each statement is its own short transaction, on a connection
        // taken for it alone.
        loop {
            let mut connection = self.connection("purge-published").await?;
            let done = sqlx::query(&delete)
                .bind(seconds)
                .bind(i64::from(batch))
                .execute(&mut *connection)
                .await
                .map_err(failed)?
                .rows();
            deleted += done;
            if done < u64::from(batch) {
                return Ok(deleted);
            }
        }
    }

    /// A connection of the pool, for one operation.
    async fn connection(
        &self,
        operation: &'static str,
    ) -> Result<sqlx::pool::PoolConnection<DB>, OutboxError> {
        self.pool.acquire().await.map_err(database(operation))
    }
}

/// What the relay asks of [`SqlOutbox::take_batch`], as the statements
/// bind it.
pub struct Take<'a> {
    /// The most rows.
    pub(super) limit: i64,
    /// The backoff's step, in seconds.
    pub(super) step: f64,
    /// The backoff's cap, in seconds.
    pub(super) cap: f64,
    /// Whether the `headers` column is read.
    pub(super) headers: bool,
    /// The rows whose mark may still be committing.
    #[cfg_attr(
        not(feature = "sqlite"),
        allow(dead_code, reason = "PostgreSQL's row locks pass those rows by")
    )]
    pub(super) in_flight: &'a [i64],
}

/// An outbox whose shared statements [`SqlTable`] runs: what its database
/// does its own way. Every such outbox is an [`OutboxSource`].
pub trait SqlOutbox: Clone + Send + Sync + 'static {
    /// The database.
    type Db: Database;

    /// The table and its pool.
    fn sql(&self) -> &SqlTable<Self::Db>;

    /// See [`OutboxSource::migrate`].
    fn create(&self) -> impl Future<Output = Result<(), OutboxError>> + Send;

    /// See [`OutboxSource::take`].
    fn take_batch(&self, take: Take<'_>)
    -> impl Future<Output = Result<Batch, OutboxError>> + Send;

    /// See [`OutboxSource::mark`].
    fn finish(
        &self,
        lease: Lease,
        marks: Marks<'_>,
    ) -> impl Future<Output = Result<(), OutboxError>> + Send;

    /// See [`OutboxSource::wakeup`].
    fn wake(&self) -> impl Future<Output = Box<dyn Wakeup>> + Send;
}

impl<T> OutboxSource for T
where
    T: SqlOutbox,
    SqlTable<T::Db>: SqlOperations,
{
    fn table(&self) -> &str {
        &self.sql().name
    }

    fn migrate(&self) -> OutboxFuture<'_, ()> {
        Box::pin(self.create())
    }

    fn stats(&self) -> OutboxFuture<'_, OutboxStats> {
        self.sql().stats_boxed()
    }

    fn retry_failed(&self, dry_run: bool) -> OutboxFuture<'_, u64> {
        self.sql().retry_failed_boxed(dry_run)
    }

    fn purge_published(&self, age: Duration, batch: u32, dry: bool) -> OutboxFuture<'_, u64> {
        self.sql().purge_boxed(age, batch, dry)
    }

    fn has_headers(&self) -> OutboxFuture<'_, bool> {
        Box::pin(async move {
            let columns = self.sql().columns_boxed().await?;
            if columns.is_empty() {
                return Err(OutboxError::MissingTable {
                    table: self.sql().name.clone(),
                });
            }
            let headers = columns.iter().any(|column| column == "headers");
            // Only the relay's build asks, before any mark it makes.
            self.sql().family.store(!headers, Ordering::Relaxed);
            Ok(headers)
        })
    }

    fn take<'a>(
        &'a self,
        limit: u32,
        backoff: Backoff,
        headers: bool,
        in_flight: &'a [i64],
    ) -> OutboxFuture<'a, Batch> {
        let take = Take {
            limit: i64::from(limit),
            step: backoff.step.as_secs_f64(),
            cap: backoff.cap.as_secs_f64(),
            headers,
            in_flight,
        };
        Box::pin(self.take_batch(take))
    }

    fn mark<'a>(&'a self, lease: Lease, marks: Marks<'a>) -> OutboxFuture<'a, ()> {
        Box::pin(self.finish(lease, marks))
    }

    fn wakeup(&self) -> Pin<Box<dyn Future<Output = Box<dyn Wakeup>> + Send + '_>> {
        Box::pin(self.wake())
    }
}

/// The shared operations as boxed futures, for a table whose database
/// sqlx drives (the bounds of [`SqlTable`]'s statements, stated once).
pub trait SqlOperations {
    /// [`SqlTable::columns`], boxed.
    fn columns_boxed(&self) -> OutboxFuture<'_, Vec<String>>;
    /// [`SqlTable::stats`], boxed.
    fn stats_boxed(&self) -> OutboxFuture<'_, OutboxStats>;
    /// [`SqlTable::retry_failed`], boxed.
    fn retry_failed_boxed(&self, dry_run: bool) -> OutboxFuture<'_, u64>;
    /// [`SqlTable::purge_published`], boxed.
    fn purge_boxed(&self, age: Duration, batch: u32, dry: bool) -> OutboxFuture<'_, u64>;
}

/// The operator's counts and clean-ups as an outbox's inherent methods,
/// the same on every database (inside `impl` of a type whose `table`
/// field is its [`SqlTable`]).
macro_rules! operator_methods {
    () => {
        /// How many rows each status holds, and the age of the oldest
        /// pending row (by the database's clock).
        pub async fn stats(&self) -> Result<OutboxStats, OutboxError> {
            self.table.stats().await
        }

        /// Makes every `'failed'` row pending again, with its attempts back
        /// to 0 (its `last_error` stays), in one statement; how many. With
        /// `dry_run`, only counts them.
        pub async fn retry_failed(&self, dry_run: bool) -> Result<u64, OutboxError> {
            self.table.retry_failed(dry_run).await
        }

        /// Deletes the rows published longer than `older_than` ago, `batch`
        /// rows per statement (each its own short write; on PostgreSQL
        /// skipping rows another transaction holds), until none is left;
        /// how many. Pending and failed rows are never touched. With
        /// `dry_run`, only counts them.
        pub async fn purge_published(
            &self,
            older_than: std::time::Duration,
            batch: u32,
            dry_run: bool,
        ) -> Result<u64, OutboxError> {
            let purge = self.table.purge_published(older_than, batch, dry_run);
            purge.await
        }
    };
}
pub(super) use operator_methods;

/// [`SqlOperations`] for the tables of `$db`.
macro_rules! sql_operations {
    ($db:ty) => {
        impl SqlOperations for SqlTable<$db> {
            fn columns_boxed(&self) -> OutboxFuture<'_, Vec<String>> {
                Box::pin(self.columns())
            }

            fn stats_boxed(&self) -> OutboxFuture<'_, OutboxStats> {
                Box::pin(self.stats())
            }

            fn retry_failed_boxed(&self, dry_run: bool) -> OutboxFuture<'_, u64> {
                Box::pin(self.retry_failed(dry_run))
            }

            fn purge_boxed(&self, age: Duration, batch: u32, dry: bool) -> OutboxFuture<'_, u64> {
                Box::pin(self.purge_published(age, batch, dry))
            }
        }
    };
}

#[cfg(feature = "sqlite")]
sql_operations!(sqlx::Sqlite);
#[cfg(feature = "postgres")]
sql_operations!(sqlx::Postgres);
