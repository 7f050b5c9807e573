//! Compile-time checks of registration, each pinned by a trybuild case:
//! malformed URN literals, handler shapes that are not handlers, and one URN
//! twice in a `routes!` table (`tests/router/fail`); every accepted shape,
//! `#[idempotent]` included (`tests/router/pass`).

#[test]
fn router_compile_time_checks() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/router/fail/*.rs");
    cases.pass("tests/router/pass/*.rs");
}
