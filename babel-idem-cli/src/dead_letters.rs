//! The broker commands: `redrive` and `dlq list|show|stats`, through the
//! library's [`redrive`](babel_idem::redrive) on the transport the
//! `--redis`, `--amqp` or `--kafka` URL names.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::time::Duration;

use babel_idem::broker::{ErasedDeadLetters, TransportError};
use babel_idem::redrive::{
    DlqRecord, LeftReason, Outcome, RecordKind, Redrive, RedriveError, RedriveOptions,
    RedriveReport, Selection,
};
use babel_idem::transport::{AmqpTransport, KafkaTransport, RedisTransport};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::{Value, json};

use crate::args::{BrokerArgs, DlqCommand, RedriveArgs, SelectArgs};
use crate::backend::{self, Access, Settings};
use crate::exit::{CliError, Exit, store_failed};
use crate::ids::key;
use crate::output::{Output, compact_json, escaped, pretty_json, rfc3339_ms};
use crate::target::Target;
use crate::units::parse_time;

/// The broker a `--redis`, `--amqp` or `--kafka` URL names, connected, as
/// its dead-letter queues: every command goes through this one object.
async fn connect(
    args: &BrokerArgs,
    timeout: Duration,
) -> Result<Box<dyn ErasedDeadLetters>, CliError> {
    let connected = match (&args.redis, &args.amqp, &args.kafka) {
        (Some(url), _, _) => RedisTransport::builder()
            .timeout(timeout)
            .connect(url)
            .await
            .map(|transport| Box::new(transport) as Box<dyn ErasedDeadLetters>),
        (None, Some(url), _) => AmqpTransport::builder()
            .timeout(timeout)
            .connect(url)
            .await
            .map(|transport| Box::new(transport) as Box<dyn ErasedDeadLetters>),
        (None, None, Some(url)) => KafkaTransport::builder()
            .timeout(timeout)
            .connect(url)
            .await
            .map(|transport| Box::new(transport) as Box<dyn ErasedDeadLetters>),
        (None, None, None) => {
            return Err(CliError::usage(
                "give --redis URL, --amqp URL or --kafka URL",
            ));
        }
    };
    connected.map_err(transport_failed)
}

/// The exit code and line of a transport failure: a bad name or URL is a
/// usage error, an unreachable broker a connect error, the rest a failed
/// operation.
pub(crate) fn transport_failed(error: TransportError) -> CliError {
    let exit = match &error {
        TransportError::InvalidUrl { .. } | TransportError::InvalidQueue { .. } => Exit::Usage,
        TransportError::Connect(_) => Exit::Connect,
        _ => Exit::Store,
    };
    CliError::new(exit, error.to_string())
}

fn redrive_failed(error: RedriveError) -> CliError {
    match error {
        RedriveError::Transport(error) => transport_failed(error),
        RedriveError::MissingQueue(queue) => CliError::new(
            Exit::NotMigrated,
            format!("the dead-letter queue {queue:?} does not exist"),
        ),
        stopped => CliError::new(Exit::Store, stopped.to_string()),
    }
}

/// The library's selection for the flags; `ids`, when given, replaces `--id`.
fn selection(args: &SelectArgs, ids: Option<&[String]>) -> Result<Selection, CliError> {
    let mut selection = Selection::new();
    for urn in &args.urn {
        selection = selection.urn(urn);
    }
    for reason in &args.reason {
        selection = selection.reason(reason);
    }
    let time = |flag: &str, text: &Option<String>| -> Result<Option<u64>, CliError> {
        let Some(text) = text else { return Ok(None) };
        let millis = parse_time(text).map_err(|why| CliError::usage(format!("--{flag}: {why}")))?;
        u64::try_from(millis)
            .map(Some)
            .map_err(|_| CliError::usage(format!("--{flag}: {text:?} is before 1970")))
    };
    if let Some(since) = time("since", &args.since)? {
        selection = selection.since(since);
    }
    if let Some(until) = time("until", &args.until)? {
        selection = selection.until(until);
    }
    for id in ids.unwrap_or(&args.id) {
        selection = selection.id(id);
    }
    Ok(selection)
}

fn options(args: &RedriveArgs, selection: Selection, dry_run: bool) -> RedriveOptions {
    let mut options = RedriveOptions::new()
        .select(selection)
        .dry_run(dry_run)
        .bypass(args.bypass)
        .include_poison(args.include_poison);
    if let Some(to) = &args.to {
        options = options.to(to);
    }
    if let Some(max) = args.max {
        options = options.max(max);
    }
    if let Some(rate) = args.rate {
        options = options.rate(rate);
    }
    options
}

/// `redrive`: moves the selected messages (with `dry_run`, says what would
/// move), one line per message that moved or stayed for a reason, then a
/// summary line.
pub(crate) async fn redrive(
    args: RedriveArgs,
    settings: &Settings,
    dry_run: bool,
    out: &mut Output,
) -> Result<Exit, CliError> {
    // Everything that can be refused is refused before anything moves.
    let mut select = selection(&args.select, None)?;
    let store = match &args.forget_in {
        Some(url) => {
            let access = if dry_run { Access::Read } else { Access::Write };
            Some(backend::open(&Target::parse(url)?, settings, access).await?)
        }
        None => None,
    };
    let broker = connect(&args.broker, settings.timeout).await?;
    if let Some(store) = &store {
        // The plan first: exactly the ids that would move are forgotten,
        // and then only those messages move.
        let plan = broker
            .redrive(&args.from, &options(&args, select.clone(), true))
            .await
            .map_err(redrive_failed)?;
        let ids: Vec<String> = plan
            .items
            .iter()
            .filter(|item| item.outcome == Outcome::WouldMove)
            .filter_map(|item| item.id.clone())
            .collect();
        let keys: Vec<String> = ids.iter().map(|id| key(None, id)).collect();
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        if dry_run {
            out.emit(
                || {
                    format!(
                        "would forget {} ids before moving them (dry run: nothing forgotten)",
                        ids.len()
                    )
                },
                || json!({ "would_forget": ids.len(), "forgotten": 0, "dry_run": true }),
            );
        } else {
            let forgotten = store.admin.forget_ids(&keys).await.map_err(store_failed)?;
            out.emit(
                || format!("forgot {forgotten} of {} ids before moving them", ids.len()),
                || json!({ "forgotten": forgotten, "ids": ids.len(), "dry_run": false }),
            );
        }
        select = selection(&args.select, Some(&ids))?;
        if ids.is_empty() {
            summary(&RedriveReport::default(), &args.from, dry_run, out);
            return Ok(Exit::Ok);
        }
    }
    let bar = progress_bar();
    let options = options(&args, select, dry_run);
    let result = broker
        .redrive_with(&args.from, &options, |_| bar.inc(1))
        .await;
    bar.finish_and_clear();
    match result {
        Ok(report) => {
            items(&report, out);
            summary(&report, &args.from, dry_run, out);
            Ok(Exit::Ok)
        }
        Err(RedriveError::Stopped { report, error }) => {
            items(&report, out);
            summary(&report, &args.from, dry_run, out);
            Err(CliError::new(
                Exit::Store,
                format!(
                    "the redrive stopped after moving {}: {error}; the rest are still in {}, run it again to go on",
                    report.moved, args.from
                ),
            ))
        }
        Err(error) => Err(redrive_failed(error)),
    }
}

/// A bar on stderr counting the messages looked at, drawn only when stderr
/// is a terminal, and only once a run lasts.
fn progress_bar() -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    if let Ok(style) =
        ProgressStyle::with_template("redriving {spinner} {pos} messages ({per_sec})")
    {
        bar.set_style(style);
    }
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}

fn outcome_word(outcome: &Outcome) -> &'static str {
    match outcome {
        Outcome::Moved => "moved",
        Outcome::WouldMove => "would move",
        Outcome::Skipped => "skipped",
        Outcome::Left(_) => "left",
        _ => "other",
    }
}

/// One line per message that moved (or would) or was left for a reason;
/// the skipped ones only count in the summary.
fn items(report: &RedriveReport, out: &mut Output) {
    for item in report
        .items
        .iter()
        .filter(|i| i.outcome != Outcome::Skipped)
    {
        let why = match &item.outcome {
            Outcome::Left(why) => Some(why),
            _ => None,
        };
        out.emit(
            || {
                let mut line = format!(
                    "{}\t{}\t{}\t{}",
                    outcome_word(&item.outcome),
                    or_dash(item.id.as_deref()),
                    or_dash(item.urn.as_deref()),
                    or_dash(reason(&item.reason)),
                );
                if let Some(to) = &item.to {
                    line.push_str(&format!("\t-> {}", escaped(to)));
                }
                if let Some(why) = why {
                    line.push_str(&format!("\t{why}"));
                }
                line
            },
            || {
                json!({
                    "id": item.id,
                    "urn": item.urn,
                    "reason": item.reason,
                    "kind": item.kind.as_str(),
                    "from": item.from,
                    "to": item.to,
                    "outcome": outcome_word(&item.outcome),
                    "left_because": why.map(LeftReason::to_string),
                    "bypassed": item.bypassed,
                })
            },
        );
    }
}

fn summary(report: &RedriveReport, from: &str, dry_run: bool, out: &mut Output) {
    let json = || {
        json!({
            "from": from,
            "moved": report.moved,
            "would_move": report.would_move,
            "skipped": report.skipped,
            "left": report.left,
            "dry_run": dry_run,
        })
    };
    if report.items.is_empty() {
        out.emit(
            || format!("nothing to redrive: {} is empty", escaped(from)),
            || {
                let mut value = json();
                value["note"] = "nothing to redrive".into();
                value
            },
        );
    } else if dry_run {
        out.emit(
            || {
                format!(
                    "would move {}, skipped {}, left {} from {} (dry run: nothing moved)",
                    report.would_move,
                    report.skipped,
                    report.left,
                    escaped(from)
                )
            },
            json,
        );
    } else {
        out.emit(
            || {
                format!(
                    "moved {}, skipped {}, left {} from {}",
                    report.moved,
                    report.skipped,
                    report.left,
                    escaped(from)
                )
            },
            json,
        );
    }
}

/// `dlq list|show|stats`: reads the queue and leaves it as it was.
pub(crate) async fn dlq(
    command: DlqCommand,
    timeout: Duration,
    out: &mut Output,
) -> Result<Exit, CliError> {
    match command {
        DlqCommand::List {
            broker,
            queue,
            max,
            select,
        } => {
            let filter = DlqFilter::new(&select)?;
            let records = look(&broker, &queue, max, timeout).await?;
            for record in records.iter().filter(|r| filter.matches(r)) {
                out.emit_line(|| list_line(record), || record_json(record, false));
            }
            Ok(Exit::Ok)
        }
        DlqCommand::Show {
            broker,
            queue,
            message,
        } => {
            let records = look(&broker, &queue, None, timeout).await?;
            let position = message
                .strip_prefix('#')
                .and_then(|n| n.parse::<usize>().ok());
            let found = records.iter().find(|record| match position {
                Some(position) => record.position == position,
                None => record.id.as_deref() == Some(message.as_str()),
            });
            let Some(record) = found else {
                return Err(CliError::new(
                    Exit::NotSeen,
                    format!("no message {:?} in {queue:?}", escaped(&message)),
                ));
            };
            out.emit_line(|| show_text(record), || record_json(record, true));
            Ok(Exit::Ok)
        }
        DlqCommand::Stats { broker, queue } => {
            let records = look(&broker, &queue, None, timeout).await?;
            stats(&queue, &records, out);
            Ok(Exit::Ok)
        }
    }
}

async fn look(
    broker: &BrokerArgs,
    queue: &str,
    max: Option<usize>,
    timeout: Duration,
) -> Result<Vec<DlqRecord>, CliError> {
    let broker = connect(broker, timeout).await?;
    broker
        .dead_letters(queue, max)
        .await
        .map_err(redrive_failed)
}

/// `dlq list`'s flags, applied to what a look read.
struct DlqFilter {
    select: SelectArgs,
    since: Option<i64>,
    until: Option<i64>,
}

impl DlqFilter {
    fn new(select: &SelectArgs) -> Result<Self, CliError> {
        selection(select, None)?;
        let time = |text: &Option<String>| text.as_deref().map(parse_time).transpose();
        Ok(DlqFilter {
            select: select.clone(),
            since: time(&select.since).map_err(CliError::usage)?,
            until: time(&select.until).map_err(CliError::usage)?,
        })
    }

    fn matches(&self, record: &DlqRecord) -> bool {
        let any = |wanted: &[String], got: Option<&str>| {
            wanted.is_empty() || got.is_some_and(|got| wanted.iter().any(|w| w == got))
        };
        let at = record.failed_at.map(|at| at as i64);
        any(&self.select.urn, record.urn.as_deref())
            && any(&self.select.reason, Some(&record.reason))
            && any(&self.select.id, record.id.as_deref())
            && self
                .since
                .is_none_or(|since| at.is_some_and(|at| at >= since))
            && self
                .until
                .is_none_or(|until| at.is_some_and(|at| at <= until))
    }
}

/// One line per record; an undecodable body adds why it does not decode.
fn list_line(record: &DlqRecord) -> String {
    let mut line = format!(
        "#{}\t{}\t{}\t{}\t{}\t{}\t{}",
        record.position,
        or_dash(record.id.as_deref()),
        or_dash(record.urn.as_deref()),
        or_dash(reason(&record.reason)),
        failed_at(record.failed_at),
        or_dash(record.original_queue.as_deref()),
        record.kind.as_str(),
    );
    if record.kind == RecordKind::Undecodable
        && let Some(why) = &record.error
    {
        line.push('\t');
        line.push_str(&escaped(why));
    }
    line
}

/// A field as a line shows it: escaped, or `-` when there is none.
fn or_dash(text: Option<&str>) -> Cow<'_, str> {
    escaped(text.unwrap_or("-"))
}

/// A dead-letter reason, `None` when the record gives none.
fn reason(reason: &str) -> Option<&str> {
    Some(reason).filter(|reason| !reason.is_empty())
}

/// When a record was dead-lettered, in RFC 3339, or `-`.
fn failed_at(at: Option<u64>) -> String {
    at.map(|at| rfc3339_ms(at as i64))
        .unwrap_or_else(|| "-".into())
}

/// The record as one JSON object; `full` adds its headers and its body,
/// a JSON body with every value as written (a number no `f64` holds
/// included), any other as text.
fn record_json(record: &DlqRecord, full: bool) -> String {
    let mut value = json!({
        "position": record.position,
        "kind": record.kind.as_str(),
        "id": record.id,
        "urn": record.urn,
        "trace_id": record.trace_id,
        "reason": record.reason,
        "failed_at_ms": record.failed_at,
        "failed_at": record.failed_at.map(|at| rfc3339_ms(at as i64)),
        "original_queue": record.original_queue,
        "error": record.error,
    });
    if full {
        value["headers"] = record
            .headers
            .iter()
            .map(|(name, value)| (name.clone(), Value::from(value.as_str())))
            .collect::<serde_json::Map<_, _>>()
            .into();
        if let Some(body) = compact_json(&record.body) {
            let mut line = value.to_string();
            // The object's closing brace, then the body as written.
            line.pop();
            line.push_str(",\"body\":");
            line.push_str(&body);
            line.push('}');
            return line;
        }
        value["body"] = String::from_utf8_lossy(&record.body).into_owned().into();
    }
    value.to_string()
}

fn show_text(record: &DlqRecord) -> String {
    let fields = [
        ("position", format!("#{}", record.position).into()),
        ("kind", record.kind.as_str().into()),
        ("id", or_dash(record.id.as_deref())),
        ("urn", or_dash(record.urn.as_deref())),
        ("trace_id", or_dash(record.trace_id.as_deref())),
        ("reason", or_dash(reason(&record.reason))),
        ("failed_at", failed_at(record.failed_at).into()),
        ("original_queue", or_dash(record.original_queue.as_deref())),
        ("error", or_dash(record.error.as_deref())),
    ];
    let headers = record.headers.iter().map(|(name, value)| {
        (
            "header",
            format!("{}: {}", escaped(name), escaped(value)).into(),
        )
    });
    let mut lines: Vec<String> = fields
        .into_iter()
        .chain(headers)
        .map(|(label, value): (&str, Cow<'_, str>)| format!("{label:<16}{value}"))
        .collect();
    let body = match compact_json(&record.body) {
        Some(body) => pretty_json(&body),
        None => escaped(&String::from_utf8_lossy(&record.body)).into_owned(),
    };
    lines.push("body".into());
    lines.push(body);
    lines.join("\n")
}

fn stats(queue: &str, records: &[DlqRecord], out: &mut Output) {
    let count = |key: fn(&DlqRecord) -> String| {
        let mut counts: BTreeMap<String, u64> = BTreeMap::new();
        for record in records {
            *counts.entry(key(record)).or_default() += 1;
        }
        counts
    };
    let by_reason = count(|r| reason(&r.reason).unwrap_or("-").to_owned());
    let by_urn = count(|r| r.urn.clone().unwrap_or_else(|| "-".into()));
    let by_queue = count(|r| r.original_queue.clone().unwrap_or_else(|| "-".into()));
    out.emit(
        || {
            let mut lines = vec![format!("{}: {} messages", escaped(queue), records.len())];
            for (title, counts) in [
                ("reason", &by_reason),
                ("urn", &by_urn),
                ("original queue", &by_queue),
            ] {
                lines.push(format!("by {title}:"));
                for (name, n) in counts {
                    lines.push(format!("  {n}\t{}", escaped(name)));
                }
            }
            lines.join("\n")
        },
        || {
            json!({
                "queue": queue,
                "messages": records.len(),
                "by_reason": by_reason,
                "by_urn": by_urn,
                "by_original_queue": by_queue,
            })
        },
    );
}
