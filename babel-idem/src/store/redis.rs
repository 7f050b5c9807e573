//! [`RedisStore`]: a seen-set shared by a fleet, in Redis (feature `redis`).
//! The commands, the layout and the limits are documented on the type.

use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use ::redis::{Client, RedisError};

use super::settings::{Drivers, optional_ttl_millis, require_tokio};
use super::{Store, StoreError, StoreFuture, StoreOperation, failed};

mod admin;
mod claim;

const BACKEND: &str = "redis";

/// The Go SDK's key prefix.
const DEFAULT_PREFIX: &str = "bq:idemp:";

/// A seen-set in Redis, shared by every consumer that points at the server.
///
/// The key layout is the Go SDK's, so Go and Rust consumers share one seen-set:
///
/// | operation | command (one round trip each) |
/// |---|---|
/// | `seen` | `EXISTS bq:idemp:<id>` |
/// | `remember` | `SET bq:idemp:<id> 1 NX`, plus `PX <ttl ms>` with a TTL |
/// | `forget` | `DEL bq:idemp:<id>` |
/// | `seen_many` | one `MGET` of every key |
/// | `remember_many` | `remember`'s `SET` per id, in one `MULTI`/`EXEC` pipeline |
///
/// Keys are binary safe, so any id (NUL, newlines, 10 KB) is stored verbatim.
/// Expiry is Redis's own, so no purge is needed.
///
/// # Prefixes
///
/// A store owns every key that starts with its prefix, so a prefix is
/// refused when the store is built unless it:
///
/// - is 2 to 128 printable ASCII characters, starting with a letter or a
///   digit and ending with `:` (never empty: with no prefix, any
///   application key would read as a remembered id and `forget` would
///   delete it);
/// - holds no space, control or glob character (`* ? [ ] \`), so
///   `SCAN MATCH <prefix>*` lists exactly the store's keys;
/// - does not nest with the Go SDK's default `bq:idemp:` (`bq:` or
///   `bq:idemp:billing:` are refused): with nested prefixes, the id
///   `billing:X` of one store is the id `X` of the other.
///
/// Nesting between two prefixes of your own (`billing:` and
/// `billing:eu:`) cannot be seen from one store: give each seen-set a
/// sibling prefix (`billing:idemp:`, `shipping:idemp:`), or share one
/// prefix and keep services apart with [`Guard::scope`](crate::guard::Guard::scope),
/// whose keys never collide.
///
/// # Runtime
///
/// Build the store inside a Tokio runtime that has its time and I/O drivers
/// (the default of `#[tokio::main]`, or `enable_all()`): the client times
/// out every command and talks over Tokio sockets. On a runtime without
/// them, building fails with an error that says so. (Tokio offers no query
/// for its drivers: the check makes a timer and a socket and catches the
/// panic Tokio raises when a driver is missing, so the panic hook prints
/// Tokio's message once; under `panic = "abort"` the process stops there,
/// when the store is built, not at the first delivery.)
///
/// Claim mode keeps its claims beside these keys (or in the PHP SDK's
/// layout): see the [`ClaimStore`](crate::store::ClaimStore) impl below.
///
/// # One server, not Redis Cluster
///
/// The store talks to one Redis server (a standalone server, or the primary
/// a proxy or Sentinel points to). Redis Cluster is **not supported**: a
/// cluster URL is refused when the store is built, and a cluster node that
/// answers `MOVED`/`ASK` makes the operation fail with an error that says so.
///
/// The store connects lazily and reconnects by itself: building it needs no
/// server, each operation fails with a [`StoreError`] while the server is
/// unreachable, and the same store works again once it answers.
///
/// ```no_run
/// use babel_idem::Store;
/// use babel_idem::store::RedisStore;
/// use std::time::Duration;
///
/// # async fn run() -> Result<(), babel_idem::StoreError> {
/// let store = RedisStore::builder()
///     .prefix("billing:idemp:")
///     .ttl(Duration::from_secs(7 * 24 * 3600))
///     .connect_lazy("redis://127.0.0.1:6379/")?;
/// store.remember("f1e2d3c4-b5a6-4789-90ab-cdef01234567").await?;
/// assert!(store.seen("f1e2d3c4-b5a6-4789-90ab-cdef01234567").await?);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RedisStore {
    connection: ConnectionManager,
    prefix: String,
    ttl_ms: Option<i64>,
    claims: claim::ClaimKeys,
}

/// Configures a [`RedisStore`]; made by [`RedisStore::builder`].
#[derive(Debug, Clone)]
pub struct RedisStoreBuilder {
    prefix: String,
    ttl: Option<Duration>,
    timeout: Duration,
    reconnect_attempts: usize,
    claim_layout: claim::ClaimLayout,
}

impl Default for RedisStoreBuilder {
    fn default() -> Self {
        RedisStoreBuilder {
            prefix: DEFAULT_PREFIX.to_owned(),
            ttl: None,
            timeout: Duration::from_secs(2),
            reconnect_attempts: 2,
            claim_layout: claim::ClaimLayout::default(),
        }
    }
}

impl RedisStoreBuilder {
    /// The key prefix (default `bq:idemp:`, the Go SDK's). Two sibling
    /// prefixes are two separate seen-sets on one server; see
    /// [the rules](RedisStore#prefixes), checked when the store is built.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Forget each id this long after it was first remembered: at least
    /// 1 ms and at most [`MAX_TTL`](crate::store::MAX_TTL) (about 100 years),
    /// counted in whole milliseconds; checked when the store is built.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// How long connecting, and then each command, may take before the
    /// operation fails (default 2 s).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// How many times a lost connection is retried, with backoff, before an
    /// operation gives up (default 2). The next operation tries again.
    pub fn reconnect_attempts(mut self, attempts: usize) -> Self {
        self.reconnect_attempts = attempts;
        self
    }

    /// A store for `url` (`redis://[user:password@]host:port/db`, `rediss://`
    /// needs the crate's TLS features, `redis+unix:///path`). Nothing
    /// connects until the first operation. Must be called inside a Tokio
    /// runtime with timers and I/O. A Redis Cluster URL is refused.
    pub fn connect_lazy(self, url: &str) -> Result<RedisStore, StoreError> {
        if let Some(reason) = cluster_url_reason(url) {
            return Err(open_failed(RedisOpenError::Cluster(reason)));
        }
        let client = Client::open(url).map_err(|e| open_failed(RedisOpenError::Url(e)))?;
        self.from_client(client)
    }

    /// A store over a client the caller already built, with its own
    /// reconnecting connection. Must be called inside a Tokio runtime with
    /// timers and I/O.
    pub fn from_client(self, client: Client) -> Result<RedisStore, StoreError> {
        let settings = self.checked()?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(Some(self.timeout))
            .set_number_of_retries(self.reconnect_attempts)
            .set_min_delay(Duration::from_millis(50))
            .set_max_delay(self.timeout);
        let connection = ConnectionManager::new_lazy_with_config(client, config)
            .map_err(|e| open_failed(RedisOpenError::Client(e)))?;
        Ok(settings.with(connection))
    }

    /// A store over a connection manager the caller already has (it is
    /// cloned per command, never closed by the store; its settings apply).
    /// Must be called inside a Tokio runtime with timers and I/O.
    pub fn from_connection_manager(
        self,
        connection: ConnectionManager,
    ) -> Result<RedisStore, StoreError> {
        Ok(self.checked()?.with(connection))
    }

    /// Every setting checked, and the runtime, before anything is built.
    fn checked(&self) -> Result<RedisSettings, StoreError> {
        let prefix = checked_prefix(&self.prefix).map_err(open_failed)?;
        let ttl_ms =
            optional_ttl_millis(self.ttl).map_err(failed(BACKEND, StoreOperation::Open))?;
        require_tokio(Drivers::TimeAndIo).map_err(failed(BACKEND, StoreOperation::Open))?;
        Ok(RedisSettings {
            claims: claim::ClaimKeys::new(self.claim_layout, prefix),
            prefix: prefix.to_owned(),
            ttl_ms,
        })
    }
}

/// The checked settings of a [`RedisStore`], waiting for its connection.
struct RedisSettings {
    prefix: String,
    ttl_ms: Option<i64>,
    claims: claim::ClaimKeys,
}

impl RedisSettings {
    fn with(self, connection: ConnectionManager) -> RedisStore {
        RedisStore {
            connection,
            prefix: self.prefix,
            ttl_ms: self.ttl_ms,
            claims: self.claims,
        }
    }
}

fn open_failed(error: RedisOpenError) -> StoreError {
    failed(BACKEND, StoreOperation::Open)(error)
}

/// The longest prefix accepted, in bytes.
const MAX_PREFIX_LEN: usize = 128;

/// Returns `prefix` when it follows [the rules](RedisStore#prefixes).
fn checked_prefix(prefix: &str) -> Result<&str, RedisOpenError> {
    let refused = || RedisOpenError::Prefix(prefix.to_owned());
    let bytes = prefix.as_bytes();
    let (Some(first), Some(b':')) = (bytes.first(), bytes.last()) else {
        return Err(refused());
    };
    let plain = |byte: &u8| byte.is_ascii_graphic() && !b"*?[]\\".contains(byte);
    let nests_with_default = prefix != DEFAULT_PREFIX
        && (prefix.starts_with(DEFAULT_PREFIX) || DEFAULT_PREFIX.starts_with(prefix));
    if first.is_ascii_alphanumeric()
        && (2..=MAX_PREFIX_LEN).contains(&bytes.len())
        && bytes.iter().all(plain)
        && !nests_with_default
    {
        Ok(prefix)
    } else {
        Err(refused())
    }
}

impl RedisStore {
    /// A store for `url` with the default prefix and no TTL; see
    /// [`RedisStoreBuilder::connect_lazy`].
    ///
    /// ```
    /// use babel_idem::store::RedisStore;
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// let cluster = RedisStore::connect_lazy("redis+cluster://10.0.0.1:7000,10.0.0.2:7000/");
    /// assert!(cluster.unwrap_err().to_string().contains("Redis Cluster is not supported"));
    /// # });
    /// ```
    pub fn connect_lazy(url: &str) -> Result<Self, StoreError> {
        Self::builder().connect_lazy(url)
    }

    /// A store over an existing connection manager, default prefix, no TTL.
    pub fn from_connection_manager(connection: ConnectionManager) -> Result<Self, StoreError> {
        Self::builder().from_connection_manager(connection)
    }

    /// Configures a store: prefix, TTL, timeout, reconnect attempts.
    pub fn builder() -> RedisStoreBuilder {
        RedisStoreBuilder::default()
    }

    /// The key prefix in front of every id.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The Redis key an id is kept under: the prefix, then the id's bytes.
    pub fn key(&self, id: &str) -> Vec<u8> {
        let mut key = Vec::with_capacity(self.prefix.len() + id.len());
        key.extend_from_slice(self.prefix.as_bytes());
        key.extend_from_slice(id.as_bytes());
        key
    }

    async fn query<T: ::redis::FromRedisValue>(
        &self,
        operation: StoreOperation,
        command: ::redis::Cmd,
    ) -> Result<T, StoreError> {
        // A clone shares the one multiplexed connection; it is how the
        // manager is meant to be used from many tasks.
        let mut connection = self.connection.clone();
        command
            .query_async(&mut connection)
            .await
            .map_err(|e| failed(BACKEND, operation)(RedisCommandError::from(e)))
    }
}

impl Store for RedisStore {
    /// A batch is one round trip here: a consumer's concurrent calls meet.
    fn batch_target(&self) -> Option<super::batched::BatchTarget> {
        super::batched::BatchTarget::of(self)
    }

    fn seen<'a>(&'a self, id: &'a str) -> StoreFuture<'a, bool> {
        if self.claims.is_php() {
            return self.php_seen(id);
        }
        StoreFuture::new(async move {
            let mut command = ::redis::cmd("EXISTS");
            command.arg(self.key(id));
            let count: i64 = self.query(StoreOperation::Seen, command).await?;
            Ok(count > 0)
        })
    }

    fn remember<'a>(&'a self, id: &'a str) -> StoreFuture<'a, ()> {
        if self.claims.is_php() {
            return self.php_remember(id);
        }
        StoreFuture::new(async move {
            let mut command = ::redis::cmd("SET");
            command.arg(self.key(id)).arg(1).arg("NX");
            if let Some(ttl_ms) = self.ttl_ms {
                command.arg("PX").arg(ttl_ms);
            }
            // `OK` when set, nil when the id was already there: both succeed.
            let _: ::redis::Value = self.query(StoreOperation::Remember, command).await?;
            Ok(())
        })
    }

    fn forget<'a>(&'a self, id: &'a str) -> StoreFuture<'a, ()> {
        StoreFuture::new(async move {
            let mut command = ::redis::cmd("DEL");
            command.arg(self.key(id));
            let _: i64 = self.query(StoreOperation::Forget, command).await?;
            Ok(())
        })
    }

    fn seen_many<'a>(&'a self, ids: &'a [&'a str]) -> StoreFuture<'a, Vec<bool>> {
        StoreFuture::new(async move {
            if ids.is_empty() {
                return Ok(Vec::new());
            }
            let mut command = ::redis::cmd("MGET");
            for id in ids {
                command.arg(self.key(id));
            }
            let values: Vec<Option<Vec<u8>>> = self.query(StoreOperation::Seen, command).await?;
            // The PHP layout's `seen` is `GET == '2'`; the Go layout's is `EXISTS`.
            let php = self.claims.is_php();
            Ok(values
                .iter()
                .map(|value| match value {
                    Some(value) => !php || value == b"2",
                    None => false,
                })
                .collect())
        })
    }

    fn remember_many<'a>(&'a self, ids: &'a [&'a str]) -> StoreFuture<'a, ()> {
        if self.claims.is_php() {
            return StoreFuture::new(super::batch::remember_each(self, ids));
        }
        StoreFuture::new(async move {
            if ids.is_empty() {
                return Ok(());
            }
            // `remember`'s command per id, in one MULTI/EXEC sent as one write.
            let mut pipeline = ::redis::pipe();
            pipeline.atomic();
            for id in ids {
                let command = pipeline.cmd("SET").arg(self.key(id)).arg(1).arg("NX");
                if let Some(ttl_ms) = self.ttl_ms {
                    command.arg("PX").arg(ttl_ms);
                }
                command.ignore();
            }
            let mut connection = self.connection.clone();
            let () = pipeline.query_async(&mut connection).await.map_err(|e| {
                failed(BACKEND, StoreOperation::Remember)(RedisCommandError::from(e))
            })?;
            Ok(())
        })
    }
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.prefix)
            .field("ttl_ms", &self.ttl_ms)
            .finish_non_exhaustive()
    }
}

/// Why `url` names a Redis Cluster, if it does: a cluster scheme, or several
/// hosts in one URL.
fn cluster_url_reason(url: &str) -> Option<&'static str> {
    let (scheme, rest) = url.split_once("://")?;
    if scheme.contains("cluster") {
        return Some("the URL scheme names a cluster");
    }
    let authority = rest.split(['/', '?']).next().unwrap_or_default();
    authority
        .contains(',')
        .then_some("the URL lists several nodes")
}

const CLUSTER_UNSUPPORTED: &str = "Redis Cluster is not supported by RedisStore: \
     point it at one standalone server (or the primary behind a proxy or Sentinel)";

/// Building the store failed.
#[derive(Debug)]
enum RedisOpenError {
    Prefix(String),
    Cluster(&'static str),
    Url(RedisError),
    Client(RedisError),
}

impl fmt::Display for RedisOpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RedisOpenError::Prefix(prefix) => write!(
                f,
                "Redis key prefix {prefix:?} is refused: it must end with ':', be 2 to \
                 {MAX_PREFIX_LEN} printable ASCII characters starting with a letter or digit, \
                 hold no space or glob character (* ? [ ] \\), and not nest with the Go SDK's \
                 {DEFAULT_PREFIX:?} (one store's key would be another's id)"
            ),
            RedisOpenError::Cluster(reason) => write!(f, "{CLUSTER_UNSUPPORTED} ({reason})"),
            RedisOpenError::Url(e) => write!(f, "not a usable Redis URL: {e}"),
            RedisOpenError::Client(e) => write!(f, "could not set up the connection: {e}"),
        }
    }
}

impl StdError for RedisOpenError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match self {
            RedisOpenError::Prefix(_) | RedisOpenError::Cluster(_) => None,
            RedisOpenError::Url(e) | RedisOpenError::Client(e) => Some(e),
        }
    }
}

/// A command failed; a cluster redirect is called out as the cause it is.
#[derive(Debug)]
struct RedisCommandError(RedisError);

impl From<RedisError> for RedisCommandError {
    fn from(error: RedisError) -> Self {
        RedisCommandError(error)
    }
}

impl fmt::Display for RedisCommandError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_cluster_error() {
            write!(f, "{CLUSTER_UNSUPPORTED}; the server answered: {}", self.0)
        } else {
            fmt::Display::fmt(&self.0, f)
        }
    }
}

impl StdError for RedisCommandError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_follow_the_documented_rules() {
        for good in ["bq:idemp:", "bq:idem:", "billing:idemp:", "a:", "9-x.y_z:"] {
            assert_eq!(checked_prefix(good).ok(), Some(good));
        }
        for bad in [
            "",
            ":",
            "a",
            "bq:",
            "bq:idemp:x:",
            "_a:",
            "a b:",
            "a\t:",
            "a*:",
            "a\\:",
            "é:",
        ] {
            assert!(checked_prefix(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn cluster_urls_are_recognised() {
        assert!(cluster_url_reason("redis+cluster://a:7000/").is_some());
        assert!(cluster_url_reason("redis://a:7000,b:7000/").is_some());
        assert!(cluster_url_reason("redis://127.0.0.1:6379/0").is_none());
        assert!(cluster_url_reason("redis://u:p@host/0?protocol=resp3").is_none());
        assert!(cluster_url_reason("redis+unix:///run/redis.sock").is_none());
    }
}
