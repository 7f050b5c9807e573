//! Transactional mode's cost (see `babel_idem::guide::modes`): deliveries per second of
//! a handler that writes in its own transaction (begin, the effect, commit),
//! with the guard's mark in that transaction (`Guard::transactional`) and
//! without it, at concurrency 1 and 16, on real PostgreSQL
//! (`BABEL_IDEM_POSTGRES_URL`; skipped when unset) and a SQLite file. The
//! goal: the marked rate is at least 0.9 of the bare one (one extra statement
//! on the handler's own connection, no other round trip).
//!
//! Two handlers: `insert` writes one row (the worst case: the mark doubles
//! the writes), `credit` writes a journal row and updates one of 256
//! account balances (a ledger credit, as in `examples/ledger.rs`).
//! Every delivery is a first delivery (a fresh id): the path that writes.
//!
//! Between bare and marked, two transactions split the mark's cost:
//! `+statement` runs, before the effect, one statement that binds the mark's
//! parameters and writes nothing (what one more statement costs: the round
//! trip, or SQLite's hop to sqlx's worker thread), and `+insert` a plain
//! `INSERT ... ON CONFLICT DO NOTHING` of the mark's row (the mark's writes
//! without its TTL clause). Every transaction runs on the store's pool,
//! begins and commits the same way; only what precedes the effect differs.
//!
//! Each round runs every mode once, in turn (reversed every other round, so
//! a drift in the shared machine's load hits all of them alike); a mode's
//! ratio is the median over rounds of its rate over that round's bare rate.
//!
//! Run: `cargo bench --all-features --bench transaction`
//! (`BABEL_IDEM_BENCH_SECS`, default 2, is the length of each run;
//! `BABEL_IDEM_BENCH_ROUNDS`, default 5, the number of rounds).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use babel_idem::{Guard, MessageId, StoreError};

use babel_idem::store::{PostgresStore, SqliteStore};

/// The stores' TTL, as a consumer that keeps ids for a week sets it: the
/// mark's row gets an expiry, as it would in production.
const TTL: Duration = Duration::from_secs(7 * 24 * 3600);

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

/// What the handler's transaction runs before its effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Nothing: the baseline every ratio divides by.
    Bare,
    /// A statement that binds the mark's parameters and writes nothing.
    Statement,
    /// A plain `INSERT ... ON CONFLICT DO NOTHING` of the mark's row.
    Insert,
    /// The guard's mark.
    Marked,
}

impl Mode {
    const ALL: [Mode; 4] = [Mode::Bare, Mode::Statement, Mode::Insert, Mode::Marked];

    fn label(self) -> &'static str {
        match self {
            Mode::Bare => "bare",
            Mode::Statement => "+statement",
            Mode::Insert => "+insert",
            Mode::Marked => "marked",
        }
    }
}

/// A handler's statements on one database, each with the message id as `$1`.
struct Statements {
    /// The handler's effect.
    effect: Vec<String>,
    /// `Mode::Statement`'s statement (the TTL in milliseconds is `$2`).
    probe: String,
    /// `Mode::Insert`'s statement (the TTL in milliseconds is `$2`).
    insert: String,
}

/// One delivery, as a broker loop makes it: begin, what `$mode` puts before
/// the effect, the effect, commit. The same source for both databases,
/// type-checked per arm.
macro_rules! deliver {
    ($store:expr, $sql:expr, $id:expr, $mode:expr) => {{
        let (store, sql, id, mode) = ($store, $sql, $id, $mode);
        let mut tx = store.pool().begin().await?;
        let before = match mode {
            Mode::Statement => Some(&sql.probe),
            Mode::Insert => Some(&sql.insert),
            Mode::Bare | Mode::Marked => None,
        };
        if let Some(statement) = before {
            sqlx::query(statement)
                .bind(&id)
                .bind(TTL.as_millis() as i64)
                .execute(&mut *tx)
                .await?;
        }
        if mode == Mode::Marked {
            Guard::new(store)
                .transactional()
                .run(&Delivery(id.clone()), &mut tx, |tx| async {
                    effect!(&mut **tx, sql, id);
                    Ok::<(), BenchError>(())
                })
                .await?;
        } else {
            effect!(&mut *tx, sql, id);
        }
        tx.commit().await?;
        Ok::<(), BenchError>(())
    }};
}

/// The handler's effect on `$connection`.
macro_rules! effect {
    ($connection:expr, $sql:expr, $id:expr) => {
        for statement in &$sql.effect {
            sqlx::query(statement)
                .bind(&$id)
                .execute($connection)
                .await?;
        }
    };
}

#[derive(Clone)]
enum Db {
    Postgres(Arc<PostgresStore>, Arc<Statements>),
    Sqlite(Arc<SqliteStore>, Arc<Statements>),
}

impl Db {
    async fn deliver(&self, id: String, mode: Mode) -> Result<(), BenchError> {
        match self {
            Db::Postgres(store, sql) => deliver!(&**store, &**sql, id, mode),
            Db::Sqlite(store, sql) => deliver!(&**store, &**sql, id, mode),
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

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

async fn compare(name: &str, db: &Db, length: Duration, rounds: usize) {
    for concurrency in [1, 16] {
        // Warm the pool, the statement caches and the tables up.
        for mode in Mode::ALL {
            rate(db, mode, concurrency, length / 4).await;
        }
        let mut rates = vec![Vec::with_capacity(rounds); Mode::ALL.len()];
        for round in 0..rounds {
            let order: Vec<usize> = if round % 2 == 0 {
                (0..Mode::ALL.len()).collect()
            } else {
                (0..Mode::ALL.len()).rev().collect()
            };
            for m in order {
                rates[m].push(rate(db, Mode::ALL[m], concurrency, length).await);
            }
        }
        let bare = &rates[0];
        let mut line = format!(
            "{name:<16} concurrency {concurrency:>2}: bare {:>7.0}/s",
            median(bare.clone())
        );
        for (m, mode) in Mode::ALL.iter().enumerate().skip(1) {
            let ratios = rates[m].iter().zip(bare).map(|(r, b)| r / b).collect();
            line += &format!(", {} {:.3}", mode.label(), median(ratios));
        }
        println!("{line}");
    }
}

fn main() {
    let full_run = std::env::args().any(|arg| arg == "--bench");
    let setting = |name: &str, default: f64| -> f64 {
        std::env::var(name)
            .ok()
            .and_then(|value| value.parse().ok())
            .unwrap_or(default)
    };
    let (length, rounds) = if full_run {
        (
            Duration::from_secs_f64(setting("BABEL_IDEM_BENCH_SECS", 2.0)),
            setting("BABEL_IDEM_BENCH_ROUNDS", 5.0) as usize,
        )
    } else {
        (Duration::from_millis(50), 1)
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a Tokio runtime");
    runtime.block_on(async {
        println!(
            "transactional mode: rate of each mode over bare, medians of {rounds} rounds of {length:?}"
        );
        let suffix = &uuid::Uuid::new_v4().simple().to_string()[..12];
        let (effects, accounts) = (
            format!("bench_effects_{suffix}"),
            format!("bench_accounts_{suffix}"),
        );

        let dir = std::env::temp_dir().join(format!("babel-idem-bench-tx-{suffix}"));
        std::fs::create_dir_all(&dir).expect("a temporary folder");
        let store = SqliteStore::builder()
            .ttl(TTL)
            .max_connections(16)
            .open(dir.join("bench.db"))
            .await
            .expect("a SQLite store");
        let store = Arc::new(store);
        let insert = format!(
            "INSERT INTO {table} (message_id, created_at, expires_at)
                 VALUES ($1, {now}, {now} + $2)
             ON CONFLICT (message_id) DO NOTHING",
            table = store.table(),
            now = "CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)",
        );
        run_backend!("sqlite", Db::Sqlite, store, insert, &effects, &accounts, length, rounds);
        drop(store);
        std::fs::remove_dir_all(&dir).expect("remove the temporary folder");

        let Ok(url) = std::env::var("BABEL_IDEM_POSTGRES_URL") else {
            println!("postgres skipped: BABEL_IDEM_POSTGRES_URL not set");
            return;
        };
        let store = PostgresStore::builder()
            .table(format!("bench_tx_marks_{suffix}"))
            .ttl(TTL)
            .max_connections(17)
            .connect_lazy(&url)
            .expect("a PostgreSQL store");
        store.migrate().await.expect("migrate");
        let store = Arc::new(store);
        let insert = format!(
            "INSERT INTO {} (message_id, expires_at)
                 VALUES ($1, now() + $2::bigint * interval '1 millisecond')
             ON CONFLICT (message_id) DO NOTHING",
            store.table()
        );
        run_backend!("postgres", Db::Postgres, store, insert, &effects, &accounts, length, rounds);
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

/// Creates the effect tables on `$store`, then compares both handlers on it,
/// `$insert` being the database's plain insert of the mark's row.
macro_rules! run_backend {
    ($name:literal, $db:path, $store:expr, $insert:expr, $effects:expr, $accounts:expr, $length:expr, $rounds:expr) => {
        for statement in ddl($effects, $accounts) {
            sqlx::query(&statement)
                .execute($store.pool())
                .await
                .expect("a bench table");
        }
        for (shape, effect) in handlers($effects, $accounts) {
            let name = format!("{} {shape}", $name);
            let sql = Statements {
                effect,
                // Both parameters read, as the mark's are, so both databases
                // take their types from the binds.
                probe: "SELECT $1 IS NULL AND $2 IS NULL".to_owned(),
                insert: $insert.clone(),
            };
            compare(&name, &$db($store.clone(), Arc::new(sql)), $length, $rounds).await;
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
fn handlers(effects: &str, accounts: &str) -> [(&'static str, Vec<String>); 2] {
    let journal = format!("INSERT INTO {effects} (message_id) VALUES ($1)");
    let credit = format!(
        "INSERT INTO {accounts} (account, balance) VALUES ('acct-' || substr($1, 1, 2), 1)
         ON CONFLICT (account) DO UPDATE SET balance = {accounts}.balance + 1"
    );
    [
        ("insert", vec![journal.clone()]),
        ("credit", vec![journal, credit]),
    ]
}
