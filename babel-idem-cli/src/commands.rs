//! One function per command, generic over the store: read the ids, call
//! the store's [`Admin`] operations, print the outcome.

use std::io::IsTerminal;

use babel_idem::store::{Admin, IdState, Retention};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::json;

use crate::args::IdArgs;
use crate::backend::{Migration, Opened};
use crate::exit::{CliError, Exit, store_failed};
use crate::ids::{Ids, key, scope_prefix};
use crate::output::{Output, escaped, rfc3339_ms};

/// Ids read (from stdin, too) and sent to the store at a time.
pub(crate) const CHUNK: usize = 1_000;

/// Expired marks (or finished claims) deleted per statement by `purge-expired`.
pub(crate) const PURGE_BATCH: u32 = 10_000;

/// The ids of `args` as the store's keys, [`CHUNK`] at a time, each chunk
/// given to `each` with its ids and keys.
async fn for_each_chunk<F>(args: IdArgs, mut each: F) -> Result<(), CliError>
where
    F: AsyncFnMut(&[String], &[&str]) -> Result<(), CliError>,
{
    let scope = args.scope.as_deref();
    let mut ids = Ids::new(args.ids);
    loop {
        let chunk = ids.next_chunk(CHUNK)?;
        if chunk.is_empty() {
            return Ok(());
        }
        let keys: Vec<String> = chunk.iter().map(|id| key(scope, id)).collect();
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        each(&chunk, &keys).await?;
    }
}

/// Prints `seen`, `claimed` or `unseen` for each id; [`Exit::NotSeen`]
/// unless every id is seen (a claimed id's handler has not finished).
pub(crate) async fn seen(
    store: &dyn Admin,
    args: IdArgs,
    out: &mut Output,
) -> Result<Exit, CliError> {
    let mut all_seen = true;
    for_each_chunk(args, async |ids, keys| {
        let states = store.states(keys).await.map_err(store_failed)?;
        for (id, state) in ids.iter().zip(states) {
            all_seen &= state.is_done();
            let word = match state {
                IdState::Done => "seen",
                IdState::Claimed => "claimed",
                _ => "unseen",
            };
            out.emit(
                || format!("{word}\t{}", escaped(id)),
                || json!({ "id": id, "seen": state.is_done(), "state": state.as_str() }),
            );
        }
        Ok(())
    })
    .await?;
    Ok(if all_seen { Exit::Ok } else { Exit::NotSeen })
}

/// Forgets the ids, [`CHUNK`] at a time; with `dry_run`, lists the ids
/// that are seen instead and removes nothing.
pub(crate) async fn forget(
    store: &dyn Admin,
    args: IdArgs,
    dry_run: bool,
    out: &mut Output,
) -> Result<Exit, CliError> {
    let (mut given, mut removed) = (0u64, 0u64);
    for_each_chunk(args, async |ids, keys| {
        given += ids.len() as u64;
        if !dry_run {
            removed += store.forget_ids(keys).await.map_err(store_failed)?;
            return Ok(());
        }
        let states = store.states(keys).await.map_err(store_failed)?;
        for (id, _) in ids.iter().zip(states).filter(|(_, state)| state.is_done()) {
            removed += 1;
            out.emit(
                || format!("would forget\t{}", escaped(id)),
                || json!({ "id": id, "would_forget": true }),
            );
        }
        Ok(())
    })
    .await?;
    if dry_run {
        out.emit(
            || format!("would forget {removed} of {given} ids (dry run: nothing removed)"),
            || json!({ "ids": given, "would_forget": removed, "forgotten": 0, "dry_run": true }),
        );
    } else {
        out.emit(
            || format!("forgot {removed} of {given} ids"),
            || json!({ "ids": given, "forgotten": removed, "dry_run": false }),
        );
    }
    Ok(Exit::Ok)
}

/// What `purge-expired` deletes: expired marks, or finished claims.
#[derive(Clone, Copy)]
enum Purged {
    Marks,
    Claims,
}

impl Purged {
    fn what(self) -> &'static str {
        match self {
            Purged::Marks => "expired marks",
            Purged::Claims => "finished claims",
        }
    }

    /// The JSON field of the count, `purged` or `claims_purged`.
    fn field(self, dry_run: bool) -> &'static str {
        match (self, dry_run) {
            (Purged::Marks, false) => "purged",
            (Purged::Marks, true) => "would_purge",
            (Purged::Claims, false) => "claims_purged",
            (Purged::Claims, true) => "claims_would_purge",
        }
    }
}

/// Deletes the expired marks (and with `claims` the finished claims) in
/// batches of [`PURGE_BATCH`], with a progress bar on a terminal; with
/// `dry_run`, counts them.
pub(crate) async fn purge_expired(
    opened: &Opened,
    claims: bool,
    dry_run: bool,
    out: &mut Output,
) -> Result<Exit, CliError> {
    if opened.self_expiring {
        // The library's purge is a no-op there; say why rather than "0".
        let purged = opened
            .admin
            .purge_expired(PURGE_BATCH)
            .await
            .map_err(store_failed)?;
        out.emit(
            || "nothing to purge: Redis deletes each mark itself when its TTL runs out".into(),
            || json!({ "purged": purged, "dry_run": dry_run, "note": "redis expires marks itself" }),
        );
        return Ok(Exit::Ok);
    }
    let kinds: &[Purged] = if claims {
        &[Purged::Marks, Purged::Claims]
    } else {
        &[Purged::Marks]
    };
    let mut report = serde_json::Map::new();
    let mut lines = Vec::new();
    for &kind in kinds {
        let store = &*opened.admin;
        let waiting = match kind {
            Purged::Marks => store.count_expired().await,
            Purged::Claims => store.count_finished_claims().await,
        }
        .map_err(store_failed)?;
        let count = if dry_run {
            lines.push(format!(
                "would purge {waiting} {} (dry run: nothing removed)",
                kind.what()
            ));
            waiting
        } else {
            let purged = purge_all(store, kind, waiting).await?;
            lines.push(format!("purged {purged} {}", kind.what()));
            purged
        };
        report.insert(kind.field(dry_run).into(), count.into());
        if dry_run {
            report.insert(kind.field(false).into(), 0.into());
        }
    }
    report.insert("dry_run".into(), dry_run.into());
    out.emit(|| lines.join("\n"), || report.into());
    Ok(Exit::Ok)
}

/// Purges `kind` until a batch comes back short; `expected` sizes the bar.
async fn purge_all(store: &dyn Admin, kind: Purged, expected: u64) -> Result<u64, CliError> {
    let bar = progress_bar(expected, kind);
    let mut purged = 0;
    loop {
        let batch = match kind {
            Purged::Marks => store.purge_expired(PURGE_BATCH).await,
            Purged::Claims => store.purge_finished_claims(PURGE_BATCH).await,
        }
        .map_err(store_failed)?;
        purged += batch;
        bar.inc(batch);
        if batch < u64::from(PURGE_BATCH) {
            break;
        }
    }
    bar.finish_and_clear();
    Ok(purged)
}

/// A bar on stderr for a purge of more than one batch, drawn only when
/// stderr is a terminal (never into a script's pipe or a log file).
fn progress_bar(total: u64, kind: Purged) -> ProgressBar {
    if total <= u64::from(PURGE_BATCH) || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    let template = format!(
        "purging {{bar:40}} {{pos}}/{{len}} {} ({{eta}})",
        kind.what()
    );
    if let Ok(style) = ProgressStyle::with_template(&template) {
        bar.set_style(style);
    }
    bar
}

/// Says what a migration made, or with `dry_run` what it would make; says
/// so when the store needs nothing (Redis).
pub(crate) fn migrated(
    display: &str,
    migration: Migration,
    dry_run: bool,
    out: &mut Output,
) -> Exit {
    let Some(table) = migration.table else {
        out.emit(
            || format!("{display}: nothing to migrate: Redis needs no schema"),
            || json!({ "migrated": false, "dry_run": dry_run, "note": "redis needs no schema" }),
        );
        return Exit::Ok;
    };
    let claims = migration.claims_table;
    if dry_run {
        let missing = migration.missing;
        out.emit(
            || match missing.is_empty() {
                true => format!("{display}: nothing to create (dry run)"),
                false => format!(
                    "{display}: would create {} (dry run: nothing created)",
                    missing.join(", ")
                ),
            },
            || json!({ "migrated": false, "dry_run": true, "would_create": missing }),
        );
        return Exit::Ok;
    }
    out.emit(
        || {
            let mut text = format!("{display}: table {table} is ready");
            if let Some(claims) = &claims {
                text.push_str(&format!("\n{display}: claims table {claims} is ready"));
            }
            text
        },
        || json!({ "migrated": true, "dry_run": false, "table": table, "claims_table": claims }),
    );
    Exit::Ok
}

/// Says that the outbox table is ready, or with `dry_run` whether it is
/// missing.
pub(crate) fn outbox_migrated(
    display: &str,
    table: &str,
    missing: bool,
    dry_run: bool,
    out: &mut Output,
) {
    out.emit(
        || match (dry_run, missing) {
            (true, true) => format!("{display}: would create outbox table {table} (dry run)"),
            (true, false) => format!("{display}: outbox table {table} is there (dry run)"),
            (false, _) => format!("{display}: outbox table {table} is ready"),
        },
        || json!({ "outbox_table": table, "dry_run": dry_run, "missing": missing }),
    );
}

/// Prints the marks' count, expired count, oldest, newest and the
/// retention the store reads from them.
pub(crate) async fn stats(
    opened: &Opened,
    scope: Option<&str>,
    out: &mut Output,
) -> Result<Exit, CliError> {
    let prefix = scope.map(scope_prefix).unwrap_or_default();
    let stats = opened.admin.stats(&prefix).await.map_err(store_failed)?;
    let time = |ms: Option<i64>| match ms {
        Some(ms) => rfc3339_ms(ms),
        None if opened.self_expiring => "- (Redis keeps no write time)".into(),
        None => "-".into(),
    };
    let retention = match stats.retention {
        Retention::Forever => "forever (marks written without a TTL)".to_owned(),
        Retention::AtLeast(_) => format!(
            "{} (Redis keeps no write time: the most time a key has left)",
            stats.retention
        ),
        Retention::Unknown => "unknown (no mark to read it from)".to_owned(),
        shown => shown.to_string(),
    };
    out.emit(
        || {
            format!(
                "marks      {}\nlive       {}\nexpired    {}\noldest     {}\nnewest     {}\n\
                 retention  {retention}",
                stats.marks,
                stats.live(),
                stats.expired,
                time(stats.oldest_ms),
                time(stats.newest_ms)
            )
        },
        || {
            json!({
                "marks": stats.marks,
                "live": stats.live(),
                "expired": stats.expired,
                "oldest_ms": stats.oldest_ms,
                "newest_ms": stats.newest_ms,
                "oldest": stats.oldest_ms.map(rfc3339_ms),
                "newest": stats.newest_ms.map(rfc3339_ms),
                "retention": stats.retention.to_string(),
                "retention_ms": stats.retention.ttl().map(|ttl| ttl.as_millis() as u64),
            })
        },
    );
    Ok(Exit::Ok)
}
