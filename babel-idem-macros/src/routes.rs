//! `routes! { "urn" => handler, MessageType => handler, ... }`: a router
//! builder from a table in which no URN appears twice.
//!
//! A literal row's URN is checked like `urn!`'s, and two literal rows with
//! one text are an error here, on the second literal. A type row's URN is
//! `<Type as Message>::URN`, which only the compiler knows: for every pair of
//! rows that involves a type, the expansion writes a free constant,
//! `const _: () = assert!(!same_text(..., ...), "...");`, spanned on the
//! later row's key, which `cargo check` evaluates (a free constant is
//! evaluated whether or not anything uses it). The same type written twice
//! is caught here, without the constant.
//!
//! Every mistake in the table is reported, each on its own row. The
//! handlers are passed through untouched, so a function of the wrong shape
//! gets the `Handler` trait's error on the user's expression.

use std::collections::HashSet;

use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, quote, quote_spanned};
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{Expr, LitStr, Token, Type};

use crate::urn;

/// What one row looks like, said when a row is malformed.
const ROW: &str = "each row of `routes!` is `\"urn literal\" => handler` or \
                   `MessageType => handler`, as in `\"urn:babel:orders:created\" => on_order_created` \
                   or `OrderCreated => on_order_created`";

/// The end of every duplicate-URN message: what to do about it.
const KEEP_ONE: &str = "each URN gets exactly one handler, so keep one of the rows";

/// The whole macro: `input` as the compiler hands it over.
pub(crate) fn routes(input: TokenStream) -> TokenStream {
    syn::parse2::<Table>(input)
        .and_then(|table| expand(&table))
        .unwrap_or_else(|errors| {
            // One `compile_error!` per mistake; a block makes them one
            // expression, which is where `routes!` stands.
            let errors = errors.into_compile_error();
            quote!({ #errors })
        })
}

fn expand(table: &Table) -> syn::Result<TokenStream> {
    let mut errors: Option<syn::Error> = None;
    let mut push = |error: syn::Error| match &mut errors {
        Some(first) => first.combine(error),
        None => errors = Some(error),
    };

    let mut routed = HashSet::new();
    let mut routes = Vec::with_capacity(table.rows.len());
    let mut checks = Vec::new();
    for (at, Row { key, handler }) in table.rows.iter().enumerate() {
        match key {
            Key::Literal(urn) => {
                match urn::checked(urn) {
                    Ok(checked) => routes.push(quote!(.route(#checked, #handler))),
                    Err(error) => push(error),
                }
                let text = urn.value();
                if !routed.insert(text.clone()) {
                    push(syn::Error::new(
                        urn.span(),
                        format!("`{text}` appears twice in this `routes!` table: {KEEP_ONE}"),
                    ));
                }
            }
            Key::Type(ty) => {
                let span = ty.span();
                routes.push(quote_spanned! {span=>
                    .route(<#ty as ::babel_idem::Message>::URN, #handler)
                });
            }
        }
        // Each earlier row that shares this one's URN, when a type is involved.
        for earlier in table.rows.iter().take(at).map(|row| &row.key) {
            match same_urn(earlier, key) {
                Pair::Literals => {}
                Pair::SameType(ty) => push(syn::Error::new(
                    ty.span(),
                    format!(
                        "`{}` appears twice in this `routes!` table: {KEEP_ONE}",
                        type_text(ty)
                    ),
                )),
                Pair::Check(check) => checks.push(check),
            }
        }
    }

    match errors {
        Some(errors) => Err(errors),
        None if checks.is_empty() => Ok(quote!(::babel_idem::Router::builder() #(#routes)*)),
        None => Ok(quote!({
            #(#checks)*
            ::babel_idem::Router::builder() #(#routes)*
        })),
    }
}

/// How two rows' URNs are compared.
enum Pair<'a> {
    /// Two literals: compared by the loop over literal texts.
    Literals,
    /// One type written twice: an error here.
    SameType(&'a Type),
    /// A constant that fails to evaluate when the two URNs are one.
    Check(TokenStream),
}

/// The comparison of `earlier` with `later`, reported on `later`'s key.
fn same_urn<'a>(earlier: &Key, later: &'a Key) -> Pair<'a> {
    let span = later.span();
    let (first, second, message) = match (earlier, later) {
        (Key::Literal(_), Key::Literal(_)) => return Pair::Literals,
        (Key::Type(first), Key::Type(second)) => {
            if type_text(first) == type_text(second) {
                return Pair::SameType(second);
            }
            (
                text_of_type(first),
                text_of_type(second),
                format!(
                    "`{}` carries the same URN as `{}`, routed above in this `routes!` table: \
                     {KEEP_ONE}",
                    type_text(second),
                    type_text(first)
                ),
            )
        }
        (Key::Literal(urn), Key::Type(ty)) => (
            quote!(#urn),
            text_of_type(ty),
            format!(
                "`{}` carries the URN `{}`, routed above in this `routes!` table: {KEEP_ONE}",
                type_text(ty),
                urn.value()
            ),
        ),
        (Key::Type(ty), Key::Literal(urn)) => (
            text_of_type(ty),
            quote!(#urn),
            format!(
                "`{}` is the URN of `{}`, routed above in this `routes!` table: {KEEP_ONE}",
                urn.value(),
                type_text(ty)
            ),
        ),
    };
    Pair::Check(quote_spanned! {span=>
        const _: () = ::core::assert!(
            !::babel_idem::__private::same_text(#first, #second),
            #message
        );
    })
}

/// The URN text of a message type, as a constant expression.
fn text_of_type(ty: &Type) -> TokenStream {
    quote_spanned!(ty.span()=> ::babel_idem::__private::MessageUrn::<#ty>::TEXT)
}

/// A type as the user wrote it, without the spaces token printing puts
/// around `::` and angle brackets.
fn type_text(ty: &Type) -> String {
    ty.to_token_stream()
        .to_string()
        .replace(" :: ", "::")
        .replace(":: ", "::")
        .replace(" < ", "<")
        .replace(" >", ">")
        .replace(" ,", ",")
}

/// `row, row, ...` with an optional trailing comma.
struct Table {
    rows: Punctuated<Row, Token![,]>,
}

impl Parse for Table {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        Ok(Table {
            rows: Punctuated::parse_terminated(input)?,
        })
    }
}

/// `key => handler`.
struct Row {
    key: Key,
    handler: Expr,
}

/// What a row routes: a URN literal, or the URN of a message type.
enum Key {
    Literal(LitStr),
    Type(Box<Type>),
}

impl Key {
    fn span(&self) -> Span {
        match self {
            Key::Literal(urn) => urn.span(),
            Key::Type(ty) => ty.span(),
        }
    }
}

impl Parse for Row {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let key = if input.peek(LitStr) {
            Key::Literal(input.parse()?)
        } else {
            Key::Type(Box::new(
                input
                    .parse::<Type>()
                    .map_err(|error| syn::Error::new(error.span(), ROW))?,
            ))
        };
        input
            .parse::<Token![=>]>()
            .map_err(|error| syn::Error::new(error.span(), ROW))?;
        let handler: Expr = input.parse()?;
        // `handler => "urn"`: the key and the handler swapped.
        if let Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Str(literal),
            ..
        }) = &handler
        {
            return Err(syn::Error::new(literal.span(), ROW));
        }
        Ok(Row { key, handler })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errors_of(input: TokenStream) -> Vec<String> {
        syn::parse2::<Table>(input)
            .and_then(|table| expand(&table))
            .unwrap_err()
            .into_iter()
            .map(|error| error.to_string())
            .collect()
    }

    #[test]
    fn a_table_becomes_one_route_call_per_row() {
        let expanded = routes(quote! {
            "urn:babel:orders:created" => on_created,
            "urn:babel:orders:paid" => on_paid,
        })
        .to_string();
        assert_eq!(expanded.matches(". route").count(), 2, "{expanded}");
        assert!(expanded.starts_with(":: babel_idem :: Router :: builder ()"));
    }

    #[test]
    fn a_repeated_urn_is_one_error_on_the_repeat() {
        let errors = errors_of(quote! {
            "urn:babel:orders:created" => a,
            "urn:babel:orders:paid" => b,
            "urn:babel:orders:created" => c,
        });
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].starts_with("`urn:babel:orders:created` appears twice"));
    }

    #[test]
    fn a_type_row_routes_its_message_urn_behind_one_check_per_pair_with_a_type() {
        let expanded = routes(quote! {
            OrderCreated => on_created,
            "urn:babel:orders:paid" => on_paid,
            "urn:babel:orders:shipped" => on_shipped,
            orders::OrderRefunded => on_refunded,
        })
        .to_string();
        assert!(
            expanded.contains(
                ". route (< OrderCreated as :: babel_idem :: Message > :: URN , on_created)"
            ),
            "{expanded}"
        );
        // Four pairs hold a type and a literal, one holds two types; the
        // two literals are compared here, not by a constant.
        assert_eq!(expanded.matches("const _ : () =").count(), 5, "{expanded}");
        assert!(
            expanded.contains(
                "`orders::OrderRefunded` carries the same URN as `OrderCreated`, routed above"
            ),
            "{expanded}"
        );
        assert!(
            expanded.contains("`urn:babel:orders:paid` is the URN of `OrderCreated`"),
            "{expanded}"
        );
    }

    #[test]
    fn the_same_type_twice_is_an_error_on_the_repeat() {
        let errors = errors_of(quote! {
            OrderCreated => a,
            "urn:babel:orders:paid" => b,
            OrderCreated => c,
        });
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0].starts_with("`OrderCreated` appears twice in this `routes!` table"),
            "{errors:?}"
        );
    }

    #[test]
    fn several_errors_still_expand_to_one_expression() {
        let output = routes(quote! {
            "babel:orders" => a,
            "urn:babel:x y" => c,
        });
        let block: syn::ExprBlock = syn::parse2(output).expect("one block expression");
        assert_eq!(block.block.stmts.len(), 2);
    }

    #[test]
    fn every_malformed_row_is_reported() {
        let errors = errors_of(quote! {
            "babel:orders" => a,
            "urn:babel:ok" => b,
            "urn:babel:x y" => c,
        });
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert_eq!(errors_of(quote!(on_created => "urn:a:b")), [ROW]);
        assert_eq!(errors_of(quote!(42 => on_created)), [ROW]);
    }
}
