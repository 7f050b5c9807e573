//! [`TransactionalStore`] for [`PostgresStore`]: `remember`'s statement, run
//! on the handler's connection instead of the store's pool.

use sqlx::{PgConnection, Postgres, Row};

use super::claim::failure;
use super::{BACKEND, PostgresStore, UnstorableId};
use crate::store::settings::run_mark;
use crate::store::transaction::{AsConnection, TransactionMisuse, TransactionalStore};
use crate::store::{StoreError, StoreFuture, StoreOperation, failed};

/// Fails in autocommit (`25P01`): a savepoint needs a transaction block.
/// Released at once; the transaction id it reads names the transaction.
const OPEN: &str = "SAVEPOINT babel_idem_guard; RELEASE SAVEPOINT babel_idem_guard; \
                    SELECT pg_current_xact_id()::text::bigint";

/// `no_active_sql_transaction`: a savepoint statement in autocommit.
const NO_TRANSACTION: &str = "25P01";

/// The SQLSTATE of a database error, if `error` is one.
fn sqlstate(error: &sqlx::Error) -> Option<String> {
    match error {
        sqlx::Error::Database(db) => db.code().map(|code| code.into_owned()),
        _ => None,
    }
}

fn misuse(misuse: TransactionMisuse) -> StoreError {
    StoreError::new(StoreOperation::Remember, BACKEND, misuse)
}

impl AsConnection<PgConnection> for PgConnection {
    #[inline]
    fn as_connection(&mut self) -> &mut PgConnection {
        self
    }
}

impl AsConnection<PgConnection> for sqlx::Transaction<'_, Postgres> {
    #[inline]
    fn as_connection(&mut self) -> &mut PgConnection {
        self
    }
}

/// # Transactional mode
///
/// `mark_in` runs [`remember_statement`](PostgresStore::remember_statement)
/// (`INSERT ... ON CONFLICT (message_id) DO UPDATE ... WHERE` the existing
/// row has expired) on the handler's connection: one row affected means
/// marked (inserted, or an expired mark replaced), none means a live mark
/// is there. The row is the seen-set's own, in the Go SDK's table, and
/// other connections (a Go consumer, `seen`) see it only once the
/// handler's transaction commits.
///
/// Under `READ COMMITTED` (PostgreSQL's default) a concurrent transaction
/// that marked the same id makes the statement wait on the primary key,
/// then find its row (commit: not marked) or none (rollback: marked).
/// Under `REPEATABLE READ` or `SERIALIZABLE` the waiting statement fails
/// with a serialization error instead: the guard returns it, the caller
/// rolls back, and the redelivery skips.
///
/// A statement that fails aborts the transaction: the caller must roll back.
///
/// The guard's checks: `SAVEPOINT` before the mark fails in autocommit
/// (`25P01`), so a connection with no transaction open is refused before
/// anything is written; after the body, `pg_xact_status` of the
/// transaction's id, asked on another connection of the pool, says whether
/// the handler ended it with its own `COMMIT` or `ROLLBACK`.
impl TransactionalStore for PostgresStore {
    type Connection = PgConnection;

    fn mark_in<'a>(
        &'a self,
        connection: &'a mut PgConnection,
        id: &'a str,
    ) -> StoreFuture<'a, bool> {
        StoreFuture::new(async move {
            let operation = StoreOperation::Remember;
            UnstorableId::check(id).map_err(|e| StoreError::new(operation, BACKEND, e))?;
            run_mark(
                connection,
                &self.settings.sql.remember,
                id,
                self.settings.ttl_ms,
            )
            .await
            .map_err(|e| failure(operation, id, e))
        })
    }

    fn open_guard<'a>(&'a self, connection: &'a mut PgConnection) -> StoreFuture<'a, Option<u64>> {
        StoreFuture::new(async move {
            let rows = match sqlx::Executor::fetch_all(connection, OPEN).await {
                Ok(rows) => rows,
                Err(e) if sqlstate(&e).as_deref() == Some(NO_TRANSACTION) => {
                    return Err(misuse(TransactionMisuse::NotOpen));
                }
                Err(e) => return Err(failed(BACKEND, StoreOperation::Remember)(e)),
            };
            let xid: Option<i64> = match rows.last() {
                Some(row) => row
                    .try_get(0)
                    .map_err(failed(BACKEND, StoreOperation::Remember))?,
                None => None,
            };
            Ok(xid.map(|xid| xid as u64))
        })
    }

    fn check_ended<'a>(&'a self, _id: &'a str, token: Option<u64>) -> StoreFuture<'a, ()> {
        StoreFuture::new(async move {
            let Some(xid) = token else { return Ok(()) };
            let status: Option<String> =
                sqlx::query_scalar("SELECT pg_xact_status($1::text::xid8)")
                    .bind(xid.to_string())
                    .fetch_one(&self.pool)
                    .await
                    .map_err(failed(BACKEND, StoreOperation::Remember))?;
            match status.as_deref() {
                Some("in progress") => Ok(()),
                _ => Err(misuse(TransactionMisuse::EndedInHandler)),
            }
        })
    }
}
