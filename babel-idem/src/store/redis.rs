//! [`RedisStore`]: a seen-set shared by a fleet, in Redis (feature `redis`).
//! The commands, the layout and the limits are documented on the type.

use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use ::redis::{Client, Cmd, FromRedisValue, Pipeline, RedisError, Script, Value};

use super::settings::{Drivers, InvalidUrl, optional_ttl_millis, require_tokio};
use super::{Store, StoreError, StoreFuture, StoreOperation, failed};
use crate::builders::setters;
use crate::redis_client::Connection;

mod admin;
mod claim;
#[cfg(feature = "redis-cluster")]
mod cluster;
mod durability;

pub use durability::{NotReplicated, ShortOfReplicas};

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
/// # One server, or a Redis Cluster
///
/// A `redis://` URL is one Redis server (a standalone server, or the
/// primary a proxy or Sentinel points to); a node of a cluster answering
/// `MOVED`/`ASK` there makes the operation fail with an error that says so.
/// With the `redis-cluster` feature, a `redis+cluster://host:port,...` URL
/// is a Redis Cluster: the same operations, every call's keys in one slot,
/// batches split by slot and sent at once; the cluster's layout (hash tags
/// around claim keys, a fence counter per slot) is on
/// [`guide::stores`](crate::guide::stores).
///
/// # Durability across a failover
///
/// Redis acknowledges a write before its replicas have it. With
/// [`wait_for_replicas`](RedisStoreBuilder::wait_for_replicas), every
/// write (a mark, a claim, a commit) is followed, in the same pipeline, by
/// `WAIT <replicas> <timeout>`, and fails with [`NotReplicated`] when fewer
/// replicas acknowledged it in time; after that, writes to the same master
/// fail at once with [`ShortOfReplicas`] until one let through is
/// confirmed.
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
    connection: Connection,
    prefix: String,
    ttl_ms: Option<i64>,
    claims: claim::ClaimKeys,
    durability: Option<durability::Durability>,
    /// The masters found short of replicas, shared by the store's clones.
    shortages: Arc<durability::Shortages>,
}

/// Configures a [`RedisStore`]; made by [`RedisStore::builder`].
#[derive(Debug, Clone)]
pub struct RedisStoreBuilder {
    prefix: String,
    ttl: Option<Duration>,
    timeout: Duration,
    reconnect_attempts: usize,
    claim_layout: claim::ClaimLayout,
    durability: Option<durability::Durability>,
}

impl Default for RedisStoreBuilder {
    fn default() -> Self {
        RedisStoreBuilder {
            prefix: DEFAULT_PREFIX.to_owned(),
            ttl: None,
            timeout: Duration::from_secs(2),
            reconnect_attempts: 2,
            claim_layout: claim::ClaimLayout::default(),
            durability: None,
        }
    }
}

impl RedisStoreBuilder {
    setters! {
        /// The key prefix (default `bq:idemp:`, the Go SDK's). Two sibling
        /// prefixes are two separate seen-sets on one server; see
        /// [the rules](RedisStore#prefixes), checked when the store is built.
        pub fn prefix(prefix: impl Into<String>) => self.prefix = prefix.into();

        /// Forget each id this long after it was first remembered: at least
        /// 1 ms and at most [`MAX_TTL`](crate::store::MAX_TTL) (about 100 years),
        /// counted in whole milliseconds; checked when the store is built.
        pub fn ttl(ttl: Duration) => self.ttl = Some(ttl);

        /// How long connecting, and then each command, may take before the
        /// operation fails (default 2 s).
        pub fn timeout(timeout: Duration) => self.timeout;

        /// How many times a lost connection is retried, with backoff, before an
        /// operation gives up (default 2). The next operation tries again.
        pub fn reconnect_attempts(attempts: usize) => self.reconnect_attempts;
    }

    /// A store for `url` (`redis://[user:password@]host:port/db`, `rediss://`
    /// needs the crate's TLS features, `redis+unix:///path`; with the
    /// `redis-cluster` feature, `redis+cluster://[user:password@]host:port[,host:port...]`
    /// or `rediss+cluster://...`, the seed nodes of a Redis Cluster). Nothing
    /// connects until the first operation. Must be called inside a Tokio
    /// runtime with timers and I/O.
    pub fn connect_lazy(self, url: &str) -> Result<RedisStore, StoreError> {
        // A password where the client reads a host or a path could be
        // quoted back: such a URL is refused unread.
        InvalidUrl::check(url).map_err(open_failed)?;
        if let Some(reason) = cluster_url_reason(url) {
            return self.cluster_lazy(url, reason);
        }
        let client = Client::open(url).map_err(|e| open_failed(RedisOpenError::Url(e)))?;
        self.from_client(client)
    }

    /// A store for `url`, as [`connect_lazy`](Self::connect_lazy) takes it,
    /// that answers now: fails, with an error that says why, when the
    /// server cannot be reached or refuses the login, and for a cluster URL
    /// when no seed node answers as a cluster node or the cluster is not
    /// `cluster_state:ok`.
    ///
    /// ```no_run
    /// use babel_idem::store::RedisStore;
    ///
    /// # async fn run() -> Result<(), babel_idem::StoreError> {
    /// let store = RedisStore::builder()
    ///     .connect("redis+cluster://10.0.0.1:7000,10.0.0.2:7000/")
    ///     .await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn connect(self, url: &str) -> Result<RedisStore, StoreError> {
        InvalidUrl::check(url).map_err(open_failed)?;
        if let Some(reason) = cluster_url_reason(url) {
            return self.cluster_eager(url, reason).await;
        }
        let store = self.connect_lazy(url)?;
        store.ping().await?;
        Ok(store)
    }

    /// Every write (`remember`, a claim, a commit, and their batches) waits
    /// until `replicas` replicas have it, or `timeout` passed: `WAIT
    /// <replicas> <timeout ms>` sent in the same pipeline, on the same
    /// connection, right after the write. A write fewer replicas
    /// acknowledged fails with [`NotReplicated`] (it may still be on the
    /// master, and reach the replicas later); the master is then taken as
    /// short of replicas, and writes to it fail at once with
    /// [`ShortOfReplicas`], nothing sent, until a write let through after
    /// a pause is confirmed (a master with no replica would hold each
    /// write for the whole `timeout`). Costs the replication's delay on
    /// every write; see [the failover guarantees](crate::guide::stores).
    ///
    /// ```
    /// use babel_idem::store::RedisStore;
    /// use std::time::Duration;
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// let store = RedisStore::builder()
    ///     .wait_for_replicas(1, Duration::from_millis(500))
    ///     .connect_lazy("redis://127.0.0.1:6379/")?;
    /// assert_eq!(store.replicas_awaited(), 1);
    /// # Ok::<(), babel_idem::StoreError>(())
    /// # }).unwrap();
    /// ```
    pub fn wait_for_replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.durability = Some(durability::Durability::new(replicas, timeout));
        self
    }

    /// Without the `redis-cluster` feature a cluster URL is refused.
    #[cfg(not(feature = "redis-cluster"))]
    fn cluster_lazy(self, _url: &str, reason: &'static str) -> Result<RedisStore, StoreError> {
        Err(open_failed(RedisOpenError::Cluster(reason)))
    }

    #[cfg(not(feature = "redis-cluster"))]
    async fn cluster_eager(
        self,
        _url: &str,
        reason: &'static str,
    ) -> Result<RedisStore, StoreError> {
        Err(open_failed(RedisOpenError::Cluster(reason)))
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
        Ok(settings.with(Connection::Single(connection)))
    }

    /// A store over a connection manager the caller already has (it is
    /// cloned per command, never closed by the store; its settings apply).
    /// Must be called inside a Tokio runtime with timers and I/O.
    pub fn from_connection_manager(
        self,
        connection: ConnectionManager,
    ) -> Result<RedisStore, StoreError> {
        Ok(self.checked()?.with(Connection::Single(connection)))
    }

    /// Every setting checked, and the runtime, before anything is built.
    fn checked(&self) -> Result<RedisSettings, StoreError> {
        let prefix = checked_prefix(&self.prefix).map_err(open_failed)?;
        if let Some(durability) = &self.durability {
            durability
                .check()
                .map_err(|reason| open_failed(RedisOpenError::Durability(reason)))?;
        }
        let ttl_ms =
            optional_ttl_millis(self.ttl).map_err(failed(BACKEND, StoreOperation::Open))?;
        require_tokio(Drivers::TimeAndIo).map_err(failed(BACKEND, StoreOperation::Open))?;
        Ok(RedisSettings {
            claims: claim::ClaimKeys::new(self.claim_layout, prefix),
            prefix: prefix.to_owned(),
            ttl_ms,
            durability: self.durability,
        })
    }
}

/// The checked settings of a [`RedisStore`], waiting for its connection.
struct RedisSettings {
    prefix: String,
    ttl_ms: Option<i64>,
    claims: claim::ClaimKeys,
    durability: Option<durability::Durability>,
}

impl RedisSettings {
    fn with(self, connection: Connection) -> RedisStore {
        RedisStore {
            connection,
            prefix: self.prefix,
            ttl_ms: self.ttl_ms,
            claims: self.claims,
            durability: self.durability,
            shortages: Arc::default(),
        }
    }
}

fn open_failed(error: impl Into<Box<dyn StdError + Send + Sync>>) -> StoreError {
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
    /// // Several hosts in a plain redis:// URL: say which kind of URL is meant.
    /// let several = RedisStore::connect_lazy("redis://10.0.0.1:7000,10.0.0.2:7000/");
    /// assert!(several.unwrap_err().to_string().contains("redis+cluster://"));
    /// # });
    /// ```
    pub fn connect_lazy(url: &str) -> Result<Self, StoreError> {
        Self::builder().connect_lazy(url)
    }

    /// A store for `url` with the default prefix and no TTL that answers
    /// now; see [`RedisStoreBuilder::connect`].
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::builder().connect(url).await
    }

    /// How many replicas each write waits for: 0 unless
    /// [`wait_for_replicas`](RedisStoreBuilder::wait_for_replicas) was set.
    pub fn replicas_awaited(&self) -> u32 {
        self.durability
            .map_or(0, |durability| durability.replicas())
    }

    /// Whether the store speaks to a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        self.connection.is_cluster()
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
        // A clone shares the one multiplexed connection (per node, on a
        // cluster); it is how the client is meant to be used from many tasks.
        let connection = &mut self.connection.clone();
        let reply = command.query_async(connection).await;
        reply.map_err(command_failed(operation))
    }

    /// Sends a write: `command` alone, or, with
    /// [`wait_for_replicas`](RedisStoreBuilder::wait_for_replicas), in one
    /// pipeline with the `WAIT` that must confirm it. A script call
    /// (`script` given) the server has forgotten (`NOSCRIPT`, after a
    /// restart or a failover) is loaded and sent again: it did not run.
    async fn write<T: FromRedisValue>(
        &self,
        operation: StoreOperation,
        script: Option<&Script>,
        command: &Cmd,
    ) -> Result<T, StoreError> {
        self.send(operation, script, command, true).await
    }

    /// Sends `command`; a `durable` one as [`write`](Self::write) does.
    async fn send<T: FromRedisValue>(
        &self,
        operation: StoreOperation,
        script: Option<&Script>,
        command: &Cmd,
        durable: bool,
    ) -> Result<T, StoreError> {
        let failed = |e| StoreError::new(operation, BACKEND, RedisCommandError::from(e));
        let mut connection = self.connection.clone();
        #[cfg(feature = "redis-cluster")]
        if let (Connection::Cluster(cluster, slots), Some(durability)) =
            (&mut connection, self.durability.filter(|_| durable))
        {
            use crate::redis_client::cluster::{command_slot, master_of, with_wait};
            let master = match command_slot(command) {
                Some(slot) => master_of(cluster, slots, slot).await,
                None => None,
            };
            let probe = match &master {
                Some(master) => self
                    .shortages
                    .admit(master, durability.replicas())
                    .map_err(|e| StoreError::new(operation, BACKEND, e))?,
                None => None,
            };
            // On a cluster the write goes alone, so the client follows its
            // redirections, then `WAIT` to the master of its slot.
            let sent = with_wait(cluster, command, script, durability.wait_arguments()).await;
            let reply = sent.reply.map_err(failed)?;
            let confirmed = durability.confirm(sent.replicas.unwrap_or(0));
            if let Some(master) = &master {
                self.shortages
                    .record(master, confirmed.is_ok(), probe.as_ref());
            }
            confirmed.map_err(|e| StoreError::new(operation, BACKEND, e))?;
            return T::from_redis_value(reply).map_err(|e| parse_failed(operation, e));
        }
        let Some(durability) = self.durability.filter(|_| durable) else {
            return match command.query_async(&mut connection).await {
                Err(e) if is_no_script(&e) && script.is_some() => {
                    if let Some(script) = script {
                        script.load_async(&mut connection).await.map_err(failed)?;
                    }
                    command.query_async(&mut connection).await.map_err(failed)
                }
                answered => answered.map_err(failed),
            };
        };
        let mut pipeline = ::redis::pipe();
        pipeline.add_command(command.clone());
        let mut values = self
            .durable_pipeline(operation, script, durability, pipeline)
            .await?;
        let value = values.pop().unwrap_or(Value::Nil);
        T::from_redis_value(value).map_err(|e| parse_failed(operation, e))
    }

    /// Sends `pipeline` with `WAIT` appended; the replies of `pipeline`'s
    /// own commands (those not ignored), once the `WAIT` confirmed them.
    async fn durable_pipeline(
        &self,
        operation: StoreOperation,
        script: Option<&Script>,
        durability: durability::Durability,
        mut pipeline: Pipeline,
    ) -> Result<Vec<Value>, StoreError> {
        let failed = |e| StoreError::new(operation, BACKEND, RedisCommandError::from(e));
        // One server: its one master.
        let probe = self
            .shortages
            .admit("", durability.replicas())
            .map_err(|e| StoreError::new(operation, BACKEND, e))?;
        durability.append_wait(&mut pipeline);
        let mut connection = self.connection.clone();
        let mut values: Vec<Value> = match pipeline.query_async(&mut connection).await {
            Err(e) if is_no_script(&e) && script.is_some() => {
                if let Some(script) = script {
                    script.load_async(&mut connection).await.map_err(failed)?;
                }
                pipeline
                    .query_async(&mut connection)
                    .await
                    .map_err(failed)?
            }
            answered => answered.map_err(failed)?,
        };
        let acknowledged = match values.pop() {
            Some(Value::Int(replicas)) => replicas,
            _ => 0,
        };
        let confirmed = durability.confirm(acknowledged);
        self.shortages.record("", confirmed.is_ok(), probe.as_ref());
        confirmed.map_err(|e| StoreError::new(operation, BACKEND, e))?;
        Ok(values)
    }

    /// The indices of `keys` grouped by the slot each key is in, groups in
    /// the order of their first key; one group of them all on one server.
    fn slot_groups<K: AsRef<[u8]>>(&self, keys: &[K]) -> Vec<Vec<usize>> {
        #[cfg(feature = "redis-cluster")]
        if self.connection.is_cluster() {
            return cluster::slot_groups(keys);
        }
        vec![(0..keys.len()).collect()]
    }

    /// One command per group of `keys`' indices (each group's keys in one
    /// slot: see [`slot_groups`](Self::slot_groups)), made by `command`: on
    /// one server each in turn; on a cluster in one pipeline per master,
    /// all at once. The groups, and each group's reply.
    async fn per_slot(
        &self,
        operation: StoreOperation,
        keys: &[Vec<u8>],
        groups: Vec<Vec<usize>>,
        script: Option<&Script>,
        durable: bool,
        command: impl Fn(&[usize]) -> Cmd,
    ) -> Result<(Vec<Vec<usize>>, Vec<Value>), StoreError> {
        #[cfg(feature = "redis-cluster")]
        if let Connection::Cluster(connection, slots) = &self.connection {
            let commands: Vec<(u16, Cmd)> = groups
                .iter()
                .map(|group| {
                    let slot = crate::redis_client::cluster::slot(&keys[group[0]]);
                    (slot, command(group))
                })
                .collect();
            let durability = self.durability.filter(|_| durable);
            let wait = durability.map(|durability| durability.wait_arguments());
            // A write to a master short of replicas fails the batch at once,
            // nothing sent: each call then asks alone, and only those of
            // that master fail.
            let mut masters: Vec<Option<String>> = Vec::new();
            let mut probes: Vec<(String, Option<durability::Probe>)> = Vec::new();
            if let Some(durability) = durability {
                for (slot, _) in &commands {
                    let master =
                        crate::redis_client::cluster::master_of(connection, slots, *slot).await;
                    if let Some(master) = &master
                        && !probes.iter().any(|(known, _)| known == master)
                    {
                        let probe = self
                            .shortages
                            .admit(master, durability.replicas())
                            .map_err(|e| StoreError::new(operation, BACKEND, e))?;
                        probes.push((master.clone(), probe));
                    }
                    masters.push(master);
                }
            }
            let sent =
                crate::redis_client::cluster::by_master(connection, slots, commands, script, wait)
                    .await;
            if let Some(durability) = durability {
                for (answer, master) in sent.iter().zip(&masters) {
                    if let (Some(replicas), Some(master)) = (answer.replicas, master) {
                        let probe = probes
                            .iter()
                            .find(|(known, _)| known == master)
                            .and_then(|(_, probe)| probe.as_ref());
                        self.shortages
                            .record(master, durability.confirm(replicas).is_ok(), probe);
                    }
                }
            }
            drop(probes);
            let mut replies = Vec::with_capacity(sent.len());
            for answer in sent {
                let reply = answer.reply.map_err(command_failed(operation))?;
                if let (Some(durability), Some(replicas)) = (durability, answer.replicas) {
                    durability
                        .confirm(replicas)
                        .map_err(|e| StoreError::new(operation, BACKEND, e))?;
                }
                replies.push(reply);
            }
            return Ok((groups, replies));
        }
        let _ = keys;
        let mut replies = Vec::with_capacity(groups.len());
        for group in &groups {
            replies.push(
                self.send::<Value>(operation, script, &command(group), durable)
                    .await?,
            );
        }
        Ok((groups, replies))
    }
}

/// A reply that is not what the command answers.
fn parse_failed(operation: StoreOperation, error: ::redis::ParsingError) -> StoreError {
    StoreError::new(
        operation,
        BACKEND,
        RedisCommandError::from(RedisError::from(error)),
    )
}

fn is_no_script(error: &RedisError) -> bool {
    error.kind() == ::redis::ErrorKind::Server(::redis::ServerErrorKind::NoScript)
}

impl Store for RedisStore {
    /// A batch is one round trip here: a consumer's concurrent calls meet.
    fn batch_target(&self) -> Option<super::BatchTarget> {
        super::BatchTarget::of(self)
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
            let _: ::redis::Value = self.write(StoreOperation::Remember, None, &command).await?;
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
            let keys: Vec<Vec<u8>> = ids.iter().map(|id| self.key(id)).collect();
            // One `MGET` (per slot on a cluster).
            let operation = StoreOperation::Seen;
            let groups = self.slot_groups(&keys);
            let (groups, answers) = self
                .per_slot(operation, &keys, groups, None, false, |group| {
                    let mut command = ::redis::cmd("MGET");
                    for &i in group {
                        command.arg(&keys[i]);
                    }
                    command
                })
                .await?;
            // The PHP layout's `seen` is `GET == '2'`; the Go layout's is `EXISTS`.
            let php = self.claims.is_php();
            let mut seen = vec![false; ids.len()];
            for (group, values) in groups.iter().zip(answers) {
                let values: Vec<Option<Vec<u8>>> = FromRedisValue::from_redis_value(values)
                    .map_err(|e| parse_failed(operation, e))?;
                for (&i, value) in group.iter().zip(values) {
                    seen[i] = match value {
                        Some(value) => !php || value == b"2",
                        None => false,
                    };
                }
            }
            Ok(seen)
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
            let keys: Vec<Vec<u8>> = ids.iter().map(|id| self.key(id)).collect();
            let set = |i: usize| {
                let mut command = ::redis::cmd("SET");
                command.arg(&keys[i]).arg(1).arg("NX");
                if let Some(ttl_ms) = self.ttl_ms {
                    command.arg("PX").arg(ttl_ms);
                }
                command
            };
            #[cfg(feature = "redis-cluster")]
            if self.connection.is_cluster() {
                // On a cluster `remember`'s `SET` per id, in one pipeline per
                // master: each mark stands alone, as `remember`'s does.
                let each = (0..keys.len()).map(|i| vec![i]).collect();
                self.per_slot(StoreOperation::Remember, &keys, each, None, true, |group| {
                    set(group[0])
                })
                .await?;
                return Ok(());
            }
            // `remember`'s command per id, in one MULTI/EXEC sent as one write.
            let mut pipeline = ::redis::pipe();
            // MULTI and EXEC by hand, so a `WAIT` can follow the EXEC.
            pipeline.cmd("MULTI").ignore();
            for i in 0..keys.len() {
                pipeline.add_command(set(i)).ignore();
            }
            pipeline.cmd("EXEC").ignore();
            match self.durability {
                Some(durability) => self
                    .durable_pipeline(StoreOperation::Remember, None, durability, pipeline)
                    .await
                    .map(drop),
                None => {
                    let mut connection = self.connection.clone();
                    pipeline
                        .query_async::<()>(&mut connection)
                        .await
                        .map_err(command_failed(StoreOperation::Remember))
                }
            }
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

/// What a cluster URL needs, or a command met a cluster where one server
/// was expected.
const CLUSTER_UNSUPPORTED: &str = "a Redis Cluster needs a redis+cluster://host:port[,host:port...] URL \
     (rediss+cluster:// for TLS) and babel-idem's `redis-cluster` feature; a redis:// URL \
     is one standalone server (or the primary behind a proxy or Sentinel)";

/// Building the store failed.
#[derive(Debug, thiserror::Error)]
enum RedisOpenError {
    #[error(
        "Redis key prefix {0:?} is refused: it must end with ':', be 2 to \
         {MAX_PREFIX_LEN} printable ASCII characters starting with a letter or digit, \
         hold no space or glob character (* ? [ ] \\), and not nest with the Go SDK's \
         {DEFAULT_PREFIX:?} (one store's key would be another's id)"
    )]
    Prefix(String),
    #[cfg_attr(feature = "redis-cluster", allow(dead_code))]
    #[error("{CLUSTER_UNSUPPORTED} ({0})")]
    Cluster(&'static str),
    #[cfg(feature = "redis-cluster")]
    #[error("{0}")]
    ClusterOpen(#[source] crate::redis_client::cluster::ClusterOpenError),
    #[cfg(feature = "redis-cluster")]
    #[error(
        "Redis key prefix {0:?} is refused on a Redis Cluster: it holds '{{' or \
         '}}', and the store's own hash tags must be the only ones in its keys"
    )]
    ClusterPrefix(String),
    #[error("{0}")]
    Durability(&'static str),
    #[error("not a usable Redis URL: {0}")]
    Url(#[source] RedisError),
    #[error("could not set up the connection: {0}")]
    Client(#[source] RedisError),
}

/// The `map_err` adapter of a Redis command that failed while it ran `operation`.
fn command_failed(operation: StoreOperation) -> impl FnOnce(RedisError) -> StoreError {
    move |e| StoreError::new(operation, BACKEND, RedisCommandError::from(e))
}

/// A command failed; a cluster redirect is called out as the cause it is.
#[derive(Debug, thiserror::Error)]
enum RedisCommandError {
    /// The server redirected the command to another cluster node.
    #[error(
        "the server answered with a Redis Cluster redirection ({0}): on a cluster the \
         slot moved while the call ran, and the next call finds it; a redis:// URL \
         is one server and cannot follow it ({CLUSTER_UNSUPPORTED})"
    )]
    Redirected(#[source] RedisError),
    /// Any other failure, as the client reported it.
    #[error("{0}")]
    Failed(#[source] RedisError),
}

impl From<RedisError> for RedisCommandError {
    fn from(error: RedisError) -> Self {
        if matches!(
            error.kind(),
            ::redis::ErrorKind::Server(
                ::redis::ServerErrorKind::Moved | ::redis::ServerErrorKind::Ask
            )
        ) {
            RedisCommandError::Redirected(error)
        } else {
            RedisCommandError::Failed(error)
        }
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
