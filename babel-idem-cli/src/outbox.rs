//! The transactional outbox's commands: `relay` drains an outbox to a
//! broker; `outbox stats | retry-failed | purge-published` look after it;
//! `migrate URL --outbox` creates its table.

use std::sync::Arc;
use std::time::Duration;

use babel_idem::outbox::{
    OutboxError, OutboxSource, PostgresOutbox, Relay, RelayError, RelaySink, RelaySource,
    SqliteOutbox,
};
use babel_idem::transport::{AmqpTransport, KafkaTransport, RedisTransport, TransportError};
use clap::{Args, Subcommand};
use serde_json::json;
use sqlx::postgres::PgPoolOptions;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};

use crate::args::BrokerArgs;
use crate::backend::with_causes;
use crate::exit::{CliError, Exit};
use crate::output::Output;
use crate::target::Target;
use crate::units::{parse_duration, positive_duration};

/// `babel-idem relay`'s arguments.
#[derive(Debug, Args)]
pub(crate) struct RelayArgs {
    /// The outbox's database: sqlite://PATH or postgres://...
    #[arg(long, value_name = "URL")]
    pub outbox: String,
    /// The broker the rows are published to.
    #[command(flatten)]
    pub broker: BrokerArgs,
    /// The outbox table (default babelqueue_outbox).
    #[arg(long, value_name = "NAME")]
    pub outbox_table: Option<String>,
    /// Exit 0 once the outbox holds no pending row (each published, or
    /// failed after its last attempt), waiting out broker and database
    /// outages. SIGTERM or Ctrl-C stops it after the current batch: it
    /// prints the totals so far, marked interrupted, and exits 0.
    #[arg(long)]
    pub drain: bool,
    /// Rows taken, published and marked at a time.
    #[arg(long, value_name = "N", default_value_t = 100)]
    pub batch: u32,
    /// Refusals after which a row is set failed.
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub max_attempts: u32,
    /// The largest body published, in bytes; a larger row is refused.
    #[arg(long, value_name = "BYTES", default_value_t = 16 * 1024 * 1024)]
    pub max_body: usize,
    /// How often an idle relay looks for rows nothing woke it for.
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = positive_duration)]
    pub poll: Duration,
}

/// `babel-idem outbox`'s subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum OutboxCommand {
    /// Count the rows by status, and the age of the oldest pending one.
    Stats(OutboxTarget),
    /// Make the failed rows pending again, their attempts back to 0.
    RetryFailed(OutboxTarget),
    /// Delete the rows published longer ago than --older-than, in batches.
    PurgePublished {
        #[command(flatten)]
        target: OutboxTarget,
        /// How long published rows are kept: 7d, 12h, 30m.
        #[arg(long, value_name = "DURATION", default_value = "7d", value_parser = parse_duration)]
        older_than: Duration,
        /// Rows deleted per statement (each a short transaction).
        #[arg(long, value_name = "N", default_value_t = 1000)]
        batch: u32,
    },
}

impl OutboxCommand {
    /// The outbox URL the command names.
    pub(crate) fn url(&self) -> &str {
        match self {
            OutboxCommand::Stats(target) | OutboxCommand::RetryFailed(target) => &target.url,
            OutboxCommand::PurgePublished { target, .. } => &target.url,
        }
    }
}

/// The outbox an `outbox` subcommand works on.
#[derive(Debug, Args)]
pub(crate) struct OutboxTarget {
    /// The outbox's database: sqlite://PATH or postgres://...
    pub url: String,
    /// The outbox table (default babelqueue_outbox).
    #[arg(long, value_name = "NAME")]
    pub outbox_table: Option<String>,
}

/// What the CLI opens an outbox for: its pool and connection options.
#[derive(Clone, Copy, PartialEq)]
enum Purpose {
    /// The relay and the operator's commands, on an outbox that exists.
    Use,
    /// `migrate --outbox`: one connection, and a SQLite file made if missing.
    Migrate,
}

/// The outbox `target` names, on a lazy pool (nothing is reached yet).
fn outbox_at(
    target: &Target,
    table: Option<&str>,
    timeout: Duration,
    purpose: Purpose,
) -> Result<Arc<dyn OutboxSource>, CliError> {
    let (sqlite_connections, postgres_connections) = match purpose {
        Purpose::Use => (2, 4),
        Purpose::Migrate => (1, 1),
    };
    Ok(match target {
        Target::Sqlite(path) => {
            let mut options = SqliteConnectOptions::new()
                .filename(path)
                .journal_mode(SqliteJournalMode::Wal)
                .busy_timeout(timeout);
            options = match purpose {
                // The relay's own connections: in WAL mode `NORMAL` syncs
                // at checkpoints, not at each commit; a mark a power loss
                // takes back publishes its row again (at least once, as
                // always).
                Purpose::Use => options.synchronous(SqliteSynchronous::Normal),
                Purpose::Migrate => options.create_if_missing(true),
            };
            let pool = SqlitePoolOptions::new()
                .max_connections(sqlite_connections)
                .acquire_timeout(timeout)
                .connect_lazy_with(options);
            let mut outbox = SqliteOutbox::new(pool);
            if let Some(table) = table {
                outbox = outbox.with_table(table).map_err(usage)?;
            }
            Arc::new(outbox)
        }
        Target::Postgres(url) => {
            let pool = PgPoolOptions::new()
                .max_connections(postgres_connections)
                .acquire_timeout(timeout)
                .connect_lazy(url)
                .map_err(|e| CliError::usage(format!("{}: {e}", target.display())))?;
            let mut outbox = PostgresOutbox::new(pool);
            if let Some(table) = table {
                outbox = outbox.with_table(table).map_err(usage)?;
            }
            Arc::new(outbox)
        }
        Target::Redis(_) => {
            return Err(CliError::usage(match purpose {
                Purpose::Use => "an outbox lives in SQL: use sqlite://PATH or postgres://...",
                Purpose::Migrate => {
                    "--outbox needs a SQL store: an outbox lives in sqlite://PATH or postgres://..."
                }
            }));
        }
    })
}

/// Opens the outbox `url` names, checking that its table is there.
async fn open(
    url: &str,
    table: Option<&str>,
    timeout: Duration,
) -> Result<(Target, Arc<dyn OutboxSource>), CliError> {
    let target = Target::parse(url)?;
    if let Target::Sqlite(path) = &target
        && !path.exists()
    {
        return Err(not_migrated(&target, "no SQLite database at this path"));
    }
    let outbox = outbox_at(&target, table, timeout, Purpose::Use)?;
    // Reaches the database and checks the table.
    outbox
        .stats()
        .await
        .map_err(|e| outbox_failed(&target, e))?;
    Ok((target, outbox))
}

fn usage(error: OutboxError) -> CliError {
    CliError::usage(error.to_string())
}

/// Sorts an outbox failure into an exit code.
fn outbox_failed(target: &Target, error: OutboxError) -> CliError {
    match error {
        OutboxError::MissingTable { table } => {
            not_migrated(target, &format!("outbox table {table} does not exist"))
        }
        OutboxError::InvalidTable { .. } => CliError::usage(error.to_string()),
        OutboxError::Database { ref source, .. }
            if source
                .downcast_ref::<sqlx::Error>()
                .is_some_and(|e| matches!(e, sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut)) =>
        {
            CliError::new(
                Exit::Connect,
                format!("cannot connect to {}: {}", target.display(), chain(&error)),
            )
        }
        other => CliError::new(
            Exit::Store,
            format!("{}: {}", target.display(), chain(&other)),
        ),
    }
}

fn not_migrated(target: &Target, what: &str) -> CliError {
    CliError::new(
        Exit::NotMigrated,
        format!(
            "{}: {what}: run `babel-idem migrate URL --outbox` (with the same --outbox-table) first",
            target.display()
        ),
    )
}

/// The error and its causes, `: `-separated.
fn chain(error: &dyn std::error::Error) -> String {
    with_causes(error.to_string(), error.source())
}

/// `babel-idem relay`: drains the outbox to the broker until SIGTERM (or
/// Ctrl-C), stopping after the current batch; with `--drain`, until no row
/// is pending or a signal, whichever comes first. Either way it prints what
/// it did: the totals of the rows its marks recorded.
pub(crate) async fn relay(
    args: RelayArgs,
    timeout: Duration,
    dry_run: bool,
    out: &mut Output,
) -> Result<Exit, CliError> {
    let (target, opened) = open(&args.outbox, args.outbox_table.as_deref(), timeout).await?;
    if dry_run {
        // Publishes nothing: says what a run would take.
        let stats = opened
            .stats()
            .await
            .map_err(|e| outbox_failed(&target, e))?;
        out.emit(
            || {
                format!(
                    "{}: would publish up to {} pending rows (dry run: nothing published)",
                    target.display(),
                    stats.pending
                )
            },
            || json!({ "pending": stats.pending, "dry_run": true }),
        );
        return Ok(Exit::Ok);
    }
    let broker = &args.broker;
    let sink = match (&broker.redis, &broker.amqp, &broker.kafka) {
        (Some(url), _, _) => RelaySink::from(
            RedisTransport::builder()
                .timeout(timeout)
                .connect(url)
                .await
                .map_err(|e| broker_failed(url, e))?,
        ),
        (None, Some(url), _) => RelaySink::from(
            AmqpTransport::builder()
                .timeout(timeout)
                .connect(url)
                .await
                .map_err(|e| broker_failed(url, e))?,
        ),
        (None, None, Some(url)) => RelaySink::from(
            KafkaTransport::builder()
                .timeout(timeout)
                .connect(url)
                .await
                .map_err(|e| broker_failed(url, e))?,
        ),
        (None, None, None) => {
            return Err(CliError::usage(
                "relay needs --redis URL, --amqp URL or --kafka URL",
            ));
        }
    };
    let relay = Relay::builder(RelaySource::shared(Arc::clone(&opened)), sink)
        .batch_size(args.batch)
        .max_attempts(args.max_attempts)
        .max_body_bytes(args.max_body)
        .poll_interval(args.poll)
        .build()
        .await
        .map_err(|e| relay_failed(&target, e))?;
    // Set once a signal asked the relay to stop: a drain it cut short is
    // reported as interrupted, with the totals of the batches it marked.
    let signalled = std::sync::atomic::AtomicBool::new(false);
    let terminated = terminated();
    let shutdown = async {
        terminated.await;
        signalled.store(true, std::sync::atomic::Ordering::SeqCst);
    };
    let report = if args.drain {
        relay.drain_until(shutdown).await
    } else {
        relay.run(shutdown).await
    }
    .map_err(|e| relay_failed(&target, e))?;
    let interrupted = args.drain && signalled.load(std::sync::atomic::Ordering::SeqCst);
    // What the interrupted drain left, when the database still answers.
    let pending = match interrupted {
        true => opened.stats().await.ok().map(|stats| stats.pending),
        false => None,
    };
    out.emit(
        || {
            let totals = format!(
                "published {}, refused {}, failed {}, waiting {}, broker outages {}",
                report.published, report.refused, report.failed, report.waiting, report.outages
            );
            match (interrupted, pending) {
                (false, _) => format!("{}: {totals}", target.display()),
                (true, Some(pending)) => format!(
                    "{}: interrupted before the outbox was drained: {totals}; {pending} rows still pending",
                    target.display()
                ),
                (true, None) => format!(
                    "{}: interrupted before the outbox was drained: {totals}",
                    target.display()
                ),
            }
        },
        || {
            let mut line = json!({
                "published": report.published,
                "refused": report.refused,
                "failed": report.failed,
                "waiting": report.waiting,
                "outages": report.outages,
            });
            if args.drain {
                line["interrupted"] = json!(interrupted);
            }
            if let Some(pending) = pending {
                line["pending"] = json!(pending);
            }
            line
        },
    );
    Ok(Exit::Ok)
}

/// Completes on SIGTERM or Ctrl-C. The handlers are installed when it is
/// called, not when it is first polled, so a signal that arrives before
/// the relay first looks still stops it after its batch.
pub(crate) fn terminated() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    let signals = {
        use tokio::signal::unix::{SignalKind, signal};
        signal(SignalKind::terminate())
            .and_then(|term| Ok((term, signal(SignalKind::interrupt())?)))
    };
    async move {
        #[cfg(unix)]
        if let Ok((mut term, mut interrupt)) = signals {
            tokio::select! {
                _ = term.recv() => {}
                _ = interrupt.recv() => {}
            }
            return;
        }
        let _ = tokio::signal::ctrl_c().await;
    }
}

fn broker_failed(url: &str, error: TransportError) -> CliError {
    let display = crate::target::redacted(url);
    let exit = match error {
        TransportError::InvalidUrl { .. } => Exit::Usage,
        _ => Exit::Connect,
    };
    CliError::new(
        exit,
        format!("cannot connect to {display}: {}", chain(&error)),
    )
}

fn relay_failed(target: &Target, error: RelayError) -> CliError {
    match error {
        RelayError::Outbox(error) => outbox_failed(target, error),
        other => CliError::new(Exit::Connect, chain(&other)),
    }
}

/// `babel-idem outbox ...`.
pub(crate) async fn outbox(
    command: OutboxCommand,
    timeout: Duration,
    dry_run: bool,
    out: &mut Output,
) -> Result<Exit, CliError> {
    match command {
        OutboxCommand::Stats(target) => {
            let (place, opened) =
                open(&target.url, target.outbox_table.as_deref(), timeout).await?;
            let stats = opened.stats().await.map_err(|e| outbox_failed(&place, e))?;
            let lag = stats.oldest_pending_age.map(|age| age.as_secs_f64());
            out.emit(
                || {
                    format!(
                        "pending {}, published {}, failed {}, oldest pending {}",
                        stats.pending,
                        stats.published,
                        stats.failed,
                        lag.map_or("none".to_owned(), |lag| format!("{lag:.3}s old"))
                    )
                },
                || {
                    json!({
                        "pending": stats.pending,
                        "published": stats.published,
                        "failed": stats.failed,
                        "oldest_pending_age_seconds": lag,
                    })
                },
            );
        }
        OutboxCommand::RetryFailed(target) => {
            let (place, opened) =
                open(&target.url, target.outbox_table.as_deref(), timeout).await?;
            let count = opened.retry_failed(dry_run).await;
            let count = count.map_err(|e| outbox_failed(&place, e))?;
            let verbs = ("make", "made");
            emit_count(
                out,
                ("retried", count),
                dry_run,
                verbs,
                "failed rows pending",
            );
        }
        OutboxCommand::PurgePublished {
            target,
            older_than,
            batch,
        } => {
            let (place, opened) =
                open(&target.url, target.outbox_table.as_deref(), timeout).await?;
            let count = opened.purge_published(older_than, batch, dry_run).await;
            let count = count.map_err(|e| outbox_failed(&place, e))?;
            let verbs = ("delete", "deleted");
            emit_count(out, ("purged", count), dry_run, verbs, "published rows");
        }
    }
    Ok(Exit::Ok)
}

/// Prints how many rows a command changed (`key` in JSON), or with
/// `dry_run` would change: "would {verb} {count} {rows} (dry run)", else
/// "{done} {count} {rows}".
fn emit_count(
    out: &mut Output,
    (key, count): (&str, u64),
    dry_run: bool,
    (verb, done): (&str, &str),
    rows: &str,
) {
    out.emit(
        || match dry_run {
            true => format!("would {verb} {count} {rows} (dry run)"),
            false => format!("{done} {count} {rows}"),
        },
        || json!({ key: count, "dry_run": dry_run }),
    );
}

/// `migrate URL --outbox`: creates the outbox table (and the SQLite file);
/// with `dry_run`, says whether it is missing. The table name it made.
pub(crate) async fn migrate(
    url: &str,
    table: Option<&str>,
    timeout: Duration,
    dry_run: bool,
) -> Result<(String, bool), CliError> {
    let target = Target::parse(url)?;
    if let Target::Sqlite(path) = &target
        && dry_run
        && !path.exists()
    {
        let table = table.unwrap_or(babel_idem::outbox::DEFAULT_TABLE);
        return Ok((table.to_owned(), true));
    }
    let outbox = outbox_at(&target, table, timeout, Purpose::Migrate)?;
    let name = outbox.table().to_owned();
    if dry_run {
        let missing = match outbox.stats().await {
            Ok(_) => false,
            Err(OutboxError::MissingTable { .. }) => true,
            Err(error) => return Err(outbox_failed(&target, error)),
        };
        return Ok((name, missing));
    }
    outbox
        .migrate()
        .await
        .map_err(|e| outbox_failed(&target, e))?;
    Ok((name, false))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outbox_on_redis_is_refused_as_a_usage_error() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let error = runtime
            .block_on(open(
                "redis://127.0.0.1:6379/0",
                None,
                Duration::from_secs(1),
            ))
            .err()
            .expect("refused");
        assert_eq!(error.exit, Exit::Usage);
    }
}
