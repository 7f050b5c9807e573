//! The command line, as clap parses it.

use clap::{Args, Parser, Subcommand};

/// Operate babel-idem's seen-sets: look up, forget (replay), purge, migrate
/// and count the marks that SQLite, Redis and PostgreSQL stores keep.
#[derive(Debug, Parser)]
#[command(
    name = "babel-idem",
    version,
    after_help = concat!(
        "Store URLs: sqlite://PATH (or sqlite:PATH), redis://..., rediss://..., ",
        "postgres://... (or postgresql://...).\n\n",
        include_str!("exit_codes.txt")
    )
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub command: Command,
    #[command(flatten)]
    pub options: StoreOptions,
}

/// The store's settings, as the consumers that write to it configure them.
#[derive(Debug, Args)]
pub(crate) struct StoreOptions {
    /// SQL stores: the table (default `babelqueue_idempotency`).
    #[arg(long, global = true, value_name = "TABLE")]
    pub table: Option<String>,
    /// Redis: the key prefix (default `bq:idemp:`).
    #[arg(long, global = true, value_name = "PREFIX")]
    pub prefix: Option<String>,
    /// Seconds to wait for the store (connecting, a pool slot, a lock).
    #[arg(long, global = true, value_name = "SECS", default_value_t = 5,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub timeout: u64,
    /// Print JSON for scripts: one object per line.
    #[arg(long, global = true)]
    pub json: bool,
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
    /// Whether each id is marked processed (exit 0: all are; 1: some are not).
    Seen(IdArgs),
    /// Forget ids, so their next delivery runs again (manual replay).
    Forget {
        #[command(flatten)]
        ids: IdArgs,
        /// Say which ids would be forgotten; remove nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Delete the marks whose TTL has run out (SQL stores; Redis expires its own).
    PurgeExpired {
        /// The store URL.
        url: String,
        /// Count the expired marks; remove nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Create the table and its index if they are missing (SQL stores).
    Migrate {
        /// The store URL.
        url: String,
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
