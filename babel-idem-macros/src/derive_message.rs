//! `#[derive(Message)]` with `#[message(urn = "...")]`: the `babel_idem::Message`
//! impl of a type, its URN literal checked by the validator `urn!` runs
//! (`urn::checked`), so a malformed one fails `cargo check` on the literal.
//!
//! - `check` reads the attribute and the type: every mistake, each on its
//!   own token (a missing URN on the type's name, a malformed one on the
//!   literal, an unknown argument on its name, generic parameters on them).
//! - `expand` writes the impl; the trait's supertraits (`Serialize`,
//!   `DeserializeOwned`, `Send`) are left to the type checker, whose error
//!   names the missing one.

use proc_macro2::TokenStream;
use quote::quote;
use syn::ext::IdentExt;
use syn::parse::{ParseStream, Parser};
use syn::{Attribute, DeriveInput, GenericParam, Ident, LitStr, Token};

use crate::urn;

/// What `#[message(...)]` takes, said when it gets anything else.
const USAGE: &str = "`#[message(...)]` takes the URN the type is routed by, as in \
                     `#[message(urn = \"urn:babel:orders:created\")]`";

/// The whole derive: `input` as the compiler hands it over.
pub(crate) fn derive(input: TokenStream) -> TokenStream {
    syn::parse2::<DeriveInput>(input)
        .and_then(|input| {
            let urn = check(&input)?;
            Ok(expand(&input, &urn))
        })
        .unwrap_or_else(syn::Error::into_compile_error)
}

/// The type's URN literal, checked, or every mistake at once.
fn check(input: &DeriveInput) -> syn::Result<LitStr> {
    let mut errors = Errors::default();
    let mut urn: Option<LitStr> = None;
    // An attribute that could not be read has had its error: no second one
    // about the URN it may have held.
    let mut unreadable = false;
    for attribute in input.attrs.iter().filter(|a| a.path().is_ident("message")) {
        if let Err(error) = read_attribute(attribute, &mut urn, &mut errors) {
            errors.push(error);
            unreadable = true;
        }
    }
    for param in &input.generics.params {
        errors.push(generic_parameter(param, &input.ident));
    }
    match &urn {
        Some(literal) => {
            if let Err(error) = urn::checked(literal) {
                errors.push(error);
            }
        }
        None if unreadable => {}
        None => errors.push(syn::Error::new(
            input.ident.span(),
            format!(
                "`#[derive(Message)]` needs the URN `{name}` is routed by: add \
                 `#[message(urn = \"urn:<NID>:<NSS>\")]` to `{name}`, as in \
                 `#[message(urn = \"urn:babel:orders:created\")]`",
                name = input.ident
            ),
        )),
    }
    errors.finish()?;
    // `finish` has returned every mistake, a missing URN among them.
    urn.ok_or_else(|| syn::Error::new(input.ident.span(), USAGE))
}

/// One `#[message(urn = "...")]`: its `urn` stored once, every other
/// argument an error on its name.
fn read_attribute(
    attribute: &Attribute,
    urn: &mut Option<LitStr>,
    errors: &mut Errors,
) -> syn::Result<()> {
    let list = attribute
        .meta
        .require_list()
        .map_err(|error| syn::Error::new(error.span(), USAGE))?;
    let parser = |input: ParseStream<'_>| -> syn::Result<()> {
        while !input.is_empty() {
            let name = Ident::parse_any(input)?;
            if !input.peek(Token![=]) {
                return Err(syn::Error::new(name.span(), USAGE));
            }
            input.parse::<Token![=]>()?;
            if name == "urn" {
                let literal = input.parse::<LitStr>().map_err(|error| {
                    syn::Error::new(
                        error.span(),
                        "`urn` takes a string literal, as in `urn = \"urn:babel:orders:created\"`",
                    )
                })?;
                if urn.is_some() {
                    errors.push(syn::Error::new(
                        name.span(),
                        "the URN is given twice: a message type has exactly one, keep one",
                    ));
                } else {
                    *urn = Some(literal);
                }
            } else {
                errors.push(syn::Error::new(
                    name.span(),
                    format!("unknown argument `{name}`: {USAGE}"),
                ));
                input.parse::<syn::Expr>()?;
            }
            if input.is_empty() {
                break;
            }
            input.parse::<Token![,]>()?;
        }
        Ok(())
    };
    parser.parse2(list.tokens.clone())
}

/// The error for a generic parameter: one URN names one payload shape, so
/// each instantiation is a message type of its own.
fn generic_parameter(param: &GenericParam, name: &Ident) -> syn::Error {
    match param {
        GenericParam::Lifetime(lifetime) => syn::Error::new(
            lifetime.lifetime.span(),
            format!(
                "a message type owns its data (`DeserializeOwned + 'static`): remove the \
                 lifetime from `{name}` and hold owned values, such as `String` for `&str`"
            ),
        ),
        GenericParam::Type(ty) => syn::Error::new(
            ty.ident.span(),
            format!(
                "`#[derive(Message)]` needs a type without generic parameters: the URN names \
                 one payload shape; implement `babel_idem::Message` by hand for each \
                 `{name}<...>` that is a message, each with its own URN"
            ),
        ),
        GenericParam::Const(constant) => syn::Error::new(
            constant.ident.span(),
            format!(
                "`#[derive(Message)]` needs a type without generic parameters: the URN names \
                 one payload shape; implement `babel_idem::Message` by hand for each \
                 `{name}<...>` that is a message, each with its own URN"
            ),
        ),
    }
}

/// The impl, its URN built at compile time like `urn!`'s.
fn expand(input: &DeriveInput, literal: &LitStr) -> TokenStream {
    let name = &input.ident;
    // `check` has validated the literal; this builds its `Urn` expression.
    let urn = urn::checked(literal).unwrap_or_else(syn::Error::into_compile_error);
    quote! {
        impl ::babel_idem::Message for #name {
            const URN: ::babel_idem::Urn = #urn;
        }
    }
}

/// Collects every mistake, so one compile reports them all.
#[derive(Default)]
struct Errors(Option<syn::Error>);

impl Errors {
    fn push(&mut self, error: syn::Error) {
        match &mut self.0 {
            Some(first) => first.combine(error),
            None => self.0 = Some(error),
        }
    }

    fn finish(self) -> syn::Result<()> {
        self.0.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quote::quote;

    fn errors_of(input: TokenStream) -> Vec<String> {
        let input = syn::parse2::<DeriveInput>(input).expect("a type");
        check(&input)
            .unwrap_err()
            .into_iter()
            .map(|error| error.to_string())
            .collect()
    }

    #[test]
    fn a_type_with_a_urn_gets_the_impl_with_a_const_urn() {
        let expanded = derive(quote! {
            #[message(urn = "urn:babel:orders:created")]
            struct OrderCreated { order_id: u64 }
        })
        .to_string();
        assert!(
            expanded.starts_with("impl :: babel_idem :: Message for OrderCreated"),
            "{expanded}"
        );
        assert!(expanded.contains("urn_literal"), "{expanded}");
        assert!(expanded.contains("9usize"), "{expanded}");
    }

    #[test]
    fn a_missing_urn_asks_for_the_attribute_by_the_types_name() {
        let errors = errors_of(quote!(
            struct OrderCreated;
        ));
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0].starts_with("`#[derive(Message)]` needs the URN `OrderCreated` is routed by: add `#[message(urn = "),
            "{errors:?}"
        );
    }

    #[test]
    fn every_mistake_is_reported() {
        let errors = errors_of(quote! {
            #[message(urn = "urn:b:orders", topic = "x")]
            #[message(urn = "urn:babel:orders:created")]
            struct OrderCreated<'a, T> { id: &'a T }
        });
        assert_eq!(errors.len(), 5, "{errors:?}");
        assert!(
            errors[0].starts_with("unknown argument `topic`"),
            "{errors:?}"
        );
        assert!(
            errors[1].starts_with("the URN is given twice"),
            "{errors:?}"
        );
        assert!(
            errors[2].starts_with("a message type owns its data"),
            "{errors:?}"
        );
        assert!(
            errors[3].contains("without generic parameters"),
            "{errors:?}"
        );
        assert!(errors[4].starts_with("malformed URN"), "{errors:?}");
    }

    #[test]
    fn a_value_that_is_no_string_literal_shows_how_to_write_it() {
        let errors = errors_of(quote! {
            #[message(urn = CREATED)]
            struct OrderCreated;
        });
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0].starts_with("`urn` takes a string literal"),
            "{errors:?}"
        );
        let errors = errors_of(quote! {
            #[message = "urn:babel:orders:created"]
            struct OrderCreated;
        });
        assert!(errors[0].starts_with(USAGE), "{errors:?}");
    }
}
