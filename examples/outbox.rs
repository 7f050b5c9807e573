//! Consume, transform, produce: a worker takes `urn:babel:ledger:credit`
//! messages from Redis, credits an account in SQL, and emits
//! `urn:babel:ledger:credited` through the transactional outbox, all in one
//! transaction with the message's idempotency mark; a relay publishes what
//! committed to Redis, and a downstream consumer reads it.
//!
//! ```text
//! cargo run --example outbox --features redis-transport,sqlite,postgres,redis -- \
//!     [--redis redis://127.0.0.1:6379/0]
//! ```
//!
//! By default it puts five credits on a fresh queue, each three times, runs
//! the worker and the relay until the queue is idle, then consumes what the
//! relay published, and prints that the balance moved once per credit and
//! that each outgoing id was published once and consumed once.
//!
//! Flags (the defaults run the demo above):
//!
//! - `--db sqlite://PATH|postgres://...`: the database (default a SQLite
//!   file in a temporary folder); `--tables PREFIX` names its tables
//!   (`PREFIX_accounts`, `PREFIX_credits`, `PREFIX_seen`, `PREFIX_outbox`).
//! - `--queue NAME`, `--out-queue NAME`: the queues (default fresh names).
//! - `--inputs N`, `--deliveries D`: credits put on the queue, and how many
//!   times each (default 5 and 3; `--inputs 0` puts none).
//! - `--fail-rate F`: the share of handler runs that fail after writing, so
//!   their transaction rolls back and the message is retried (default 0).
//! - `--no-relay`, `--no-downstream`: leave the relay or the downstream
//!   consumer to another process.
//! - `--until-idle DURATION` (default 2s), `--retry-after DURATION`: when the
//!   worker stops, and how long a reservation lasts before a worker's sweep
//!   takes it back (default 90s).
//!
//! The last line on stdout is one JSON object: the worker's deliveries and,
//! unless left out, what was published and consumed.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use babel_idem::broker::Publisher;
use babel_idem::outbox::{PostgresOutbox, Relay, SqliteOutbox};
use babel_idem::router::Backoff;
use babel_idem::store::{PostgresStore, SqliteStore};
use babel_idem::transport::RedisTransport;
use babel_idem::{Consumer, Envelope, InMemoryStore, Router, idempotent, run_once, urn};
use serde_json::json;
use sqlx::{PgConnection, SqliteConnection};

/// The URN the worker consumes, and the one it emits.
const CREDIT: &str = "urn:babel:ledger:credit";
const CREDITED: &str = "urn:babel:ledger:credited";
const ACCOUNT: &str = "acct-1042";
/// Deliveries in flight at once on PostgreSQL.
const CONCURRENCY: usize = 8;

/// The ledger's database: the seen-set (transactional marks), the accounts,
/// one effect row per credit applied, and the outbox, in one database so
/// one transaction covers all four.
enum Db {
    Sqlite {
        store: SqliteStore,
        outbox: SqliteOutbox,
    },
    Postgres {
        store: PostgresStore,
        outbox: PostgresOutbox,
    },
}

struct Ledger {
    db: Db,
    prefix: String,
    out_queue: String,
    fail_rate: f64,
}

impl Ledger {
    async fn open(
        url: &str,
        prefix: &str,
        out_queue: &str,
        fail_rate: f64,
    ) -> anyhow::Result<Self> {
        let db = if let Some(path) = url.strip_prefix("sqlite://") {
            let store = SqliteStore::builder()
                .table(format!("{prefix}_seen"))
                .open(path)
                .await?;
            let outbox =
                SqliteOutbox::new(store.pool().clone()).with_table(&format!("{prefix}_outbox"))?;
            Db::Sqlite { store, outbox }
        } else {
            let store = PostgresStore::builder()
                .table(format!("{prefix}_seen"))
                // Each delivery in flight holds a transaction, and the guard
                // checks it from a second connection.
                .max_connections(2 * CONCURRENCY as u32 + 2)
                .connect_lazy(url)?;
            store.migrate().await?;
            let outbox = PostgresOutbox::new(store.pool().clone())
                .with_table(&format!("{prefix}_outbox"))?;
            Db::Postgres { store, outbox }
        };
        let ledger = Ledger {
            db,
            prefix: prefix.to_owned(),
            out_queue: out_queue.to_owned(),
            fail_rate,
        };
        ledger.migrate().await?;
        Ok(ledger)
    }

    async fn migrate(&self) -> anyhow::Result<()> {
        let p = &self.prefix;
        let ddl = format!(
            "CREATE TABLE IF NOT EXISTS {p}_accounts (account TEXT PRIMARY KEY, balance BIGINT NOT NULL);
             CREATE TABLE IF NOT EXISTS {p}_credits (credit_id TEXT NOT NULL, amount BIGINT NOT NULL);"
        );
        match &self.db {
            Db::Sqlite { store, outbox } => {
                sqlx::raw_sql(&ddl).execute(store.pool()).await?;
                outbox.migrate().await?;
            }
            Db::Postgres { store, outbox } => {
                sqlx::raw_sql(&ddl).execute(store.pool()).await?;
                outbox.migrate().await?;
            }
        }
        Ok(())
    }

    /// The credit and its outgoing message, as one statement list for
    /// either database; then, on `--fail-rate`, a failure that rolls both back.
    fn credit_sql(&self) -> [String; 2] {
        let p = &self.prefix;
        [
            format!(
                "INSERT INTO {p}_accounts (account, balance) VALUES ($1, $2)
                 ON CONFLICT (account) DO UPDATE SET balance = {p}_accounts.balance + excluded.balance"
            ),
            format!("INSERT INTO {p}_credits (credit_id, amount) VALUES ($1, $2)"),
        ]
    }

    fn credited(&self, env: &Envelope) -> anyhow::Result<(i64, Envelope)> {
        let amount = env.data["amount"]
            .as_i64()
            .ok_or_else(|| anyhow::anyhow!("a credit needs an integer `amount`"))?;
        let outgoing = env
            .follow_up(
                CREDITED,
                json!({"account": ACCOUNT, "amount": amount, "credit_id": env.meta.id}),
            )
            .with_queue(&self.out_queue);
        Ok((amount, outgoing))
    }

    fn fails_now(&self) -> bool {
        let draw = (uuid::Uuid::new_v4().as_u128() % 10_000) as f64 / 10_000.0;
        draw < self.fail_rate
    }

    /// The handler on SQLite: the mark, the credit, the effect row and the
    /// outgoing message, on the one transaction `tx`.
    #[idempotent(store = self.sqlite_store(), transaction = tx)]
    async fn on_credit_sqlite(
        &self,
        env: Envelope,
        tx: &mut SqliteConnection,
    ) -> anyhow::Result<()> {
        let Db::Sqlite { outbox, .. } = &self.db else {
            unreachable!("the SQLite handler runs on SQLite")
        };
        let (amount, outgoing) = self.credited(&env)?;
        let [account, credit] = self.credit_sql();
        sqlx::query(&account)
            .bind(ACCOUNT)
            .bind(amount)
            .execute(&mut *tx)
            .await?;
        sqlx::query(&credit)
            .bind(env.meta.id.as_deref())
            .bind(amount)
            .execute(&mut *tx)
            .await?;
        outbox.save(&mut *tx, &outgoing).await?;
        if self.fails_now() {
            anyhow::bail!("a simulated failure after the writes: the transaction rolls back");
        }
        Ok(())
    }

    /// The same handler on PostgreSQL.
    #[idempotent(store = self.postgres_store(), transaction = tx)]
    async fn on_credit_postgres(&self, env: Envelope, tx: &mut PgConnection) -> anyhow::Result<()> {
        let Db::Postgres { outbox, .. } = &self.db else {
            unreachable!("the PostgreSQL handler runs on PostgreSQL")
        };
        let (amount, outgoing) = self.credited(&env)?;
        let [account, credit] = self.credit_sql();
        sqlx::query(&account)
            .bind(ACCOUNT)
            .bind(amount)
            .execute(&mut *tx)
            .await?;
        sqlx::query(&credit)
            .bind(env.meta.id.as_deref())
            .bind(amount)
            .execute(&mut *tx)
            .await?;
        outbox.save(&mut *tx, &outgoing).await?;
        if self.fails_now() {
            anyhow::bail!("a simulated failure after the writes: the transaction rolls back");
        }
        Ok(())
    }

    fn sqlite_store(&self) -> &SqliteStore {
        match &self.db {
            Db::Sqlite { store, .. } => store,
            Db::Postgres { .. } => unreachable!("asked on SQLite only"),
        }
    }

    fn postgres_store(&self) -> &PostgresStore {
        match &self.db {
            Db::Postgres { store, .. } => store,
            Db::Sqlite { .. } => unreachable!("asked on PostgreSQL only"),
        }
    }

    /// One delivery as a broker loop runs a transactional handler: begin,
    /// call, commit on `Ok`; on `Err` the dropped transaction rolls back
    /// the credit, the outgoing message and the mark together.
    async fn deliver(&self, env: Envelope) -> anyhow::Result<()> {
        match &self.db {
            Db::Sqlite { store, .. } => {
                let mut tx = store.pool().begin().await?;
                self.on_credit_sqlite(env, &mut tx).await?;
                tx.commit().await?;
            }
            Db::Postgres { store, .. } => {
                let mut tx = store.pool().begin().await?;
                self.on_credit_postgres(env, &mut tx).await?;
                tx.commit().await?;
            }
        }
        Ok(())
    }

    async fn balance(&self) -> anyhow::Result<i64> {
        let query = format!(
            "SELECT balance FROM {}_accounts WHERE account = $1",
            self.prefix
        );
        let balance: Option<i64> = match &self.db {
            Db::Sqlite { store, .. } => {
                sqlx::query_scalar(&query)
                    .bind(ACCOUNT)
                    .fetch_optional(store.pool())
                    .await?
            }
            Db::Postgres { store, .. } => {
                sqlx::query_scalar(&query)
                    .bind(ACCOUNT)
                    .fetch_optional(store.pool())
                    .await?
            }
        };
        Ok(balance.unwrap_or(0))
    }

    /// The relay's outbox: on PostgreSQL with a pool of its own, so the
    /// relay never waits behind the worker's transactions.
    fn relay_source(&self, url: &str) -> anyhow::Result<babel_idem::outbox::RelaySource> {
        Ok(match &self.db {
            Db::Sqlite { outbox, .. } => outbox.clone().into(),
            Db::Postgres { outbox, .. } => {
                let pool = sqlx::postgres::PgPoolOptions::new()
                    .max_connections(3)
                    .connect_lazy(url)?;
                PostgresOutbox::new(pool).with_table(outbox.table())?.into()
            }
        })
    }
}

struct Options {
    redis: String,
    db: Option<String>,
    prefix: String,
    queue: String,
    out_queue: String,
    inputs: u64,
    deliveries: u64,
    fail_rate: f64,
    relay: bool,
    downstream: bool,
    until_idle: Duration,
    retry_after: Duration,
}

fn options() -> Result<Options, String> {
    let run = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
    let mut options = Options {
        redis: "redis://127.0.0.1:6379/0".to_owned(),
        db: None,
        prefix: "ledger".to_owned(),
        queue: format!("ledger-credits-{run}"),
        out_queue: format!("ledger-credited-{run}"),
        inputs: 5,
        deliveries: 3,
        fail_rate: 0.0,
        relay: true,
        downstream: true,
        until_idle: Duration::from_secs(2),
        retry_after: Duration::from_secs(90),
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--redis" => options.redis = value()?,
            "--db" => options.db = Some(value()?),
            "--tables" => options.prefix = value()?,
            "--queue" => options.queue = value()?,
            "--out-queue" => options.out_queue = value()?,
            "--inputs" => {
                options.inputs = value()?.parse().map_err(|e| format!("--inputs: {e}"))?
            }
            "--deliveries" => {
                options.deliveries = value()?.parse().map_err(|e| format!("--deliveries: {e}"))?
            }
            "--fail-rate" => {
                options.fail_rate = value()?.parse().map_err(|e| format!("--fail-rate: {e}"))?
            }
            "--no-relay" => options.relay = false,
            "--no-downstream" => options.downstream = false,
            "--until-idle" => options.until_idle = seconds(&value()?)?,
            "--retry-after" => options.retry_after = seconds(&value()?)?,
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(options)
}

/// `500ms`, `3s` or a bare number of seconds.
fn seconds(text: &str) -> Result<Duration, String> {
    if let Some(ms) = text.strip_suffix("ms") {
        return ms
            .parse()
            .map(Duration::from_millis)
            .map_err(|e| format!("{text}: {e}"));
    }
    let secs = text.strip_suffix('s').unwrap_or(text);
    secs.parse()
        .map(Duration::from_secs)
        .map_err(|e| format!("{text}: {e}"))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let options = options().map_err(|e| anyhow::anyhow!(e))?;
    let temp = std::env::temp_dir().join(format!("babel-idem-outbox-{}", std::process::id()));
    let db_url = match &options.db {
        Some(url) => url.clone(),
        None => {
            std::fs::create_dir_all(&temp)?;
            format!("sqlite://{}", temp.join("ledger.db").display())
        }
    };
    let ledger = Arc::new(
        Ledger::open(
            &db_url,
            &options.prefix,
            &options.out_queue,
            options.fail_rate,
        )
        .await?,
    );
    let transport = RedisTransport::builder()
        .retry_after(options.retry_after)
        .connect(&options.redis)
        .await?;

    // The inputs: each credit delivered `deliveries` times.
    let mut credited_once = 0;
    let credits: Vec<Envelope> = (0..options.inputs)
        .map(|n| {
            let amount = 10 + n as i64;
            credited_once += amount;
            Envelope::new(CREDIT, json!({"account": ACCOUNT, "amount": amount}))
                .with_queue(&options.queue)
        })
        .collect();
    for _ in 0..options.deliveries {
        for credit in &credits {
            transport.publish_envelope(credit).await?;
        }
    }
    let before = ledger.balance().await?;

    // The relay, beside the worker.
    let (stop_relay, relay_stopped) = tokio::sync::oneshot::channel::<()>();
    let relay = if options.relay {
        let relay = Relay::builder(ledger.relay_source(&db_url)?, transport.clone())
            .poll_interval(Duration::from_millis(200))
            .build()
            .await?;
        Some(tokio::spawn(async move {
            let report = relay.run(relay_stopped).await?;
            // What committed while it stopped.
            let rest = relay.drain().await?;
            Ok::<u64, babel_idem::outbox::RelayError>(report.published + rest.published)
        }))
    } else {
        drop(relay_stopped);
        None
    };

    let handler = Arc::clone(&ledger);
    let router = Router::builder()
        .route(urn!("urn:babel:ledger:credit"), move |env: Envelope| {
            let ledger = Arc::clone(&handler);
            async move { ledger.deliver(env).await }
        })
        .max_attempts(50)
        .backoff(Backoff::fixed(Duration::from_millis(5)))
        .build()?;
    // SQLite has one writer at a time: one delivery at a time there.
    let concurrency = if db_url.starts_with("sqlite:") {
        1
    } else {
        CONCURRENCY
    };
    let consumer = Consumer::builder(router, transport.clone(), &options.queue)
        .concurrency(concurrency)
        .build()?;
    let idle = consumer.progress();
    let report = consumer.run_until(idle.idle_for(options.until_idle)).await;
    let _ = stop_relay.send(());
    let published = match relay {
        Some(relay) => Some(relay.await??),
        None => None,
    };
    let after = ledger.balance().await?;

    let mut line = json!({
        "delivered": report.delivered,
        "retried": report.retried,
        "dead_lettered": report.dead_lettered,
    });
    if options.inputs > 0 {
        println!(
            "balance moved by {} for {} credits delivered {} times each (their sum is {credited_once})",
            after - before,
            options.inputs,
            options.deliveries
        );
        line["balance_moved"] = json!(after - before);
        line["credited_once"] = json!(credited_once);
    }
    if let Some(published) = published {
        line["published"] = json!(published);
    }
    if options.downstream {
        let consumed = downstream(&transport, &options.out_queue).await?;
        let once = consumed.values().all(|&runs| runs == 1);
        println!(
            "{} outgoing ids consumed downstream, each {}",
            consumed.len(),
            if once { "once" } else { "MORE THAN ONCE" }
        );
        line["consumed"] = json!(consumed.len());
        line["each_consumed_once"] = json!(once);
    }
    println!("{line}");
    if options.db.is_none() {
        let _ = std::fs::remove_dir_all(&temp);
    }
    Ok(())
}

/// Consumes the relay's output with a seen-set guard; how many times each
/// outgoing id ran.
async fn downstream(
    transport: &RedisTransport,
    queue: &str,
) -> anyhow::Result<HashMap<String, u32>> {
    let seen = Arc::new(InMemoryStore::new());
    let runs: Arc<std::sync::Mutex<HashMap<String, u32>>> = Arc::default();
    let (route_seen, route_runs) = (Arc::clone(&seen), Arc::clone(&runs));
    let router = Router::builder()
        .route(urn!("urn:babel:ledger:credited"), move |env: Envelope| {
            let (seen, runs) = (Arc::clone(&route_seen), Arc::clone(&route_runs));
            async move {
                let id = env.meta.id.clone().unwrap_or_default();
                run_once(&*seen, &env, async {
                    *runs.lock().unwrap().entry(id).or_default() += 1;
                    Ok::<(), babel_idem::StoreError>(())
                })
                .await
            }
        })
        .build()?;
    let consumer = Consumer::builder(router, transport.clone(), queue).build()?;
    let idle = consumer.progress();
    consumer
        .run_until(idle.idle_for(Duration::from_secs(1)))
        .await;
    let runs = runs.lock().unwrap().clone();
    Ok(runs)
}
