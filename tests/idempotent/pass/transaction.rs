//! Transactional mode through the attribute, `transaction = tx`: a free fn,
//! a method on a service holding the store (and so its pool), and a handler
//! generic over its store. Each marks the id on the handler's own SQLite
//! connection: the effect and the mark commit, or roll back, together.

#[path = "../support.rs"]
mod support;

use std::future::Future;
use std::sync::OnceLock;

use babel_idem::store::TransactionalStore;
use babel_idem::{Envelope, idempotent};
use babel_idem::store::SqliteStore;
use sqlx::{Sqlite, SqliteConnection, Transaction};
use support::{HandlerError, Runs};

static STORE: OnceLock<SqliteStore> = OnceLock::new();
static RUNS: Runs = Runs::new();

fn store() -> &'static SqliteStore {
    STORE.get().expect("exercise opens the store first")
}

/// The handler's effect: a row in `effects`, on the transaction's connection.
async fn write_effect(tx: &mut SqliteConnection, env: &Envelope) -> Result<(), HandlerError> {
    sqlx::query("INSERT INTO effects (message_id) VALUES (?1)")
        .bind(env.meta.id.as_deref())
        .execute(tx)
        .await
        .map(drop)
        .map_err(|_| HandlerError::Refused)
}

/// A free fn on a plain connection.
#[idempotent(store = store(), transaction = tx)]
async fn on_credit(env: Envelope, tx: &mut SqliteConnection) -> Result<(), HandlerError> {
    write_effect(tx, &env).await?;
    RUNS.record(&env)
}

/// A service holding the store: the transaction parameter is a `sqlx::Transaction`.
struct Ledger {
    store: SqliteStore,
    runs: Runs,
}

impl Ledger {
    #[idempotent(store = self.store, transaction = tx, scope = "ledger")]
    async fn on_credit(
        &self,
        env: &Envelope,
        tx: &mut Transaction<'_, Sqlite>,
    ) -> Result<(), HandlerError> {
        write_effect(tx, env).await?;
        self.runs.record(env)
    }
}

static GENERIC_RUNS: Runs = Runs::new();

/// Generic over the store: any `TransactionalStore` on SQLite will do.
#[idempotent(store = store, transaction = tx)]
async fn generic<S>(store: &S, env: Envelope, tx: &mut SqliteConnection) -> Result<(), HandlerError>
where
    S: TransactionalStore<Connection = SqliteConnection> + ?Sized,
{
    write_effect(tx, &env).await?;
    GENERIC_RUNS.record(&env)
}

/// One delivery as a broker loop makes it: begin, run the handler, commit on
/// `Ok`, roll back on `Err`.
async fn deliver<H, Fut>(pool: &sqlx::SqlitePool, env: Envelope, handler: H) -> Result<(), HandlerError>
where
    H: FnOnce(Envelope, Transaction<'static, Sqlite>) -> Fut,
    Fut: Future<Output = (Transaction<'static, Sqlite>, Result<(), HandlerError>)>,
{
    let tx = pool.begin().await.expect("begin");
    let (tx, result) = handler(env, tx).await;
    match result {
        Ok(()) => tx.commit().await.expect("commit"),
        Err(_) => tx.rollback().await.expect("rollback"),
    }
    result
}

async fn effects(store: &SqliteStore) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM effects")
        .fetch_one(store.pool())
        .await
        .expect("count")
}

async fn open() -> SqliteStore {
    let store = SqliteStore::in_memory().await.expect("in-memory store");
    sqlx::query("CREATE TABLE effects (message_id TEXT)")
        .execute(store.pool())
        .await
        .expect("effects table");
    store
}

pub async fn exercise() {
    if STORE.get().is_none() {
        let _ = STORE.set(open().await);
    }
    let pool = store().pool().clone();
    let before = effects(store()).await;
    support::check_contract(&RUNS, |env| {
        deliver(&pool, env, |env, mut tx| async move {
            let result = on_credit(env, &mut tx).await;
            (tx, result)
        })
    })
    .await;
    // One run succeeded with the id (the failed one rolled back, the
    // duplicate skipped) and two without an id: three committed effects.
    assert_eq!(effects(store()).await, before + 3);

    let ledger = Ledger {
        store: open().await,
        runs: Runs::new(),
    };
    let pool = ledger.store.pool().clone();
    support::check_contract(&ledger.runs, |env| {
        let ledger = &ledger;
        deliver(&pool, env, move |env, mut tx| async move {
            let result = ledger.on_credit(&env, &mut tx).await;
            (tx, result)
        })
    })
    .await;
    assert_eq!(effects(&ledger.store).await, 3);

    let generic_store = open().await;
    let pool = generic_store.pool().clone();
    support::check_contract(&GENERIC_RUNS, |env| {
        let store = &generic_store;
        deliver(&pool, env, move |env, mut tx| async move {
            let result = generic(store, env, &mut tx).await;
            (tx, result)
        })
    })
    .await;
    assert_eq!(effects(&generic_store).await, 3);
}

fn main() {
    support::block_on(exercise());
}
