//! Runs babel-idem against a BabelQueue conformance folder and prints one
//! line per case.
//!
//! ```text
//! cargo run --example conformance -- ../shared/conformance
//! BABEL_IDEM_CONFORMANCE_DIR=../shared/conformance cargo run --example conformance
//! ```
//!
//! Exit status: 0 when every case passed, 1 when a case failed or the folder
//! cannot be run, 2 when no folder was given.

use std::path::PathBuf;
use std::process::ExitCode;

use babel_idem::conformance;

const ENV_VAR: &str = "BABEL_IDEM_CONFORMANCE_DIR";

fn main() -> ExitCode {
    // The argument wins over the environment, so a one-off run needs no unset.
    let Some(dir) = std::env::args_os()
        .nth(1)
        .or_else(|| std::env::var_os(ENV_VAR))
        .map(PathBuf::from)
    else {
        eprintln!("usage: conformance <folder with manifest.json>   (or set {ENV_VAR})");
        return ExitCode::from(2);
    };

    match conformance::run(&dir) {
        Ok(report) => {
            println!("{report}");
            if report.is_success() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(error) => {
            eprintln!("conformance: {error}");
            ExitCode::FAILURE
        }
    }
}
