//! Which shared servers the store tests may use, from the environment.
//!
//! - `BABEL_IDEM_REDIS_URL`, `BABEL_IDEM_REDIS_CLUSTER_URL`, `BABEL_IDEM_POSTGRES_URL`:
//!   the servers to test against. Unset: the test prints a visible `skipped:` line and passes.
//! - `BABEL_IDEM_REQUIRE_SERVERS=1` (CI): an unset URL is a failure instead.

use std::env;

pub const REDIS_URL: &str = "BABEL_IDEM_REDIS_URL";
/// A Redis Cluster's seed nodes, `redis+cluster://host:port,host:port/`.
pub const REDIS_CLUSTER_URL: &str = "BABEL_IDEM_REDIS_CLUSTER_URL";
pub const POSTGRES_URL: &str = "BABEL_IDEM_POSTGRES_URL";
pub const REQUIRE_SERVERS: &str = "BABEL_IDEM_REQUIRE_SERVERS";

/// Whether a missing or unreachable server fails the run (CI) rather than
/// skipping the test (a laptop without servers).
pub fn servers_required() -> bool {
    env::var(REQUIRE_SERVERS).is_ok_and(|value| value == "1")
}

/// The URL in `variable`, or `None` after saying on stderr that `test` is
/// skipped. Panics when servers are required.
pub fn server_url(variable: &str, test: &str) -> Option<String> {
    match env::var(variable) {
        Ok(url) if !url.trim().is_empty() => Some(url),
        _ if servers_required() => {
            panic!("{test}: {variable} is not set, and {REQUIRE_SERVERS}=1 requires it")
        }
        _ => {
            eprintln!("skipped: {test}: {variable} not set");
            None
        }
    }
}

/// Says `test` is skipped for `reason`, or panics when servers are required.
pub fn skip_or_fail(test: &str, reason: &str) {
    if servers_required() {
        panic!("{test}: {reason}, and {REQUIRE_SERVERS}=1 requires it");
    }
    // Past the test harness's capture, so the line shows when the test passes.
    let _ = std::io::Write::write_fmt(
        &mut std::io::stderr(),
        format_args!("skipped: {test}: {reason}\n"),
    );
}

/// A short random suffix that keeps one test run's keys and tables apart
/// from every other run against the same server.
pub fn unique_suffix() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..12].to_owned()
}
