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
/// layer's `impl ClaimStore`: the calls it has nothing to add to.
macro_rules! pass_claims_through {
    (release) => {
        fn release<'a>(&'a self, id: &'a str, owner: ClaimToken) -> StoreFuture<'a, bool> {
            self.inner.store.release(id, owner)
        }
    };
    (renew) => {
        fn renew<'a>(
            &'a self,
            id: &'a str,
            owner: ClaimToken,
            lease: Duration,
        ) -> StoreFuture<'a, bool> {
            self.inner.store.renew(id, owner, lease)
        }
    };
    (claim_many) => {
        fn claim_many<'a>(
            &'a self,
            claims: &'a [(&'a str, ClaimToken)],
            lease: Duration,
        ) -> StoreFuture<'a, Vec<Claim>> {
            self.inner.store.claim_many(claims, lease)
        }
    };
    (commit_many) => {
        fn commit_many<'a>(
            &'a self,
            commits: &'a [(&'a str, ClaimToken)],
        ) -> StoreFuture<'a, Vec<bool>> {
            self.inner.store.commit_many(commits)
        }
    };
    ($($method:ident),+) => {
        $(pass_claims_through!($method);)+
    };
}

pub(crate) mod batched;
pub(crate) mod cached;
