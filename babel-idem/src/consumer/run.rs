//! The consumer loop: reserve while there is room, dispatch each delivery on
//! its own task, settle it, and stop gracefully.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;

use crate::router::Delivery;
use crate::transport::{Reserved, Settlement, Transport};

use super::settle::{self, Counters, Outcome};
use super::{Consumer, ConsumerReport, MAX_BATCH, replay};

/// The first and the longest pause after a broker error.
const BROKER_BACKOFF: (Duration, Duration) = (Duration::from_millis(50), Duration::from_secs(2));

impl<T: Transport> Consumer<T> {
    /// Consumes until `shutdown` completes, then stops gracefully: no new
    /// reservations; in-flight deliveries get the shutdown timeout to finish
    /// and settle; those still running are dropped (their handlers' guards
    /// leave their ids unmarked) and left unsettled for the broker's recovery.
    /// Returns the totals.
    ///
    /// Broker errors never end the loop: it logs them and tries again with
    /// backoff, so a broker restart only pauses it.
    pub async fn run_until<F: Future<Output = ()>>(&self, shutdown: F) -> ConsumerReport {
        let permits = Arc::new(Semaphore::new(self.concurrency));
        let mut tasks = JoinSet::new();
        let mut idle = Backoff::new(self.idle_poll);
        let mut broker = Backoff::new(BROKER_BACKOFF);
        tokio::pin!(shutdown);

        loop {
            while let Some(joined) = tasks.try_join_next() {
                report_task_end(joined);
            }
            // Wait for room for one delivery, then take whatever else is free.
            let first = tokio::select! {
                biased;
                () = &mut shutdown => break,
                permit = Arc::clone(&permits).acquire_owned() => {
                    permit.expect("the consumer never closes its semaphore")
                }
            };
            tokio::task::yield_now().await;
            let mut room = vec![first];
            while room.len() < MAX_BATCH {
                match Arc::clone(&permits).try_acquire_owned() {
                    Ok(permit) => room.push(permit),
                    Err(_) => break,
                }
            }

            // Not raced against `shutdown`: a reservation dropped half-way
            // would sit in the broker until its recovery.
            self.counters.reserve_calls.fetch_add(1, Ordering::Relaxed);
            let batch = match self.transport.reserve(&self.queue, room.len()).await {
                Ok(batch) => {
                    broker.reset();
                    batch
                }
                Err(error) => {
                    self.counters.broker_errors.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(queue = &*self.queue, %error, "babel-idem: reserving failed; trying again");
                    drop(room);
                    if pause(broker.next(), &mut shutdown).await {
                        break;
                    }
                    continue;
                }
            };
            if batch.is_empty() {
                drop(room);
                if pause(idle.next(), &mut shutdown).await {
                    break;
                }
                continue;
            }
            idle.reset();

            let count = batch.len() as u64;
            self.counters.delivered.fetch_add(count, Ordering::Relaxed);
            self.counters.in_flight.fetch_add(count, Ordering::Relaxed);
            for (reserved, permit) in batch.into_iter().zip(room) {
                tasks.spawn(self.handle(reserved, permit));
            }
        }

        self.drain(tasks).await;
        self.progress().report()
    }

    /// Consumes until the process is stopped (a future that never completes).
    pub async fn run(&self) -> ConsumerReport {
        self.run_until(std::future::pending()).await
    }

    /// Waits for the in-flight deliveries up to the shutdown timeout, then
    /// drops the rest unsettled.
    async fn drain(&self, mut tasks: JoinSet<()>) {
        let finished = tokio::time::timeout(self.shutdown_timeout, async {
            while let Some(joined) = tasks.join_next().await {
                report_task_end(joined);
            }
        })
        .await;
        if finished.is_err() {
            let unfinished = tasks.len() as u64;
            tracing::warn!(
                queue = &*self.queue,
                unfinished,
                "babel-idem: shutdown timeout reached; unfinished deliveries are left for the broker's recovery"
            );
            self.counters
                .unfinished
                .fetch_add(unfinished, Ordering::Relaxed);
            self.counters
                .in_flight
                .fetch_sub(unfinished, Ordering::Relaxed);
            tasks.abort_all();
            while tasks.join_next().await.is_some() {}
        }
    }

    /// The task of one delivery: dispatch, then settle. Holds its permit
    /// until the settlement is done.
    fn handle(
        &self,
        reserved: Reserved<T::Handle>,
        permit: OwnedSemaphorePermit,
    ) -> impl Future<Output = ()> + Send + 'static {
        let router = Arc::clone(&self.router);
        let transport = Arc::clone(&self.transport);
        let counters = Arc::clone(&self.counters);
        let queue = Arc::clone(&self.queue);
        let dead_letter_queue = Arc::clone(&self.dead_letter_queue);
        let max_body_bytes = self.max_body_bytes;
        async move {
            let Reserved {
                body,
                headers,
                handle,
            } = reserved;
            let (outcome, settlement) = match max_body_bytes {
                Some(limit) if body.len() > limit => (
                    Outcome::DeadLettered,
                    settle::oversized(&body, limit, &queue, &dead_letter_queue),
                ),
                _ => {
                    let replay =
                        replay::marks_replay(headers.iter().map(|(n, v)| (n.as_str(), v.as_str())));
                    let delivery = headers.into_iter().fold(
                        Delivery::new().with_queue(&*queue),
                        |delivery, (name, value)| delivery.with_header(name, value),
                    );
                    // Boxed: the dispatch's state is most of the task's,
                    // and a smaller task is cheaper to spawn and to move.
                    let dispatch =
                        Box::pin(replay::scope(replay, router.dispatch(&body, delivery)));
                    let disposition = dispatch.await;
                    // A retry waits its backoff, a parked claim its delay,
                    // before going back, so neither spins on the queue.
                    let wait = match &disposition {
                        crate::router::Disposition::Retry(retry) => retry.backoff,
                        crate::router::Disposition::Release { delay, .. } => *delay,
                        _ => None,
                    };
                    let settlement =
                        settle::settlement_for(disposition, &body, &queue, &dead_letter_queue);
                    if let Some(wait) = wait {
                        // Boxed, as the sleep below: a timer is large, and
                        // only the deliveries that wait pay for one.
                        Box::pin(tokio::time::sleep(wait)).await;
                    }
                    settlement
                }
            };
            drop(body);
            settle_until_done(
                &*transport,
                &handle,
                &settlement,
                &counters,
                &queue,
                outcome,
            )
            .await;
            counters.in_flight.fetch_sub(1, Ordering::Relaxed);
            drop(permit);
        }
    }
}

/// Settles, retrying a failing broker with backoff: the dispatch is done, so
/// giving up would only leave the delivery to be handled again. Stops when
/// the consumer's shutdown aborts the task.
async fn settle_until_done<T: Transport>(
    transport: &T,
    handle: &T::Handle,
    settlement: &Settlement,
    counters: &Counters,
    queue: &str,
    outcome: Outcome,
) {
    let mut backoff = Backoff::new(BROKER_BACKOFF);
    loop {
        match transport.settle(handle, settlement).await {
            Ok(true) => return counters.count(outcome),
            Ok(false) => {
                counters.lapsed.fetch_add(1, Ordering::Relaxed);
                return;
            }
            Err(error) => {
                counters.broker_errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(queue, settlement = settlement.kind(), %error, "babel-idem: settling failed; trying again");
                Box::pin(tokio::time::sleep(backoff.next())).await;
            }
        }
    }
}

/// Sleeps `delay` unless `shutdown` completes first; `true` when it did.
async fn pause<F: Future<Output = ()>>(
    delay: Duration,
    shutdown: &mut std::pin::Pin<&mut F>,
) -> bool {
    tokio::select! {
        biased;
        () = shutdown.as_mut() => true,
        () = tokio::time::sleep(delay) => false,
    }
}

fn report_task_end(joined: Result<(), tokio::task::JoinError>) {
    // Dispatch catches handler panics; this would be a bug in the consumer
    // itself. The delivery stays reserved for recovery.
    if let Err(error) = joined
        && error.is_panic()
    {
        tracing::error!(%error, "babel-idem: a delivery task panicked; its delivery is left for recovery");
    }
}

/// A doubling pause between `first` and `max`.
struct Backoff {
    first: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    fn new((first, max): (Duration, Duration)) -> Self {
        Backoff {
            first,
            max,
            next: first,
        }
    }

    fn next(&mut self) -> Duration {
        let now = self.next;
        self.next = (self.next * 2).min(self.max);
        now
    }

    fn reset(&mut self) {
        self.next = self.first;
    }
}
