//! `babel-idem`: the operator CLI of babel-idem's seen-sets.
//!
//! ```text
//! babel-idem seen URL ID...                 whether each id is marked processed
//! babel-idem forget URL ID... [--dry-run]   un-mark ids (manual replay); `-` reads stdin
//! babel-idem purge-expired URL [--dry-run]  delete marks whose TTL ran out
//! babel-idem migrate URL                    create the table (SQL stores)
//! babel-idem stats URL [--scope S]          count marks: total, expired, oldest, newest
//! ```
//!
//! `URL` is `sqlite://PATH` (or `sqlite:PATH`), `redis://...` or
//! `postgres://...` (`postgresql://`). `--table` (SQL) and `--prefix`
//! (Redis) name the seen-set as the consumers' store builders do; `--scope`
//! looks ids up under a [`Guard::scope`](babel_idem::Guard::scope)'s keys
//! ([`DedupeKey`](babel_idem::key::DedupeKey)); `--json` prints one JSON object
//! per line. Ids given as `-` are read from stdin one per line, a thousand
//! at a time, so a list of any length streams through.
//!
//! Errors are one line on stderr, `babel-idem: ...`, never a backtrace.
//!
//! This library is the binary's body (`babel_idem_cli::main`), so the
//! documentation lives here; operators use the binary.
//!
#![doc = "```text"]
#![doc = include_str!("exit_codes.txt")]
#![doc = "```"]

mod args;
mod backend;
mod commands;
mod exit;
mod ids;
mod output;
mod target;

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

use crate::args::{Cli, Command};
use crate::backend::{Backend, Settings};
use crate::exit::{CliError, Exit};
use crate::output::Output;
use crate::target::Target;

/// Runs the command line of this process and returns its exit code: the
/// whole of the `babel-idem` binary.
pub fn main() -> ExitCode {
    // Usage errors exit 2 here, `--help` and `--version` 0 (clap's codes).
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    let outcome = match runtime {
        Ok(runtime) => runtime.block_on(run(cli)),
        Err(e) => Err(CliError::new(
            Exit::Store,
            format!("cannot start the async runtime: {e}"),
        )),
    };
    match outcome {
        Ok(exit) => exit.into(),
        Err(error) => {
            eprintln!("babel-idem: {}", error.one_line());
            error.exit.into()
        }
    }
}

async fn run(cli: Cli) -> Result<Exit, CliError> {
    let settings = Settings {
        table: cli.options.table,
        prefix: cli.options.prefix,
        timeout: Duration::from_secs(cli.options.timeout),
    };
    let mut out = Output::new(cli.options.json);
    match cli.command {
        Command::Seen(args) => {
            let backend = Backend::ready(&Target::parse(&args.url)?, &settings).await?;
            commands::seen(&backend, args, &mut out).await
        }
        Command::Forget { ids, dry_run } => {
            let backend = Backend::ready(&Target::parse(&ids.url)?, &settings).await?;
            commands::forget(&backend, ids, dry_run, &mut out).await
        }
        Command::PurgeExpired { url, dry_run } => {
            let backend = Backend::ready(&Target::parse(&url)?, &settings).await?;
            commands::purge_expired(&backend, dry_run, &mut out).await
        }
        Command::Migrate { url } => {
            let target = Target::parse(&url)?;
            let table = Backend::migrate(&target, &settings).await?;
            Ok(commands::migrated(&target.display(), table, &mut out))
        }
        Command::Stats { url, scope } => {
            let backend = Backend::ready(&Target::parse(&url)?, &settings).await?;
            commands::stats(&backend, scope.as_deref(), &mut out).await
        }
    }
}
