//! Seen-set mode over a batch of messages ([`Guard::run_batch`]): one
//! `seen_many`, the handlers, one `remember_many`, and the decision of
//! seen-set table of [`guide::modes`](crate::guide::modes) for every message.

use std::collections::HashMap;
use std::future::{Future, poll_fn};
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::pin::pin;
use std::sync::{Arc, LazyLock};
use std::task::Poll;

use super::context::{body_starts, marking};
use super::inflight::{InFlight, Running};
use super::{Guard, SeenSet, mark_failed, report, store_failed};
use crate::key::DedupeKey;
use crate::message::MessageId;
use crate::store::StoreOperation;
use crate::store::{Store, StoreError};
use crate::telemetry::metrics::{Decision, timed};

/// What [`Guard::run_batch`] did with one message of the batch: the decision, and the
/// result a single [`Guard::run`] would have returned for it.
#[derive(Debug)]
pub struct MessageOutcome<E> {
    decision: Decision,
    result: Result<(), E>,
}

impl<E> MessageOutcome<E> {
    /// What the guard decided: `ran`, `skipped`, `failed`, `fail_open`,
    /// `mark_failed` or `store_failed`.
    pub fn decision(&self) -> Decision {
        self.decision
    }

    /// The message's result: settle the delivery by it.
    pub fn result(&self) -> &Result<(), E> {
        &self.result
    }

    /// The message's result, owned.
    pub fn into_result(self) -> Result<(), E> {
        self.result
    }
}

/// The ids every batch of this process is running.
static BATCHES: LazyLock<Arc<InFlight>> = LazyLock::new(Arc::default);

/// The right to run each distinct id of a batch, taken in sorted order.
async fn take_turns(keys: &[DedupeKey]) -> Vec<Running> {
    let mut ids: Vec<&str> = keys.iter().filter_map(DedupeKey::as_str).collect();
    ids.sort_unstable();
    ids.dedup();
    let mut running = Vec::with_capacity(ids.len());
    for id in ids {
        running.push(BATCHES.turn(id).await);
    }
    running
}

/// What the store said about one message before its handler could run.
enum Asked {
    /// No usable id: fail open.
    NoId,
    /// `seen`'s answer, and the index of the message's id among the batch's
    /// distinct ids.
    Seen(bool, usize),
    /// The store could not tell.
    Failed(StoreError),
}

impl<S: Store> Guard<S, SeenSet> {
    /// Runs `handler` for each message of a batch under this guard's
    /// decision, in two store round trips for the whole batch: one
    /// [`seen_many`](Store::seen_many) before any handler runs and one
    /// [`remember_many`](Store::remember_many) after the last (none when no
    /// message has an id, or no handler succeeded).
    ///
    /// The contract of [`run_once`](crate::guard::run_once) holds for every message, and
    /// the outcomes come back in the messages' order:
    ///
    /// - a failed handler leaves only its own id unmarked;
    /// - an id repeated inside the batch runs once: a later copy is skipped
    ///   once an earlier one succeeded (and runs if the earlier one failed,
    ///   as a redelivery would);
    /// - when `seen_many` fails, each message is asked with
    ///   [`seen`](Store::seen) on its own, so only the messages the store
    ///   cannot answer for fail (`store_failed`, the handler not run); an
    ///   outage costs one round trip per message, a poison id (one the
    ///   backend refuses) fails alone;
    /// - when `remember_many` fails, each id is remembered on its own, and
    ///   the ones that still fail are reported by the guard's
    ///   [`OnRememberFailure`](crate::guard::OnRememberFailure) (`mark_failed`).
    ///
    /// - one id never runs in two batches at once in this process: a batch
    ///   that holds an id another batch is running waits until that batch
    ///   has marked its ids, then asks the store, so it skips what the other
    ///   ran and runs what it failed. Batches take their ids in one order,
    ///   so two batches never wait for each other; a handler must not run a
    ///   batch holding one of its own batch's ids (it would wait for itself).
    ///
    /// Handlers run one after the other, in order. If one panics, the ids of
    /// the handlers that succeeded before it are remembered, then the panic
    /// resumes. A batch future dropped before its `remember_many` leaves
    /// every id of the batch unmarked, as a single guard dropped before its
    /// `remember` does: they run again when redelivered.
    ///
    /// ```
    /// use babel_idem::{Envelope, Guard, InMemoryStore, MessageId};
    /// use babel_idem::telemetry::metrics::Decision;
    /// use serde_json::json;
    ///
    /// #[derive(Debug)]
    /// enum Error { Declined, Store(babel_idem::StoreError) }
    /// impl From<babel_idem::StoreError> for Error {
    ///     fn from(e: babel_idem::StoreError) -> Self { Error::Store(e) }
    /// }
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let guard = Guard::new(InMemoryStore::new());
    /// let order = |id: &str| Envelope::new("urn:babel:orders:created", json!({})).with_id(id);
    /// let batch = [order("id-A"), order("id-B"), order("id-A")];
    ///
    /// let outcomes = guard
    ///     .run_batch(&batch, |env| async move {
    ///         match env.message_id() {
    ///             Some("id-B") => Err(Error::Declined),
    ///             _ => Ok(()),
    ///         }
    ///     })
    ///     .await;
    /// let decisions: Vec<Decision> = outcomes.iter().map(|o| o.decision()).collect();
    /// assert_eq!(decisions, [Decision::Ran, Decision::Failed, Decision::Skipped]);
    /// assert!(outcomes[1].result().is_err());
    /// # });
    /// ```
    pub async fn run_batch<'m, M, H, F, E>(
        &self,
        messages: &'m [M],
        mut handler: H,
    ) -> Vec<MessageOutcome<E>>
    where
        M: MessageId,
        H: FnMut(&'m M) -> F,
        F: Future<Output = Result<(), E>>,
        E: From<StoreError>,
    {
        // Text keys: a batch asks its store with `str`s (`seen_many`).
        let scope = self.scope.as_deref();
        let keys: Vec<DedupeKey> = messages
            .iter()
            .map(|message| DedupeKey::new(scope, message))
            .collect();
        // Held until the batch has marked its ids (dropped last).
        let _running = take_turns(&keys).await;
        let mut asked = self.ask(&keys).await;

        let mut outcomes = Vec::with_capacity(messages.len());
        // Per distinct id (by slot), the message whose handler succeeded.
        let mut ran: HashMap<usize, usize> = HashMap::new();
        for (at, message) in messages.iter().enumerate() {
            let id = keys[at].as_str().unwrap_or("");
            let slot = match std::mem::replace(&mut asked[at], Asked::NoId) {
                Asked::Failed(error) => {
                    outcomes.push(outcome(Decision::StoreFailed, store_failed(id, error)));
                    continue;
                }
                Asked::Seen(seen, slot) if seen || ran.contains_key(&slot) => {
                    report(Decision::Skipped, id);
                    outcomes.push(outcome(Decision::Skipped, Ok(())));
                    continue;
                }
                Asked::Seen(_, slot) => Some(slot),
                Asked::NoId => None,
            };
            if let Some(take_back) = body_starts() {
                take_back.await;
            }
            let result = match catch_panic(handler(message)).await {
                Ok(result) => result,
                Err(panic) => {
                    // Keep what succeeded before the panic, then let it go on.
                    self.mark(&keys, &runners(&ran), &mut outcomes).await;
                    resume_unwind(panic);
                }
            };
            outcomes.push(match (slot, result) {
                (None, result) => {
                    report(Decision::FailOpen, "");
                    outcome(Decision::FailOpen, result)
                }
                (Some(_), Err(error)) => {
                    report(Decision::Failed, id);
                    outcome(Decision::Failed, Err(error))
                }
                (Some(slot), Ok(())) => {
                    ran.insert(slot, at);
                    // Settled by `mark` once the batch is remembered.
                    outcome(Decision::Ran, Ok(()))
                }
            });
        }
        self.mark(&keys, &runners(&ran), &mut outcomes).await;
        outcomes
    }

    /// `seen` for every message: one `seen_many` over the distinct ids, or,
    /// when it fails, one `seen` per message.
    async fn ask(&self, keys: &[DedupeKey]) -> Vec<Asked> {
        let mut slots: HashMap<&str, usize> = HashMap::new();
        let mut distinct: Vec<&str> = Vec::new();
        let slot_of: Vec<Option<usize>> = keys
            .iter()
            .map(|key| {
                let id = key.as_str()?;
                Some(*slots.entry(id).or_insert_with(|| {
                    distinct.push(id);
                    distinct.len() - 1
                }))
            })
            .collect();
        let answers = match distinct.is_empty() {
            true => Ok(Vec::new()),
            false => {
                timed::<S, _>(StoreOperation::SeenMany, || self.store.seen_many(&distinct)).await
            }
        };
        match answers {
            // A store that answers for other ids than it was asked about is
            // asked again, one id at a time.
            Ok(answers) if answers.len() == distinct.len() => slot_of
                .iter()
                .map(|slot| match *slot {
                    Some(slot) => Asked::Seen(answers[slot], slot),
                    None => Asked::NoId,
                })
                .collect(),
            answers => {
                if let Err(error) = answers {
                    tracing::warn!(target: "babel_idem", %error, "seen_many failed; asking one id at a time");
                }
                let mut asked = Vec::with_capacity(keys.len());
                for (key, slot) in keys.iter().zip(slot_of) {
                    asked.push(match (key.as_str(), slot) {
                        (Some(id), Some(slot)) => match self.store.seen(id).await {
                            Ok(seen) => Asked::Seen(seen, slot),
                            Err(error) => Asked::Failed(error),
                        },
                        _ => Asked::NoId,
                    });
                }
                asked
            }
        }
    }

    /// Remembers the ids of the messages at `runners` (whose handlers
    /// succeeded) with one `remember_many`, or, when it fails, one
    /// `remember` each; settles their outcomes: `ran`, or `mark_failed` by
    /// the guard's policy.
    async fn mark<E: From<StoreError>>(
        &self,
        keys: &[DedupeKey],
        runners: &[usize],
        outcomes: &mut [MessageOutcome<E>],
    ) {
        let ids: Vec<&str> = runners
            .iter()
            .map(|&at| keys[at].as_str().unwrap_or(""))
            .collect();
        if ids.is_empty() {
            return;
        }
        marking();
        let marks = match timed::<S, _>(StoreOperation::RememberMany, || {
            self.store.remember_many(&ids)
        })
        .await
        {
            Ok(()) => ids.iter().map(|_| Ok(())).collect(),
            Err(error) => {
                tracing::warn!(target: "babel_idem", %error, "remember_many failed; remembering one id at a time");
                let mut marks = Vec::with_capacity(ids.len());
                for id in &ids {
                    marks.push(self.store.remember(id).await);
                }
                marks
            }
        };
        for ((&at, id), mark) in runners.iter().zip(ids).zip(marks) {
            match mark {
                Ok(()) => report(Decision::Ran, id),
                Err(error) => {
                    let result = mark_failed(id, error, self.on_remember_failure);
                    outcomes[at] = outcome(Decision::MarkFailed, result);
                }
            }
        }
    }
}

fn outcome<E>(decision: Decision, result: Result<(), E>) -> MessageOutcome<E> {
    MessageOutcome { decision, result }
}

/// The messages whose handlers succeeded, in the batch's order.
fn runners(ran: &HashMap<usize, usize>) -> Vec<usize> {
    let mut runners: Vec<usize> = ran.values().copied().collect();
    runners.sort_unstable();
    runners
}

/// Runs `future`, catching a panic in any of its polls.
async fn catch_panic<F: Future>(future: F) -> std::thread::Result<F::Output> {
    let mut future = pin!(future);
    poll_fn(
        |cx| match catch_unwind(AssertUnwindSafe(|| future.as_mut().poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(output)) => Poll::Ready(Ok(output)),
            Err(panic) => Poll::Ready(Err(panic)),
        },
    )
    .await
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use crate::envelope::Envelope;
    use crate::guard::Guard;
    use crate::store::{InMemoryStore, StoreError};
    use crate::telemetry::metrics::Decision;

    /// Per id: runs going on now, the most at once, runs in all.
    type Runs = Arc<Mutex<HashMap<String, (u32, u32, u32)>>>;

    /// Two batches with the same ids in opposite orders, at once on two
    /// threads: no id runs in both at once, none runs twice (the later
    /// batch skips what the earlier ran), and neither waits for the other
    /// for ever.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_batches_sharing_ids_never_run_one_id_at_once() {
        let guard = Arc::new(Guard::new(InMemoryStore::new()));
        let runs: Runs = Arc::default();
        let ids: Vec<String> = (0..20).map(|n| format!("shared-{n}")).collect();
        let batch = |reversed: bool| {
            let mut ids = ids.clone();
            if reversed {
                ids.reverse();
            }
            let messages: Vec<Envelope> = ids
                .iter()
                .map(|id| {
                    Envelope::new("urn:babel:orders:created", serde_json::json!({})).with_id(id)
                })
                .collect();
            let (guard, runs) = (Arc::clone(&guard), Arc::clone(&runs));
            tokio::spawn(async move {
                let outcomes = guard
                    .run_batch(&messages, |env| {
                        let runs = Arc::clone(&runs);
                        let id = env.meta.id.clone().unwrap();
                        async move {
                            {
                                let mut runs = runs.lock().unwrap();
                                let entry = runs.entry(id.clone()).or_default();
                                entry.0 += 1;
                                entry.1 = entry.1.max(entry.0);
                                entry.2 += 1;
                            }
                            tokio::time::sleep(Duration::from_millis(2)).await;
                            runs.lock().unwrap().get_mut(&id).unwrap().0 -= 1;
                            Ok::<(), StoreError>(())
                        }
                    })
                    .await;
                outcomes
                    .iter()
                    .map(|outcome| outcome.decision())
                    .collect::<Vec<_>>()
            })
        };
        let (first, second) = (batch(false), batch(true));
        let both = tokio::time::timeout(Duration::from_secs(30), async {
            (first.await.unwrap(), second.await.unwrap())
        })
        .await
        .expect("neither batch waits for the other for ever");
        let runs = runs.lock().unwrap();
        assert_eq!(runs.len(), 20);
        for (id, &(_, most_at_once, total)) in runs.iter() {
            assert_eq!(most_at_once, 1, "{id} ran in two batches at once");
            assert_eq!(total, 1, "{id} ran {total} times");
        }
        let decisions: Vec<Decision> = both.0.into_iter().chain(both.1).collect();
        let count = |d: Decision| decisions.iter().filter(|&&x| x == d).count();
        assert_eq!((count(Decision::Ran), count(Decision::Skipped)), (20, 20));
    }
}
