//! Runs babel-idem against a BabelQueue conformance folder (a
//! `manifest.json` beside its fixtures) and prints one line per case.
//!
//! ```text
//! cargo run --features redis-transport,amqp-transport --example conformance -- babel-idem/tests/fixtures/conformance
//! ```
//!
//! `babel-idem/tests/fixtures/conformance` holds this repository's own cases; the
//! upstream BabelQueue suite's folder is passed the same way. The `redis`
//! and `rabbitmq` blocks are checked when their transport's feature is on;
//! every block of a binding babel-idem lacks is listed as `n/a`.
//!
//! Exit status: 0 when every case passed, 1 when a case failed or the folder
//! cannot be run, 2 when no folder was given.

use std::path::PathBuf;
use std::process::ExitCode;

use babel_idem::conformance;

fn main() -> ExitCode {
    let Some(dir) = std::env::args_os().nth(1).map(PathBuf::from) else {
        eprintln!(
            "usage: conformance <folder with manifest.json>   (this repository's own: babel-idem/tests/fixtures/conformance)"
        );
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
