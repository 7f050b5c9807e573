//! The one way the integration tests run a Python peer: the interpreter
//! from `BABEL_IDEM_PYTHON` (or a skip line), and one subcommand of a
//! script of `babel-idem/tests/python` run to its end with its JSON answer.
//! Self-contained: `consumer_support` includes it, and a test without
//! that module includes it by path.
#![allow(dead_code, unreachable_pub)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

/// The peer's python, or `None` after a `skipped:` line; with
/// `BABEL_IDEM_REQUIRE_SERVERS=1` a missing one fails the test instead.
pub fn python(test: &str) -> Option<PathBuf> {
    match std::env::var("BABEL_IDEM_PYTHON") {
        Ok(path) if !path.trim().is_empty() => Some(PathBuf::from(path)),
        _ => {
            let reason = "BABEL_IDEM_PYTHON is not set (source .ci/python.sh)";
            let required = std::env::var("BABEL_IDEM_REQUIRE_SERVERS").is_ok_and(|v| v == "1");
            assert!(
                !required,
                "{test}: {reason}, and BABEL_IDEM_REQUIRE_SERVERS=1 requires it"
            );
            // Past the test harness's capture, so the line shows when the test passes.
            let _ = std::io::Write::write_fmt(
                &mut std::io::stderr(),
                format_args!("skipped: {test}: {reason}\n"),
            );
            None
        }
    }
}

/// `babel-idem/tests/python`, from whichever package's test includes this
/// module: babel-idem's own tests, or the workspace root's.
fn scripts_dir() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    match env!("CARGO_PKG_NAME") {
        "babel-idem" => manifest.join("tests/python"),
        _ => manifest.join("babel-idem/tests/python"),
    }
}

/// Runs one subcommand of the peer `babel-idem/tests/python/<script>` to its
/// end (on a blocking thread, so a Rust worker can run beside it), with
/// `stdin` as its input; its JSON answer.
pub async fn peer(python: &Path, script: &str, args: Vec<String>, stdin: Option<Value>) -> Value {
    let python = python.to_path_buf();
    let script = scripts_dir().join(script);
    tokio::task::spawn_blocking(move || {
        let mut child = Command::new(&python)
            .arg(script)
            .args(&args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("start {python:?}: {e}"));
        let input = stdin.map(|v| v.to_string()).unwrap_or_default();
        std::io::Write::write_all(&mut child.stdin.take().unwrap(), input.as_bytes()).unwrap();
        let output = child.wait_with_output().unwrap();
        assert!(
            output.status.success(),
            "python peer {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
            panic!(
                "python peer {args:?} printed no JSON ({e}): {}",
                String::from_utf8_lossy(&output.stdout)
            )
        })
    })
    .await
    .unwrap()
}
