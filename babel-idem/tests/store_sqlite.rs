//! The store contract against `SqliteStore`, plus what only SQLite has: a
//! file that survives the store, shared by several stores and processes at
//! once, a checked table name and a purge of expired ids.
//!
//! `sqlite` is a default feature of babel-idem, so these always run.

#[macro_use]
mod store_contract;

use std::sync::Arc;
use std::time::Duration;

use babel_idem::store::SqliteStore;
use babel_idem::store::{Admin, Claim, ClaimToken, IdState, StoreOperation};
use babel_idem::{ClaimStore, Store};
use store_contract::{Backend, SqliteBackend, assert_refused_when_built, migrate_concurrently};

store_contract_tests!(SqliteBackend::create);
admin_contract_tests!(SqliteBackend::create);
store_settings_tests!(SqliteBackend::create);

#[tokio::test]
async fn a_remembered_id_survives_reopening_the_file() {
    let backend = SqliteBackend::create("reopen").unwrap();
    let first = backend.open("reopen", None).await;
    first.remember("id-A").await.unwrap();
    drop(first);
    let reopened = backend.open("reopen", None).await;
    assert!(reopened.seen("id-A").await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stores_sharing_one_file_see_each_others_writes() {
    let backend = SqliteBackend::create("shared_file").unwrap();
    // Separate stores (separate pools) on one file stand in for separate processes.
    let mut stores: Vec<Arc<SqliteStore>> = Vec::new();
    for _ in 0..4 {
        stores.push(Arc::new(backend.open("shared", None).await));
    }
    let tasks: Vec<_> = (0..64)
        .map(|n| {
            let store = Arc::clone(&stores[n % stores.len()]);
            tokio::spawn(async move { store.remember(&format!("id-{n}")).await })
        })
        .collect();
    for task in tasks {
        task.await
            .unwrap()
            .expect("a concurrent write waits for the lock");
    }
    for n in 0..64 {
        let reader = &stores[(n + 1) % stores.len()];
        assert!(reader.seen(&format!("id-{n}")).await.unwrap(), "id-{n}");
    }
}

/// Where the child process of the next test writes: the database file and table.
const CHILD_DATABASE: &str = "BABEL_IDEM_TEST_SQLITE_CHILD_DATABASE";
const CHILD_TABLE: &str = "BABEL_IDEM_TEST_SQLITE_CHILD_TABLE";
const IDS_PER_PROCESS: usize = 200;

/// Two processes write one file at the same time (WAL and the busy timeout
/// make them wait for each other, not fail), and each sees the other's ids.
#[tokio::test]
async fn processes_sharing_one_file_see_each_others_writes() {
    let backend = SqliteBackend::create("processes").unwrap();
    let store = backend.open("processes", None).await;
    // The child is this test binary running only the writer below.
    let child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "child_process_writer",
            "--test-threads=1",
        ])
        .env(CHILD_DATABASE, backend.database())
        .env(CHILD_TABLE, backend.table("processes"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start the child process");
    for n in 0..IDS_PER_PROCESS {
        store.remember(&format!("parent-{n}")).await.unwrap();
    }
    let output = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .unwrap()
        .expect("the child process ran");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("1 passed"),
        "the child writer failed: {stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for n in 0..IDS_PER_PROCESS {
        assert!(
            store.seen(&format!("child-{n}")).await.unwrap(),
            "child-{n}"
        );
        assert!(
            store.seen(&format!("parent-{n}")).await.unwrap(),
            "parent-{n}"
        );
    }
}

/// The child half of the test above; it only runs when that test starts it.
#[tokio::test]
#[ignore = "run by processes_sharing_one_file_see_each_others_writes in a child process"]
async fn child_process_writer() {
    let database = std::env::var(CHILD_DATABASE).expect("started by the parent test");
    let table = std::env::var(CHILD_TABLE).expect("started by the parent test");
    let store = SqliteStore::builder()
        .table(table)
        .open(database)
        .await
        .unwrap();
    for n in 0..IDS_PER_PROCESS {
        store.remember(&format!("child-{n}")).await.unwrap();
    }
}

/// Marking an id done drops its claim row in the same statement: commit
/// leaves no row behind, and an id `remember`ed in seen-set mode while
/// claimed is no longer held (its holder's commit then reports the claim
/// lost, and the id stays done).
#[tokio::test]
async fn marking_an_id_done_drops_its_claim_row() {
    let backend = SqliteBackend::create("claim_rows").unwrap();
    let store = backend.open_claims("claim_rows", None).await;
    let lease = Duration::from_secs(30);
    let claim_rows = || async {
        let count: i64 =
            sqlx::query_scalar(&format!("SELECT count(*) FROM {}_claims", store.table()))
                .fetch_one(store.pool())
                .await
                .unwrap();
        count
    };

    let owner = ClaimToken::random();
    assert!(matches!(
        store.claim("committed", owner, lease).await.unwrap(),
        Claim::Won { .. }
    ));
    assert_eq!(claim_rows().await, 1);
    assert!(store.commit("committed", owner).await.unwrap());
    assert_eq!(claim_rows().await, 0, "commit dropped the claim row");
    assert_eq!(
        store
            .claim("committed", ClaimToken::random(), lease)
            .await
            .unwrap(),
        Claim::Done
    );

    let holder = ClaimToken::random();
    assert!(matches!(
        store.claim("remembered", holder, lease).await.unwrap(),
        Claim::Won { .. }
    ));
    store.remember("remembered").await.unwrap();
    assert_eq!(claim_rows().await, 0, "remember dropped the claim row");
    assert!(
        store.commit("remembered", holder).await.unwrap(),
        "the claim is gone, and the commit finds the id done"
    );
    assert_eq!(claim_rows().await, 0);
    assert!(store.seen("remembered").await.unwrap());
}

/// A claim or commit batch whose write fails part way (here a trigger
/// refuses one id) leaves every id of the batch as it was: the batch's
/// writes are one transaction.
#[tokio::test]
async fn a_batch_whose_write_fails_changes_nothing() {
    let backend = SqliteBackend::create("batch_rollback").unwrap();
    let store = backend.open_claims("batch_rollback", None).await;
    let lease = Duration::from_secs(30);
    let table = store.table().to_owned();
    for (name, on) in [("claim", format!("{table}_claims")), ("mark", table)] {
        sqlx::raw_sql(&format!(
            "CREATE TRIGGER refuse_poison_{name} BEFORE INSERT ON {on}
             WHEN NEW.message_id = 'poison'
             BEGIN SELECT RAISE(ABORT, 'poison refused'); END"
        ))
        .execute(store.pool())
        .await
        .unwrap();
    }
    let (first, poison) = (ClaimToken::random(), ClaimToken::random());

    let error = store
        .claim_many(&[("fine", first), ("poison", poison)], lease)
        .await
        .expect_err("the take of `poison` fails");
    assert!(error.to_string().contains("poison refused"), "{error}");
    assert!(
        matches!(
            store.claim("fine", first, lease).await.unwrap(),
            Claim::Won { .. }
        ),
        "the failed batch took nothing"
    );

    // The commit batch: `poison` gets a live claim row past the claims
    // trigger, and its mark then fails on the seen-set table's.
    sqlx::raw_sql(&format!(
        "DROP TRIGGER refuse_poison_claim;
         INSERT INTO {}_claims (message_id, owner, fence, lease_until)
         VALUES ('poison', '{}', 1, 9999999999999)",
        store.table(),
        poison.to_hex()
    ))
    .execute(store.pool())
    .await
    .unwrap();
    let error = store
        .commit_many(&[("fine", first), ("poison", poison)])
        .await
        .expect_err("the mark of `poison` fails");
    assert!(error.to_string().contains("poison refused"), "{error}");
    assert!(
        !store.seen("fine").await.unwrap(),
        "the failed batch marked nothing"
    );
    assert!(
        store.commit("fine", first).await.unwrap(),
        "and left the claim to its owner"
    );
}

#[tokio::test]
async fn purge_deletes_only_expired_ids() {
    let backend = SqliteBackend::create("purge").unwrap();
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
    assert!(!forever.seen("short-lived").await.unwrap());
}

#[tokio::test]
async fn a_table_name_that_is_not_an_identifier_is_refused() {
    for table in [
        "",
        "1st",
        "seen-ids",
        "t; DROP TABLE users",
        "\"t\"",
        "main.t",
        &"t".repeat(49),
    ] {
        let built = SqliteStore::builder().table(table).in_memory().await;
        assert_refused_when_built(built, table, &["sqlite store", "not a plain identifier"]);
    }
}

#[tokio::test]
async fn the_in_memory_database_keeps_its_ids_and_migrate_is_idempotent() {
    let store = SqliteStore::in_memory().await.unwrap();
    store.remember("id-A").await.unwrap();
    store.migrate().await.unwrap();
    assert!(store.seen("id-A").await.unwrap());
    assert_eq!(store.table(), "babelqueue_idempotency");
}

/// Opening a store (and `migrate`) creates the seen-set table only; claim
/// mode's table comes from `migrate_claims`, which is idempotent too, and
/// claims work once it ran.
#[tokio::test]
async fn migrate_makes_the_seen_set_only_and_migrate_claims_claim_modes_tables() {
    let backend = SqliteBackend::create("migrations").unwrap();
    let store = backend.open("migrations", None).await;
    assert!(store.table_exists().await.unwrap());
    assert!(!store.claims_table_exists().await.unwrap());
    let lease = Duration::from_secs(30);
    store
        .claim("id-A", ClaimToken::random(), lease)
        .await
        .expect_err("no claims table yet");
    store.migrate_claims().await.unwrap();
    store.migrate_claims().await.unwrap();
    assert!(store.claims_table_exists().await.unwrap());
    assert!(matches!(
        store
            .claim("id-A", ClaimToken::random(), lease)
            .await
            .unwrap(),
        Claim::Won { .. }
    ));
}

/// A fleet starting at once on one file: 80 concurrent `migrate()` calls,
/// then 80 concurrent `migrate_claims()` calls, on a table name no one made
/// yet, each from a store (and pool) of its own, all succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eighty_concurrent_migrations_of_a_fresh_table_all_succeed() {
    let backend = SqliteBackend::create("fleet").unwrap();
    // The file exists (another table's store made it); the table does not.
    backend.open("other", None).await;
    let table = backend.table("fleet");
    let stores: Vec<Arc<SqliteStore>> = (0..80)
        .map(|_| {
            let store = SqliteStore::builder()
                .table(&table)
                .busy_timeout(Duration::from_secs(30))
                .max_connections(1)
                .open_existing(backend.database())
                .unwrap();
            Arc::new(store)
        })
        .collect();
    migrate_concurrently(&stores, 80, |store| async move { store.migrate().await }).await;
    migrate_concurrently(
        &stores,
        80,
        |store| async move { store.migrate_claims().await },
    )
    .await;
    let store = &stores[0];
    assert!(store.table_exists().await.unwrap());
    assert!(store.claims_table_exists().await.unwrap());
    store.remember("id-A").await.unwrap();
    assert_eq!(store.states(&["id-A"]).await.unwrap(), [IdState::Done]);
}

#[tokio::test]
async fn an_unwritable_path_is_a_store_error() {
    let error = SqliteStore::open("/proc/babel-idem/cannot/exist.db")
        .await
        .expect_err("no such directory");
    assert_eq!(error.operation(), StoreOperation::Open);
    assert_eq!(error.backend(), "sqlite");
}

/// Where the opener children of the next test open their store.
const OPENER_DATABASE: &str = "BABEL_IDEM_TEST_SQLITE_OPENER_DATABASE";

/// Processes opening one new file at the same instant, as workers started
/// together do: switching a new file to WAL takes a lock that no busy
/// timeout waits on, and every open (with claim mode's tables) must still
/// succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_opening_one_new_file_at_once_all_open() {
    let backend = SqliteBackend::create("open_at_once").unwrap();
    for round in 0..10 {
        let path = backend.dir.join(format!("new-{round}.db"));
        let children: Vec<_> = (0..8)
            .map(|_| {
                std::process::Command::new(std::env::current_exe().unwrap())
                    .args([
                        "--ignored",
                        "--exact",
                        "child_process_opener",
                        "--test-threads=1",
                    ])
                    .env(OPENER_DATABASE, &path)
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .expect("start a child process")
            })
            .collect();
        for child in children {
            let output = tokio::task::spawn_blocking(move || child.wait_with_output())
                .await
                .unwrap()
                .expect("the child process ran");
            let stdout = String::from_utf8_lossy(&output.stdout);
            assert!(
                output.status.success() && stdout.contains("1 passed"),
                "round {round}: an opener failed: {stdout}{}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
    }
}

/// The child half of the test above; it only runs when that test starts it.
#[tokio::test]
#[ignore = "run by processes_opening_one_new_file_at_once_all_open in a child process"]
async fn child_process_opener() {
    let database = std::env::var(OPENER_DATABASE).expect("started by the parent test");
    let store = SqliteStore::open(database).await.unwrap();
    store.migrate_claims().await.unwrap();
    store.remember("id-A").await.unwrap();
}
