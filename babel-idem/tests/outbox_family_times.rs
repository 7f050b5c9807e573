//! `published_at` (and `created_at`) in the family's format when the relay
//! drains a SQLite outbox table made by the family's DDL: UTC text in whole
//! seconds, `YYYY-MM-DD HH:MM:SS`, as the family's SDKs write it; babel-idem's
//! own table keeps its milliseconds. The relay publishes to the real Redis
//! (`BABEL_IDEM_REDIS_URL`; unset, the test prints `skipped:`, or fails with
//! `BABEL_IDEM_REQUIRE_SERVERS=1`).
#![cfg(all(feature = "outbox", feature = "sqlite", feature = "redis-transport"))]

#[path = "store_contract/servers.rs"]
#[allow(dead_code, unreachable_pub)]
mod servers;

use std::path::PathBuf;

use babel_idem::Envelope;
use babel_idem::outbox::{Relay, SqliteOutbox};
use babel_idem::transport::RedisTransport;
use redis::AsyncCommands;
use serde_json::json;
use servers::{REDIS_URL, server_url, unique_suffix};
use sqlx::SqlitePool;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};

/// The family's DDL for the outbox (what another SDK's producer migrates):
/// no `headers` column.
const FAMILY_DDL: &str = "CREATE TABLE babelqueue_outbox (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    queue        TEXT    NOT NULL,
    body         TEXT    NOT NULL,
    status       TEXT    NOT NULL DEFAULT 'pending',
    attempts     INTEGER NOT NULL DEFAULT 0,
    last_error   TEXT,
    created_at   TEXT    NOT NULL,
    published_at TEXT,
    failed_at    TEXT
)";

/// A SQLite file of the test's own, removed on drop.
struct Database {
    dir: PathBuf,
    pool: SqlitePool,
}

impl Database {
    async fn open() -> Database {
        let dir = std::env::temp_dir().join(format!("bi-outbox-times-{}", unique_suffix()));
        std::fs::create_dir_all(&dir).unwrap();
        let options = SqliteConnectOptions::new()
            .filename(dir.join("outbox.db"))
            .create_if_missing(true);
        let pool = SqlitePoolOptions::new()
            .max_connections(2)
            .connect_with(options)
            .await
            .unwrap();
        Database { dir, pool }
    }

    /// `(created_at, published_at)` of every row, by id.
    async fn times(&self) -> Vec<(String, Option<String>)> {
        sqlx::query_as("SELECT created_at, published_at FROM babelqueue_outbox ORDER BY id")
            .fetch_all(&self.pool)
            .await
            .unwrap()
    }
}

impl Drop for Database {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Whether `text` is `YYYY-MM-DD HH:MM:SS`, nothing more.
fn whole_seconds(text: &str) -> bool {
    let bytes = text.as_bytes();
    bytes.len() == 19
        && bytes.iter().enumerate().all(|(i, b)| match i {
            4 | 7 => *b == b'-',
            10 => *b == b' ',
            13 | 16 => *b == b':',
            _ => b.is_ascii_digit(),
        })
}

/// Whether `text` is `YYYY-MM-DD HH:MM:SS.SSS`.
fn with_milliseconds(text: &str) -> bool {
    text.len() == 23 && whole_seconds(&text[..19]) && text.as_bytes()[19] == b'.'
}

/// Saves one envelope through `outbox` and one row as another SDK writes
/// it, relays both to `queue` on Redis, and returns the rows' times.
async fn relay_two_rows(
    db: &Database,
    outbox: SqliteOutbox,
    url: &str,
    queue: &str,
) -> Vec<(String, Option<String>)> {
    let mut tx = db.pool.begin().await.unwrap();
    let env = Envelope::new("urn:babel:orders:created", json!({"order_id": 7})).with_queue(queue);
    outbox.save(&mut tx, &env).await.unwrap();
    tx.commit().await.unwrap();
    let theirs = Envelope::new("urn:babel:orders:created", json!({"order_id": 8}))
        .with_id(uuid::Uuid::new_v4().to_string());
    sqlx::query(
        "INSERT INTO babelqueue_outbox (queue, body, created_at)
         VALUES (?1, ?2, strftime('%Y-%m-%d %H:%M:%S', 'now'))",
    )
    .bind(queue)
    .bind(String::from_utf8(theirs.encode_for_publish().unwrap()).unwrap())
    .execute(&db.pool)
    .await
    .unwrap();

    let sink = RedisTransport::connect(url).await.unwrap();
    // The relay's own outbox, as a relay-only process would make it: it
    // finds the table's kind itself.
    let source = SqliteOutbox::new(db.pool.clone());
    let relay = Relay::builder(source, sink).build().await.unwrap();
    assert_eq!(relay.drain().await.unwrap().published, 2);

    let mut redis = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let landed: i64 = redis.llen(queue).await.unwrap();
    assert_eq!(landed, 2);
    let _: () = redis.del(queue).await.unwrap();
    db.times().await
}

#[tokio::test]
async fn the_relay_writes_published_at_in_whole_seconds_on_the_familys_table() {
    let test = "the_relay_writes_published_at_in_whole_seconds_on_the_familys_table";
    let Some(url) = server_url(REDIS_URL, test) else {
        return;
    };
    let db = Database::open().await;
    sqlx::raw_sql(FAMILY_DDL).execute(&db.pool).await.unwrap();
    let queue = format!("bi-obx-times-{}", unique_suffix());

    let outbox = SqliteOutbox::new(db.pool.clone()).without_headers();
    let times = relay_two_rows(&db, outbox, &url, &queue).await;

    assert_eq!(times.len(), 2);
    for (created_at, published_at) in &times {
        let published_at = published_at.as_deref().expect("published");
        assert!(whole_seconds(published_at), "published_at {published_at:?}");
        assert!(whole_seconds(created_at), "created_at {created_at:?}");
        assert!(
            published_at >= created_at.as_str(),
            "{published_at} < {created_at}"
        );
    }
}

#[tokio::test]
async fn babel_idems_own_table_keeps_milliseconds() {
    let test = "babel_idems_own_table_keeps_milliseconds";
    let Some(url) = server_url(REDIS_URL, test) else {
        return;
    };
    let db = Database::open().await;
    let outbox = SqliteOutbox::new(db.pool.clone());
    outbox.migrate().await.unwrap();
    let queue = format!("bi-obx-times-{}", unique_suffix());

    let times = relay_two_rows(&db, outbox, &url, &queue).await;

    assert_eq!(times.len(), 2);
    assert!(
        with_milliseconds(&times[0].0),
        "created_at {:?}",
        times[0].0
    );
    for (_, published_at) in &times {
        let published_at = published_at.as_deref().expect("published");
        assert!(
            with_milliseconds(published_at),
            "published_at {published_at:?}"
        );
    }
}
