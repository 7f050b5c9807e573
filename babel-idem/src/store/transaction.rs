//! What transactional mode needs from a store (see [`guide::modes`](crate::guide::modes)): the
//! connection type its table lives behind, and one statement that marks an
//! id on a connection the caller holds, inside the caller's transaction.
//!
//! [`TransactionalStore`] is public so a store of your own (another SQL
//! database, a wrapper) can join transactional mode; [`PostgresStore`] and
//! [`SqliteStore`] implement it, and it is forwarded through `&S`, `Arc<S>`
//! and `Box<S>`. [`AsConnection`] says which handler parameters can lend
//! that connection: the connection itself and a `sqlx::Transaction` over it.
//!
//! [`PostgresStore`]: crate::store::PostgresStore
//! [`SqliteStore`]: crate::store::SqliteStore

use std::sync::Arc;

use super::{Store, StoreFuture};

/// Why a [`TransactionalStore`] refused a connection, as the source of the
/// [`StoreError`](crate::store::StoreError) the guard returns: the mark
/// belongs inside the handler's transaction, and the connection had none
/// open, or lost it while the handler ran.
///
/// ```
/// use babel_idem::store::TransactionMisuse;
///
/// assert!(TransactionMisuse::NotOpen.to_string().contains("no transaction open"));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TransactionMisuse {
    /// The connection was in autocommit (a `pool.acquire()`d connection,
    /// not `pool.begin()`): the mark would commit on its own, before the
    /// handler's effect. Nothing was marked and the handler did not run.
    #[error(
        "transactional mode needs a connection inside a transaction, and this one has \
         no transaction open (begin one with `pool.begin()`): nothing was marked and \
         the handler did not run"
    )]
    NotOpen,
    /// The transaction that held the mark ended while the handler ran (the
    /// handler ran `COMMIT` or `ROLLBACK` itself): the mark and the effect
    /// no longer commit together.
    #[error(
        "the transaction that held the mark ended while the handler ran (the handler \
         ran COMMIT or ROLLBACK itself): the mark and the effect no longer commit \
         together; leave the transaction's end to the caller"
    )]
    EndedInHandler,
}

/// A store whose marks are rows a handler can insert on its own database
/// connection, so the mark commits or rolls back with the handler's effect.
///
/// The decision (insert, then run or skip) is the guard's
/// ([`Guard::transactional`](crate::guard::Guard::transactional)); a store only
/// translates [`mark_in`](TransactionalStore::mark_in) into its database's
/// statement.
///
/// ```
/// use babel_idem::store::TransactionalStore;
/// use babel_idem::store::SqliteStore;
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let store = SqliteStore::in_memory().await?;
/// let mut tx = store.pool().begin().await.unwrap();
/// assert!(store.mark_in(&mut tx, "id-A").await?, "absent: marked");
/// assert!(!store.mark_in(&mut tx, "id-A").await?, "a live mark: not marked again");
/// tx.rollback().await.unwrap();
/// let mut tx = store.pool().begin().await.unwrap();
/// assert!(store.mark_in(&mut tx, "id-A").await?, "the rollback took the mark away");
/// # Ok::<(), babel_idem::StoreError>(())
/// # }).unwrap();
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot mark a message inside a database transaction",
    label = "not a store with a SQL table",
    note = "`transaction = ...` (and `Guard::transactional`) needs a store whose table the \
            handler's connection can write: `babel_idem::store::PostgresStore` or `babel_idem::store::SqliteStore` \
            (or a reference / `Arc` to one)"
)]
pub trait TransactionalStore: Store {
    /// The connection the store's table is reached through, which the
    /// handler's transaction runs on: `sqlx::PgConnection`,
    /// `sqlx::SqliteConnection`.
    type Connection: Send + ?Sized;

    /// Marks `id` on `connection`, as part of whatever transaction is open
    /// there: inserts it, or replaces a mark whose TTL has run out. `true`
    /// when it marked, `false` when a live mark was already there
    /// (committed, or written earlier in this same transaction).
    ///
    /// A concurrent transaction that marked `id` and has not finished makes
    /// this wait for it (on the primary key, or SQLite's write lock): `false`
    /// once it commits, `true` once it rolls back.
    fn mark_in<'a>(
        &'a self,
        connection: &'a mut Self::Connection,
        id: &'a str,
    ) -> StoreFuture<'a, bool>;

    /// Checks, on the server, that `connection` has a transaction open;
    /// runs before the mark. Returns what names that transaction for
    /// `check_ended` (PostgreSQL: its transaction id; `None` where the
    /// database has no such name). A hook of the guard's, off the
    /// documented contract: the default checks nothing.
    ///
    /// Fails with a [`StoreError`](crate::store::StoreError) whose source is
    /// [`TransactionMisuse::NotOpen`] when the connection is in autocommit,
    /// leaving nothing behind.
    #[doc(hidden)]
    fn open_guard<'a>(
        &'a self,
        connection: &'a mut Self::Connection,
    ) -> StoreFuture<'a, Option<u64>> {
        let _ = connection;
        StoreFuture::ready(Ok(None))
    }

    /// After the body, from another connection of the store: fails with a
    /// [`StoreError`](crate::store::StoreError) whose source is
    /// [`TransactionMisuse::EndedInHandler`] when the transaction that
    /// marked `id` (named by `token`, from `open_guard`) has ended already,
    /// committed or rolled back by the handler itself. A hook of the
    /// guard's, off the documented contract: the default checks nothing.
    #[doc(hidden)]
    fn check_ended<'a>(&'a self, id: &'a str, token: Option<u64>) -> StoreFuture<'a, ()> {
        let _ = (id, token);
        StoreFuture::ready(Ok(()))
    }
}

macro_rules! forward_transactional {
    ($($ty:ty),+ $(,)?) => {$(
        impl<S: TransactionalStore + ?Sized> TransactionalStore for $ty {
            type Connection = S::Connection;

            #[inline]
            fn mark_in<'a>(
                &'a self,
                connection: &'a mut Self::Connection,
                id: &'a str,
            ) -> StoreFuture<'a, bool> {
                (**self).mark_in(connection, id)
            }

            #[inline]
            fn open_guard<'a>(
                &'a self,
                connection: &'a mut Self::Connection,
            ) -> StoreFuture<'a, Option<u64>> {
                (**self).open_guard(connection)
            }

            #[inline]
            fn check_ended<'a>(&'a self, id: &'a str, token: Option<u64>) -> StoreFuture<'a, ()> {
                (**self).check_ended(id, token)
            }
        }
    )+};
}

forward_transactional!(&S, Arc<S>, Box<S>);

/// A handler parameter that lends the connection `C` its transaction runs
/// on: `C` itself (`&mut sqlx::PgConnection`, `&mut sqlx::SqliteConnection`)
/// or a `sqlx::Transaction` over it.
///
/// ```
/// use babel_idem::store::AsConnection;
///
/// fn lends_sqlite<T: AsConnection<sqlx::SqliteConnection> + ?Sized>() {}
/// lends_sqlite::<sqlx::SqliteConnection>();
/// lends_sqlite::<sqlx::Transaction<'static, sqlx::Sqlite>>();
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a connection the store's marks can be written on",
    label = "expected a connection to the database of the `store = ...`",
    note = "`transaction = ...` names the handler's connection parameter: `&mut sqlx::PgConnection` \
            for a `PostgresStore`, `&mut sqlx::SqliteConnection` for a `SqliteStore`, or a \
            `&mut sqlx::Transaction<'_, _>` over one"
)]
pub trait AsConnection<C: ?Sized> {
    /// The connection, borrowed for one statement.
    fn as_connection(&mut self) -> &mut C;
}
