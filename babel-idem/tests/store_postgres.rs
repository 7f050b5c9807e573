//! The store contract against `PostgresStore` on the shared server
//! (`BABEL_IDEM_POSTGRES_URL`), plus the Go SDK's table read back directly.
#![cfg(feature = "postgres")]

#[macro_use]
mod store_contract;

use std::sync::Arc;
use std::time::Duration;

use babel_idem::store::PostgresStore;
use babel_idem::store::{Admin, Claim, ClaimToken, IdState, StoreOperation};
use babel_idem::{ClaimStore, Store};
use sqlx::Row;
use store_contract::{Backend, PostgresBackend, assert_refused_when_built, migrate_concurrently};

store_contract_tests!(PostgresBackend::create);
admin_contract_tests!(PostgresBackend::create);
store_settings_tests!(server PostgresBackend::create);

/// `migrate` creates the Go SDK's table: the columns, types, defaults and
/// the index on `expires_at`, and nothing of claim mode's; running it again
/// changes nothing.
#[tokio::test]
async fn migrate_creates_the_go_sdk_table() {
    let Some(backend) = PostgresBackend::create("migrate_creates_the_go_sdk_table") else {
        return;
    };
    let store = backend.open("schema", None).await;
    store.migrate().await.expect("migrate twice");
    assert!(store.table_exists().await.unwrap());
    assert!(
        !store.claims_table_exists().await.unwrap(),
        "the seen-set's migration made claim mode's table"
    );
    let mut raw = backend.raw().await;
    let columns = sqlx::query(
        "SELECT column_name::text, data_type::text, is_nullable::text, column_default::text
           FROM information_schema.columns WHERE table_name = $1 ORDER BY ordinal_position",
    )
    .bind(store.table())
    .fetch_all(&mut raw)
    .await
    .unwrap();
    let columns: Vec<(String, String, String, Option<String>)> = columns
        .iter()
        .map(|row| (row.get(0), row.get(1), row.get(2), row.get(3)))
        .collect();
    let expected = [
        ("message_id", "text", "NO", None),
        (
            "created_at",
            "timestamp with time zone",
            "NO",
            Some("now()"),
        ),
        ("expires_at", "timestamp with time zone", "YES", None),
    ];
    assert_eq!(columns.len(), expected.len(), "{columns:?}");
    for ((name, kind, nullable, default), (want_name, want_kind, want_null, want_default)) in
        columns.iter().zip(expected)
    {
        assert_eq!((name.as_str(), kind.as_str()), (want_name, want_kind));
        assert_eq!(nullable, want_null, "{name}");
        assert_eq!(default.as_deref(), want_default, "{name}");
    }
    let indexes: Vec<String> =
        sqlx::query_scalar("SELECT indexdef::text FROM pg_indexes WHERE tablename = $1")
            .bind(store.table())
            .fetch_all(&mut raw)
            .await
            .unwrap();
    assert!(
        indexes
            .iter()
            .any(|def| def.contains("PRIMARY KEY") || def.contains("(message_id)")),
        "{indexes:?}"
    );
    assert!(
        indexes.iter().any(|def| def.contains("(expires_at)")),
        "{indexes:?}"
    );
}

/// Claims are logged by default, like the marks; the claims table can be
/// made `UNLOGGED` (as its DDL describes) and claim mode works on it alike.
#[tokio::test]
async fn claims_are_logged_and_an_unlogged_claims_table_works_alike() {
    let Some(backend) =
        PostgresBackend::create("claims_are_logged_and_an_unlogged_claims_table_works_alike")
    else {
        return;
    };
    let store = backend.open_claims("persistence", None).await;
    let claims = format!("{}_claims", store.table());
    let mut raw = backend.raw().await;
    let persistence = "SELECT relpersistence::text FROM pg_class WHERE oid = to_regclass($1)";
    for table in [store.table(), claims.as_str()] {
        let kind: String = sqlx::query_scalar(persistence)
            .bind(table)
            .fetch_one(&mut raw)
            .await
            .unwrap();
        assert_eq!(kind, "p", "{table}");
    }

    sqlx::query(&format!("ALTER TABLE {claims} SET UNLOGGED"))
        .execute(&mut raw)
        .await
        .unwrap();
    let lease = Duration::from_secs(30);
    let (first, second) = (ClaimToken::random(), ClaimToken::random());
    let Claim::Won { fence: taken } = store.claim("order-1", first, lease).await.unwrap() else {
        panic!("a fresh id is won");
    };
    assert!(matches!(
        store.claim("order-1", second, lease).await.unwrap(),
        Claim::Held { .. }
    ));
    assert!(
        !store.commit("order-1", second).await.unwrap(),
        "not its claim"
    );
    assert!(store.commit("order-1", first).await.unwrap());
    assert_eq!(
        store.claim("order-1", second, lease).await.unwrap(),
        Claim::Done
    );
    assert!(store.seen("order-1").await.unwrap());
    let Claim::Won { fence: next } = store.claim("order-2", second, lease).await.unwrap() else {
        panic!("a fresh id is won");
    };
    assert!(next > taken, "fences keep growing");
}

/// A commit that takes more than a second to become visible (a stalled
/// server, a slow WAL flush): a claim that started before it finished cannot
/// see the done row, waits on the claim row, and then meets the commit's
/// tombstone. It must answer held, never win: the id's effect has happened.
/// `claim` and `claim_many` alike; afterwards the id is done.
#[tokio::test]
async fn a_claim_racing_a_slow_commit_never_wins() {
    let Some(backend) = PostgresBackend::create("a_claim_racing_a_slow_commit_never_wins") else {
        return;
    };
    let store = Arc::new(backend.open_claims("slow_commit", None).await);
    let lease = Duration::from_secs(30);
    for batch in [false, true] {
        let id = if batch { "order-batch" } else { "order-single" };
        let owner = ClaimToken::random();
        assert!(matches!(
            store.claim(id, owner, lease).await.unwrap(),
            Claim::Won { .. }
        ));

        // The owner's commit, in a transaction left open: visible only at
        // `COMMIT`, as a slow one would be.
        let mut connection = backend.raw().await;
        let mut committing = sqlx::Connection::begin(&mut connection).await.unwrap();
        let committed: bool = sqlx::query_scalar(store.commit_statement().unwrap())
            .bind(id)
            .bind(owner.to_hex())
            .bind(None::<i64>)
            .fetch_one(&mut *committing)
            .await
            .unwrap();
        assert!(committed, "the owner's lease is live");

        // Another worker's claim starts more than a second later ...
        tokio::time::sleep(Duration::from_millis(1200)).await;
        let racing = {
            let store = store.clone();
            tokio::spawn(async move {
                let other = ClaimToken::random();
                if batch {
                    store
                        .claim_many(&[(id, other)], lease)
                        .await
                        .unwrap()
                        .remove(0)
                } else {
                    store.claim(id, other, lease).await.unwrap()
                }
            })
        };
        // ... and waits on the claim row, which the commit holds.
        let mut watching = backend.raw().await;
        let claims = format!("{}_claims", store.table());
        let mut waited = false;
        for _ in 0..400 {
            if store_contract::postgres_locks::lock_waiters(&mut watching, &claims).await > 0 {
                waited = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        assert!(
            waited,
            "the racing claim never waited on the commit's row lock"
        );
        committing.commit().await.unwrap();

        let answer = racing.await.unwrap();
        assert!(
            matches!(answer, Claim::Held { .. }),
            "batch: {batch}: a claim racing a commit answered {answer:?}, so the \
             committed id would run again"
        );
        assert_eq!(
            store.claim(id, ClaimToken::random(), lease).await.unwrap(),
            Claim::Done,
            "batch: {batch}"
        );
    }
}

/// `purge_finished_claims` deletes lapsed claims and tombstones once they
/// are a minute old, and keeps live claims and fresh tombstones;
/// `count_finished_claims` counts what it would delete.
#[tokio::test]
async fn purge_finished_claims_deletes_only_old_claim_rows() {
    let Some(backend) =
        PostgresBackend::create("purge_finished_claims_deletes_only_old_claim_rows")
    else {
        return;
    };
    let store = backend.open_claims("purge_claims", None).await;
    let lease = Duration::from_secs(30);
    let owners: Vec<ClaimToken> = (0..4).map(|_| ClaimToken::random()).collect();
    for (n, &owner) in owners.iter().enumerate() {
        let id = format!("order-{n}");
        assert!(matches!(
            store.claim(&id, owner, lease).await.unwrap(),
            Claim::Won { .. }
        ));
    }
    // order-0 and order-1 are committed (tombstones), order-2 and order-3
    // stay claimed; order-1's tombstone and order-3's lease are made old.
    assert!(store.commit("order-0", owners[0]).await.unwrap());
    assert!(store.commit("order-1", owners[1]).await.unwrap());
    let mut raw = backend.raw().await;
    sqlx::query(&format!(
        "UPDATE {}_claims SET lease_until = now() - interval '61 seconds'
         WHERE message_id IN ('order-1', 'order-3')",
        store.table()
    ))
    .execute(&mut raw)
    .await
    .unwrap();

    assert_eq!(store.count_finished_claims().await.unwrap(), 2);
    assert_eq!(
        store.purge_finished_claims(1).await.unwrap(),
        1,
        "at most the limit"
    );
    assert_eq!(store.purge_finished_claims(10).await.unwrap(), 1);
    let left: Vec<String> = sqlx::query_scalar(&format!(
        "SELECT message_id FROM {}_claims ORDER BY message_id",
        store.table()
    ))
    .fetch_all(&mut raw)
    .await
    .unwrap();
    assert_eq!(left, ["order-0", "order-2"]);
    // The purged ids answer as before: order-1 done, order-3 claimable.
    let other = ClaimToken::random();
    assert_eq!(
        store.claim("order-1", other, lease).await.unwrap(),
        Claim::Done
    );
    assert!(matches!(
        store.claim("order-3", other, lease).await.unwrap(),
        Claim::Won { .. }
    ));
    assert_eq!(store.purge_finished_claims(10).await.unwrap(), 0);
    assert_eq!(store.count_finished_claims().await.unwrap(), 0);
}

/// Claim mode deletes its own finished rows: once 2,000 commits' tombstones
/// are past the purge age, a later commit starts a purge that leaves only
/// the claim still in flight and the fresh tombstone, and the purged ids
/// still answer done.
#[tokio::test]
async fn commits_purge_old_finished_claims_on_their_own() {
    let Some(backend) = PostgresBackend::create("commits_purge_old_finished_claims_on_their_own")
    else {
        return;
    };
    let store = PostgresStore::builder()
        .table(backend.table("auto_purge"))
        .purge_finished_claims_every(Some(Duration::from_millis(200)))
        .connect_lazy(&backend.url)
        .unwrap();
    store.migrate().await.unwrap();
    store.migrate_claims().await.unwrap();
    let lease = Duration::from_secs(30);
    let owner = ClaimToken::random();
    let ids: Vec<String> = (0..2_000).map(|n| format!("order-{n}")).collect();
    for chunk in ids.chunks(100) {
        let entries: Vec<(&str, ClaimToken)> =
            chunk.iter().map(|id| (id.as_str(), owner)).collect();
        let claims = store.claim_many(&entries, lease).await.unwrap();
        assert!(
            claims.iter().all(|c| matches!(c, Claim::Won { .. })),
            "{claims:?}"
        );
        let commits = store.commit_many(&entries).await.unwrap();
        assert!(commits.iter().all(|&c| c));
    }
    assert!(matches!(
        store.claim("in-flight", owner, lease).await.unwrap(),
        Claim::Won { .. }
    ));
    let claims = format!("{}_claims", store.table());
    let mut raw = backend.raw().await;
    let count = format!("SELECT count(*) FROM {claims}");
    let rows: i64 = sqlx::query_scalar(&count)
        .fetch_one(&mut raw)
        .await
        .unwrap();
    assert_eq!(rows, 2_001, "every commit left its tombstone");
    // Every tombstone ages past the purge age; the live claim does not.
    sqlx::query(&format!(
        "UPDATE {claims} SET lease_until = now() - interval '2 minutes' WHERE owner IS NULL"
    ))
    .execute(&mut raw)
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert!(matches!(
        store.claim("trigger", owner, lease).await.unwrap(),
        Claim::Won { .. }
    ));
    assert!(store.commit("trigger", owner).await.unwrap());

    let list = format!("SELECT message_id FROM {claims} ORDER BY message_id");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let left: Vec<String> = loop {
        let left: Vec<String> = sqlx::query_scalar(&list).fetch_all(&mut raw).await.unwrap();
        if left.len() <= 2 || tokio::time::Instant::now() > deadline {
            break left;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(left.len() <= 2, "the purge left {} rows", left.len());
    assert_eq!(left, ["in-flight", "trigger"]);
    assert_eq!(
        store
            .claim("order-7", ClaimToken::random(), lease)
            .await
            .unwrap(),
        Claim::Done
    );
}

/// The expiry is `now() + ttl` by the database clock, written in the same
/// statement as `created_at`; a second remember leaves the row as it was.
#[tokio::test]
async fn expiry_is_computed_by_the_database_clock() {
    let Some(backend) = PostgresBackend::create("expiry_is_computed_by_the_database_clock") else {
        return;
    };
    let store = backend
        .open("clock", Some(Duration::from_millis(90_061_001)))
        .await;
    store.remember("id-A").await.unwrap();
    let mut raw = backend.raw().await;
    let read = format!(
        "SELECT (expires_at - created_at)::text, created_at::text FROM {} WHERE message_id = 'id-A'",
        store.table()
    );
    let (lifetime, created): (String, String) =
        sqlx::query_as(&read).fetch_one(&mut raw).await.unwrap();
    assert_eq!(lifetime, "1 day 01:01:01.001");
    store.remember("id-A").await.unwrap();
    let (_, created_again): (String, String) =
        sqlx::query_as(&read).fetch_one(&mut raw).await.unwrap();
    assert_eq!(
        created, created_again,
        "set-if-absent: the row is untouched"
    );
}

/// A row a Go consumer inserted (no expiry) is seen; `forget` deletes it.
#[tokio::test]
async fn rows_written_by_another_sdk_are_seen() {
    let Some(backend) = PostgresBackend::create("rows_written_by_another_sdk_are_seen") else {
        return;
    };
    let store = backend.open("go_rows", None).await;
    let mut raw = backend.raw().await;
    let insert = format!(
        "INSERT INTO {} (message_id, expires_at) VALUES ('live', NULL), ('gone', now() - interval '1 second')",
        store.table()
    );
    sqlx::query(&insert).execute(&mut raw).await.unwrap();
    assert!(store.seen("live").await.unwrap());
    assert!(
        !store.seen("gone").await.unwrap(),
        "an expired row is not seen"
    );
    store.remember("gone").await.unwrap();
    assert!(store.seen("gone").await.unwrap(), "and is taken over");
    store.forget("live").await.unwrap();
    let count: i64 = sqlx::query_scalar(&format!(
        "SELECT count(*) FROM {} WHERE message_id = 'live'",
        store.table()
    ))
    .fetch_one(&mut raw)
    .await
    .unwrap();
    assert_eq!(count, 0);
}

#[tokio::test]
async fn purge_deletes_only_expired_rows() {
    let Some(backend) = PostgresBackend::create("purge_deletes_only_expired_rows") else {
        return;
    };
    let ttl = Duration::from_millis(200);
    let expiring = backend.open("purge", Some(ttl)).await;
    let forever = backend.open("purge", None).await;
    expiring.remember("short-lived").await.unwrap();
    forever.remember("kept").await.unwrap();
    tokio::time::sleep(ttl + Duration::from_millis(100)).await;
    assert_eq!(expiring.count_expired().await.unwrap(), 1);
    assert_eq!(expiring.purge_expired(100).await.unwrap(), 1);
    assert_eq!(expiring.purge_expired(100).await.unwrap(), 0);
    assert!(forever.seen("kept").await.unwrap());
}

/// An id too long for the primary-key index fails `remember` with a
/// `StoreError` that says so (never a panic); shorter ids are unaffected.
#[tokio::test]
async fn an_id_too_long_for_the_index_is_a_clear_store_error() {
    let Some(backend) =
        PostgresBackend::create("an_id_too_long_for_the_index_is_a_clear_store_error")
    else {
        return;
    };
    let store = backend.open("too_long", None).await;
    // 10 KB that does not compress: hex of random UUIDs.
    let id: String = (0..300)
        .map(|_| uuid::Uuid::new_v4().simple().to_string())
        .collect();
    assert!(!store.seen(&id).await.unwrap());
    let error = store.remember(&id).await.expect_err("over the btree limit");
    assert_eq!(error.operation(), StoreOperation::Remember);
    assert_eq!(error.backend(), "postgres");
    assert!(
        error
            .to_string()
            .contains("too long for the primary-key index"),
        "{error}"
    );
    store.remember("short").await.unwrap();
    assert!(store.seen("short").await.unwrap());
}

#[tokio::test]
async fn a_table_name_that_is_not_an_identifier_is_refused() {
    for table in [
        "",
        "1st",
        "seen-ids",
        "t; DROP TABLE users",
        "\"t\"",
        "public.t",
        &"t".repeat(64),
    ] {
        let built = PostgresStore::builder()
            .table(table)
            .connect_lazy("postgres://postgres@127.0.0.1:5432/postgres");
        assert_refused_when_built(built, table, &["postgres store", "not a plain identifier"]);
    }
}

/// The store never closes a pool it was given.
#[tokio::test]
async fn a_pool_the_caller_owns_stays_open() {
    let Some(backend) = PostgresBackend::create("a_pool_the_caller_owns_stays_open") else {
        return;
    };
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect(&backend.url)
        .await
        .unwrap();
    let store = PostgresStore::builder()
        .table(backend.table("user_pool"))
        .from_pool(pool.clone())
        .unwrap();
    store.migrate().await.unwrap();
    store.remember("id-A").await.unwrap();
    assert!(store.seen("id-A").await.unwrap());
    drop(store);
    assert!(!pool.is_closed());
    let one: i32 = sqlx::query_scalar("SELECT 1")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(one, 1);
}

#[test]
fn building_outside_a_tokio_runtime_is_an_error_not_a_panic() {
    let error = PostgresStore::connect_lazy("postgres://postgres@127.0.0.1:5432/postgres")
        .expect_err("no runtime");
    assert!(error.to_string().contains("Tokio runtime"), "{error}");
}

/// The `expires_at` index is named `<table>_expires_at_idx`, which must fit
/// PostgreSQL's 63-byte identifier: a 49- or 63-character table name (whose
/// index name the server would truncate, then skip as already there) is
/// refused when the store is built; at 48 characters migrate creates the
/// index under its full name, on the real server.
#[tokio::test]
async fn a_table_name_whose_index_name_would_be_truncated_is_refused() {
    let Some(backend) =
        PostgresBackend::create("a_table_name_whose_index_name_would_be_truncated_is_refused")
    else {
        return;
    };
    // The fixture's name for a 31-character space is 48 characters long.
    let table = backend.table(&"t".repeat(31));
    assert_eq!(table.len(), 48);
    for len in [49, 63] {
        let longer = format!("{table}{}", "t".repeat(len - table.len()));
        let built = PostgresStore::builder()
            .table(&longer)
            .connect_lazy(&backend.url);
        assert_refused_when_built(built, longer, &["at most 48 characters", "_expires_at_idx"]);
    }

    let store = PostgresStore::builder()
        .table(&table)
        .connect_lazy(&backend.url)
        .unwrap();
    store.migrate().await.unwrap();
    store.migrate().await.unwrap();
    let mut raw = backend.raw().await;
    let indexes: Vec<String> = sqlx::query_scalar(
        "SELECT indexname::text FROM pg_indexes WHERE tablename = $1 ORDER BY indexname",
    )
    .bind(&table)
    .fetch_all(&mut raw)
    .await
    .unwrap();
    assert_eq!(
        indexes,
        [format!("{table}_expires_at_idx"), format!("{table}_pkey")]
    );
}

/// A fleet starting at once: 80 concurrent `migrate()` calls, then 80
/// concurrent `migrate_claims()` calls, on a table name no one made yet, all
/// succeed (`CREATE ... IF NOT EXISTS` alone fails some of them on a
/// catalog's unique index). The calls share 20 one-connection pools, so 20
/// connections race at the server, as separate processes would, without
/// taking most of the shared server's connection slots.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eighty_concurrent_migrations_of_a_fresh_table_all_succeed() {
    let Some(backend) =
        PostgresBackend::create("eighty_concurrent_migrations_of_a_fresh_table_all_succeed")
    else {
        return;
    };
    let table = backend.table("fleet");
    let pools: Vec<Arc<PostgresStore>> = (0..20)
        .map(|_| {
            let store = PostgresStore::builder()
                .table(&table)
                .max_connections(1)
                .acquire_timeout(Duration::from_secs(30))
                .connect_lazy(&backend.url)
                .unwrap();
            Arc::new(store)
        })
        .collect();
    migrate_concurrently(&pools, 80, |store| async move { store.migrate().await }).await;
    migrate_concurrently(
        &pools,
        80,
        |store| async move { store.migrate_claims().await },
    )
    .await;
    let store = &pools[0];
    assert!(store.table_exists().await.unwrap());
    assert!(store.claims_table_exists().await.unwrap());
    store.remember("id-A").await.unwrap();
    assert_eq!(store.states(&["id-A"]).await.unwrap(), [IdState::Done]);
    for store in &pools {
        store.pool().close().await;
    }
}
