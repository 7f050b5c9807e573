//! `cargo check`, what editors and CI run, rejects a malformed `urn!`
//! literal with an error on the literal. This runs the real `cargo check` on
//! a scratch crate that depends on this workspace's `babel-idem`: first with
//! a well-formed literal (it passes, so the crate itself is sound), then with
//! a malformed one (it fails, and says what is wrong and where).
//!
//! The scratch crate and its build output live under the target directory,
//! so after the first run only the scratch crate itself is checked again.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const WELL_FORMED: &str = r#"fn main() {
    let created = babel_idem::urn!("urn:babel:orders:created");
    println!("{created}");
}
"#;

const MALFORMED: &str = r#"fn main() {
    let created = babel_idem::urn!("urn:babel:orders created");
    println!("{created}");
}
"#;

fn workspace() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target"))
}

/// Writes the scratch crate (a workspace of its own, locked to this
/// workspace's dependency versions so it checks offline) and returns its
/// directory.
fn scratch_crate() -> PathBuf {
    let dir = target_dir().join("urn-cargo-check").join("scratch");
    fs::create_dir_all(dir.join("src")).expect("the scratch directory is writable");
    let runtime = workspace().join("babel-idem");
    fs::write(
        dir.join("Cargo.toml"),
        format!(
            "[package]\nname = \"urn-cargo-check\"\nversion = \"0.0.0\"\nedition = \"2024\"\n\
             publish = false\n\n[dependencies]\n\
             babel-idem = {{ path = {runtime:?}, default-features = false }}\n\n[workspace]\n"
        ),
    )
    .expect("the scratch manifest is writable");
    fs::copy(workspace().join("Cargo.lock"), dir.join("Cargo.lock"))
        .expect("the workspace lock file is readable");
    dir
}

fn cargo_check(dir: &Path, main_rs: &str) -> Output {
    fs::write(dir.join("src/main.rs"), main_rs).expect("the scratch main.rs is writable");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    Command::new(cargo)
        .current_dir(dir)
        .args(["check", "--offline", "--color", "never"])
        .env(
            "CARGO_TARGET_DIR",
            target_dir().join("urn-cargo-check").join("target"),
        )
        .output()
        .expect("cargo runs")
}

#[test]
fn cargo_check_rejects_a_malformed_urn_literal_on_the_literal() {
    let dir = scratch_crate();

    let control = cargo_check(&dir, WELL_FORMED);
    assert!(
        control.status.success(),
        "the well-formed scratch crate must pass `cargo check`:\n{}",
        String::from_utf8_lossy(&control.stderr)
    );

    let output = cargo_check(&dir, MALFORMED);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "`cargo check` passed:\n{stderr}");
    for expected in [
        "error: malformed URN: the namespace-specific string (NSS) holds a character that must be percent-encoded",
        "found ' ' at byte 16",
        // Line 2, column 36: the string literal inside `urn!(...)`.
        "src/main.rs:2:36",
    ] {
        assert!(
            stderr.contains(expected),
            "missing `{expected}` in:\n{stderr}"
        );
    }
    assert!(
        !stderr.contains("E0080"),
        "the literal is checked by the macro, not by const evaluation:\n{stderr}"
    );
}
