//! `examples/typed.rs` as a user runs it: in process without a broker, on
//! a real Redis when `BABEL_IDEM_REDIS_URL` is set (the order charged once
//! for its two deliveries, the shipment handled, the invalid order refused
//! before publishing, exit 0), and its checked-in registry folder
//! (`examples/schemas`) being exactly what `--export` writes from the types.
//!
//! Environment: `BABEL_IDEM_REDIS_URL` for the Redis run; without it that
//! test prints `skipped:`, and with `BABEL_IDEM_REQUIRE_SERVERS=1` fails.
//! A test run that did not build the example builds it first.
#![cfg(all(feature = "schemars", feature = "redis-transport"))]

mod example_binary;
#[allow(dead_code, unreachable_pub)]
#[path = "../babel-idem/tests/store_contract/servers.rs"]
mod servers;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

use serde_json::Value;
use servers::{REDIS_URL, server_url};

/// The example's binary, built once per test run.
fn example() -> &'static Path {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY
        .get_or_init(|| example_binary::build("typed", &["--features", "schemars,redis-transport"]))
}

/// Runs the example with `args`, `BABEL_IDEM_REDIS_URL` set to `redis` or
/// unset; its output, checked for a panic.
fn run(args: &[&str], redis: Option<&str>) -> Output {
    let mut command = Command::new(example());
    command
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    match redis {
        Some(url) => command.env("BABEL_IDEM_REDIS_URL", url),
        None => command.env_remove("BABEL_IDEM_REDIS_URL"),
    };
    let output = command.output().expect("start the example");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("panicked"), "a panic: {stderr}");
    output
}

/// The example's last line, its JSON summary, after checking it exited 0.
fn summary(output: &Output) -> Value {
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the example failed: {stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let last = stdout
        .lines()
        .last()
        .expect("the example printed a summary");
    serde_json::from_str(last).unwrap_or_else(|e| panic!("{e}: {last}"))
}

/// What every run of the example reports, whatever the broker.
fn assert_one_charge_one_shipment(summary: &Value, broker: &str) {
    assert_eq!(summary["broker"], broker, "{summary}");
    assert_eq!(summary["delivered"], 3, "the order twice and the shipment");
    assert_eq!(summary["charged"], 1, "the redelivery was skipped");
    assert_eq!(summary["shipped"], 1);
    assert_eq!(
        summary["refused"],
        "data for 'urn:babel:orders:placed' does not match its URN schema: \
         lines[0].qty: below_minimum"
    );
}

#[test]
fn without_a_broker_the_example_dispatches_in_process_and_charges_once() {
    let output = run(&[], None);
    let summary = summary(&output);
    assert_one_charge_one_shipment(&summary, "none");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("BABEL_IDEM_REDIS_URL is not set"),
        "it says what it needs for a broker: {stdout}"
    );
}

#[test]
fn on_redis_the_example_publishes_and_consumes_and_charges_once() {
    let Some(url) = server_url(REDIS_URL, "typed_example_redis") else {
        return;
    };
    let summary = summary(&run(&[], Some(&url)));
    assert_one_charge_one_shipment(&summary, "redis");
}

#[test]
fn the_checked_in_registry_is_what_the_types_export() {
    let folder = std::env::temp_dir().join(format!(
        "babel-idem-typed-export-{}",
        uuid::Uuid::new_v4().simple()
    ));
    let output = run(&["--export", folder.to_str().unwrap()], None);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let checked_in = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/schemas");
    let files = |dir: &Path| -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|entry| entry.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    };
    let names = files(&folder);
    assert_eq!(
        names,
        [
            "babel.orders.placed.json",
            "babel.orders.shipped.json",
            "registry.json"
        ]
    );
    assert_eq!(files(&checked_in), names);
    // Compared as JSON: serde_json writes an object's keys sorted, or in
    // insertion order when another crate of the build turns on its
    // `preserve_order`.
    let read = |path: PathBuf| -> Value {
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    };
    for name in &names {
        assert_eq!(
            read(checked_in.join(name)),
            read(folder.join(name)),
            "examples/schemas/{name} is stale: rerun the example with --export examples/schemas"
        );
    }
    std::fs::remove_dir_all(&folder).unwrap();
}

#[test]
fn an_unknown_flag_is_a_usage_error() {
    let output = run(&["--bogus"], None);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("usage: typed"));
}
