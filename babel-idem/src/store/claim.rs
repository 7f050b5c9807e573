//! [`ClaimStore`]: the capability behind claim mode (DESIGN section 8.1).
//!
//! A claim is a lease on one id, held by one owner ([`ClaimToken`]) and
//! numbered by a fencing token that grows with every claim of that id. The
//! three-method [`Store`] stays the cross-SDK contract; claims live beside the
//! seen-set, so a seen-set reader (a Go consumer) never takes a claim for a
//! done id.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::{Store, StoreFuture};

/// The owner of one claim: random, fresh for every claim a guard makes.
///
/// Every operation after [`ClaimStore::claim`] names its owner, so a late
/// `commit` or `release` from an owner whose lease lapsed changes nothing.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ClaimToken(u128);

impl ClaimToken {
    /// A fresh random token.
    ///
    /// ```
    /// use babel_idem::store::ClaimToken;
    /// assert_ne!(ClaimToken::random(), ClaimToken::random());
    /// ```
    pub fn random() -> Self {
        ClaimToken(uuid::Uuid::new_v4().as_u128())
    }

    /// The token as a number (how the in-memory store keeps it).
    pub fn as_u128(self) -> u128 {
        self.0
    }

    /// The token as 32 lowercase hex digits (how servers keep it).
    pub fn to_hex(self) -> String {
        format!("{:032x}", self.0)
    }
}

impl fmt::Debug for ClaimToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ClaimToken({:032x})", self.0)
    }
}

/// What [`ClaimStore::claim`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Claim {
    /// The id is done (in the seen-set): skip the delivery.
    Done,
    /// The caller holds the id until its lease lapses. `fence` is strictly
    /// greater than the fence of every earlier claim of this id.
    Won {
        /// The claim's fencing token.
        fence: u64,
    },
    /// Another owner holds a live lease.
    Held {
        /// How long the current lease has left, where the store knows it.
        retry_after: Option<Duration>,
    },
}

/// A [`Store`] that can also lease an id to one owner at a time.
///
/// Each operation is atomic on the server (one script or one statement) and
/// takes the owner's token:
///
/// - [`claim`](ClaimStore::claim): done, won with a fence, or held.
/// - [`commit`](ClaimStore::commit): while the claim is still the owner's,
///   write the seen-set's done marker (the Go-compatible layout) and drop the
///   claim; `false` when the claim was lost.
/// - [`release`](ClaimStore::release): drop the owner's claim (never another
///   owner's), so a redelivery can run; the fence counter is kept.
/// - [`renew`](ClaimStore::renew): extend the owner's live lease; `false` when
///   it was lost.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot claim ids: it is not a babel-idem `ClaimStore`",
    label = "this store has no claim capability",
    note = "claim mode (`lease = ...`, `Guard::lease`) needs a store that implements `babel_idem::ClaimStore`: \
            `InMemoryStore`, `SqliteStore`, `RedisStore` or `PostgresStore`"
)]
pub trait ClaimStore: Store {
    /// Claims `id` for `owner` for `lease`, unless it is done or held by a
    /// live owner.
    fn claim<'a>(
        &'a self,
        id: &'a str,
        owner: ClaimToken,
        lease: Duration,
    ) -> StoreFuture<'a, Claim>;

    /// Marks `id` done and drops `owner`'s claim, if `owner` still holds it.
    fn commit<'a>(&'a self, id: &'a str, owner: ClaimToken) -> StoreFuture<'a, bool>;

    /// Drops `owner`'s claim on `id`, if `owner` still holds it.
    fn release<'a>(&'a self, id: &'a str, owner: ClaimToken) -> StoreFuture<'a, bool>;

    /// Extends `owner`'s live claim on `id` to `lease` from now.
    fn renew<'a>(
        &'a self,
        id: &'a str,
        owner: ClaimToken,
        lease: Duration,
    ) -> StoreFuture<'a, bool>;
}

macro_rules! forward_claim_store {
    ($($ty:ty),+ $(,)?) => {$(
        impl<S: ClaimStore + ?Sized> ClaimStore for $ty {
            #[inline]
            fn claim<'a>(&'a self, id: &'a str, owner: ClaimToken, lease: Duration) -> StoreFuture<'a, Claim> {
                (**self).claim(id, owner, lease)
            }
            #[inline]
            fn commit<'a>(&'a self, id: &'a str, owner: ClaimToken) -> StoreFuture<'a, bool> {
                (**self).commit(id, owner)
            }
            #[inline]
            fn release<'a>(&'a self, id: &'a str, owner: ClaimToken) -> StoreFuture<'a, bool> {
                (**self).release(id, owner)
            }
            #[inline]
            fn renew<'a>(&'a self, id: &'a str, owner: ClaimToken, lease: Duration) -> StoreFuture<'a, bool> {
                (**self).renew(id, owner, lease)
            }
        }
    )+};
}

forward_claim_store!(&S, Arc<S>, Box<S>);
