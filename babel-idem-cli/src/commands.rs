//! One function per command: read the ids, call the store, print the outcome.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::json;

use crate::args::IdArgs;
use crate::backend::Backend;
use crate::exit::{CliError, Exit, store_failed};
use crate::ids::{Ids, key, scope_prefix};
use crate::output::{Output, rfc3339_ms};

/// Ids read (from stdin, too) and sent to the store at a time.
pub(crate) const CHUNK: usize = 1_000;

/// Expired marks deleted per statement by `purge-expired`.
pub(crate) const PURGE_BATCH: u32 = 10_000;

/// Prints `seen` or `unseen` for each id; [`Exit::NotSeen`] if any is unseen.
pub(crate) async fn seen(
    backend: &Backend,
    args: IdArgs,
    out: &mut Output,
) -> Result<Exit, CliError> {
    let scope = args.scope.as_deref();
    let mut ids = Ids::new(args.ids);
    let mut all_seen = true;
    loop {
        let chunk = ids.next_chunk(CHUNK)?;
        if chunk.is_empty() {
            break;
        }
        for id in &chunk {
            let seen = backend
                .store()
                .seen(&key(scope, id))
                .await
                .map_err(store_failed)?;
            all_seen &= seen;
            let state = if seen { "seen" } else { "unseen" };
            out.emit(
                || format!("{state}\t{id}"),
                || json!({ "id": id, "seen": seen }),
            );
        }
    }
    Ok(if all_seen { Exit::Ok } else { Exit::NotSeen })
}

/// Forgets the ids, [`CHUNK`] at a time; with `dry_run`, lists the ids
/// that are stored instead and removes nothing.
pub(crate) async fn forget(
    backend: &Backend,
    args: IdArgs,
    dry_run: bool,
    out: &mut Output,
) -> Result<Exit, CliError> {
    let scope = args.scope.as_deref();
    let mut ids = Ids::new(args.ids);
    let (mut given, mut removed) = (0u64, 0u64);
    loop {
        let chunk = ids.next_chunk(CHUNK)?;
        if chunk.is_empty() {
            break;
        }
        given += chunk.len() as u64;
        let keys: Vec<String> = chunk.iter().map(|id| key(scope, id)).collect();
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        if !dry_run {
            removed += backend.forget_many(&keys).await?;
            continue;
        }
        let stored = backend.stored_many(&keys).await?;
        for id in chunk.iter().zip(stored).filter(|(_, stored)| *stored) {
            removed += 1;
            out.emit(
                || format!("would forget\t{}", id.0),
                || json!({ "id": id.0, "would_forget": true }),
            );
        }
    }
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

/// Deletes the expired marks in batches of [`PURGE_BATCH`], with a
/// progress bar on a terminal; with `dry_run`, counts them.
pub(crate) async fn purge_expired(
    backend: &Backend,
    dry_run: bool,
    out: &mut Output,
) -> Result<Exit, CliError> {
    if backend.is_redis() {
        // The library's purge is a no-op on Redis; say why rather than "0".
        let purged = backend.purge_expired_batch(PURGE_BATCH).await?;
        out.emit(
            || "nothing to purge: Redis deletes each mark itself when its TTL runs out".into(),
            || json!({ "purged": purged, "dry_run": dry_run, "note": "redis expires marks itself" }),
        );
        return Ok(Exit::Ok);
    }
    let expired = backend.count_expired().await?;
    if dry_run {
        out.emit(
            || format!("would purge {expired} expired marks (dry run: nothing removed)"),
            || json!({ "would_purge": expired, "purged": 0, "dry_run": true }),
        );
        return Ok(Exit::Ok);
    }
    let bar = progress_bar(expired);
    let mut purged = 0;
    loop {
        let batch = backend.purge_expired_batch(PURGE_BATCH).await?;
        purged += batch;
        bar.inc(batch);
        if batch < u64::from(PURGE_BATCH) {
            break;
        }
    }
    bar.finish_and_clear();
    out.emit(
        || format!("purged {purged} expired marks"),
        || json!({ "purged": purged, "dry_run": false }),
    );
    Ok(Exit::Ok)
}

/// A bar on stderr for a purge of more than one batch, drawn only when
/// stderr is a terminal (never into a script's pipe or a log file).
fn progress_bar(total: u64) -> ProgressBar {
    if total <= u64::from(PURGE_BATCH) || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    if let Ok(style) =
        ProgressStyle::with_template("purging {bar:40} {pos}/{len} expired marks ({eta})")
    {
        bar.set_style(style);
    }
    bar
}

/// Creates what the store needs; says so when it needs nothing (Redis).
pub(crate) fn migrated(display: &str, table: Option<String>, out: &mut Output) -> Exit {
    match table {
        Some(table) => out.emit(
            || format!("{display}: table {table} is ready"),
            || json!({ "migrated": true, "table": table }),
        ),
        None => out.emit(
            || format!("{display}: nothing to migrate: Redis needs no schema"),
            || json!({ "migrated": false, "note": "redis needs no schema" }),
        ),
    }
    Exit::Ok
}

/// Prints the marks' count, expired count, oldest and newest.
pub(crate) async fn stats(
    backend: &Backend,
    scope: Option<&str>,
    out: &mut Output,
) -> Result<Exit, CliError> {
    let prefix = scope.map(scope_prefix).unwrap_or_default();
    let stats = backend.stats(&prefix).await?;
    let time = |ms: Option<i64>| match ms {
        Some(ms) => rfc3339_ms(ms),
        None if backend.is_redis() => "- (Redis keeps no write time)".into(),
        None => "-".into(),
    };
    out.emit(
        || {
            format!(
                "marks    {}\nlive     {}\nexpired  {}\noldest   {}\nnewest   {}",
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
            })
        },
    );
    Ok(Exit::Ok)
}
