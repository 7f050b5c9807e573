//! [`fence`]: the claim's fencing token, readable inside a claimed handler.
//!
//! The guard sets a thread-local around each poll of the handler and puts the
//! previous value back afterwards (like `tracing`'s `Instrumented`), so it
//! works under any executor, follows the handler from thread to thread, and
//! a guard nested in a handler restores the outer fence when its poll ends.

use std::cell::Cell;

thread_local! {
    static CURRENT: Cell<Option<u64>> = const { Cell::new(None) };
}

/// The fencing token of the claim the current handler runs under: `Some`
/// inside a handler run by a claim-mode guard ([`Guard::lease`]), `None`
/// anywhere else (outside a handler, in seen-set mode, for a message without
/// an id, or on a store that keeps no fence).
///
/// Fences strictly increase across successive claims of one id, so a
/// downstream write guarded by `... WHERE fence < $1` refuses a stale owner
/// whose lease lapsed while it was still running.
///
/// The value is read from the handler's own future: a task the handler
/// spawns does not inherit it, so pass the number along.
///
/// [`Guard::lease`]: crate::guard::Guard::lease
///
/// ```
/// use babel_idem::{Envelope, Guard, InMemoryStore, StoreError};
/// use babel_idem::guard::fence;
/// use serde_json::json;
/// use std::time::Duration;
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let guard = Guard::new(InMemoryStore::new()).lease(Duration::from_secs(10))?;
/// let env = Envelope::new("urn:babel:orders:created", json!({}));
/// assert_eq!(fence(), None);
/// guard
///     .run(&env, async {
///         let token = fence().expect("a claimed handler has a fence");
///         println!("UPDATE orders SET ... WHERE fence < {token}");
///         Ok::<(), StoreError>(())
///     })
///     .await?;
/// # Ok::<(), StoreError>(())
/// # }).unwrap();
/// ```
pub fn fence() -> Option<u64> {
    CURRENT.with(Cell::get)
}

/// Runs `poll` with `fence` current, then restores the previous value, also
/// when `poll` unwinds.
#[inline]
pub(super) fn scoped<T>(fence: Option<u64>, poll: impl FnOnce() -> T) -> T {
    struct Restore(Option<u64>);
    impl Drop for Restore {
        fn drop(&mut self) {
            CURRENT.with(|current| current.set(self.0));
        }
    }
    let _restore = Restore(CURRENT.with(|current| current.replace(fence)));
    poll()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_scopes_restore_the_outer_fence_even_on_panic() {
        assert_eq!(fence(), None);
        scoped(Some(1), || {
            assert_eq!(fence(), Some(1));
            scoped(Some(2), || assert_eq!(fence(), Some(2)));
            assert_eq!(fence(), Some(1));
            let unwound = std::panic::catch_unwind(|| scoped(Some(3), || panic!("handler")));
            assert!(unwound.is_err());
            assert_eq!(fence(), Some(1));
        });
        assert_eq!(fence(), None);
    }
}
