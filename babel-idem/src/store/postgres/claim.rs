//! [`ClaimStore`] for [`PostgresStore`]: one statement per operation, in a
//! claims table beside the seen-set table (`claims.sql`).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::PgPool;

use super::{BACKEND, PostgresStore, UnstorableId, is_index_limit};
use crate::store::claim::{
    Claim, ClaimFuture, ClaimStore, ClaimToken, RenewFuture, server_lease_ms, won_or_held,
};
use crate::store::settings::{DEFAULT_TABLE, run_purge};
use crate::store::{StoreError, StoreFuture, StoreOperation};

/// The claims table's DDL, for the default table names.
const DDL: &str = include_str!("claims.sql");

/// The longest identifier PostgreSQL keeps without truncating it.
const MAX_IDENTIFIER: usize = 63;

/// How old a finished claim row must be before a purge deletes it. Deleting a
/// tombstone is safe once no claim statement that began before its commit is
/// still running: a minute is far beyond any statement's stall.
const PURGE_AFTER: &str = "1 minute";

/// The rows one statement of a store's own purge deletes at most: a short
/// transaction that holds few row locks, whatever the backlog.
const PURGE_BATCH: u32 = 1_000;

/// The batches one purge of a store's own deletes at most before it waits
/// for the next one: a backlog drains over several intervals, never in one
/// long burst beside the handlers' statements.
const PURGE_BATCHES: u32 = 100;

/// When a store next deletes its finished claim rows on its own.
///
/// Invariant: at most one purge is started per interval per store (and its
/// clones); the commit that finds one due starts it and moves the next one
/// an interval away, every other commit only reads the clock.
#[derive(Debug)]
pub(super) struct PurgeSchedule {
    every: Option<Duration>,
    next: Mutex<Instant>,
}

impl PurgeSchedule {
    /// A schedule whose first purge is due at the first commit (rows left
    /// by an earlier process go then), or none.
    pub(super) fn new(every: Option<Duration>) -> Arc<Self> {
        Arc::new(PurgeSchedule {
            every,
            next: Mutex::new(Instant::now()),
        })
    }

    /// Whether a purge is due now; when it is, the next one is an interval
    /// away. A commit that finds the schedule busy leaves it to the other.
    fn take_due(&self) -> bool {
        let Some(every) = self.every else {
            return false;
        };
        let Ok(mut next) = self.next.try_lock() else {
            return false;
        };
        let now = Instant::now();
        if now < *next {
            return false;
        }
        *next = now + every;
        true
    }
}

/// Deletes finished claim rows (tombstones and lapsed leases older than
/// [`PURGE_AFTER`]) in short batches, until a batch finds fewer than it may
/// take or [`PURGE_BATCHES`] ran. A failure waits for the next interval.
async fn purge_finished(pool: PgPool, statement: String) {
    let mut purged = 0;
    for _ in 0..PURGE_BATCHES {
        match run_purge(&pool, BACKEND, &statement, PURGE_BATCH).await {
            Ok(deleted) => {
                purged += deleted;
                if deleted < u64::from(PURGE_BATCH) {
                    break;
                }
            }
            Err(error) => {
                tracing::warn!(%error, purged, "purging finished claims failed; next interval retries");
                return;
            }
        }
    }
    tracing::debug!(purged, "purged finished claims");
}

/// The claim statements for one seen-set table, or why there are none.
#[derive(Debug, Clone)]
pub(super) enum ClaimStatements {
    Ready(Box<Statements>),
    /// `<table>_claims_fence` would be longer than PostgreSQL keeps.
    NameTooLong {
        table: String,
    },
}

#[derive(Debug, Clone)]
pub(super) struct Statements {
    create: String,
    claim: String,
    commit: String,
    claim_many: String,
    commit_many: String,
    release: String,
    renew: String,
    /// The ids of `$1` (a `text[]`) that a live lease holds.
    pub(super) claimed: String,
    /// Counts the rows a purge would delete.
    pub(super) count_finished: String,
    /// Deletes at most `$1` lapsed claims and tombstones, once old enough.
    pub(super) purge_finished: String,
}

impl ClaimStatements {
    pub(super) fn for_table(table: &str) -> Self {
        let claims = format!("{table}_claims");
        if claims.len() + "_fence".len() > MAX_IDENTIFIER {
            return ClaimStatements::NameTooLong {
                table: table.to_owned(),
            };
        }
        // A claim row is taken over only when its lease has lapsed, or when
        // it is a tombstone this statement's snapshot already held (same
        // fence) with no done row beside it: the id was forgotten or its mark
        // expired. Never a live lease, and never a tombstone written after
        // the snapshot was taken: a commit that finished while this statement
        // waited on the row left a done row the snapshot cannot see. (The
        // subquery reads the snapshot; `held` is the row as it is now.)
        let take_over = format!(
            "ON CONFLICT (message_id) DO UPDATE
                 SET owner = EXCLUDED.owner, fence = EXCLUDED.fence,
                     lease_until = EXCLUDED.lease_until
                 WHERE CASE WHEN held.owner IS NULL
                     THEN held.fence = (SELECT tombstone.fence FROM {claims} AS tombstone
                                        WHERE tombstone.message_id = EXCLUDED.message_id
                                            AND tombstone.owner IS NULL)
                     ELSE held.lease_until <= now() END"
        );
        // The seen-set rows of the ids in `mine` (set-if-absent, as
        // `remember`; `$3` the TTL in ms or NULL).
        let mark_done = format!(
            "marked AS (
                 INSERT INTO {table} (message_id, expires_at)
                 SELECT message_id, now() + $3::bigint * interval '1 millisecond' FROM mine
                 ON CONFLICT (message_id) DO UPDATE
                     SET created_at = now(), expires_at = EXCLUDED.expires_at
                     WHERE {table}.expires_at IS NOT NULL AND {table}.expires_at <= now()
             )"
        );
        ClaimStatements::Ready(Box::new(Statements {
            // The DDL names the default seen-set table only inside the
            // claims table's and the sequence's names.
            create: DDL.replace(DEFAULT_TABLE, table),
            // Done, won or held in one statement. The insert sees a claim
            // row as it is now, even one written after the statement began:
            // it takes a lapsed lease over, never a live one (`take_over`
            // says which tombstones). `nextval` runs only when the id is not
            // done, and the live lease is looked up only when the claim is
            // held (a `CASE` evaluates its subquery only when its condition
            // holds): a duplicate reads no more pages than `seen` does.
            claim: format!(
                "WITH done AS (
                     SELECT 1 FROM {table} WHERE message_id = $1
                         AND (expires_at IS NULL OR expires_at > now())
                 ), won AS (
                     INSERT INTO {claims} AS held (message_id, owner, fence, lease_until)
                     SELECT $1, $2, nextval('{claims}_fence'),
                            now() + $3::bigint * interval '1 millisecond'
                     WHERE NOT EXISTS (SELECT 1 FROM done)
                     {take_over}
                     RETURNING held.fence
                 )
                 SELECT EXISTS (SELECT 1 FROM done),
                        (SELECT fence FROM won),
                        CASE WHEN NOT EXISTS (SELECT 1 FROM done) AND NOT EXISTS (SELECT 1 FROM won)
                        THEN (SELECT (extract(epoch FROM lease_until - now()) * 1000)::bigint
                                  FROM {claims} WHERE message_id = $1 AND owner IS NOT NULL)
                        END"
            ),
            // The owner's live claim becomes a tombstone and the seen-set
            // row is written (set-if-absent, as `remember`), together. An id
            // already done answers true too: a commit retried after its
            // first attempt took effect finds its effect recorded.
            commit: format!(
                "WITH mine AS (
                     UPDATE {claims} SET owner = NULL, lease_until = clock_timestamp()
                     WHERE message_id = $1 AND owner = $2 AND lease_until > now()
                     RETURNING message_id
                 ), {mark_done}
                 SELECT EXISTS (SELECT 1 FROM mine)
                     OR EXISTS (SELECT 1 FROM {table} WHERE message_id = $1
                                    AND (expires_at IS NULL OR expires_at > now()))"
            ),
            // `claim` for a batch (`$1` ids, `$2` owners, in batch order) in
            // one statement: one round trip and one commit for the batch.
            // Only an id's first entry may win (an insert cannot touch one
            // row twice); its later entries find the id held, as they would
            // one call after another. One row per entry, in batch order.
            claim_many: format!(
                "WITH batch AS (
                     SELECT id, owner, n FROM unnest($1::text[], $2::text[])
                         WITH ORDINALITY AS entry(id, owner, n)
                 ), firsts AS (
                     SELECT DISTINCT ON (id) id, owner, n FROM batch ORDER BY id, n
                 ), done AS (
                     SELECT firsts.id FROM firsts JOIN {table} ON {table}.message_id = firsts.id
                     WHERE {table}.expires_at IS NULL OR {table}.expires_at > now()
                 ), won AS (
                     INSERT INTO {claims} AS held (message_id, owner, fence, lease_until)
                     SELECT id, owner, nextval('{claims}_fence'),
                            now() + $3::bigint * interval '1 millisecond'
                     FROM firsts WHERE NOT EXISTS (SELECT 1 FROM done WHERE done.id = firsts.id)
                     ORDER BY n
                     {take_over}
                     RETURNING held.message_id, held.fence
                 )
                 SELECT done.id IS NOT NULL,
                        CASE WHEN batch.n = firsts.n THEN won.fence END,
                        CASE WHEN done.id IS NOT NULL OR batch.n = firsts.n AND won.fence IS NOT NULL
                             THEN NULL
                             WHEN won.fence IS NOT NULL THEN $3::bigint
                             ELSE (SELECT (extract(epoch FROM lease_until - now()) * 1000)::bigint
                                   FROM {claims} WHERE message_id = batch.id AND owner IS NOT NULL)
                        END
                 FROM batch
                 JOIN firsts ON firsts.id = batch.id
                 LEFT JOIN done ON done.id = batch.id
                 LEFT JOIN won ON won.message_id = batch.id
                 ORDER BY batch.n"
            ),
            // `commit` for a batch in one statement. Of the entries naming
            // the live owner of an id, the first commits; an entry after it,
            // and an entry of an id done before the batch, answers true (the
            // id is done); every other entry finds the claim lost, as it
            // would one call after another.
            commit_many: format!(
                "WITH batch AS (
                     SELECT id, owner, n FROM unnest($1::text[], $2::text[])
                         WITH ORDINALITY AS entry(id, owner, n)
                 ), firsts AS (
                     SELECT DISTINCT ON (id, owner) id, owner, n FROM batch ORDER BY id, owner, n
                 ), mine AS (
                     UPDATE {claims} SET owner = NULL, lease_until = clock_timestamp()
                     FROM firsts
                     WHERE {claims}.message_id = firsts.id AND {claims}.owner = firsts.owner
                         AND {claims}.lease_until > now()
                     RETURNING {claims}.message_id, firsts.n
                 ), {mark_done}
                 SELECT EXISTS (SELECT 1 FROM mine WHERE mine.message_id = batch.id
                                    AND mine.n <= batch.n)
                     OR EXISTS (SELECT 1 FROM {table} WHERE message_id = batch.id
                                    AND (expires_at IS NULL OR expires_at > now()))
                 FROM batch ORDER BY batch.n"
            ),
            release: format!("DELETE FROM {claims} WHERE message_id = $1 AND owner = $2"),
            renew: format!(
                "UPDATE {claims} SET lease_until = now() + $3::bigint * interval '1 millisecond'
                 WHERE message_id = $1 AND owner = $2 AND lease_until > now()"
            ),
            claimed: format!(
                "SELECT message_id FROM {claims} WHERE message_id = ANY($1::text[])
                     AND owner IS NOT NULL AND lease_until > now()"
            ),
            count_finished: format!(
                "SELECT count(*) FROM {claims} WHERE lease_until < now() - interval '{PURGE_AFTER}'"
            ),
            purge_finished: format!(
                "DELETE FROM {claims} WHERE message_id IN (
                     SELECT message_id FROM {claims}
                     WHERE lease_until < now() - interval '{PURGE_AFTER}'
                     LIMIT $1 FOR UPDATE SKIP LOCKED)"
            ),
        }))
    }

    /// The claims DDL, when there can be claims for this table.
    pub(super) fn create(&self, operation: StoreOperation) -> Result<&str, StoreError> {
        Ok(&self.ready(operation)?.create)
    }

    /// The statements, when there can be claims for this table.
    pub(super) fn ready(&self, operation: StoreOperation) -> Result<&Statements, StoreError> {
        match self {
            ClaimStatements::Ready(statements) => Ok(statements),
            ClaimStatements::NameTooLong { table } => Err(StoreError::new(
                operation,
                BACKEND,
                format!(
                    "claim mode needs the sequence `{table}_claims_fence`, longer than \
                     PostgreSQL's {MAX_IDENTIFIER}-byte identifiers: use a table name of \
                     at most 50 bytes"
                ),
            )),
        }
    }
}

impl PostgresStore {
    /// The statement `claim` runs: `$1` the id, `$2` the owner (32 hex
    /// digits), `$3` the lease in ms. It answers (done, fence if won,
    /// ms left on a live claim).
    pub fn claim_statement(&self) -> Result<&str, StoreError> {
        Ok(&self.claims.ready(StoreOperation::Claim)?.claim)
    }

    /// The statement `commit` runs: `$1` the id, `$2` the owner, `$3` the
    /// store's TTL in ms or `NULL`. It answers whether the owner committed,
    /// or the id was already done.
    pub fn commit_statement(&self) -> Result<&str, StoreError> {
        Ok(&self.claims.ready(StoreOperation::Commit)?.commit)
    }

    /// A batch's ids and owners as the two arrays its statement binds, with
    /// its longest id (named when the batch is over the index limit), once
    /// every id is one PostgreSQL can hold.
    fn batch_entries<'e>(
        &self,
        operation: StoreOperation,
        entries: &[(&'e str, ClaimToken)],
    ) -> Result<(Vec<&'e str>, Vec<String>, &'e str), StoreError> {
        let mut longest = "";
        for &(id, _) in entries {
            UnstorableId::check(id).map_err(|e| StoreError::new(operation, BACKEND, e))?;
            if id.len() > longest.len() {
                longest = id;
            }
        }
        let ids = entries.iter().map(|&(id, _)| id).collect();
        let owners = entries.iter().map(|(_, owner)| owner.to_hex()).collect();
        Ok((ids, owners, longest))
    }

    /// Starts a purge of finished claim rows beside the caller when one is
    /// due: the commit that finds it due does not wait for it. Outside a
    /// Tokio runtime (none to run it on) the purge is left to the next
    /// commit that has one.
    fn purge_if_due(&self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let Ok(statements) = self.claims.ready(StoreOperation::Maintenance) else {
            return;
        };
        if self.claims_purge.take_due() {
            runtime.spawn(purge_finished(
                self.pool.clone(),
                statements.purge_finished.clone(),
            ));
        }
    }

    /// The claim statements, once `id` is one PostgreSQL can hold.
    fn claim_statements(
        &self,
        operation: StoreOperation,
        id: &str,
    ) -> Result<&Statements, StoreError> {
        UnstorableId::check(id).map_err(|e| StoreError::new(operation, BACKEND, e))?;
        self.claims.ready(operation)
    }
}

/// What the claim statements answer: whether the id is done, the fence
/// when the claim was won, and the ms left on the live claim that holds it.
type ClaimRow = (bool, Option<i64>, Option<i64>);

fn claim_answer((done, fence, left_ms): ClaimRow) -> Claim {
    if done {
        Claim::Done
    } else {
        won_or_held(fence, left_ms)
    }
}

/// A failed statement, with an id over the index limit called out.
pub(super) fn failure(operation: StoreOperation, id: &str, error: sqlx::Error) -> StoreError {
    if is_index_limit(&error) {
        let too_long = UnstorableId::TooLong {
            bytes: id.len(),
            source: error,
        };
        return StoreError::new(operation, BACKEND, too_long);
    }
    StoreError::new(operation, BACKEND, error)
}

/// # Claim mode
///
/// Claims live in `<table>_claims` (`babelqueue_idempotency_claims`), beside
/// the seen-set table a Go consumer reads, so a claim never looks done to
/// it. [`migrate_claims`](PostgresStore::migrate_claims) creates it:
///
/// ```sql
#[doc = include_str!("claims.sql")]
/// ```
///
/// | operation | one statement |
/// |---|---|
/// | `claim` | done row? else `INSERT ... ON CONFLICT DO UPDATE` taking over only a lapsed lease or a tombstone whose done row is gone, fence from `nextval` |
/// | `commit` | while the owner's lease is live: the claim row becomes a tombstone and the done row is inserted; an id already done answers `true` (a retried commit finds its effect recorded) |
/// | `release` | `DELETE` the owner's claim row |
/// | `renew` | `UPDATE` the owner's live claim row |
/// | `claim_many`, `commit_many` | the same for a whole batch, the ids and owners bound as two arrays: one round trip and one commit per batch |
///
/// A duplicate of a done id costs one round trip, a first delivery two
/// (claim, commit), each a WAL flush where seen-set mode makes one; making
/// the claims table `UNLOGGED` (see the DDL above for what that gives up)
/// saves the claim's. Times come from the database clock.
///
/// Commit leaves a tombstone rather than deleting the row. A claim whose
/// statement began before a commit finished cannot see the done row; it
/// finds the row locked, waits, and then meets a tombstone its snapshot did
/// not hold, which it never takes over: it answers held, and the redelivery
/// finds the id done. A tombstone the snapshot did hold, with no done row,
/// is an id forgotten or expired since, and is claimed again at once.
/// Tombstones and lapsed claims are deleted once they are a minute old, by
/// the store itself: a commit that finds the last purge an interval ago
/// ([`PostgresStoreBuilder::purge_finished_claims_every`](super::PostgresStoreBuilder::purge_finished_claims_every),
/// a minute by default) starts one beside it, in batches of 1,000 rows. The
/// claims table so holds the claims in flight and about two minutes of
/// commits. [`Admin::purge_finished_claims`](crate::store::Admin::purge_finished_claims)
/// and `babel-idem purge-expired --claims` do the same on demand.
///
/// An id with NUL, or one too long for the primary-key index, fails the
/// claim with a [`StoreError`] saying so: the guard then does not run the
/// handler.
impl ClaimStore for PostgresStore {
    fn claim<'a>(&'a self, id: &'a str, owner: ClaimToken, lease: Duration) -> ClaimFuture<'a> {
        StoreFuture::new(async move {
            let operation = StoreOperation::Claim;
            let lease_ms = server_lease_ms(BACKEND, operation, lease)?;
            let statement = &self.claim_statements(operation, id)?.claim;
            let answer = sqlx::query_as::<_, ClaimRow>(statement)
                .bind(id)
                .bind(owner.to_hex())
                .bind(lease_ms)
                .fetch_one(&self.pool)
                .await
                .map_err(|e| failure(operation, id, e))?;
            Ok(claim_answer(answer))
        })
    }

    fn commit<'a>(&'a self, id: &'a str, owner: ClaimToken) -> StoreFuture<'a, bool> {
        StoreFuture::new(async move {
            let operation = StoreOperation::Commit;
            let statement = &self.claim_statements(operation, id)?.commit;
            let committed = sqlx::query_scalar::<_, bool>(statement)
                .bind(id)
                .bind(owner.to_hex())
                .bind(self.settings.ttl_ms)
                .fetch_one(&self.pool)
                .await
                .map_err(|e| failure(operation, id, e))?;
            self.purge_if_due();
            Ok(committed)
        })
    }

    fn claim_many<'a>(
        &'a self,
        claims: &'a [(&'a str, ClaimToken)],
        lease: Duration,
    ) -> StoreFuture<'a, Vec<Claim>> {
        StoreFuture::new(async move {
            let operation = StoreOperation::Claim;
            if claims.is_empty() {
                return Ok(Vec::new());
            }
            let lease_ms = server_lease_ms(BACKEND, operation, lease)?;
            let (ids, owners, longest) = self.batch_entries(operation, claims)?;
            let answers = sqlx::query_as::<_, ClaimRow>(&self.claims.ready(operation)?.claim_many)
                .bind(ids)
                .bind(owners)
                .bind(lease_ms)
                .fetch_all(&self.pool)
                .await
                .map_err(|e| failure(operation, longest, e))?;
            Ok(answers.into_iter().map(claim_answer).collect())
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
            let (ids, owners, longest) = self.batch_entries(operation, commits)?;
            let committed =
                sqlx::query_scalar::<_, bool>(&self.claims.ready(operation)?.commit_many)
                    .bind(ids)
                    .bind(owners)
                    .bind(self.settings.ttl_ms)
                    .fetch_all(&self.pool)
                    .await
                    .map_err(|e| failure(operation, longest, e))?;
            self.purge_if_due();
            Ok(committed)
        })
    }

    fn release<'a>(&'a self, id: &'a str, owner: ClaimToken) -> StoreFuture<'a, bool> {
        StoreFuture::new(async move {
            let operation = StoreOperation::Release;
            let statement = &self.claim_statements(operation, id)?.release;
            let done = sqlx::query(statement)
                .bind(id)
                .bind(owner.to_hex())
                .execute(&self.pool)
                .await
                .map_err(|e| failure(operation, id, e))?;
            Ok(done.rows_affected() == 1)
        })
    }

    fn renew<'a>(&'a self, id: &'a str, owner: ClaimToken, lease: Duration) -> RenewFuture<'a> {
        StoreFuture::new(async move {
            let operation = StoreOperation::Renew;
            let lease_ms = server_lease_ms(BACKEND, operation, lease)?;
            let statement = &self.claim_statements(operation, id)?.renew;
            let done = sqlx::query(statement)
                .bind(id)
                .bind(owner.to_hex())
                .bind(lease_ms)
                .execute(&self.pool)
                .await
                .map_err(|e| failure(operation, id, e))?;
            Ok(done.rows_affected() == 1)
        })
    }
}
