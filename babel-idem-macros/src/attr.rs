//! The arguments of `#[idempotent(...)]`, parsed with `syn`.
//!
//! Every argument is `name = value`, separated by commas, in any order:
//!
//! | argument | value | required |
//! |---|---|---|
//! | `store` | any expression | yes |
//! | `message` | a parameter name (or `self`) | no |
//! | `scope` | a non-empty string literal | no |
//! | `on_remember_failure` | `AckAndReport` or `ReturnError` | no |
//! | `lease` | an expression of type `Duration`: turns on claim mode | no |
//! | `transaction` | a parameter name: turns on transactional mode | no, and never with `lease` |
//!
//! Each mistake is a `syn::Error` on the token that is wrong, and every
//! mistake in the list is reported, not only the first.

use proc_macro2::Span;
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream};
use syn::{Expr, Ident, LitStr, Token};

/// The names `#[idempotent]` accepts, in the order the docs list them.
const ARGUMENTS: &str =
    "`store`, `message`, `scope`, `on_remember_failure`, `lease`, `transaction`";

/// The variants of `babel_idem::OnRememberFailure` the attribute can name.
const POLICIES: [&str; 2] = ["AckAndReport", "ReturnError"];

/// The parsed arguments. `store` is checked by [`Args::store`], so a missing
/// one is reported together with the other mistakes of the same attribute.
pub(crate) struct Args {
    store: Option<Expr>,
    /// The parameter that carries the message id, when the user names it.
    pub(crate) message: Option<Ident>,
    /// The namespace put in front of every key.
    pub(crate) scope: Option<LitStr>,
    /// A variant of `OnRememberFailure`, already checked against [`POLICIES`].
    pub(crate) on_remember_failure: Option<Ident>,
    /// The claim-mode lease (a `Duration` expression), when the user asks for it.
    pub(crate) lease: Option<Expr>,
    /// The parameter holding the handler's database connection, for
    /// transactional mode.
    pub(crate) transaction: Option<Ident>,
}

impl Args {
    /// The `store = ...` expression, or the error that asks for it.
    pub(crate) fn store(&self) -> syn::Result<&Expr> {
        self.store.as_ref().ok_or_else(|| {
            syn::Error::new(
                Span::call_site(),
                "missing `store = ...`: `#[idempotent]` needs the seen-set to consult, \
                 as in `#[idempotent(store = STORE)]`",
            )
        })
    }
}

impl Parse for Args {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let mut args = Args {
            store: None,
            message: None,
            scope: None,
            on_remember_failure: None,
            lease: None,
            transaction: None,
        };
        // Where `transaction` was written, for the error that refuses it with `lease`.
        let mut transaction_name = None;
        let mut errors = Errors::default();

        while !input.is_empty() {
            // `parse_any` accepts keywords too, so `type = ...` gets the
            // "unknown argument" error rather than "expected identifier".
            let name = Ident::parse_any(input)?;
            match name.to_string().as_str() {
                "store" => {
                    let value = parse_value(
                        input,
                        &name,
                        "an expression, as in `store = STORE`",
                        Expr::parse,
                    )?;
                    set_once(&mut args.store, &name, value, &mut errors);
                }
                "message" => {
                    // `parse_any` so `message = self` can name the receiver.
                    let value = parse_value(
                        input,
                        &name,
                        "a parameter name, as in `message = env`",
                        Ident::parse_any,
                    )?;
                    set_once(&mut args.message, &name, value, &mut errors);
                }
                "scope" => {
                    let value = parse_value(
                        input,
                        &name,
                        "a string literal, as in `scope = \"billing\"`",
                        <LitStr as Parse>::parse,
                    )?;
                    if value.value().is_empty() {
                        errors.push(syn::Error::new(
                            value.span(),
                            "`scope` must not be empty: it is the prefix that keeps two \
                             services' keys apart, as in `scope = \"billing\"`",
                        ));
                    }
                    set_once(&mut args.scope, &name, value, &mut errors);
                }
                "on_remember_failure" => {
                    let value = parse_value(
                        input,
                        &name,
                        "`AckAndReport` or `ReturnError`, as in `on_remember_failure = ReturnError`",
                        Ident::parse,
                    )?;
                    if !POLICIES.contains(&value.to_string().as_str()) {
                        errors.push(syn::Error::new(
                            value.span(),
                            format!(
                                "unknown policy `{value}`: expected `AckAndReport` (the default: \
                                 ack and report a failed `remember`) or `ReturnError` (return the \
                                 store error so the message is retried)"
                            ),
                        ));
                    }
                    set_once(&mut args.on_remember_failure, &name, value, &mut errors);
                }
                "lease" => {
                    let value = parse_value(
                        input,
                        &name,
                        "a `Duration` expression, as in `lease = Duration::from_secs(30)`",
                        Expr::parse,
                    )?;
                    set_once(&mut args.lease, &name, value, &mut errors);
                }
                "transaction" => {
                    let value = parse_value(
                        input,
                        &name,
                        "the name of the connection parameter, as in `transaction = tx`",
                        Ident::parse,
                    )?;
                    transaction_name.get_or_insert(name.span());
                    set_once(&mut args.transaction, &name, value, &mut errors);
                }
                _ => {
                    errors.push(syn::Error::new(
                        name.span(),
                        format!("unknown argument `{name}`, expected one of {ARGUMENTS}"),
                    ));
                    // Skip its value, if any, so the arguments after it are still checked.
                    if input.parse::<Option<Token![=]>>()?.is_some() {
                        input.parse::<Expr>()?;
                    }
                }
            }

            if input.is_empty() {
                break;
            }
            if !input.peek(Token![,]) {
                return Err(input.error("expected `,` between arguments"));
            }
            input.parse::<Token![,]>()?;
        }

        if let (Some(span), Some(_)) = (transaction_name, &args.lease) {
            errors.push(syn::Error::new(
                span,
                "`transaction` and `lease` cannot be combined: in transactional mode the \
                 database's primary key already makes a concurrent duplicate wait, so no lease \
                 is needed; keep one of them",
            ));
        }

        errors.finish()?;
        Ok(args)
    }
}

/// Parses the `= value` that follows an argument's name.
fn parse_value<T>(
    input: ParseStream<'_>,
    name: &Ident,
    expected: &str,
    parse: fn(ParseStream<'_>) -> syn::Result<T>,
) -> syn::Result<T> {
    if !input.peek(Token![=]) {
        return Err(syn::Error::new(
            name.span(),
            format!("expected `=` after `{name}`: `{name}` takes {expected}"),
        ));
    }
    input.parse::<Token![=]>()?;
    parse(input)
        .map_err(|error| syn::Error::new(error.span(), format!("`{name}` takes {expected}")))
}

/// Stores `value` unless the argument was given before, which is an error on
/// the second name.
fn set_once<T>(slot: &mut Option<T>, name: &Ident, value: T, errors: &mut Errors) {
    if slot.is_some() {
        errors.push(syn::Error::new(
            name.span(),
            format!("`{name}` is given twice: keep one"),
        ));
    } else {
        *slot = Some(value);
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
