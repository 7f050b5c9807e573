//! Admin operations of [`RedisStore`], for operators and the `babel-idem`
//! CLI: ping, stats, batched lookups and forgets. There is nothing to
//! migrate or purge: keys are made by the first `SET` and Redis deletes an
//! expired key by itself.

use super::{BACKEND, RedisCommandError, RedisStore};
use crate::store::{StoreError, StoreOperation, StoreStats, failed};

/// How many keys one `SCAN` step asks for.
const SCAN_COUNT: usize = 1_000;

/// # Admin operations
///
/// | operation | command |
/// |---|---|
/// | [`ping`](Self::ping) | `PING` |
/// | [`stats`](Self::stats) | `SCAN <cursor> MATCH <prefix><key prefix>* COUNT 1000`, until the cursor is 0 |
/// | [`stored_many`](Self::stored_many) | one `EXISTS <key>` per key, in one pipeline |
/// | [`forget_many`](Self::forget_many) | `DEL <key> <key> ...` |
/// | [`count_expired`](Self::count_expired), [`purge_expired`](Self::purge_expired) | none: Redis deletes expired keys itself (`PX`) |
///
/// ```no_run
/// use babel_idem::Store;
/// use babel_idem::store::RedisStore;
///
/// # async fn run() -> Result<(), babel_idem::StoreError> {
/// let store = RedisStore::builder()
///     .prefix("billing:idemp:")
///     .connect_lazy("redis://127.0.0.1:6379/")?;
/// store.ping().await?;
/// store.remember("id-A").await?;
/// assert_eq!(store.stored_many(&["id-A", "id-B"]).await?, [true, false]);
/// assert_eq!(store.stats("").await?.marks, 1);
/// assert_eq!(store.forget_many(&["id-A", "id-B"]).await?, 1);
/// assert_eq!(store.purge_expired().await?, 0, "Redis expires keys itself");
/// # Ok(())
/// # }
/// ```
impl RedisStore {
    /// One round trip: fails when the server cannot be reached or refuses
    /// the login (a wrong password fails here, not at the first delivery).
    pub async fn ping(&self) -> Result<(), StoreError> {
        let _: String = self
            .query(StoreOperation::Open, ::redis::cmd("PING"))
            .await?;
        Ok(())
    }

    /// Counts the keys under the store's prefix whose id starts with
    /// `key_prefix` (`""`: all of them; a
    /// [`Guard::scope`](crate::guard::Guard::scope)'s keys start with
    /// `<length>:<scope>:`), walking the keyspace with `SCAN`.
    ///
    /// `expired` is always 0 (an expired key is gone) and Redis keeps no
    /// write time, so `oldest_ms` and `newest_ms` are `None`. `SCAN` may
    /// return a key twice while Redis resizes its table, so on a busy
    /// server the count is close rather than exact. With
    /// [`php_claims`](crate::store::RedisStoreBuilder::php_claims), keys
    /// still claimed count too.
    pub async fn stats(&self, key_prefix: &str) -> Result<StoreStats, StoreError> {
        let mut pattern = self.prefix.as_bytes().to_vec();
        for byte in key_prefix.bytes() {
            if b"*?[]\\".contains(&byte) {
                pattern.push(b'\\');
            }
            pattern.push(byte);
        }
        pattern.push(b'*');
        let mut marks = 0;
        let mut cursor = 0u64;
        loop {
            let mut command = ::redis::cmd("SCAN");
            command
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(SCAN_COUNT);
            let (next, keys): (u64, Vec<Vec<u8>>) =
                self.query(StoreOperation::Maintenance, command).await?;
            marks += keys.len() as u64;
            if next == 0 {
                break;
            }
            cursor = next;
        }
        Ok(StoreStats {
            marks,
            ..StoreStats::default()
        })
    }

    /// For each key, whether Redis holds it: what
    /// [`forget_many`](Self::forget_many) would delete.
    pub async fn stored_many(&self, keys: &[&str]) -> Result<Vec<bool>, StoreError> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipeline = ::redis::pipe();
        for key in keys {
            pipeline.cmd("EXISTS").arg(self.key(key));
        }
        let mut connection = self.connection.clone();
        let counts: Vec<i64> = pipeline
            .query_async(&mut connection)
            .await
            .map_err(|e| failed(BACKEND, StoreOperation::Seen)(RedisCommandError::from(e)))?;
        Ok(counts.into_iter().map(|count| count > 0).collect())
    }

    /// Forgets every key in `keys` with one `DEL` and returns how many keys
    /// went (unknown keys are not an error, as with
    /// [`forget`](crate::store::Store::forget)).
    pub async fn forget_many(&self, keys: &[&str]) -> Result<u64, StoreError> {
        if keys.is_empty() {
            return Ok(0);
        }
        let mut command = ::redis::cmd("DEL");
        for key in keys {
            command.arg(self.key(key));
        }
        let removed: u64 = self.query(StoreOperation::Forget, command).await?;
        Ok(removed)
    }

    /// Always 0: Redis deletes a key when its TTL runs out, so no expired
    /// mark waits for a purge. Sends nothing.
    pub async fn count_expired(&self) -> Result<u64, StoreError> {
        Ok(0)
    }

    /// Deletes nothing and returns 0: Redis expires the keys itself (they
    /// are written with `PX <ttl>`). Here so a tool treats every persistent
    /// store alike. Sends nothing.
    pub async fn purge_expired(&self) -> Result<u64, StoreError> {
        Ok(0)
    }
}
