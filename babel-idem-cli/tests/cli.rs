//! The `babel-idem` binary, run as an operator runs it, against SQLite
//! files, the shared Redis and the shared PostgreSQL (`BABEL_IDEM_REDIS_URL`,
//! `BABEL_IDEM_POSTGRES_URL`; without them the server tests print a
//! `skipped:` line, and fail under `BABEL_IDEM_REQUIRE_SERVERS=1`).
//!
//! Marks are written by the library (a scoped `Guard`, `Store::remember`)
//! and must be found and forgotten by the CLI with the same settings.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use babel_idem::{Envelope, Guard, Store, StoreError};

use babel_idem::store::{Admin, ClaimToken, PostgresStore, RedisStore, SqliteStore};
use babel_idem::{ClaimStore, store::Claim};
use serde_json::{Value, json};
use sqlx::Connection;

#[allow(
    dead_code,
    unreachable_pub,
    reason = "the shared helpers, public for the root package's tests; this file uses some"
)]
#[path = "../../babel-idem/tests/store_contract/servers.rs"]
mod servers;

use servers::{POSTGRES_URL, REDIS_URL, server_url, unique_suffix};

const BIN: &str = env!("CARGO_BIN_EXE_babel-idem");

/// One run of the binary.
#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn stdout_lines(&self) -> Vec<&str> {
        self.stdout.lines().collect()
    }

    fn json(&self) -> Value {
        serde_json::from_str(self.stdout.trim()).unwrap_or_else(|e| panic!("{e}: {self:?}"))
    }

    #[track_caller]
    fn ok(&self) -> &Self {
        assert_eq!(self.code, 0, "{self:?}");
        assert!(self.stderr.is_empty(), "{self:?}");
        self
    }

    /// A refusal as every command makes one: one line on stderr, the right
    /// code, no panic, no backtrace (RUST_BACKTRACE=1 is set for every run).
    #[track_caller]
    fn refused(&self, code: i32, says: &str) {
        assert_eq!(self.code, code, "{self:?}");
        assert_eq!(self.stderr.lines().count(), 1, "one line: {self:?}");
        assert!(self.stderr.starts_with("babel-idem: "), "{self:?}");
        assert!(self.stderr.contains(says), "{says:?} in {self:?}");
        let lower = self.stderr.to_lowercase();
        for trace in ["panicked", "backtrace", "stack"] {
            assert!(!lower.contains(trace), "{trace}: {self:?}");
        }
    }
}

fn cli(args: &[&str]) -> Run {
    cli_with_stdin(args, None)
}

/// Runs the binary with `input` on stdin, written from a thread while the
/// binary reads (it streams: a large input never fits a pipe buffer).
fn cli_with_stdin(args: &[&str], input: Option<String>) -> Run {
    let mut child = Command::new(BIN)
        .args(args)
        .env("RUST_BACKTRACE", "1")
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run babel-idem");
    let writer = input.map(|input| {
        let mut stdin = child.stdin.take().expect("stdin is piped");
        std::thread::spawn(move || {
            // The binary may stop reading early (an error): not this test's failure.
            let _ = stdin.write_all(input.as_bytes());
        })
    });
    let output = child.wait_with_output().expect("babel-idem ran");
    if let Some(writer) = writer {
        writer.join().expect("stdin writer");
    }
    Run {
        code: output.status.code().expect("exited, not killed"),
        stdout: String::from_utf8(output.stdout).expect("UTF-8 stdout"),
        stderr: String::from_utf8(output.stderr).expect("UTF-8 stderr"),
    }
}

/// `args` followed by `extra` (the store options of one backend).
fn with<'a>(args: &[&'a str], extra: &[&'a str]) -> Vec<&'a str> {
    args.iter().chain(extra).copied().collect()
}

/// Marks the library writes the way consumers do: `id-A` through a guard
/// scoped `billing`, `id-U` through an unscoped `remember`.
async fn mark_like_a_consumer(store: &dyn Store) {
    let env = Envelope::new("urn:babel:orders:created", json!({})).with_id("id-A");
    let mut ran = false;
    Guard::new(store)
        .scope("billing")
        .run(&env, async {
            ran = true;
            Ok::<(), StoreError>(())
        })
        .await
        .expect("guarded delivery");
    assert!(ran);
    store.remember("id-U").await.expect("remember");
}

/// Whether a `billing` guard would skip a delivery of `id`.
async fn billing_sees(store: &dyn Store, id: &str) -> bool {
    let env = Envelope::new("urn:babel:orders:created", json!({})).with_id(id);
    let key = Guard::new(store).scope("billing").key(&env);
    store.seen(key.as_str().unwrap()).await.expect("seen")
}

/// `seen`, `stats`, `forget --dry-run` and `forget` on the marks of
/// [`mark_like_a_consumer`], with the backend's options `opts`.
async fn scoped_marks_round_trip(url: &str, opts: &[&str], store: &dyn Store) {
    mark_like_a_consumer(store).await;
    let scoped = with(&["--scope", "billing"], opts);

    // seen: grep-like exit codes, one line per id.
    let run = cli(&with(&["seen", url, "id-A", "id-B"], &scoped));
    assert_eq!(run.code, 1, "{run:?}");
    assert_eq!(run.stdout_lines(), ["seen\tid-A", "unseen\tid-B"]);
    cli(&with(&["seen", url, "id-A"], &scoped)).ok();
    cli(&with(&["seen", url, "id-U"], opts)).ok();
    // The scope is part of the key: unscoped, id-A is not there.
    assert_eq!(cli(&with(&["seen", url, "id-A"], opts)).code, 1);
    let run = cli(&with(&["seen", url, "--json", "id-A", "id-Z"], &scoped));
    let lines: Vec<Value> = run
        .stdout_lines()
        .iter()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(
        lines,
        [
            json!({"id": "id-A", "seen": true, "state": "done"}),
            json!({"id": "id-Z", "seen": false, "state": "absent"})
        ]
    );

    // stats: everything, then one scope.
    let all = cli(&with(&["stats", url, "--json"], opts)).ok().json();
    assert_eq!(
        (all["marks"].as_u64(), all["expired"].as_u64()),
        (Some(2), Some(0))
    );
    let billing = cli(&with(&["stats", url, "--json"], &scoped)).ok().json();
    assert_eq!(billing["marks"], 1);
    assert_eq!(
        cli(&with(
            &["stats", url, "--json", "--scope", "shipping"],
            opts
        ))
        .json()["marks"],
        0
    );

    // forget --dry-run says what would go and removes nothing.
    let run = cli(&with(
        &["forget", url, "--dry-run", "id-A", "id-B"],
        &scoped,
    ));
    run.ok();
    assert_eq!(
        run.stdout_lines(),
        [
            "would forget\tid-A",
            "would forget 1 of 2 ids (dry run: nothing removed)"
        ]
    );
    assert!(
        billing_sees(store, "id-A").await,
        "a dry run removed a mark"
    );

    // forget: the guard runs the delivery again.
    let run = cli(&with(&["forget", url, "id-A", "id-B"], &scoped));
    assert_eq!(run.ok().stdout_lines(), ["forgot 1 of 2 ids"]);
    assert!(!billing_sees(store, "id-A").await);
    assert!(
        store.seen("id-U").await.unwrap(),
        "another scope's mark stays"
    );
    let run = cli(&with(&["forget", url, "--json", "id-U"], opts));
    assert_eq!(
        run.ok().json(),
        json!({"ids": 1, "forgotten": 1, "dry_run": false})
    );
    assert!(!store.seen("id-U").await.unwrap());
}

/// `count` ids, one per line: `id-1` .. `id-<count>`.
fn id_lines(count: usize) -> String {
    (1..=count).map(|i| format!("id-{i}\n")).collect()
}

/// A folder of its own under the temp dir, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(format!("babel-idem-cli-{}", unique_suffix()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        TempDir(dir)
    }

    fn url(&self, file: &str) -> String {
        format!("sqlite://{}", self.0.join(file).display())
    }

    fn path(&self, file: &str) -> PathBuf {
        self.0.join(file)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

async fn sqlite_store(path: &Path, table: &str) -> SqliteStore {
    SqliteStore::builder()
        .table(table)
        .open(path)
        .await
        .expect("open the SQLite store")
}

#[tokio::test]
async fn sqlite_migrate_then_every_command_with_scope_and_table() {
    let dir = TempDir::new();
    let url = dir.url("seen.db");
    let run = cli(&["migrate", &url, "--table", "billing_seen"]);
    assert_eq!(
        run.ok().stdout_lines(),
        [format!(
            "sqlite:{}: table billing_seen is ready",
            dir.path("seen.db").display()
        )]
    );
    // `sqlite:PATH` names the same file.
    let short = format!("sqlite:{}", dir.path("seen.db").display());
    cli(&["stats", &short, "--table", "billing_seen"]).ok();

    let store = sqlite_store(&dir.path("seen.db"), "billing_seen").await;
    scoped_marks_round_trip(&url, &["--table", "billing_seen"], &store).await;
}

#[tokio::test]
async fn sqlite_purge_expired_in_batches_and_dry_run_removes_nothing() {
    let dir = TempDir::new();
    let url = dir.url("seen.db");
    let store = sqlite_store(&dir.path("seen.db"), "babelqueue_idempotency").await;
    store.remember("live").await.unwrap();
    // 25,000 expired rows: three purge batches.
    sqlx::raw_sql(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 25000)
         INSERT INTO babelqueue_idempotency (message_id, created_at, expires_at)
         SELECT 'gone-' || i, 1000, 2000 FROM n",
    )
    .execute(store.pool())
    .await
    .unwrap();

    let stats = cli(&["stats", &url, "--json"]).ok().json();
    assert_eq!(
        (stats["marks"].as_u64(), stats["expired"].as_u64()),
        (Some(25_001), Some(25_000))
    );
    assert_eq!(stats["live"], 1);
    assert_eq!(stats["oldest"], "1970-01-01T00:00:01.000Z");
    let run = cli(&["stats", &url]);
    assert!(
        run.ok()
            .stdout
            .starts_with("marks      25001\nlive       1\nexpired    25000\n"),
        "{run:?}"
    );

    let run = cli(&["purge-expired", &url, "--dry-run"]);
    assert_eq!(
        run.ok().stdout_lines(),
        ["would purge 25000 expired marks (dry run: nothing removed)"]
    );
    assert_eq!(store.count_expired().await.unwrap(), 25_000);

    let run = cli(&["purge-expired", &url]);
    assert_eq!(run.ok().stdout_lines(), ["purged 25000 expired marks"]);
    // Not a terminal: no progress bar on stderr (`ok` checked it is empty).
    assert_eq!(store.stats("").await.unwrap().marks, 1);
    assert!(store.seen("live").await.unwrap());
    let run = cli(&["purge-expired", &url, "--json"]);
    assert_eq!(run.ok().json(), json!({"purged": 0, "dry_run": false}));
}

#[tokio::test]
async fn sqlite_forget_streams_200k_ids_from_stdin() {
    let dir = TempDir::new();
    let url = dir.url("seen.db");
    let store = sqlite_store(&dir.path("seen.db"), "babelqueue_idempotency").await;
    sqlx::raw_sql(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 200000)
         INSERT INTO babelqueue_idempotency (message_id, created_at)
         SELECT 'id-' || i, 0 FROM n",
    )
    .execute(store.pool())
    .await
    .unwrap();
    store.remember("kept").await.unwrap();

    // 200,000 stored ids and 10 unknown ones, with blank lines and CRLFs.
    let mut input = id_lines(200_010);
    input.push_str("\n\r\n");
    let run = cli_with_stdin(&["forget", &url, "-"], Some(input));
    assert_eq!(run.ok().stdout_lines(), ["forgot 200000 of 200010 ids"]);
    assert_eq!(store.stats("").await.unwrap().marks, 1);
    assert!(store.seen("kept").await.unwrap());

    // Arguments and `-` mix, in order; a dry run over stdin lists what is stored.
    store.remember("id-7").await.unwrap();
    let run = cli_with_stdin(
        &["forget", &url, "--dry-run", "kept", "-", "id-8"],
        Some("id-6\r\nid-7\n".into()),
    );
    assert_eq!(
        run.ok().stdout_lines(),
        [
            "would forget\tkept",
            "would forget\tid-7",
            "would forget 2 of 4 ids (dry run: nothing removed)"
        ]
    );
    assert_eq!(store.stats("").await.unwrap().marks, 2);
    let run = cli_with_stdin(&["seen", &url, "-"], Some("kept\nid-7\n".into()));
    assert_eq!(run.ok().stdout_lines(), ["seen\tkept", "seen\tid-7"]);
}

#[tokio::test]
async fn sqlite_bad_input_is_one_line_and_a_documented_code() {
    let dir = TempDir::new();
    let missing = dir.url("missing.db");

    cli(&["seen", "mysql://app:s3cret@db/app", "id"]).refused(2, "unsupported URL scheme `mysql`");
    cli(&["stats", "seen.db"]).refused(2, "is not a store URL");
    cli(&["stats", "sqlite::memory:"]).refused(2, "in-memory");
    cli(&["seen", &missing, "id"]).refused(4, "run `babel-idem migrate");
    assert!(
        !dir.path("missing.db").exists(),
        "looking did not create the file"
    );

    let url = dir.url("seen.db");
    cli(&["migrate", &url]).ok();
    cli(&["seen", &url, "--table", "other_table", "id"])
        .refused(4, "table other_table does not exist");
    cli(&["forget", &url, "--table", "x; DROP TABLE t", "id"]).refused(2, "plain identifier");
    cli(&["stats", &url, "--prefix", "a:"]).refused(2, "--prefix is a Redis setting");
    cli(&["seen", &url, ""]).refused(2, "empty id");
    // A table that is there but is not a seen-set: reached, then a command fails.
    let store = sqlite_store(&dir.path("seen.db"), "babelqueue_idempotency").await;
    sqlx::raw_sql("CREATE TABLE not_a_seen_set (a INTEGER)")
        .execute(store.pool())
        .await
        .unwrap();
    cli(&["seen", &url, "--table", "not_a_seen_set", "id"]).refused(5, "`seen` failed");
    let run = cli_with_stdin(&["forget", &url, "-"], Some("id-1\n\u{0}\u{ff}".into()));
    assert_eq!(run.code, 0, "NUL is a valid (if odd) id: {run:?}");
    let mut not_utf8 = Command::new(BIN)
        .args(["forget", &url, "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    not_utf8
        .stdin
        .take()
        .unwrap()
        .write_all(b"id-1\n\xff\xfe\n")
        .unwrap();
    let output = not_utf8.wait_with_output().unwrap();
    Run {
        code: output.status.code().unwrap(),
        stdout: String::from_utf8_lossy(&output.stdout).into(),
        stderr: String::from_utf8_lossy(&output.stderr).into(),
    }
    .refused(2, "line 2 of stdin");

    std::fs::write(
        dir.path("junk.db"),
        "not a database, just text\n".repeat(200),
    )
    .unwrap();
    cli(&["stats", &dir.url("junk.db")]).refused(3, "cannot open");

    // Usage errors are clap's (several lines of usage help), with code 2.
    for args in [
        &["seen"][..],
        &["frobnicate", &url],
        &["stats", &url, "--timeout", "0"],
        &["stats", &url, "--timeout", "0s"],
        &["stats", &url, "--timeout", "5 minutes"],
        &["migrate", &url, "--claimz"],
    ] {
        let run = cli(args);
        assert_eq!(run.code, 2, "{run:?}");
        assert!(!run.stderr.contains("panicked"), "{run:?}");
    }
    assert!(
        cli(&["stats", &url, "--timeout", "5x"])
            .stderr
            .contains("30s, 5m, 2h")
    );
    cli(&["stats", &url, "--timeout", "2m"]).ok();
    cli(&["stats", &url, "--php-claims"]).refused(2, "--php-claims is a Redis layout");
    let help = cli(&["--help"]);
    let help = &help.ok().stdout;
    assert!(help.contains("4  the store is not set up"), "{help}");
    for convention in [
        "takes the store URL as its first argument",
        "--redis URL, --amqp URL or --kafka URL",
        "30s, 5m, 2h",
        "RFC 3339",
        "Unix milliseconds",
        "--json prints one JSON object per line",
        "--dry-run changes nothing",
    ] {
        assert!(help.contains(convention), "{convention:?} in {help}");
    }
}

/// Deletes every key under the prefix when dropped (a failing test too).
struct RedisKeys {
    url: String,
    prefix: String,
}

impl Drop for RedisKeys {
    fn drop(&mut self) {
        let Ok(client) = redis::Client::open(self.url.as_str()) else {
            return;
        };
        let Ok(mut connection) = client.get_connection_with_timeout(Duration::from_secs(2)) else {
            return;
        };
        let keys: Vec<Vec<u8>> = redis::cmd("KEYS")
            .arg(format!("{}*", self.prefix))
            .query(&mut connection)
            .unwrap_or_default();
        if !keys.is_empty() {
            let _: redis::RedisResult<i64> = redis::cmd("DEL").arg(keys).query(&mut connection);
        }
    }
}

#[tokio::test]
async fn redis_every_command_with_scope_and_prefix() {
    let Some(url) = server_url(REDIS_URL, "redis_every_command_with_scope_and_prefix") else {
        return;
    };
    let prefix = format!("clitest{}:", unique_suffix());
    let _cleanup = RedisKeys {
        url: url.clone(),
        prefix: prefix.clone(),
    };
    let opts = ["--prefix", prefix.as_str()];
    let store = RedisStore::builder()
        .prefix(&prefix)
        .connect_lazy(&url)
        .unwrap();

    let run = cli(&with(&["migrate", &url], &opts));
    assert!(
        run.ok()
            .stdout
            .contains("nothing to migrate: Redis needs no schema"),
        "{run:?}"
    );
    scoped_marks_round_trip(&url, &opts, &store).await;

    // Another prefix is another seen-set.
    store.remember("id-P").await.unwrap();
    cli(&with(&["seen", &url, "id-P"], &opts)).ok();
    assert_eq!(
        cli(&["seen", &url, "id-P"]).code,
        1,
        "the default prefix is another set"
    );

    let stats = cli(&with(&["stats", &url, "--json"], &opts)).ok().json();
    assert_eq!(stats["marks"], 1);
    assert_eq!(stats["oldest"], Value::Null, "Redis keeps no write time");
    let run = cli(&with(&["purge-expired", &url], &opts));
    assert!(
        run.ok()
            .stdout
            .contains("nothing to purge: Redis deletes each mark itself")
    );
    cli(&with(&["purge-expired", &url, "--dry-run"], &opts)).ok();

    // 5,000 ids through stdin, in chunks, against a server.
    for i in 1..=5_000 {
        store.remember(&format!("id-{i}")).await.unwrap();
    }
    let run = cli_with_stdin(&with(&["forget", &url, "-"], &opts), Some(id_lines(5_000)));
    assert_eq!(run.ok().stdout_lines(), ["forgot 5000 of 5000 ids"]);
    assert_eq!(store.stats("").await.unwrap().marks, 1);

    cli(&with(&["stats", &url, "--table", "t"], &[])).refused(2, "--table is a SQL setting");
    cli(&with(&["stats", &url], &["--prefix", "bq:"])).refused(2, "prefix \"bq:\" is refused");
    let wrong = url.replacen("redis://", "redis://:wrong-password@", 1);
    let run = cli(&["seen", &wrong, "id"]);
    run.refused(3, "cannot connect to redis://:***@");
    assert!(!run.stderr.contains("wrong-password"));
    cli(&["stats", "redis://127.0.0.1:1/", "--timeout", "1s"]).refused(3, "cannot connect");
}

/// Drops the table (and claim mode's) when dropped, from a thread with a
/// runtime of its own (Drop cannot await).
struct PostgresTable {
    url: String,
    table: String,
}

impl Drop for PostgresTable {
    fn drop(&mut self) {
        let (url, table) = (self.url.clone(), self.table.clone());
        let cleanup = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a cleanup runtime");
            runtime.block_on(async move {
                let Ok(mut connection) = sqlx::PgConnection::connect(&url).await else {
                    return;
                };
                let _ = sqlx::raw_sql(&format!(
                    "DROP TABLE IF EXISTS {table}, {table}_claims; \
                     DROP SEQUENCE IF EXISTS {table}_claims_fence"
                ))
                .execute(&mut connection)
                .await;
            });
        });
        let _ = cleanup.join();
    }
}

#[tokio::test]
async fn postgres_every_command_with_scope_and_table() {
    let Some(url) = server_url(POSTGRES_URL, "postgres_every_command_with_scope_and_table") else {
        return;
    };
    let table = format!("cli_{}", unique_suffix());
    let _cleanup = PostgresTable {
        url: url.clone(),
        table: table.clone(),
    };
    let opts = ["--table", table.as_str()];

    cli(&with(&["seen", &url, "id"], &opts)).refused(4, "does not exist: run `babel-idem migrate");
    let run = cli(&with(&["migrate", &url], &opts));
    assert!(
        run.ok()
            .stdout
            .ends_with(&format!("table {table} is ready\n")),
        "{run:?}"
    );
    let alias = url.replacen("postgres://", "postgresql://", 1);
    cli(&with(&["stats", &alias], &opts)).ok();

    let store = PostgresStore::builder()
        .table(&table)
        .connect_lazy(&url)
        .unwrap();
    scoped_marks_round_trip(&url, &opts, &store).await;

    // 12,000 expired rows and one live one: two purge batches.
    store.remember("live").await.unwrap();
    sqlx::raw_sql(&format!(
        "INSERT INTO {table} (message_id, created_at, expires_at)
         SELECT 'gone-' || g, now() - interval '2 hours', now() - interval '1 hour'
         FROM generate_series(1, 12000) g"
    ))
    .execute(store.pool())
    .await
    .unwrap();
    let stats = cli(&with(&["stats", &url, "--json"], &opts)).ok().json();
    assert_eq!(
        (stats["marks"].as_u64(), stats["expired"].as_u64()),
        (Some(12_001), Some(12_000))
    );
    assert!(
        stats["oldest_ms"].as_i64() < stats["newest_ms"].as_i64(),
        "{stats}"
    );
    let run = cli(&with(&["purge-expired", &url, "--dry-run"], &opts));
    assert_eq!(
        run.ok().stdout_lines(),
        ["would purge 12000 expired marks (dry run: nothing removed)"]
    );
    assert_eq!(store.count_expired().await.unwrap(), 12_000);
    let run = cli(&with(&["purge-expired", &url], &opts));
    assert_eq!(run.ok().stdout_lines(), ["purged 12000 expired marks"]);
    assert_eq!(store.stats("").await.unwrap().marks, 1);
    assert!(store.seen("live").await.unwrap());

    let (scheme, rest) = url.split_once("://").unwrap();
    let host = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
    let stranger = format!("{scheme}://no_such_role_{}:pw@{host}", unique_suffix());
    let run = cli(&with(&["seen", &stranger, "id"], &opts));
    run.refused(3, "cannot connect to");
    assert!(
        run.stderr.contains(":***@") && !run.stderr.contains(":pw@"),
        "{run:?}"
    );
}

/// `migrate` makes the seen-set table only; `--claims` adds claim mode's;
/// `--dry-run` names what is missing and creates nothing, file included.
#[tokio::test]
async fn sqlite_migrate_claims_and_dry_run() {
    let dir = TempDir::new();
    let url = dir.url("seen.db");
    let run = cli(&["migrate", &url, "--dry-run", "--claims"]);
    assert_eq!(
        run.ok().stdout_lines(),
        [format!(
            "sqlite:{}: would create babelqueue_idempotency, babelqueue_idempotency_claims \
             (dry run: nothing created)",
            dir.path("seen.db").display()
        )]
    );
    assert!(!dir.path("seen.db").exists(), "a dry run made the file");

    cli(&["migrate", &url]).ok();
    let store = SqliteStore::builder()
        .open_existing(dir.path("seen.db"))
        .expect("a lazily opened store");
    assert!(store.table_exists().await.unwrap());
    assert!(!store.claims_table_exists().await.unwrap(), "not asked for");
    let run = cli(&["migrate", &url, "--claims", "--dry-run", "--json"]);
    assert_eq!(
        run.ok().json(),
        json!({"migrated": false, "dry_run": true, "would_create": ["babelqueue_idempotency_claims"]})
    );
    let run = cli(&["migrate", &url, "--claims", "--json"]);
    assert_eq!(
        run.ok().json(),
        json!({
            "migrated": true,
            "dry_run": false,
            "table": "babelqueue_idempotency",
            "claims_table": "babelqueue_idempotency_claims"
        })
    );
    assert!(store.claims_table_exists().await.unwrap());
    let run = cli(&["migrate", &url, "--claims", "--dry-run"]);
    assert!(
        run.ok().stdout.contains("nothing to create (dry run)"),
        "{run:?}"
    );
}

/// Claims `id` for a running handler (a long lease), so it is claimed, not done.
async fn hold(store: &dyn ClaimStore, id: &str) {
    let claim = store
        .claim(id, ClaimToken::random(), Duration::from_secs(300))
        .await
        .expect("claim");
    assert!(matches!(claim, Claim::Won { .. }), "{claim:?}");
}

/// `seen` on a claim-mode store: a done id is seen, a claimed one (its
/// handler still runs) is `claimed` and not seen, an unknown one unseen;
/// `forget --dry-run` lists only the done one, and `forget` leaves the
/// claim to its holder.
async fn claimed_ids_are_reported_claimed(url: &str, opts: &[&str], store: &dyn ClaimStore) {
    store.remember("done-1").await.unwrap();
    hold(store, "running-1").await;
    let run = cli(&with(
        &["seen", url, "done-1", "running-1", "never-1"],
        opts,
    ));
    assert_eq!(run.code, 1, "{run:?}");
    assert_eq!(
        run.stdout_lines(),
        ["seen\tdone-1", "claimed\trunning-1", "unseen\tnever-1"]
    );
    let run = cli(&with(&["seen", url, "--json", "running-1"], opts));
    assert_eq!(
        run.json(),
        json!({"id": "running-1", "seen": false, "state": "claimed"})
    );
    let run = cli(&with(
        &["forget", url, "--dry-run", "done-1", "running-1"],
        opts,
    ));
    assert_eq!(
        run.ok().stdout_lines(),
        [
            "would forget\tdone-1",
            "would forget 1 of 2 ids (dry run: nothing removed)"
        ]
    );
    let run = cli(&with(&["forget", url, "done-1", "running-1"], opts));
    assert_eq!(run.ok().stdout_lines(), ["forgot 1 of 2 ids"]);
    let run = cli(&with(&["seen", url, "done-1", "running-1"], opts));
    assert_eq!(run.stdout_lines(), ["unseen\tdone-1", "claimed\trunning-1"]);
}

#[tokio::test]
async fn sqlite_seen_reports_claimed_and_purge_removes_finished_claims() {
    let dir = TempDir::new();
    let url = dir.url("seen.db");
    cli(&["migrate", &url, "--claims"]).ok();
    let store = sqlite_store(&dir.path("seen.db"), "babelqueue_idempotency").await;
    claimed_ids_are_reported_claimed(&url, &[], &store).await;

    // A claim whose lease lapsed is finished: purged with --claims only.
    sqlx::raw_sql(
        "INSERT INTO babelqueue_idempotency_claims (message_id, owner, fence, lease_until)
         VALUES ('lapsed-1', 'aa', 1000, 0), ('lapsed-2', 'bb', 1001, 0)",
    )
    .execute(store.pool())
    .await
    .unwrap();
    let run = cli(&["purge-expired", &url, "--claims", "--dry-run", "--json"]);
    assert_eq!(
        run.ok().json(),
        json!({
            "would_purge": 0, "purged": 0,
            "claims_would_purge": 2, "claims_purged": 0,
            "dry_run": true
        })
    );
    let run = cli(&["purge-expired", &url]);
    assert_eq!(run.ok().stdout_lines(), ["purged 0 expired marks"]);
    assert_eq!(store.count_finished_claims().await.unwrap(), 2);
    let run = cli(&["purge-expired", &url, "--claims"]);
    assert_eq!(
        run.ok().stdout_lines(),
        ["purged 0 expired marks", "purged 2 finished claims"]
    );
    assert_eq!(store.count_finished_claims().await.unwrap(), 0);
    let run = cli(&["seen", &url, "running-1"]);
    assert_eq!(
        run.stdout_lines(),
        ["claimed\trunning-1"],
        "a live claim stays"
    );
}

#[tokio::test]
async fn redis_seen_reports_claimed_in_both_claim_layouts() {
    let Some(url) = server_url(
        REDIS_URL,
        "redis_seen_reports_claimed_in_both_claim_layouts",
    ) else {
        return;
    };
    let prefix = format!("clitest{}:", unique_suffix());
    // The claim keys and the fence counter beside the prefix's keys.
    let beside = format!("{}-", prefix.trim_end_matches(':'));
    let _cleanup = [&prefix, &beside].map(|prefix| RedisKeys {
        url: url.clone(),
        prefix: prefix.to_string(),
    });
    let store = RedisStore::builder()
        .prefix(&prefix)
        .connect_lazy(&url)
        .unwrap();
    claimed_ids_are_reported_claimed(&url, &["--prefix", prefix.as_str()], &store).await;

    // The PHP SDK's layout: '1' is a claim, '2' done, in one key per id.
    let php_prefix = format!("clitestphp{}:", unique_suffix());
    let _php_cleanup = RedisKeys {
        url: url.clone(),
        prefix: php_prefix.clone(),
    };
    let php = RedisStore::builder()
        .php_claims()
        .prefix(&php_prefix)
        .connect_lazy(&url)
        .unwrap();
    let opts = ["--php-claims", "--prefix", php_prefix.as_str()];
    claimed_ids_are_reported_claimed(&url, &opts, &php).await;
    // Read without the PHP layout, the '1' would pass for a mark.
    let run = cli(&["seen", &url, "--prefix", &php_prefix, "running-1"]);
    assert_eq!(run.stdout_lines(), ["seen\trunning-1"]);
}

#[tokio::test]
async fn postgres_migrate_claims_and_seen_reports_claimed() {
    let Some(url) = server_url(
        POSTGRES_URL,
        "postgres_migrate_claims_and_seen_reports_claimed",
    ) else {
        return;
    };
    let table = format!("cli_{}", unique_suffix());
    let _cleanup = PostgresTable {
        url: url.clone(),
        table: table.clone(),
    };
    let opts = ["--table", table.as_str()];
    let run = cli(&with(&["migrate", &url, "--claims", "--dry-run"], &opts));
    assert!(
        run.ok().stdout.contains(&format!(
            "would create {table}, {table}_claims (dry run: nothing created)"
        )),
        "{run:?}"
    );
    cli(&with(&["migrate", &url], &opts)).ok();
    let store = PostgresStore::builder()
        .table(&table)
        .connect_lazy(&url)
        .unwrap();
    assert!(!store.claims_table_exists().await.unwrap(), "not asked for");
    let run = cli(&with(&["migrate", &url, "--claims"], &opts));
    assert!(
        run.ok()
            .stdout
            .ends_with(&format!("claims table {table}_claims is ready\n")),
        "{run:?}"
    );
    claimed_ids_are_reported_claimed(&url, &opts, &store).await;
    let run = cli(&with(&["purge-expired", &url, "--claims", "--json"], &opts));
    assert_eq!(
        run.ok().json(),
        json!({"purged": 0, "claims_purged": 0, "dry_run": false})
    );
}

/// No secret a store URL carries is printed, in any command's output or
/// error: a `password=` query parameter in any case, `user:PW@`, Redis's
/// `:PW@`, a URL the CLI cannot parse.
#[test]
fn secrets_in_store_urls_never_print() {
    let secrets = ["Qry5ecret", "Us3rSecret", "R3disSecret", "MalformedSecret"];
    let mut runs = vec![
        cli(&[
            "stats",
            "postgres://app:Us3rSecret@127.0.0.1:1/db?sslmode=disable&PASSWORD=Qry5ecret",
            "--timeout",
            "2s",
        ]),
        cli(&[
            "seen",
            "postgresql://app@127.0.0.1:1/db?password=Qry5ecret",
            "--timeout",
            "2s",
            "id",
        ]),
        cli(&[
            "stats",
            "redis://:R3disSecret@127.0.0.1:1/0",
            "--timeout",
            "2s",
        ]),
        cli(&[
            "stats",
            "rediss://:R3disSecret@127.0.0.1:1/0",
            "--timeout",
            "2s",
        ]),
        cli(&["migrate", "postgres:app:MalformedSecret@h/db"]),
        cli(&["stats", "mysql://app:Us3rSecret@h/db?password=Qry5ecret"]),
    ];
    if let Ok(url) = std::env::var("BABEL_IDEM_POSTGRES_URL") {
        // The real server, refusing a wrong password given as a parameter.
        let sep = if url.contains('?') { '&' } else { '?' };
        runs.push(cli(&[
            "stats",
            &format!("{url}{sep}password=Qry5ecret"),
            "--timeout",
            "5s",
        ]));
    }
    for run in &runs {
        assert_ne!(run.code, 0, "{run:?}");
        for secret in secrets {
            assert!(!run.stderr.contains(secret), "{secret} printed: {run:?}");
            assert!(!run.stdout.contains(secret), "{secret} printed: {run:?}");
        }
    }
    assert!(runs[0].stderr.contains("PASSWORD=***"), "{:?}", runs[0]);
    assert!(runs[0].stderr.contains("app:***@"), "{:?}", runs[0]);
    assert!(runs[2].stderr.contains(":***@127.0.0.1"), "{:?}", runs[2]);
}

/// A command run as a user who may not write `dir` nor the files in it:
/// `nobody` when the tests run as root (root writes any file), else the
/// current user, with the files made read-only.
fn cli_read_only(args: &[&str]) -> Run {
    use std::os::unix::process::CommandExt;
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| out.stdout.starts_with(b"0\n"));
    let mut command = Command::new(BIN);
    command
        .args(args)
        .env("RUST_BACKTRACE", "1")
        .stdin(Stdio::null());
    if root {
        command.uid(65534).gid(65534);
    }
    let output = command.output().expect("babel-idem ran");
    Run {
        code: output.status.code().expect("exited, not killed"),
        stdout: String::from_utf8(output.stdout).expect("UTF-8 stdout"),
        stderr: String::from_utf8(output.stderr).expect("UTF-8 stderr"),
    }
}

/// An id with a newline or another control character prints as one
/// escaped line, in text and JSON; it cannot forge a line of its own.
#[tokio::test]
async fn ids_with_control_characters_print_escaped() {
    let dir = TempDir::new();
    let url = dir.url("seen.db");
    cli(&["migrate", &url]).ok();
    let store = sqlite_store(&dir.path("seen.db"), "babelqueue_idempotency").await;
    let forged = "x\nseen\tadmin\r\u{1b}[2K\u{7f}";
    store.remember(forged).await.expect("remember");
    let run = cli(&["seen", &url, forged]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(
        run.stdout, "seen\tx\\nseen\\tadmin\\r\\u{1b}[2K\\u{7f}\n",
        "one escaped line: {run:?}"
    );
    let run = cli(&["--dry-run", "forget", &url, forged]);
    assert_eq!(
        run.stdout.lines().next(),
        Some("would forget\tx\\nseen\\tadmin\\r\\u{1b}[2K\\u{7f}"),
        "{run:?}"
    );
    let run = cli(&["--json", "seen", &url, forged]);
    assert_eq!(run.stdout.lines().count(), 1, "{run:?}");
    let line: serde_json::Value = serde_json::from_str(run.stdout.trim_end()).expect("JSON");
    assert_eq!(line["id"], forged, "the JSON line parses back to the id");
}

/// A SQLite file this process may not write answers `seen` and `stats`
/// (opened read-only, nothing written); `forget`, `purge-expired` and
/// `migrate` give one clear error and change nothing.
#[tokio::test]
async fn a_read_only_sqlite_file_answers_reads_and_refuses_writes() {
    use std::os::unix::fs::PermissionsExt;
    let dir = TempDir::new();
    let url = dir.url("seen.db");
    cli(&["migrate", &url]).ok();
    {
        let store = sqlite_store(&dir.path("seen.db"), "babelqueue_idempotency").await;
        store.remember("id-A").await.expect("remember");
        sqlx::raw_sql("PRAGMA wal_checkpoint(TRUNCATE)")
            .execute(store.pool())
            .await
            .expect("checkpoint");
        store.pool().close().await;
    }
    // A file copied or mounted read-only: the database alone, its WAL
    // checkpointed into it.
    for file in ["seen.db-wal", "seen.db-shm"] {
        let _ = std::fs::remove_file(dir.path(file));
    }
    for file in ["seen.db", "seen.db-wal", "seen.db-shm"] {
        let path = dir.path(file);
        if path.exists() {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o444)).unwrap();
        }
    }
    std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o555)).unwrap();
    let before = std::fs::read(dir.path("seen.db")).unwrap();

    let run = cli_read_only(&["seen", &url, "id-A", "id-B"]);
    assert_eq!(run.code, 1, "id-B is unseen: {run:?}");
    assert_eq!(run.stdout, "seen\tid-A\nunseen\tid-B\n", "{run:?}");
    let run = cli_read_only(&["--json", "stats", &url]);
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.stdout.contains("\"marks\":1"), "{run:?}");
    for args in [
        vec!["forget", url.as_str(), "id-A"],
        vec!["purge-expired", url.as_str()],
        vec!["migrate", url.as_str()],
    ] {
        cli_read_only(&args).refused(5, "is read-only here");
    }
    assert_eq!(
        std::fs::read(dir.path("seen.db")).unwrap(),
        before,
        "nothing written"
    );
    std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// What `stats` says of the retention: the JSON's `retention` and
/// `retention_ms`, and the text's `retention` line.
fn retention_shown(url: &str, opts: &[&str]) -> (Value, Value, String) {
    let stats = cli(&with(&["stats", url, "--json"], opts)).ok().json();
    let run = cli(&with(&["stats", url], opts));
    let line = run
        .ok()
        .stdout_lines()
        .into_iter()
        .find(|line| line.starts_with("retention"))
        .unwrap_or_else(|| panic!("no retention line: {run:?}"))
        .to_owned();
    (
        stats["retention"].clone(),
        stats["retention_ms"].clone(),
        line,
    )
}

#[tokio::test]
async fn sqlite_stats_shows_the_retention_the_newest_mark_was_written_with() {
    let dir = TempDir::new();
    let url = dir.url("seen.db");
    let forever = sqlite_store(&dir.path("seen.db"), "babelqueue_idempotency").await;
    let (shown, ms, line) = retention_shown(&url, &[]);
    assert_eq!((shown, ms), (json!("unknown"), Value::Null));
    assert_eq!(line, "retention  unknown (no mark to read it from)");

    forever.remember("kept").await.unwrap();
    let (shown, ms, line) = retention_shown(&url, &[]);
    assert_eq!((shown, ms), (json!("forever"), Value::Null));
    assert_eq!(line, "retention  forever (marks written without a TTL)");

    let ninety_minutes = SqliteStore::builder()
        .ttl(Duration::from_secs(90 * 60))
        .open(dir.path("seen.db"))
        .await
        .unwrap();
    ninety_minutes.remember("expiring").await.unwrap();
    let (shown, ms, line) = retention_shown(&url, &[]);
    assert_eq!((shown, ms), (json!("1h30m"), json!(5_400_000)));
    assert_eq!(line, "retention  1h30m");
}

#[tokio::test]
async fn redis_stats_shows_at_least_the_time_a_mark_has_left() {
    let Some(url) = server_url(
        REDIS_URL,
        "redis_stats_shows_at_least_the_time_a_mark_has_left",
    ) else {
        return;
    };
    let prefix = format!("cliretention{}:", unique_suffix());
    let _cleanup = RedisKeys {
        url: url.clone(),
        prefix: prefix.clone(),
    };
    let opts = ["--prefix", prefix.as_str()];
    let (shown, ms, _) = retention_shown(&url, &opts);
    assert_eq!((shown, ms), (json!("unknown"), Value::Null));

    let day = RedisStore::builder()
        .prefix(&prefix)
        .ttl(Duration::from_secs(86_400))
        .connect_lazy(&url)
        .unwrap();
    day.remember("expiring").await.unwrap();
    let (shown, ms, line) = retention_shown(&url, &opts);
    // Redis keeps the time left, not the write time: a floor, under a day.
    let shown = shown.as_str().unwrap().to_owned();
    assert!(
        shown.starts_with("at least 23h59m") || shown == "at least 1d",
        "{shown}"
    );
    assert_eq!(ms, Value::Null, "a floor is no exact TTL");
    assert!(line.contains("Redis keeps no write time"), "{line}");

    let forever = RedisStore::builder()
        .prefix(&prefix)
        .connect_lazy(&url)
        .unwrap();
    forever.remember("kept").await.unwrap();
    let (shown, _, _) = retention_shown(&url, &opts);
    assert_eq!(shown, "forever", "a mark without expiry is kept forever");
}

#[tokio::test]
async fn postgres_stats_shows_the_retention_the_newest_mark_was_written_with() {
    let Some(url) = server_url(
        POSTGRES_URL,
        "postgres_stats_shows_the_retention_the_newest_mark_was_written_with",
    ) else {
        return;
    };
    let table = format!("cli_retention_{}", unique_suffix());
    let _cleanup = PostgresTable {
        url: url.clone(),
        table: table.clone(),
    };
    let opts = ["--table", table.as_str()];
    let store = PostgresStore::builder()
        .table(&table)
        .ttl(Duration::from_secs(7 * 86_400))
        .connect_lazy(&url)
        .unwrap();
    store.migrate().await.unwrap();
    let (shown, _, _) = retention_shown(&url, &opts);
    assert_eq!(shown, "unknown");

    store.remember("expiring").await.unwrap();
    let (shown, ms, line) = retention_shown(&url, &opts);
    assert_eq!((shown, ms), (json!("7d"), json!(604_800_000)));
    assert_eq!(line, "retention  7d");
}
