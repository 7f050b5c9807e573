//! Transactional mode's cost (DESIGN section 8.2): deliveries per second of
//! a handler that writes in its own transaction (begin, the effect, commit),
//! with the guard's mark in that transaction
//! (`Guard::transactional`) and without it, at concurrency 1 and 16, on
//! real PostgreSQL (`BABEL_IDEM_POSTGRES_URL`; skipped when unset) and a
//! SQLite file. The goal: the guarded rate is at least 0.9 of the bare one
//! (one extra statement on the handler's own connection, no other round trip).
//!
//! Two handlers: `insert` writes one row (the worst case: the mark doubles
//! the writes), `credit` writes a journal row and updates one of 256
//! account balances (a ledger credit, as in `examples/ledger.rs`).
//! Every delivery is a first delivery (a fresh id): the path that writes.
//! Bare and guarded runs alternate, twice each, and the ratio compares
//! their sums, so a drift in the shared machine's load hits both.
//!
//! Run: `cargo bench --bench transaction --features postgres`
//! (`BABEL_IDEM_BENCH_SECS`, default 2, is the length of each run).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use babel_idem::{Guard, MessageId, PostgresStore, SqliteStore, StoreError};

struct Delivery(String);

impl MessageId for Delivery {
    fn message_id(&self) -> Option<&str> {
        Some(&self.0)
    }
}

// The fields are read through `Debug`, when a delivery fails.
#[allow(dead_code)]
#[derive(Debug)]
enum BenchError {
    Store(StoreError),
    Sql(sqlx::Error),
}

impl From<StoreError> for BenchError {
    fn from(error: StoreError) -> Self {
        BenchError::Store(error)
    }
}

impl From<sqlx::Error> for BenchError {
    fn from(error: sqlx::Error) -> Self {
        BenchError::Sql(error)
    }
}

/// Whether the handler's transaction carries the guard's mark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Bare,
    Marked,
}

/// One delivery, as a broker loop makes it: begin, the effect (guarded or
/// not), commit. The same source for both databases, type-checked per arm.
macro_rules! deliver {
    ($store:expr, $effect:expr, $id:expr, $mode:expr) => {{
        let mut tx = $store.pool().begin().await?;
        let id: String = $id;
        match $mode {
            Mode::Bare => {
                for statement in $effect {
                    sqlx::query(statement).bind(&id).execute(&mut *tx).await?;
                }
            }
            Mode::Marked => {
                Guard::new($store)
                    .transactional()
                    .run(&Delivery(id.clone()), &mut tx, |tx| async {
                        for statement in $effect {
                            sqlx::query(statement).bind(&id).execute(&mut **tx).await?;
                        }
                        Ok::<(), BenchError>(())
                    })
                    .await?;
            }
        }
        tx.commit().await?;
        Ok::<(), BenchError>(())
    }};
}

#[derive(Clone)]
enum Db {
    Postgres(Arc<PostgresStore>, Arc<[String]>),
    Sqlite(Arc<SqliteStore>, Arc<[String]>),
}

impl Db {
    async fn deliver(&self, id: String, mode: Mode) -> Result<(), BenchError> {
        match self {
            Db::Postgres(store, effect) => deliver!(&**store, effect.iter(), id, mode),
            Db::Sqlite(store, effect) => deliver!(&**store, effect.iter(), id, mode),
        }
    }
}

/// Deliveries per second with `concurrency` tasks for `length`.
async fn rate(db: &Db, mode: Mode, concurrency: usize, length: Duration) -> f64 {
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|_| {
            let (db, done, stop) = (db.clone(), done.clone(), stop.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let id = uuid::Uuid::new_v4().to_string();
                    db.deliver(id, mode).await.expect("a delivery");
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    tokio::time::sleep(length).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.expect("a bench task");
    }
    done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}

async fn compare(name: &str, db: &Db, length: Duration) {
    for concurrency in [1, 16] {
        // Warm the pool and the tables up.
        rate(db, Mode::Marked, concurrency, length / 4).await;
        let (mut bare, mut marked) = (0.0, 0.0);
        for _ in 0..2 {
            bare += rate(db, Mode::Bare, concurrency, length).await;
            marked += rate(db, Mode::Marked, concurrency, length).await;
        }
        println!(
            "{name:<16} concurrency {concurrency:>2}: without mark {:>8.0}/s, with mark {:>8.0}/s, ratio {:.3}",
            bare / 2.0,
            marked / 2.0,
            marked / bare
        );
    }
}

fn main() {
    let full_run = std::env::args().any(|arg| arg == "--bench");
    let seconds: f64 = std::env::var("BABEL_IDEM_BENCH_SECS")
        .ok()
        .and_then(|secs| secs.parse().ok())
        .unwrap_or(2.0);
    let length = if full_run {
        Duration::from_secs_f64(seconds)
    } else {
        Duration::from_millis(50)
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a Tokio runtime");
    runtime.block_on(async {
        println!("transactional mode: marked vs bare handler transactions, {length:?} per run");
        let suffix = &uuid::Uuid::new_v4().simple().to_string()[..12];
        let (effects, accounts) = (
            format!("bench_effects_{suffix}"),
            format!("bench_accounts_{suffix}"),
        );

        let dir = std::env::temp_dir().join(format!("babel-idem-bench-tx-{suffix}"));
        std::fs::create_dir_all(&dir).expect("a temporary folder");
        let store = SqliteStore::builder()
            .max_connections(16)
            .open(dir.join("bench.db"))
            .await
            .expect("a SQLite store");
        let store = Arc::new(store);
        run_backend!("sqlite", Db::Sqlite, store, &effects, &accounts, length);
        drop(store);
        std::fs::remove_dir_all(&dir).expect("remove the temporary folder");

        let Ok(url) = std::env::var("BABEL_IDEM_POSTGRES_URL") else {
            println!("postgres skipped: BABEL_IDEM_POSTGRES_URL not set");
            return;
        };
        let store = PostgresStore::builder()
            .table(format!("bench_tx_marks_{suffix}"))
            .max_connections(17)
            .connect_lazy(&url)
            .expect("a PostgreSQL store");
        store.migrate().await.expect("migrate");
        let store = Arc::new(store);
        run_backend!("postgres", Db::Postgres, store, &effects, &accounts, length);
        let table = store.table();
        for statement in [
            format!("DROP TABLE IF EXISTS {effects}, {accounts}, {table}, {table}_claims"),
            format!("DROP SEQUENCE IF EXISTS {table}_claims_fence"),
        ] {
            sqlx::query(&statement)
                .execute(store.pool())
                .await
                .expect("drop the bench tables");
        }
    });
}

/// Creates the effect tables on `$store`, then compares both handlers on it.
macro_rules! run_backend {
    ($name:literal, $db:path, $store:expr, $effects:expr, $accounts:expr, $length:expr) => {
        for statement in ddl($effects, $accounts) {
            sqlx::query(&statement)
                .execute($store.pool())
                .await
                .expect("a bench table");
        }
        for (shape, effect) in handlers($effects, $accounts) {
            let name = format!("{} {shape}", $name);
            compare(&name, &$db($store.clone(), effect), $length).await;
        }
    };
}
use run_backend;

/// The effect tables, the same DDL on both databases.
fn ddl(effects: &str, accounts: &str) -> [String; 2] {
    [
        format!("CREATE TABLE {effects} (message_id TEXT NOT NULL)"),
        format!("CREATE TABLE {accounts} (account TEXT PRIMARY KEY, balance BIGINT NOT NULL)"),
    ]
}

/// The two handlers: their statements, each with the message id as `$1`.
fn handlers(effects: &str, accounts: &str) -> [(&'static str, Arc<[String]>); 2] {
    let journal = format!("INSERT INTO {effects} (message_id) VALUES ($1)");
    let credit = format!(
        "INSERT INTO {accounts} (account, balance) VALUES ('acct-' || substr($1, 1, 2), 1)
         ON CONFLICT (account) DO UPDATE SET balance = {accounts}.balance + 1"
    );
    [
        ("insert", Arc::from(vec![journal.clone()])),
        ("credit", Arc::from(vec![journal, credit])),
    ]
}
