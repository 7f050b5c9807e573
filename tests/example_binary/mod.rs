//! The binary of one of the root package's examples, built with cargo for
//! the profile the calling test binary was built in (cargo does nothing
//! when the binary is fresh), so a test never runs a stale example.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Builds the example `name` with `cargo_args` (its features, such as
/// `["--all-features"]`) and returns the path of its binary.
pub fn build(name: &str, cargo_args: &[&str]) -> PathBuf {
    // target/<profile>/deps/<test>-<hash> -> target/<profile>
    let profile_dir = std::env::current_exe()
        .expect("the test binary's path")
        .parent()
        .and_then(Path::parent)
        .expect("the test binary lives in target/<profile>/deps")
        .to_owned();
    let mut cargo = Command::new(env!("CARGO"));
    cargo
        .args(["build", "--quiet", "--example", name])
        .args(cargo_args);
    if profile_dir.ends_with("release") {
        cargo.arg("--release");
    }
    let status = cargo.status().expect("run cargo to build the example");
    assert!(status.success(), "cargo build --example {name} failed");
    profile_dir
        .join("examples")
        .join(format!("{name}{}", std::env::consts::EXE_SUFFIX))
}
