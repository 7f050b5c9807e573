//! [`ClaimStore`] for [`RedisStore`]: one Lua script per operation, sent as
//! `EVALSHA` (one round trip; the script is loaded on the first `NOSCRIPT`).
//!
//! A script costs the server far more than a plain command (its call, then
//! about a plain command per `redis.call`), so the scripts make as few calls
//! as their outcome needs and answer with one integer, and each `EVALSHA`
//! is written straight into one command buffer.
//!
//! Two layouts, chosen when the store is built:
//!
//! - **Beside the seen-set** (the default). Claims have keys of their own
//!   that a Go consumer never reads, so a claimed id never looks done.
//! - **The PHP SDK's** ([`RedisStoreBuilder::php_claims`]): one key per id
//!   holding `'1'` (claimed) or `'2'` (done), so a Rust worker joins a PHP fleet.

use std::io::Write as _;
use std::sync::LazyLock;
use std::time::Duration;

use ::redis::{Cmd, ErrorKind, FromRedisValue, RedisWrite, Script, ServerErrorKind, ToRedisArgs};

use super::{BACKEND, RedisCommandError, RedisStore, RedisStoreBuilder};
use crate::store::batch::{claim_each, commit_each};
use crate::store::claim::{
    Claim, ClaimFuture, ClaimStore, ClaimToken, RenewFuture, server_lease_ms,
};
use crate::store::{StoreError, StoreFuture, StoreOperation};

/// The PHP SDK's default key prefix (`bq:idem:`, not the Go SDK's `bq:idemp:`).
const PHP_PREFIX: &str = "bq:idem:";

/// Which claim layout a builder makes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) enum ClaimLayout {
    #[default]
    Beside,
    Php,
}

/// The claim keys of one store, derived once from its prefix.
#[derive(Debug, Clone)]
pub(super) enum ClaimKeys {
    /// `<claim prefix><id>` holds the owner's hex token with the lease as
    /// its expiry; `fence` is the store-wide counter every won claim
    /// increments.
    Beside {
        claim_prefix: Vec<u8>,
        fence: Vec<u8>,
    },
    /// An empty prefix: every key is a seen-set key, so claims have no
    /// room beside it.
    NoRoom,
    /// The PHP SDK's single key per id.
    Php,
}

impl ClaimKeys {
    /// The keys for `layout` on a store whose seen-set keys are `prefix` + id.
    ///
    /// Beside `bq:idemp:`, claims live under `bq:idemp-claim:` and the fence
    /// counter is `bq:idemp-fence`. In general the prefix's last byte is
    /// replaced by `-` (by `+` when it is `-`): the two key spaces then differ
    /// at that byte, so no claim key is ever `prefix + some id`.
    pub(super) fn new(layout: ClaimLayout, prefix: &str) -> Self {
        if layout == ClaimLayout::Php {
            return ClaimKeys::Php;
        }
        let Some((&last, stem)) = prefix.as_bytes().split_last() else {
            return ClaimKeys::NoRoom;
        };
        let separator = if last == b'-' { b'+' } else { b'-' };
        let derived = |name: &[u8]| [stem, &[separator], name].concat();
        ClaimKeys::Beside {
            claim_prefix: derived(b"claim:"),
            fence: derived(b"fence"),
        }
    }

    pub(super) fn is_php(&self) -> bool {
        matches!(self, ClaimKeys::Php)
    }
}

impl RedisStoreBuilder {
    /// Speak the PHP SDK's claim layout, so a Rust worker can join a PHP
    /// fleet: one key per id, `'1'` while claimed (with the lease as its
    /// expiry), `'2'` once done. Sets the prefix to the PHP SDK's default
    /// `bq:idem:`; call [`prefix`](Self::prefix) after this for another.
    ///
    /// `seen` is then `GET == '2'` and `remember` writes `'2'`, as the PHP
    /// SDK does. The layout records **no owner**, so it is unfenced: every
    /// claim is won with fence `0` (real fences start at 1), and a worker
    /// whose lease lapsed can still release or renew the claim a second
    /// worker took since. Commit marks the id done over any claim, and
    /// answers `true` for an id already done, as every layout does.
    ///
    /// ```
    /// use babel_idem::store::RedisStore;
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// let store = RedisStore::builder().php_claims().connect_lazy("redis://127.0.0.1:6379/")?;
    /// assert_eq!(store.prefix(), "bq:idem:");
    /// assert_eq!(store.claim_key("order-42"), b"bq:idem:order-42");
    /// # Ok::<(), babel_idem::StoreError>(())
    /// # }).unwrap();
    /// ```
    pub fn php_claims(mut self) -> Self {
        self.claim_layout = ClaimLayout::Php;
        self.prefix = PHP_PREFIX.to_owned();
        self
    }
}

impl RedisStore {
    /// The key that holds `id`'s claim: beside the seen-set by default
    /// (`bq:idemp-claim:<id>` for the prefix `bq:idemp:`), the id's own key
    /// in the PHP layout.
    ///
    /// ```
    /// use babel_idem::store::RedisStore;
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// let store = RedisStore::connect_lazy("redis://127.0.0.1:6379/")?;
    /// assert_eq!(store.key("order-42"), b"bq:idemp:order-42");
    /// assert_eq!(store.claim_key("order-42"), b"bq:idemp-claim:order-42");
    /// # Ok::<(), babel_idem::StoreError>(())
    /// # }).unwrap();
    /// ```
    ///
    /// On a Redis Cluster the claim key shares its done key's slot: see
    /// [`guide::stores`](crate::guide::stores).
    pub fn claim_key(&self, id: &str) -> Vec<u8> {
        match &self.claims {
            ClaimKeys::Beside { claim_prefix, .. } => match self.claim_arg(claim_prefix, id) {
                ClaimArg::Joined(Joined(claim_prefix, id)) => {
                    [claim_prefix, id.as_bytes()].concat()
                }
                ClaimArg::Owned(key) => key,
            },
            ClaimKeys::Php | ClaimKeys::NoRoom => self.key(id),
        }
    }

    /// The claim key of `id` beside the seen-set, as a script argument.
    fn claim_arg<'a>(&'a self, claim_prefix: &'a [u8], id: &'a str) -> ClaimArg<'a> {
        #[cfg(feature = "redis-cluster")]
        if self.connection.is_cluster() {
            return ClaimArg::Owned(super::cluster::claim_key(claim_prefix, &self.prefix, id));
        }
        ClaimArg::Joined(Joined(claim_prefix, id))
    }

    /// `seen` in the PHP layout: only a done id (`'2'`) is seen, not a claim.
    pub(super) fn php_seen<'a>(&'a self, id: &'a str) -> StoreFuture<'a, bool> {
        StoreFuture::new(async move {
            let mut command = ::redis::cmd("GET");
            command.arg(self.key(id));
            let value: Option<Vec<u8>> = self.query(StoreOperation::Seen, command).await?;
            Ok(value.as_deref() == Some(b"2"))
        })
    }

    /// `remember` in the PHP layout: `'2'` over a claim or nothing.
    pub(super) fn php_remember<'a>(&'a self, id: &'a str) -> StoreFuture<'a, ()> {
        StoreFuture::new(async move {
            let ttl_ms = self.ttl_ms.unwrap_or(0);
            let (script, done) = self.php_call(&SCRIPTS.php_done, id, Some(ttl_ms));
            self.eval::<i64>(StoreOperation::Remember, script, &done)
                .await?;
            Ok(())
        })
    }

    /// The seen-set key of `id`, as a script argument.
    fn id_key<'a>(&'a self, id: &'a str) -> Joined<'a> {
        Joined(self.prefix.as_bytes(), id)
    }

    /// A PHP-layout script's call: `id`'s own key, then `arg` if there is one.
    fn php_call(
        &self,
        script: &'static Script,
        id: &str,
        arg: Option<i64>,
    ) -> (&'static Script, Cmd) {
        let mut call = evalsha(script, 1, id);
        call.arg(self.id_key(id));
        if let Some(arg) = arg {
            call.arg(arg);
        }
        (script, call)
    }

    /// Runs a script call made by [`evalsha`], loading the script into the
    /// server when it answers `NOSCRIPT` (a restart, `SCRIPT FLUSH`, a
    /// promoted replica); with [`wait_for_replicas`](RedisStoreBuilder::wait_for_replicas),
    /// a write's call is confirmed by `WAIT`.
    async fn eval<T: FromRedisValue>(
        &self,
        operation: StoreOperation,
        script: &Script,
        call: &Cmd,
    ) -> Result<T, StoreError> {
        if self.durability.is_some() && operation != StoreOperation::Release {
            return self.write(operation, Some(script), call).await;
        }
        let failed = |e| StoreError::new(operation, BACKEND, RedisCommandError::from(e));
        let mut connection = self.connection.clone();
        match call.query_async(&mut connection).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                script.load_async(&mut connection).await.map_err(failed)?;
                call.query_async(&mut connection).await.map_err(failed)
            }
            answered => answered.map_err(failed),
        }
    }
}

/// `EVALSHA <script's hash> <keys>`, for `keys` keys of `id` and up to two
/// arguments to follow. One buffer for the whole command, sized up front:
/// `Script::prepare_invoke` would give each argument a `Vec` of its own and
/// copy them all into a command per call.
fn evalsha(script: &Script, keys: usize, id: &str) -> Cmd {
    // The name, the hash, the count, the owner's 32 digits and a number in
    // 128 bytes; a prefix and the id per key.
    let mut call = Cmd::with_capacity(keys + 5, 128 + keys * (id.len() + 32));
    call.arg("EVALSHA").arg(script.get_hash()).arg(keys);
    call
}

/// A key written as one argument from its prefix and the id, with no
/// intermediate `Vec`.
struct Joined<'a>(&'a [u8], &'a str);

/// A claim key: prefix and id on one server, the cluster's tagged key on a
/// cluster.
enum ClaimArg<'a> {
    Joined(Joined<'a>),
    #[cfg_attr(not(feature = "redis-cluster"), allow(dead_code))]
    Owned(Vec<u8>),
}

impl ToRedisArgs for ClaimArg<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        match self {
            ClaimArg::Joined(joined) => joined.write_redis_args(out),
            ClaimArg::Owned(key) => out.write_arg(key),
        }
    }
}

impl ToRedisArgs for Joined<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        let mut arg = out.writer_for_next_arg();
        // Writes into the command's own buffer, which cannot fail.
        let _ = arg.write_all(self.0);
        let _ = arg.write_all(self.1.as_bytes());
    }
}

/// The owner's token as the scripts compare it: 32 lowercase hex digits,
/// written as one argument with no intermediate `String`.
struct Owner(ClaimToken);

impl ToRedisArgs for Owner {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        out.write_arg(&self.0.hex_digits());
    }
}

/// Claims need a key space apart from the seen-set's.
fn no_room(operation: StoreOperation) -> StoreError {
    StoreError::new(
        operation,
        BACKEND,
        "claim mode needs a non-empty key prefix: with an empty one every key \
         is a seen-set key, and a claim would look done to a Go consumer",
    )
}

/// The scripts, hashed once per process. The four claim scripts start with
/// `held.lua`, the answer for a claim another owner holds.
struct Scripts {
    claim: Script,
    claim_many: Script,
    #[cfg_attr(not(feature = "redis-cluster"), allow(dead_code))]
    claim_cluster: Script,
    #[cfg_attr(not(feature = "redis-cluster"), allow(dead_code))]
    claim_many_cluster: Script,
    commit: Script,
    commit_many: Script,
    release: Script,
    renew: Script,
    php_claim: Script,
    php_done: Script,
    php_release: Script,
    php_renew: Script,
}

static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    claim: Script::new(concat!(include_str!("held.lua"), include_str!("claim.lua"))),
    claim_many: Script::new(concat!(
        include_str!("held.lua"),
        include_str!("claim_many.lua")
    )),
    claim_cluster: Script::new(concat!(
        include_str!("held.lua"),
        include_str!("claim_cluster.lua")
    )),
    claim_many_cluster: Script::new(concat!(
        include_str!("held.lua"),
        include_str!("claim_many_cluster.lua")
    )),
    commit: Script::new(include_str!("commit.lua")),
    commit_many: Script::new(include_str!("commit_many.lua")),
    release: Script::new(include_str!("release.lua")),
    renew: Script::new(include_str!("renew.lua")),
    php_claim: Script::new(include_str!("php_claim.lua")),
    php_done: Script::new(include_str!("php_done.lua")),
    php_release: Script::new(include_str!("php_release.lua")),
    php_renew: Script::new(include_str!("php_renew.lua")),
});

/// Reads a claim script's reply: `-1` done, a fence (`0`: unfenced) won,
/// `-2` held with no expiry, `-3 - ms left` held.
fn claim_from_reply(reply: i64) -> Claim {
    match reply {
        -1 => Claim::Done,
        -2 => Claim::Held { retry_after: None },
        fence @ 0.. => Claim::Won {
            fence: fence.unsigned_abs(),
        },
        held => Claim::Held {
            retry_after: Some(Duration::from_millis((-3 - held).unsigned_abs())),
        },
    }
}

/// # Claim mode
///
/// One script per operation (`EVALSHA`, one round trip), so a duplicate of a
/// done id costs one round trip and a first delivery two (claim, commit).
/// `claim_many` and `commit_many` run a batch in one script (up to 512
/// entries per call), which [`Batched`](crate::store::Batched) uses for
/// concurrent deliveries: the script's fixed cost on the server is paid once
/// per batch instead of once per delivery.
///
/// Beside the seen-set (default), for the prefix `bq:idemp:`:
///
/// | key | value | written by |
/// |---|---|---|
/// | `bq:idemp:<id>` | `1`, the store's TTL | `commit`: the Go SDK's done marker (`SET NX`) |
/// | `bq:idemp-claim:<id>` | the owner's 32 hex digits, `PX <lease>` | `claim` (`SET NX`), `renew`; deleted by `commit`, `release` |
/// | `bq:idemp-fence` | a counter | `INCR` on every won claim, never reset |
///
/// A Go consumer's `EXISTS bq:idemp:<id>` never sees a claim. `claim` wins
/// when there is no done marker and no live claim key; `commit`, `release`
/// and `renew` act only while the claim key still holds the caller's owner
/// token, so a stale owner changes nothing. A `commit` that finds the done
/// marker answers `true` all the same: retried after its first attempt took
/// effect (a lost reply, a `WAIT` that failed), it finds its effect recorded.
///
/// In the PHP layout ([`RedisStoreBuilder::php_claims`]) the id's own key
/// holds `'1'` (claimed, `PX <lease>`) or `'2'` (done): unfenced, see there.
///
/// Any id works: keys are binary safe.
impl ClaimStore for RedisStore {
    fn claim<'a>(&'a self, id: &'a str, owner: ClaimToken, lease: Duration) -> ClaimFuture<'a> {
        StoreFuture::new(async move {
            let operation = StoreOperation::Claim;
            let lease_ms = server_lease_ms(BACKEND, operation, lease)?;
            let (script, call) = match &self.claims {
                ClaimKeys::Beside {
                    claim_prefix,
                    fence,
                } => {
                    let (script, fence) = self.fence_for(fence, id);
                    let mut call = evalsha(script, 3, id);
                    call.arg(self.id_key(id))
                        .arg(self.claim_arg(claim_prefix, id))
                        .arg(fence)
                        .arg(Owner(owner))
                        .arg(lease_ms);
                    (script, call)
                }
                ClaimKeys::Php => self.php_call(&SCRIPTS.php_claim, id, Some(lease_ms)),
                ClaimKeys::NoRoom => return Err(no_room(operation)),
            };
            let reply = self.eval(operation, script, &call).await?;
            Ok(claim_from_reply(reply))
        })
    }

    fn commit<'a>(&'a self, id: &'a str, owner: ClaimToken) -> StoreFuture<'a, bool> {
        StoreFuture::new(async move {
            let operation = StoreOperation::Commit;
            let ttl_ms = self.ttl_ms.unwrap_or(0);
            let (script, call) = match &self.claims {
                ClaimKeys::Beside { claim_prefix, .. } => {
                    let script = &SCRIPTS.commit;
                    let mut call = evalsha(script, 2, id);
                    call.arg(self.id_key(id))
                        .arg(self.claim_arg(claim_prefix, id))
                        .arg(Owner(owner))
                        .arg(ttl_ms);
                    (script, call)
                }
                ClaimKeys::Php => self.php_call(&SCRIPTS.php_done, id, Some(ttl_ms)),
                ClaimKeys::NoRoom => return Err(no_room(operation)),
            };
            let reply = self.eval::<i64>(operation, script, &call).await?;
            // Beside the seen-set: 1 committed or already done, 0 lost. The
            // PHP layout marks over any claim: 1 marked, 0 already done,
            // both done now.
            Ok(reply == 1 || self.claims.is_php())
        })
    }

    fn release<'a>(&'a self, id: &'a str, owner: ClaimToken) -> StoreFuture<'a, bool> {
        StoreFuture::new(async move {
            let operation = StoreOperation::Release;
            let (script, call) = match &self.claims {
                ClaimKeys::Beside { claim_prefix, .. } => {
                    let script = &SCRIPTS.release;
                    let mut call = evalsha(script, 1, id);
                    call.arg(self.claim_arg(claim_prefix, id)).arg(Owner(owner));
                    (script, call)
                }
                ClaimKeys::Php => self.php_call(&SCRIPTS.php_release, id, None),
                ClaimKeys::NoRoom => return Err(no_room(operation)),
            };
            Ok(self.eval::<i64>(operation, script, &call).await? == 1)
        })
    }

    fn renew<'a>(&'a self, id: &'a str, owner: ClaimToken, lease: Duration) -> RenewFuture<'a> {
        StoreFuture::new(async move {
            let operation = StoreOperation::Renew;
            let lease_ms = server_lease_ms(BACKEND, operation, lease)?;
            let (script, call) = match &self.claims {
                ClaimKeys::Beside { claim_prefix, .. } => {
                    let script = &SCRIPTS.renew;
                    let mut call = evalsha(script, 1, id);
                    call.arg(self.claim_arg(claim_prefix, id))
                        .arg(Owner(owner))
                        .arg(lease_ms);
                    (script, call)
                }
                ClaimKeys::Php => self.php_call(&SCRIPTS.php_renew, id, Some(lease_ms)),
                ClaimKeys::NoRoom => return Err(no_room(operation)),
            };
            Ok(self.eval::<i64>(operation, script, &call).await? == 1)
        })
    }

    /// Beside the seen-set: one script per 512 entries
    /// (`claim_many.lua`, `claim.lua` applied to each entry in order). The
    /// PHP layout claims one entry at a time.
    fn claim_many<'a>(
        &'a self,
        claims: &'a [(&'a str, ClaimToken)],
        lease: Duration,
    ) -> StoreFuture<'a, Vec<Claim>> {
        StoreFuture::new(async move {
            let operation = StoreOperation::Claim;
            let lease_ms = server_lease_ms(BACKEND, operation, lease)?;
            let (claim_prefix, fence) = match &self.claims {
                ClaimKeys::Beside {
                    claim_prefix,
                    fence,
                } => (claim_prefix, fence),
                ClaimKeys::Php => return claim_each(self, claims, lease).await,
                ClaimKeys::NoRoom => return Err(no_room(operation)),
            };
            let batch = Batch {
                operation,
                script: if self.connection.is_cluster() {
                    &SCRIPTS.claim_many_cluster
                } else {
                    &SCRIPTS.claim_many
                },
                first_key: Some(fence),
                claim_prefix,
                argument: lease_ms,
            };
            let replies = self.run_batch(&batch, claims).await?;
            Ok(replies.into_iter().map(claim_from_reply).collect())
        })
    }

    /// Beside the seen-set: one script per 512 entries
    /// (`commit_many.lua`, `commit.lua` applied to each entry in order). The
    /// PHP layout commits one entry at a time.
    fn commit_many<'a>(
        &'a self,
        commits: &'a [(&'a str, ClaimToken)],
    ) -> StoreFuture<'a, Vec<bool>> {
        StoreFuture::new(async move {
            let operation = StoreOperation::Commit;
            let claim_prefix = match &self.claims {
                ClaimKeys::Beside { claim_prefix, .. } => claim_prefix,
                ClaimKeys::Php => return commit_each(self, commits).await,
                ClaimKeys::NoRoom => return Err(no_room(operation)),
            };
            let batch = Batch {
                operation,
                script: &SCRIPTS.commit_many,
                first_key: None,
                claim_prefix,
                argument: self.ttl_ms.unwrap_or(0),
            };
            let replies = self.run_batch(&batch, commits).await?;
            Ok(replies.into_iter().map(|reply| reply == 1).collect())
        })
    }
}

/// The most entries one batch script takes: the server runs a script to
/// its end before anything else, so a huge batch goes in several.
const MAX_SCRIPT_BATCH: usize = 512;

/// A batch script and what its calls share: `EVALSHA <hash> <n>
/// [first_key] (<done key> <claim key>)* <argument> <owner>*`, one integer
/// answered per entry.
struct Batch<'a> {
    operation: StoreOperation,
    script: &'a Script,
    /// A key before the entries' (the fence counter).
    first_key: Option<&'a [u8]>,
    claim_prefix: &'a [u8],
    /// The one argument before the owners (a lease or a TTL, in ms).
    argument: i64,
}

impl RedisStore {
    /// The claim script and the fence counter for `id`: the store's one
    /// counter on one server, the counter of the id's slot on a cluster.
    fn fence_for<'a>(&self, fence: &'a [u8], id: &str) -> (&'static Script, ClaimArg<'a>) {
        #[cfg(feature = "redis-cluster")]
        if self.connection.is_cluster() {
            let done = self.key(id);
            return (
                &SCRIPTS.claim_cluster,
                ClaimArg::Owned(super::cluster::fence_key(fence, &done)),
            );
        }
        let _ = id;
        (&SCRIPTS.claim, ClaimArg::Joined(Joined(fence, "")))
    }

    /// Runs `batch` over `entries`, [`MAX_SCRIPT_BATCH`] per call; on a
    /// cluster one call per slot share of the entries (the slot's fence
    /// counter first), in one pipeline per master, all at once. The replies
    /// in the entries' order.
    async fn run_batch(
        &self,
        batch: &Batch<'_>,
        entries: &[(&str, ClaimToken)],
    ) -> Result<Vec<i64>, StoreError> {
        #[cfg(feature = "redis-cluster")]
        if self.connection.is_cluster() {
            let keys: Vec<Vec<u8>> = entries.iter().map(|(id, _)| self.key(id)).collect();
            let groups: Vec<Vec<usize>> = self
                .slot_groups(&keys)
                .iter()
                .flat_map(|group| group.chunks(MAX_SCRIPT_BATCH).map(<[usize]>::to_vec))
                .collect();
            let (groups, answers) = self
                .per_slot(
                    batch.operation,
                    &keys,
                    groups,
                    Some(batch.script),
                    true,
                    |group| {
                        let fence = batch
                            .first_key
                            .map(|fence| super::cluster::fence_key(fence, &keys[group[0]]));
                        let share: Vec<(&str, ClaimToken)> =
                            group.iter().map(|&i| entries[i]).collect();
                        self.batch_call(batch, fence.as_deref(), &share)
                    },
                )
                .await?;
            let mut replies = vec![0; entries.len()];
            for (group, answer) in groups.iter().zip(answers) {
                let answer: Vec<i64> = FromRedisValue::from_redis_value(answer)
                    .map_err(|e| super::parse_failed(batch.operation, e))?;
                for (&i, reply) in group.iter().zip(answer) {
                    replies[i] = reply;
                }
            }
            return Ok(replies);
        }
        let mut replies = Vec::with_capacity(entries.len());
        for chunk in entries.chunks(MAX_SCRIPT_BATCH) {
            let call = self.batch_call(batch, batch.first_key, chunk);
            let chunk_replies: Vec<i64> = self.eval(batch.operation, batch.script, &call).await?;
            replies.extend(chunk_replies);
        }
        Ok(replies)
    }

    /// `batch`'s script call for `chunk` (at most [`MAX_SCRIPT_BATCH`]
    /// entries), with `first_key` before the entries' keys.
    fn batch_call(
        &self,
        batch: &Batch<'_>,
        first_key: Option<&[u8]>,
        chunk: &[(&str, ClaimToken)],
    ) -> Cmd {
        let keys = 2 * chunk.len() + usize::from(first_key.is_some());
        let id_bytes: usize = chunk.iter().map(|(id, _)| id.len()).sum();
        // Per entry two prefixed keys, and an owner's 32 digits.
        let mut call = Cmd::with_capacity(
            keys + chunk.len() + 5,
            128 + 2 * id_bytes + chunk.len() * 96,
        );
        call.arg("EVALSHA").arg(batch.script.get_hash()).arg(keys);
        if let Some(key) = first_key {
            call.arg(key);
        }
        for &(id, _) in chunk {
            call.arg(self.id_key(id))
                .arg(self.claim_arg(batch.claim_prefix, id));
        }
        call.arg(batch.argument);
        for &(_, owner) in chunk {
            call.arg(Owner(owner));
        }
        call
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn beside(prefix: &str) -> (Vec<u8>, Vec<u8>) {
        match ClaimKeys::new(ClaimLayout::Beside, prefix) {
            ClaimKeys::Beside {
                claim_prefix,
                fence,
            } => (claim_prefix, fence),
            other => panic!("{prefix:?}: {other:?}"),
        }
    }

    #[test]
    fn claim_keys_never_fall_inside_the_seen_set() {
        for prefix in ["bq:idemp:", "billing:", "x", "a-", "bq:idemp"] {
            let (claims, fence) = beside(prefix);
            for key in [&claims, &fence] {
                assert!(
                    !key.starts_with(prefix.as_bytes()),
                    "{prefix:?}: {:?} would be read as a seen-set id",
                    String::from_utf8_lossy(key)
                );
            }
            assert!(
                !fence.starts_with(&claims),
                "{prefix:?}: the fence is no claim"
            );
        }
        assert_eq!(beside("bq:idemp:").0, b"bq:idemp-claim:");
        assert_eq!(beside("bq:idemp:").1, b"bq:idemp-fence");
        assert!(matches!(
            ClaimKeys::new(ClaimLayout::Beside, ""),
            ClaimKeys::NoRoom
        ));
    }

    #[test]
    fn claim_replies_decode_every_outcome() {
        assert_eq!(claim_from_reply(-1), Claim::Done);
        assert_eq!(claim_from_reply(7), Claim::Won { fence: 7 });
        assert_eq!(claim_from_reply(0), Claim::Won { fence: 0 });
        assert_eq!(claim_from_reply(-2), Claim::Held { retry_after: None });
        let held = |ms| Claim::Held {
            retry_after: Some(Duration::from_millis(ms)),
        };
        assert_eq!(claim_from_reply(-3), held(0));
        assert_eq!(claim_from_reply(-1503), held(1500));
        assert_eq!(claim_from_reply(i64::MIN), held(i64::MAX as u64 - 2));
    }

    #[test]
    fn script_calls_are_written_as_one_argument_each() {
        let owner = ClaimToken::random();
        let mut call = evalsha(&SCRIPTS.release, 1, "id\n1");
        call.arg(Joined(b"bq:idemp-claim:", "id\n1"))
            .arg(Owner(owner));
        let args: Vec<&[u8]> = call
            .args_iter()
            .map(|arg| match arg {
                ::redis::Arg::Simple(bytes) => bytes,
                other => panic!("only plain arguments, not {other:?}"),
            })
            .collect();
        assert_eq!(
            args,
            [
                b"EVALSHA".as_slice(),
                SCRIPTS.release.get_hash().as_bytes(),
                b"1",
                b"bq:idemp-claim:id\n1",
                owner.to_hex().as_bytes(),
            ]
        );
    }
}
