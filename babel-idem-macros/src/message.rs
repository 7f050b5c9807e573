//! Which parameter carries the message id.
//!
//! `message = name` picks a binding by name (any binding of the parameter
//! patterns, or `self`). Without it, the one parameter whose type is
//! `Envelope`, `&Envelope`, `&'a Envelope` or a path ending in `Envelope`
//! (such as `babel_idem::Envelope`) is the message; when no parameter is an
//! envelope, the one whose type is `Delivery` or `&Delivery` (a typed
//! handler's, into which dispatch moves the envelope's `meta`, and so its
//! id). No such parameter, or several of the kind chosen, is an error that
//! asks for `message = ...`.
//!
//! The choice is syntactic; whether the chosen type implements `MessageId` is
//! left to the type checker, whose error carries the trait's
//! `#[diagnostic::on_unimplemented]` note.

use proc_macro2::Span;
use syn::{FnArg, Ident, Pat, PatType, Signature, Type};

/// The parameter whose id is the dedupe key.
pub(crate) struct Message {
    /// The user's token for it, so errors about it point at the user's code.
    pub(crate) name: Ident,
    /// Whether its declared type is a reference (`&Envelope`, `&self`): the
    /// key is then read through the reference itself, without borrowing the
    /// parameter, which would keep it in the handler's future for its whole
    /// life.
    pub(crate) is_reference: bool,
}

/// Finds the message parameter of `sig`; `named` is the `message = ...`
/// argument when the user gave one.
pub(crate) fn pick(sig: &Signature, named: Option<&Ident>) -> syn::Result<Message> {
    match named {
        Some(name) => find_named(sig, name),
        None => find_by_type(sig),
    }
}

/// The types that carry the id, in the order they are looked for: a
/// parameter of the second kind is the message only when none is of the
/// first.
const CARRIERS: [&str; 2] = ["Envelope", "Delivery"];

/// `message = name`: the receiver or a binding in some parameter's pattern.
fn find_named(sig: &Signature, name: &Ident) -> syn::Result<Message> {
    if name == "self" {
        return match sig.receiver() {
            Some(receiver) => Ok(Message {
                name: Ident::new("self", receiver.self_token.span),
                is_reference: matches!(*receiver.ty, Type::Reference(_)),
            }),
            None => Err(syn::Error::new(
                name.span(),
                format!(
                    "`message = self`, but `{}` has no `self` parameter",
                    sig.ident
                ),
            )),
        };
    }

    let mut bindings = Vec::new();
    for input in &sig.inputs {
        if let FnArg::Typed(param) = input {
            collect_bindings(&param.pat, &mut bindings);
        }
    }
    if let Some(found) = bindings.iter().find(|binding| *binding == name) {
        // The attribute's token carries the name; the parameter's token
        // carries the hygiene of the signature, so resolve through it but
        // report at the attribute, where the user chose it.
        return Ok(Message {
            name: Ident::new(&found.to_string(), found.span().located_at(name.span())),
            is_reference: declared_type(sig, found).is_some_and(is_reference),
        });
    }

    let known = if bindings.is_empty() {
        "it has no named parameters".to_owned()
    } else {
        let names: Vec<String> = bindings.iter().map(|b| format!("`{b}`")).collect();
        format!("its parameters are {}", names.join(", "))
    };
    Err(syn::Error::new(
        name.span(),
        format!(
            "`message = {name}` names no parameter of `{}`: {known}",
            sig.ident
        ),
    ))
}

/// No `message = ...`: the single parameter typed as an `Envelope`, or
/// without one, as a `Delivery`.
fn find_by_type(sig: &Signature) -> syn::Result<Message> {
    let of_type = |carrier: &str| -> Vec<&PatType> {
        sig.inputs
            .iter()
            .filter_map(|input| match input {
                FnArg::Typed(param) if is_named(&param.ty, carrier) => Some(param),
                _ => None,
            })
            .collect()
    };
    let Some((carrier, candidates)) = CARRIERS
        .iter()
        .map(|carrier| (*carrier, of_type(carrier)))
        .find(|(_, candidates)| !candidates.is_empty())
    else {
        return Err(syn::Error::new(
            parameters_span(sig),
            format!(
                "`#[idempotent]` cannot tell which parameter of `{}` carries the message id: \
                 none has type `Envelope` or `Delivery`; a typed handler takes \
                 `delivery: Delivery` beside its message, whose `meta.id` is the id; or name \
                 the parameter with `#[idempotent(store = ..., message = <parameter>)]` \
                 (its type must implement `babel_idem::MessageId`)",
                sig.ident
            ),
        ));
    };

    match candidates.as_slice() {
        [param] => binding_name(&param.pat)
            .map(|name| Message {
                name,
                is_reference: is_reference(&param.ty),
            })
            .ok_or_else(|| {
                let lower = carrier.to_lowercase();
                syn::Error::new_spanned(
                    &param.pat,
                    format!(
                        "the {lower} parameter must be bound to a name, as in \
                         `{short}: {carrier}`, so the guard can read its id: destructure it \
                         inside the body instead",
                        short = if carrier == "Envelope" {
                            "env"
                        } else {
                            "delivery"
                        },
                    ),
                )
            }),
        // Several (`find` above kept a kind with at least one): the error
        // goes on the second.
        several => {
            let message = format!(
                "`#[idempotent]` cannot tell which parameter of `{}` carries the message id: \
                 {} parameters are of type `{carrier}`; say which with `message = <parameter>`",
                sig.ident,
                several.len()
            );
            Err(match several.get(1) {
                Some(second) => syn::Error::new_spanned(second, message),
                None => syn::Error::new(parameters_span(sig), message),
            })
        }
    }
}

/// The declared type of the parameter bound as a whole to `name` (`name: T`),
/// or `None` when `name` is bound inside a pattern.
fn declared_type<'a>(sig: &'a Signature, name: &Ident) -> Option<&'a Type> {
    sig.inputs.iter().find_map(|input| match input {
        FnArg::Typed(param) => match &*param.pat {
            Pat::Ident(binding) if binding.ident == *name && binding.by_ref.is_none() => {
                Some(&*param.ty)
            }
            _ => None,
        },
        FnArg::Receiver(_) => None,
    })
}

fn is_reference(ty: &Type) -> bool {
    match ty {
        Type::Reference(_) => true,
        Type::Paren(inner) => is_reference(&inner.elem),
        Type::Group(inner) => is_reference(&inner.elem),
        _ => false,
    }
}

/// `name` (`Envelope`, `Delivery`), any path ending in it, or a reference
/// to one.
fn is_named(ty: &Type, name: &str) -> bool {
    match ty {
        Type::Reference(reference) => is_named(&reference.elem, name),
        Type::Paren(inner) => is_named(&inner.elem, name),
        Type::Group(inner) => is_named(&inner.elem, name),
        Type::Path(path) => {
            path.qself.is_none()
                && path
                    .path
                    .segments
                    .last()
                    .is_some_and(|last| last.ident == name && last.arguments.is_none())
        }
        _ => false,
    }
}

/// The name a parameter pattern binds the whole value to, if it does.
fn binding_name(pat: &Pat) -> Option<Ident> {
    match pat {
        Pat::Ident(binding) => Some(binding.ident.clone()),
        Pat::Paren(inner) => binding_name(&inner.pat),
        _ => None,
    }
}

/// Every name a pattern binds, in order (`(a, Foo { b, .. })` gives `a`, `b`).
fn collect_bindings(pat: &Pat, out: &mut Vec<Ident>) {
    match pat {
        Pat::Ident(binding) => {
            out.push(binding.ident.clone());
            if let Some((_, sub)) = &binding.subpat {
                collect_bindings(sub, out);
            }
        }
        Pat::Paren(inner) => collect_bindings(&inner.pat, out),
        Pat::Reference(inner) => collect_bindings(&inner.pat, out),
        Pat::Tuple(tuple) => tuple.elems.iter().for_each(|p| collect_bindings(p, out)),
        Pat::TupleStruct(tuple) => tuple.elems.iter().for_each(|p| collect_bindings(p, out)),
        Pat::Slice(slice) => slice.elems.iter().for_each(|p| collect_bindings(p, out)),
        Pat::Struct(fields) => fields
            .fields
            .iter()
            .for_each(|field| collect_bindings(&field.pat, out)),
        Pat::Type(typed) => collect_bindings(&typed.pat, out),
        Pat::Or(alternatives) => {
            if let Some(first) = alternatives.cases.first() {
                collect_bindings(first, out);
            }
        }
        _ => {}
    }
}

/// The parameter list, for errors about all parameters at once.
fn parameters_span(sig: &Signature) -> Span {
    sig.paren_token.span.join()
}
