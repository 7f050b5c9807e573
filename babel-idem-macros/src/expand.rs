//! The rewrite: the handler keeps its signature; its body moves into one
//! `async move` block that a guard runs.
//!
//! For
//!
//! ```text
//! #[idempotent(store = STORE, scope = "billing")]
//! pub async fn on_order(env: Envelope) -> Result<(), BillingError> { BODY }
//! ```
//!
//! the output is
//!
//! ```text
//! pub async fn on_order(env: Envelope) -> Result<(), BillingError> {
//!     // The store, found by auto-deref (a `LazyLock` static, an `Arc`...).
//!     let __babel_idem_store = &(STORE);
//!     let __babel_idem_store = {
//!         let (__babel_idem_store, __babel_idem_checked) = {
//!             use ::babel_idem::__private::ResolveStore as _;
//!             (&&&::babel_idem::__private::StoreRef(__babel_idem_store)).resolve()
//!         };
//!         // Never runs: a `store` that is not a `Store` fails here, once.
//!         let _ = || ::babel_idem::__private::Guard::new(__babel_idem_checked);
//!         __babel_idem_store
//!     };
//!     let __babel_idem_guard = ::babel_idem::__private::Guard::new(__babel_idem_store).scope("billing");
//!     // Never runs: a return type that is not `Result<(), E: From<StoreError>>` fails here, once.
//!     let _ = |error: ::babel_idem::__private::StoreError| -> Result<(), BillingError> {
//!         ::core::result::Result::<(), _>::Err(::core::convert::Into::into(error))
//!     };
//!     let __babel_idem_key = __babel_idem_guard.key(&env);
//!     {
//!         use ::babel_idem::__private::RunGuarded as _;
//!         (&&::babel_idem::__private::Outcome::<Result<(), BillingError>>::OF)
//!             .run(&__babel_idem_guard, __babel_idem_key, async move { BODY })
//!     }
//!     .await
//! }
//! ```
//!
//! With `lease = EXPR` (claim mode) the lease is evaluated after the key,
//! `let __babel_idem_lease: Duration = EXPR;`, and
//! `let __babel_idem_guard = __babel_idem_guard.lease(__babel_idem_lease);`
//! leases the guard, and `HandlerResult::run_claimed(guard, key, body)` runs
//! the body under it (or returns a refused lease as the handler's error).
//!
//! With `transaction = tx` (transactional mode) the store is resolved as a
//! `TransactionalStore` (checked with `Guard::transactional`), and the body
//! runs in a closure that gets the connection back under its own name:
//! `guard.transactional().run_keyed(key, tx, move |tx| async move { BODY })`.
//! `Guard::run_keyed`'s own (public) bounds check the connection's type.
//!
//! - The store expression is evaluated and the key taken before the
//!   `async move` block takes ownership of the parameters, so a body may move
//!   or mutate the message, and `&mut self` works with
//!   `store = self.shared.clone()`.
//! - `Outcome::<R>` pins the block's output to the declared return type, so
//!   `?` and `return` infer. When `R` is `Result<(), E>` with
//!   `E: From<StoreError>` it runs the body under the guard; otherwise the
//!   closure above it is the one error, and nothing else fails.
//! - The same for the store: a value that is no `Store` gives the guard a
//!   placeholder, and the closure that checks the value is the one error.
//!   Every error names public items only (`Store`, `Guard::new`, `From`).
//! - The `__babel_idem_*` locals use mixed-site hygiene: the body cannot see
//!   them or be shadowed by them.

use proc_macro2::{Span, TokenStream, TokenTree};
use quote::{ToTokens, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{
    AttrStyle, Expr, GenericArgument, Ident, ItemFn, LitStr, PathArguments, ReturnType,
    TraitItemFn, Type,
};

use crate::attr::Args;
use crate::message::{self, Message};
use crate::transaction::{self, Connection};

/// The whole attribute: `args` and `item` as the compiler hands them over.
/// Never panics: every mistake becomes a `compile_error!` next to the
/// original item, so the rest of the crate (and an editor) still sees the
/// function.
pub(crate) fn idempotent(args: TokenStream, item: TokenStream) -> TokenStream {
    match parse_and_expand(args, item.clone()) {
        Ok(expanded) => expanded,
        Err(error) => {
            let error = error.into_compile_error();
            quote! { #item #error }
        }
    }
}

fn parse_and_expand(args: TokenStream, item: TokenStream) -> syn::Result<TokenStream> {
    let args = syn::parse2::<Args>(args);
    let function = syn::parse2::<ItemFn>(item.clone()).map_err(|error| not_a_function(item, error));
    let (args, function) = match (args, function) {
        (Ok(args), Ok(function)) => (args, function),
        (args, function) => return Err(combine([args.err(), function.err()])),
    };
    let handler = check(&args, &function)?;
    Ok(expand(function, handler))
}

/// The error for an item that is not a function with a body; a trait's
/// method declaration gets a hint of its own.
fn not_a_function(item: TokenStream, error: syn::Error) -> syn::Error {
    if let Ok(TraitItemFn {
        default: None,
        semi_token: Some(semi),
        ..
    }) = syn::parse2::<TraitItemFn>(item)
    {
        return syn::Error::new(
            semi.span,
            "`#[idempotent]` needs the function's body: put it on the `async fn` of each \
             `impl`, not on the trait's declaration",
        );
    }
    syn::Error::new(
        error.span(),
        format!("`#[idempotent]` goes on an `async fn` with a body: {error}"),
    )
}

/// What the checks found out about the handler: everything the rewrite needs
/// besides the function itself.
struct Handler {
    /// The `store = ...` expression.
    store: Expr,
    /// The parameter (or `self`) whose id is the dedupe key.
    message: Message,
    /// The declared return type, the `R` of `Outcome`.
    output: Type,
    scope: Option<LitStr>,
    on_remember_failure: Option<Ident>,
    /// The claim-mode lease expression, if any.
    lease: Option<Expr>,
    /// The transactional-mode connection parameter, if any.
    connection: Option<Connection>,
}

/// Every check that does not need the type checker, all reported at once.
fn check(args: &Args, function: &ItemFn) -> syn::Result<Handler> {
    let sig = &function.sig;
    let asyncness = match sig.asyncness {
        Some(_) => Ok(()),
        None => Err(syn::Error::new(
            sig.fn_token.span,
            format!(
                "`#[idempotent]` works on an `async fn` only: write `async fn {}`; the guard \
                 awaits the store before it runs the body",
                sig.ident
            ),
        )),
    };
    let store = args.store().cloned();
    let output = declared_output(&sig.output, &sig.ident);
    let message = message::pick(sig, args.message.as_ref());
    let connection = args
        .transaction
        .as_ref()
        .map(|name| transaction::pick(sig, name))
        .transpose();

    match (asyncness, store, output, message, connection) {
        (Ok(()), Ok(store), Ok(output), Ok(message), Ok(connection)) => Ok(Handler {
            store,
            message,
            output,
            scope: args.scope.clone(),
            on_remember_failure: args.on_remember_failure.clone(),
            lease: args.lease.clone(),
            connection,
        }),
        (asyncness, store, output, message, connection) => Err(combine([
            asyncness.err(),
            store.err(),
            output.err(),
            message.err(),
            connection.err(),
        ])),
    }
}

/// One error out of several, so a single compile reports every mistake.
fn combine<const N: usize>(errors: [Option<syn::Error>; N]) -> syn::Error {
    errors
        .into_iter()
        .flatten()
        .reduce(|mut first, next| {
            first.combine(next);
            first
        })
        .unwrap_or_else(|| syn::Error::new(Span::call_site(), "`#[idempotent]` failed"))
}

/// The declared return type, when it can be `Result<(), E>`: a path (a
/// `Result`, or an alias the macro cannot see into) whose success type, if
/// written, is `()`. Anything else is rejected here; a path that is not a
/// `Result` after all is rejected by the type checker through
/// the generated return-type check, as a mismatched-types error.
fn declared_output(output: &ReturnType, name: &Ident) -> syn::Result<Type> {
    let ty = match output {
        ReturnType::Type(_, ty) => &**ty,
        ReturnType::Default => {
            return Err(syn::Error::new(
                name.span(),
                format!(
                    "`{name}` returns nothing: an idempotent handler returns `Result<(), E>`, \
                     so a failure leaves the id unmarked and goes back for retry"
                ),
            ));
        }
    };

    let path = match strip_groups(ty) {
        Type::Path(path) if path.qself.is_none() => &path.path,
        other => {
            return Err(syn::Error::new_spanned(
                other,
                "an idempotent handler returns `Result<(), E>` (or an alias of it, such as \
                 `anyhow::Result<()>`)",
            ));
        }
    };
    if contains_impl_trait(ty.to_token_stream()) {
        return Err(syn::Error::new_spanned(
            ty,
            "`impl Trait` in an idempotent handler's return type cannot be named by the guard: \
             write the error type out",
        ));
    }
    if let Some(last) = path.segments.last()
        && last.ident == "Result"
        && let PathArguments::AngleBracketed(generics) = &last.arguments
        && let Some(GenericArgument::Type(success)) = generics.args.first()
        && !is_unit(success)
    {
        return Err(syn::Error::new_spanned(
            success,
            "an idempotent handler succeeds with `()`: a skipped duplicate has no value to \
             return, so return `Result<(), E>` and send results elsewhere",
        ));
    }
    Ok(ty.clone())
}

fn strip_groups(ty: &Type) -> &Type {
    match ty {
        Type::Paren(inner) => strip_groups(&inner.elem),
        Type::Group(inner) => strip_groups(&inner.elem),
        other => other,
    }
}

fn is_unit(ty: &Type) -> bool {
    matches!(strip_groups(ty), Type::Tuple(tuple) if tuple.elems.is_empty())
}

fn contains_impl_trait(tokens: TokenStream) -> bool {
    tokens.into_iter().any(|token| match token {
        TokenTree::Ident(ident) => ident == "impl",
        TokenTree::Group(group) => contains_impl_trait(group.stream()),
        _ => false,
    })
}

/// Writes the handler back with its body handed to a guard.
fn expand(function: ItemFn, handler: Handler) -> TokenStream {
    let ItemFn {
        attrs,
        vis,
        sig,
        block,
    } = function;
    let Handler {
        store: store_expr,
        message,
        output,
        scope,
        on_remember_failure,
        lease,
        connection,
    } = handler;

    // syn lifts a body's inner attributes (`#![allow(...)]`) into `attrs`;
    // they go back to the top of the body, where they still cover all of it.
    let (inner_attrs, outer_attrs): (Vec<_>, Vec<_>) = attrs
        .into_iter()
        .partition(|attr| matches!(attr.style, AttrStyle::Inner(_)));

    let store_span = store_expr.span();
    let output_span = output.span();

    // Hygienic locals: the body can neither see nor shadow them.
    let store = local("store");
    let guard = local("guard");
    let key = local("key");

    // The check's argument carries the store expression's own span (not a
    // mixed-site one), so the error points at the user's expression; it
    // lives in a block of its own, out of the body's sight.
    let checked = Ident::new("__babel_idem_checked", store_span);
    // Claim mode resolves a `ClaimStore` and checks `Guard::lease` instead,
    // so a store without the capability is one error with that trait's text.
    // Transactional mode resolves a `TransactionalStore` and checks
    // `Guard::transactional` the same way.
    let resolve_store = match (&lease, &connection) {
        (_, Some(_)) => quote_spanned! {store_span=>
            {
                use ::babel_idem::__private::ResolveTransactionalStore as _;
                (&&&::babel_idem::__private::StoreRef(#store)).resolve_transactional_store()
            }
        },
        (None, None) => quote_spanned! {store_span=>
            {
                use ::babel_idem::__private::ResolveStore as _;
                (&&&::babel_idem::__private::StoreRef(#store)).resolve()
            }
        },
        (Some(_), None) => quote_spanned! {store_span=>
            {
                use ::babel_idem::__private::ResolveClaimStore as _;
                (&&&::babel_idem::__private::StoreRef(#store)).resolve_claim_store()
            }
        },
    };
    let check_store = match (&lease, &connection) {
        (_, Some(_)) => quote_spanned! {store_span=>
            ::babel_idem::__private::Guard::new(#checked).transactional()
        },
        (None, None) => {
            quote_spanned! {store_span=> ::babel_idem::__private::Guard::new(#checked) }
        }
        (Some(_), None) => quote_spanned! {store_span=>
            ::babel_idem::__private::Guard::new(#checked).lease(::core::time::Duration::ZERO)
        },
    };
    let take_store = quote_spanned! {store_span=>
        let #store = &(#store_expr);
        let #store = {
            let (#store, #checked) = #resolve_store;
            // Type-checked, never run: the one place a `store` that is not a
            // `Store` is reported, with the `Store` trait's own message.
            let _ = || #check_store;
            #store
        };
    };
    // The guard's store is always a `Store` (see `take_store`), so its
    // configuration and use below cannot fail and add errors of their own.
    let scope = scope.map(|scope| quote!(.scope(#scope)));
    let policy = on_remember_failure.map(|policy| {
        quote_spanned!(policy.span()=>
            .on_remember_failure(::babel_idem::__private::OnRememberFailure::#policy)
        )
    });

    // A reference parameter is passed as it is: borrowing it would keep the
    // parameter itself alive in the future across every `.await`.
    let Message { name, is_reference } = message;
    let borrow = (!is_reference).then(|| quote_spanned!(name.span()=> &));
    let take_key = quote_spanned! {name.span()=>
        let #key = #guard.key(#borrow #name);
    };
    // Type-checked, never run: the one place a return type that is not
    // `Result<(), E>`, or an `E` without `From<StoreError>`, is reported, on
    // the return type, in the compiler's own words.
    let check_output = quote_spanned! {output_span=>
        let _ = |error: ::babel_idem::__private::StoreError| -> #output {
            ::core::result::Result::<(), _>::Err(::core::convert::Into::into(error))
        };
    };
    let run = match (lease, connection) {
        // Transactional mode: the guard marks the id on the connection
        // parameter, then hands it back to the body under its own name.
        (
            _,
            Some(Connection {
                name: connection,
                mutable,
                target,
            }),
        ) => {
            // Resolved through the parameter's own token, reported at its type.
            let argument = Ident::new(
                &connection.to_string(),
                connection.span().located_at(target.span()),
            );
            let mutable = mutable.then(|| quote!(mut));
            // `Guard::run_keyed` directly: its bounds are public, so a
            // parameter that is no connection of the store's database is
            // one error naming `AsConnection`.
            quote_spanned! {output_span=>
                let #guard = #guard.transactional();
                #guard.run_keyed(
                    #key,
                    #argument,
                    move |#mutable #connection| async move #block,
                )
                .await
            }
        }
        (None, None) => quote_spanned! {output_span=>
            {
                use ::babel_idem::__private::RunGuarded as _;
                (&&::babel_idem::__private::Outcome::<#output>::OF).run(&#guard, #key, async move #block)
            }
            .await
        },
        // Claim mode: the lease is evaluated with the store, before the body
        // takes the parameters; one out of range becomes the handler's error
        // at run time, and the body does not run.
        (Some(lease_expr), None) => {
            let lease = local("lease");
            let take_lease = quote_spanned! {lease_expr.span()=>
                let #lease: ::core::time::Duration = #lease_expr;
            };
            quote_spanned! {output_span=>
                #take_lease
                let #guard = #guard.lease(#lease);
                {
                    use ::babel_idem::__private::RunGuarded as _;
                    (&&::babel_idem::__private::Outcome::<#output>::OF)
                        .run_claimed(#guard, #key, async move #block)
                }
                .await
            }
        }
    };

    quote! {
        #(#outer_attrs)*
        #vis #sig {
            #(#inner_attrs)*
            #take_store
            let #guard = ::babel_idem::__private::Guard::new(#store) #scope #policy;
            #check_output
            #take_key
            #run
        }
    }
}

fn local(name: &str) -> Ident {
    Ident::new(&format!("__babel_idem_{name}"), Span::mixed_site())
}
