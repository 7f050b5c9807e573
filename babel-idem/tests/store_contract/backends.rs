//! One fixture per store: how the contract suite opens a store, and how a
//! test run cleans up after itself on a server other runs share.
//!
//! Every fixture isolates one test run: its Redis keys sit under a prefix
//! with a random suffix, its PostgreSQL and SQLite tables carry one in their
//! name, and dropping the fixture deletes them (also when the test failed).

use std::time::Duration;

use babel_idem::{InMemoryStore, Store, StoreError};

use super::servers::unique_suffix;

/// A store backend as the contract suite sees it.
#[allow(async_fn_in_trait)]
pub trait Backend {
    /// The store this fixture opens.
    type Store: Store + 'static;

    /// A store on the seen-set named `space` (a Redis prefix, a SQL table),
    /// private to this test run. Stores on different spaces never share
    /// ids; stores on one space do, where the backend is shared at all.
    async fn open(&self, space: &str, ttl: Option<Duration>) -> Self::Store {
        self.build(space, ttl)
            .await
            .unwrap_or_else(|e| panic!("open a store on {space}: {e}"))
    }

    /// What building (and migrating) that store returns: how a test sees a
    /// setting refused.
    async fn build(&self, space: &str, ttl: Option<Duration>) -> Result<Self::Store, StoreError>;

    /// [`open`](Backend::open), then what claim mode needs beside the
    /// seen-set (the SQL stores' `migrate_claims`).
    async fn open_claims(&self, space: &str, ttl: Option<Duration>) -> Self::Store {
        let store = self.open(space, ttl).await;
        self.migrate_claims(&store)
            .await
            .unwrap_or_else(|e| panic!("migrate claim mode on {space}: {e}"));
        store
    }

    /// Creates claim mode's tables for `store`, where the backend has any.
    async fn migrate_claims(&self, store: &Self::Store) -> Result<(), StoreError> {
        let _ = store;
        Ok(())
    }

    /// Whether the server deletes expired marks by itself (Redis), so none
    /// waits for a purge.
    fn self_expiring(&self) -> bool {
        false
    }

    /// Whether the backend stores ids containing NUL. PostgreSQL `TEXT`
    /// cannot, and `PostgresStore` refuses them with a `StoreError`.
    fn stores_nul(&self) -> bool {
        true
    }

    /// Whether fences order the claims of every id together (one counter
    /// for the store), rather than only each id's own claims (a Redis
    /// Cluster keeps a counter per slot).
    fn fences_store_wide(&self) -> bool {
        true
    }
}

/// The reference store: a fresh [`InMemoryStore`] per `open`.
pub struct MemoryBackend;

impl MemoryBackend {
    pub fn create(_test: &str) -> Option<Self> {
        Some(MemoryBackend)
    }
}

impl Backend for MemoryBackend {
    type Store = InMemoryStore;

    async fn build(
        &self,
        _space: &str,
        ttl: Option<Duration>,
    ) -> Result<InMemoryStore, StoreError> {
        Ok(match ttl {
            Some(ttl) => InMemoryStore::builder().ttl(ttl).build()?,
            None => InMemoryStore::new(),
        })
    }
}

/// The longest table name the SQL stores accept.
pub const MAX_TABLE_NAME: usize = 48;

/// A table name for `space` that is unique to one run and a plain
/// identifier; a long space is cut and keeps a hash of its whole name, so
/// two long spaces never share a table.
fn table_name(run: &str, space: &str) -> String {
    let space: String = space
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    let mut name = format!("bqt_{run}_{space}");
    if name.len() > MAX_TABLE_NAME {
        let digest = fnv1a(space.as_bytes());
        name.truncate(MAX_TABLE_NAME - 9);
        name.push_str(&format!("_{digest:08x}"));
    }
    name
}

/// FNV-1a, 32 bits: a fixed, dependency-free hash for short names.
fn fnv1a(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5, |hash, &byte| {
        (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193)
    })
}

/// SQLite (babel-idem's default feature, so always built): one database
/// file in a temporary directory, one table per space.
pub use sqlite::SqliteBackend;

mod sqlite {
    use super::*;
    use babel_idem::store::SqliteStore;
    use std::path::PathBuf;

    pub struct SqliteBackend {
        run: String,
        pub dir: PathBuf,
    }

    impl SqliteBackend {
        pub fn create(_test: &str) -> Option<Self> {
            let run = unique_suffix();
            let dir = std::env::temp_dir().join(format!("babel-idem-sqlite-{run}"));
            std::fs::create_dir_all(&dir).expect("create a temporary directory");
            Some(SqliteBackend { run, dir })
        }

        pub fn database(&self) -> PathBuf {
            self.dir.join("seen.db")
        }

        pub fn table(&self, space: &str) -> String {
            table_name(&self.run, space)
        }
    }

    impl Backend for SqliteBackend {
        type Store = SqliteStore;

        async fn build(
            &self,
            space: &str,
            ttl: Option<Duration>,
        ) -> Result<SqliteStore, StoreError> {
            let mut builder = SqliteStore::builder().table(self.table(space));
            if let Some(ttl) = ttl {
                builder = builder.ttl(ttl);
            }
            builder.open(self.database()).await
        }

        async fn migrate_claims(&self, store: &SqliteStore) -> Result<(), StoreError> {
            store.migrate_claims().await
        }
    }

    impl Drop for SqliteBackend {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Redis: the shared server from `BABEL_IDEM_REDIS_URL`, one prefix per space.
#[cfg(feature = "redis")]
pub use redis_backend::RedisBackend;

#[cfg(feature = "redis")]
mod redis_backend {
    use super::*;
    use crate::store_contract::servers::{REDIS_URL, server_url};
    use babel_idem::store::RedisStore;

    pub struct RedisBackend {
        pub url: String,
        run: String,
    }

    impl RedisBackend {
        pub fn create(test: &str) -> Option<Self> {
            let url = server_url(REDIS_URL, test)?;
            Some(Self::on(url))
        }

        /// A fixture on a given server (the outage tests' own).
        pub fn on(url: String) -> Self {
            RedisBackend {
                url,
                run: unique_suffix(),
            }
        }

        /// Every key of this run starts with this.
        pub fn run_prefix(&self) -> String {
            format!("bqtest:{}:", self.run)
        }

        pub fn prefix(&self, space: &str) -> String {
            format!("{}{space}:", self.run_prefix())
        }

        /// A plain client connection, to read Redis without the store.
        pub async fn raw(&self) -> redis::aio::MultiplexedConnection {
            redis::Client::open(self.url.as_str())
                .expect("a Redis URL")
                .get_multiplexed_async_connection()
                .await
                .expect("connect to Redis")
        }
    }

    impl Backend for RedisBackend {
        type Store = RedisStore;

        async fn build(
            &self,
            space: &str,
            ttl: Option<Duration>,
        ) -> Result<RedisStore, StoreError> {
            let mut builder = RedisStore::builder().prefix(self.prefix(space));
            if let Some(ttl) = ttl {
                builder = builder.ttl(ttl);
            }
            builder.connect_lazy(&self.url)
        }

        fn self_expiring(&self) -> bool {
            true
        }
    }

    impl Drop for RedisBackend {
        fn drop(&mut self) {
            // Blocking I/O on purpose: Drop cannot await, and it must run
            // when a test panics too. A server that is gone has nothing to clean.
            let Ok(client) = redis::Client::open(self.url.as_str()) else {
                return;
            };
            let Ok(mut connection) = client.get_connection_with_timeout(Duration::from_secs(2))
            else {
                return;
            };
            let pattern = format!("{}*", self.run_prefix());
            let mut cursor = 0u64;
            loop {
                let page: redis::RedisResult<(u64, Vec<Vec<u8>>)> = redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(1000)
                    .query(&mut connection);
                let Ok((next, keys)) = page else { return };
                if !keys.is_empty() {
                    let _: redis::RedisResult<i64> =
                        redis::cmd("DEL").arg(keys).query(&mut connection);
                }
                if next == 0 {
                    return;
                }
                cursor = next;
            }
        }
    }
}

/// PostgreSQL: the shared server from `BABEL_IDEM_POSTGRES_URL`, one table per space.
#[cfg(feature = "postgres")]
pub use postgres_backend::PostgresBackend;

#[cfg(feature = "postgres")]
mod postgres_backend {
    use super::*;
    use crate::store_contract::servers::{POSTGRES_URL, server_url};
    use babel_idem::store::PostgresStore;
    use sqlx::Connection;
    use std::sync::Mutex;

    pub struct PostgresBackend {
        pub url: String,
        run: String,
        tables: Mutex<Vec<String>>,
        acquire_timeout: Duration,
    }

    impl PostgresBackend {
        pub fn create(test: &str) -> Option<Self> {
            let url = server_url(POSTGRES_URL, test)?;
            Some(Self::on(url, Duration::from_secs(5)))
        }

        /// A fixture on a given server (the outage tests' own).
        pub fn on(url: String, acquire_timeout: Duration) -> Self {
            PostgresBackend {
                url,
                run: unique_suffix(),
                tables: Mutex::new(Vec::new()),
                acquire_timeout,
            }
        }

        /// The table of `space`, recorded so the fixture drops it.
        pub fn table(&self, space: &str) -> String {
            let table = table_name(&self.run, space);
            let mut tables = self.tables.lock().unwrap();
            if !tables.contains(&table) {
                tables.push(table.clone());
            }
            table
        }

        /// A store on `space` that is built but not migrated.
        pub fn unmigrated(&self, space: &str, ttl: Option<Duration>) -> PostgresStore {
            self.build_unmigrated(space, ttl)
                .expect("build the PostgreSQL store")
        }

        fn build_unmigrated(
            &self,
            space: &str,
            ttl: Option<Duration>,
        ) -> Result<PostgresStore, StoreError> {
            let mut builder = PostgresStore::builder()
                .table(self.table(space))
                .acquire_timeout(self.acquire_timeout);
            if let Some(ttl) = ttl {
                builder = builder.ttl(ttl);
            }
            builder.connect_lazy(&self.url)
        }

        /// A plain connection, to read the table without the store.
        pub async fn raw(&self) -> sqlx::PgConnection {
            sqlx::PgConnection::connect(&self.url)
                .await
                .expect("connect to PostgreSQL")
        }
    }

    impl Backend for PostgresBackend {
        type Store = PostgresStore;

        async fn build(
            &self,
            space: &str,
            ttl: Option<Duration>,
        ) -> Result<PostgresStore, StoreError> {
            let store = self.build_unmigrated(space, ttl)?;
            store.migrate().await?;
            Ok(store)
        }

        async fn migrate_claims(&self, store: &PostgresStore) -> Result<(), StoreError> {
            store.migrate_claims().await
        }

        fn stores_nul(&self) -> bool {
            false
        }
    }

    impl Drop for PostgresBackend {
        fn drop(&mut self) {
            let tables = std::mem::take(&mut *self.tables.lock().unwrap());
            if tables.is_empty() {
                return;
            }
            let url = self.url.clone();
            // Drop cannot await and may run inside the test's runtime: clean
            // up from a thread with a runtime of its own.
            let cleanup = std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a cleanup runtime");
                runtime.block_on(async move {
                    let connect = sqlx::PgConnection::connect(&url);
                    let Ok(Ok(mut connection)) =
                        tokio::time::timeout(Duration::from_secs(5), connect).await
                    else {
                        return;
                    };
                    for table in tables {
                        // The seen-set table, then claim mode's table and sequence.
                        let drop_table = format!(
                            "DROP TABLE IF EXISTS {table}, {table}_claims; \
                             DROP SEQUENCE IF EXISTS {table}_claims_fence"
                        );
                        let _ = sqlx::raw_sql(&drop_table).execute(&mut connection).await;
                    }
                });
            });
            let _ = cleanup.join();
        }
    }
}

/// A Redis Cluster from `BABEL_IDEM_REDIS_CLUSTER_URL`, one prefix per space.
#[cfg(feature = "redis-cluster")]
pub use redis_cluster_backend::{RedisClusterBackend, seed_urls};

#[cfg(feature = "redis-cluster")]
mod redis_cluster_backend {
    use super::*;
    use crate::store_contract::servers::{REDIS_CLUSTER_URL, server_url};
    use babel_idem::store::RedisStore;

    pub struct RedisClusterBackend {
        pub url: String,
        run: String,
    }

    impl RedisClusterBackend {
        pub fn create(test: &str) -> Option<Self> {
            let url = server_url(REDIS_CLUSTER_URL, test)?;
            Some(Self::on(url))
        }

        /// A fixture on a given cluster (the failover tests' own).
        pub fn on(url: String) -> Self {
            RedisClusterBackend {
                url,
                run: unique_suffix(),
            }
        }

        pub fn run_prefix(&self) -> String {
            format!("bqtest:{}:", self.run)
        }

        pub fn prefix(&self, space: &str) -> String {
            format!("{}{space}:", self.run_prefix())
        }

        /// The seed nodes as plain `redis://host:port/` URLs.
        pub fn seeds(&self) -> Vec<String> {
            seed_urls(&self.url)
        }

        /// A cluster connection, to read the cluster without the store.
        pub async fn raw(&self) -> redis::cluster_async::ClusterConnection {
            redis::cluster::ClusterClient::new(self.seeds())
                .expect("a cluster URL")
                .get_async_connection()
                .await
                .expect("connect to the Redis Cluster")
        }
    }

    /// `redis+cluster://a:1,b:2/` as `["redis://a:1/", "redis://b:2/"]`.
    pub fn seed_urls(url: &str) -> Vec<String> {
        let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
        let hosts = rest.split(['/', '?']).next().unwrap_or_default();
        hosts
            .split(',')
            .filter(|host| !host.is_empty())
            .map(|host| format!("redis://{host}/"))
            .collect()
    }

    /// The masters serving slots, as `host:port`, read from `seed` (sync).
    pub fn masters(seed: &str) -> Vec<String> {
        let Ok(client) = redis::Client::open(seed) else {
            return Vec::new();
        };
        let Ok(mut connection) = client.get_connection_with_timeout(Duration::from_secs(2)) else {
            return Vec::new();
        };
        let nodes: String = redis::cmd("CLUSTER")
            .arg("NODES")
            .query(&mut connection)
            .unwrap_or_default();
        nodes
            .lines()
            .filter_map(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                let flags = fields.get(2)?;
                (flags.contains("master") && !flags.contains("fail") && fields.len() > 8)
                    .then(|| fields[1].split('@').next().unwrap_or_default().to_owned())
            })
            .collect()
    }

    impl Backend for RedisClusterBackend {
        type Store = RedisStore;

        async fn build(
            &self,
            space: &str,
            ttl: Option<Duration>,
        ) -> Result<RedisStore, StoreError> {
            let mut builder = RedisStore::builder().prefix(self.prefix(space));
            if let Some(ttl) = ttl {
                builder = builder.ttl(ttl);
            }
            builder.connect_lazy(&self.url)
        }

        fn self_expiring(&self) -> bool {
            true
        }

        fn fences_store_wide(&self) -> bool {
            false
        }
    }

    impl Drop for RedisClusterBackend {
        fn drop(&mut self) {
            // Every master holds its slots' keys: SCAN each, DEL key by key
            // (a multi-key DEL must stay in one slot). Claim keys and fence
            // counters start with the run's prefix too, bar the last byte.
            let Some(seed) = self.seeds().into_iter().next() else {
                return;
            };
            let stem = self.run_prefix();
            let stem = &stem[..stem.len() - 1];
            for master in masters(&seed) {
                let Ok(client) = redis::Client::open(format!("redis://{master}/")) else {
                    continue;
                };
                let Ok(mut connection) = client.get_connection_with_timeout(Duration::from_secs(2))
                else {
                    continue;
                };
                let mut cursor = 0u64;
                loop {
                    let page: redis::RedisResult<(u64, Vec<Vec<u8>>)> = redis::cmd("SCAN")
                        .arg(cursor)
                        .arg("MATCH")
                        .arg(format!("{stem}*"))
                        .arg("COUNT")
                        .arg(1000)
                        .query(&mut connection);
                    let Ok((next, keys)) = page else { break };
                    let mut pipeline = redis::pipe();
                    for key in keys {
                        pipeline.cmd("DEL").arg(key).ignore();
                    }
                    let _: redis::RedisResult<()> = pipeline.query(&mut connection);
                    if next == 0 {
                        break;
                    }
                    cursor = next;
                }
            }
        }
    }
}
