//! The exit codes a script can rely on, and the one-line error behind each.

use std::process::ExitCode;

/// The exit codes of `babel-idem`, as `exit_codes.txt` (shown by `--help`)
/// lists them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Ok = 0,
    NotSeen = 1,
    Usage = 2,
    Connect = 3,
    NotMigrated = 4,
    Store = 5,
}

impl From<Exit> for ExitCode {
    fn from(exit: Exit) -> Self {
        ExitCode::from(exit as u8)
    }
}

/// Why a command stopped: printed as one line on stderr, exits with `exit`.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub(crate) struct CliError {
    pub exit: Exit,
    message: String,
}

impl CliError {
    pub(crate) fn new(exit: Exit, message: impl Into<String>) -> Self {
        CliError {
            exit,
            message: message.into(),
        }
    }

    pub(crate) fn usage(message: impl Into<String>) -> Self {
        Self::new(Exit::Usage, message)
    }

    /// The message on one line: a backend error may carry newlines (a
    /// server's detail, a hint), and a script reads one line.
    pub(crate) fn one_line(&self) -> String {
        self.message
            .split(['\n', '\r'])
            .map(str::trim)
            .filter(|part| !part.is_empty())
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// A store command failed after the store was reached.
pub(crate) fn store_failed(error: babel_idem::StoreError) -> CliError {
    CliError::new(Exit::Store, error.to_string())
}
