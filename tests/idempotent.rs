//! `#[idempotent]`: the trybuild suite (every pass case compiles and runs,
//! every fail case fails with the checked-in `.stderr`) and the pass cases'
//! behaviour, run again here as ordinary tests so a failure names the case.
//!
//! Regenerate a fail case's expected output with
//! `TRYBUILD=overwrite cargo test --test idempotent`, then read the diff: the
//! error must point at the user's token and say what to write.

// Each pass case is also a standalone program for trybuild, so each one
// includes `idempotent/support.rs` itself; here that file is loaded once per case.
#![allow(clippy::duplicate_mod)]

macro_rules! pass_cases {
    ($($case:ident => $path:literal),+ $(,)?) => {$(
        // The case's `main` is for trybuild; here `exercise` is the test.
        #[allow(dead_code)]
        #[path = $path]
        mod $case;

        #[tokio::test]
        async fn $case() {
            $case::exercise().await;
        }
    )+};
}

pass_cases!(
    custom_message => "idempotent/pass/custom_message.rs",
    free_fn => "idempotent/pass/free_fn.rs",
    methods => "idempotent/pass/methods.rs",
    patterns => "idempotent/pass/patterns.rs",
    results => "idempotent/pass/results.rs",
    scope_policy => "idempotent/pass/scope_policy.rs",
    signature => "idempotent/pass/signature.rs",
    store_expressions => "idempotent/pass/store_expressions.rs",
    trait_impl => "idempotent/pass/trait_impl.rs",
    tracing_stacked => "idempotent/pass/tracing_stacked.rs",
    visibility_generics => "idempotent/pass/visibility_generics.rs",
);

#[test]
fn trybuild_cases() {
    let cases = trybuild::TestCases::new();
    cases.pass("tests/idempotent/pass/*.rs");
    cases.compile_fail("tests/idempotent/fail/*.rs");
}
