//! [`TransactionalStore`] for [`SqliteStore`]: `remember`'s statement, run
//! on the handler's connection instead of the store's pool.

use sqlx::{Sqlite, SqliteConnection};

use super::{BACKEND, SqliteStore};
use crate::store::settings::run_mark;
use crate::store::transaction::{AsConnection, TransactionMisuse, TransactionalStore};
use crate::store::{StoreError, StoreFuture, StoreOperation, failed};

/// A probe that succeeds only in autocommit: SQLite refuses a `BEGIN`
/// inside a transaction, and a `SAVEPOINT` there would begin one instead
/// of failing.
const PROBE: &str = "BEGIN";
const UNDO_PROBE: &str = "ROLLBACK";
/// SQLite's text for a `BEGIN` inside a transaction.
const IN_TRANSACTION: &str = "within a transaction";

/// Whether `error` is SQLite saying `text`.
fn says(error: &sqlx::Error, text: &str) -> bool {
    matches!(error, sqlx::Error::Database(db) if db.message().contains(text))
}

fn misuse(misuse: TransactionMisuse) -> StoreError {
    StoreError::new(StoreOperation::Remember, BACKEND, misuse)
}

impl AsConnection<SqliteConnection> for SqliteConnection {
    #[inline]
    fn as_connection(&mut self) -> &mut SqliteConnection {
        self
    }
}

impl AsConnection<SqliteConnection> for sqlx::Transaction<'_, Sqlite> {
    #[inline]
    fn as_connection(&mut self) -> &mut SqliteConnection {
        self
    }
}

/// # Transactional mode
///
/// `mark_in` runs [`remember_statement`](SqliteStore::remember_statement)
/// (`INSERT ... ON CONFLICT (message_id) DO UPDATE ... WHERE` the existing
/// row has expired) on the handler's connection: one row changed means
/// marked (inserted, or an expired mark replaced), none means a live mark
/// is there. Other connections see the row once the transaction commits.
///
/// SQLite has one writer at a time: a concurrent transaction that marked
/// the same id holds the write lock, so the statement waits (up to the
/// store's busy timeout, which [`open`](SqliteStore::open) sets with WAL
/// mode) and then finds its row (commit) or none (rollback). Begin the
/// transaction on the store's pool (`store.pool().begin()`) so those
/// settings apply, and let the mark be the transaction's first statement
/// (the guard runs it before the body): a deferred transaction that read
/// first cannot wait for the lock and fails with `SQLITE_BUSY` instead
/// (`BEGIN IMMEDIATE` avoids that too).
///
/// What the mark costs is mostly pages, not the statement: its row lands on
/// a leaf of the table (ordered by id, so a random one) and on the
/// `expires_at` index, so a commit writes those pages to the WAL beside the
/// effect's own, and the WAL fills and is checkpointed (synced) sooner.
///
/// The store's `synchronous = NORMAL` keeps each commit atomic (the effect
/// and the mark survive or vanish together, whatever crashes), but a power
/// loss may undo the last commits, acked or not. A consumer that needs an
/// acked effect to survive power loss opens its own pool with
/// `synchronous = FULL` (one sync per commit) and builds the store on it
/// with [`from_pool`](SqliteStore::from_pool).
///
/// The guard's checks: a `BEGIN` before the mark fails inside a transaction
/// and succeeds in autocommit (then rolled back at once, and the connection
/// refused, nothing written). After the body, a mark that another
/// connection can already read was committed by the handler itself (SQLite
/// has one writer: while the mark's transaction is open, no other can
/// commit that id). That check takes an idle connection of the pool and is
/// skipped when none is idle, so it never waits for the handler's own.
impl TransactionalStore for SqliteStore {
    type Connection = SqliteConnection;

    fn mark_in<'a>(
        &'a self,
        connection: &'a mut SqliteConnection,
        id: &'a str,
    ) -> StoreFuture<'a, bool> {
        let sql = &self.settings.sql.remember;
        StoreFuture::new(async move {
            run_mark(connection, sql, id, self.settings.ttl_ms)
                .await
                .map_err(failed(BACKEND, StoreOperation::Remember))
        })
    }

    fn open_guard<'a>(
        &'a self,
        connection: &'a mut SqliteConnection,
    ) -> StoreFuture<'a, Option<u64>> {
        StoreFuture::new(async move {
            let failed = failed(BACKEND, StoreOperation::Remember);
            match sqlx::Executor::execute(&mut *connection, PROBE).await {
                Ok(_) => {
                    sqlx::Executor::execute(&mut *connection, UNDO_PROBE)
                        .await
                        .map_err(failed)?;
                    Err(misuse(TransactionMisuse::NotOpen))
                }
                Err(e) if says(&e, IN_TRANSACTION) => Ok(None),
                Err(e) => Err(failed(e)),
            }
        })
    }

    fn check_ended<'a>(&'a self, id: &'a str, _token: Option<u64>) -> StoreFuture<'a, ()> {
        StoreFuture::new(async move {
            let Some(mut other) = self.pool().try_acquire() else {
                return Ok(());
            };
            let committed = sqlx::query_scalar::<_, bool>(&self.settings.sql.seen)
                .bind(id)
                .fetch_one(&mut *other)
                .await
                .map_err(failed(BACKEND, StoreOperation::Remember))?;
            if committed {
                Err(misuse(TransactionMisuse::EndedInHandler))
            } else {
                Ok(())
            }
        })
    }
}
