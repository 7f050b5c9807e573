//! [`ClaimStore`] for [`RedisStore`]: one Lua script per operation, sent as
//! `EVALSHA` (one round trip; the script is loaded on the first `NOSCRIPT`).
//!
//! Two layouts, chosen when the store is built:
//!
//! - **Beside the seen-set** (the default). Claims have keys of their own
//!   that a Go consumer never reads, so a claimed id never looks done.
//! - **The PHP SDK's** ([`RedisStoreBuilder::php_claims`]): one key per id
//!   holding `'1'` (claimed) or `'2'` (done), so a Rust worker joins a PHP fleet.

use std::sync::LazyLock;
use std::time::Duration;

use ::redis::{Script, ScriptInvocation};

use super::{BACKEND, RedisCommandError, RedisStore, RedisStoreBuilder};
use crate::store::claim::{Claim, ClaimStore, ClaimToken, server_lease_ms};
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
    /// `<claim prefix><id>` holds `<owner hex>:<fence>` with the lease as
    /// its expiry; `fence` is the store-wide counter every claim increments.
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
    /// worker took since. Commit refuses only an id that is already done.
    ///
    /// ```
    /// use babel_idem::RedisStore;
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
    /// use babel_idem::RedisStore;
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// let store = RedisStore::connect_lazy("redis://127.0.0.1:6379/")?;
    /// assert_eq!(store.key("order-42"), b"bq:idemp:order-42");
    /// assert_eq!(store.claim_key("order-42"), b"bq:idemp-claim:order-42");
    /// # Ok::<(), babel_idem::StoreError>(())
    /// # }).unwrap();
    /// ```
    pub fn claim_key(&self, id: &str) -> Vec<u8> {
        match &self.claims {
            ClaimKeys::Beside { claim_prefix, .. } => [claim_prefix, id.as_bytes()].concat(),
            ClaimKeys::Php | ClaimKeys::NoRoom => self.key(id),
        }
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
            let mut done = SCRIPTS.php_done.prepare_invoke();
            done.key(self.key(id)).arg(self.ttl_ms.unwrap_or(0));
            let _: i64 = self.invoke(StoreOperation::Remember, &done).await?;
            Ok(())
        })
    }

    async fn invoke<T: ::redis::FromRedisValue>(
        &self,
        operation: StoreOperation,
        script: &ScriptInvocation<'_>,
    ) -> Result<T, StoreError> {
        let mut connection = self.connection.clone();
        script
            .invoke_async(&mut connection)
            .await
            .map_err(|e| StoreError::new(operation, BACKEND, RedisCommandError::from(e)))
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

/// What each script's owner argument looks like: the claim value starts with it.
fn owner_arg(owner: ClaimToken) -> String {
    let mut arg = owner.to_hex();
    arg.push(':');
    arg
}

/// The scripts, hashed once per process.
struct Scripts {
    claim: Script,
    commit: Script,
    release: Script,
    renew: Script,
    php_claim: Script,
    php_done: Script,
    php_release: Script,
    php_renew: Script,
}

static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    claim: Script::new(include_str!("claim.lua")),
    commit: Script::new(include_str!("commit.lua")),
    release: Script::new(include_str!("release.lua")),
    renew: Script::new(include_str!("renew.lua")),
    php_claim: Script::new(include_str!("php_claim.lua")),
    php_done: Script::new(include_str!("php_done.lua")),
    php_release: Script::new(include_str!("php_release.lua")),
    php_renew: Script::new(include_str!("php_renew.lua")),
});

/// Reads a claim script's reply: `{0}` done, `{1, fence}` won, `{2, ms}` held.
fn claim_from_reply(reply: &[i64]) -> Result<Claim, StoreError> {
    match *reply {
        [0] => Ok(Claim::Done),
        [1, fence] if fence >= 0 => Ok(Claim::Won {
            fence: fence as u64,
        }),
        [2, left] => Ok(Claim::Held {
            retry_after: u64::try_from(left).ok().map(Duration::from_millis),
        }),
        _ => Err(StoreError::new(
            StoreOperation::Claim,
            BACKEND,
            format!("the claim script answered {reply:?}, which is not a claim outcome"),
        )),
    }
}

/// # Claim mode
///
/// One script per operation (`EVALSHA`, one round trip), so a duplicate of a
/// done id costs one round trip and a first delivery two (claim, commit).
///
/// Beside the seen-set (default), for the prefix `bq:idemp:`:
///
/// | key | value | written by |
/// |---|---|---|
/// | `bq:idemp:<id>` | `1`, the store's TTL | `commit`: the Go SDK's done marker (`SET NX`) |
/// | `bq:idemp-claim:<id>` | `<owner hex>:<fence>`, `PX <lease>` | `claim`, `renew`; deleted by `commit`, `release` |
/// | `bq:idemp-fence` | a counter | `INCR` on every won claim, never reset |
///
/// A Go consumer's `EXISTS bq:idemp:<id>` never sees a claim. `claim` wins
/// when there is no done marker and no live claim key; `commit`, `release`
/// and `renew` act only while the claim key still starts with the caller's
/// owner token, so a stale owner changes nothing.
///
/// In the PHP layout ([`RedisStoreBuilder::php_claims`]) the id's own key
/// holds `'1'` (claimed, `PX <lease>`) or `'2'` (done): unfenced, see there.
///
/// Any id works: keys are binary safe.
impl ClaimStore for RedisStore {
    fn claim<'a>(
        &'a self,
        id: &'a str,
        owner: ClaimToken,
        lease: Duration,
    ) -> StoreFuture<'a, Claim> {
        StoreFuture::new(async move {
            let operation = StoreOperation::Claim;
            let lease_ms = server_lease_ms(BACKEND, operation, lease)?;
            let mut script;
            match &self.claims {
                ClaimKeys::Beside { fence, .. } => {
                    script = SCRIPTS.claim.prepare_invoke();
                    script
                        .key(self.key(id))
                        .key(self.claim_key(id))
                        .key(fence)
                        .arg(owner_arg(owner))
                        .arg(lease_ms);
                }
                ClaimKeys::Php => {
                    script = SCRIPTS.php_claim.prepare_invoke();
                    script.key(self.key(id)).arg(lease_ms);
                }
                ClaimKeys::NoRoom => return Err(no_room(operation)),
            }
            let reply: Vec<i64> = self.invoke(operation, &script).await?;
            claim_from_reply(&reply)
        })
    }

    fn commit<'a>(&'a self, id: &'a str, owner: ClaimToken) -> StoreFuture<'a, bool> {
        StoreFuture::new(async move {
            let operation = StoreOperation::Commit;
            let ttl_ms = self.ttl_ms.unwrap_or(0);
            let mut script;
            match &self.claims {
                ClaimKeys::Beside { .. } => {
                    script = SCRIPTS.commit.prepare_invoke();
                    script
                        .key(self.key(id))
                        .key(self.claim_key(id))
                        .arg(owner_arg(owner))
                        .arg(ttl_ms);
                }
                ClaimKeys::Php => {
                    script = SCRIPTS.php_done.prepare_invoke();
                    script.key(self.key(id)).arg(ttl_ms);
                }
                ClaimKeys::NoRoom => return Err(no_room(operation)),
            }
            let committed: i64 = self.invoke(operation, &script).await?;
            Ok(committed == 1)
        })
    }

    fn release<'a>(&'a self, id: &'a str, owner: ClaimToken) -> StoreFuture<'a, bool> {
        StoreFuture::new(async move {
            let operation = StoreOperation::Release;
            let mut script;
            match &self.claims {
                ClaimKeys::Beside { .. } => {
                    script = SCRIPTS.release.prepare_invoke();
                    script.key(self.claim_key(id)).arg(owner_arg(owner));
                }
                ClaimKeys::Php => {
                    script = SCRIPTS.php_release.prepare_invoke();
                    script.key(self.key(id));
                }
                ClaimKeys::NoRoom => return Err(no_room(operation)),
            }
            let released: i64 = self.invoke(operation, &script).await?;
            Ok(released == 1)
        })
    }

    fn renew<'a>(
        &'a self,
        id: &'a str,
        owner: ClaimToken,
        lease: Duration,
    ) -> StoreFuture<'a, bool> {
        StoreFuture::new(async move {
            let operation = StoreOperation::Renew;
            let lease_ms = server_lease_ms(BACKEND, operation, lease)?;
            let mut script;
            match &self.claims {
                ClaimKeys::Beside { .. } => {
                    script = SCRIPTS.renew.prepare_invoke();
                    script
                        .key(self.claim_key(id))
                        .arg(owner_arg(owner))
                        .arg(lease_ms);
                }
                ClaimKeys::Php => {
                    script = SCRIPTS.php_renew.prepare_invoke();
                    script.key(self.key(id)).arg(lease_ms);
                }
                ClaimKeys::NoRoom => return Err(no_room(operation)),
            }
            let renewed: i64 = self.invoke(operation, &script).await?;
            Ok(renewed == 1)
        })
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
    fn claim_replies_are_read_strictly() {
        assert_eq!(claim_from_reply(&[0]).unwrap(), Claim::Done);
        assert_eq!(claim_from_reply(&[1, 7]).unwrap(), Claim::Won { fence: 7 });
        assert_eq!(
            claim_from_reply(&[2, 1500]).unwrap(),
            Claim::Held {
                retry_after: Some(Duration::from_millis(1500))
            }
        );
        assert_eq!(
            claim_from_reply(&[2, -1]).unwrap(),
            Claim::Held { retry_after: None }
        );
        assert!(claim_from_reply(&[3]).is_err());
        assert!(claim_from_reply(&[]).is_err());
    }
}
