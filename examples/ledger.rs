//! A ledger consumer in transactional mode: each `urn:babel:ledger:credited`
//! message credits an account in SQLite (the embedded default), and its id
//! is marked in the same transaction, so the credit and the mark commit
//! together or not at all. Every message is delivered three times; the
//! balance moves once per message.
//!
//! ```text
//! cargo run --example ledger                 # a database in a temporary folder
//! cargo run --example ledger -- ledger.db    # or this file (kept afterwards)
//! ```
//!
//! The broker loop's part (see [`Ledger::deliver`]): begin a transaction on
//! the store's pool, call the handler with it, commit on `Ok`, roll back on
//! `Err`; the `Router` acks only what committed, and retries the rest.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use babel_idem::{Delivery, Envelope, Router, idempotent, urn};

use babel_idem::store::SqliteStore;
use serde_json::json;
use sqlx::SqliteConnection;

/// The accounts and the seen-set live in one SQLite file, so one
/// transaction covers both.
pub struct Ledger {
    store: SqliteStore,
}

impl Ledger {
    /// Opens (or creates) the database at `path`: the seen-set table, then
    /// the accounts.
    pub async fn open(path: &Path) -> anyhow::Result<Ledger> {
        let store = SqliteStore::open(path).await?;
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS accounts (
                 account TEXT PRIMARY KEY NOT NULL,
                 balance INTEGER NOT NULL
             )",
        )
        .execute(store.pool())
        .await?;
        Ok(Ledger { store })
    }

    /// Credits `data.amount` to `data.account`, on the transaction's
    /// connection. The attribute marks the message id on that connection
    /// first: a redelivery finds the mark and skips the body.
    #[idempotent(store = self.store, transaction = tx)]
    async fn on_credited(&self, env: Envelope, tx: &mut SqliteConnection) -> anyhow::Result<()> {
        let account = env.data["account"].as_str();
        let amount = env.data["amount"].as_i64();
        let (Some(account), Some(amount)) = (account, amount) else {
            anyhow::bail!("a credit needs `account` (text) and `amount` (integer)");
        };
        sqlx::query(
            "INSERT INTO accounts (account, balance) VALUES (?1, ?2)
             ON CONFLICT (account) DO UPDATE SET balance = balance + excluded.balance",
        )
        .bind(account)
        .bind(amount)
        .execute(&mut *tx)
        .await?;
        Ok(())
    }

    /// One delivery, as a broker loop runs a transactional handler: begin,
    /// call, commit on `Ok`. On `Err` the transaction is dropped, which
    /// rolls back the credit and the mark together; the router then retries.
    pub async fn deliver(&self, env: Envelope) -> anyhow::Result<()> {
        let mut tx = self.store.pool().begin().await?;
        self.on_credited(env, &mut tx).await?;
        tx.commit().await?;
        Ok(())
    }

    /// The router a consumer dispatches to: the ledger's one route.
    pub fn router(self: &Arc<Self>) -> anyhow::Result<Router> {
        let ledger = Arc::clone(self);
        let router = Router::builder()
            .route(urn!("urn:babel:ledger:credited"), move |env: Envelope| {
                let ledger = Arc::clone(&ledger);
                async move { ledger.deliver(env).await }
            })
            .build()?;
        Ok(router)
    }

    /// The balance of `account` (0 when it was never credited).
    pub async fn balance(&self, account: &str) -> anyhow::Result<i64> {
        let balance = sqlx::query_scalar("SELECT balance FROM accounts WHERE account = ?1")
            .bind(account)
            .fetch_optional(self.store.pool())
            .await?;
        Ok(balance.unwrap_or(0))
    }

    /// How many message ids the seen-set holds.
    pub async fn marks(&self) -> anyhow::Result<i64> {
        let query = format!("SELECT count(*) FROM {}", self.store.table());
        Ok(sqlx::query_scalar(&query)
            .fetch_one(self.store.pool())
            .await?)
    }
}

/// What one run of the example saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The account's balance after every delivery.
    pub balance: i64,
    /// The sum of the distinct messages' amounts: what the balance must be.
    pub credited_once: i64,
    /// How many deliveries the router acked (all of them: duplicates too).
    pub acked: usize,
    /// Marks in the seen-set: one per distinct message.
    pub marks: i64,
}

/// The account every message credits.
pub const ACCOUNT: &str = "acct-1042";

/// Credits five messages to [`ACCOUNT`], delivers each of them `rounds`
/// times through the router, and reports what the ledger holds.
pub async fn replay(path: &Path, rounds: usize) -> anyhow::Result<Outcome> {
    let ledger = Arc::new(Ledger::open(path).await?);
    let router = ledger.router()?;
    let amounts = [10, 25, 5, 40, 20];
    let messages: Vec<Vec<u8>> = amounts
        .iter()
        .map(|amount| {
            Envelope::new(
                "urn:babel:ledger:credited",
                json!({"account": ACCOUNT, "amount": amount}),
            )
            .with_queue("ledger")
            .to_vec()
        })
        .collect();

    let before = ledger.balance(ACCOUNT).await?;
    let mut acked = 0;
    for round in 1..=rounds {
        for message in &messages {
            let disposition = router.dispatch(message, Delivery::new()).await;
            if disposition.is_ack() {
                acked += 1;
            } else {
                println!("  not acked: {disposition:?}");
            }
        }
        let balance = ledger.balance(ACCOUNT).await?;
        println!("after delivery round {round}: balance {balance}");
    }
    Ok(Outcome {
        balance: ledger.balance(ACCOUNT).await? - before,
        credited_once: amounts.iter().sum(),
        acked,
        marks: ledger.marks().await?,
    })
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let (path, temporary) = match std::env::args_os().nth(1) {
        Some(path) => (PathBuf::from(path), None),
        None => {
            let dir =
                std::env::temp_dir().join(format!("babel-idem-ledger-{}", uuid::Uuid::new_v4()));
            std::fs::create_dir_all(&dir)?;
            (dir.join("ledger.db"), Some(dir))
        }
    };
    println!("ledger database: {}", path.display());
    let outcome = replay(&path, 3).await?;
    println!(
        "{} deliveries acked; balance moved by {} (five credits once: {}); {} ids marked",
        outcome.acked, outcome.balance, outcome.credited_once, outcome.marks
    );
    if let Some(dir) = temporary {
        std::fs::remove_dir_all(dir)?;
    }
    anyhow::ensure!(
        outcome.balance == outcome.credited_once,
        "the balance moved by {} instead of {}",
        outcome.balance,
        outcome.credited_once
    );
    Ok(())
}
