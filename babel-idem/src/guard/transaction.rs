//! Transactional mode's decision table (see [`guide::modes`](crate::guide::modes)): mark the id on
//! the handler's own connection, inside its transaction, then run or skip.
//! The caller owns the transaction: it begins it, and commits or rolls back
//! the effect and the mark together.

use std::future::Future;

use super::context::body_starts;
use super::{Guard, report, store_failed};
use crate::key::DedupeKey;
use crate::message::MessageId;
use crate::store::{AsConnection, TransactionMisuse, TransactionalStore};
use crate::store::{Store, StoreError};
use crate::telemetry::metrics::Decision;

/// Transactional mode, made by [`Guard::transactional`]: the mark is a row
/// inserted on the handler's connection before the body runs, so it commits
/// or rolls back with the handler's effect.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Transactional;

impl<S: Store, Mode> Guard<S, Mode> {
    /// Turns on transactional mode (see [`guide::modes`](crate::guide::modes)), for a handler whose
    /// effect is a write to the database that holds the store's table
    /// (`PostgresStore`,
    /// [`SqliteStore`](crate::store::SqliteStore)).
    ///
    /// [`run`](Guard::run) then takes the handler's connection (or its
    /// `sqlx::Transaction`) and, before the body, marks the id on it with
    /// one `INSERT ... ON CONFLICT` (the seen-set's own row, the table the
    /// Go SDK reads; an expired mark is replaced, as `remember` does):
    ///
    /// | the mark | the guard | the caller then |
    /// |---|---|---|
    /// | no usable id | runs the body, marks nothing (`fail_open`) | commits on `Ok` |
    /// | inserted | runs the body; `Ok` (`ran`) or its error (`failed`) | commits on `Ok`, rolls back on `Err`: effect and mark together |
    /// | a live mark (committed, or in this transaction) | skips the body, returns `Ok` (`skipped`) | commits (nothing to write), acks |
    /// | a concurrent transaction holds it | waits for it: skips once it commits, runs once it rolls back | |
    /// | the statement fails | does not run the body, returns the store error (`store_failed`) | rolls back, retries |
    ///
    /// A crash between the body's write and the commit loses both: the
    /// redelivery runs once. There is no lease and no window, but the mark
    /// only protects effects written in that same transaction; a call to
    /// another system from the body can still happen twice.
    ///
    /// [`OnRememberFailure`](crate::guard::OnRememberFailure) has no say here: a
    /// mark that fails is known before the body runs.
    ///
    /// # From a broker loop
    ///
    /// The handler that runs the guard is given the transaction; whoever
    /// calls it (a `Router` handler, a consumer loop)
    /// begins it, commits on `Ok`, drops (rolls back) on `Err`, and acks
    /// only after the commit. `examples/ledger.rs` does this through a
    /// `Router` end to end.
    ///
    /// ```
    /// use babel_idem::{Envelope, Guard, StoreError};
    /// use babel_idem::store::SqliteStore;
    /// use serde_json::json;
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// let store = SqliteStore::in_memory().await?;
    /// let guard = Guard::new(&store).transactional();
    /// let env = Envelope::new("urn:babel:ledger:credited", json!({"amount": 5}));
    ///
    /// for _delivery in 0..3 {
    ///     let mut tx = store.pool().begin().await.map_err(anyhow::Error::from)?;
    ///     guard
    ///         .run(&env, &mut tx, |tx| async move {
    ///             sqlx::query("SELECT 1").execute(&mut **tx).await?; // the effect
    ///             Ok::<(), anyhow::Error>(())
    ///         })
    ///         .await?;
    ///     tx.commit().await?; // effect and mark, together; then ack
    /// }
    /// let id = babel_idem::MessageId::message_id(&env).unwrap();
    /// assert!(babel_idem::Store::seen(&store, id).await?);
    /// # Ok::<(), anyhow::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn transactional(self) -> Guard<S, Transactional>
    where
        S: TransactionalStore,
    {
        Guard {
            store: self.store,
            scope: self.scope,
            on_remember_failure: self.on_remember_failure,
            mode: Transactional,
        }
    }
}

impl<S: TransactionalStore> Guard<S, Transactional> {
    /// Runs `body` for `message` in transactional mode (see
    /// [`Guard::transactional`]): marks the id on `connection`, then hands
    /// `connection` to `body`. `connection` is the handler's
    /// `&mut sqlx::PgConnection` / `&mut sqlx::SqliteConnection`, or a
    /// `&mut sqlx::Transaction` over one; the future does not borrow the
    /// message.
    pub fn run<'g, 'c, M, C, B, F, E>(
        &'g self,
        message: &M,
        connection: &'c mut C,
        body: B,
    ) -> impl Future<Output = Result<(), E>> + use<'g, 'c, S, M, C, B, F, E>
    where
        M: MessageId + ?Sized,
        C: AsConnection<S::Connection> + ?Sized,
        B: FnOnce(&'c mut C) -> F,
        F: Future<Output = Result<(), E>>,
        E: From<StoreError>,
    {
        self.run_keyed(self.key(message), connection, body)
    }

    /// [`Guard::run`] with a key taken earlier with [`Guard::key`], for a
    /// body that owns the message. The decision itself; the table is on
    /// [`Guard::transactional`].
    pub async fn run_keyed<'c, C, B, F, E>(
        &self,
        key: DedupeKey,
        connection: &'c mut C,
        body: B,
    ) -> Result<(), E>
    where
        C: AsConnection<S::Connection> + ?Sized,
        B: FnOnce(&'c mut C) -> F,
        F: Future<Output = Result<(), E>>,
        E: From<StoreError>,
    {
        let (store, key) = (&self.store, &key);
        // Before the mark: its row stays locked while the body waits.
        if let Some(take_back) = body_starts() {
            take_back.await;
        }
        let Some(id) = key.as_str() else {
            report(Decision::FailOpen, "");
            return body(connection).await;
        };

        // A connection in autocommit would commit the mark on its own, before
        // the effect: refused before anything is written.
        let token = match store.open_guard(connection.as_connection()).await {
            Ok(token) => token,
            Err(error) => return store_failed(id, error),
        };
        match store.mark_in(connection.as_connection(), id).await {
            Ok(true) => {}
            Ok(false) => {
                report(Decision::Skipped, id);
                return Ok(());
            }
            Err(error) => return store_failed(id, error),
        }

        // The mark stands or falls with the body's writes: an `Err` here is for
        // the caller to roll back, which takes the mark away too.
        let result = body(connection).await;
        // Unless the body ended the transaction itself: then the mark may have
        // committed without the rest of the effect, and success is not ours to
        // report.
        let ended = match store.check_ended(id, token).await {
            Err(error) if is_misuse(&error) => Some(error),
            Err(error) if result.is_ok() => return store_failed(id, error),
            _ => None,
        };
        if let Some(error) = ended {
            if result.is_err() {
                // A failed body whose mark committed would be skipped on every
                // redelivery: the id is unmarked so that it runs again.
                if let Err(forget) = store.forget(id).await {
                    tracing::warn!(
                        target: "babel_idem",
                        message_id = id,
                        %forget,
                        "the handler ended its transaction and failed; its mark could not be removed",
                    );
                }
            }
            report(Decision::Failed, id);
            return match result {
                Ok(()) => store_failed(id, error),
                Err(body) => {
                    tracing::warn!(target: "babel_idem", message_id = id, %error);
                    Err(body)
                }
            };
        }
        report(
            if result.is_ok() {
                Decision::Ran
            } else {
                Decision::Failed
            },
            id,
        );
        result
    }
}

/// Whether `error` is the store saying the handler ended its transaction.
fn is_misuse(error: &StoreError) -> bool {
    std::error::Error::source(error)
        .and_then(|source| source.downcast_ref::<TransactionMisuse>())
        .is_some()
}
