//! [`Admin`] for [`RedisStore`], and what an operator's tool needs beside
//! it: ping. There is nothing to migrate or purge: keys are made by the
//! first `SET`, and Redis deletes an expired mark or claim by itself.

use std::sync::LazyLock;

use ::redis::{FromRedisValue, Script};

use super::claim::ClaimKeys;
use super::{RedisStore, command_failed};
#[cfg(feature = "redis-cluster")]
use crate::redis_client::join_all;
use crate::store::admin::{Admin, IdState, Retention, StoreStats};
use crate::store::{StoreError, StoreFuture, StoreOperation};

/// How many keys one `SCAN` step asks for.
const SCAN_COUNT: usize = 1_000;

/// How many of the keys `stats` finds it reads the time left of (`PTTL`),
/// for the [`Retention`].
const RETENTION_SAMPLE: usize = 100;

/// The PHP layout's forget: deletes each key that holds `'2'` (done) and
/// leaves a claim (`'1'`) to its holder, atomically per call.
static PHP_FORGET: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("php_forget.lua")));

/// # Admin operations
///
/// | operation | command |
/// |---|---|
/// | [`ping`](Self::ping) | `PING` |
/// | `stats` | `SCAN <cursor> MATCH <prefix><key prefix>* COUNT 1000`, until the cursor is 0 (on a cluster, on every master); then `PTTL <key>` of up to 100 of the keys found, in one pipeline (one per master on a cluster), for the retention |
/// | `states` | one pipeline: `EXISTS <key>` and `EXISTS <claim key>` per id; in the PHP layout, `GET <key>` per id (`'2'` done, another value claimed); on a cluster one pipeline per slot, all at once |
/// | `forget_ids` | `DEL <key> ...`; in the PHP layout a script that deletes the keys holding `'2'`; on a cluster one call per slot |
/// | `count_expired`, `purge_expired`, `count_finished_claims`, `purge_finished_claims` | none: Redis deletes expired keys itself (`PX`), and a claim's key expires with its lease |
///
/// ```no_run
/// use babel_idem::Store;
/// use babel_idem::store::{Admin, IdState, RedisStore};
///
/// # async fn run() -> Result<(), babel_idem::StoreError> {
/// let store = RedisStore::builder()
///     .prefix("billing:idemp:")
///     .connect_lazy("redis://127.0.0.1:6379/")?;
/// store.ping().await?;
/// store.remember("id-A").await?;
/// assert_eq!(store.states(&["id-A", "id-B"]).await?, [IdState::Done, IdState::Absent]);
/// assert_eq!(store.stats("").await?.marks, 1);
/// assert_eq!(store.forget_ids(&["id-A", "id-B"]).await?, 1);
/// assert_eq!(store.purge_expired(10_000).await?, 0, "Redis expires keys itself");
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

    /// The states of `ids` on a cluster: `EXISTS` (`GET` in the PHP layout)
    /// of each done key and claim key, in one pipeline per master.
    #[cfg(feature = "redis-cluster")]
    async fn cluster_states(&self, ids: &[&str]) -> Result<Vec<IdState>, StoreError> {
        let operation = StoreOperation::Seen;
        let php = self.claims.is_php();
        let beside = matches!(self.claims, ClaimKeys::Beside { .. });
        let per_id = if beside { 2 } else { 1 };
        let mut keys = Vec::with_capacity(ids.len() * per_id);
        for id in ids {
            keys.push(self.key(id));
            if beside {
                keys.push(self.claim_key(id));
            }
        }
        let each = (0..keys.len()).map(|i| vec![i]).collect();
        let (_, replies) = self
            .per_slot(operation, &keys, each, None, false, |group| {
                let mut command = ::redis::cmd(if php { "GET" } else { "EXISTS" });
                command.arg(&keys[group[0]]);
                command
            })
            .await?;
        if php {
            return replies
                .into_iter()
                .map(|value| {
                    let value = Option::<Vec<u8>>::from_redis_value(value)
                        .map_err(|e| super::parse_failed(operation, e))?;
                    Ok(match value.as_deref() {
                        None => IdState::Absent,
                        Some(b"2") => IdState::Done,
                        Some(_) => IdState::Claimed,
                    })
                })
                .collect();
        }
        let counts = replies
            .into_iter()
            .map(|value| {
                i64::from_redis_value(value).map_err(|e| super::parse_failed(operation, e))
            })
            .collect::<Result<Vec<i64>, StoreError>>()?;
        Ok(states_from_counts(&counts, per_id))
    }

    /// The states of `ids` in one pipeline (one server).
    async fn states_in_slot(
        &self,
        ids: impl Iterator<Item = &str>,
    ) -> Result<Vec<IdState>, StoreError> {
        let mut pipeline = ::redis::pipe();
        if self.claims.is_php() {
            for id in ids {
                pipeline.cmd("GET").arg(self.key(id));
            }
            let values: Vec<Option<Vec<u8>>> =
                self.pipelined(StoreOperation::Seen, &pipeline).await?;
            return Ok(values
                .into_iter()
                .map(|value| match value.as_deref() {
                    None => IdState::Absent,
                    Some(b"2") => IdState::Done,
                    // `'1'`, or anything else the PHP SDK's claim finds
                    // held: a claim, never done.
                    Some(_) => IdState::Claimed,
                })
                .collect());
        }
        let beside = matches!(self.claims, ClaimKeys::Beside { .. });
        for id in ids {
            pipeline.cmd("EXISTS").arg(self.key(id));
            if beside {
                pipeline.cmd("EXISTS").arg(self.claim_key(id));
            }
        }
        let counts: Vec<i64> = self.pipelined(StoreOperation::Seen, &pipeline).await?;
        let per_id = if beside { 2 } else { 1 };
        Ok(states_from_counts(&counts, per_id))
    }

    /// The [`Retention`] `keys` show: their `PTTL`, in one pipeline (on a
    /// cluster one per master, all at once).
    async fn retention_of(&self, keys: &[Vec<u8>]) -> Result<Retention, StoreError> {
        let operation = StoreOperation::Maintenance;
        if keys.is_empty() {
            return Ok(Retention::Unknown);
        }
        #[cfg(feature = "redis-cluster")]
        if self.connection.is_cluster() {
            let each = (0..keys.len()).map(|i| vec![i]).collect();
            let (_, replies) = self
                .per_slot(operation, keys, each, None, false, |group| {
                    let mut command = ::redis::cmd("PTTL");
                    command.arg(&keys[group[0]]);
                    command
                })
                .await?;
            let left = replies
                .into_iter()
                .map(|value| {
                    i64::from_redis_value(value).map_err(|e| super::parse_failed(operation, e))
                })
                .collect::<Result<Vec<i64>, StoreError>>()?;
            return Ok(retention_from_time_left(&left));
        }
        let mut pipeline = ::redis::pipe();
        for key in keys {
            pipeline.cmd("PTTL").arg(key);
        }
        let left: Vec<i64> = self.pipelined(operation, &pipeline).await?;
        Ok(retention_from_time_left(&left))
    }

    /// Runs `pipeline`, answering one value per command.
    async fn pipelined<T: ::redis::FromRedisValue>(
        &self,
        operation: StoreOperation,
        pipeline: &::redis::Pipeline,
    ) -> Result<T, StoreError> {
        let connection = &mut self.connection.clone();
        let reply = pipeline.query_async(connection).await;
        reply.map_err(command_failed(operation))
    }
}

/// `keys` added to `sample` while it holds fewer than [`RETENTION_SAMPLE`].
fn take_sample(sample: &mut Vec<Vec<u8>>, keys: Vec<Vec<u8>>) {
    let room = RETENTION_SAMPLE.saturating_sub(sample.len());
    sample.extend(keys.into_iter().take(room));
}

/// The [`Retention`] keys with these `PTTL` answers show: `-1` (no expiry)
/// makes it [`Forever`](Retention::Forever), else the most time left, in
/// whole seconds, is a floor; `-2` (a key gone since the `SCAN`) says
/// nothing.
fn retention_from_time_left(left: &[i64]) -> Retention {
    if left.contains(&-1) {
        return Retention::Forever;
    }
    match left.iter().copied().filter(|ms| *ms >= 0).max() {
        Some(ms) => Retention::AtLeast(std::time::Duration::from_secs(ms as u64 / 1_000)),
        None => Retention::Unknown,
    }
}

/// The states of ids from their `EXISTS` counts, `per_id` a row: the done
/// key's, then (two a row) the claim key's; done wins over claimed.
fn states_from_counts(counts: &[i64], per_id: usize) -> Vec<IdState> {
    counts
        .chunks(per_id)
        .map(|found| match found {
            [done, ..] if *done > 0 => IdState::Done,
            [_, claimed] if *claimed > 0 => IdState::Claimed,
            _ => IdState::Absent,
        })
        .collect()
}

/// `expired` is always 0 in `stats` (an expired key is gone) and Redis
/// keeps no write time, so `oldest_ms` and `newest_ms` are `None`, and the
/// retention is read from the time up to 100 keys have left: `forever`
/// when one has no expiry, else at least the most time one has left. `SCAN`
/// may return a key twice while Redis resizes its table, so on a busy
/// server the count is close rather than exact. In the PHP layout
/// ([`php_claims`](crate::store::RedisStoreBuilder::php_claims)), keys
/// still claimed count too.
impl Admin for RedisStore {
    fn stats<'a>(&'a self, key_prefix: &'a str) -> StoreFuture<'a, StoreStats> {
        StoreFuture::new(async move {
            let mut pattern = self.prefix.as_bytes().to_vec();
            for byte in key_prefix.bytes() {
                if b"*?[]\\".contains(&byte) {
                    pattern.push(b'\\');
                }
                pattern.push(byte);
            }
            pattern.push(b'*');
            let scan = |cursor: u64| {
                let mut command = ::redis::cmd("SCAN");
                command
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(SCAN_COUNT);
                command
            };
            #[cfg(feature = "redis-cluster")]
            if let Some((connection, masters)) = self
                .cluster_masters()
                .await
                .map_err(command_failed(StoreOperation::Maintenance))?
            {
                // Each master holds its slots' keys; a replica's are copies.
                let counts = join_all(masters.iter().map(|(host, port)| {
                    let mut connection = connection.clone();
                    let scan = &scan;
                    async move {
                        let mut marks = 0u64;
                        let mut sample = Vec::new();
                        let mut cursor = 0u64;
                        loop {
                            let (next, keys): (u64, Vec<Vec<u8>>) =
                                crate::redis_client::cluster::on_node(
                                    &mut connection,
                                    host,
                                    *port,
                                    scan(cursor),
                                )
                                .await?;
                            marks += keys.len() as u64;
                            take_sample(&mut sample, keys);
                            if next == 0 {
                                return Ok::<_, ::redis::RedisError>((marks, sample));
                            }
                            cursor = next;
                        }
                    }
                }))
                .await;
                let mut marks = 0;
                let mut sample = Vec::new();
                for count in counts {
                    let (found, keys) =
                        count.map_err(command_failed(StoreOperation::Maintenance))?;
                    marks += found;
                    take_sample(&mut sample, keys);
                }
                return Ok(StoreStats {
                    marks,
                    retention: self.retention_of(&sample).await?,
                    ..StoreStats::default()
                });
            }
            let mut marks = 0;
            let mut sample = Vec::new();
            let mut cursor = 0u64;
            loop {
                let (next, keys): (u64, Vec<Vec<u8>>) = self
                    .query(StoreOperation::Maintenance, scan(cursor))
                    .await?;
                marks += keys.len() as u64;
                take_sample(&mut sample, keys);
                if next == 0 {
                    break;
                }
                cursor = next;
            }
            Ok(StoreStats {
                marks,
                retention: self.retention_of(&sample).await?,
                ..StoreStats::default()
            })
        })
    }

    fn states<'a>(&'a self, ids: &'a [&'a str]) -> StoreFuture<'a, Vec<IdState>> {
        StoreFuture::new(async move {
            if ids.is_empty() {
                return Ok(Vec::new());
            }
            #[cfg(feature = "redis-cluster")]
            if self.connection.is_cluster() {
                return self.cluster_states(ids).await;
            }
            self.states_in_slot(ids.iter().copied()).await
        })
    }

    fn forget_ids<'a>(&'a self, ids: &'a [&'a str]) -> StoreFuture<'a, u64> {
        StoreFuture::new(async move {
            if ids.is_empty() {
                return Ok(0);
            }
            let operation = StoreOperation::Forget;
            let keys: Vec<Vec<u8>> = ids.iter().map(|id| self.key(id)).collect();
            // One `DEL` (or the PHP layout's script) per slot on a cluster.
            let php = self.claims.is_php();
            let groups = self.slot_groups(&keys);
            let (_, removed) = self
                .per_slot(
                    operation,
                    &keys,
                    groups,
                    php.then_some(&*PHP_FORGET),
                    false,
                    |group| {
                        let mut command = if php {
                            let mut call = ::redis::cmd("EVALSHA");
                            call.arg(PHP_FORGET.get_hash()).arg(group.len());
                            call
                        } else {
                            ::redis::cmd("DEL")
                        };
                        for &i in group {
                            command.arg(&keys[i]);
                        }
                        command
                    },
                )
                .await?;
            let mut total = 0;
            for count in removed {
                total +=
                    u64::from_redis_value(count).map_err(|e| super::parse_failed(operation, e))?;
            }
            Ok(total)
        })
    }

    /// Always 0: Redis deletes a key when its TTL runs out. Sends nothing.
    fn count_expired(&self) -> StoreFuture<'_, u64> {
        StoreFuture::ready(Ok(0))
    }

    /// Deletes nothing and returns 0: the marks are written with
    /// `PX <ttl>`, and Redis expires them itself. Sends nothing.
    fn purge_expired(&self, _limit: u32) -> StoreFuture<'_, u64> {
        StoreFuture::ready(Ok(0))
    }

    /// Always 0: a claim's key expires with its lease, and a commit
    /// deletes it. Sends nothing.
    fn count_finished_claims(&self) -> StoreFuture<'_, u64> {
        StoreFuture::ready(Ok(0))
    }

    /// Deletes nothing and returns 0, as
    /// [`count_finished_claims`](Admin::count_finished_claims) says why.
    fn purge_finished_claims(&self, _limit: u32) -> StoreFuture<'_, u64> {
        StoreFuture::ready(Ok(0))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_key_without_expiry_makes_the_retention_forever() {
        assert_eq!(
            retention_from_time_left(&[5_000, -1, -2]),
            Retention::Forever
        );
    }

    #[test]
    fn the_most_time_left_in_whole_seconds_is_the_floor() {
        assert_eq!(
            retention_from_time_left(&[1_999, 86_399_999, -2]),
            Retention::AtLeast(Duration::from_secs(86_399))
        );
    }

    #[test]
    fn keys_gone_since_the_scan_say_nothing() {
        assert_eq!(retention_from_time_left(&[-2, -2]), Retention::Unknown);
        assert_eq!(retention_from_time_left(&[]), Retention::Unknown);
    }

    #[test]
    fn the_sample_stops_at_its_size() {
        let mut sample = Vec::new();
        take_sample(&mut sample, vec![b"k".to_vec(); 70]);
        take_sample(&mut sample, vec![b"k".to_vec(); 70]);
        assert_eq!(sample.len(), RETENTION_SAMPLE);
    }
}
