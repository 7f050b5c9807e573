//! The `#[idempotent]` attribute of `babel-idem`. Use it through
//! `babel_idem::idempotent`.

use proc_macro::TokenStream;

/// Placeholder until the attribute lands: emits the item unchanged.
#[proc_macro_attribute]
pub fn idempotent(_args: TokenStream, item: TokenStream) -> TokenStream {
    item
}
