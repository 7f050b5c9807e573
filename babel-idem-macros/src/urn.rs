//! `urn!("...")`: a URN literal checked while the macro expands, by the same
//! validator `Urn::parse` runs (`babel_idem_urn::validate`).
//!
//! A well-formed literal becomes a `const { }` call that builds the `Urn`
//! without checking it again; a malformed one becomes one error on the
//! literal, so `cargo check` (and an editor) reports it.

use std::fmt::Write as _;

use babel_idem_urn::{UrnError, validate};
use proc_macro2::{Span, TokenStream};
use quote::quote_spanned;
use syn::parse::{Parse, ParseStream};
use syn::{LitStr, Token};

/// What `urn!` takes, said when it gets anything else.
const USAGE: &str = "`urn!` takes one string literal, such as `urn!(\"urn:babel:orders:created\")`; \
                     for a URN known only at run time use `Urn::parse`";

/// The whole macro: `input` as the compiler hands it over.
pub(crate) fn urn(input: TokenStream) -> TokenStream {
    syn::parse2::<UrnLiteral>(input)
        .and_then(|UrnLiteral(literal)| checked(&literal))
        .unwrap_or_else(syn::Error::into_compile_error)
}

/// The expression for a URN literal, or the error that says what is wrong
/// with it, on the literal.
pub(crate) fn checked(literal: &LitStr) -> syn::Result<TokenStream> {
    let text = literal.value();
    let nid_end =
        validate(&text).map_err(|error| syn::Error::new(literal.span(), describe(&text, error)))?;
    Ok(quote_spanned! {literal.span()=>
        const { ::babel_idem::__private::urn_literal(#literal, #nid_end) }
    })
}

/// The validator's description, plus the offending character and where it
/// is, when the rule that failed is about one character.
fn describe(text: &str, error: UrnError) -> String {
    let mut message = error.description().to_owned();
    if let Some(at) = error.position()
        && let Some(found) = text.get(at..).and_then(|rest| rest.chars().next())
    {
        // Writing to a String cannot fail.
        let _ = write!(message, ": found {found:?} at byte {at}");
    }
    message
}

/// One string literal, with an optional trailing comma.
struct UrnLiteral(LitStr);

impl Parse for UrnLiteral {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        if input.is_empty() {
            // On the whole invocation: there is no token to point at.
            return Err(syn::Error::new(Span::call_site(), USAGE));
        }
        let literal = input
            .parse::<LitStr>()
            .map_err(|error| syn::Error::new(error.span(), USAGE))?;
        input.parse::<Option<Token![,]>>()?;
        if !input.is_empty() {
            return Err(input.error(USAGE));
        }
        Ok(UrnLiteral(literal))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quote::quote;

    fn error_of(input: TokenStream) -> String {
        syn::parse2::<UrnLiteral>(input)
            .and_then(|UrnLiteral(literal)| checked(&literal))
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn a_well_formed_literal_expands_to_a_const_urn() {
        let expanded = urn(quote!("urn:babel:orders:created")).to_string();
        assert!(expanded.contains("urn_literal"), "{expanded}");
        assert!(expanded.contains("9usize"), "{expanded}");
    }

    #[test]
    fn a_malformed_literal_says_what_and_where() {
        assert_eq!(
            error_of(quote!("urn:babel:orders created")),
            format!(
                "{}: found ' ' at byte 16",
                UrnError::InvalidNssChar { at: 16 }.description()
            )
        );
        assert_eq!(
            error_of(quote!("babel:orders")),
            UrnError::MissingScheme.description()
        );
    }

    #[test]
    fn anything_but_one_literal_shows_the_usage() {
        assert_eq!(error_of(quote!(text)), USAGE);
        assert_eq!(error_of(quote!()), USAGE);
        assert_eq!(error_of(quote!("urn:a:b", "urn:a:c")), USAGE);
        assert!(syn::parse2::<UrnLiteral>(quote!("urn:ab:c",)).is_ok());
    }
}
