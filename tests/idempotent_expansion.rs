//! The expansion of `#[idempotent]` for a representative handler, compared
//! to the checked-in snapshot `tests/idempotent/expansion.snap`, so that any
//! change to the generated code shows up in review.
//!
//! The macro's modules are compiled here as a plain library (they only use
//! `proc_macro2`, which works outside a compiler invocation). After an
//! intended change, regenerate the snapshot with
//! `UPDATE_SNAPSHOTS=1 cargo test --test idempotent_expansion` and review it.

#[allow(dead_code)]
#[path = "../babel-idem-macros/src/attr.rs"]
mod attr;
#[allow(dead_code)]
#[path = "../babel-idem-macros/src/expand.rs"]
mod expand;
#[allow(dead_code)]
#[path = "../babel-idem-macros/src/message.rs"]
mod message;
#[allow(dead_code)]
#[path = "../babel-idem-macros/src/transaction.rs"]
mod transaction;

use std::path::Path;

use proc_macro2::TokenStream;

const SNAPSHOT: &str = "tests/idempotent/expansion.snap";

/// A handler that uses every argument and every part of a signature the
/// macro must keep: docs, another attribute, visibility, lifetimes,
/// generics, a `where` clause, a `mut` pattern, an inner attribute, `?` and
/// `return`.
const ARGS: &str = r#"store = STORE, scope = "billing", on_remember_failure = ReturnError"#;
const HANDLER: &str = r#"
/// Charges the order once, however often it is delivered.
#[tracing::instrument(skip_all)]
pub(crate) async fn on_order_created<'a, C>(env: &'a Envelope, mut charges: C) -> Result<(), BillingError>
where
    C: Charges + Send,
{
    #![allow(clippy::needless_return)]
    let amount = env.data["amount"].as_u64().ok_or(BillingError::NoAmount)?;
    if amount == 0 {
        return Ok(());
    }
    charges.charge(amount).await
}
"#;

fn tokens(source: &str) -> TokenStream {
    source
        .parse()
        .expect("the test's source is valid Rust tokens")
}

fn expand(args: &str, item: &str) -> TokenStream {
    expand::idempotent(tokens(args), tokens(item))
}

fn pretty(expanded: TokenStream) -> String {
    let file: syn::File = syn::parse2(expanded).expect("the expansion parses as Rust");
    prettyplease::unparse(&file)
}

/// Compares `actual` to the snapshot at `snapshot` (rewriting it first
/// under `UPDATE_SNAPSHOTS=1`).
fn assert_snapshot(snapshot: &str, actual: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(snapshot);
    if std::env::var_os("UPDATE_SNAPSHOTS").is_some() {
        std::fs::write(&path, actual).expect("the snapshot is writable");
    }
    let expected = std::fs::read_to_string(&path).expect("the snapshot exists");
    assert!(
        actual == expected,
        "the expansion changed; if intended, rerun with UPDATE_SNAPSHOTS=1 and review \
         {snapshot}\n--- expected\n{expected}\n--- actual\n{actual}"
    );
}

#[test]
fn expansion_matches_the_snapshot() {
    assert_snapshot(SNAPSHOT, &pretty(expand(ARGS, HANDLER)));
}

/// Transactional mode: the connection parameter is marked on, then handed
/// back to the body under its own name.
const TRANSACTION_SNAPSHOT: &str = "tests/idempotent/expansion_transaction.snap";
const TRANSACTION_ARGS: &str = "store = self.store, transaction = tx";
const TRANSACTION_HANDLER: &str = r#"
async fn on_credit(&self, env: Envelope, mut tx: &mut sqlx::Transaction<'_, Sqlite>) -> anyhow::Result<()> {
    credit(&mut **tx, &env).await?;
    Ok(())
}
"#;

#[test]
fn transactional_expansion_matches_the_snapshot() {
    let actual = pretty(expand(TRANSACTION_ARGS, TRANSACTION_HANDLER));
    assert_snapshot(TRANSACTION_SNAPSHOT, &actual);
    assert_eq!(actual.matches("credit(&mut **tx, &env)").count(), 1);
    assert!(
        actual.contains("mut tx: &mut sqlx::Transaction<'_, Sqlite>,"),
        "{actual}"
    );
    assert!(actual.contains("move |mut tx| async move {"), "{actual}");
}

#[test]
fn the_body_is_quoted_once_and_the_signature_kept() {
    let expanded = pretty(expand(ARGS, HANDLER));
    assert_eq!(expanded.matches("charges.charge(amount)").count(), 1);
    assert!(expanded.contains("/// Charges the order once, however often it is delivered."));
    assert!(expanded.contains("#[tracing::instrument(skip_all)]"));
    assert!(expanded.contains(
        "pub(crate) async fn on_order_created<'a, C>(\n    env: &'a Envelope,\n    mut charges: C,\n) -> Result<(), BillingError>\nwhere\n    C: Charges + Send,"
    ));
    assert_eq!(expanded.matches("async move").count(), 1);
    assert!(
        expanded.contains("C: Charges + Send,\n{\n    #![allow(clippy::needless_return)]\n"),
        "the inner attribute opens the body again: {expanded}"
    );
    assert!(!expanded.contains("static "), "no hidden statics");
    assert_eq!(expanded.matches("fn ").count(), 1, "no nested fn");
}

/// Malformed input never panics: it gives the original item back, followed
/// by a `compile_error!`, so the rest of the crate still sees the function.
#[test]
fn malformed_input_keeps_the_item_and_adds_an_error() {
    let item = "async fn on_order(env: Envelope) -> Result<(), StoreError> { Ok(()) }";
    let cases = [
        ("", item),
        ("store", item),
        ("store =", item),
        ("store = STORE,, scope = \"x\"", item),
        ("store = STORE, scope = 7", item),
        ("store = STORE, message = 1", item),
        ("store = STORE, on_remember_failure = \"ReturnError\"", item),
        ("store = STORE, scope = \"a\", scope = \"b\"", item),
        ("store = STORE, transaction = tx", item),
        ("store = STORE, transaction = env", item),
        ("store = STORE, transaction = \"tx\"", item),
        ("= STORE", item),
        (
            "store = STORE",
            "fn on_order(env: Envelope) -> Result<(), StoreError> { Ok(()) }",
        ),
        (
            "store = STORE",
            "async fn on_order(env: Envelope) -> impl Sized { Ok(()) }",
        ),
        (
            "store = STORE",
            "async fn on_order() -> Result<(), StoreError> { Ok(()) }",
        ),
        (
            "store = STORE",
            "async fn on_order(a: Envelope, b: Envelope) -> Result<(), StoreError> { Ok(()) }",
        ),
        (
            "store = STORE",
            "async fn on_order(env: Envelope) -> Result<(), StoreError>;",
        ),
        ("store = STORE", "struct NotAFunction;"),
        (
            "store = STORE",
            "async fn half_written(env: Envelope) -> Result<(), StoreError> { let x = ; }",
        ),
    ];
    for (args, item) in cases {
        let output = expand(args, item).to_string();
        let original = tokens(item).to_string();
        assert!(
            output.starts_with(&original),
            "`{args}` on `{item}` keeps the item: {output}"
        );
        assert!(
            output.contains("compile_error"),
            "`{args}` on `{item}` is an error: {output}"
        );
    }
}

#[test]
fn every_mistake_of_one_attribute_is_reported() {
    let output = expand(
        "scope = \"\", ttl = 5",
        "fn on_order(a: Envelope, b: Envelope) {}",
    )
    .to_string();
    for mistake in ["must not be empty", "unknown argument `ttl`"] {
        assert!(output.contains(mistake), "{mistake}: {output}");
    }

    let output = expand("store = STORE", "fn on_order(a: Envelope, b: Envelope) {}").to_string();
    for mistake in [
        "`async fn` only",
        "returns nothing",
        "2 parameters are of type `Envelope`",
    ] {
        assert!(output.contains(mistake), "{mistake}: {output}");
    }
}
