//! The admin section of the store contract: what an operator's tool sees
//! through [`Admin`], whatever the backend. Each store keeps what
//! consumers wrote; these checks write it as consumers do (`remember`,
//! `claim`, `commit`) and read it back through `Admin` only.
//!
//! `tests/store_<backend>.rs` (and the PHP layout in `tests/store_claims.rs`)
//! run it with [`admin_contract_tests!`].

use std::time::Duration;

use babel_idem::store::{Admin, Claim, ClaimToken, IdState};
use babel_idem::{ClaimStore, Store};

use super::Backend;

/// Expands to one `#[tokio::test]` per admin check, each opening its own
/// fixture with `$create(test_name) -> Option<impl Backend>` whose store
/// implements `Admin` and `ClaimStore`.
#[allow(unused_macros)]
macro_rules! admin_contract_tests {
    ($create:path) => {
        admin_contract_tests!(@each $create:
            states_tell_done_claimed_and_absent,
            forget_ids_removes_marks_and_leaves_live_claims,
            stats_count_marks_under_a_key_prefix,
            purges_delete_what_the_counts_said,
        );
    };
    (@each $create:path: $($check:ident),+ $(,)?) => {$(
        #[tokio::test]
        async fn $check() {
            if let Some(backend) = $create(stringify!($check)) {
                crate::store_contract::admin::$check(&backend).await;
            }
        }
    )+};
}

/// A lease that outlives every test.
const LONG: Duration = Duration::from_secs(300);

/// Claims `id` for a new owner; the claim must be won.
async fn claim_won<S: ClaimStore>(store: &S, id: &str, lease: Duration) -> ClaimToken {
    let owner = ClaimToken::random();
    let claim = store.claim(id, owner, lease).await.expect("claim");
    assert!(matches!(claim, Claim::Won { .. }), "{id}: {claim:?}");
    owner
}

/// A remembered id is done; an id a live claim holds is claimed (its
/// handler still runs: never done) until its commit makes it done or its
/// release makes it absent; an unknown id is absent. Answers come in the
/// ids' order, a repeated id answered each time.
pub async fn states_tell_done_claimed_and_absent<B>(backend: &B)
where
    B: Backend,
    B::Store: Admin + ClaimStore,
{
    let store = backend.open_claims("admin_states", None).await;
    assert!(store.states(&[]).await.unwrap().is_empty());
    store.remember("done-1").await.unwrap();
    let running = claim_won(&store, "running-1", LONG).await;
    let released = claim_won(&store, "released-1", LONG).await;
    assert_eq!(
        store
            .states(&["done-1", "running-1", "never-1", "running-1"])
            .await
            .unwrap(),
        [
            IdState::Done,
            IdState::Claimed,
            IdState::Absent,
            IdState::Claimed
        ]
    );
    assert!(store.commit("running-1", running).await.unwrap());
    assert!(store.release("released-1", released).await.unwrap());
    assert_eq!(
        store.states(&["running-1", "released-1"]).await.unwrap(),
        [IdState::Done, IdState::Absent]
    );
}

/// `forget_ids` removes the marks of many ids at once and counts them,
/// unknown ids included without error; an id a live claim holds keeps its
/// claim (its holder may still commit).
pub async fn forget_ids_removes_marks_and_leaves_live_claims<B>(backend: &B)
where
    B: Backend,
    B::Store: Admin + ClaimStore,
{
    let store = backend.open_claims("admin_forget", None).await;
    store
        .remember_many(&["id-A", "id-B", "id-C"])
        .await
        .unwrap();
    let owner = claim_won(&store, "running-1", LONG).await;
    assert_eq!(store.forget_ids(&[]).await.unwrap(), 0);
    assert_eq!(
        store
            .forget_ids(&["id-A", "id-B", "unknown", "running-1"])
            .await
            .unwrap(),
        2
    );
    assert_eq!(
        store
            .states(&["id-A", "id-B", "id-C", "running-1"])
            .await
            .unwrap(),
        [
            IdState::Absent,
            IdState::Absent,
            IdState::Done,
            IdState::Claimed
        ]
    );
    assert!(
        !store.seen("id-A").await.unwrap(),
        "a forgotten id runs again"
    );
    assert!(
        store.commit("running-1", owner).await.unwrap(),
        "the holder still commits"
    );
}

/// `stats` counts the marks whose key starts with a prefix (a guard
/// scope's keys), none expired; write times, where the store keeps them,
/// are in order.
pub async fn stats_count_marks_under_a_key_prefix<B>(backend: &B)
where
    B: Backend,
    B::Store: Admin + ClaimStore,
{
    let store = backend.open_claims("admin_stats", None).await;
    let empty = store.stats("").await.unwrap();
    assert_eq!((empty.marks, empty.expired, empty.oldest_ms), (0, 0, None));
    store
        .remember_many(&["id-A", "7:billing:id-B", "7:billing:id-C"])
        .await
        .unwrap();
    let all = store.stats("").await.unwrap();
    assert_eq!((all.marks, all.expired, all.live()), (3, 0, 3));
    assert!(all.oldest_ms <= all.newest_ms, "{all:?}");
    assert_eq!(store.stats("7:billing:").await.unwrap().marks, 2);
    assert_eq!(store.stats("8:shipping:").await.unwrap().marks, 0);
}

/// The counts say what the purges then delete, batch by batch, and a purge
/// touches nothing live: a live mark stays done, a live claim stays
/// claimed. A store that keeps expired marks until a purge counts the one
/// expired here; one whose server expires them itself has none to count.
/// A lease that lapsed leaves nothing that looks claimed.
pub async fn purges_delete_what_the_counts_said<B>(backend: &B)
where
    B: Backend,
    B::Store: Admin + ClaimStore,
{
    let ttl = Duration::from_millis(200);
    let expiring = backend.open_claims("admin_purge", Some(ttl)).await;
    let forever = backend.open_claims("admin_purge", None).await;
    expiring.remember_many(&["gone-1", "gone-2"]).await.unwrap();
    forever.remember("kept").await.unwrap();
    claim_won(&forever, "running-1", LONG).await;
    claim_won(&forever, "lapsed-1", Duration::from_millis(100)).await;
    tokio::time::sleep(ttl + Duration::from_millis(150)).await;

    let expired = forever.count_expired().await.unwrap();
    assert_eq!(expired, if backend.self_expiring() { 0 } else { 2 });
    assert_eq!(forever.purge_expired(1).await.unwrap(), expired.min(1));
    assert_eq!(
        forever.purge_expired(10).await.unwrap(),
        expired.saturating_sub(1)
    );
    assert_eq!(forever.count_expired().await.unwrap(), 0);

    let finished = forever.count_finished_claims().await.unwrap();
    assert_eq!(forever.purge_finished_claims(10).await.unwrap(), finished);
    assert_eq!(forever.count_finished_claims().await.unwrap(), 0);
    assert_eq!(
        forever
            .states(&["kept", "running-1", "lapsed-1", "gone-1"])
            .await
            .unwrap(),
        [
            IdState::Done,
            IdState::Claimed,
            IdState::Absent,
            IdState::Absent
        ]
    );
}
