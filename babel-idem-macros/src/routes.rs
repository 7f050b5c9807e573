//! `routes! { "urn" => handler, ... }`: a router builder from a table whose
//! URN literals are checked like `urn!`'s, and in which no URN appears twice.
//!
//! Every mistake in the table is reported, each on its own literal. The
//! handlers are passed through untouched, so a function of the wrong shape
//! gets the `Handler` trait's error on the user's expression.

use std::collections::HashSet;

use proc_macro2::TokenStream;
use quote::quote;
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::{Expr, LitStr, Token};

use crate::urn;

/// What one row looks like, said when a row is malformed.
const ROW: &str = "each row of `routes!` is `\"urn literal\" => handler`, \
                   as in `\"urn:babel:orders:created\" => on_order_created`";

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
    for Row { urn, handler } in &table.rows {
        match urn::checked(urn) {
            Ok(checked) => routes.push(quote!(.route(#checked, #handler))),
            Err(error) => push(error),
        }
        let text = urn.value();
        if !routed.insert(text.clone()) {
            push(syn::Error::new(
                urn.span(),
                format!(
                    "`{text}` appears twice in this `routes!` table: each URN gets exactly one \
                     handler, so keep one of the rows"
                ),
            ));
        }
    }

    match errors {
        Some(errors) => Err(errors),
        None => Ok(quote!(::babel_idem::Router::builder() #(#routes)*)),
    }
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

/// `"urn literal" => handler`.
struct Row {
    urn: LitStr,
    handler: Expr,
}

impl Parse for Row {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let urn = input
            .parse::<LitStr>()
            .map_err(|error| syn::Error::new(error.span(), ROW))?;
        input
            .parse::<Token![=>]>()
            .map_err(|error| syn::Error::new(error.span(), ROW))?;
        let handler = input.parse()?;
        Ok(Row { urn, handler })
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
    }
}
