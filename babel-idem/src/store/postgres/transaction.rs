//! [`TransactionalStore`] for [`PostgresStore`]: `remember`'s statement, run
//! on the handler's connection instead of the store's pool.

use sqlx::{PgConnection, Postgres};

use super::claim::failure;
use super::{BACKEND, PostgresStore, UnstorableId};
use crate::store::settings::run_mark;
use crate::store::transaction::{AsConnection, TransactionalStore};
use crate::store::{StoreError, StoreFuture, StoreOperation};

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
}
