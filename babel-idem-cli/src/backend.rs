//! The store a URL names, opened with the operator's settings. Every
//! operation is the library's (the stores' `admin` operations and
//! [`Store`]); this module only picks the backend and sorts failures into
//! exit codes.

use std::time::Duration;

use babel_idem::store::StoreStats;
use babel_idem::store::{PostgresStore, RedisStore, SqliteStore};
use babel_idem::{Store, StoreError};

use crate::exit::{CliError, Exit, store_failed};
use crate::target::Target;

/// The operator's store settings.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub table: Option<String>,
    pub prefix: Option<String>,
    pub timeout: Duration,
}

/// Whether opening a SQLite store may create its file and table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Create {
    Yes,
    No,
}

pub(crate) enum Backend {
    Sqlite(SqliteStore),
    Redis(RedisStore),
    Postgres(PostgresStore),
}

/// Building the store refused a setting (a table name, a prefix, a URL).
fn refused(error: StoreError) -> CliError {
    CliError::usage(error.to_string())
}

impl Backend {
    /// The store `target` names, reached and ready: its table is there.
    /// A missing SQLite file is not created (see [`Backend::migrate`]).
    pub(crate) async fn ready(target: &Target, settings: &Settings) -> Result<Backend, CliError> {
        if let Target::Sqlite(path) = target
            && !path.exists()
        {
            return Err(not_migrated(target, "no SQLite database at this path"));
        }
        let backend = Backend::open(target, settings, Create::No).await?;
        let reached = match &backend {
            Backend::Sqlite(store) => store.table_exists().await,
            Backend::Postgres(store) => store.table_exists().await,
            Backend::Redis(store) => store.ping().await.map(|()| true),
        };
        match reached {
            Ok(true) => Ok(backend),
            Ok(false) => Err(not_migrated(
                target,
                &format!(
                    "table {} does not exist",
                    backend.table().unwrap_or_default()
                ),
            )),
            Err(error) => Err(cannot_reach(target, error)),
        }
    }

    /// Creates the table and its index where they are missing (and the
    /// SQLite file); `None` for Redis, which has nothing to create (it is
    /// pinged, so bad credentials still fail).
    pub(crate) async fn migrate(
        target: &Target,
        settings: &Settings,
    ) -> Result<Option<String>, CliError> {
        match Backend::open(target, settings, Create::Yes).await? {
            // Opening the file created it and its table.
            Backend::Sqlite(store) => Ok(Some(store.table().to_owned())),
            Backend::Postgres(store) => {
                store
                    .table_exists()
                    .await
                    .map_err(|e| cannot_reach(target, e))?;
                store.migrate().await.map_err(store_failed)?;
                Ok(Some(store.table().to_owned()))
            }
            Backend::Redis(store) => {
                store.ping().await.map_err(|e| cannot_reach(target, e))?;
                Ok(None)
            }
        }
    }

    /// The store, with its settings checked. Nothing is reached, except a
    /// SQLite file that `create` asks to make (and migrate).
    async fn open(
        target: &Target,
        settings: &Settings,
        create: Create,
    ) -> Result<Backend, CliError> {
        match target {
            Target::Sqlite(_) | Target::Postgres(_) if settings.prefix.is_some() => Err(
                CliError::usage("--prefix is a Redis setting; SQL stores take --table"),
            ),
            Target::Redis(_) if settings.table.is_some() => Err(CliError::usage(
                "--table is a SQL setting; Redis stores take --prefix",
            )),
            Target::Sqlite(path) => {
                // Lazy: refuses a bad table name before the file is touched.
                let store = sqlite_builder(settings)
                    .open_existing(path)
                    .map_err(refused)?;
                if create == Create::No {
                    return Ok(Backend::Sqlite(store));
                }
                sqlite_builder(settings)
                    .open(path)
                    .await
                    .map(Backend::Sqlite)
                    .map_err(|e| cannot_reach(target, e))
            }
            Target::Postgres(url) => {
                let mut builder = PostgresStore::builder()
                    .acquire_timeout(settings.timeout)
                    .max_connections(2);
                if let Some(table) = &settings.table {
                    builder = builder.table(table);
                }
                builder
                    .connect_lazy(url)
                    .map(Backend::Postgres)
                    .map_err(refused)
            }
            Target::Redis(url) => {
                let mut builder = RedisStore::builder()
                    .timeout(settings.timeout)
                    .reconnect_attempts(1);
                if let Some(prefix) = &settings.prefix {
                    builder = builder.prefix(prefix);
                }
                builder
                    .connect_lazy(url)
                    .map(Backend::Redis)
                    .map_err(refused)
            }
        }
    }

    pub(crate) fn store(&self) -> &dyn Store {
        match self {
            Backend::Sqlite(store) => store,
            Backend::Redis(store) => store,
            Backend::Postgres(store) => store,
        }
    }

    /// The SQL stores' table.
    fn table(&self) -> Option<&str> {
        match self {
            Backend::Sqlite(store) => Some(store.table()),
            Backend::Postgres(store) => Some(store.table()),
            Backend::Redis(_) => None,
        }
    }

    pub(crate) fn is_redis(&self) -> bool {
        matches!(self, Backend::Redis(_))
    }

    pub(crate) async fn stored_many(&self, keys: &[&str]) -> Result<Vec<bool>, CliError> {
        match self {
            Backend::Sqlite(store) => store.stored_many(keys).await,
            Backend::Redis(store) => store.stored_many(keys).await,
            Backend::Postgres(store) => store.stored_many(keys).await,
        }
        .map_err(store_failed)
    }

    pub(crate) async fn forget_many(&self, keys: &[&str]) -> Result<u64, CliError> {
        match self {
            Backend::Sqlite(store) => store.forget_many(keys).await,
            Backend::Redis(store) => store.forget_many(keys).await,
            Backend::Postgres(store) => store.forget_many(keys).await,
        }
        .map_err(store_failed)
    }

    pub(crate) async fn stats(&self, key_prefix: &str) -> Result<StoreStats, CliError> {
        match self {
            Backend::Sqlite(store) => store.stats(key_prefix).await,
            Backend::Redis(store) => store.stats(key_prefix).await,
            Backend::Postgres(store) => store.stats(key_prefix).await,
        }
        .map_err(store_failed)
    }

    pub(crate) async fn count_expired(&self) -> Result<u64, CliError> {
        match self {
            Backend::Sqlite(store) => store.count_expired().await,
            Backend::Redis(store) => store.count_expired().await,
            Backend::Postgres(store) => store.count_expired().await,
        }
        .map_err(store_failed)
    }

    /// Deletes up to `limit` expired marks; Redis has none waiting.
    pub(crate) async fn purge_expired_batch(&self, limit: u32) -> Result<u64, CliError> {
        match self {
            Backend::Sqlite(store) => store.purge_expired_batch(limit).await,
            Backend::Redis(store) => store.purge_expired().await,
            Backend::Postgres(store) => store.purge_expired_batch(limit).await,
        }
        .map_err(store_failed)
    }
}

fn sqlite_builder(settings: &Settings) -> babel_idem::store::SqliteStoreBuilder {
    let mut builder = SqliteStore::builder()
        .busy_timeout(settings.timeout)
        .max_connections(1);
    if let Some(table) = &settings.table {
        builder = builder.table(table);
    }
    builder
}

fn not_migrated(target: &Target, what: &str) -> CliError {
    CliError::new(
        Exit::NotMigrated,
        format!(
            "{}: {what}: run `babel-idem migrate URL` (with the same --table) first",
            target.display()
        ),
    )
}

fn cannot_reach(target: &Target, error: StoreError) -> CliError {
    let verb = match target {
        Target::Sqlite(_) => "cannot open",
        _ => "cannot connect to",
    };
    CliError::new(
        Exit::Connect,
        format!("{verb} {}: {}", target.display(), source_chain(&error)),
    )
}

/// The error and its causes, `: `-separated: a connection failure's reason
/// (refused, password) is often only in a source.
fn source_chain(error: &StoreError) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    // The store error's own text already ends with its direct source.
    if let Some(direct) = source {
        source = direct.source();
    }
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}
