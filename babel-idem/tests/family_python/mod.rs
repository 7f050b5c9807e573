//! The Python SDK's own answers for the family's formulas
//! (`tests/python/family_formulas.py`, run with `BABEL_IDEM_PYTHON`), for a
//! test to compare its own against.
#![allow(dead_code, unreachable_pub)]

#[path = "../store_contract/servers.rs"]
mod servers;

use std::io::Write;
use std::process::{Command, Stdio};

use serde_json::Value;

const PYTHON: &str = "BABEL_IDEM_PYTHON";
const SCRIPT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/python/family_formulas.py"
);

/// What `family_formulas.py <mode>` answers for `requests`, or `None`
/// after the skip line when `BABEL_IDEM_PYTHON` is not set (a failure with
/// `BABEL_IDEM_REQUIRE_SERVERS=1`).
pub fn ask(test: &str, mode: &str, requests: &Value) -> Option<Value> {
    let python = match std::env::var(PYTHON) {
        Ok(python) if !python.trim().is_empty() => python,
        _ => {
            servers::skip_or_fail(test, &format!("{PYTHON} not set (source .ci/python.sh)"));
            return None;
        }
    };
    let mut child = Command::new(&python)
        .arg(SCRIPT)
        .arg(mode)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|error| panic!("cannot run {python}: {error}"));
    let mut stdin = child.stdin.take().expect("piped stdin");
    stdin
        .write_all(requests.to_string().as_bytes())
        .expect("the script reads its requests");
    drop(stdin);
    let output = child.wait_with_output().expect("the script ends");
    assert!(
        output.status.success(),
        "family_formulas.py {mode} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Some(serde_json::from_slice(&output.stdout).expect("one JSON document"))
}
