//! Compile-time checks of registration, each pinned by a trybuild case:
//! malformed URN literals (in `urn!`, `routes!` and `#[message(urn = ...)]`),
//! a message type without a URN, handler shapes that are not handlers, one
//! URN twice in a `routes!` table, by literals or by message types
//! (`tests/router/fail`); every accepted shape, typed handlers and
//! `#[idempotent]` included (`tests/router/pass`).
//!
//! The fail cases are a suite of their own: trybuild checks a suite without
//! pass cases with `cargo check` (one with pass cases, with `cargo build`),
//! so each of them, the URN comparisons `routes!` writes as constants
//! among them, fails `cargo check`, where editors and CI see it.
//!
//! Regenerate a fail case's expected output with
//! `TRYBUILD=overwrite cargo test --test router_ui`, then read the diff: the
//! error must point at the user's token and say what to write.

#[test]
fn router_mistakes_fail_cargo_check() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/router/fail/*.rs");
}

#[test]
fn router_accepted_shapes_compile_and_run() {
    let cases = trybuild::TestCases::new();
    cases.pass("tests/router/pass/*.rs");
}
