//! [`ClaimStore`] for [`SqliteStore`]: claims in a table beside the
//! seen-set table (`claims.sql`).

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::time::Duration;

use sqlx::SqliteConnection;

use super::{
    BACKEND, CACHED_BATCH, MAX_VARIABLES, NOW_MS, SqliteStore, mark_many_sql, numbered, variables,
};
use crate::store::admin::IdState;
use crate::store::claim::{
    Claim, ClaimFuture, ClaimStore, ClaimToken, RenewFuture, server_lease_ms, won_or_held,
};
use crate::store::settings::DEFAULT_TABLE;
use crate::store::{StoreError, StoreFuture, StoreOperation, failed};

/// The claims DDL, for the default table names.
const DDL: &str = include_str!("claims.sql");

/// The claim statements for one seen-set table, written out once.
#[derive(Debug, Clone)]
pub(super) struct ClaimStatements {
    pub(super) create: String,
    look: String,
    take: String,
    mark: String,
    release: String,
    renew: String,
    /// The fence counter's last value.
    last_fence: String,
    /// Counts the claim rows whose lease lapsed.
    pub(super) count_finished: String,
    /// Deletes at most `?1` claim rows whose lease lapsed.
    pub(super) purge_finished: String,
}

impl ClaimStatements {
    pub(super) fn for_table(table: &str) -> Self {
        let claims = format!("{table}_claims");
        let take_over = take_over(table);
        let keep_marked = keep_marked(table);
        ClaimStatements {
            // The DDL names the default seen-set table only inside the
            // names of the claims table, its counter and triggers.
            create: DDL.replace(DEFAULT_TABLE, table),
            // Whether the id is done, and how long a claim on it has left.
            look: format!(
                "SELECT EXISTS (SELECT 1 FROM {table} WHERE message_id = ?1
                            AND (expires_at IS NULL OR expires_at > {NOW_MS})),
                        (SELECT lease_until - {NOW_MS} FROM {claims} WHERE message_id = ?1)"
            ),
            // The decision: SQLite runs a writing statement under its write
            // lock on the newest data, so this wins only when the id is not
            // done and nobody holds a live lease. The fence is the store's
            // counter plus one; the triggers move the counter along.
            take: format!(
                "INSERT INTO {claims} (message_id, owner, fence, lease_until)
                 SELECT ?1, ?2, last + 1, {NOW_MS} + ?3 FROM {claims}_fence
                 WHERE counter = 1 AND NOT EXISTS (
                     SELECT 1 FROM {table} WHERE message_id = ?1
                         AND (expires_at IS NULL OR expires_at > {NOW_MS}))
                 ON CONFLICT (message_id) {take_over}
                 RETURNING fence"
            ),
            // Commit's decision, one statement under the write lock: while
            // the owner's lease is live, mark the id done as `remember` does
            // (an expired row is taken over, a live one keeps its expiry and
            // is written back unchanged), answering a row exactly then.
            mark: format!(
                "INSERT INTO {table} (message_id, created_at, expires_at)
                 SELECT ?1, {NOW_MS}, {NOW_MS} + ?3
                 WHERE EXISTS (SELECT 1 FROM {claims} WHERE message_id = ?1 AND owner = ?2
                                   AND lease_until > {NOW_MS})
                 ON CONFLICT (message_id) {keep_marked}
                 RETURNING 1"
            ),
            release: format!("DELETE FROM {claims} WHERE message_id = ?1 AND owner = ?2"),
            last_fence: format!("SELECT last FROM {claims}_fence WHERE counter = 1"),
            // A lapsed row holds nothing: a new claim takes it over, and the
            // fences live in the counter, not in the rows.
            count_finished: format!("SELECT COUNT(*) FROM {claims} WHERE lease_until <= {NOW_MS}"),
            purge_finished: format!(
                "DELETE FROM {claims} WHERE message_id IN (
                     SELECT message_id FROM {claims} WHERE lease_until <= {NOW_MS} LIMIT ?1)"
            ),
            renew: format!(
                "UPDATE {claims} SET lease_until = {NOW_MS} + ?3
                 WHERE message_id = ?1 AND owner = ?2 AND lease_until > {NOW_MS}"
            ),
        }
    }
}

/// How a claim row meets a new claim: taken over only once its lease has
/// lapsed, never while it is live.
fn take_over(table: &str) -> String {
    format!(
        "DO UPDATE SET owner = excluded.owner, fence = excluded.fence,
                       lease_until = excluded.lease_until
             WHERE {table}_claims.lease_until <= {NOW_MS}"
    )
}

/// How commit's mark meets an existing seen-set row: as `remember`, an
/// expired row is taken over and a live one keeps its expiry, but the row is
/// always written back, so that its trigger drops the claim row.
fn keep_marked(table: &str) -> String {
    let expired =
        format!("{table}.expires_at IS NOT NULL AND {table}.expires_at <= excluded.created_at");
    format!(
        "DO UPDATE SET created_at = iif({expired}, excluded.created_at, {table}.created_at),
                       expires_at = iif({expired}, excluded.expires_at, {table}.expires_at)"
    )
}

/// `look` over `count` ids (`?1..`, each used twice): the done ids with `1`
/// and no lease, then every claim row's id with `0` and its ms left.
fn look_many_sql(table: &str, count: usize) -> String {
    let ids = numbered(1, count);
    format!(
        "SELECT message_id, 1, NULL FROM {table} WHERE message_id IN ({ids})
             AND (expires_at IS NULL OR expires_at > {NOW_MS})
         UNION ALL
         SELECT message_id, 0, lease_until - {NOW_MS} FROM {table}_claims
             WHERE message_id IN ({ids})"
    )
}

/// # Claim mode
///
/// Claims live in `<table>_claims` (`babelqueue_idempotency_claims`), beside
/// the seen-set table, with a one-row counter for the fences;
/// [`migrate_claims`](SqliteStore::migrate_claims) creates them:
///
/// ```sql
#[doc = include_str!("claims.sql")]
/// ```
///
/// | operation | statements |
/// |---|---|
/// | `claim` | a read (done? a live lease?); only when the id looks free, one `INSERT ... ON CONFLICT DO UPDATE ... RETURNING fence` decides |
/// | `commit` | one `INSERT ... SELECT ... WHERE` the owner's lease is live decides and marks the id done; the table's triggers drop the claim row in that statement. When it marks nothing, a read answers whether the id is done (a retried commit finds its effect recorded) |
/// | `release` | `DELETE` the owner's claim row |
/// | `renew` | `UPDATE` the owner's live claim row |
///
/// Each statement runs alone under the database's single write lock, which
/// it holds only while it runs (a transaction over several statements would
/// hold it across their round trips to sqlx's worker thread, and every other
/// writer would wait). Marking an id done, by commit or by `remember`,
/// drops its claim row (the triggers above), so a first delivery writes
/// twice (claim, commit) and a duplicate of a done id costs one read.
///
/// A batch trades that for one commit per batch, its decisions made in a
/// `BEGIN IMMEDIATE` transaction, which holds the write lock for a few
/// statements: [`claim_many`](ClaimStore::claim_many) reads the whole batch
/// in one statement (a batch of duplicates ends there), then, under the
/// lock, reads the ids that looked free again and takes those still free in
/// one statement, numbering their fences after the counter;
/// [`commit_many`](ClaimStore::commit_many) reads who holds each id and
/// marks the ids whose holder committed in one statement. A batch that
/// fails changes nothing.
impl ClaimStore for SqliteStore {
    fn claim<'a>(&'a self, id: &'a str, owner: ClaimToken, lease: Duration) -> ClaimFuture<'a> {
        StoreFuture::new(async move {
            let operation = StoreOperation::Claim;
            let lease_ms = server_lease_ms(BACKEND, operation, lease)?;
            let (done, left_ms) = sqlx::query_as::<_, (bool, Option<i64>)>(&self.claims.look)
                .bind(id)
                .fetch_one(&self.pool)
                .await
                .map_err(failed(BACKEND, operation))?;
            match (done, left_ms) {
                (true, _) => return Ok(Claim::Done),
                (false, Some(ms)) if ms > 0 => return Ok(won_or_held(None, Some(ms))),
                _ => {}
            }
            let fence: Option<i64> = sqlx::query_scalar(&self.claims.take)
                .bind(id)
                .bind(owner.to_hex())
                .bind(lease_ms)
                .fetch_optional(&self.pool)
                .await
                .map_err(failed(BACKEND, operation))?;
            // No fence: lost a race since the read, to another worker that
            // claimed (or finished) the id; its next delivery sees which.
            Ok(won_or_held(fence, None))
        })
    }

    fn commit<'a>(&'a self, id: &'a str, owner: ClaimToken) -> StoreFuture<'a, bool> {
        StoreFuture::new(async move {
            let operation = StoreOperation::Commit;
            let marked = sqlx::query(&self.claims.mark)
                .bind(id)
                .bind(owner.to_hex())
                .bind(self.settings.ttl_ms)
                .fetch_optional(&self.pool)
                .await
                .map_err(failed(BACKEND, operation))?;
            // The row's triggers dropped the claim in the same statement.
            if marked.is_some() {
                return Ok(true);
            }
            // Not this owner's live claim: a done id answers true all the
            // same, so a commit retried after its first attempt took effect
            // finds its effect recorded.
            let (done, _) = sqlx::query_as::<_, (bool, Option<i64>)>(&self.claims.look)
                .bind(id)
                .fetch_one(&self.pool)
                .await
                .map_err(failed(BACKEND, operation))?;
            Ok(done)
        })
    }

    fn claim_many<'a>(
        &'a self,
        claims: &'a [(&'a str, ClaimToken)],
        lease: Duration,
    ) -> StoreFuture<'a, Vec<Claim>> {
        StoreFuture::new(async move {
            let operation = StoreOperation::Claim;
            let lease_ms = server_lease_ms(BACKEND, operation, lease)?;
            // A read first, without the write lock: a batch of duplicates
            // ends here, as a duplicate's `claim` does.
            let ids: Vec<&str> = claims.iter().map(|&(id, _)| id).collect();
            let mut connection = self
                .pool
                .acquire()
                .await
                .map_err(failed(BACKEND, operation))?;
            let looks = self.look_many(&mut connection, &ids).await?;
            drop(connection);
            let mut answers: Vec<Option<Claim>> = ids.iter().map(|id| looks.answer(id)).collect();
            let free = first_entries(&ids, &answers);
            if free.is_empty() {
                return Ok(finish(answers, &ids, lease));
            }

            // The ids that looked free, decided under the write lock: read
            // again, then take the ones still free in one statement, with
            // the fences that follow the counter.
            let mut tx = self
                .pool
                .begin_with("BEGIN IMMEDIATE")
                .await
                .map_err(failed(BACKEND, operation))?;
            let free_ids: Vec<&str> = free.iter().map(|&n| ids[n]).collect();
            let looks = self.look_many(&mut tx, &free_ids).await?;
            let last: i64 = sqlx::query_scalar(&self.claims.last_fence)
                .fetch_one(&mut *tx)
                .await
                .map_err(failed(BACKEND, operation))?;
            let mut takes = Vec::with_capacity(free.len());
            for n in free {
                answers[n] = looks.answer(ids[n]);
                if answers[n].is_none() {
                    let fence = last + 1 + takes.len() as i64;
                    takes.push((n, fence));
                }
            }
            let mut taken = HashSet::new();
            for chunk in takes.chunks((MAX_VARIABLES - 1) / 3) {
                let sql = take_many_sql(&self.settings.table, chunk.len());
                let query = chunk.iter().fold(
                    sqlx::query_scalar::<_, String>(&sql).bind(lease_ms),
                    |query, &(n, fence)| query.bind(ids[n]).bind(claims[n].1.to_hex()).bind(fence),
                );
                let rows = query
                    .persistent(chunk.len() <= CACHED_BATCH)
                    .fetch_all(&mut *tx)
                    .await
                    .map_err(failed(BACKEND, operation))?;
                taken.extend(rows);
            }
            tx.commit().await.map_err(failed(BACKEND, operation))?;
            for (n, fence) in takes {
                // Under the write lock every take lands; `held` only if a
                // row was somehow live after all.
                answers[n] = Some(if taken.contains(ids[n]) {
                    Claim::Won {
                        fence: fence.unsigned_abs(),
                    }
                } else {
                    won_or_held(None, None)
                });
            }
            Ok(finish(answers, &ids, lease))
        })
    }

    fn commit_many<'a>(
        &'a self,
        commits: &'a [(&'a str, ClaimToken)],
    ) -> StoreFuture<'a, Vec<bool>> {
        StoreFuture::new(async move {
            let operation = StoreOperation::Commit;
            if commits.is_empty() {
                return Ok(Vec::new());
            }
            // Under the write lock: who holds each id now decides every
            // entry, and the ids whose owner committed are marked in one
            // statement (its triggers drop their claim rows).
            let mut tx = self
                .pool
                .begin_with("BEGIN IMMEDIATE")
                .await
                .map_err(failed(BACKEND, operation))?;
            let ids: Vec<&str> = commits.iter().map(|&(id, _)| id).collect();
            let mut holders: HashMap<String, String> = HashMap::new();
            for chunk in ids.chunks(MAX_VARIABLES) {
                let sql = live_owners_sql(&self.settings.table, chunk.len());
                let query = chunk
                    .iter()
                    .fold(sqlx::query_as::<_, (String, String)>(&sql), |query, id| {
                        query.bind(*id)
                    });
                let rows = query
                    .persistent(chunk.len() <= CACHED_BATCH)
                    .fetch_all(&mut *tx)
                    .await
                    .map_err(failed(BACKEND, operation))?;
                holders.extend(rows);
            }
            // The ids done before the batch: their entries answer true.
            let mut done = HashSet::new();
            let not_held: Vec<&str> = commits
                .iter()
                .filter(|&&(id, owner)| holders.get(id).is_none_or(|held| *held != owner.to_hex()))
                .map(|&(id, _)| id)
                .collect();
            if !not_held.is_empty() {
                let looks = self.look_many(&mut tx, &not_held).await?;
                done.extend(not_held.into_iter().filter(|id| looks.is_done(id)));
            }
            // Once an id is marked its claim is gone and it is done: its
            // later entries answer true, as later calls would.
            let mut marking = HashSet::new();
            let answers = commits
                .iter()
                .map(|&(id, owner)| {
                    let holds = holders.get(id).is_some_and(|held| *held == owner.to_hex());
                    (holds && marking.insert(id)) || marking.contains(id) || done.contains(id)
                })
                .collect();
            let marking: Vec<&str> = marking.into_iter().collect();
            for chunk in marking.chunks(MAX_VARIABLES - 1) {
                let table = &self.settings.table;
                let sql = mark_many_sql(table, chunk.len(), &keep_marked(table));
                chunk
                    .iter()
                    .fold(sqlx::query(&sql).bind(self.settings.ttl_ms), |query, id| {
                        query.bind(*id)
                    })
                    .persistent(chunk.len() <= CACHED_BATCH)
                    .execute(&mut *tx)
                    .await
                    .map_err(failed(BACKEND, operation))?;
            }
            tx.commit().await.map_err(failed(BACKEND, operation))?;
            Ok(answers)
        })
    }

    fn release<'a>(&'a self, id: &'a str, owner: ClaimToken) -> StoreFuture<'a, bool> {
        StoreFuture::new(async move {
            let dropped = sqlx::query(&self.claims.release)
                .bind(id)
                .bind(owner.to_hex())
                .execute(&self.pool)
                .await
                .map_err(failed(BACKEND, StoreOperation::Release))?;
            Ok(dropped.rows_affected() == 1)
        })
    }

    fn renew<'a>(&'a self, id: &'a str, owner: ClaimToken, lease: Duration) -> RenewFuture<'a> {
        StoreFuture::new(async move {
            let operation = StoreOperation::Renew;
            let lease_ms = server_lease_ms(BACKEND, operation, lease)?;
            let done = sqlx::query(&self.claims.renew)
                .bind(id)
                .bind(owner.to_hex())
                .bind(lease_ms)
                .execute(&self.pool)
                .await
                .map_err(failed(BACKEND, operation))?;
            Ok(done.rows_affected() == 1)
        })
    }
}

/// What a batch's read found: the done ids, and the ms left on each id's
/// claim row (lapsed when not above zero).
#[derive(Debug, Default)]
pub(super) struct Looks {
    done: HashSet<String>,
    left_ms: HashMap<String, i64>,
}

impl Looks {
    /// The answer the read alone gives `id`; `None` when it looks free.
    fn answer(&self, id: &str) -> Option<Claim> {
        if self.done.contains(id) {
            return Some(Claim::Done);
        }
        match self.left_ms.get(id) {
            Some(&ms) if ms > 0 => Some(won_or_held(None, Some(ms))),
            _ => None,
        }
    }

    /// Whether `id` is done.
    fn is_done(&self, id: &str) -> bool {
        self.done.contains(id)
    }

    /// Where `id` stands: done, held by a live lease, or neither.
    pub(super) fn state(&self, id: &str) -> IdState {
        match self.answer(id) {
            Some(Claim::Done) => IdState::Done,
            Some(_) => IdState::Claimed,
            None => IdState::Absent,
        }
    }
}

impl SqliteStore {
    /// `look` for every id of a batch, in one statement per
    /// [`MAX_VARIABLES`] ids.
    pub(super) async fn look_many(
        &self,
        connection: &mut SqliteConnection,
        ids: &[&str],
    ) -> Result<Looks, StoreError> {
        let mut looks = Looks::default();
        for chunk in ids.chunks(MAX_VARIABLES) {
            let sql = look_many_sql(&self.settings.table, chunk.len());
            let query = chunk.iter().fold(
                sqlx::query_as::<_, (String, bool, Option<i64>)>(&sql),
                |query, id| query.bind(*id),
            );
            let rows = query
                .persistent(chunk.len() <= CACHED_BATCH)
                .fetch_all(&mut *connection)
                .await
                .map_err(failed(BACKEND, StoreOperation::Claim))?;
            for (id, done, left_ms) in rows {
                if done {
                    looks.done.insert(id);
                } else if let Some(ms) = left_ms {
                    looks.left_ms.insert(id, ms);
                }
            }
        }
        Ok(looks)
    }
}

/// The entries whose id looked free, the first entry of each such id only:
/// a batch claims an id once.
fn first_entries(ids: &[&str], answers: &[Option<Claim>]) -> Vec<usize> {
    let mut seen = HashSet::new();
    (0..ids.len())
        .filter(|&n| seen.insert(ids[n]) && answers[n].is_none())
        .collect()
}

/// Every entry's answer: a later entry of an id answers as its first one
/// did, or, when that one won, finds the id held for the new lease.
fn finish(answers: Vec<Option<Claim>>, ids: &[&str], lease: Duration) -> Vec<Claim> {
    let mut firsts: HashMap<&str, Claim> = HashMap::new();
    ids.iter()
        .zip(answers)
        .map(|(&id, answer)| match firsts.get(id) {
            Some(Claim::Won { .. }) => Claim::Held {
                retry_after: Some(lease),
            },
            Some(&first) => first,
            None => {
                let answer = answer.unwrap_or(won_or_held(None, None));
                firsts.insert(id, answer);
                answer
            }
        })
        .collect()
}

/// The take for `count` entries (`?2..`: id, owner and fence of each; the
/// lease is `?1`), run only under the write lock on ids just read free. The
/// lapsed-lease condition stays as a safeguard. Answers the ids taken.
fn take_many_sql(table: &str, count: usize) -> String {
    let rows = variables(0, count, |list, n| {
        let first = 2 + 3 * n;
        let _ = write!(list, "(?{first},?{},?{})", first + 1, first + 2);
    });
    let take_over = take_over(table);
    format!(
        "INSERT INTO {table}_claims (message_id, owner, fence, lease_until)
             SELECT column1, column2, column3, {NOW_MS} + ?1 FROM (VALUES {rows}) WHERE true
         ON CONFLICT (message_id) {take_over}
         RETURNING message_id"
    )
}

/// The live claims among `count` ids (`?1..`): each id with its owner.
fn live_owners_sql(table: &str, count: usize) -> String {
    let ids = numbered(1, count);
    format!(
        "SELECT message_id, owner FROM {table}_claims
             WHERE message_id IN ({ids}) AND lease_until > {NOW_MS}"
    )
}
