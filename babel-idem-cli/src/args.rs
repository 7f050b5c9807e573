//! The command line, as clap parses it.

use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::units::positive_duration;

/// The conventions every command keeps, as `--help` prints them.
pub(crate) const CONVENTIONS: &str = "\
Conventions (every command keeps them):
  - A store command takes the store URL as its first argument:
    sqlite://PATH (or sqlite:PATH), redis://..., rediss://...,
    redis+cluster://HOST:PORT,... (a Redis Cluster, every master scanned),
    postgres://... (or postgresql://...). The URL picks the backend.
  - A command that talks to a broker takes --redis URL, --amqp URL or --kafka URL
    (redrive, dlq, relay), or --kafka URL (redrive, dlq, kafka).
  - Durations are a whole number and a unit: 250ms, 30s, 5m, 2h, 7d
    (e.g. --timeout 5s); a bare number is seconds.
  - Points in time are RFC 3339 (2026-12-01T02:48:19Z, with Z or an offset)
    or Unix milliseconds, in UTC.
  - --json prints one JSON object per line, in every command.
  - stdout is the command's output; stderr its error line and the log of
    what it meets (a broker outage, a row refused): babel-idem's warnings
    and infos, only errors with -q, debug with -v, traces with -vv; as
    JSON objects with --json.
  - --dry-run changes nothing and reports what the command would do, in
    every command (a command that only reads changes nothing anyway).
  - Ids given as - are read from stdin, one per line.
";

/// What `--help` prints after the options: the conventions, the exit codes.
fn after_help() -> String {
    format!("{CONVENTIONS}\n{}", include_str!("exit_codes.txt"))
}

/// Operate babel-idem's seen-sets: look up, forget (replay), purge, migrate
/// and count the marks and claims that SQLite, Redis and PostgreSQL stores
/// keep; look at dead-letter queues and redrive them; move Kafka retry-tier
/// records back to work.
#[derive(Debug, Parser)]
#[command(
    name = "babel-idem",
    version,
    after_help = after_help()
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub command: Command,
    #[command(flatten)]
    pub options: StoreOptions,
}

/// The store's settings, as the consumers that write to it configure them,
/// and the output flags every command shares.
#[derive(Debug, Args)]
pub(crate) struct StoreOptions {
    /// SQL stores: the table (default `babelqueue_idempotency`).
    #[arg(long, global = true, value_name = "TABLE")]
    pub table: Option<String>,
    /// Redis: the key prefix (default `bq:idemp:`; with --php-claims `bq:idem:`).
    #[arg(long, global = true, value_name = "PREFIX")]
    pub prefix: Option<String>,
    /// Redis: the PHP SDK's layout, one key per id holding '1' (claimed)
    /// or '2' (done), as `RedisStoreBuilder::php_claims` writes it.
    #[arg(long, global = true)]
    pub php_claims: bool,
    /// How long to wait for the store (connecting, a pool slot, a lock):
    /// a duration such as 5s or 1m.
    #[arg(long, global = true, value_name = "DURATION", default_value = "5s",
          value_parser = positive_duration)]
    pub timeout: Duration,
    /// Print JSON for scripts: one object per line (the log on stderr too).
    #[arg(long, global = true)]
    pub json: bool,
    /// Log more on stderr: -v debug events, -vv traces (default: warnings
    /// and infos).
    #[arg(short = 'v', long = "verbose", global = true, action = clap::ArgAction::Count,
          conflicts_with = "quiet")]
    pub verbose: u8,
    /// Log only errors on stderr.
    #[arg(short = 'q', long, global = true)]
    pub quiet: bool,
    /// Change nothing; report what the command would do.
    #[arg(long, global = true)]
    pub dry_run: bool,
}

/// The ids of `seen` and `forget`, and the scope they were marked under.
#[derive(Debug, Args)]
pub(crate) struct IdArgs {
    /// The store URL.
    pub url: String,
    /// Message ids (`meta.id`); `-` reads ids from stdin, one per line.
    #[arg(required = true, value_name = "ID")]
    pub ids: Vec<String>,
    /// The guard's scope (`Guard::scope`, `#[idempotent(scope = ...)]`):
    /// the ids are looked up under the keys that guard writes.
    #[arg(long, value_name = "SCOPE")]
    pub scope: Option<String>,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Where each id stands: seen (done), claimed (a handler holds it) or
    /// unseen (exit 0: all are seen; 1: some are not).
    Seen(IdArgs),
    /// Forget ids, so their next delivery runs again (manual replay). A
    /// worker whose seen-set is in `store::Cached` still skips an id it saw
    /// done for its window (2s by default; the worker example's `--cached`):
    /// wait that long before replaying.
    Forget(IdArgs),
    /// Delete the marks whose TTL has run out (SQL stores; Redis expires its own).
    PurgeExpired {
        /// The store URL.
        url: String,
        /// Also delete finished claims (lapsed leases; on PostgreSQL the
        /// rows commits leave behind, once a minute old).
        #[arg(long)]
        claims: bool,
    },
    /// Create the seen-set table and its index if they are missing (SQL stores).
    Migrate {
        /// The store URL.
        url: String,
        /// Also create claim mode's tables (claims need the seen-set table).
        #[arg(long)]
        claims: bool,
        /// Also create the transactional outbox's table.
        #[arg(long)]
        outbox: bool,
        /// The outbox table (default babelqueue_outbox).
        #[arg(long, value_name = "NAME", requires = "outbox")]
        outbox_table: Option<String>,
    },
    /// Count the marks: total, expired, oldest and newest, and the
    /// retention the store reads from them.
    Stats {
        /// The store URL.
        url: String,
        /// Count only the marks of this guard scope.
        #[arg(long, value_name = "SCOPE")]
        scope: Option<String>,
    },
    /// Move dead-lettered messages back to work: each selected message,
    /// reset (no dead_letter block, attempts 0, the same meta.id), to its
    /// original queue or --to; poison records stay unless --include-poison.
    Redrive(Box<RedriveArgs>),
    /// Look at a dead-letter queue before moving anything.
    Dlq {
        #[command(subcommand)]
        command: DlqCommand,
    },
    /// Publish a transactional outbox's pending rows to Redis or RabbitMQ,
    /// until SIGTERM (after the current batch) or, with --drain, until none
    /// is pending (a signal stops a drain after the current batch, and it
    /// prints what it did).
    Relay(crate::outbox::RelayArgs),
    /// Look after a transactional outbox: stats, retry-failed, purge-published.
    #[command(subcommand)]
    Outbox(crate::outbox::OutboxCommand),
    /// Operate the Kafka binding: reinject.
    #[command(subcommand)]
    Kafka(KafkaCommand),
}

/// `kafka`'s subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum KafkaCommand {
    /// Move the records parked on the retry tiers (<topic>.retry.<n>) back
    /// to their work topic once due, until SIGTERM or Ctrl-C; then print
    /// how many it moved. Run one beside the workers of a transport with
    /// retry tiers: without it a parked message is never delivered.
    Reinject(ReinjectArgs),
}

/// `kafka reinject`'s arguments.
#[derive(Debug, Args)]
pub(crate) struct ReinjectArgs {
    /// The Kafka cluster (kafka://HOST:PORT[,HOST:PORT]).
    #[arg(long, value_name = "URL")]
    pub kafka: String,
    /// A work topic whose tier topics are read; repeat it for more.
    #[arg(long = "topic", value_name = "TOPIC", required = true)]
    pub topics: Vec<String>,
    /// The retry tiers, the producers' list: ascending durations, comma
    /// separated.
    #[arg(long, value_name = "DURATIONS", default_value = "5s,30s,5m,30m",
          value_parser = crate::kafka::parse_tiers)]
    pub tiers: babel_idem::transport::kafka::RetryTiers,
    /// The consumer group the re-injectors share.
    #[arg(long, value_name = "GROUP", default_value = babel_idem::transport::kafka::DEFAULT_REINJECT_GROUP)]
    pub group: String,
}

/// Which dead-lettered messages a command takes: every condition given
/// must hold; a repeated flag takes any of its values.
#[derive(Debug, Clone, Args)]
pub(crate) struct SelectArgs {
    /// Only messages of this URN (job).
    #[arg(long, value_name = "URN")]
    pub urn: Vec<String>,
    /// Only messages dead-lettered for this reason: failed, unknown_urn,
    /// poison, or RabbitMQ's x-death reason (rejected, expired, maxlen,
    /// delivery_limit).
    #[arg(long, value_name = "REASON")]
    pub reason: Vec<String>,
    /// Only messages dead-lettered at or after TIME (RFC 3339 or Unix ms, UTC).
    #[arg(long, value_name = "TIME")]
    pub since: Option<String>,
    /// Only messages dead-lettered at or before TIME (RFC 3339 or Unix ms, UTC).
    #[arg(long, value_name = "TIME")]
    pub until: Option<String>,
    /// Only the message with this meta.id.
    #[arg(long, value_name = "ID")]
    pub id: Vec<String>,
}

/// The broker a command talks to: one of --redis, --amqp and --kafka.
#[derive(Debug, Clone, Args)]
#[group(required = true, multiple = false)]
pub(crate) struct BrokerArgs {
    /// The Redis server of the BabelQueue Redis layout (redis://HOST:PORT/DB).
    #[arg(long, value_name = "URL")]
    pub redis: Option<String>,
    /// The RabbitMQ broker (amqp://USER:PASSWORD@HOST:PORT/VHOST).
    #[arg(long, value_name = "URL")]
    pub amqp: Option<String>,
    /// The Kafka cluster (kafka://HOST:PORT[,HOST:PORT]); a dead-letter
    /// run reads the dead-letter topic in the consumer group
    /// babelqueue-redrive.
    #[arg(long, value_name = "URL")]
    pub kafka: Option<String>,
}

impl BrokerArgs {
    /// The URL given, whichever flag carried it.
    pub(crate) fn url(&self) -> &str {
        self.redis
            .as_deref()
            .or(self.amqp.as_deref())
            .or(self.kafka.as_deref())
            .unwrap_or_default()
    }
}

/// `redrive`'s arguments.
#[derive(Debug, Args)]
pub(crate) struct RedriveArgs {
    #[command(flatten)]
    pub broker: BrokerArgs,
    /// The dead-letter queue to move messages from (e.g. orders.dlq).
    #[arg(long, value_name = "QUEUE")]
    pub from: String,
    /// Send every message to this queue instead of its original queue.
    #[arg(long, value_name = "QUEUE")]
    pub to: Option<String>,
    /// Move at most N messages.
    #[arg(long, value_name = "N")]
    pub max: Option<usize>,
    #[command(flatten)]
    pub select: SelectArgs,
    /// Stamp bq-replay-bypass on each moved message: handlers see an
    /// intended replay and can skip external effects that already fired.
    #[arg(long)]
    pub bypass: bool,
    /// Move at most N messages a second.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub rate: Option<u32>,
    /// Also republish poison records: the payload each kept, as it holds it.
    #[arg(long)]
    pub include_poison: bool,
    /// DANGEROUS: first forget the moved messages' ids in this seen-set
    /// (a store URL), so messages that were marked done run again.
    #[arg(long, value_name = "STORE_URL")]
    pub forget_in: Option<String>,
}

/// `dlq`'s subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum DlqCommand {
    /// One line per message: position, meta.id, URN, reason, failed at, queue.
    List {
        #[command(flatten)]
        broker: BrokerArgs,
        /// The dead-letter queue (e.g. orders.dlq).
        queue: String,
        /// At most N messages, from the head.
        #[arg(long, value_name = "N")]
        max: Option<usize>,
        #[command(flatten)]
        select: SelectArgs,
    },
    /// One message in full: its record, its headers, its body.
    Show {
        #[command(flatten)]
        broker: BrokerArgs,
        /// The dead-letter queue (e.g. orders.dlq).
        queue: String,
        /// The message's meta.id, or its position (0 at the head) as #N.
        message: String,
    },
    /// Counts by reason, by URN and by original queue.
    Stats {
        #[command(flatten)]
        broker: BrokerArgs,
        /// The dead-letter queue (e.g. orders.dlq).
        queue: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_help_prints_the_conventions_as_written_once() {
        use clap::CommandFactory;
        let help = Cli::command().render_long_help().to_string();
        assert!(help.contains(CONVENTIONS), "{help}");
    }
}
