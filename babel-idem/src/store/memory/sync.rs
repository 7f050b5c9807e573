//! The synchronisation the memory store is built on, in one place so that
//! `--cfg loom` can swap it for loom's model of it in this crate's own unit
//! tests (any other build, with the flag or not, uses the real thing).
//!
//! Under loom, [`Published`] (an `ArcSwap` otherwise) becomes a mutex around
//! an `Arc`: loom cannot see inside arc-swap, so the model assumes what
//! arc-swap documents (a reader that loads a table sees everything written
//! before it was stored, and a store is seen by every later load) and checks
//! the table's own protocol on top of it. Ids also hash the same way in every
//! loom iteration, as loom requires every replay of a schedule to take the
//! same steps.

use std::ops::Deref;

#[cfg(not(all(test, loom)))]
pub(super) use std::sync::atomic::AtomicU64;
#[cfg(not(all(test, loom)))]
pub(super) use std::sync::{Arc, Mutex, MutexGuard};

#[cfg(all(test, loom))]
pub(super) use loom::sync::atomic::AtomicU64;
#[cfg(all(test, loom))]
pub(super) use loom::sync::{Arc, Mutex, MutexGuard};

/// How ids are hashed into shards and table slots.
#[cfg(not(all(test, loom)))]
pub(super) type IdHasher = foldhash::fast::RandomState;
#[cfg(all(test, loom))]
pub(super) type IdHasher = foldhash::fast::FixedState;

/// A value that its owner replaces as a whole while readers keep reading the
/// one they loaded, without taking a lock.
pub(super) struct Published<T> {
    #[cfg(not(all(test, loom)))]
    current: arc_swap::ArcSwap<T>,
    #[cfg(all(test, loom))]
    current: Mutex<Arc<T>>,
}

/// A loaded value; it stays valid after the value is replaced.
pub(super) struct Loaded<T> {
    #[cfg(not(all(test, loom)))]
    guard: arc_swap::Guard<Arc<T>>,
    #[cfg(all(test, loom))]
    guard: Arc<T>,
}

impl<T> Published<T> {
    pub(super) fn new(value: T) -> Self {
        Published {
            #[cfg(not(all(test, loom)))]
            current: arc_swap::ArcSwap::from_pointee(value),
            #[cfg(all(test, loom))]
            current: Mutex::new(Arc::new(value)),
        }
    }

    /// The current value. `ArcSwap::load`, not `load_full`: a reference
    /// count bump would write to the cache line every reader reads.
    #[inline]
    pub(super) fn load(&self) -> Loaded<T> {
        Loaded {
            #[cfg(not(all(test, loom)))]
            guard: self.current.load(),
            #[cfg(all(test, loom))]
            guard: Arc::clone(&self.current.lock().unwrap_or_else(|p| p.into_inner())),
        }
    }

    /// Replaces the value; readers of the old one finish on it undisturbed.
    pub(super) fn store(&self, value: T) {
        #[cfg(not(all(test, loom)))]
        self.current.store(Arc::new(value));
        #[cfg(all(test, loom))]
        {
            *self.current.lock().unwrap_or_else(|p| p.into_inner()) = Arc::new(value);
        }
    }
}

impl<T> Deref for Loaded<T> {
    type Target = T;

    #[inline]
    fn deref(&self) -> &T {
        &self.guard
    }
}
