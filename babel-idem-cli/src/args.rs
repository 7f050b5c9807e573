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
  - A command that talks to a broker takes --redis URL or --amqp URL
    (no command talks to a broker yet).
  - Durations are a whole number and a unit: 250ms, 30s, 5m, 2h, 7d
    (e.g. --timeout 5s); a bare number is seconds.
  - Points in time are RFC 3339 (2026-12-01T02:48:19Z, with Z or an offset)
    or Unix milliseconds, in UTC.
  - --json prints one JSON object per line, in every command.
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
/// keep.
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
    /// Print JSON for scripts: one object per line.
    #[arg(long, global = true)]
    pub json: bool,
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
    /// Forget ids, so their next delivery runs again (manual replay).
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
    },
    /// Count the marks: total, expired, oldest and newest.
    Stats {
        /// The store URL.
        url: String,
        /// Count only the marks of this guard scope.
        #[arg(long, value_name = "SCOPE")]
        scope: Option<String>,
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
