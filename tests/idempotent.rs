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
    inner_attributes => "idempotent/pass/inner_attributes.rs",
    lease => "idempotent/pass/lease.rs",
    methods => "idempotent/pass/methods.rs",
    patterns => "idempotent/pass/patterns.rs",
    results => "idempotent/pass/results.rs",
    scope_policy => "idempotent/pass/scope_policy.rs",
    signature => "idempotent/pass/signature.rs",
    store_expressions => "idempotent/pass/store_expressions.rs",
    trait_impl => "idempotent/pass/trait_impl.rs",
    tracing_stacked => "idempotent/pass/tracing_stacked.rs",
    transaction => "idempotent/pass/transaction.rs",
    typed_handler => "idempotent/pass/typed_handler.rs",
    visibility_generics => "idempotent/pass/visibility_generics.rs",
);

// rustc words a missing-trait error by the impls it can see, and those
// follow the backend features: the `.stderr` files are written for the
// default features, the ones `cargo test` builds. (The pass cases' behaviour
// runs above under every feature set.)
#[test]
#[cfg_attr(
    any(feature = "redis", feature = "postgres", feature = "consumer"),
    ignore = "the expected compiler output is for the default features: run `cargo test`"
)]
fn trybuild_cases() {
    let cases = trybuild::TestCases::new();
    cases.pass("tests/idempotent/pass/*.rs");
    cases.compile_fail("tests/idempotent/fail/*.rs");
}

/// The attribute adds no state to the handler's future: it is the size of
/// the same body behind a hand-written `Guard::run_keyed` call, for a
/// borrowed and for an owned envelope.
mod future_size {
    use std::sync::LazyLock;

    use babel_idem::{Envelope, Guard, InMemoryStore, StoreError, idempotent};

    static STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);

    #[idempotent(store = STORE)]
    async fn annotated_borrowed(env: &Envelope) -> Result<(), StoreError> {
        assert!(!env.urn().is_empty());
        Ok(())
    }

    async fn hand_written_borrowed(env: &Envelope) -> Result<(), StoreError> {
        let guard = Guard::new(&*STORE);
        let key = guard.key(env);
        guard
            .run_keyed(key, async move {
                assert!(!env.urn().is_empty());
                Ok(())
            })
            .await
    }

    #[idempotent(store = STORE)]
    async fn annotated_owned(env: Envelope) -> Result<(), StoreError> {
        assert!(!env.urn().is_empty());
        Ok(())
    }

    async fn hand_written_owned(env: Envelope) -> Result<(), StoreError> {
        let guard = Guard::new(&*STORE);
        let key = guard.key(&env);
        guard
            .run_keyed(key, async move {
                assert!(!env.urn().is_empty());
                Ok(())
            })
            .await
    }

    #[test]
    fn matches_a_hand_written_guard_call() {
        let env = Envelope::new("urn:babel:orders:created", serde_json::json!({}));
        assert_eq!(
            size_of_val(&annotated_borrowed(&env)),
            size_of_val(&hand_written_borrowed(&env)),
        );
        assert_eq!(
            size_of_val(&annotated_owned(env.clone())),
            size_of_val(&hand_written_owned(env)),
        );
    }
}
