//! `babel-idem`: the operator CLI of babel-idem's seen-sets.
//!
//! ```text
//! babel-idem seen URL ID...                   where each id stands: seen, claimed or unseen
//! babel-idem forget URL ID...                 un-mark ids (manual replay); `-` reads stdin
//! babel-idem purge-expired URL [--claims]     delete expired marks (and finished claims)
//! babel-idem migrate URL [--claims]           create the seen-set table (and claim mode's)
//! babel-idem stats URL [--scope S]            count marks: total, expired, oldest, newest, retention
//! babel-idem redrive --redis URL|--amqp URL|--kafka URL --from DLQ [--to Q] [--max N] [--urn U]
//!            [--reason R] [--since T] [--until T] [--id ID] [--bypass] [--rate N]
//!            [--include-poison] [--forget-in STORE_URL]
//!                                            move dead-lettered messages back to work
//! babel-idem dlq list|show|stats --redis URL|--amqp URL|--kafka URL DLQ
//!                                            look at a dead-letter queue, change nothing
//! babel-idem relay --outbox URL --redis URL   publish a transactional outbox (or --amqp URL)
//! babel-idem outbox stats|retry-failed|purge-published URL   look after an outbox
//! babel-idem kafka reinject --kafka URL --topic T [--topic T2] [--tiers 5s,30s,5m,30m]
//!                                            move Kafka retry-tier records back to work when due
//! ```
//!
//! `URL` is `sqlite://PATH` (or `sqlite:PATH`), `redis://...`
//! (`redis+cluster://HOST:PORT,...` for a Redis Cluster) or
//! `postgres://...` (`postgresql://`); it picks the backend once, and every
//! command then works through the library's
//! [`Admin`](babel_idem::store::Admin) trait. `--table` (SQL) and
//! `--prefix` (Redis) name the seen-set as the consumers' store builders do;
//! `--scope` looks ids up under a [`Guard::scope`](babel_idem::Guard::scope)'s
//! keys ([`DedupeKey`](babel_idem::key::DedupeKey)).
//!
//! Every command keeps one set of conventions (`--help` prints them): the
//! store URL is a store command's first argument; a command that talks to a
//! broker takes `--redis URL` or `--amqp URL` (`redrive`, `dlq`, `relay`), or
//! `--kafka URL` (`redrive`, `dlq`, `kafka reinject`); durations
//! are written `30s`, `5m`, `2h` ([`parse_duration`]); points in time are
//! RFC 3339 or Unix milliseconds, UTC ([`parse_time`]); `--json` prints one
//! JSON object per line and `--dry-run` changes nothing and reports what
//! the command would do, in every command. Ids given as `-` are read from
//! stdin one per line, a thousand at a time, so a list of any length
//! streams through.
//!
//! Errors are one line on stderr, `babel-idem: ...`, never a backtrace.
//! What a command meets on the way (a broker outage, a row the broker
//! refused, a reconnection: the library's `tracing` events) is logged on
//! stderr too, one line each, `TIME LEVEL TARGET: MESSAGE name=value...`,
//! or a JSON object with `--json`: babel-idem's warnings and infos by
//! default, only errors with `-q`, debug events with `-v`, traces with
//! `-vv`. stdout is only the command's own output, and no line anywhere
//! shows a password of the URLs given.
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
mod dead_letters;
mod exit;
mod ids;
mod kafka;
mod logging;
mod outbox;
mod output;
mod target;
mod units;

pub use units::{parse_duration, parse_time};

use std::process::ExitCode;

use clap::Parser;

use crate::args::{Cli, Command, DlqCommand, KafkaCommand};
use crate::backend::{Access, Settings};
use crate::exit::{CliError, Exit};
use crate::output::Output;
use crate::target::Target;

/// Runs the command line of this process and returns its exit code: the
/// whole of the `babel-idem` binary.
pub fn main() -> ExitCode {
    // Usage errors exit 2 here, `--help` and `--version` 0 (clap's codes).
    let cli = Cli::parse();
    let urls: Vec<String> = urls(&cli.command).into_iter().map(str::to_owned).collect();
    logging::init(
        logging::level(cli.options.quiet, cli.options.verbose),
        cli.options.json,
        urls.clone(),
    );
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
            // A driver's error may quote the URL: no secret of it is printed.
            let line = urls
                .iter()
                .fold(error.one_line(), |line, url| target::scrubbed(&line, url));
            eprintln!("babel-idem: {line}");
            error.exit.into()
        }
    }
}

/// The URLs the command names (a store's, a broker's): none of their
/// secrets is printed.
fn urls(command: &Command) -> Vec<&str> {
    match command {
        Command::Seen(args) => vec![&args.url],
        Command::Forget(args) => vec![&args.url],
        Command::PurgeExpired { url, .. }
        | Command::Migrate { url, .. }
        | Command::Stats { url, .. } => vec![url],
        Command::Redrive(args) => {
            let mut urls = vec![args.broker.url()];
            urls.extend(args.forget_in.as_deref());
            urls
        }
        Command::Dlq { command } => match command {
            DlqCommand::List { broker, .. }
            | DlqCommand::Show { broker, .. }
            | DlqCommand::Stats { broker, .. } => vec![broker.url()],
        },
        Command::Relay(args) => {
            vec![args.outbox.as_str(), args.broker.url()]
        }
        Command::Outbox(command) => vec![command.url()],
        Command::Kafka(KafkaCommand::Reinject(args)) => vec![&args.kafka],
    }
}

async fn run(cli: Cli) -> Result<Exit, CliError> {
    let options = cli.options;
    let settings = Settings {
        table: options.table,
        prefix: options.prefix,
        php_claims: options.php_claims,
        timeout: options.timeout,
    };
    let dry_run = options.dry_run;
    let mut out = Output::new(options.json);
    match cli.command {
        Command::Seen(args) => {
            let opened = backend::open(&Target::parse(&args.url)?, &settings, Access::Read).await?;
            commands::seen(&*opened.admin, args, &mut out).await
        }
        Command::Forget(args) => {
            let access = if dry_run { Access::Read } else { Access::Write };
            let opened = backend::open(&Target::parse(&args.url)?, &settings, access).await?;
            commands::forget(&*opened.admin, args, dry_run, &mut out).await
        }
        Command::PurgeExpired { url, claims } => {
            let access = if dry_run { Access::Read } else { Access::Write };
            let opened = backend::open(&Target::parse(&url)?, &settings, access).await?;
            commands::purge_expired(&opened, claims, dry_run, &mut out).await
        }
        Command::Migrate {
            url,
            claims,
            outbox,
            outbox_table,
        } => {
            let target = Target::parse(&url)?;
            let migration = backend::migrate(&target, &settings, claims, dry_run).await?;
            let exit = commands::migrated(&target.display(), migration, dry_run, &mut out);
            if outbox {
                let (table, missing) =
                    outbox::migrate(&url, outbox_table.as_deref(), settings.timeout, dry_run)
                        .await?;
                commands::outbox_migrated(&target.display(), &table, missing, dry_run, &mut out);
            }
            Ok(exit)
        }
        Command::Relay(args) => outbox::relay(args, settings.timeout, dry_run, &mut out).await,
        Command::Outbox(command) => {
            outbox::outbox(command, settings.timeout, dry_run, &mut out).await
        }
        Command::Stats { url, scope } => {
            let opened = backend::open(&Target::parse(&url)?, &settings, Access::Read).await?;
            commands::stats(&opened, scope.as_deref(), &mut out).await
        }
        Command::Redrive(args) => dead_letters::redrive(*args, &settings, dry_run, &mut out).await,
        Command::Dlq { command } => dead_letters::dlq(command, settings.timeout, &mut out).await,
        Command::Kafka(command) => kafka::kafka(command, settings.timeout, dry_run, &mut out).await,
    }
}
