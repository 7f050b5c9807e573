//! Stores that wrap a store: [`Batched`](crate::store::Batched) sends
//! concurrent single calls together, [`Cached`](crate::store::Cached)
//! answers the ids it knows are done without asking. Each is a [`Store`]
//! (and a [`ClaimStore`]) over any store, and leaves every answer the one
//! the inner store would give.
//!
//! [`Store`]: crate::store::Store
//! [`ClaimStore`]: crate::store::ClaimStore

pub(crate) mod batched;
pub(crate) mod cached;
