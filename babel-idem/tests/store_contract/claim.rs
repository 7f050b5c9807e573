//! The claim section of the store contract: every [`ClaimStore`] leases an
//! id to one owner at a time, numbers its claims with growing fences, and
//! never lets a claim look done to a seen-set reader.
//!
//! `tests/store_claims.rs` runs it against every store with
//! [`claim_contract_tests!`]. Leases here are real (the servers' own
//! clocks); tests wait past a lease to see it lapse and assert outcomes only.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use babel_idem::store::{Batched, Claim, ClaimToken};
use babel_idem::{ClaimStore, Store};

use super::Backend;

/// Expands to one `#[tokio::test]` per claim check, each opening its own
/// fixture with `$create(test_name) -> Option<impl Backend + SeenSetReader>`.
#[allow(unused_macros)]
macro_rules! claim_contract_tests {
    ($create:path) => {
        claim_contract_tests!(@current_thread $create:
            stale_release_commit_and_renew_change_nothing,
            an_expired_claim_is_taken_over_with_a_larger_fence,
            fences_grow_across_release_commit_and_forget,
            a_done_id_is_never_claimable_again,
            a_commit_retried_after_it_already_took_effect_answers_true,
            a_commit_stays_lost_while_another_owner_holds_the_id,
            renewal_keeps_a_claim_past_its_first_lease,
            a_claim_never_looks_done_to_a_seen_set_reader,
            bad_leases_and_unstorable_ids_fail_with_a_clear_error,
            batches_of_claims_and_commits_answer_as_single_calls,
            a_batch_takes_a_lapsed_claim_over_once,
        );

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn exactly_one_of_64_concurrent_claims_wins() {
            if let Some(backend) = $create("exactly_one_of_64_concurrent_claims_wins") {
                crate::store_contract::claim::exactly_one_of_64_concurrent_claims_wins(&backend)
                    .await;
            }
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn exactly_one_of_64_concurrent_batched_claims_wins() {
            if let Some(backend) = $create("exactly_one_of_64_concurrent_batched_claims_wins") {
                crate::store_contract::claim::exactly_one_of_64_concurrent_batched_claims_wins(
                    &backend,
                )
                .await;
            }
        }
    };
    (@current_thread $create:path: $($check:ident),+ $(,)?) => {$(
        #[tokio::test]
        async fn $check() {
            if let Some(backend) = $create(stringify!($check)) {
                crate::store_contract::claim::$check(&backend).await;
            }
        }
    )+};
}

/// How a consumer that only knows the seen-set layout (the Go SDK) reads
/// the store's server: `EXISTS <prefix><id>`, a live row in the table.
#[allow(async_fn_in_trait)]
pub trait SeenSetReader: Backend {
    /// Whether that reader takes `id` for done, read without the store.
    async fn reader_sees(&self, store: &Self::Store, id: &str) -> bool;
}

/// A lease no check outlives on a healthy machine.
const LONG: Duration = Duration::from_secs(30);
/// A lease the tests wait out; long enough to be still live when checked
/// right after it was taken, whatever pause a loaded machine puts in between.
const SHORT: Duration = Duration::from_secs(1);

async fn lapse() {
    tokio::time::sleep(SHORT * 2).await;
}

fn won(claim: Claim) -> u64 {
    match claim {
        Claim::Won { fence } => fence,
        other => panic!("expected a won claim, got {other:?}"),
    }
}

fn assert_held(claim: Claim) {
    assert!(
        matches!(claim, Claim::Held { .. }),
        "expected held, got {claim:?}"
    );
}

pub async fn exactly_one_of_64_concurrent_claims_wins<B>(backend: &B)
where
    B: Backend,
    B::Store: ClaimStore,
{
    let store = Arc::new(backend.open_claims("claim_race", None).await);
    let winner = the_one_winner_of_64_claims(&store, false).await;
    assert!(store.commit("id-A", winner).await.unwrap());
    for _ in 0..3 {
        let late = store.claim("id-A", ClaimToken::random(), LONG).await;
        assert_eq!(late.unwrap(), Claim::Done);
    }
}

/// The same race through [`Batched`]: the 64 claims meet in batches (one
/// `claim_many` each), among claims of other ids, and still exactly one
/// wins; 8 concurrent commits by the winner all answer true (the first
/// commits, the others find the id done).
pub async fn exactly_one_of_64_concurrent_batched_claims_wins<B>(backend: &B)
where
    B: Backend,
    B::Store: ClaimStore,
{
    let store = Arc::new(Batched::new(
        backend.open_claims("claim_race_batched", None).await,
    ));
    let winner = the_one_winner_of_64_claims(&store, true).await;
    let commits: Vec<_> = (0..8)
        .map(|_| {
            let store = Arc::clone(&store);
            tokio::spawn(async move { store.commit("id-A", winner).await.unwrap() })
        })
        .collect();
    for commit in commits {
        assert!(
            commit.await.expect("the task ran"),
            "the first commit marks the id done; the others find it done"
        );
    }
    assert_eq!(
        store
            .claim("id-A", ClaimToken::random(), LONG)
            .await
            .unwrap(),
        Claim::Done
    );
}

/// 64 tasks claim `id-A` at once (with `other_ids`, half of them first claim
/// an id of their own, which each wins); exactly one wins `id-A`: its owner.
async fn the_one_winner_of_64_claims<S>(store: &Arc<S>, other_ids: bool) -> ClaimToken
where
    S: ClaimStore + Send + Sync + 'static,
{
    let tasks: Vec<_> = (0..64)
        .map(|n| {
            let store = Arc::clone(store);
            tokio::spawn(async move {
                let owner = ClaimToken::random();
                if other_ids && n % 2 == 0 {
                    won(store.claim(&format!("own-{n}"), owner, LONG).await.unwrap());
                }
                (owner, store.claim("id-A", owner, LONG).await)
            })
        })
        .collect();
    let mut winners = Vec::new();
    for task in tasks {
        let (owner, claim) = task.await.expect("the task ran");
        match claim.expect("claim succeeded") {
            Claim::Won { .. } => winners.push(owner),
            Claim::Held { .. } => {}
            Claim::Done => panic!("nothing committed yet, so nothing is done"),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one of 64 claims wins");
    winners[0]
}

/// `claim_many` and `commit_many` give, entry by entry, what single calls
/// made in that order give: done ids, live claims, an id twice in one
/// batch, stale owners, an empty batch, and a batch longer than a Redis
/// batch script takes.
pub async fn batches_of_claims_and_commits_answer_as_single_calls<B>(backend: &B)
where
    B: Backend,
    B::Store: ClaimStore,
{
    let store = backend.open_claims("claim_batches", None).await;
    let [
        done_owner,
        other,
        fresh,
        held_asker,
        twice_first,
        twice_second,
    ] = std::array::from_fn(|_| ClaimToken::random());
    won(store.claim("done", done_owner, LONG).await.unwrap());
    assert!(store.commit("done", done_owner).await.unwrap());
    won(store.claim("held", other, LONG).await.unwrap());

    let claimed = store
        .claim_many(
            &[
                ("fresh", fresh),
                ("done", ClaimToken::random()),
                ("held", held_asker),
                ("twice", twice_first),
                ("twice", twice_second),
            ],
            LONG,
        )
        .await
        .unwrap();
    assert_eq!(claimed.len(), 5, "{claimed:?}");
    won(claimed[0]);
    assert_eq!(claimed[1], Claim::Done);
    assert_held(claimed[2]);
    won(claimed[3]);
    assert_held(claimed[4]);

    let committed = store
        .commit_many(&[
            ("fresh", fresh),
            ("held", held_asker),
            ("twice", twice_second),
            ("twice", twice_first),
            ("twice", twice_first),
            ("done", done_owner),
        ])
        .await
        .unwrap();
    assert_eq!(
        committed,
        [true, false, false, true, true, true],
        "only a current owner commits; a done id answers true"
    );
    assert_eq!(
        store.seen_many(&["fresh", "held", "twice"]).await.unwrap(),
        [true, false, true]
    );
    assert!(
        store.commit("held", other).await.unwrap(),
        "the holder is untouched"
    );

    assert!(store.claim_many(&[], LONG).await.unwrap().is_empty());
    assert!(store.commit_many(&[]).await.unwrap().is_empty());

    let ids: Vec<String> = (0..600).map(|n| format!("many-{n}")).collect();
    let owners: Vec<(&str, ClaimToken)> = ids
        .iter()
        .map(|id| (id.as_str(), ClaimToken::random()))
        .collect();
    let claimed = store.claim_many(&owners, LONG).await.unwrap();
    assert_eq!(claimed.len(), 600);
    let fences: Vec<u64> = claimed.into_iter().map(won).collect();
    if backend.fences_store_wide() {
        let distinct: HashSet<u64> = fences.iter().copied().collect();
        assert_eq!(
            distinct.len(),
            600,
            "every claim of a batch has a fence of its own"
        );
        let after = won(store
            .claim("after-many", ClaimToken::random(), LONG)
            .await
            .unwrap());
        assert!(
            fences.iter().all(|&fence| fence < after),
            "a claim after a batch is fenced above all of the batch's"
        );
    } else {
        // Fences order one id's claims: released and claimed again, each
        // id of the batch is fenced above its first claim.
        for (&(id, owner), &fence) in owners.iter().zip(&fences) {
            assert!(store.release(id, owner).await.unwrap(), "{id}");
            let again = won(store.claim(id, owner, LONG).await.unwrap());
            assert!(again > fence, "{id}: fence {again} after {fence}");
        }
    }
    assert!(
        store
            .commit_many(&owners)
            .await
            .unwrap()
            .into_iter()
            .all(|done| done)
    );
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    assert!(
        store
            .seen_many(&ids)
            .await
            .unwrap()
            .into_iter()
            .all(|seen| seen)
    );
}

/// A batch that finds an id's claim lapsed takes it over with its first
/// entry of the id, at a larger fence; the id's later entries find the new
/// claim live (their wait is the new lease, not the lapsed one's), and the
/// lapsed owner can no longer commit.
pub async fn a_batch_takes_a_lapsed_claim_over_once<B>(backend: &B)
where
    B: Backend,
    B::Store: ClaimStore,
{
    let store = backend.open_claims("claim_batch_takeover", None).await;
    let lapsed = ClaimToken::random();
    let old_fence = won(store.claim("id-A", lapsed, SHORT).await.unwrap());
    won(store
        .claim("id-B", ClaimToken::random(), LONG)
        .await
        .unwrap());
    lapse().await;

    let (first, second, third) = (
        ClaimToken::random(),
        ClaimToken::random(),
        ClaimToken::random(),
    );
    let claimed = store
        .claim_many(&[("id-A", first), ("id-B", second), ("id-A", third)], LONG)
        .await
        .unwrap();
    assert!(won(claimed[0]) > old_fence, "{claimed:?}");
    assert_held(claimed[1]);
    match claimed[2] {
        Claim::Held {
            retry_after: Some(wait),
        } => assert!(
            wait > SHORT && wait <= LONG,
            "the wait is the new claim's lease, got {wait:?}"
        ),
        other => panic!("expected held behind the new claim, got {other:?}"),
    }
    assert_eq!(
        store
            .commit_many(&[("id-A", lapsed), ("id-A", third), ("id-A", first)])
            .await
            .unwrap(),
        [false, false, true]
    );
    assert_eq!(
        store.seen_many(&["id-A", "id-B"]).await.unwrap(),
        [true, false]
    );
}

pub async fn stale_release_commit_and_renew_change_nothing<B>(backend: &B)
where
    B: Backend,
    B::Store: ClaimStore,
{
    let store = backend.open_claims("claim_stale", None).await;
    let (first, stranger) = (ClaimToken::random(), ClaimToken::random());
    won(store.claim("id-A", first, LONG).await.unwrap());

    assert!(!store.release("id-A", stranger).await.unwrap());
    assert!(!store.renew("id-A", stranger, LONG).await.unwrap());
    assert!(!store.commit("id-A", stranger).await.unwrap());
    assert!(
        !store.seen("id-A").await.unwrap(),
        "a stranger's commit marks nothing"
    );
    assert_held(store.claim("id-A", stranger, LONG).await.unwrap());

    // The first owner's lease lapses and a second owner takes the id over:
    // every late call of the first owner is now stale.
    let first = ClaimToken::random();
    won(store.claim("id-B", first, SHORT).await.unwrap());
    lapse().await;
    let second = ClaimToken::random();
    won(store.claim("id-B", second, LONG).await.unwrap());
    assert!(!store.renew("id-B", first, LONG).await.unwrap());
    assert!(!store.release("id-B", first).await.unwrap());
    assert!(!store.commit("id-B", first).await.unwrap());
    assert!(
        !store.seen("id-B").await.unwrap(),
        "a stale commit marks nothing"
    );
    assert_held(store.claim("id-B", first, LONG).await.unwrap());
    assert!(store.commit("id-B", second).await.unwrap());
    assert!(store.seen("id-B").await.unwrap());
    assert!(
        !store.release("id-B", second).await.unwrap(),
        "nothing left to release"
    );
    assert_eq!(store.claim("id-B", first, LONG).await.unwrap(), Claim::Done);
}

pub async fn an_expired_claim_is_taken_over_with_a_larger_fence<B>(backend: &B)
where
    B: Backend,
    B::Store: ClaimStore,
{
    let store = backend.open_claims("claim_expiry", None).await;
    let first = won(store
        .claim("id-A", ClaimToken::random(), SHORT)
        .await
        .unwrap());
    assert_held(
        store
            .claim("id-A", ClaimToken::random(), LONG)
            .await
            .unwrap(),
    );
    lapse().await;
    let owner = ClaimToken::random();
    let second = won(store.claim("id-A", owner, LONG).await.unwrap());
    assert!(second > first, "fence {second} after {first}");
    assert!(store.commit("id-A", owner).await.unwrap());
}

pub async fn fences_grow_across_release_commit_and_forget<B>(backend: &B)
where
    B: Backend,
    B::Store: ClaimStore,
{
    let store = backend.open_claims("claim_fences", None).await;
    let mut fences = Vec::new();
    for round in 0..3 {
        let owner = ClaimToken::random();
        fences.push(won(store.claim("id-A", owner, LONG).await.unwrap()));
        if round < 2 {
            assert!(store.release("id-A", owner).await.unwrap());
        } else {
            assert!(store.commit("id-A", owner).await.unwrap());
        }
    }
    // A manual replay: the done marker is gone, so the id is claimed again
    // at once (PostgreSQL's tombstone does not hold it).
    store.forget("id-A").await.unwrap();
    let owner = ClaimToken::random();
    let replay = store.claim("id-A", owner, LONG).await.unwrap();
    fences.push(won(replay));
    assert!(
        fences.windows(2).all(|pair| pair[0] < pair[1]),
        "fences must strictly grow: {fences:?}"
    );
    assert!(store.commit("id-A", owner).await.unwrap());
}

pub async fn a_done_id_is_never_claimable_again<B>(backend: &B)
where
    B: Backend,
    B::Store: ClaimStore,
{
    let store = backend.open_claims("claim_done", None).await;
    // Done through the seen-set (a seen-set consumer's remember) ...
    store.remember("id-A").await.unwrap();
    // ... and through a committed claim.
    let owner = ClaimToken::random();
    won(store.claim("id-B", owner, SHORT).await.unwrap());
    assert!(store.commit("id-B", owner).await.unwrap());
    assert!(
        store.commit("id-B", owner).await.unwrap(),
        "a repeated commit finds the id done"
    );
    lapse().await;
    for id in ["id-A", "id-B"] {
        for _ in 0..3 {
            let owner = ClaimToken::random();
            assert_eq!(
                store.claim(id, owner, LONG).await.unwrap(),
                Claim::Done,
                "{id}"
            );
            assert!(!store.release(id, owner).await.unwrap(), "{id}");
        }
        assert!(store.seen(id).await.unwrap(), "{id}");
    }
}

/// A commit whose reply was lost (a timeout, a failover, a `WAIT` that
/// failed) is sent again: finding the id done, it answers true, alone and
/// in a batch, so the guard acks instead of reporting a lost claim.
pub async fn a_commit_retried_after_it_already_took_effect_answers_true<B>(backend: &B)
where
    B: Backend,
    B::Store: ClaimStore,
{
    let store = backend.open_claims("claim_commit_retry", None).await;
    let owner = ClaimToken::random();
    won(store.claim("id-A", owner, LONG).await.unwrap());
    assert!(store.commit("id-A", owner).await.unwrap());
    for _ in 0..2 {
        assert!(
            store.commit("id-A", owner).await.unwrap(),
            "a retried commit finds its effect recorded"
        );
    }
    assert_eq!(
        store
            .commit_many(&[("id-A", owner), ("id-A", owner)])
            .await
            .unwrap(),
        [true, true]
    );
    assert!(store.seen("id-A").await.unwrap());
    assert_eq!(
        store
            .claim("id-A", ClaimToken::random(), LONG)
            .await
            .unwrap(),
        Claim::Done,
        "the retries claimed nothing"
    );
}

/// An owner whose lease lapsed and whose id another owner now holds cannot
/// commit while the id is not done (alone or in a batch); once the holder
/// commits, every commit of the id answers true.
pub async fn a_commit_stays_lost_while_another_owner_holds_the_id<B>(backend: &B)
where
    B: Backend,
    B::Store: ClaimStore,
{
    let store = backend.open_claims("claim_commit_lost", None).await;
    let (first, second) = (ClaimToken::random(), ClaimToken::random());
    won(store.claim("id-B", first, SHORT).await.unwrap());
    lapse().await;
    won(store.claim("id-B", second, LONG).await.unwrap());
    assert!(!store.commit("id-B", first).await.unwrap());
    assert_eq!(
        store.commit_many(&[("id-B", first)]).await.unwrap(),
        [false]
    );
    assert!(!store.seen("id-B").await.unwrap());
    assert!(store.commit("id-B", second).await.unwrap());
    assert!(
        store.commit("id-B", first).await.unwrap(),
        "once done, every commit of the id answers true"
    );
}

pub async fn renewal_keeps_a_claim_past_its_first_lease<B>(backend: &B)
where
    B: Backend,
    B::Store: ClaimStore,
{
    let store = backend.open_claims("claim_renew", None).await;
    let lease = Duration::from_millis(1500);
    let owner = ClaimToken::random();
    won(store.claim("id-A", owner, lease).await.unwrap());
    // Renew every third of the lease, for three leases.
    for _ in 0..9 {
        tokio::time::sleep(lease / 3).await;
        assert!(store.renew("id-A", owner, lease).await.unwrap());
        assert_held(
            store
                .claim("id-A", ClaimToken::random(), LONG)
                .await
                .unwrap(),
        );
    }
    assert!(store.commit("id-A", owner).await.unwrap());
    assert_eq!(
        store
            .claim("id-A", ClaimToken::random(), LONG)
            .await
            .unwrap(),
        Claim::Done
    );
}

pub async fn a_claim_never_looks_done_to_a_seen_set_reader<B>(backend: &B)
where
    B: SeenSetReader,
    B::Store: ClaimStore,
{
    let store = backend.open_claims("claim_reader", None).await;
    let owner = ClaimToken::random();
    won(store.claim("id-A", owner, LONG).await.unwrap());
    assert!(!store.seen("id-A").await.unwrap());
    assert!(
        !backend.reader_sees(&store, "id-A").await,
        "a claimed, uncommitted id looks done to a seen-set reader"
    );
    assert!(store.renew("id-A", owner, LONG).await.unwrap());
    assert!(!backend.reader_sees(&store, "id-A").await);
    assert!(store.commit("id-A", owner).await.unwrap());
    assert!(
        backend.reader_sees(&store, "id-A").await,
        "commit writes the seen-set's own done marker"
    );

    // A released claim leaves nothing behind for the reader either.
    let owner = ClaimToken::random();
    won(store.claim("id-B", owner, LONG).await.unwrap());
    assert!(store.release("id-B", owner).await.unwrap());
    assert!(!backend.reader_sees(&store, "id-B").await);
}

pub async fn bad_leases_and_unstorable_ids_fail_with_a_clear_error<B>(backend: &B)
where
    B: Backend,
    B::Store: ClaimStore,
{
    let store = backend.open_claims("claim_bad_input", None).await;
    for lease in [Duration::ZERO, Duration::from_micros(10), Duration::MAX] {
        let error = store
            .claim("id-A", ClaimToken::random(), lease)
            .await
            .expect_err("a lease the server cannot hold is refused");
        assert!(error.to_string().contains("lease"), "{error}");
    }
    let owner = ClaimToken::random();
    won(store.claim("id-A", owner, LONG).await.unwrap());
    assert!(store.renew("id-A", owner, Duration::ZERO).await.is_err());
    assert!(store.release("id-A", owner).await.unwrap());

    // Unusual ids are claimed verbatim and kept apart.
    let ids: HashSet<String> = [
        super::long_id(),
        "заказ-注文-🦀".to_owned(),
        r#"it's "quoted" \ '; DROP TABLE users; --"#.to_owned(),
        "glob*[?]{}%_".to_owned(),
    ]
    .into_iter()
    .collect();
    for id in &ids {
        let owner = ClaimToken::random();
        won(store.claim(id, owner, LONG).await.unwrap());
        assert!(store.commit(id, owner).await.unwrap());
        assert!(store.seen(id).await.unwrap(), "{id:.40}");
        let near_miss = format!("{id}x");
        assert!(!store.seen(&near_miss).await.unwrap(), "{id:.40}");
    }

    if backend.stores_nul() {
        let owner = ClaimToken::random();
        won(store.claim("nul\0a", owner, LONG).await.unwrap());
        assert!(store.commit("nul\0a", owner).await.unwrap());
        assert!(!store.seen("nul").await.unwrap());
    } else {
        let error = store
            .claim("nul\0a", ClaimToken::random(), LONG)
            .await
            .expect_err("an id with NUL cannot be held");
        assert!(error.to_string().contains("NUL"), "{error}");
        // In a batch, the NUL id fails the whole batch before anything is
        // claimed or committed, so every entry can ask again on its own.
        let owner = ClaimToken::random();
        let error = store
            .claim_many(&[("before-nul", owner), ("nul\0b", owner)], LONG)
            .await
            .expect_err("a batch holding an id with NUL cannot be claimed");
        assert!(error.to_string().contains("NUL"), "{error}");
        won(store.claim("before-nul", owner, LONG).await.unwrap());
        let error = store
            .commit_many(&[("before-nul", owner), ("nul\0b", owner)])
            .await
            .expect_err("a batch holding an id with NUL cannot be committed");
        assert!(error.to_string().contains("NUL"), "{error}");
        assert!(!store.seen("before-nul").await.unwrap());
    }
}

impl SeenSetReader for super::SqliteBackend {
    async fn reader_sees(&self, store: &babel_idem::store::SqliteStore, id: &str) -> bool {
        let live = format!(
            "SELECT EXISTS (SELECT 1 FROM {} WHERE message_id = ?1 AND (expires_at IS NULL \
             OR expires_at > CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)))",
            store.table()
        );
        sqlx::query_scalar(&live)
            .bind(id)
            .fetch_one(store.pool())
            .await
            .expect("read the seen-set table")
    }
}

#[cfg(feature = "redis-cluster")]
impl SeenSetReader for super::RedisClusterBackend {
    /// The Go SDK's `Seen`: `EXISTS <prefix><id>`, on the id's master.
    async fn reader_sees(&self, store: &babel_idem::store::RedisStore, id: &str) -> bool {
        let mut raw = self.raw().await;
        redis::cmd("EXISTS")
            .arg(store.key(id))
            .query_async::<i64>(&mut raw)
            .await
            .expect("EXISTS")
            > 0
    }
}

#[cfg(feature = "redis")]
impl SeenSetReader for super::RedisBackend {
    /// The Go SDK's `Seen`: `EXISTS <prefix><id>`.
    async fn reader_sees(&self, store: &babel_idem::store::RedisStore, id: &str) -> bool {
        let mut raw = self.raw().await;
        redis::cmd("EXISTS")
            .arg(store.key(id))
            .query_async::<i64>(&mut raw)
            .await
            .expect("EXISTS")
            > 0
    }
}

#[cfg(feature = "postgres")]
impl SeenSetReader for super::PostgresBackend {
    /// The Go SDK's `Seen`: a live row in the table.
    async fn reader_sees(&self, store: &babel_idem::store::PostgresStore, id: &str) -> bool {
        let live = format!(
            "SELECT EXISTS (SELECT 1 FROM {} WHERE message_id = $1 \
             AND (expires_at IS NULL OR expires_at > now()))",
            store.table()
        );
        let mut raw = self.raw().await;
        sqlx::query_scalar(&live)
            .bind(id)
            .fetch_one(&mut raw)
            .await
            .expect("read the seen-set table")
    }
}

impl SeenSetReader for super::MemoryBackend {
    /// In-memory claims are not shared with any other reader: the store's
    /// own `seen` is the only seen-set reader there is.
    async fn reader_sees(&self, store: &babel_idem::InMemoryStore, id: &str) -> bool {
        store.seen(id).await.expect("an in-memory seen")
    }
}
