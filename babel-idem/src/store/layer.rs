//! Stores that wrap a store: [`Batched`](crate::store::Batched) sends
//! concurrent single calls together, [`Cached`](crate::store::Cached)
//! answers the ids it knows are done without asking. Each is a [`Store`]
//! (and a [`ClaimStore`]) over any store, and leaves every answer the one
//! the inner store would give.
//!
//! [`Store`]: crate::store::Store
//! [`ClaimStore`]: crate::store::ClaimStore

/// The [`ClaimStore`](crate::store::ClaimStore) methods a layer sends
/// straight to the store it wraps (`self.inner.store`), written inside the
/// layer's `impl ClaimStore` as `method(arguments) -> answer;`: the calls it
/// has nothing to add to.
macro_rules! pass_claims_through {
    ($($method:ident($($arg:ident: $ty:ty),*) -> $answer:ty;)+) => {$(
        fn $method<'a>(&'a self, $($arg: $ty),*) -> StoreFuture<'a, $answer> {
            self.inner.store.$method($($arg),*)
        }
    )+};
}

/// `Clone` for a layer that is an `Arc` of its state, whatever its store:
/// clones share the state (the batches, the kept ids).
macro_rules! clone_shares_inner {
    ($layer:ident) => {
        impl<S> Clone for $layer<S> {
            fn clone(&self) -> Self {
                $layer {
                    inner: Arc::clone(&self.inner),
                }
            }
        }
    };
}

pub(crate) mod batched;
pub(crate) mod cached;
