//! A password in a store or broker URL is never shown, whatever shape the
//! URL has: every malformed spelling of a URL that carries a distinctive
//! password is given to the library's parsers (the stores' and transports'
//! builders, then a first operation on whatever they accept) and to the
//! `babel-idem` binary, and the password appears in no error's `Display`
//! or `Debug`, and on neither stdout nor stderr.
//!
//! Nothing here needs a server: the hosts are `127.0.0.1` on a port nothing
//! listens on, so a URL that parses fails at its connection.

use std::process::{Command, Stdio};
use std::time::Duration;

use babel_idem::store::{PostgresStore, RedisStore};
use babel_idem::transport::{AmqpTransport, RedisTransport};

const BIN: &str = env!("CARGO_BIN_EXE_babel-idem");

/// The passwords: plain; percent-encoded (its decoded spelling is checked
/// too); holding an `@`, a `:` and a `/`, which move the places a parser
/// splits a URL at.
const SECRETS: &[&str] = &[
    "Zk9SECRETqv",
    "Zk9SEC%52ETqv",
    "Zk9SEC@RETqv",
    "Zk9:SEC/RETqv",
];

/// What must never show for `secret`: itself and its percent-decoded text.
fn forbidden(secret: &str) -> Vec<String> {
    let decoded = secret.replace("%52", "R");
    let mut all = vec![secret.to_owned()];
    if decoded != secret {
        all.push(decoded);
    }
    all
}

/// A port nothing listens on.
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// Every URL shape of the test for `secret`: schemes, each with every way
/// of getting its separator wrong, each with credentials spelled several
/// ways, each with several tails; then shapes that break something else.
fn shapes(secret: &str, port: u16) -> Vec<String> {
    let schemes = [
        "postgres",
        "postgresql",
        "redis",
        "rediss",
        "redis+cluster",
        "amqp",
        "amqps",
        "sqlite",
        "mysql",
        "POSTGRES",
        "Redis",
    ];
    let separators = [
        "://", ":/", ":", "//", "/", ":///", "", "::", ": //", ":\\\\", "://///", ":/ /",
    ];
    let credentials = [
        format!("u:{secret}@"),
        format!(":{secret}@"),
        format!("u:{secret}@@"),
        format!("u:{secret}:x@"),
        format!("u:{secret}@v@"),
        format!("u::{secret}@"),
        format!("u:{secret}/@"),
        format!("u:{secret}?@"),
        format!("u:{secret}#@"),
        format!("u: {secret}@"),
    ];
    let tails = [
        format!("127.0.0.1:{port}/db"),
        "127.0.0.1:notaport/db".to_owned(),
        String::new(),
        format!("[::1:{port}/db"),
        format!("127.0.0.1:{port},127.0.0.1:{port}/"),
        format!("127.0.0.1:{port}/db?sslmode=bogus&x=a@b"),
        format!("127.0.0.1:{port}/%zz"),
    ];
    // The shapes first met: a slash missing after the scheme.
    let mut all = vec![
        format!("postgres:/u:{secret}@127.0.0.1:{port}/db"),
        format!("postgres//u:{secret}@127.0.0.1:{port}/db"),
        format!("redis:/:{secret}@127.0.0.1:{port}"),
        format!("amqp:/u:{secret}@127.0.0.1:{port}"),
    ];
    for scheme in schemes {
        for separator in separators {
            for credential in &credentials {
                for tail in &tails {
                    all.push(format!("{scheme}{separator}{credential}{tail}"));
                }
            }
        }
    }
    for scheme in schemes {
        for shape in [
            format!(" {scheme}://u:{secret}@127.0.0.1:{port}/db"),
            format!("{scheme}://u:{secret}@127.0.0.1:{port}/db\n"),
            format!("{scheme}://u:{secret} @127.0.0.1:{port}/db"),
            format!("{scheme}://u:{secret}@127.0.0.1:{port}:{port}/db"),
            format!("{scheme}://u:{secret}@"),
            format!("{scheme}://u:{secret}@@127.0.0.1:{port}/db"),
            format!("{scheme}://127.0.0.1:{port}/db?password={secret}"),
            format!("{scheme}://127.0.0.1:{port}/db?user=u&PASSWORD={secret}&sslmode=bogus"),
            format!("{scheme}://u:{secret}@127.0.0.1:{port}/db?password={secret}"),
            format!("{scheme}://u:{secret}@127.0.0.1:{port}/db#frag"),
            format!("{scheme}://u%3A:{secret}@127.0.0.1:{port}/db"),
            format!("u:{secret}@127.0.0.1:{port}://x"),
            format!("{scheme}-u:{secret}@127.0.0.1://x"),
            format!("{scheme}:u:{secret}@127.0.0.1:{port}"),
        ] {
            all.push(shape);
        }
    }
    all
}

/// A line saying where `text` shows `secret`, if it does.
fn leak(secret: &str, url: &str, what: &str, text: &str) -> Option<String> {
    forbidden(secret)
        .into_iter()
        .find(|shown| text.contains(shown))
        .map(|shown| format!("{what} shows {shown:?} of {url:?}: {}", text.trim_end()))
}

/// Fails listing every leak (the first 30 of them).
#[track_caller]
fn assert_no_leaks(leaks: &[String]) {
    assert!(
        leaks.is_empty(),
        "{} leaks:\n{}",
        leaks.len(),
        leaks
            .iter()
            .take(30)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// Whatever the library says about `url`: the errors of the builders and,
/// for a URL they accept, of a first operation.
async fn library_errors(url: String) -> Vec<(&'static str, String)> {
    let timeout = Duration::from_millis(300);
    let mut said = Vec::new();
    let mut say = |what: &'static str, error: &dyn std::fmt::Debug, display: String| {
        said.push((what, display));
        said.push((what, format!("{error:?}")));
    };
    match RedisTransport::builder()
        .timeout(timeout)
        .reconnect_attempts(0)
        .connect(&url)
        .await
    {
        Err(error) => say("RedisTransport::connect", &error, error.to_string()),
        Ok(_) => panic!("{url:?}: nothing listens there"),
    }
    match AmqpTransport::builder()
        .timeout(timeout)
        .reconnect_attempts(0)
        .connect(&url)
        .await
    {
        Err(error) => say("AmqpTransport::connect", &error, error.to_string()),
        Ok(_) => panic!("{url:?}: nothing listens there"),
    }
    match RedisStore::builder()
        .timeout(timeout)
        .reconnect_attempts(0)
        .connect_lazy(&url)
    {
        Err(error) => say("RedisStore::connect_lazy", &error, error.to_string()),
        Ok(store) => match store.ping().await {
            Err(error) => say("RedisStore::ping", &error, error.to_string()),
            Ok(()) => panic!("{url:?}: nothing listens there"),
        },
    }
    match PostgresStore::builder()
        .acquire_timeout(timeout)
        .connect_lazy(&url)
    {
        Err(error) => say("PostgresStore::connect_lazy", &error, error.to_string()),
        Ok(store) => match store.table_exists().await {
            Err(error) => say("PostgresStore::table_exists", &error, error.to_string()),
            Ok(_) => panic!("{url:?}: nothing listens there"),
        },
    }
    said
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_library_error_shows_the_password_of_a_malformed_url() {
    let port = closed_port();
    let mut checked = 0;
    let mut leaks = Vec::new();
    for secret in SECRETS {
        let urls = shapes(secret, port);
        // A few at a time: most fail at once, the parseable ones at their
        // connection.
        for chunk in urls.chunks(64) {
            let mut tasks = tokio::task::JoinSet::new();
            for url in chunk {
                let url = url.clone();
                tasks.spawn(async move { (url.clone(), library_errors(url).await) });
            }
            while let Some(done) = tasks.join_next().await {
                let (url, said) = done.expect("no panic");
                for (what, text) in said {
                    leaks.extend(leak(secret, &url, what, &text));
                    checked += 1;
                }
            }
        }
    }
    assert_no_leaks(&leaks);
    assert!(checked > 10_000, "{checked} errors checked");
}

/// The binary's output for `args`.
fn cli(args: &[&str]) -> (i32, String, String) {
    let output = Command::new(BIN)
        .args(args)
        .env("RUST_BACKTRACE", "1")
        .stdin(Stdio::null())
        .output()
        .expect("run babel-idem");
    (
        output.status.code().expect("exited, not killed"),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn no_command_shows_the_password_of_a_malformed_url() {
    let port = closed_port();
    let outbox = std::env::temp_dir().join(format!(
        "bi-cli-secrets-{}.db",
        uuid::Uuid::new_v4().simple()
    ));
    let outbox = format!("sqlite://{}", outbox.display());
    let (code, _, stderr) = cli(&["migrate", &outbox, "--outbox"]);
    assert_eq!(code, 0, "{stderr}");
    let mut runs = 0;
    let mut leaks = Vec::new();
    // Two passwords, and a spread of the shapes: the library's test above
    // reads every shape; this one checks what the binary adds (its own URL
    // parsing, the lines it writes).
    for secret in [SECRETS[0], SECRETS[3]] {
        let urls = shapes(secret, port);
        let sample: Vec<&String> = urls
            .iter()
            .enumerate()
            .filter(|(n, _)| *n < 4 || n % 149 == 0)
            .map(|(_, url)| url)
            .collect();
        for url in sample {
            let url = url.as_str();
            for args in [
                vec!["--timeout", "300ms", "seen", url, "id-1"],
                vec!["--timeout", "300ms", "outbox", "stats", url],
                vec![
                    "--timeout",
                    "300ms",
                    "dlq",
                    "stats",
                    "--redis",
                    url,
                    "q.dlq",
                ],
                vec!["--timeout", "300ms", "dlq", "list", "--amqp", url, "q.dlq"],
                vec![
                    "--timeout",
                    "300ms",
                    "redrive",
                    "--redis",
                    url,
                    "--from",
                    "q.dlq",
                    "--forget-in",
                    url,
                ],
                vec![
                    "--timeout",
                    "300ms",
                    "relay",
                    "--drain",
                    "--outbox",
                    &outbox,
                    "--amqp",
                    url,
                ],
                vec!["--json", "--timeout", "300ms", "stats", url],
            ] {
                let (code, stdout, stderr) = cli(&args);
                assert_ne!(code, 0, "{args:?} cannot succeed: {stdout}{stderr}");
                leaks.extend(leak(secret, url, "stdout", &stdout));
                leaks.extend(leak(secret, url, "stderr", &stderr));
                assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
                runs += 1;
            }
        }
    }
    if let Some(path) = outbox.strip_prefix("sqlite://") {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{path}{suffix}"));
        }
    }
    assert_no_leaks(&leaks);
    assert!(runs > 100, "{runs} runs");
}
