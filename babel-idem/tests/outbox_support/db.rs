//! One test's outbox table, in a SQLite file of its own or on the shared
//! PostgreSQL under a unique name (dropped on drop), and the binaries the
//! process tests run: the CLI and `examples/outbox_producer.rs`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use babel_idem::Envelope;
use babel_idem::outbox::{PostgresOutbox, RelaySource, SqliteOutbox};
use sqlx::postgres::PgPoolOptions;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use sqlx::{PgPool, SqlitePool};

use crate::store_contract::servers::{POSTGRES_URL, server_url, unique_suffix};

/// The family's DDL for the outbox (the examples' `schema.sql`), without
/// babel-idem's `headers` column: what another SDK's producer migrates.
pub const FAMILY_SQLITE_DDL: &str = "CREATE TABLE IF NOT EXISTS babelqueue_outbox (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    queue        TEXT    NOT NULL,
    body         TEXT    NOT NULL,
    status       TEXT    NOT NULL DEFAULT 'pending',
    attempts     INTEGER NOT NULL DEFAULT 0,
    last_error   TEXT,
    created_at   TEXT    NOT NULL,
    published_at TEXT,
    failed_at    TEXT
);
CREATE INDEX IF NOT EXISTS idx_outbox_pending ON babelqueue_outbox (status, id);";

pub const FAMILY_POSTGRES_DDL: &str = "CREATE TABLE IF NOT EXISTS babelqueue_outbox (
    id           BIGSERIAL    PRIMARY KEY,
    queue        VARCHAR(255) NOT NULL,
    body         TEXT         NOT NULL,
    status       VARCHAR(16)  NOT NULL DEFAULT 'pending',
    attempts     INTEGER      NOT NULL DEFAULT 0,
    last_error   VARCHAR(500),
    created_at   TIMESTAMP    NOT NULL,
    published_at TIMESTAMP,
    failed_at    TIMESTAMP
);
CREATE INDEX IF NOT EXISTS babelqueue_outbox_idx_pending ON babelqueue_outbox (status, id);";

/// Which database a test's outbox lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Sqlite,
    Postgres,
}

/// One row as the test reads it back.
#[derive(Debug, Clone)]
pub struct Row {
    pub id: i64,
    pub queue: String,
    pub status: String,
    pub attempts: i64,
    pub last_error: Option<String>,
    pub failed_at: bool,
}

pub enum Db {
    Sqlite {
        dir: PathBuf,
        pool: SqlitePool,
        table: String,
    },
    Postgres {
        url: String,
        pool: PgPool,
        table: String,
    },
}

impl Db {
    /// A fresh database for `test`, or `None` (after a `skipped:` line)
    /// when PostgreSQL is asked for and not configured. The table is not
    /// created.
    pub async fn open(kind: Kind, test: &str) -> Option<Db> {
        let table = format!("bi_outbox_{}", unique_suffix());
        Some(match kind {
            Kind::Sqlite => {
                let dir = std::env::temp_dir().join(format!("bi-outbox-{}", unique_suffix()));
                std::fs::create_dir_all(&dir).unwrap();
                let options = SqliteConnectOptions::new()
                    .filename(dir.join("outbox.db"))
                    .create_if_missing(true)
                    .journal_mode(SqliteJournalMode::Wal)
                    .busy_timeout(std::time::Duration::from_secs(30));
                let pool = SqlitePoolOptions::new()
                    .max_connections(4)
                    .connect_with(options)
                    .await
                    .unwrap();
                Db::Sqlite { dir, pool, table }
            }
            Kind::Postgres => {
                let url = server_url(POSTGRES_URL, test)?;
                let pool = PgPoolOptions::new()
                    .max_connections(8)
                    .connect(&url)
                    .await
                    .unwrap();
                Db::Postgres { url, pool, table }
            }
        })
    }

    pub fn kind(&self) -> Kind {
        match self {
            Db::Sqlite { .. } => Kind::Sqlite,
            Db::Postgres { .. } => Kind::Postgres,
        }
    }

    pub fn table(&self) -> &str {
        match self {
            Db::Sqlite { table, .. } | Db::Postgres { table, .. } => table,
        }
    }

    /// The URL the CLI and the example take.
    pub fn url(&self) -> String {
        match self {
            Db::Sqlite { dir, .. } => format!("sqlite://{}", dir.join("outbox.db").display()),
            Db::Postgres { url, .. } => url.clone(),
        }
    }

    pub fn sqlite(&self) -> SqliteOutbox {
        match self {
            Db::Sqlite { pool, table, .. } => {
                SqliteOutbox::new(pool.clone()).with_table(table).unwrap()
            }
            Db::Postgres { .. } => panic!("not a SQLite test"),
        }
    }

    pub fn postgres(&self) -> PostgresOutbox {
        match self {
            Db::Postgres { pool, table, .. } => {
                PostgresOutbox::new(pool.clone()).with_table(table).unwrap()
            }
            Db::Sqlite { .. } => panic!("not a PostgreSQL test"),
        }
    }

    /// The outbox as a relay's source (a pool of its own on PostgreSQL,
    /// so each relay of a test has its own connections).
    pub async fn source(&self) -> RelaySource {
        match self {
            Db::Sqlite { .. } => self.sqlite().into(),
            Db::Postgres { url, table, .. } => {
                let pool = PgPoolOptions::new()
                    .max_connections(4)
                    .connect(url)
                    .await
                    .unwrap();
                PostgresOutbox::new(pool).with_table(table).unwrap().into()
            }
        }
    }

    /// babel-idem's migration.
    pub async fn migrate(&self) {
        match self {
            Db::Sqlite { .. } => self.sqlite().migrate().await.unwrap(),
            Db::Postgres { .. } => self.postgres().migrate().await.unwrap(),
        }
    }

    /// The family's DDL alone.
    pub async fn migrate_family(&self) {
        let (ddl, table) = match self {
            Db::Sqlite { table, .. } => (FAMILY_SQLITE_DDL, table),
            Db::Postgres { table, .. } => (FAMILY_POSTGRES_DDL, table),
        };
        let ddl = ddl.replace("babelqueue_outbox", table);
        match self {
            Db::Sqlite { pool, .. } => {
                sqlx::raw_sql(&ddl).execute(pool).await.unwrap();
            }
            Db::Postgres { pool, .. } => {
                sqlx::raw_sql(&ddl).execute(pool).await.unwrap();
            }
        }
    }

    /// Saves each envelope in one committed transaction per call.
    pub async fn save_all(&self, envelopes: &[Envelope]) -> Vec<i64> {
        let mut ids = Vec::new();
        match self {
            Db::Sqlite { pool, .. } => {
                let outbox = self.sqlite();
                let mut tx = pool.begin().await.unwrap();
                for env in envelopes {
                    ids.push(outbox.save(&mut tx, env).await.unwrap());
                }
                tx.commit().await.unwrap();
            }
            Db::Postgres { pool, .. } => {
                let outbox = self.postgres();
                let mut tx = pool.begin().await.unwrap();
                for env in envelopes {
                    ids.push(outbox.save(&mut tx, env).await.unwrap());
                }
                tx.commit().await.unwrap();
            }
        }
        ids
    }

    /// Inserts rows with plain SQL, as the family's producers write them.
    pub async fn insert_plain(&self, rows: &[(String, String)]) {
        let t = self.table();
        match self {
            Db::Sqlite { pool, .. } => {
                let insert = format!(
                    "INSERT INTO {t} (queue, body, status, attempts, last_error, created_at)
                     VALUES (?1, ?2, 'pending', 0, NULL, strftime('%Y-%m-%d %H:%M:%S', 'now'))"
                );
                let mut tx = pool.begin().await.unwrap();
                for (queue, body) in rows {
                    sqlx::query(&insert)
                        .bind(queue)
                        .bind(body)
                        .execute(&mut *tx)
                        .await
                        .unwrap();
                }
                tx.commit().await.unwrap();
            }
            Db::Postgres { pool, .. } => {
                let insert = format!(
                    "INSERT INTO {t} (queue, body, status, attempts, last_error, created_at)
                     SELECT q, b, 'pending', 0, NULL, now() AT TIME ZONE 'UTC'
                     FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS r(q, b, n) ORDER BY n"
                );
                let queues: Vec<&str> = rows.iter().map(|(q, _)| q.as_str()).collect();
                let bodies: Vec<&str> = rows.iter().map(|(_, b)| b.as_str()).collect();
                sqlx::query(&insert)
                    .bind(queues)
                    .bind(bodies)
                    .execute(pool)
                    .await
                    .unwrap();
            }
        }
    }

    /// Inserts one pending row as another writer could leave it: raw bytes
    /// for the body and, on SQLite, the headers (each stored as a BLOB);
    /// on PostgreSQL the headers as JSON text, cast to the column's type.
    pub async fn insert_raw(&self, queue: &str, body: &[u8], headers: Option<&[u8]>) {
        let t = self.table();
        match self {
            Db::Sqlite { pool, .. } => {
                let insert = format!(
                    "INSERT INTO {t} (queue, body, headers, created_at)
                     VALUES (?1, ?2, ?3, strftime('%Y-%m-%d %H:%M:%f', 'now'))"
                );
                sqlx::query(&insert)
                    .bind(queue)
                    .bind(body)
                    .bind(headers)
                    .execute(pool)
                    .await
                    .unwrap();
            }
            Db::Postgres { pool, .. } => {
                let insert = format!(
                    "INSERT INTO {t} (queue, body, headers, created_at)
                     VALUES ($1, $2, $3::jsonb, now() AT TIME ZONE 'UTC')"
                );
                let text = |bytes: &[u8]| String::from_utf8(bytes.to_vec()).unwrap();
                sqlx::query(&insert)
                    .bind(queue)
                    .bind(text(body))
                    .bind(headers.map(text))
                    .execute(pool)
                    .await
                    .unwrap();
            }
        }
    }

    /// How many rows have `status`.
    pub async fn count(&self, status: &str) -> i64 {
        let select = format!("SELECT count(*) FROM {} WHERE status = $1", self.table());
        match self {
            Db::Sqlite { pool, .. } => sqlx::query_scalar(&select.replace("$1", "?1"))
                .bind(status)
                .fetch_one(pool)
                .await
                .unwrap(),
            Db::Postgres { pool, .. } => sqlx::query_scalar(&select)
                .bind(status)
                .fetch_one(pool)
                .await
                .unwrap(),
        }
    }

    /// Ends every PostgreSQL connection whose `application_name` is `name`
    /// (as an operator or a failover would); how many.
    pub async fn terminate_connections(&self, name: &str) -> usize {
        let Db::Postgres { pool, .. } = self else {
            panic!("not a PostgreSQL test");
        };
        let ended: Vec<bool> = sqlx::query_scalar(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
             WHERE application_name = $1 AND pid <> pg_backend_pid()",
        )
        .bind(name)
        .fetch_all(pool)
        .await
        .unwrap();
        ended.into_iter().filter(|ended| *ended).count()
    }

    pub async fn rows(&self) -> Vec<Row> {
        let t = self.table();
        let select = format!(
            "SELECT id, queue, status, attempts, last_error, failed_at IS NOT NULL FROM {t} ORDER BY id"
        );
        match self {
            Db::Sqlite { pool, .. } => {
                let rows: Vec<(i64, String, String, i64, Option<String>, bool)> =
                    sqlx::query_as(&select).fetch_all(pool).await.unwrap();
                rows.into_iter().map(row).collect()
            }
            Db::Postgres { pool, .. } => {
                let select = select.replace("attempts,", "attempts::int8,");
                let rows: Vec<(i64, String, String, i64, Option<String>, bool)> =
                    sqlx::query_as(&select).fetch_all(pool).await.unwrap();
                rows.into_iter().map(row).collect()
            }
        }
    }

    /// Drops the table (PostgreSQL) or the folder (SQLite).
    pub async fn cleanup(self) {
        match self {
            Db::Sqlite { dir, pool, .. } => {
                pool.close().await;
                let _ = std::fs::remove_dir_all(dir);
            }
            Db::Postgres { pool, table, .. } => {
                let _ = sqlx::query(&format!("DROP TABLE IF EXISTS {table}, {table}_orders"))
                    .execute(&pool)
                    .await;
            }
        }
    }
}

fn row(
    (id, queue, status, attempts, last_error, failed_at): (
        i64,
        String,
        String,
        i64,
        Option<String>,
        bool,
    ),
) -> Row {
    Row {
        id,
        queue,
        status,
        attempts,
        last_error,
        failed_at,
    }
}

/// The profile directory this test binary was built in.
fn profile_dir() -> PathBuf {
    std::env::current_exe()
        .expect("the test binary's path")
        .parent()
        .and_then(Path::parent)
        .expect("the test binary lives in target/<profile>/deps")
        .to_owned()
}

/// Builds `binary` with cargo once per test run (up to date, so a binary
/// left by an older build is never run).
fn built(binary: PathBuf, args: &[&str]) -> PathBuf {
    let mut build = Command::new(env!("CARGO"));
    build.arg("build").arg("--quiet").args(args);
    if profile_dir().ends_with("release") {
        build.arg("--release");
    }
    let status = build.status().expect("run cargo build");
    assert!(status.success(), "cargo build {args:?} failed");
    assert!(binary.exists(), "{binary:?} was not built");
    binary
}

/// The `babel-idem` CLI.
pub fn cli() -> &'static Path {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| {
        let binary = profile_dir().join(format!("babel-idem{}", std::env::consts::EXE_SUFFIX));
        // The whole workspace with every feature, as `cargo test --all-features`
        // builds it, so its artifacts are reused.
        built(
            binary,
            &["--workspace", "--all-features", "--bin", "babel-idem"],
        )
    })
}

/// `examples/outbox_producer.rs`.
pub fn producer() -> &'static Path {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| {
        let binary = profile_dir()
            .join("examples")
            .join(format!("outbox_producer{}", std::env::consts::EXE_SUFFIX));
        built(
            binary,
            &[
                "--example",
                "outbox_producer",
                "--features",
                "outbox,sqlite,postgres",
            ],
        )
    })
}
