//! The operator's side of a persistent store: the [`Admin`] trait, what its
//! operations answer ([`StoreStats`], [`Retention`], [`IdState`]).
//!
//! A consumer never needs these: the guard only asks [`Store`] and
//! [`ClaimStore`]. An operator's tool (the `babel-idem` CLI is one) opens a
//! store from a URL and works on it through `Box<dyn Admin>`, whatever the
//! backend. Each backend's impl, beside it in its `admin.rs`, only
//! translates the operations into its server's commands.
//!
//! [`Store`]: crate::store::Store
//! [`ClaimStore`]: crate::store::ClaimStore

use std::fmt;
use std::time::Duration;

use crate::store::StoreFuture;

/// The marks a store holds, as [`Admin::stats`] counts them.
///
/// ```
/// use babel_idem::store::{Retention, StoreStats};
///
/// let stats = StoreStats::default();
/// assert_eq!(stats.live(), 0);
/// assert_eq!(stats.oldest_ms, None);
/// assert_eq!(stats.retention, Retention::Unknown);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoreStats {
    /// The marks stored (rows or keys), live or expired.
    pub marks: u64,
    /// Of those, how many have expired and wait for a purge (always 0 on
    /// Redis, which deletes an expired key by itself).
    pub expired: u64,
    /// When the oldest mark was written, in Unix milliseconds by the
    /// database clock; `None` when there is none, or the store keeps no
    /// write time (Redis).
    pub oldest_ms: Option<i64>,
    /// When the newest mark was written, like [`oldest_ms`](Self::oldest_ms).
    pub newest_ms: Option<i64>,
    /// How long the marks are kept, as the store reads it from the marks
    /// themselves (the writers' TTL, not the one the reading store was
    /// built with): see [`Retention`] for what each backend can know.
    pub retention: Retention,
}

impl StoreStats {
    /// The marks that still count as seen: [`marks`](Self::marks) minus
    /// [`expired`](Self::expired).
    pub fn live(&self) -> u64 {
        self.marks.saturating_sub(self.expired)
    }
}

/// How long a store keeps its marks, as [`Admin::stats`] reads it from
/// the marks under the key prefix asked about.
///
/// Each backend answers what it can know:
///
/// - SQLite and PostgreSQL keep each mark's write time and expiry: the
///   retention of the newest mark (`expires_at - created_at`), which is the
///   TTL its writers use, [`Ttl`](Retention::Ttl), or
///   [`Forever`](Retention::Forever) when it has no `expires_at`.
/// - Redis keeps no write time, only the time a key has left (`PTTL`): of
///   up to 100 keys read, [`Forever`](Retention::Forever) when one has no
///   expiry, else [`AtLeast`](Retention::AtLeast) the most time one has
///   left (in whole seconds).
/// - With no mark to read, [`Unknown`](Retention::Unknown).
///
/// It prints as the CLI writes durations (`7d`, `1h30m`), `forever`,
/// `at least 59m59s` or `unknown`:
///
/// ```
/// use std::time::Duration;
/// use babel_idem::store::Retention;
///
/// assert_eq!(Retention::Ttl(Duration::from_secs(7 * 86_400)).to_string(), "7d");
/// assert_eq!(Retention::Ttl(Duration::from_secs(5_400)).to_string(), "1h30m");
/// assert_eq!(Retention::Forever.to_string(), "forever");
/// assert_eq!(Retention::AtLeast(Duration::from_secs(3_599)).to_string(), "at least 59m59s");
/// assert_eq!(Retention::Unknown.to_string(), "unknown");
/// assert_eq!(Retention::Ttl(Duration::from_secs(60)).ttl(), Some(Duration::from_secs(60)));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Retention {
    /// Nothing to read it from: the store holds no mark under the prefix.
    #[default]
    Unknown,
    /// Marks are written without a TTL: kept until forgotten.
    Forever,
    /// Each mark is kept this long after it was written.
    Ttl(Duration),
    /// Marks are kept at least this long: a mark read had this much time
    /// left, and how long it had already been kept is not known.
    AtLeast(Duration),
}

impl Retention {
    /// The TTL, when the store knows it exactly ([`Ttl`](Retention::Ttl)).
    pub fn ttl(&self) -> Option<Duration> {
        match self {
            Retention::Ttl(ttl) => Some(*ttl),
            _ => None,
        }
    }
}

impl fmt::Display for Retention {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Retention::Unknown => f.write_str("unknown"),
            Retention::Forever => f.write_str("forever"),
            Retention::Ttl(ttl) => write_duration(f, *ttl),
            Retention::AtLeast(left) => {
                f.write_str("at least ")?;
                write_duration(f, *left)
            }
        }
    }
}

/// `duration` in whole milliseconds, as days, hours, minutes, seconds and
/// milliseconds, each unit written only when not 0 (`1h30m`; `0ms` for 0).
fn write_duration(f: &mut fmt::Formatter<'_>, duration: Duration) -> fmt::Result {
    let mut left = duration.as_millis();
    if left == 0 {
        return f.write_str("0ms");
    }
    for (unit, millis) in [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
        ("ms", 1),
    ] {
        if left >= millis {
            write!(f, "{}{unit}", left / millis)?;
            left %= millis;
        }
    }
    Ok(())
}

/// Where one id stands in a store, as [`Admin::states`] reads it.
///
/// ```
/// use babel_idem::store::IdState;
///
/// assert_eq!(IdState::Claimed.as_str(), "claimed");
/// assert!(IdState::Done.is_done());
/// assert!(!IdState::Claimed.is_done(), "a running handler has not finished");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum IdState {
    /// Processed: a live mark is stored, so a delivery of it is skipped.
    Done,
    /// Held by a live claim (claim mode; the PHP SDK's `'1'`): a handler
    /// is running it, or its lease has not lapsed yet. Not done.
    Claimed,
    /// Neither: a delivery of it runs.
    Absent,
}

impl IdState {
    /// `"done"`, `"claimed"` or `"absent"`.
    pub fn as_str(&self) -> &'static str {
        match self {
            IdState::Done => "done",
            IdState::Claimed => "claimed",
            IdState::Absent => "absent",
        }
    }

    /// Whether the id is [`Done`](IdState::Done).
    pub fn is_done(&self) -> bool {
        *self == IdState::Done
    }
}

/// What an operator does to a persistent store: count its marks, look ids
/// up, forget them (manual replay), and purge what no delivery needs any
/// more. [`SqliteStore`], `RedisStore` and `PostgresStore` implement it.
///
/// [`InMemoryStore`](crate::store::InMemoryStore) does not: its marks live
/// inside one process, out of an operator's reach, and the process itself
/// has [`Store::forget`](crate::store::Store::forget),
/// [`InMemoryStore::len`](crate::store::InMemoryStore::len) and
/// [`InMemoryStore::clear`](crate::store::InMemoryStore::clear).
///
/// Object safe, like [`Store`](crate::store::Store): every operation
/// returns a [`StoreFuture`], so a tool picks the backend once, from
/// configuration, and works through `Box<dyn Admin>`.
///
/// The names do not clash with [`Store`](crate::store::Store)'s
/// (`seen_many`, `remember_many`): an admin operation reads and writes
/// what consumers left, and answers for claims too.
///
/// ```
/// use babel_idem::Store;
/// use babel_idem::store::{Admin, IdState, SqliteStore};
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let store = SqliteStore::in_memory().await?;
/// store.remember("id-A").await?;
/// let admin: Box<dyn Admin> = Box::new(store);
///
/// assert_eq!(admin.stats("").await?.marks, 1);
/// assert_eq!(admin.states(&["id-A", "id-B"]).await?, [IdState::Done, IdState::Absent]);
/// assert_eq!(admin.forget_ids(&["id-A", "id-B"]).await?, 1);
/// assert_eq!(admin.count_expired().await?, 0);
/// while admin.purge_expired(10_000).await? > 0 {}
/// # Ok::<(), babel_idem::StoreError>(())
/// # }).unwrap();
/// ```
///
/// [`SqliteStore`]: crate::store::SqliteStore
pub trait Admin: Send + Sync {
    /// Counts the marks whose key starts with `key_prefix` (`""`: all of
    /// them; a [`Guard::scope`](crate::guard::Guard::scope)'s keys start
    /// with `<length>:<scope>:`), how many have expired, when the
    /// oldest and newest were written, and their [`Retention`].
    fn stats<'a>(&'a self, key_prefix: &'a str) -> StoreFuture<'a, StoreStats>;

    /// Where each id stands, in the ids' order: [`IdState::Done`] for a
    /// live mark, [`IdState::Claimed`] for a live claim and no mark (a
    /// claimed id whose handler still runs is never done), else
    /// [`IdState::Absent`].
    fn states<'a>(&'a self, ids: &'a [&'a str]) -> StoreFuture<'a, Vec<IdState>>;

    /// Forgets the marks of `ids`, so their next delivery runs again, and
    /// returns how many marks were removed (live or expired). Unknown ids
    /// are not an error; a live claim is left to its holder.
    fn forget_ids<'a>(&'a self, ids: &'a [&'a str]) -> StoreFuture<'a, u64>;

    /// How many marks have expired and wait for a purge: what
    /// [`purge_expired`](Admin::purge_expired) would delete now. Expired
    /// marks are already not seen; purging only reclaims their space.
    fn count_expired(&self) -> StoreFuture<'_, u64>;

    /// Deletes at most `limit` expired marks and returns how many went: a
    /// purge in short transactions (call it until it returns less than
    /// `limit`), so consumers wait for one batch, never the whole purge.
    fn purge_expired(&self, limit: u32) -> StoreFuture<'_, u64>;

    /// How many finished claims (lapsed leases, and what a commit leaves
    /// behind) wait for a purge: what
    /// [`purge_finished_claims`](Admin::purge_finished_claims) would delete
    /// now. 0 where claim mode was never set up, or the store lets its
    /// server expire claims.
    fn count_finished_claims(&self) -> StoreFuture<'_, u64>;

    /// Deletes at most `limit` finished claims and returns how many went.
    /// Claim mode works without it; it only reclaims space.
    fn purge_finished_claims(&self, limit: u32) -> StoreFuture<'_, u64>;
}

macro_rules! forward_admin {
    ($($ty:ty),+ $(,)?) => {$(
        impl<A: Admin + ?Sized> Admin for $ty {
            fn stats<'a>(&'a self, key_prefix: &'a str) -> StoreFuture<'a, StoreStats> {
                (**self).stats(key_prefix)
            }
            fn states<'a>(&'a self, ids: &'a [&'a str]) -> StoreFuture<'a, Vec<IdState>> {
                (**self).states(ids)
            }
            fn forget_ids<'a>(&'a self, ids: &'a [&'a str]) -> StoreFuture<'a, u64> {
                (**self).forget_ids(ids)
            }
            fn count_expired(&self) -> StoreFuture<'_, u64> {
                (**self).count_expired()
            }
            fn purge_expired(&self, limit: u32) -> StoreFuture<'_, u64> {
                (**self).purge_expired(limit)
            }
            fn count_finished_claims(&self) -> StoreFuture<'_, u64> {
                (**self).count_finished_claims()
            }
            fn purge_finished_claims(&self, limit: u32) -> StoreFuture<'_, u64> {
                (**self).purge_finished_claims(limit)
            }
        }
    )+};
}

forward_admin!(&A, std::sync::Arc<A>, Box<A>);
