//! The synchronisation the memory store is built on, in one place so that
//! `--cfg loom` can swap it for loom's model of it in this crate's own unit
//! tests (any other build, with the flag or not, uses the real thing).
//!
//! The UUID table's segments sit in `std::sync::OnceLock`s in every build.
//! Loom cannot see a `OnceLock`'s synchronisation, so under loom a table
//! makes all of its (few) segments when it is made, before any model thread
//! reads them, and the model checks the table's own protocol on top. Ids
//! also hash the same way in every loom iteration, as loom requires every
//! replay of a schedule to take the same steps.

#[cfg(not(all(test, loom)))]
pub(super) use std::sync::atomic::{AtomicU64, fence};
#[cfg(not(all(test, loom)))]
pub(super) use std::sync::{Mutex, MutexGuard};

#[cfg(all(test, loom))]
pub(super) use loom::sync::atomic::{AtomicU64, fence};
#[cfg(all(test, loom))]
pub(super) use loom::sync::{Mutex, MutexGuard};

/// How ids are hashed into shards and table slots.
#[cfg(not(all(test, loom)))]
pub(super) type IdHasher = foldhash::fast::RandomState;
#[cfg(all(test, loom))]
pub(super) type IdHasher = foldhash::fast::FixedState;
