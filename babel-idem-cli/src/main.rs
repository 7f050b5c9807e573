//! The `babel-idem` binary; see the `babel_idem_cli` crate docs.

fn main() -> std::process::ExitCode {
    babel_idem_cli::main()
}
