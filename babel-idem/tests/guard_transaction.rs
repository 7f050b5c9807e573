//! Transactional mode (see `babel_idem::guide::modes`) on real databases: real
//! PostgreSQL (`BABEL_IDEM_POSTGRES_URL`, a unique table per run, dropped
//! after) and SQLite files in a temporary folder.
//!
//! - A process aborted after the handler's write and before the commit
//!   leaves neither: restarted, the message runs once, one effect row.
//! - A fleet of OS processes (this test binary, started again with
//!   `--ignored --exact transaction_worker`) delivering the same ids, 10% of
//!   runs failing and rolled back: one effect per id, and the effect rows
//!   and the marks name exactly the same ids.
//! - A plain `SELECT` on the table from another connection (what a Go
//!   consumer runs) sees a mark only once its transaction commits.
//! - A concurrent duplicate waits for the first transaction, then skips
//!   (commit) or runs (rollback).
#![cfg(feature = "postgres")]

#[allow(unreachable_pub)]
#[path = "store_contract/postgres_locks.rs"]
mod postgres_locks;
#[allow(dead_code, unreachable_pub)]
#[path = "store_contract/servers.rs"]
mod servers;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use babel_idem::{Guard, MessageId, Store, StoreError};

use babel_idem::store::{PostgresStore, SqliteStore, TransactionMisuse};

const WORKER_ENV: &str = "BABEL_IDEM_TX_WORKER";
/// Distinct ids each fleet process delivers, in its own shuffled order.
const IDS: usize = 2000;
/// Concurrent deliveries inside one fleet process.
const TASKS: usize = 4;
/// A hang (a lost wake-up, a lock never released) fails the test here.
const DEADLINE: Duration = Duration::from_secs(120);

/// A message whose id is a plain string.
struct Message(String);

impl MessageId for Message {
    fn message_id(&self) -> Option<&str> {
        Some(&self.0)
    }
}

// The fields are read through `Debug`, when a delivery's error is printed.
#[allow(dead_code)]
#[derive(Debug)]
enum RunError {
    /// The handler failed on purpose, after its write.
    Failed,
    Store(StoreError),
    Sql(sqlx::Error),
}

impl From<StoreError> for RunError {
    fn from(error: StoreError) -> Self {
        RunError::Store(error)
    }
}

impl From<sqlx::Error> for RunError {
    fn from(error: sqlx::Error) -> Self {
        RunError::Sql(error)
    }
}

/// One database: the store (its table holds the marks) and the effect table.
#[derive(Clone)]
enum Db {
    Postgres {
        store: PostgresStore,
        effects: String,
    },
    Sqlite {
        store: SqliteStore,
        effects: String,
    },
}

/// Runs `$body` with `$store` and `$effects` bound for either backend; each
/// arm is type-checked for its own database.
macro_rules! on_db {
    ($db:expr, |$store:ident, $effects:ident| $body:expr) => {
        match $db {
            Db::Postgres {
                store: $store,
                effects: $effects,
            } => $body,
            Db::Sqlite {
                store: $store,
                effects: $effects,
            } => $body,
        }
    };
}

/// What happens between the handler's write and the end of its transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Then {
    Commit,
    /// The handler fails after its write: rolled back.
    Fail,
    /// The process aborts before the commit.
    Abort,
}

impl Db {
    /// Where a child process finds this database: `<backend> <table> <effects> <location>`.
    fn spec(&self, location: &str) -> String {
        on_db!(self, |store, effects| {
            let backend = match self {
                Db::Postgres { .. } => "postgres",
                Db::Sqlite { .. } => "sqlite",
            };
            format!("{backend} {} {effects} {location}", store.table())
        })
    }

    async fn open(spec: &str) -> Db {
        let parts: Vec<&str> = spec.splitn(4, ' ').collect();
        let [backend, table, effects, location] = parts[..] else {
            panic!("a database spec is `<backend> <table> <effects> <location>`, got {spec:?}");
        };
        let effects = effects.to_owned();
        match backend {
            "postgres" => {
                let store = PostgresStore::builder()
                    .table(table)
                    .max_connections(TASKS as u32 + 2)
                    .connect_lazy(location)
                    .expect("a PostgreSQL store");
                Db::Postgres { store, effects }
            }
            "sqlite" => {
                let store = SqliteStore::builder()
                    .table(table)
                    .open(location)
                    .await
                    .expect("a SQLite store");
                Db::Sqlite { store, effects }
            }
            other => panic!("no backend {other:?}"),
        }
    }

    /// Creates the marks table and the effect table (no key: a second
    /// effect of one id would be a second row).
    async fn create(&self) {
        on_db!(self, |store, effects| {
            store.migrate().await.expect("migrate");
            sqlx::query(&format!(
                "CREATE TABLE IF NOT EXISTS {effects} (message_id TEXT NOT NULL)"
            ))
            .execute(store.pool())
            .await
            .expect("the effect table");
        })
    }

    async fn drop_tables(&self) {
        on_db!(self, |store, effects| {
            let table = store.table();
            let claims = format!("{table}_claims");
            for statement in [
                format!("DROP TABLE IF EXISTS {effects}"),
                format!("DROP TABLE IF EXISTS {table}"),
                format!("DROP TABLE IF EXISTS {claims}"),
                format!("DROP SEQUENCE IF EXISTS {claims}_fence"),
            ] {
                if matches!(self, Db::Sqlite { .. }) && statement.contains("SEQUENCE") {
                    continue;
                }
                sqlx::query(&statement)
                    .execute(store.pool())
                    .await
                    .expect("drop");
            }
        })
    }

    /// One delivery as a broker loop makes it: begin, the guarded handler
    /// (write the effect, then `then`), commit on `Ok`, roll back on `Err`.
    /// `Ok(true)` when the handler's body ran and committed.
    async fn deliver(&self, id: &str, then: Then) -> Result<bool, RunError> {
        on_db!(self, |store, effects| {
            let mut tx = store.pool().begin().await?;
            let mut ran = false;
            let insert = format!("INSERT INTO {effects} (message_id) VALUES ($1)");
            let result = Guard::new(store)
                .transactional()
                .run(&Message(id.to_owned()), &mut tx, |tx| async {
                    ran = true;
                    sqlx::query(&insert).bind(id).execute(&mut **tx).await?;
                    match then {
                        Then::Commit => Ok(()),
                        Then::Fail => Err(RunError::Failed),
                        Then::Abort => std::process::abort(),
                    }
                })
                .await;
            match result {
                Ok(()) => {
                    tx.commit().await?;
                    Ok(ran)
                }
                Err(error) => {
                    tx.rollback().await?;
                    Err(error)
                }
            }
        })
    }

    /// A plain query on the table, from the pool (not the transaction's
    /// connection): what a Go consumer reading the table sees.
    async fn marked(&self, id: &str) -> bool {
        on_db!(self, |store, _effects| {
            let query = format!(
                "SELECT count(*) FROM {} WHERE message_id = $1",
                store.table()
            );
            let count: i64 = sqlx::query_scalar(&query)
                .bind(id)
                .fetch_one(store.pool())
                .await
                .expect("count marks");
            count == 1
        })
    }

    async fn count(&self, query: String) -> i64 {
        on_db!(self, |store, _effects| sqlx::query_scalar(&query)
            .fetch_one(store.pool())
            .await
            .expect("count"))
    }

    async fn effects_of(&self, id: &str) -> i64 {
        let effects = on_db!(self, |_store, effects| effects.clone());
        self.count(format!(
            "SELECT count(*) FROM {effects} WHERE message_id = '{id}'"
        ))
        .await
    }

    fn store(&self) -> &dyn Store {
        on_db!(self, |store, _effects| store)
    }
}

/// A fresh PostgreSQL database (unique tables), or `None` when skipped.
fn postgres(test: &str) -> Option<(Db, String)> {
    let url = servers::server_url(servers::POSTGRES_URL, test)?;
    let suffix = servers::unique_suffix();
    let store = PostgresStore::builder()
        .table(format!("tx_marks_{suffix}"))
        .max_connections(TASKS as u32 + 2)
        .connect_lazy(&url)
        .expect("a PostgreSQL store");
    let effects = format!("tx_effects_{suffix}");
    Some((Db::Postgres { store, effects }, url))
}

/// A SQLite file in a fresh temporary folder (removed by the caller).
async fn sqlite() -> (Db, PathBuf) {
    let dir = std::env::temp_dir().join(format!("babel-idem-tx-{}", servers::unique_suffix()));
    std::fs::create_dir_all(&dir).expect("a temporary folder");
    let path = dir.join("ledger.db");
    let store = SqliteStore::builder()
        .table("tx_marks")
        .open(&path)
        .await
        .expect("a SQLite store");
    let effects = "tx_effects".to_owned();
    (Db::Sqlite { store, effects }, dir)
}

fn spawn_child(mode: &str, spec: &str) -> std::process::Child {
    Command::new(std::env::current_exe().expect("the test binary"))
        .args(["--ignored", "--exact", "transaction_worker", "--nocapture"])
        .env(WORKER_ENV, format!("{mode} {spec}"))
        .stdout(Stdio::null())
        .spawn()
        .expect("start a child process")
}

// ---------------------------------------------------------------- child

/// A child process: `abort <id> <db spec>` delivers one message and aborts
/// before the commit; `fleet <db spec>` delivers every id until it is acked.
#[test]
#[ignore = "a child process: started by the tests in this file, not on its own"]
fn transaction_worker() {
    let Ok(spec) = std::env::var(WORKER_ENV) else {
        eprintln!("transaction_worker runs only when a test starts it ({WORKER_ENV})");
        return;
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a Tokio runtime");
    runtime.block_on(async move {
        let (mode, rest) = spec.split_once(' ').expect("a mode");
        match mode {
            "abort" => {
                let (id, spec) = rest.split_once(' ').expect("an id");
                let db = Db::open(spec).await;
                let result = db.deliver(id, Then::Abort).await;
                panic!("the delivery should have aborted the process, returned {result:?}");
            }
            "fleet" => fleet_worker(Db::open(rest).await).await,
            other => panic!("no child mode {other:?}"),
        }
    });
}

/// Delivers each of `IDS` ids, shuffled, with `TASKS` deliveries at once,
/// until each is acked; one run in ten fails after its write (rolled back,
/// delivered again).
async fn fleet_worker(db: Db) {
    let mut ids: Vec<String> = (0..IDS).map(fleet_id).collect();
    ids.sort_by_cached_key(|_| uuid::Uuid::new_v4());
    let ids = Arc::new(ids);
    let next = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let (db, ids, next) = (db.clone(), ids.clone(), next.clone());
            tokio::spawn(async move {
                while let Some(id) = ids.get(next.fetch_add(1, Ordering::Relaxed)) {
                    loop {
                        let fails = uuid::Uuid::new_v4().as_u128().is_multiple_of(10);
                        let then = if fails { Then::Fail } else { Then::Commit };
                        match db.deliver(id, then).await {
                            Ok(_) => break,
                            Err(RunError::Failed) => continue,
                            // A lock timeout or a serialization failure: retried, as a broker would.
                            Err(error) => {
                                eprintln!("{id}: {error:?}; delivered again");
                                tokio::time::sleep(Duration::from_millis(5)).await;
                            }
                        }
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("a delivery task");
    }
}

fn fleet_id(n: usize) -> String {
    format!("credit-{n:05}")
}

// ---------------------------------------------------------------- abort

async fn aborted_before_commit_runs_once_after_restart(db: &Db, location: &str) {
    db.create().await;
    let id = format!("abort-{}", servers::unique_suffix());
    let status = spawn_child("abort", &format!("{id} {}", db.spec(location)))
        .wait()
        .expect("the child exits");
    assert!(!status.success(), "the child aborted: {status}");
    assert!(
        !db.marked(&id).await,
        "the aborted transaction left no mark"
    );
    assert_eq!(db.effects_of(&id).await, 0, "nor an effect");

    // The restarted consumer: the redelivery runs, once.
    assert!(
        db.deliver(&id, Then::Commit).await.expect("runs"),
        "the redelivery ran"
    );
    assert!(
        !db.deliver(&id, Then::Commit).await.expect("skips"),
        "a duplicate skipped"
    );
    assert_eq!(db.effects_of(&id).await, 1, "one effect row");
    assert!(db.marked(&id).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_abort_before_commit() {
    let Some((db, url)) = postgres("postgres_abort_before_commit") else {
        return;
    };
    aborted_before_commit_runs_once_after_restart(&db, &url).await;
    db.drop_tables().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_abort_before_commit() {
    let (db, dir) = sqlite().await;
    let path = dir.join("ledger.db");
    aborted_before_commit_runs_once_after_restart(&db, path.to_str().expect("a UTF-8 path")).await;
    std::fs::remove_dir_all(dir).expect("remove the temporary folder");
}

// ---------------------------------------------------------------- fleet

async fn fleet_marks_equal_effects(db: &Db, location: &str, processes: usize) {
    db.create().await;
    let spec = db.spec(location);
    let started = Instant::now();
    let mut children: Vec<_> = (0..processes)
        .map(|_| spawn_child("fleet", &spec))
        .collect();
    for child in &mut children {
        loop {
            if let Some(status) = child.try_wait().expect("a child") {
                assert!(status.success(), "a fleet process failed: {status}");
                break;
            }
            if started.elapsed() > DEADLINE {
                children.iter_mut().for_each(|c| drop(c.kill()));
                panic!("the fleet did not finish within {DEADLINE:?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    let (table, effects) = on_db!(db, |store, effects| (
        store.table().to_owned(),
        effects.clone()
    ));
    let rows = db.count(format!("SELECT count(*) FROM {effects}")).await;
    let distinct = db
        .count(format!("SELECT count(DISTINCT message_id) FROM {effects}"))
        .await;
    let marks = db.count(format!("SELECT count(*) FROM {table}")).await;
    let effect_without_mark = db
        .count(format!(
            "SELECT count(*) FROM {effects} e
             WHERE NOT EXISTS (SELECT 1 FROM {table} m WHERE m.message_id = e.message_id)"
        ))
        .await;
    let mark_without_effect = db
        .count(format!(
            "SELECT count(*) FROM {table} m
             WHERE NOT EXISTS (SELECT 1 FROM {effects} e WHERE e.message_id = m.message_id)"
        ))
        .await;
    assert_eq!(distinct, IDS as i64, "every id's effect happened");
    assert_eq!(rows, distinct, "and exactly once");
    assert_eq!(marks, IDS as i64, "one mark per id");
    assert_eq!(effect_without_mark, 0, "no effect without its mark");
    assert_eq!(mark_without_effect, 0, "no mark without its effect");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_fleet_of_four_processes() {
    let Some((db, url)) = postgres("postgres_fleet_of_four_processes") else {
        return;
    };
    fleet_marks_equal_effects(&db, &url, 4).await;
    db.drop_tables().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_fleet_of_two_processes() {
    let (db, dir) = sqlite().await;
    let path = dir.join("ledger.db");
    fleet_marks_equal_effects(&db, path.to_str().expect("a UTF-8 path"), 2).await;
    std::fs::remove_dir_all(dir).expect("remove the temporary folder");
}

// ------------------------------------------------- visibility, concurrency

/// Marks `id` in a transaction left open, and hands it back.
macro_rules! open_mark {
    ($store:expr, $id:expr) => {{
        let mut tx = $store.pool().begin().await.expect("begin");
        Guard::new($store)
            .transactional()
            .run(&Message($id.to_owned()), &mut tx, |_tx| async {
                Ok::<(), StoreError>(())
            })
            .await
            .expect("marked");
        tx
    }};
}

async fn a_reader_sees_the_mark_after_commit(db: &Db) {
    let id = format!("visible-{}", servers::unique_suffix());
    on_db!(db, |store, _effects| {
        let tx = open_mark!(store, &id);
        assert!(
            !db.marked(&id).await,
            "uncommitted: a plain SELECT sees no mark"
        );
        assert!(!store.seen(&id).await.expect("seen"), "nor does `seen`");
        tx.commit().await.expect("commit");
    });
    assert!(db.marked(&id).await, "committed: the mark is there");
    assert!(db.store().seen(&id).await.expect("seen"));
}

/// A second delivery of `id` while the first one's transaction is open:
/// it waits, then skips when the first commits and runs when it rolls back.
async fn a_concurrent_duplicate_waits(db: &Db, first_commits: bool) {
    let id = format!("concurrent-{}", servers::unique_suffix());
    on_db!(db, |store, _effects| {
        let first = open_mark!(store, &id);
        let second = tokio::spawn({
            let (db, id) = (db.clone(), id.clone());
            async move { db.deliver(&id, Then::Commit).await }
        });
        wait_until_blocked(db, &second).await;
        if first_commits {
            first.commit().await.expect("commit");
        } else {
            first.rollback().await.expect("rollback");
        }
        let ran = second
            .await
            .expect("the second delivery")
            .expect("no error");
        assert_eq!(ran, !first_commits, "commit: skipped; rollback: ran");
    });
    assert_eq!(db.effects_of(&id).await, i64::from(!first_commits));
    assert!(db.marked(&id).await);
}

/// Returns once the second delivery waits on the first one's lock: seen in
/// `pg_stat_activity` on PostgreSQL; on SQLite (nothing to observe) after a
/// pause, which only makes the wait likelier, never the result different.
async fn wait_until_blocked<T>(db: &Db, second: &tokio::task::JoinHandle<T>) {
    let started = Instant::now();
    match db {
        Db::Postgres { store, .. } => loop {
            if postgres_locks::lock_waiters(store.pool(), store.table()).await == 1 {
                break;
            }
            assert!(
                !second.is_finished(),
                "the duplicate did not wait for the lock"
            );
            assert!(
                started.elapsed() < DEADLINE,
                "the duplicate never reached the lock"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        },
        Db::Sqlite { .. } => tokio::time::sleep(Duration::from_millis(200)).await,
    }
    assert!(
        !second.is_finished(),
        "the duplicate waits while the first is open"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_visibility_and_concurrent_duplicates() {
    let Some((db, _url)) = postgres("postgres_visibility_and_concurrent_duplicates") else {
        return;
    };
    db.create().await;
    a_reader_sees_the_mark_after_commit(&db).await;
    a_concurrent_duplicate_waits(&db, true).await;
    a_concurrent_duplicate_waits(&db, false).await;
    db.drop_tables().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_visibility_and_concurrent_duplicates() {
    let (db, dir) = sqlite().await;
    db.create().await;
    a_reader_sees_the_mark_after_commit(&db).await;
    a_concurrent_duplicate_waits(&db, true).await;
    a_concurrent_duplicate_waits(&db, false).await;
    std::fs::remove_dir_all(dir).expect("remove the temporary folder");
}

/// An expired mark is replaced inside the transaction, as `remember` does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_mark_is_replaced() {
    let dir = std::env::temp_dir().join(format!("babel-idem-tx-{}", servers::unique_suffix()));
    std::fs::create_dir_all(&dir).expect("a temporary folder");
    let store = SqliteStore::builder()
        .ttl(Duration::from_millis(1))
        .open(dir.join("ttl.db"))
        .await
        .expect("a store");
    store.remember("id-A").await.expect("remember");
    // 1 ms TTL: by the database clock the mark has expired once a few ms pass.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let mut ran = false;
    let mut tx = store.pool().begin().await.expect("begin");
    Guard::new(&store)
        .transactional()
        .run(&Message("id-A".into()), &mut tx, |_tx| async {
            ran = true;
            Ok::<(), StoreError>(())
        })
        .await
        .expect("runs");
    tx.commit().await.expect("commit");
    assert!(ran, "an expired mark does not skip");
    std::fs::remove_dir_all(Path::new(&dir)).expect("remove the temporary folder");
}

/// Whether `error` is the store refusing the connection for `misuse`.
fn is_misuse(error: &StoreError, misuse: TransactionMisuse) -> bool {
    std::error::Error::source(error).and_then(|s| s.downcast_ref::<TransactionMisuse>())
        == Some(&misuse)
}

/// A connection with no transaction open (`pool.acquire()`) is refused:
/// the handler does not run and nothing is marked. A handler that commits
/// on its own and then fails is reported, and the redelivery runs again;
/// one that commits on its own and returns `Ok` is reported too.
async fn a_connection_without_its_transaction_is_refused(db: &Db) {
    on_db!(db, |store, _effects| {
        let guard = Guard::new(store).transactional();

        let id = format!("no-tx-{}", servers::unique_suffix());
        let mut ran = false;
        let mut conn = store.pool().acquire().await.expect("a connection");
        let error = guard
            .run(&Message(id.clone()), &mut *conn, |_c| async {
                ran = true;
                Ok::<(), StoreError>(())
            })
            .await
            .expect_err("autocommit is refused");
        assert!(is_misuse(&error, TransactionMisuse::NotOpen), "{error}");
        assert!(error.to_string().contains("no transaction open"), "{error}");
        assert!(!ran, "the handler did not run");
        drop(conn);
        assert!(!store.seen(&id).await.expect("seen"), "nothing marked");

        // The handler commits the mark itself, then fails.
        let id = format!("own-commit-{}", servers::unique_suffix());
        let mut tx = store.pool().begin().await.expect("begin");
        let outcome = guard
            .run(&Message(id.clone()), &mut tx, |tx| async move {
                sqlx::query("COMMIT").execute(&mut **tx).await?;
                Err::<(), RunError>(RunError::Failed)
            })
            .await;
        assert!(matches!(outcome, Err(RunError::Failed)), "{outcome:?}");
        drop(tx);
        let mut runs = 0;
        let mut tx = store.pool().begin().await.expect("begin");
        guard
            .run(&Message(id.clone()), &mut tx, |_tx| async {
                runs += 1;
                Ok::<(), RunError>(())
            })
            .await
            .expect("the redelivery runs");
        tx.commit().await.expect("commit");
        assert_eq!(runs, 1, "the redelivery was not skipped");

        // The handler commits itself and returns `Ok`: not reported a success.
        let id = format!("own-commit-ok-{}", servers::unique_suffix());
        let mut tx = store.pool().begin().await.expect("begin");
        let outcome = guard
            .run(&Message(id.clone()), &mut tx, |tx| async move {
                sqlx::query("COMMIT").execute(&mut **tx).await?;
                Ok::<(), RunError>(())
            })
            .await;
        match outcome {
            Err(RunError::Store(error)) => {
                assert!(
                    is_misuse(&error, TransactionMisuse::EndedInHandler),
                    "{error}"
                )
            }
            other => panic!("a handler's own COMMIT is an error, got {other:?}"),
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_connection_without_transaction_refused() {
    let Some((db, _url)) = postgres("postgres_connection_without_transaction_refused") else {
        return;
    };
    db.create().await;
    a_connection_without_its_transaction_is_refused(&db).await;
    db.drop_tables().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_connection_without_transaction_refused() {
    let (db, dir) = sqlite().await;
    db.create().await;
    a_connection_without_its_transaction_is_refused(&db).await;
    std::fs::remove_dir_all(dir).expect("remove the temporary folder");
}
