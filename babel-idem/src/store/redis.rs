//! [`RedisStore`]: a seen-set shared by a fleet, in Redis (feature `redis`).
//! The commands, the layout and the limits are documented on the type.

use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use ::redis::{Client, RedisError};

use super::settings::{require_tokio_runtime, ttl_millis};
use super::{Store, StoreError, StoreFuture, StoreOperation};

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
///
/// Keys are binary safe, so any id (NUL, newlines, 10 KB) is stored verbatim.
/// Expiry is Redis's own, so no purge is needed.
///
/// Claim mode keeps its claims beside these keys (or in the PHP SDK's
/// layout): see the [`ClaimStore`](crate::ClaimStore) impl below.
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
/// use babel_idem::{RedisStore, Store};
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
    /// The key prefix (default `bq:idemp:`, the Go SDK's). Two prefixes are
    /// two separate seen-sets on one server.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Forget each id this long after it was first remembered (at least 1 ms).
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
    /// runtime. A Redis Cluster URL is refused.
    pub fn connect_lazy(self, url: &str) -> Result<RedisStore, StoreError> {
        let open = |e: RedisOpenError| StoreError::new(StoreOperation::Open, BACKEND, e);
        if let Some(reason) = cluster_url_reason(url) {
            return Err(open(RedisOpenError::Cluster(reason)));
        }
        let client = Client::open(url).map_err(|e| open(RedisOpenError::Url(e)))?;
        self.from_client(client)
    }

    /// A store over a client the caller already built, with its own
    /// reconnecting connection. Must be called inside a Tokio runtime.
    pub fn from_client(self, client: Client) -> Result<RedisStore, StoreError> {
        require_tokio_runtime().map_err(|e| StoreError::new(StoreOperation::Open, BACKEND, e))?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(Some(self.timeout))
            .set_number_of_retries(self.reconnect_attempts)
            .set_min_delay(Duration::from_millis(50))
            .set_max_delay(self.timeout);
        let connection = ConnectionManager::new_lazy_with_config(client, config).map_err(|e| {
            StoreError::new(StoreOperation::Open, BACKEND, RedisOpenError::Client(e))
        })?;
        self.from_connection_manager(connection)
    }

    /// A store over a connection manager the caller already has (it is
    /// cloned per command, never closed by the store; its settings apply).
    pub fn from_connection_manager(
        self,
        connection: ConnectionManager,
    ) -> Result<RedisStore, StoreError> {
        let ttl_ms = self
            .ttl
            .map(ttl_millis)
            .transpose()
            .map_err(|e| StoreError::new(StoreOperation::Open, BACKEND, e))?;
        Ok(RedisStore {
            connection,
            claims: claim::ClaimKeys::new(self.claim_layout, &self.prefix),
            prefix: self.prefix,
            ttl_ms,
        })
    }
}

impl RedisStore {
    /// A store for `url` with the default prefix and no TTL; see
    /// [`RedisStoreBuilder::connect_lazy`].
    ///
    /// ```
    /// use babel_idem::RedisStore;
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
            .map_err(|e| StoreError::new(operation, BACKEND, RedisCommandError::from(e)))
    }
}

impl Store for RedisStore {
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
    Cluster(&'static str),
    Url(RedisError),
    Client(RedisError),
}

impl fmt::Display for RedisOpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RedisOpenError::Cluster(reason) => write!(f, "{CLUSTER_UNSUPPORTED} ({reason})"),
            RedisOpenError::Url(e) => write!(f, "not a usable Redis URL: {e}"),
            RedisOpenError::Client(e) => write!(f, "could not set up the connection: {e}"),
        }
    }
}

impl StdError for RedisOpenError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match self {
            RedisOpenError::Cluster(_) => None,
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
    fn cluster_urls_are_recognised() {
        assert!(cluster_url_reason("redis+cluster://a:7000/").is_some());
        assert!(cluster_url_reason("redis://a:7000,b:7000/").is_some());
        assert!(cluster_url_reason("redis://127.0.0.1:6379/0").is_none());
        assert!(cluster_url_reason("redis://u:p@host/0?protocol=resp3").is_none());
        assert!(cluster_url_reason("redis+unix:///run/redis.sock").is_none());
    }
}
