//! Claim mode's decision table (see [`guide::modes`](crate::guide::modes)):
//! claim the id, run the handler while renewing the lease, then commit or
//! release. Every claim decision is also recorded in the delivery's context,
//! if any ([`context::record`]), so its dispatcher releases a parked
//! delivery whatever the handler's error type keeps of the parked error.

use std::any::Any;
use std::future::{Future, poll_fn};
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::pin::{Pin, pin};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use super::context::{self, body_starts, marking};
use super::outcome::Guarded;
use super::timer::{self, Sleep};
use super::{OnRememberFailure, fence, mark_failed, report, store_failed};
use crate::key::DedupeKey;
use crate::store::StoreFuture;
use crate::store::{Claim, ClaimToken, StoreOperation};
use crate::store::{ClaimStore, StoreError};
use crate::telemetry::metrics::{self, Decision, Timed, claim_mode, timed};

/// | state of the id | the guard |
/// |---|---|
/// | no usable id | runs the handler unclaimed (`fail_open`) |
/// | done | skips (`skipped`) |
/// | `claim` fails | does not run, returns the store error (`store_failed`) |
/// | held by a live owner | does not run, returns a parked error and records the park for the delivery (`parked`) |
/// | absent or lapsed: won | runs the handler, renewing the lease |
/// | `Ok`, commit succeeds, or finds the id already done | marked done, claim dropped (`ran`) |
/// | `Ok`, claim lost (another owner's now, the id not done) | not marked, returns a lost-claim error (`lost_claim`) |
/// | `Ok`, commit fails with a store error | retried with backoff while the lease is kept alive, for up to the lease (at most [`COMMIT_RETRY_LIMIT`]); then by [`OnRememberFailure`] (`mark_failed`) |
/// | `Err` or panic | releases its own claim, returns the error or resumes the panic (`failed`) |
/// | the future is dropped | nothing can be awaited in `Drop`: the claim lapses with its lease |
pub(super) async fn decide<S, F, E>(
    store: &S,
    key: &DedupeKey,
    lease: Duration,
    on_commit_failure: OnRememberFailure,
    handler: F,
) -> Result<(), E>
where
    S: ClaimStore + ?Sized,
    F: Future<Output = Result<(), E>>,
    E: From<StoreError>,
{
    // Before the claim: a lease is not renewed while the body waits.
    if let Some(take_back) = body_starts() {
        take_back.await;
    }
    let Some(id) = key.as_str() else {
        context::record(Guarded::Ran(()));
        claim_mode(|| report(Decision::FailOpen, ""));
        return handler.await;
    };

    let owner = ClaimToken::random();
    let answer = store_answer!(timed::<S, _>(StoreOperation::Claim, || {
        store.claim(id, owner, lease)
    }));
    // Recorded before the handler runs: a guard nested in it decides later,
    // and its decision is the one that counts for the delivery.
    context::record(match answer {
        Ok(Claim::Held { retry_after }) => Guarded::Parked { retry_after },
        Ok(Claim::Done) => Guarded::Skipped,
        Ok(Claim::Won { .. }) => Guarded::Ran(()),
        Err(_) => Guarded::StoreFailed,
    });
    let fence = match answer {
        Ok(Claim::Won { fence }) => fence,
        Ok(Claim::Done) => {
            claim_mode(|| report(Decision::Skipped, id));
            return Ok(());
        }
        Ok(Claim::Held { retry_after }) => {
            tracing::debug!(
                target: "babel_idem",
                message_id = id,
                decision = Decision::Parked.as_str(),
                ?retry_after,
                "another owner is running this message; parked",
            );
            claim_mode(|| metrics::record(Decision::Parked));
            return Err(E::from(StoreError::parked(retry_after)));
        }
        Err(error) => return claim_mode(|| store_failed(id, error)),
    };
    // Fence 0: the store keeps none (an unfenced layout).
    let fence = (fence != 0).then_some(fence);

    let (outcome, confirmed) = run_renewing(store, id, owner, lease, fence, handler).await;
    let result = match outcome {
        Outcome::Returned(result) => result,
        Outcome::Panicked(payload) => {
            release(store, id, owner).await;
            claim_mode(|| report(Decision::Failed, id));
            resume_unwind(payload);
        }
    };
    if let Err(error) = result {
        release(store, id, owner).await;
        claim_mode(|| report(Decision::Failed, id));
        return Err(error);
    }

    marking();
    match commit(store, id, owner, lease, confirmed).await {
        Ok(true) => {
            claim_mode(|| report(Decision::Ran, id));
            Ok(())
        }
        Ok(false) => {
            tracing::warn!(
                target: "babel_idem",
                message_id = id,
                decision = Decision::LostClaim.as_str(),
                ?fence,
                "handler succeeded after its claim lapsed and was taken over; not marked done, \
                 the redelivery sees the new owner's outcome",
            );
            claim_mode(|| metrics::record(Decision::LostClaim));
            Err(E::from(StoreError::lost_claim()))
        }
        Err(error) => claim_mode(|| mark_failed(id, error, on_commit_failure)),
    }
}

/// The longest a commit that fails with a store error is retried: long
/// enough to outlast a failover (a cluster's node timeout and an election),
/// short enough that a store that stays down hands the delivery to
/// [`OnRememberFailure`] soon. A shorter lease shortens it to the lease.
pub(super) const COMMIT_RETRY_LIMIT: Duration = Duration::from_secs(10);

/// The first wait before a failed commit is sent again; it doubles up to
/// [`COMMIT_BACKOFF_MAX`].
const COMMIT_BACKOFF_FIRST: Duration = Duration::from_millis(50);
const COMMIT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Commits `owner`'s claim on `id`; a store error is retried with backoff
/// for up to the lease (at most [`COMMIT_RETRY_LIMIT`]), renewing the lease
/// between attempts once a third of it has passed since `confirmed` (when
/// the claim or its last renewal was known to hold), so that the id stays
/// claimed while the store recovers and no other owner runs it meanwhile.
///
/// A retry is safe because every store's commit is idempotent for it: an
/// attempt that took effect though its reply was lost (a timeout, a
/// failover, a `WAIT` that failed) leaves the id done, and the next attempt
/// answers `true`. A renewal that finds the claim gone changes nothing: the
/// next attempt tells a commit that took effect from a claim that was lost.
async fn commit<S: ClaimStore + ?Sized>(
    store: &S,
    id: &str,
    owner: ClaimToken,
    lease: Duration,
    mut confirmed: Instant,
) -> Result<bool, StoreError> {
    let give_up_at = Instant::now() + lease.min(COMMIT_RETRY_LIMIT);
    let mut backoff = COMMIT_BACKOFF_FIRST;
    loop {
        let error = match store_answer!(
            timed::<S, _>(StoreOperation::Commit, || store.commit(id, owner))
        ) {
            Ok(done) => return Ok(done),
            Err(error) => error,
        };
        // Without the timer nothing would wake the wait: no retry then.
        if Instant::now() + backoff >= give_up_at || !timer::available() {
            return Err(error);
        }
        tracing::debug!(
            target: "babel_idem",
            message_id = id,
            %error,
            retry_in = ?backoff,
            "commit failed; trying again while the claim is kept",
        );
        let mut wait = Sleep::until(Instant::now() + backoff);
        poll_fn(|cx| wait.poll_elapsed(cx)).await;
        backoff = (backoff * 2).min(COMMIT_BACKOFF_MAX);
        if confirmed.elapsed() >= lease / 3 {
            let asked = Instant::now();
            if let Ok(true) =
                timed::<S, _>(StoreOperation::Renew, || store.renew(id, owner, lease)).await
            {
                confirmed = asked;
            }
        }
    }
}

/// Drops the guard's own claim so a redelivery can run at once. A failure is
/// only reported: the claim then lapses with its lease.
async fn release<S: ClaimStore + ?Sized>(store: &S, id: &str, owner: ClaimToken) {
    match timed::<S, _>(StoreOperation::Release, || store.release(id, owner)).await {
        Ok(true) => {}
        Ok(false) => tracing::debug!(
            target: "babel_idem",
            message_id = id,
            "the claim to release had already lapsed",
        ),
        Err(error) => tracing::warn!(
            target: "babel_idem",
            message_id = id,
            %error,
            "claim could not be released; it lapses with its lease",
        ),
    }
}

enum Outcome<E> {
    Returned(Result<(), E>),
    Panicked(Box<dyn Any + Send>),
}

/// Polls the handler with its fence current and, whenever it is pending,
/// the lease renewal: both in this one future, no task spawned. Its
/// outcome, and when the claim was last known to hold (claimed or renewed).
async fn run_renewing<S, F, E>(
    store: &S,
    id: &str,
    owner: ClaimToken,
    lease: Duration,
    fence: Option<u64>,
    handler: F,
) -> (Outcome<E>, Instant)
where
    S: ClaimStore + ?Sized,
    F: Future<Output = Result<(), E>>,
{
    let mut handler = pin!(handler);
    let since = Instant::now();
    let mut renewal = Renewal {
        store,
        id,
        owner,
        lease,
        confirmed: since,
        state: State::NotStarted { since },
    };
    let outcome = poll_fn(|cx| {
        // A panicking handler is never polled again; its claim is released
        // before the panic resumes.
        let polled = catch_unwind(AssertUnwindSafe(|| {
            fence::scoped(fence, || handler.as_mut().poll(cx))
        }));
        match polled {
            Ok(Poll::Ready(result)) => Poll::Ready(Outcome::Returned(result)),
            Err(payload) => Poll::Ready(Outcome::Panicked(payload)),
            Ok(Poll::Pending) => {
                renewal.drive(cx);
                Poll::Pending
            }
        }
    })
    .await;
    (outcome, renewal.confirmed)
}

/// Renews the lease about every third of it while the handler runs.
///
/// When a renewal finds the claim lost, the handler keeps running (stopping
/// it half way could leave a half-made effect; the fence refuses its stale
/// writes) and its success reports `lost_claim`. A renewal that fails is
/// tried again a period later.
struct Renewal<'a, S: ?Sized> {
    store: &'a S,
    id: &'a str,
    owner: ClaimToken,
    lease: Duration,
    /// When the claim was last known to hold: claimed, or a renewal sent
    /// then answered that it still held.
    confirmed: Instant,
    state: State<'a>,
}

enum State<'a> {
    /// The handler has not been pending yet: no timer registered.
    NotStarted {
        since: Instant,
    },
    Waiting(Sleep),
    /// A renewal sent at the instant it holds.
    Renewing(Timed<StoreFuture<'a, bool>>, Instant),
    Lost,
}

impl<S: ClaimStore + ?Sized> Renewal<'_, S> {
    fn period(&self) -> Duration {
        self.lease / 3
    }

    fn drive(&mut self, cx: &mut Context<'_>) {
        loop {
            match &mut self.state {
                State::NotStarted { since } => {
                    self.state = State::Waiting(Sleep::until(*since + self.period()));
                }
                State::Waiting(sleep) => {
                    if sleep.poll_elapsed(cx).is_pending() {
                        return;
                    }
                    let (store, id, owner, lease) = (self.store, self.id, self.owner, self.lease);
                    self.state = State::Renewing(
                        timed::<S, _>(StoreOperation::Renew, || store.renew(id, owner, lease)),
                        Instant::now(),
                    );
                }
                State::Renewing(renewing, sent) => {
                    let sent = *sent;
                    let Poll::Ready(renewed) = Pin::new(renewing).poll(cx) else {
                        return;
                    };
                    match renewed {
                        Ok(true) => self.confirmed = sent,
                        Ok(false) => {
                            tracing::warn!(
                                target: "babel_idem",
                                message_id = self.id,
                                "claim lost while the handler runs (its lease lapsed; another owner \
                                 may have claimed the message); the handler goes on, its success reports lost_claim",
                            );
                            self.state = State::Lost;
                            return;
                        }
                        Err(error) => tracing::warn!(
                            target: "babel_idem",
                            message_id = self.id,
                            %error,
                            retry_in = ?self.period(),
                            "claim renewal failed; trying again",
                        ),
                    }
                    self.state = State::Waiting(Sleep::until(Instant::now() + self.period()));
                }
                State::Lost => return,
            }
        }
    }
}
