//! Which parameter lends the handler's database connection, in
//! transactional mode (`transaction = tx`).
//!
//! The parameter must be bound to a plain name (`tx` or `mut tx`) and typed
//! `&mut T`: the guard borrows it for the mark, then hands it to the body
//! under the same name. Whether `T` is a connection of the store's database
//! is left to the type checker (`babel_idem::store::AsConnection`, whose
//! `#[diagnostic::on_unimplemented]` note says what to write).

use syn::{FnArg, Ident, Pat, Signature, Type};

/// The connection parameter.
pub(crate) struct Connection {
    /// The parameter's own token, so the body's uses of it resolve to the
    /// closure parameter the rewrite binds with it.
    pub(crate) name: Ident,
    /// `mut tx`: the closure parameter keeps the `mut`.
    pub(crate) mutable: bool,
    /// The `T` of `&mut T`, for errors about it.
    pub(crate) target: Type,
}

/// Finds the parameter `transaction = name` names in `sig`.
pub(crate) fn pick(sig: &Signature, name: &Ident) -> syn::Result<Connection> {
    let mut names = Vec::new();
    for input in &sig.inputs {
        let FnArg::Typed(param) = input else { continue };
        let Pat::Ident(binding) = &*param.pat else {
            continue;
        };
        if binding.ident != *name {
            names.push(format!("`{}`", binding.ident));
            continue;
        }
        if binding.by_ref.is_some() || binding.subpat.is_some() {
            return Err(syn::Error::new_spanned(
                &param.pat,
                "the transaction parameter must be bound to a plain name, as in \
                 `tx: &mut sqlx::PgConnection`",
            ));
        }
        return match strip_groups(&param.ty) {
            Type::Reference(reference) if reference.mutability.is_some() => Ok(Connection {
                name: binding.ident.clone(),
                mutable: binding.mutability.is_some(),
                target: (*reference.elem).clone(),
            }),
            other => Err(syn::Error::new_spanned(
                other,
                format!(
                    "`transaction = {name}` names a parameter of type `{}`: the transaction \
                     parameter is a `&mut sqlx::PgConnection`, `&mut sqlx::SqliteConnection` \
                     or `&mut sqlx::Transaction<'_, _>`, which the guard marks the message on",
                    quote::ToTokens::to_token_stream(other)
                ),
            )),
        };
    }
    let known = if names.is_empty() {
        "it has no other named parameters".to_owned()
    } else {
        format!("its parameters are {}", names.join(", "))
    };
    Err(syn::Error::new(
        name.span(),
        format!(
            "`transaction = {name}` names no parameter of `{}`: {known}",
            sig.ident
        ),
    ))
}

fn strip_groups(ty: &Type) -> &Type {
    match ty {
        Type::Paren(inner) => strip_groups(&inner.elem),
        Type::Group(inner) => strip_groups(&inner.elem),
        other => other,
    }
}
