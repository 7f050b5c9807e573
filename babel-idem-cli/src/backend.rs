//! The store a URL names, opened with the operator's settings: the one
//! place the CLI looks at the backend. Every command then works on the
//! store through [`Admin`], the library's; this module only opens,
//! migrates, and sorts failures into exit codes.

use std::time::Duration;

use babel_idem::StoreError;
use babel_idem::store::{Admin, PostgresStore, RedisStore, SqliteStore, SqliteStoreBuilder};

use crate::exit::{CliError, Exit, store_failed};
use crate::target::Target;

/// The operator's store settings.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub table: Option<String>,
    pub prefix: Option<String>,
    pub php_claims: bool,
    pub timeout: Duration,
}

/// A store, reached and set up, with what the commands say about it.
pub(crate) struct Opened {
    pub admin: Box<dyn Admin>,
    /// The server deletes expired marks and finished claims itself, and
    /// keeps no write time (Redis): nothing to purge, no oldest or newest.
    pub self_expiring: bool,
}

/// What a migration made, or would make.
pub(crate) struct Migration {
    /// The seen-set table; `None` where there is no schema (Redis).
    pub table: Option<String>,
    /// Claim mode's table, when asked for.
    pub claims_table: Option<String>,
    /// With `--dry-run`: the tables missing, which a migration would create.
    pub missing: Vec<String>,
}

/// Building the store refused a setting (a table name, a prefix, a URL).
fn refused(error: StoreError) -> CliError {
    CliError::usage(error.to_string())
}

/// Whether a command writes to the store: a read-only one opens a SQLite
/// file read-only, so a file the process may not write still answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    Read,
    Write,
}

/// Opens the store `target` names, reached and ready: its table is there.
/// A missing SQLite file is not created (see [`migrate`]).
pub(crate) async fn open(
    target: &Target,
    settings: &Settings,
    access: Access,
) -> Result<Opened, CliError> {
    check_options(target, settings)?;
    let reach = |e| cannot_reach(target, e);
    match target {
        Target::Sqlite(path) => {
            if !path.exists() {
                return Err(not_migrated(target, "no SQLite database at this path"));
            }
            if access == Access::Write {
                refuse_read_only(target, path)?;
            }
            // Lazy: refuses a bad table name before the file is touched.
            sqlite_builder(settings)
                .open_existing(path)
                .map_err(refused)?;
            let builder = sqlite_builder(settings);
            let store = match access {
                Access::Read => builder.open_read_only(path).await.map_err(reach)?,
                Access::Write => builder.open_existing(path).map_err(refused)?,
            };
            if !store.table_exists().await.map_err(reach)? {
                return Err(missing_table(target, store.table()));
            }
            Ok(sql(store))
        }
        Target::Postgres(url) => {
            let store = postgres_store(url, settings)?;
            if !store.table_exists().await.map_err(reach)? {
                return Err(missing_table(target, store.table()));
            }
            Ok(sql(store))
        }
        Target::Redis(url) => {
            let store = redis_store(url, settings)?;
            store.ping().await.map_err(reach)?;
            Ok(Opened {
                admin: Box::new(store),
                self_expiring: true,
            })
        }
    }
}

/// Creates the seen-set table and its index where they are missing (and
/// the SQLite file), and claim mode's tables with `claims`; with `dry_run`
/// only says which are missing. Redis has nothing to create; it is pinged,
/// so bad credentials still fail.
pub(crate) async fn migrate(
    target: &Target,
    settings: &Settings,
    claims: bool,
    dry_run: bool,
) -> Result<Migration, CliError> {
    check_options(target, settings)?;
    let reach = |e| cannot_reach(target, e);
    match target {
        Target::Sqlite(path) => {
            // Lazy: refuses a bad table name before the file is touched.
            let existing = sqlite_builder(settings)
                .open_existing(path)
                .map_err(refused)?;
            let (table, claims_table) = (existing.table(), format!("{}_claims", existing.table()));
            if dry_run {
                let there = path.exists();
                let mut missing = Vec::new();
                if !there || !existing.table_exists().await.map_err(reach)? {
                    missing.push(table.to_owned());
                }
                if claims && (!there || !existing.claims_table_exists().await.map_err(reach)?) {
                    missing.push(claims_table.clone());
                }
                return Ok(migration(table, claims.then_some(claims_table), missing));
            }
            if path.exists() {
                refuse_read_only(target, path)?;
            }
            // Opening makes the file and the seen-set table.
            let store = sqlite_builder(settings).open(path).await.map_err(reach)?;
            if claims {
                store.migrate_claims().await.map_err(store_failed)?;
            }
            Ok(migration(table, claims.then_some(claims_table), Vec::new()))
        }
        Target::Postgres(url) => {
            let store = postgres_store(url, settings)?;
            let (table, claims_table) = (store.table(), format!("{}_claims", store.table()));
            let table_there = store.table_exists().await.map_err(reach)?;
            if dry_run {
                let mut missing = Vec::new();
                if !table_there {
                    missing.push(table.to_owned());
                }
                if claims && !store.claims_table_exists().await.map_err(store_failed)? {
                    missing.push(claims_table.clone());
                }
                return Ok(migration(table, claims.then_some(claims_table), missing));
            }
            store.migrate().await.map_err(store_failed)?;
            if claims {
                store.migrate_claims().await.map_err(store_failed)?;
            }
            Ok(migration(table, claims.then_some(claims_table), Vec::new()))
        }
        Target::Redis(url) => {
            redis_store(url, settings)?.ping().await.map_err(reach)?;
            Ok(Migration {
                table: None,
                claims_table: None,
                missing: Vec::new(),
            })
        }
    }
}

fn migration(table: &str, claims_table: Option<String>, missing: Vec<String>) -> Migration {
    Migration {
        table: Some(table.to_owned()),
        claims_table,
        missing,
    }
}

fn sql(store: impl Admin + 'static) -> Opened {
    Opened {
        admin: Box::new(store),
        self_expiring: false,
    }
}

/// Refuses a setting of another backend.
fn check_options(target: &Target, settings: &Settings) -> Result<(), CliError> {
    match target {
        Target::Sqlite(_) | Target::Postgres(_) if settings.prefix.is_some() => Err(
            CliError::usage("--prefix is a Redis setting; SQL stores take --table"),
        ),
        Target::Sqlite(_) | Target::Postgres(_) if settings.php_claims => Err(CliError::usage(
            "--php-claims is a Redis layout; SQL stores have one layout",
        )),
        Target::Redis(_) if settings.table.is_some() => Err(CliError::usage(
            "--table is a SQL setting; Redis stores take --prefix",
        )),
        _ => Ok(()),
    }
}

fn sqlite_builder(settings: &Settings) -> SqliteStoreBuilder {
    let mut builder = SqliteStore::builder()
        .busy_timeout(settings.timeout)
        .max_connections(1);
    if let Some(table) = &settings.table {
        builder = builder.table(table);
    }
    builder
}

/// A lazily connected store: nothing is reached yet.
fn postgres_store(url: &str, settings: &Settings) -> Result<PostgresStore, CliError> {
    let mut builder = PostgresStore::builder()
        .acquire_timeout(settings.timeout)
        .max_connections(2);
    if let Some(table) = &settings.table {
        builder = builder.table(table);
    }
    builder.connect_lazy(url).map_err(refused)
}

/// A lazily connected store: nothing is reached yet.
fn redis_store(url: &str, settings: &Settings) -> Result<RedisStore, CliError> {
    let mut builder = RedisStore::builder()
        .timeout(settings.timeout)
        .reconnect_attempts(1);
    if settings.php_claims {
        builder = builder.php_claims();
    }
    if let Some(prefix) = &settings.prefix {
        builder = builder.prefix(prefix);
    }
    builder.connect_lazy(url).map_err(refused)
}

/// A command that writes, on a SQLite file this process may not write:
/// one clear error before SQLite's own (`attempt to write a readonly
/// database`, met halfway).
fn refuse_read_only(target: &Target, path: &std::path::Path) -> Result<(), CliError> {
    let writable = std::fs::OpenOptions::new().write(true).open(path).is_ok();
    if writable {
        return Ok(());
    }
    Err(CliError::new(
        Exit::Store,
        format!(
            "{} is read-only here: this command writes to it (seen and stats only read)",
            target.display()
        ),
    ))
}

fn missing_table(target: &Target, table: &str) -> CliError {
    not_migrated(target, &format!("table {table} does not exist"))
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
    // The store error's own text already ends with its direct source.
    let direct = std::error::Error::source(error);
    with_causes(error.to_string(), direct.and_then(|direct| direct.source()))
}

/// `text` followed by `source` and its own sources, each `: `-separated,
/// leaving out a cause whose text `text` already holds.
pub(crate) fn with_causes(
    mut text: String,
    mut source: Option<&(dyn std::error::Error + 'static)>,
) -> String {
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
