//! [`ClaimStore`]: the capability behind claim mode (see [`guide::modes`](crate::guide::modes)).
//!
//! A claim is a lease on one id, held by one owner ([`ClaimToken`]) and
//! numbered by a fencing token that grows with every claim of that id. The
//! three-method [`Store`] stays the cross-SDK contract; claims live beside the
//! seen-set, so a seen-set reader (a Go consumer) never takes a claim for a
//! done id.

use std::cell::Cell;
use std::fmt;
use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use super::{Store, StoreError, StoreFuture, StoreOperation, batch};

/// The owner of one claim: random, fresh for every claim a guard makes.
///
/// Every operation after [`ClaimStore::claim`] names its owner, so a late
/// `commit` or `release` from an owner whose lease lapsed changes nothing.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ClaimToken(u128);

impl ClaimToken {
    /// A fresh random token, unique among the tokens of every thread.
    ///
    /// ```
    /// use babel_idem::store::ClaimToken;
    /// assert_ne!(ClaimToken::random(), ClaimToken::random());
    /// ```
    pub fn random() -> Self {
        // Seeded once per thread from the OS (a system call per delivery
        // would cost more than an in-memory claim), then stepped: the high
        // half never repeats within a thread, the low half tells threads
        // apart.
        thread_local! {
            static STATE: Cell<(u64, u64)> = Cell::new(split(uuid::Uuid::new_v4().as_u128()));
        }
        let next = STATE.try_with(|state| {
            let (counter, salt) = state.get();
            let counter = counter.wrapping_add(0x9E37_79B9_7F4A_7C15);
            state.set((counter, salt));
            (u128::from(mix(counter)) << 64) | u128::from(mix(counter ^ salt))
        });
        // Only while the thread is being torn down: ask the OS.
        ClaimToken(next.unwrap_or_else(|_| uuid::Uuid::new_v4().as_u128()))
    }

    /// The token as a number (how the in-memory store keeps it).
    pub fn as_u128(self) -> u128 {
        self.0
    }

    /// The token as 32 lowercase hex digits (how servers keep it).
    pub fn to_hex(self) -> String {
        self.hex_digits().into_iter().map(char::from).collect()
    }

    /// [`to_hex`](Self::to_hex)'s digits as bytes, for a command buffer:
    /// no allocation, and none of the formatting machinery, which costs
    /// several times as much on every claim operation.
    pub(crate) fn hex_digits(self) -> [u8; 32] {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut digits = [0; 32];
        for (at, digit) in digits.iter_mut().enumerate() {
            let nibble = (self.0 >> (4 * (31 - at))) & 0xf;
            *digit = DIGITS[nibble as usize];
        }
        digits
    }
}

fn split(seed: u128) -> (u64, u64) {
    ((seed >> 64) as u64, seed as u64)
}

/// SplitMix64's finaliser: a bijection on `u64` that scrambles a counter.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl fmt::Debug for ClaimToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ClaimToken({:032x})", self.0)
    }
}

/// What [`ClaimStore::claim`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Claim {
    /// The id is done (in the seen-set): skip the delivery.
    Done,
    /// The caller holds the id until its lease lapses. `fence` is strictly
    /// greater than the fence of every earlier claim of this id.
    Won {
        /// The claim's fencing token, from 1 up. `0` means the store keeps
        /// no fence (an unfenced layout such as the PHP SDK's): a guard then
        /// offers the handler no fence ([`fence`](crate::guard::fence) is `None`).
        fence: u64,
    },
    /// Another owner holds a live lease.
    Held {
        /// How long the current lease has left, where the store knows it.
        retry_after: Option<Duration>,
    },
}

/// What a [`ClaimStore::claim`] implementation returns: the store's
/// [`Claim`] on the id, once it answers. Named once, so that every store's
/// `claim` signature reads the same short way.
pub(crate) type ClaimFuture<'a> = StoreFuture<'a, Claim>;

/// What a [`ClaimStore::renew`] implementation returns: whether the caller
/// still held the claim, once the store answers.
pub(crate) type RenewFuture<'a> = StoreFuture<'a, bool>;

/// A SQL claim's answer for an id that is not done: won with the `fence`
/// the statement drew, else held, with the ms it read as left on the live
/// lease (no wait to suggest when it read none, or a lease just lapsed).
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn won_or_held(fence: Option<i64>, left_ms: Option<i64>) -> Claim {
    match fence {
        Some(fence) => Claim::Won {
            fence: fence.unsigned_abs(),
        },
        None => Claim::Held {
            retry_after: left_ms
                .and_then(|ms| u64::try_from(ms).ok())
                .map(Duration::from_millis),
        },
    }
}

/// A [`Store`] that can also lease an id to one owner at a time.
///
/// Each operation is atomic on the server (one script or one statement) and
/// takes the owner's token:
///
/// - [`claim`](ClaimStore::claim): done, won with a fence, or held.
/// - [`commit`](ClaimStore::commit): while the claim is still the owner's,
///   write the seen-set's done marker (the Go-compatible layout) and drop the
///   claim; `false` when the claim was lost.
/// - [`release`](ClaimStore::release): drop the owner's claim (never another
///   owner's), so a redelivery can run; the fence counter is kept.
/// - [`renew`](ClaimStore::renew): extend the owner's live lease; `false` when
///   it was lost.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot claim ids: it is not a babel-idem `ClaimStore`",
    label = "this store has no claim capability",
    note = "claim mode (`lease = ...`, `Guard::lease`) needs a store that implements `babel_idem::ClaimStore`: \
            `InMemoryStore`, `SqliteStore`, `RedisStore` or `PostgresStore`"
)]
pub trait ClaimStore: Store {
    /// Claims `id` for `owner` for `lease`, unless it is done or held by a
    /// live owner.
    fn claim<'a>(
        &'a self,
        id: &'a str,
        owner: ClaimToken,
        lease: Duration,
    ) -> StoreFuture<'a, Claim>;

    /// Marks `id` done and drops `owner`'s claim, if `owner` still holds it.
    fn commit<'a>(&'a self, id: &'a str, owner: ClaimToken) -> StoreFuture<'a, bool>;

    /// Drops `owner`'s claim on `id`, if `owner` still holds it.
    fn release<'a>(&'a self, id: &'a str, owner: ClaimToken) -> StoreFuture<'a, bool>;

    /// Extends `owner`'s live claim on `id` to `lease` from now.
    fn renew<'a>(
        &'a self,
        id: &'a str,
        owner: ClaimToken,
        lease: Duration,
    ) -> StoreFuture<'a, bool>;

    /// [`claim`](ClaimStore::claim) for every `(id, owner)` of a batch, all
    /// for `lease`, in order: one answer per entry, each the one a single
    /// call made at that point would give (an id that appears twice is held
    /// by its first owner when its second entry is claimed).
    ///
    /// The default calls [`claim`](ClaimStore::claim) once per entry, in
    /// turn (what the [`InMemoryStore`](crate::store::InMemoryStore) keeps: it
    /// answers at once); the server-backed stores answer a whole batch
    /// together (`RedisStore`: one script per 512
    /// entries; `PostgresStore`: one statement;
    /// [`SqliteStore`](crate::store::SqliteStore): one read, then one write
    /// transaction for the entries that look free).
    /// [`Batched`](crate::store::Batched) sends concurrent claims through
    /// it. On an `Err` some entries may have been claimed and others not
    /// (the SQL stores claim none): each owner's
    /// [`release`](ClaimStore::release) gives its claim back (`Batched`
    /// does so before its callers ask alone).
    ///
    /// ```
    /// use std::time::Duration;
    /// use babel_idem::store::{Claim, ClaimToken};
    /// use babel_idem::{ClaimStore, InMemoryStore};
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let store = InMemoryStore::new();
    /// let (first, second) = (ClaimToken::random(), ClaimToken::random());
    /// let answers = store
    ///     .claim_many(&[("id-A", first), ("id-A", second)], Duration::from_secs(30))
    ///     .await?;
    /// assert!(matches!(answers[0], Claim::Won { .. }));
    /// assert!(matches!(answers[1], Claim::Held { .. }));
    /// # Ok::<(), babel_idem::StoreError>(())
    /// # }).unwrap();
    /// ```
    fn claim_many<'a>(
        &'a self,
        claims: &'a [(&'a str, ClaimToken)],
        lease: Duration,
    ) -> StoreFuture<'a, Vec<Claim>> {
        StoreFuture::new(batch::claim_each(self, claims, lease))
    }

    /// [`commit`](ClaimStore::commit) for every `(id, owner)` of a batch, in
    /// order: `true` where that owner still held its claim and the id is now
    /// done.
    ///
    /// The default calls [`commit`](ClaimStore::commit) once per entry, in
    /// turn; `RedisStore` answers a whole batch with
    /// one script, `PostgresStore` with one
    /// statement, [`SqliteStore`](crate::store::SqliteStore) in one transaction. On
    /// an `Err` some entries may have been committed and others not (the SQL
    /// stores commit none).
    ///
    /// ```
    /// use std::time::Duration;
    /// use babel_idem::store::{Claim, ClaimToken};
    /// use babel_idem::{ClaimStore, InMemoryStore, Store};
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let store = InMemoryStore::new();
    /// let (owner, stranger) = (ClaimToken::random(), ClaimToken::random());
    /// store.claim("id-A", owner, Duration::from_secs(30)).await?;
    /// let answers = store.commit_many(&[("id-A", stranger), ("id-A", owner)]).await?;
    /// assert_eq!(answers, [false, true]);
    /// assert!(store.seen("id-A").await?);
    /// # Ok::<(), babel_idem::StoreError>(())
    /// # }).unwrap();
    /// ```
    fn commit_many<'a>(
        &'a self,
        commits: &'a [(&'a str, ClaimToken)],
    ) -> StoreFuture<'a, Vec<bool>> {
        StoreFuture::new(batch::commit_each(self, commits))
    }
}

/// Implements `ClaimStore` for a wrapper of a store `S` by handing every
/// operation to the store that `$inner` (a `&self` method) returns.
macro_rules! forward_claim_store {
    ([$($bounds:tt)+] $inner:ident:) => {};
    ([$($bounds:tt)+] $inner:ident: $ty:ty $(, $rest:ty)*) => {
        impl<S: $($bounds)+> $crate::store::ClaimStore for $ty {
            #[inline]
            fn claim<'a>(&'a self, id: &'a str, owner: $crate::store::ClaimToken, lease: ::std::time::Duration) -> $crate::store::StoreFuture<'a, $crate::store::Claim> {
                self.$inner().claim(id, owner, lease)
            }
            #[inline]
            fn commit<'a>(&'a self, id: &'a str, owner: $crate::store::ClaimToken) -> $crate::store::StoreFuture<'a, bool> {
                self.$inner().commit(id, owner)
            }
            #[inline]
            fn release<'a>(&'a self, id: &'a str, owner: $crate::store::ClaimToken) -> $crate::store::StoreFuture<'a, bool> {
                self.$inner().release(id, owner)
            }
            #[inline]
            fn renew<'a>(&'a self, id: &'a str, owner: $crate::store::ClaimToken, lease: ::std::time::Duration) -> $crate::store::StoreFuture<'a, bool> {
                self.$inner().renew(id, owner, lease)
            }
            #[inline]
            fn claim_many<'a>(&'a self, claims: &'a [(&'a str, $crate::store::ClaimToken)], lease: ::std::time::Duration) -> $crate::store::StoreFuture<'a, ::std::vec::Vec<$crate::store::Claim>> {
                self.$inner().claim_many(claims, lease)
            }
            #[inline]
            fn commit_many<'a>(&'a self, commits: &'a [(&'a str, $crate::store::ClaimToken)]) -> $crate::store::StoreFuture<'a, ::std::vec::Vec<bool>> {
                self.$inner().commit_many(commits)
            }
        }
        forward_claim_store!([$($bounds)+] $inner: $($rest),*);
    };
}

forward_claim_store!([ClaimStore + ?Sized] deref: &S, Arc<S>, Box<S>);

/// The longest lease a claim can ask for: 2^31 - 1 ms (about 24.8 days),
/// which every backend holds as a 32-bit millisecond count and adds to its
/// clock without overflow. A lease is meant to be seconds long and renewed.
pub const MAX_LEASE: Duration = Duration::from_millis(i32::MAX as u64);

/// The lease in whole milliseconds (the unit every backend expires in), or
/// why no store can hold it: under 1 ms (a claim that lapses as it is made;
/// Redis refuses `PX 0`) or over [`MAX_LEASE`].
pub(crate) fn lease_millis(lease: Duration) -> Result<u32, InvalidLease> {
    match u32::try_from(lease.as_millis()) {
        Ok(millis) if millis >= 1 && u64::from(millis) <= MAX_LEASE.as_millis() as u64 => {
            Ok(millis)
        }
        _ => Err(InvalidLease { lease }),
    }
}

/// [`lease_millis`] for a server store: the lease in milliseconds as its
/// commands take them, or the refusal as `backend`'s `operation` error.
#[cfg(any(feature = "sqlite", feature = "redis", feature = "postgres"))]
pub(crate) fn server_lease_ms(
    backend: &'static str,
    operation: super::StoreOperation,
    lease: Duration,
) -> Result<i64, super::StoreError> {
    lease_millis(lease)
        .map(i64::from)
        .map_err(super::failed(backend, operation))
}

/// A lease no store can hold: under 1 ms or over [`MAX_LEASE`]. Refused when
/// a claim-mode guard is built ([`Guard::lease`](crate::guard::Guard::lease)), and by
/// a store asked to claim with it.
///
/// ```
/// use babel_idem::{Guard, InMemoryStore};
/// use std::time::Duration;
///
/// let refused = Guard::new(InMemoryStore::new()).lease(Duration::ZERO).unwrap_err();
/// assert_eq!(refused.lease(), Duration::ZERO);
/// assert!(refused.to_string().contains("at least 1 ms"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "claim lease {lease:?} is out of range: it must be at least 1 ms and at most {} ms",
    MAX_LEASE.as_millis()
)]
pub struct InvalidLease {
    lease: Duration,
}

impl InvalidLease {
    /// The lease that was refused.
    pub fn lease(&self) -> Duration {
        self.lease
    }
}

/// A handler whose guard could not be built reports the bad lease as its
/// store error: the handler does not run and the delivery is not acked.
impl From<InvalidLease> for StoreError {
    fn from(error: InvalidLease) -> Self {
        StoreError::new(StoreOperation::Claim, GUARD, error)
    }
}

/// The `backend` of a [`StoreError`] the claim-mode guard makes itself.
pub(crate) const GUARD: &str = "guard";

/// Why a claim-mode guard did not run or did not ack a delivery, though no
/// store failed. Carried as the source of a [`StoreError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
enum Refusal {
    /// Another owner holds a live claim on the id.
    #[error(
        "parked: another owner holds a live claim on this message{}",
        .retry_after.map(|after| format!("; retry in {after:?}")).unwrap_or_default()
    )]
    Parked { retry_after: Option<Duration> },
    /// The handler succeeded, but its claim's lease lapsed before the
    /// commit, whether or not another owner has claimed the id since.
    #[error(
        "lost claim: the handler succeeded but its lease lapsed before the commit \
         (another owner may have claimed the message since); not marked done"
    )]
    LostClaim,
}

impl StoreError {
    /// A delivery the guard parked: another owner is running this id.
    pub(crate) fn parked(retry_after: Option<Duration>) -> Self {
        StoreError::new(
            StoreOperation::Claim,
            GUARD,
            Refusal::Parked { retry_after },
        )
    }

    /// A success the guard could not commit: the claim was lost.
    pub(crate) fn lost_claim() -> Self {
        StoreError::new(StoreOperation::Commit, GUARD, Refusal::LostClaim)
    }

    fn refusal(&self) -> Option<Refusal> {
        self.source_ref().downcast_ref::<Refusal>().copied()
    }

    /// Whether a claim-mode guard parked this delivery: another owner holds a
    /// live claim on its id, so the handler did not run. Put the delivery
    /// back without spending an attempt, after
    /// [`retry_after`](StoreError::retry_after).
    ///
    /// [`Router::dispatch`](crate::router::Router::dispatch) does so without
    /// reading this error: the guard also records the park for the delivery
    /// it runs in, so a handler error type that drops the `StoreError`'s
    /// source still gets the delivery released. Ask this where a guard runs
    /// outside a router (a loop of one's own, a tower service).
    ///
    /// ```
    /// use babel_idem::store::ClaimToken;
    /// use babel_idem::{ClaimStore, Envelope, Guard, InMemoryStore, MessageId, StoreError};
    /// use serde_json::json;
    /// use std::time::Duration;
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let store = InMemoryStore::new();
    /// let env = Envelope::new("urn:babel:orders:created", json!({}));
    /// let lease = Duration::from_secs(30);
    /// // Another worker is running this message.
    /// let id = env.message_id().expect("a fresh envelope has an id");
    /// store.claim(id, ClaimToken::random(), lease).await?;
    ///
    /// let guard = Guard::new(&store).lease(lease)?;
    /// let error = guard.run(&env, async { Ok::<(), StoreError>(()) }).await.unwrap_err();
    /// assert!(error.is_parked());
    /// assert!(error.retry_after().unwrap() <= lease);
    /// # Ok::<(), StoreError>(())
    /// # }).unwrap();
    /// ```
    pub fn is_parked(&self) -> bool {
        matches!(self.refusal(), Some(Refusal::Parked { .. }))
    }

    /// For a parked delivery, how long the live claim has left, where the
    /// store knows it; `None` otherwise.
    pub fn retry_after(&self) -> Option<Duration> {
        match self.refusal() {
            Some(Refusal::Parked { retry_after }) => retry_after,
            _ => None,
        }
    }

    /// Whether the handler succeeded but its claim was lost before the
    /// commit (`lost_claim`): the id was not marked done, and a redelivery
    /// sees the new owner's outcome.
    pub fn is_lost_claim(&self) -> bool {
        matches!(self.refusal(), Some(Refusal::LostClaim))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_never_repeat_within_or_across_threads() {
        let mine: Vec<ClaimToken> = (0..10_000).map(|_| ClaimToken::random()).collect();
        let theirs = std::thread::spawn(|| {
            (0..10_000)
                .map(|_| ClaimToken::random())
                .collect::<Vec<_>>()
        })
        .join()
        .unwrap();
        let distinct: std::collections::HashSet<_> = mine.iter().chain(&theirs).collect();
        assert_eq!(distinct.len(), 20_000);
    }

    #[test]
    fn tokens_read_as_32_lowercase_hex_digits() {
        for token in [ClaimToken(0), ClaimToken(u128::MAX), ClaimToken::random()] {
            assert_eq!(token.to_hex(), format!("{:032x}", token.as_u128()));
            assert_eq!(token.hex_digits(), token.to_hex().as_bytes());
        }
    }

    #[test]
    fn leases_count_in_whole_milliseconds_within_range() {
        assert_eq!(lease_millis(Duration::from_millis(1)), Ok(1));
        assert_eq!(lease_millis(Duration::from_micros(2_500)), Ok(2));
        assert_eq!(lease_millis(MAX_LEASE), Ok(i32::MAX as u32));
        for refused in [
            Duration::ZERO,
            Duration::from_micros(999),
            MAX_LEASE + Duration::from_millis(1),
            Duration::MAX,
        ] {
            assert_eq!(lease_millis(refused), Err(InvalidLease { lease: refused }));
        }
    }

    #[test]
    fn refusals_read_as_what_happened() {
        let parked = StoreError::parked(Some(Duration::from_secs(2)));
        assert!(parked.is_parked() && !parked.is_lost_claim());
        assert_eq!(parked.retry_after(), Some(Duration::from_secs(2)));
        assert!(parked.to_string().starts_with("parked: another owner"));
        let lost = StoreError::lost_claim();
        assert!(lost.is_lost_claim() && !lost.is_parked());
        assert_eq!(lost.retry_after(), None);
        let lease: StoreError = InvalidLease {
            lease: Duration::ZERO,
        }
        .into();
        assert!(
            lease
                .to_string()
                .starts_with("claim lease 0ns is out of range")
        );
        assert!(!lease.is_parked());
    }
}
