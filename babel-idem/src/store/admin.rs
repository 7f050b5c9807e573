//! What the persistent stores' admin operations share: [`StoreStats`], the
//! answer of `stats` on `SqliteStore`, `RedisStore` and `PostgresStore`.
//!
//! The admin operations themselves (stats, batched forget, counting and
//! purging expired marks, checking that the table is there) live beside
//! each backend, in its `admin.rs`, as translations to its database's
//! commands; the operator CLI (`babel-idem-cli`) is built on them.

/// The marks a store holds, as its `stats` operation counts them.
///
/// ```
/// use babel_idem::store::StoreStats;
///
/// let stats = StoreStats::default();
/// assert_eq!(stats.live(), 0);
/// assert_eq!(stats.oldest_ms, None);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoreStats {
    /// The marks stored (rows or keys), live or expired.
    pub marks: u64,
    /// Of those, how many have expired and wait for a purge (always 0 on
    /// Redis, which deletes an expired key by itself).
    pub expired: u64,
    /// When the oldest mark was written, in Unix milliseconds by the
    /// database clock; `None` when there is none, or the store keeps no
    /// write time (Redis).
    pub oldest_ms: Option<i64>,
    /// When the newest mark was written, like [`oldest_ms`](Self::oldest_ms).
    pub newest_ms: Option<i64>,
}

impl StoreStats {
    /// The marks that still count as seen: [`marks`](Self::marks) minus
    /// [`expired`](Self::expired).
    pub fn live(&self) -> u64 {
        self.marks.saturating_sub(self.expired)
    }
}
