//! Settings the stores share, checked once when a store is built: the TTL,
//! the Tokio runtime the server clients need and, for the SQL stores, the
//! table name and the statements written for it.
//!
//! Every builder calls these, so a setting means the same thing, and is
//! refused with the same words, whichever backend it is given to.

use std::ops::Range;
use std::time::Duration;

#[cfg(any(feature = "sqlite", feature = "postgres"))]
use super::{StoreError, StoreOperation, failed};

/// The longest TTL a store accepts: 36,500 days (about 100 years).
///
/// PostgreSQL cannot add much more than 292,000 years to `now()` ("interval
/// out of range") and Redis refuses a `PX` past `i64::MAX` ms from now; one
/// bound far inside both keeps the rule identical for every backend. For ids
/// that never expire, set no TTL.
pub const MAX_TTL: Duration = Duration::from_secs(36_500 * 24 * 3600);

/// The TTL in whole milliseconds, the unit every backend expires in; a
/// fraction of a millisecond is dropped.
///
/// Under one millisecond would forget each id as it is remembered (and
/// Redis refuses `PX 0`); over [`MAX_TTL`] a server refuses every write.
/// Both are refused here, when the store is built, rather than by the
/// server on every delivery (which, with the default remember-failure
/// policy, silently turns dedupe off).
pub(crate) fn ttl_millis(ttl: Duration) -> Result<i64, InvalidTtl> {
    if ttl < Duration::from_millis(1) || ttl > MAX_TTL {
        return Err(InvalidTtl { ttl });
    }
    // In range, so at most 3.2e12: it fits.
    Ok(ttl.as_millis() as i64)
}

/// [`ttl_millis`] of an optional TTL (`None`: ids never expire).
pub(crate) fn optional_ttl_millis(ttl: Option<Duration>) -> Result<Option<i64>, InvalidTtl> {
    ttl.map(ttl_millis).transpose()
}

/// A TTL outside 1 ms ..= [`MAX_TTL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "TTL {ttl:?} is out of range: it must be at least 1 ms and at most 36500 days \
     (about 100 years); for ids that never expire, set no TTL"
)]
pub(crate) struct InvalidTtl {
    ttl: Duration,
}

/// `text` with every secret `url` may carry replaced by `***`: what an
/// error message, a log line or an output line may say about a store or
/// broker URL, whatever its shape.
///
/// A URL that [`check_url_credentials`] accepts is read as every client
/// reads it: its password (after the user info's first `:`, up to the
/// authority's last `@`) and the value of every query parameter naming a
/// password (`password=`, `sslpassword=`, in any case) are hidden, and the
/// URL itself, quoted whole, keeps its scheme, user and host in sight.
/// A malformed URL (`postgres:/u:pw@host/db`, `redis:/:pw@host`, a
/// password holding `/`, `?` or `#`) splits differently in every parser,
/// so no one reading says where its password is: every reading is hidden
/// instead, the text between any `:` and any later `@`, and its pieces
/// between `/`, `?` and `#`. Each secret is also hidden percent-decoded
/// and as `Debug` escapes it.
///
/// ```
/// use babel_idem::store::redact_url_secrets;
///
/// let url = "postgres://app:s3cret@db:5432/app";
/// assert_eq!(redact_url_secrets(url, url), "postgres://app:***@db:5432/app");
/// let typo = "postgres:/app:s3cret@db/app";
/// let error = format!("cannot parse {typo}: the password s3cret is not a port");
/// assert!(!redact_url_secrets(&error, typo).contains("s3cret"));
/// ```
pub fn redact_url_secrets(text: &str, url: &str) -> String {
    let secrets = url_secrets(url);
    let scrub = |piece: &str| {
        let mut piece = piece.to_owned();
        for secret in &secrets {
            if piece.contains(secret.as_str()) {
                piece = piece.replace(secret.as_str(), "***");
            }
        }
        piece
    };
    if url.is_empty() || !text.contains(url) {
        return scrub(text);
    }
    // The URL quoted whole loses only its password, not a user or a host
    // that happens to be spelled like it.
    let shown = match password_spans(url) {
        Some(spans) => {
            let mut shown = url.to_owned();
            for span in spans.into_iter().rev() {
                shown.replace_range(span, "***");
            }
            shown
        }
        None => scrub(url),
    };
    text.split(url).map(scrub).collect::<Vec<_>>().join(&shown)
}

/// Where the secrets of a URL that [`check_url_credentials`] accepts are,
/// as every client reads it, in order; `None` for a URL it refuses.
fn password_spans(url: &str) -> Option<Vec<Range<usize>>> {
    check_url_credentials(url).ok()?;
    let mut spans = Vec::new();
    let mut query_from = 0;
    if let Some((start, end)) = authority(url) {
        if let Some(at) = url[start..end].rfind('@')
            && let Some(colon) = url[start..start + at].find(':')
        {
            spans.push(start + colon + 1..start + at);
        }
        query_from = end;
    }
    if let Some(question) = url[query_from..].find('?') {
        let query_start = query_from + question + 1;
        let query_end = url[query_start..]
            .find('#')
            .map_or(url.len(), |at| query_start + at);
        let mut at = query_start;
        for pair in url[query_start..query_end].split('&') {
            if let Some(equals) = pair.find('=')
                && names_a_password(&pair[..equals])
            {
                spans.push(at + equals + 1..at + pair.len());
            }
            at += pair.len() + 1;
        }
    }
    spans.retain(|span| !span.is_empty());
    Some(spans)
}

/// Where the authority of a `scheme://` URL starts and ends (at its first
/// `/`, `?` or `#`).
fn authority(url: &str) -> Option<(usize, usize)> {
    let start = url.len() - url.trim_start().len();
    let separator = url[start..]
        .find("://")
        .filter(|&at| is_scheme(&url[start..start + at]))?;
    let authority_start = start + separator + 3;
    let authority_end = url[authority_start..]
        .find(['/', '?', '#'])
        .map_or(url.len(), |at| authority_start + at);
    Some((authority_start, authority_end))
}

/// Checks that the user info of a store or broker URL sits where every
/// client reads it; `Err` says what is wrong, without quoting the URL.
///
/// A URL whose password may land anywhere else is refused before any
/// client sees it: a client would take the password for a database name,
/// a host or a port, and a server quotes those back (`database "u:pw@host/db"
/// does not exist`). The stores and transports refuse such a URL when
/// they are built. The rule, for a URL holding an `@`:
///
/// - it starts with `scheme://` (not `scheme:/`, `scheme:` or `scheme//`);
/// - no `:` that could start a password is followed by an `@` anywhere
///   else than in the user info right after `scheme://`: a `:` in the
///   path, or after the host when what follows is not a port number
///   (`postgres://u:pw/d@host`, `postgres:///u:pw@host`). A `/`, `?`, `#`
///   or `@` inside a password is written `%2F`, `%3F`, `%23` or `%40`.
///
/// ```
/// use babel_idem::store::check_url_credentials;
///
/// assert!(check_url_credentials("postgres://app:s3cret@db:5432/app").is_ok());
/// assert!(check_url_credentials("redis://127.0.0.1:6379/0?client=a@b").is_ok());
/// assert!(check_url_credentials("postgres:/app:s3cret@db/app").is_err());
/// assert!(check_url_credentials("postgres://app:s3c/ret@db/app").is_err());
/// let refused = check_url_credentials("redis:/:s3cret@host").unwrap_err();
/// assert!(!refused.contains("s3cret"));
/// ```
pub fn check_url_credentials(url: &str) -> Result<(), &'static str> {
    if !url.contains('@') {
        return Ok(());
    }
    let Some((authority_start, authority_end)) = authority(url) else {
        return Err("its user info has no `scheme://` in front: \
                    write scheme://user:password@host/...");
    };
    let query_start = url[authority_end..]
        .find(['?', '#'])
        .map_or(url.len(), |at| authority_end + at);
    // The `@` that ends the user info, as clients read it: the authority's last.
    let user_info_end = url[authority_start..authority_end]
        .rfind('@')
        .map(|at| authority_start + at);
    for (colon, _) in url.match_indices(':') {
        if colon < authority_start || user_info_end.is_some_and(|at| colon < at) {
            continue;
        }
        if colon >= query_start {
            break;
        }
        if colon < authority_end
            && is_port_colon(
                &url[authority_start..authority_end],
                colon - authority_start,
            )
        {
            continue;
        }
        if url[colon..].contains('@') {
            return Err(
                "a `:` outside the user info is followed by an `@`: the user info goes \
                        right after `scheme://`, and a `/`, `?`, `#` or `@` inside a password \
                        is written %2F, %3F, %23 or %40",
            );
        }
    }
    Ok(())
}

/// Whether the `:` at `at` in `authority` separates a host from its port
/// (digits up to the next `,` of a host list), or sits inside an IPv6
/// literal's brackets.
fn is_port_colon(authority: &str, at: usize) -> bool {
    let before = &authority[..at];
    let host_start = before.rfind([',', '@']).map_or(0, |at| at + 1);
    let host = &before[host_start..];
    if host.rfind('[') > host.rfind(']') {
        return true;
    }
    let after = &authority[at + 1..];
    let port = after.split(',').next().unwrap_or(after);
    port.chars().all(|c| c.is_ascii_digit())
}

/// Whether `text` is a URL scheme: a letter, then letters, digits, `+`,
/// `-` or `.`.
fn is_scheme(text: &str) -> bool {
    text.starts_with(|c: char| c.is_ascii_alphabetic())
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
}

/// A store URL refused before any client read it, without its secrets.
#[cfg_attr(
    not(any(feature = "redis", feature = "postgres")),
    allow(dead_code, reason = "only the server stores take URLs")
)]
#[derive(Debug, thiserror::Error)]
#[error("the URL {url:?} cannot be used: {reason}")]
pub(crate) struct InvalidUrl {
    url: String,
    reason: &'static str,
}

#[cfg_attr(
    not(any(feature = "redis", feature = "postgres")),
    allow(dead_code, reason = "only the server stores take URLs")
)]
impl InvalidUrl {
    /// `Err` when [`check_url_credentials`] refuses `url`.
    pub(crate) fn check(url: &str) -> Result<(), InvalidUrl> {
        check_url_credentials(url).map_err(|reason| InvalidUrl {
            url: redact_url_secrets(url, url),
            reason,
        })
    }
}

/// Every text of `url` that some reading of it takes for a secret, the
/// longest first; see [`redact_url_secrets`]. Never an empty string.
fn url_secrets(url: &str) -> Vec<String> {
    let mut found: Vec<&str> = Vec::new();
    match password_spans(url) {
        Some(spans) => found.extend(spans.into_iter().map(|span| &url[span])),
        None => {
            // The colon of a leading scheme (`postgres:`) starts a password
            // only when no slash follows it (`postgres:user:pw@`, `user:pw@`).
            let trimmed = url.trim_start();
            let scheme_colon = trimmed
                .find(':')
                .filter(|&at| is_scheme(&trimmed[..at]))
                .map(|at| at + (url.len() - trimmed.len()));
            let colons: Vec<usize> = url.match_indices(':').map(|(at, _)| at).collect();
            for (at, _) in url.match_indices('@') {
                for &colon in colons.iter().take_while(|&&colon| colon < at) {
                    let reading = &url[colon + 1..at];
                    if Some(colon) == scheme_colon && reading.starts_with('/') {
                        continue;
                    }
                    found.push(reading);
                    // Where a parser ends the authority, the rest of it.
                    found.extend(reading.split(['/', '?', '#']));
                }
            }
            for pair in url.split(['?', '&', ';']) {
                if let Some((key, value)) = pair.split_once('=')
                    && names_a_password(key)
                {
                    found.push(value.split('#').next().unwrap_or(value));
                }
            }
        }
    }
    let mut secrets: Vec<String> = Vec::new();
    for secret in found.into_iter().filter(|secret| !secret.is_empty()) {
        let debug = format!("{secret:?}");
        let escaped = debug[1..debug.len() - 1].to_owned();
        for form in [secret.to_owned(), percent_decoded(secret), escaped] {
            if !form.is_empty() && !secrets.contains(&form) {
                secrets.push(form);
            }
        }
    }
    // The longest first: a secret inside another is then already gone.
    secrets.sort_by_key(|secret| std::cmp::Reverse(secret.len()));
    secrets
}

/// Whether a query parameter's name (percent-encoded or not) names a
/// password.
fn names_a_password(key: &str) -> bool {
    let decoded = percent_decoded(key).to_ascii_lowercase();
    decoded.contains("password") || matches!(decoded.as_str(), "pass" | "passwd" | "pwd")
}

/// `text` with its `%XX` escapes decoded (invalid escapes kept as they are,
/// bytes that do not make UTF-8 replaced).
fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let (Some(hi), Some(lo)) = (hex(bytes[i + 1]), hex(bytes[i + 2]))
        {
            out.push((hi * 16 + lo) as u8);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The Tokio drivers a store's client uses once it is built.
#[cfg(any(feature = "sqlite", feature = "redis", feature = "postgres"))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Drivers {
    /// Timers only: SQLite runs its I/O on its own threads.
    #[cfg_attr(
        not(feature = "sqlite"),
        allow(dead_code, reason = "only SQLite asks for timers alone")
    )]
    Time,
    /// Timers and sockets: the server clients.
    #[cfg_attr(
        not(any(feature = "redis", feature = "postgres")),
        allow(dead_code, reason = "only the server stores ask for sockets")
    )]
    TimeAndIo,
}

/// Fails unless a Tokio runtime with `drivers` is running: the clients start
/// background tasks when they are built, time out every command with Tokio
/// timers and, for a server, talk over Tokio sockets; each panics on a
/// runtime built without `enable_time` / `enable_io`, at the first delivery.
#[cfg(any(feature = "sqlite", feature = "redis", feature = "postgres"))]
pub(crate) fn require_tokio(drivers: Drivers) -> Result<(), RuntimeUnfit> {
    if tokio::runtime::Handle::try_current().is_err() {
        return Err(RuntimeUnfit::NoRuntime);
    }
    if !timers_enabled() {
        return Err(RuntimeUnfit::TimersDisabled);
    }
    #[cfg(any(feature = "redis", feature = "postgres"))]
    if drivers == Drivers::TimeAndIo && !io_enabled() {
        return Err(RuntimeUnfit::IoDisabled);
    }
    let _ = drivers;
    Ok(())
}

/// Whether the current runtime has a time driver.
///
/// Tokio offers no query for it; making a timer is the test, and panics
/// without a driver. The panic is caught here, once, when a store is built
/// (the panic hook still prints Tokio's message; under `panic = "abort"` the
/// process stops here, at start-up, rather than at the first delivery). The
/// timer is never polled, so it is never registered.
#[cfg(any(feature = "sqlite", feature = "redis", feature = "postgres"))]
fn timers_enabled() -> bool {
    std::panic::catch_unwind(|| drop(tokio::time::sleep(Duration::ZERO))).is_ok()
}

/// Whether the current runtime has an I/O driver, tested as
/// [`timers_enabled`] is: registering a socket panics without one. A socket
/// that cannot be opened at all says nothing, and is not held against the
/// runtime.
#[cfg(any(feature = "redis", feature = "postgres"))]
fn io_enabled() -> bool {
    let Ok(socket) = std::net::UdpSocket::bind((std::net::Ipv4Addr::LOCALHOST, 0)) else {
        return true;
    };
    if socket.set_nonblocking(true).is_err() {
        return true;
    }
    std::panic::catch_unwind(move || drop(tokio::net::UdpSocket::from_std(socket))).is_ok()
}

/// The current thread has no Tokio runtime a store can run on.
#[cfg(any(feature = "sqlite", feature = "redis", feature = "postgres"))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum RuntimeUnfit {
    #[error(
        "no Tokio runtime is running: build this store inside one \
         (for example in `#[tokio::main]`)"
    )]
    NoRuntime,
    #[error(
        "the Tokio runtime has no time driver, which the store's client needs \
         for its timeouts: build the runtime with `enable_time()` (or `enable_all()`)"
    )]
    TimersDisabled,
    #[cfg_attr(
        not(any(feature = "redis", feature = "postgres")),
        allow(dead_code, reason = "only the server stores ask for sockets")
    )]
    #[error(
        "the Tokio runtime has no I/O driver, which the store's client needs \
         for its connections: build the runtime with `enable_io()` (or `enable_all()`)"
    )]
    IoDisabled,
}

/// The table the SQL stores use unless told otherwise; the Go SDK's name.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) const DEFAULT_TABLE: &str = "babelqueue_idempotency";

/// What each SQL store's `.sql` file appends to the table name to name the
/// `expires_at` index.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) const INDEX_SUFFIX: &str = "_expires_at_idx";

/// The longest table name: PostgreSQL truncates identifiers past 63 bytes,
/// and a truncated index name would make `CREATE INDEX IF NOT EXISTS` skip
/// the index (the truncated name is the table's own) or name it
/// unpredictably. SQLite has no such limit; the rule is the same so a table
/// name moves between the two.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
const MAX_TABLE_LEN: usize = 63 - INDEX_SUFFIX.len();

/// Returns `name` when it matches `[A-Za-z_][A-Za-z0-9_]{0,47}`.
///
/// SQL placeholders bind values, not identifiers, so the stores put the
/// table name into their statements as text. Only a plain identifier is
/// accepted, which needs no quoting and cannot change what a statement means.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn checked_table_name(name: &str) -> Result<&str, InvalidTableName> {
    let mut bytes = name.bytes();
    let starts_well = bytes
        .next()
        .is_some_and(|first| first.is_ascii_alphabetic() || first == b'_');
    let rest_is_plain = bytes.all(|byte| byte.is_ascii_alphanumeric() || byte == b'_');
    if starts_well && rest_is_plain && name.len() <= MAX_TABLE_LEN {
        Ok(name)
    } else {
        Err(InvalidTableName {
            name: name.to_owned(),
        })
    }
}

/// A table name that is not a plain SQL identifier of at most 48 characters.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "table name {name:?} is not a plain identifier of at most {max} characters: \
     it must match [A-Za-z_][A-Za-z0-9_]{{0,{rest}}}, so that its index \
     `<table>{suffix}` fits PostgreSQL's 63-byte identifiers",
    max = MAX_TABLE_LEN,
    rest = MAX_TABLE_LEN - 1,
    suffix = INDEX_SUFFIX,
)]
pub(crate) struct InvalidTableName {
    name: String,
}

/// The checked settings of a SQL store, and the statements it runs.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
#[derive(Debug, Clone)]
pub(crate) struct SqlSettings {
    /// A plain identifier of at most 48 characters.
    pub(crate) table: String,
    /// The TTL in milliseconds; `None`: ids never expire.
    pub(crate) ttl_ms: Option<i64>,
    pub(crate) sql: Statements,
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
impl SqlSettings {
    /// The one check both SQL builders run: the table name, the TTL and the
    /// runtime (the pools time out with Tokio timers), each refused as an
    /// `open` error of `backend`; then the statements of `dialect` for that
    /// table.
    pub(crate) fn check(
        backend: &'static str,
        table: &str,
        ttl: Option<Duration>,
        dialect: fn(&str) -> Statements,
        drivers: Drivers,
    ) -> Result<Self, StoreError> {
        let table = checked_table_name(table).map_err(failed(backend, StoreOperation::Open))?;
        let ttl_ms = optional_ttl_millis(ttl).map_err(failed(backend, StoreOperation::Open))?;
        require_tokio(drivers).map_err(failed(backend, StoreOperation::Open))?;
        Ok(SqlSettings {
            sql: dialect(table),
            table: table.to_owned(),
            ttl_ms,
        })
    }
}

/// What both SQL builders are given: the table, the TTL and the size of
/// the pool the store opens.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
#[derive(Debug, Clone)]
pub(crate) struct SqlBuilder {
    pub(crate) table: String,
    pub(crate) ttl: Option<Duration>,
    pub(crate) max_connections: u32,
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
impl SqlBuilder {
    /// The defaults: the Go SDK's table, no TTL, `max_connections`.
    pub(crate) fn new(max_connections: u32) -> Self {
        SqlBuilder {
            table: DEFAULT_TABLE.to_owned(),
            ttl: None,
            max_connections,
        }
    }

    /// [`SqlSettings::check`] of these settings.
    pub(crate) fn check(
        &self,
        backend: &'static str,
        dialect: fn(&str) -> Statements,
        drivers: Drivers,
    ) -> Result<SqlSettings, StoreError> {
        SqlSettings::check(backend, &self.table, self.ttl, dialect, drivers)
    }
}

/// The setters both SQL builders share, over their `sql: SqlBuilder` field;
/// `$connections` is the builder's default pool size, for the docs.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
macro_rules! sql_builder_setters {
    ($connections:literal) => {
        /// The table to use (default `babelqueue_idempotency`). It must match
        /// `[A-Za-z_][A-Za-z0-9_]{0,47}`, or building the store fails.
        pub fn table(mut self, table: impl Into<String>) -> Self {
            self.sql.table = table.into();
            self
        }

        /// Forget each id this long after it was first remembered: at least
        /// 1 ms and at most [`MAX_TTL`](crate::store::MAX_TTL) (about 100
        /// years), counted in whole milliseconds; checked when the store is
        /// built.
        pub fn ttl(mut self, ttl: Duration) -> Self {
            self.sql.ttl = Some(ttl);
            self
        }

        #[doc = concat!("The most connections the store's own pool opens (default ", $connections, ").")]
        pub fn max_connections(mut self, max: u32) -> Self {
            self.sql.max_connections = max.max(1);
            self
        }
    };
}
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) use sql_builder_setters;

/// The expiry methods of [`Admin`](crate::store::admin::Admin) both SQL
/// stores answer with their settings' statements alone, over their `pool`
/// and `settings` fields and their module's `BACKEND`.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
macro_rules! sql_expiry_admin {
    () => {
        fn count_expired(&self) -> StoreFuture<'_, u64> {
            let count = &self.settings.sql.count_expired;
            StoreFuture::new($crate::store::settings::run_count(
                &self.pool, BACKEND, count,
            ))
        }

        fn purge_expired(&self, limit: u32) -> StoreFuture<'_, u64> {
            let purge = &self.settings.sql.purge_expired;
            StoreFuture::new($crate::store::settings::run_purge(
                &self.pool, BACKEND, purge, limit,
            ))
        }
    };
}
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) use sql_expiry_admin;

/// `claims_table_exists` of both SQL stores, over their `has_table` and
/// their settings' table name.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
macro_rules! sql_claims_table_exists {
    () => {
        /// Whether claim mode's table is there ([`migrate_claims`](Self::migrate_claims) made it).
        pub async fn claims_table_exists(&self) -> Result<bool, StoreError> {
            self.has_table(&format!("{}_claims", self.settings.table))
                .await
        }
    };
}
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) use sql_claims_table_exists;

/// The statements a SQL store runs, written out once for its table.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
#[derive(Debug, Clone)]
pub(crate) struct Statements {
    /// The backend's `.sql` file, for this table.
    pub(crate) create: String,
    /// Whether an id is remembered and not expired: the id is the first
    /// parameter.
    pub(crate) seen: String,
    /// Set-if-absent (an expired row is taken over): the id, then the TTL in
    /// milliseconds or `NULL`.
    pub(crate) remember: String,
    /// Deletes the id given as the first parameter.
    pub(crate) forget: String,
    /// The marks whose key starts with the first parameter: how many, how
    /// many expired, the oldest and newest write times in Unix ms.
    pub(crate) stats: String,
    /// The newest mark whose key starts with the first parameter: its
    /// retention in ms (`expires_at - created_at`, `NULL` without expiry);
    /// no row when there is none.
    pub(crate) retention: String,
    /// Counts the expired rows.
    pub(crate) count_expired: String,
    /// Deletes at most the first parameter's number of expired rows.
    pub(crate) purge_expired: String,
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
impl Statements {
    /// A backend's `.sql` file (written for [`DEFAULT_TABLE`]) for `table`.
    ///
    /// The table name is a checked plain identifier, and the files name
    /// only the table and its index, `<table>_expires_at_idx`, with it.
    pub(crate) fn ddl_for(ddl: &str, table: &str) -> String {
        ddl.replace(DEFAULT_TABLE, table)
    }
}

/// The answer of a statement that writes: how many rows it changed.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) trait RowsAffected {
    fn rows_affected(&self) -> u64;
}

#[cfg(feature = "sqlite")]
impl RowsAffected for sqlx::sqlite::SqliteQueryResult {
    fn rows_affected(&self) -> u64 {
        sqlx::sqlite::SqliteQueryResult::rows_affected(self)
    }
}

#[cfg(feature = "postgres")]
impl RowsAffected for sqlx::postgres::PgQueryResult {
    fn rows_affected(&self) -> u64 {
        sqlx::postgres::PgQueryResult::rows_affected(self)
    }
}

/// Runs a statement that answers one count (`SELECT count(*) ...`), as a
/// maintenance operation of `backend`.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) async fn run_count<'e, DB, E>(
    executor: E,
    backend: &'static str,
    sql: &'e str,
) -> Result<u64, StoreError>
where
    DB: sqlx::Database,
    E: sqlx::Executor<'e, Database = DB>,
    (i64,): for<'r> sqlx::FromRow<'r, DB::Row>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
{
    let count: i64 = sqlx::query_scalar(sql)
        .fetch_one(executor)
        .await
        .map_err(failed(backend, StoreOperation::Maintenance))?;
    Ok(count.max(0) as u64)
}

/// Runs a store's `stats` and `retention` statements for the marks under
/// `key_prefix`.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) async fn run_stats<'e, DB, E>(
    executor: E,
    backend: &'static str,
    statements: &'e Statements,
    key_prefix: &'e str,
) -> Result<crate::store::StoreStats, StoreError>
where
    DB: sqlx::Database,
    E: sqlx::Executor<'e, Database = DB> + Copy,
    for<'q> &'q str: sqlx::Type<DB> + sqlx::Encode<'q, DB>,
    (i64, i64, Option<i64>, Option<i64>): for<'r> sqlx::FromRow<'r, DB::Row>,
    (Option<i64>,): for<'r> sqlx::FromRow<'r, DB::Row>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
{
    let (marks, expired, oldest_ms, newest_ms) =
        sqlx::query_as::<_, (i64, i64, Option<i64>, Option<i64>)>(&statements.stats)
            .bind(key_prefix)
            .fetch_one(executor)
            .await
            .map_err(failed(backend, StoreOperation::Maintenance))?;
    let newest = sqlx::query_as::<_, (Option<i64>,)>(&statements.retention)
        .bind(key_prefix)
        .fetch_optional(executor)
        .await
        .map_err(failed(backend, StoreOperation::Maintenance))?;
    let retention = match newest {
        None => crate::store::Retention::Unknown,
        Some((None,)) => crate::store::Retention::Forever,
        Some((Some(ms),)) => crate::store::Retention::Ttl(Duration::from_millis(ms.max(0) as u64)),
    };
    Ok(crate::store::StoreStats {
        marks: marks.max(0) as u64,
        expired: expired.max(0) as u64,
        oldest_ms,
        newest_ms,
        retention,
    })
}

/// Runs a statement that deletes at most its first parameter's number of
/// rows, as a maintenance operation of `backend`: how many went.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) async fn run_purge<'e, DB, E>(
    executor: E,
    backend: &'static str,
    sql: &'e str,
    limit: u32,
) -> Result<u64, StoreError>
where
    DB: sqlx::Database,
    DB::QueryResult: RowsAffected,
    E: sqlx::Executor<'e, Database = DB>,
    i64: sqlx::Type<DB> + for<'q> sqlx::Encode<'q, DB>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
{
    let done = sqlx::query(sql)
        .bind(i64::from(limit))
        .execute(executor)
        .await
        .map_err(failed(backend, StoreOperation::Maintenance))?;
    Ok(done.rows_affected())
}

/// Runs a store's `remember` statement (`id`, then the TTL in ms or `NULL`)
/// on `executor`: whether it marked the id (inserted it, or took over an
/// expired mark) rather than finding a live mark there.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) async fn run_mark<'e, DB, E>(
    executor: E,
    sql: &'e str,
    id: &'e str,
    ttl_ms: Option<i64>,
) -> Result<bool, sqlx::Error>
where
    DB: sqlx::Database,
    DB::QueryResult: RowsAffected,
    E: sqlx::Executor<'e, Database = DB>,
    for<'q> &'q str: sqlx::Type<DB> + sqlx::Encode<'q, DB>,
    Option<i64>: sqlx::Type<DB> + for<'q> sqlx::Encode<'q, DB>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
{
    let done = sqlx::query(sql)
        .bind(id)
        .bind(ttl_ms)
        .execute(executor)
        .await?;
    Ok(done.rows_affected() == 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_well_formed_url_keeps_all_but_its_password_in_sight() {
        for (url, shown) in [
            (
                "postgres://app:s3cret@db:5432/app",
                "postgres://app:***@db:5432/app",
            ),
            ("redis://:s3cret@h/0", "redis://:***@h/0"),
            ("rediss://:s3cret@h:6380", "rediss://:***@h:6380"),
            ("redis://h/0?x=a@b", "redis://h/0?x=a@b"),
            ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
            (
                "postgres://h/db?sslmode=disable&PassWord=s3cret&user=app",
                "postgres://h/db?sslmode=disable&PassWord=***&user=app",
            ),
            (
                "postgres://h/db?pass%77ord=s3cret",
                "postgres://h/db?pass%77ord=***",
            ),
        ] {
            assert_eq!(redact_url_secrets(url, url), shown);
        }
    }

    #[test]
    fn every_reading_of_a_malformed_url_hides_its_password() {
        for url in [
            "postgres:/u:s3cret@host/db",
            "postgres//u:s3cret@host/db",
            "redis:/:s3cret@host",
            "amqp:/u:s3cret@host",
            "postgres:u:s3cret@host",
            "u:s3cret@host",
            "postgres:///u:s3cret@host",
            "postgres://u:s3cret/@host/db",
            "postgres://u:s3cret?@host/db",
            " postgres://u:s3cret@host/db",
            "postgres://u:s3%63ret@host/db",
        ] {
            let error = format!("{url} failed: s3cret, \"s3cret\", {url:?}");
            let shown = redact_url_secrets(&error, url);
            assert!(!shown.contains("s3cret"), "{url}: {shown}");
        }
        // A password holding a quote is hidden as `Debug` escapes it too.
        let url = "redis://:s3\"cret@h";
        assert!(!redact_url_secrets(&format!("{url:?}"), url).contains("cret"));
    }

    #[test]
    fn user_info_where_no_client_reads_it_is_refused() {
        for url in [
            "postgres://app:s3cret@db:5432/app",
            "postgres://app@db/app",
            "redis://:s3cret@h:6379/0?protocol=resp3",
            "redis://127.0.0.1:6379/0?client=a@b",
            "redis+cluster://u:s3cret@a:7000,b:7000/",
            "postgres://u:s3cret@[::1]:5432/db",
            "postgres://[::1]:5432/db?x=a@b",
            "postgres://h/db?password=s3cret",
            "unix:///run/redis.sock",
        ] {
            assert_eq!(check_url_credentials(url), Ok(()), "{url}");
        }
        for url in [
            "postgres:/u:s3cret@host/db",
            "postgres//u:s3cret@host/db",
            "redis:/:s3cret@host",
            "amqp:/u:s3cret@host",
            "postgres:u:s3cret@host",
            "u:s3cret@host://x",
            "postgres:///u:s3cret@host",
            "postgres:///u:s3cret?@host",
            "postgres://u:s3cret/@host/db",
            "postgres://u:s3cret?@host/db",
            "postgres://u:s3cret#@host/db",
            "postgres://host:5432/u:s3cret@x",
        ] {
            let refused = check_url_credentials(url).expect_err(url);
            assert!(!refused.contains("s3cret"), "{refused}");
        }
    }

    #[test]
    fn ttl_is_counted_in_whole_milliseconds() {
        assert_eq!(ttl_millis(Duration::from_millis(1)), Ok(1));
        assert_eq!(ttl_millis(Duration::from_micros(1_999)), Ok(1));
        assert_eq!(ttl_millis(Duration::from_secs(86_400)), Ok(86_400_000));
        assert_eq!(ttl_millis(MAX_TTL), Ok(3_153_600_000_000));
    }

    #[test]
    fn ttls_outside_the_range_are_refused_with_the_range() {
        for ttl in [
            Duration::ZERO,
            Duration::from_micros(999),
            MAX_TTL + Duration::from_nanos(1),
            Duration::from_millis(i64::MAX as u64),
            Duration::MAX,
        ] {
            let error = ttl_millis(ttl).unwrap_err();
            assert!(
                error
                    .to_string()
                    .contains("at least 1 ms and at most 36500 days"),
                "{error}"
            );
        }
        assert_eq!(optional_ttl_millis(None), Ok(None));
    }

    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    #[test]
    fn plain_identifiers_up_to_48_characters_pass() {
        for name in ["babelqueue_idempotency", "_t", "T9", &"a".repeat(48)] {
            assert_eq!(checked_table_name(name), Ok(name));
        }
    }

    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    #[test]
    fn anything_else_is_refused() {
        for name in [
            "",
            "9table",
            "my-table",
            "t; DROP TABLE users",
            "\"quoted\"",
            "schema.table",
            "tablé",
            &"a".repeat(49),
            &"a".repeat(63),
        ] {
            let err = checked_table_name(name).unwrap_err();
            assert!(
                err.to_string()
                    .contains("not a plain identifier of at most 48 characters"),
                "{name}: {err}"
            );
        }
    }

    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    #[test]
    fn the_longest_table_name_still_names_its_index_in_63_bytes() {
        let table = "a".repeat(MAX_TABLE_LEN);
        assert_eq!(format!("{table}{INDEX_SUFFIX}").len(), 63);
    }

    /// Each backend's `.sql` file, as the store runs it for a table of its
    /// own: the table and the index named by the rule, nothing left of the
    /// default name.
    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    #[test]
    fn each_shipped_ddl_names_the_table_and_its_index_by_the_rule() {
        let dialects: &[fn(&str) -> Statements] = &[
            #[cfg(feature = "sqlite")]
            crate::store::sqlite::sqlite_statements,
            #[cfg(feature = "postgres")]
            crate::store::postgres::postgres_statements,
        ];
        for dialect in dialects {
            let create = dialect("seen_ids").create;
            let index = format!("CREATE INDEX IF NOT EXISTS seen_ids{INDEX_SUFFIX}");
            assert!(
                create.contains("CREATE TABLE IF NOT EXISTS seen_ids ("),
                "{create}"
            );
            assert!(create.contains(&index), "{create}");
            assert!(!create.contains(DEFAULT_TABLE), "{create}");
        }
    }

    #[cfg(feature = "sqlite")]
    #[test]
    fn a_runtime_without_timers_is_told_apart_from_none() {
        assert_eq!(require_tokio(Drivers::Time), Err(RuntimeUnfit::NoRuntime));
        let no_timers = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        no_timers.block_on(async {
            assert_eq!(
                require_tokio(Drivers::Time),
                Err(RuntimeUnfit::TimersDisabled)
            );
        });
        let timers_only = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        timers_only.block_on(async { assert_eq!(require_tokio(Drivers::Time), Ok(())) });
    }

    #[cfg(any(feature = "redis", feature = "postgres"))]
    #[test]
    fn a_runtime_without_io_is_refused_to_a_server_client() {
        let timers_only = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        timers_only.block_on(async {
            assert_eq!(
                require_tokio(Drivers::TimeAndIo),
                Err(RuntimeUnfit::IoDisabled)
            );
        });
        let both = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        both.block_on(async { assert_eq!(require_tokio(Drivers::TimeAndIo), Ok(())) });
    }
}
