//! A producer on the transactional outbox: each order row and its
//! `urn:babel:orders:created` message are written in one transaction, so
//! they commit together or not at all. `--crash` aborts the process at the
//! worst moment, to show it:
//!
//! ```text
//! cargo run --example outbox_producer --features postgres,sqlite -- \
//!     --db sqlite://orders.db --queue orders --count 3 [--crash before-commit|after-commit]
//! babel-idem relay --outbox sqlite://orders.db --redis redis://127.0.0.1:6379/0 --drain
//! ```
//!
//! - `before-commit`: the process aborts after `save` and before `COMMIT`:
//!   neither the orders nor their messages exist; the relay publishes nothing.
//! - `after-commit`: it aborts after `COMMIT`, before any relay ran: the
//!   orders and messages are durable, and the relay publishes each once.
//!
//! It prints one JSON line per saved message, `{"row":..,"id":..}`, as it is
//! saved (before the commit), so the ids that must or must not reach the
//! broker are known whatever the crash.

use std::io::Write;

use babel_idem::Envelope;
use babel_idem::outbox::{PostgresOutbox, SqliteOutbox};
use serde_json::json;

/// Where the crash happens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Crash {
    BeforeCommit,
    AfterCommit,
}

struct Args {
    db: String,
    queue: String,
    count: u32,
    table: Option<String>,
    crash: Option<Crash>,
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        db: String::new(),
        queue: "orders".to_owned(),
        count: 1,
        table: None,
        crash: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--db" => args.db = value()?,
            "--queue" => args.queue = value()?,
            "--count" => args.count = value()?.parse().map_err(|e| format!("--count: {e}"))?,
            "--outbox-table" => args.table = Some(value()?),
            "--crash" => {
                args.crash = Some(match value()?.as_str() {
                    "before-commit" => Crash::BeforeCommit,
                    "after-commit" => Crash::AfterCommit,
                    other => {
                        return Err(format!("--crash before-commit|after-commit, not {other}"));
                    }
                })
            }
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if args.db.is_empty() {
        return Err("--db sqlite://PATH|postgres://... is required".to_owned());
    }
    Ok(args)
}

/// The envelopes of one run, with the order rows they announce.
fn orders(args: &Args) -> Vec<(i64, Envelope)> {
    (0..args.count)
        .map(|n| {
            let order = i64::from(n) + 1000;
            let env = Envelope::new("urn:babel:orders:created", json!({"order_id": order}))
                .with_queue(&args.queue);
            (order, env)
        })
        .collect()
}

fn report(row: i64, env: &Envelope) {
    println!(
        "{}",
        json!({"row": row, "id": env.meta.id.as_deref().unwrap_or_default()})
    );
    let _ = std::io::stdout().flush();
}

async fn sqlite(args: &Args, path: &str) -> anyhow::Result<()> {
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal);
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(options)
        .await?;
    let mut outbox = SqliteOutbox::new(pool.clone());
    if let Some(table) = &args.table {
        outbox = outbox.with_table(table)?;
    }
    outbox.migrate().await?;
    sqlx::query("CREATE TABLE IF NOT EXISTS orders (order_id INTEGER NOT NULL)")
        .execute(&pool)
        .await?;
    let mut tx = pool.begin().await?;
    for (order, env) in orders(args) {
        sqlx::query("INSERT INTO orders (order_id) VALUES (?1)")
            .bind(order)
            .execute(&mut *tx)
            .await?;
        let row = outbox.save(&mut tx, &env).await?;
        report(row, &env);
    }
    if args.crash == Some(Crash::BeforeCommit) {
        std::process::abort();
    }
    tx.commit().await?;
    if args.crash == Some(Crash::AfterCommit) {
        std::process::abort();
    }
    Ok(())
}

async fn postgres(args: &Args) -> anyhow::Result<()> {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&args.db)
        .await?;
    let mut outbox = PostgresOutbox::new(pool.clone());
    if let Some(table) = &args.table {
        outbox = outbox.with_table(table)?;
    }
    outbox.migrate().await?;
    let orders_table = format!("{}_orders", outbox.table());
    sqlx::query(&format!(
        "CREATE TABLE IF NOT EXISTS {orders_table} (order_id BIGINT NOT NULL)"
    ))
    .execute(&pool)
    .await?;
    let mut tx = pool.begin().await?;
    for (order, env) in orders(args) {
        sqlx::query(&format!(
            "INSERT INTO {orders_table} (order_id) VALUES ($1)"
        ))
        .bind(order)
        .execute(&mut *tx)
        .await?;
        let row = outbox.save(&mut tx, &env).await?;
        report(row, &env);
    }
    if args.crash == Some(Crash::BeforeCommit) {
        std::process::abort();
    }
    tx.commit().await?;
    if args.crash == Some(Crash::AfterCommit) {
        std::process::abort();
    }
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = match parse() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("outbox_producer: {message}");
            std::process::exit(2);
        }
    };
    if let Some(path) = args
        .db
        .strip_prefix("sqlite://")
        .or(args.db.strip_prefix("sqlite:"))
    {
        let path = path.to_owned();
        sqlite(&args, &path).await
    } else {
        postgres(&args).await
    }
}
