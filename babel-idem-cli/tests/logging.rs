//! What a long-running command meets is logged on stderr: the library's
//! events (a row the broker refused, a broker outage) as lines of text, or
//! JSON objects with `--json`; `-q` keeps only errors. stdout keeps the
//! command's own output.
//!
//! The relay runs against the shared Redis (`BABEL_IDEM_REDIS_URL`; without
//! it a test prints a `skipped:` line, and fails under
//! `BABEL_IDEM_REQUIRE_SERVERS=1`), through a proxy of the test's own that
//! cuts the connection when the relay publishes and refuses every later one:
//! the broker is down for the relay alone.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

#[allow(
    dead_code,
    unreachable_pub,
    reason = "the shared helpers, public for the root package's tests; this file uses some"
)]
#[path = "../../babel-idem/tests/store_contract/servers.rs"]
mod servers;

use servers::{REDIS_URL, server_url, unique_suffix};

const BIN: &str = env!("CARGO_BIN_EXE_babel-idem");

/// The longest a test waits for a condition (a guard against hanging, never
/// a timing assertion).
const PATIENCE: Duration = Duration::from_secs(60);

/// What the relay logs when the broker cannot be reached.
const OUTAGE: &str = "the broker is unreachable";
/// What the relay logs when the broker refuses a row.
const REFUSAL: &str = "the broker refused a row";

/// A SQLite outbox of the test's own with one pending row for `queue`;
/// the file is removed on drop.
struct Outbox {
    path: PathBuf,
}

impl Outbox {
    async fn with_one_row(queue: &str) -> Outbox {
        let path = std::env::temp_dir().join(format!("bi-cli-logging-{}.db", unique_suffix()));
        let outbox = Outbox { path };
        let migrate = Command::new(BIN)
            .args(["migrate", &outbox.url(), "--outbox"])
            .output()
            .expect("run babel-idem migrate");
        assert!(migrate.status.success(), "{migrate:?}");
        let options = sqlx::sqlite::SqliteConnectOptions::new().filename(&outbox.path);
        let mut connection = sqlx::ConnectOptions::connect(&options).await.unwrap();
        let body = format!(
            r#"{{"job":"urn:babel:orders:created","trace_id":"t","data":{{}},"meta":{{"id":"{}","queue":"{queue}","schema_version":1}},"attempts":0}}"#,
            unique_suffix()
        );
        sqlx::query(
            "INSERT INTO babelqueue_outbox (queue, body, status, attempts, created_at)
             VALUES (?1, ?2, 'pending', 0, strftime('%Y-%m-%d %H:%M:%S', 'now'))",
        )
        .bind(queue)
        .bind(body)
        .execute(&mut connection)
        .await
        .unwrap();
        outbox
    }

    fn url(&self) -> String {
        format!("sqlite://{}", self.path.display())
    }
}

impl Drop for Outbox {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", self.path.display()));
        }
    }
}

/// The lines of `stderr` that say `what`: as text, or (`json`) as JSON
/// objects whose `message` says it, each of babel-idem's at `level`
/// (`WARN`, `ERROR`).
fn said(stderr: &str, what: &str, json: bool, level: &str) -> Vec<String> {
    let mut lines = Vec::new();
    for line in stderr.lines().filter(|line| line.contains(what)) {
        if json {
            let event: Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("a JSON log line ({e}): {line}"));
            assert_eq!(event["level"], level, "{line}");
            assert!(
                event["target"].as_str().unwrap().starts_with("babel_idem"),
                "{line}"
            );
            assert!(event["message"].as_str().unwrap().contains(what), "{line}");
            assert!(event["timestamp"].is_string(), "{line}");
        } else {
            assert!(line.contains(level), "{line}");
        }
        lines.push(line.to_owned());
    }
    lines
}

/// `babel-idem relay --drain` with `flags` over an outbox holding one row
/// for `queue`, which the relay refuses (over `--max-body 1`) until its
/// `max_attempts` are spent.
async fn relay_refusing_one_row(
    flags: &[&str],
    queue: &str,
    redis: &str,
    max_attempts: u32,
) -> std::process::Output {
    let outbox = Outbox::with_one_row(queue).await;
    Command::new(BIN)
        .args(flags)
        .args([
            "relay",
            "--drain",
            "--outbox",
            &outbox.url(),
            "--redis",
            redis,
        ])
        .args([
            "--max-body",
            "1",
            "--max-attempts",
            &max_attempts.to_string(),
        ])
        .stdin(Stdio::null())
        .output()
        .expect("run babel-idem relay")
}

/// A row the broker refuses (larger than `--max-body`) for its last
/// attempt turns `'failed'`: that is logged as an error, in text by
/// default, as JSON with `--json`, and still with `-q` (errors only), where
/// it is the only line; stdout keeps the relay's summary alone.
#[tokio::test]
async fn a_row_refused_for_its_last_attempt_is_logged_as_an_error_in_text_or_json_even_with_q() {
    const TEST: &str = "cli_logs_a_failed_row";
    let Some(url) = server_url(REDIS_URL, TEST) else {
        return;
    };
    let queue = format!("bi-cli-logging-{}", unique_suffix());
    for (flags, json) in [
        (&[][..], false),
        (&["--json"][..], true),
        (&["-q"][..], false),
        (&["--json", "-q"][..], true),
    ] {
        let output = relay_refusing_one_row(flags, &queue, &url, 1).await;
        let (stdout, stderr) = (
            String::from_utf8(output.stdout).unwrap(),
            String::from_utf8(output.stderr).unwrap(),
        );
        assert!(output.status.success(), "{flags:?}: {stdout}{stderr}");
        let lines = said(&stderr, REFUSAL, json, "ERROR");
        assert_eq!(lines.len(), 1, "{flags:?}: one failed row logged: {stderr}");
        assert!(lines[0].contains("'failed'"), "{flags:?}: {}", lines[0]);
        if flags.contains(&"-q") {
            assert_eq!(stderr.lines().count(), 1, "{flags:?}: quiet: {stderr}");
        }
        assert!(
            !stdout.contains(REFUSAL),
            "{flags:?}: stdout is the command's: {stdout}"
        );
        assert_eq!(
            stdout.lines().count(),
            1,
            "{flags:?}: the summary: {stdout}"
        );
        assert!(
            stdout.contains("failed 1") || stdout.contains("\"failed\":1"),
            "{flags:?}: {stdout}"
        );
    }
}

/// A refusal that leaves the row attempts to go is a warning: shown by
/// default, not with `-q`.
#[tokio::test]
async fn a_refused_row_with_attempts_left_is_a_warning_and_quiet_with_q() {
    const TEST: &str = "cli_logs_a_refused_row";
    let Some(url) = server_url(REDIS_URL, TEST) else {
        return;
    };
    let queue = format!("bi-cli-logging-{}", unique_suffix());
    for (flags, logged) in [(&[][..], true), (&["-q"][..], false)] {
        let output = relay_refusing_one_row(flags, &queue, &url, 2).await;
        let stderr = String::from_utf8(output.stderr).unwrap();
        assert!(output.status.success(), "{flags:?}: {stderr}");
        let warned: Vec<&str> = stderr
            .lines()
            .filter(|line| line.contains(REFUSAL) && line.contains("WARN"))
            .collect();
        match logged {
            true => assert_eq!(warned.len(), 1, "{flags:?}: the first refusal: {stderr}"),
            false => assert!(warned.is_empty(), "{flags:?}: quiet: {stderr}"),
        }
    }
}

/// A TCP proxy to a server that cuts the connection carrying `marker`
/// (the relay's publish) and then refuses every connection: the broker
/// goes down for its clients. Counts the connections it refused.
struct CuttingProxy {
    port: u16,
    refused: Arc<AtomicUsize>,
}

impl CuttingProxy {
    fn start(upstream: String, marker: Vec<u8>) -> CuttingProxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let refused = Arc::new(AtomicUsize::new(0));
        let down = Arc::new(AtomicBool::new(false));
        let counted = Arc::clone(&refused);
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                if down.load(Ordering::SeqCst) {
                    counted.fetch_add(1, Ordering::SeqCst);
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
                let Ok(server) = TcpStream::connect(&upstream) else {
                    continue;
                };
                let (down, marker) = (Arc::clone(&down), marker.clone());
                let (mut from_client, mut to_server) =
                    (client.try_clone().unwrap(), server.try_clone().unwrap());
                std::thread::spawn(move || {
                    let mut seen: Vec<u8> = Vec::new();
                    let mut buffer = [0u8; 16 * 1024];
                    while let Ok(read) = from_client.read(&mut buffer) {
                        if read == 0 {
                            break;
                        }
                        seen.extend_from_slice(&buffer[..read]);
                        if seen.windows(marker.len()).any(|w| w == marker.as_slice()) {
                            // The publish never reaches the server.
                            down.store(true, Ordering::SeqCst);
                            break;
                        }
                        let keep = seen.len().saturating_sub(marker.len());
                        seen.drain(..keep);
                        if to_server.write_all(&buffer[..read]).is_err() {
                            break;
                        }
                    }
                    let _ = from_client.shutdown(Shutdown::Both);
                    let _ = to_server.shutdown(Shutdown::Both);
                });
                let (mut from_server, mut to_client) = (server, client);
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut from_server, &mut to_client);
                    let _ = to_client.shutdown(Shutdown::Both);
                });
            }
        });
        CuttingProxy { port, refused }
    }

    fn refused(&self) -> usize {
        self.refused.load(Ordering::SeqCst)
    }
}

/// `host:port` of a `redis://` URL.
fn address(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split('/').next().unwrap_or(rest);
    let host_port = authority.rsplit('@').next().unwrap_or(authority);
    if host_port.contains(':') {
        host_port.to_owned()
    } else {
        format!("{host_port}:6379")
    }
}

/// A relay running in the background, its stderr collected as it comes.
struct Running {
    child: Child,
    stderr: Arc<Mutex<String>>,
}

impl Running {
    fn start(args: &[&str]) -> Running {
        let mut child = Command::new(BIN)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start babel-idem relay");
        let stderr = Arc::new(Mutex::new(String::new()));
        let collected = Arc::clone(&stderr);
        let pipe = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines() {
                let Ok(line) = line else { break };
                let mut all = collected.lock().unwrap();
                all.push_str(&line);
                all.push('\n');
            }
        });
        Running { child, stderr }
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Waits until `condition` holds, the relay still running.
    fn wait_for(&mut self, what: &str, condition: impl Fn(&Running) -> bool) {
        let give_up = Instant::now() + PATIENCE;
        while !condition(self) {
            assert!(
                self.child.try_wait().unwrap().is_none(),
                "the relay stopped before {what}: {}",
                self.stderr()
            );
            assert!(
                Instant::now() < give_up,
                "gave up waiting for {what}: {}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The broker lost while the relay runs: each pass that finds it down is
/// logged as a warning (text, or JSON with `--json`); with `-q` none is,
/// while the relay goes on meeting the outage.
#[tokio::test]
async fn a_broker_outage_is_logged_on_stderr_in_text_or_json_and_quiet_with_q() {
    const TEST: &str = "cli_logs_a_broker_outage";
    let Some(url) = server_url(REDIS_URL, TEST) else {
        return;
    };
    for (flags, json, logged) in [
        (&[][..], false, true),
        (&["--json"][..], true, true),
        (&["-q"][..], false, false),
    ] {
        let queue = format!("bi-cli-logging-{}", unique_suffix());
        let outbox = Outbox::with_one_row(&queue).await;
        let proxy = CuttingProxy::start(address(&url), queue.clone().into_bytes());
        let proxied = format!("redis://127.0.0.1:{}/", proxy.port);
        let outbox_url = outbox.url();
        let mut args: Vec<&str> = flags.to_vec();
        args.extend([
            "relay",
            "--drain",
            "--outbox",
            &outbox_url,
            "--redis",
            &proxied,
        ]);
        let mut relay = Running::start(&args);
        if logged {
            relay.wait_for("two outages logged", |relay| {
                said(&relay.stderr(), OUTAGE, json, "WARN").len() >= 2
            });
        } else {
            relay.wait_for("three reconnections refused", |_| proxy.refused() >= 3);
            let stderr = relay.stderr();
            assert!(stderr.is_empty(), "quiet: {stderr}");
        }
        drop(relay);
    }
}
