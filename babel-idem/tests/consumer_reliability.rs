//! `Consumer` + `RedisTransport` under faults: a store that goes down, a
//! handler that never returns, reservations held longer than they last, a
//! message nobody handles, two copies of one id, a broker that fails.
//!
//! Environment: `BABEL_IDEM_REDIS_URL` (the shared server, for queues);
//! without it a test prints `skipped:`, and with
//! `BABEL_IDEM_REQUIRE_SERVERS=1` it fails instead. A test that stops a
//! server starts its own (`redis-server` on a free port, `appendonly yes`).
#![cfg(all(feature = "redis-transport", feature = "redis", feature = "sqlite"))]

mod consumer_support;
mod store_contract;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use babel_idem::consumer::{DEFAULT_DELIVERY_TIMEOUT, Failing};
use babel_idem::router::{Backoff, UnknownUrnStrategy};
use babel_idem::store::{NotReplicated, RedisStore, ShortOfReplicas};
use babel_idem::telemetry::metrics::{self, Decision};
use babel_idem::transport::RedisTransport;
use babel_idem::{ClaimStore, Consumer, Envelope, Guard, Router, Store, StoreError, run_once, urn};
use redis::AsyncCommands;
use serde_json::{Value, json};
use store_contract::servers::{REDIS_URL, server_url};
use store_contract::spawned::OwnRedis;

use consumer_support::redis_queue::{Queue, publish_numbered};
use consumer_support::{
    PATIENCE, QUIET, assert_each_id_runs_once_in_one_process, envelope_with_id, eventually,
    run_until_idle, twice_in_a_row,
};

/// The `dead_letter` blocks of the records in `queue`'s DLQ.
async fn dead_letters(queue: &Queue) -> Vec<Value> {
    let records: Vec<Vec<u8>> = queue.raw().await.lrange(queue.dlq(), 0, -1).await.unwrap();
    records
        .iter()
        .map(|record| serde_json::from_slice::<Value>(record).unwrap()["dead_letter"].clone())
        .collect()
}

/// Effects per id, counted by the handlers of one test.
type Effects = Arc<Mutex<HashMap<String, u32>>>;

fn count_effect(effects: &Effects, env: &Envelope) {
    *effects
        .lock()
        .unwrap()
        .entry(env.meta.id.clone().unwrap_or_default())
        .or_default() += 1;
}

// ---------------------------------------------------------------- store outage

/// The seen-set's own Redis is killed for 10 s under load, then restarted:
/// the deliveries whose guard could not ask it go back unchanged, the
/// consumer pauses instead of spending their attempts, and it resumes by
/// itself. Nothing reaches the DLQ; each message's effect happens once,
/// except for ids whose `remember` failed (the default policy acks them
/// and reports `mark_failed`), which are counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_outage_pauses_the_consumer_and_dead_letters_nothing() {
    const TEST: &str = "a_store_outage_pauses_the_consumer";
    const MESSAGES: u64 = 600;
    let Some(url) = server_url(REDIS_URL, TEST) else {
        return;
    };
    let Some(mut seen_set) = OwnRedis::reserve(TEST) else {
        return;
    };
    seen_set.start();
    let store = RedisStore::builder()
        .timeout(Duration::from_millis(500))
        .connect_lazy(&seen_set.url())
        .unwrap();
    let queue = Queue::new(&url);
    let transport = queue.transport().await;
    publish_numbered(&transport, &queue.name, "outage", MESSAGES).await;

    let effects: Effects = Arc::default();
    let counted = Arc::clone(&effects);
    let router = Router::builder()
        .route(urn!("urn:babel:interop:created"), move |env: Envelope| {
            let (store, counted) = (store.clone(), Arc::clone(&counted));
            async move {
                run_once(store, &env, async {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    count_effect(&counted, &env);
                    Ok::<(), StoreError>(())
                })
                .await
            }
        })
        .build()
        .unwrap();
    let consumer = Consumer::builder(router, transport, &queue.name)
        .concurrency(16)
        .build()
        .unwrap();
    let progress = consumer.progress();
    let before = metrics::counts();

    let done = Arc::clone(&effects);
    let run = tokio::time::timeout(
        PATIENCE,
        consumer.run_until(async move {
            eventually("every message had its effect", || async {
                done.lock().unwrap().len() as u64 == MESSAGES
            })
            .await;
            eventually("nothing in flight", || async {
                progress.report().in_flight == 0
            })
            .await;
        }),
    );
    let paused = consumer.progress();
    let outage = async {
        eventually("a sixth of the queue is done", || async {
            effects.lock().unwrap().len() as u64 >= MESSAGES / 6
        })
        .await;
        seen_set.kill();
        let reported = tokio::time::Instant::now();
        eventually("the consumer reports the store failing", || async {
            paused.report().failing == Some(Failing::Store)
        })
        .await;
        let during = effects.lock().unwrap().len();
        tokio::time::sleep(Duration::from_secs(10).saturating_sub(reported.elapsed())).await;
        let after = effects.lock().unwrap().len();
        seen_set.start();
        (during, after)
    };
    let (report, (during, after)) = tokio::join!(run, outage);
    let report = report.expect("the consumer resumes after the store restarts");
    let mark_failed = metrics::counts().since(&before).get(Decision::MarkFailed);

    assert_eq!(after, during, "nothing ran while the store was down");
    assert_eq!(report.dead_lettered, 0, "{report:?}");
    assert!(dead_letters(&queue).await.is_empty());
    assert_eq!(report.retried, 0, "no attempt was spent: {report:?}");
    assert!(report.store_outages >= 1, "{report:?}");
    assert!(report.store_unavailable >= 1, "{report:?}");
    assert_eq!(report.failing, None, "the store answers again: {report:?}");
    let effects = effects.lock().unwrap().clone();
    assert_eq!(effects.len() as u64, MESSAGES);
    let twice = effects.values().filter(|&&n| n > 1).count() as u64;
    println!(
        "store outage: {} deliveries handed back, {} outages, {mark_failed} remember failures, {twice} ids run twice",
        report.store_unavailable, report.store_outages
    );
    assert!(
        twice <= mark_failed,
        "{twice} ids ran twice, only {mark_failed} remember failures were reported"
    );
    eventually("the queue is drained", || queue.drained()).await;
}

/// Two kinds of orders, each behind a guard of its own: one on a store
/// that answers, one in claim mode on a Redis whose writes must reach a
/// replica it does not have (`wait_for_replicas(1)`), a part of the store
/// that is down as a shard left without a replica is. The store fails such
/// writes at once once it knows the master is short of replicas (nothing
/// written); the consumer holds those deliveries back and sends them back
/// unattempted: none runs, none is dead-lettered, none is lost, and the
/// other orders never wait for them (no pause of every reservation), each
/// run once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_whose_part_of_the_store_is_down_are_held_back_while_the_others_run_once() {
    const TEST: &str = "ids_whose_part_of_the_store_is_down_are_held_back";
    const PAUSED_URN: &str = "urn:babel:interop:paused";
    let Some(url) = server_url(REDIS_URL, TEST) else {
        return;
    };
    let Some(mut unreplicated) = OwnRedis::reserve(TEST) else {
        return;
    };
    unreplicated.start();
    let short = RedisStore::builder()
        .wait_for_replicas(1, Duration::from_millis(200))
        .connect(&unreplicated.url())
        .await
        .unwrap();

    // The first write waits out WAIT and fails; the master has it. The
    // next fails at once, sent nowhere.
    let error = short.remember("first").await.unwrap_err();
    let source = std::error::Error::source(&error);
    assert!(
        source.is_some_and(|s| s.downcast_ref::<NotReplicated>().is_some()),
        "{error}"
    );
    let error = short.remember("second").await.unwrap_err();
    let refused = std::error::Error::source(&error)
        .and_then(|s| s.downcast_ref::<ShortOfReplicas>())
        .unwrap_or_else(|| panic!("ShortOfReplicas, got {error}"));
    assert_eq!(refused.wanted, 1);
    assert!(short.seen("first").await.unwrap());
    assert!(!short.seen("second").await.unwrap(), "nothing was sent");

    let queue = Queue::new(&url);
    let transport = queue.transport().await;
    let seen_set = RedisStore::builder()
        .prefix(queue.key("seen:"))
        .connect(&url)
        .await
        .unwrap();
    let claims = Arc::new(
        Guard::new(Arc::new(short) as Arc<dyn ClaimStore>)
            .lease(Duration::from_secs(5))
            .unwrap(),
    );
    let effects: Effects = Arc::default();
    let paused_runs = Arc::new(AtomicU64::new(0));
    let router = {
        let (counted, paused_runs) = (Arc::clone(&effects), Arc::clone(&paused_runs));
        Router::builder()
            .route(urn!("urn:babel:interop:created"), move |env: Envelope| {
                let (store, counted) = (seen_set.clone(), Arc::clone(&counted));
                async move {
                    run_once(store, &env, async {
                        count_effect(&counted, &env);
                        Ok::<(), StoreError>(())
                    })
                    .await
                }
            })
            .route(urn!("urn:babel:interop:paused"), move |env: Envelope| {
                let (claims, paused_runs) = (Arc::clone(&claims), Arc::clone(&paused_runs));
                async move {
                    claims
                        .run(&env, async {
                            paused_runs.fetch_add(1, Ordering::SeqCst);
                            Ok::<(), StoreError>(())
                        })
                        .await
                }
            })
            .build()
            .unwrap()
    };
    let paused = |n: u64| {
        Envelope::new(PAUSED_URN, json!({ "n": n }))
            .with_id(format!("paused-{n}"))
            .with_queue(&queue.name)
            .to_vec()
    };
    publish_numbered(&transport, &queue.name, "first", 64).await;
    let consumer = Consumer::builder(router, transport.clone(), &queue.name)
        .concurrency(16)
        .build()
        .unwrap();
    let progress = consumer.progress();
    let (report, outages_while_others_ran) = {
        let stop = tokio::sync::Notify::new();
        let watch = async {
            // The other orders flow before the first paused one comes.
            eventually("a half of the first orders ran", || async {
                effects.lock().unwrap().len() >= 32
            })
            .await;
            for n in 0..100 {
                let body = envelope_with_id(&format!("then-{n}"), &queue.name, n).to_vec();
                transport.publish(&queue.name, &body).await.unwrap();
                transport.publish(&queue.name, &paused(n)).await.unwrap();
            }
            eventually("every other order ran", || async {
                effects.lock().unwrap().len() == 164
            })
            .await;
            let outages = progress.report().store_outages;
            stop.notify_one();
            outages
        };
        tokio::time::timeout(PATIENCE, async {
            tokio::join!(consumer.run_until(stop.notified()), watch)
        })
        .await
        .expect("every other order runs")
    };

    let effects = effects.lock().unwrap().clone();
    assert_eq!(effects.len(), 164);
    assert!(effects.values().all(|&n| n == 1), "{effects:?}");
    assert_eq!(
        outages_while_others_ran, 0,
        "the paused orders paused every reservation: {report:?}"
    );
    assert_eq!(paused_runs.load(Ordering::SeqCst), 0, "{report:?}");
    assert!(report.store_unavailable >= 100, "{report:?}");
    assert_eq!(report.dead_lettered, 0, "{report:?}");
    assert_eq!(report.retried, 0, "{report:?}");
    assert!(dead_letters(&queue).await.is_empty());
    // Every paused order is still there, ready or reserved.
    let mut raw = queue.raw().await;
    let mut held: Vec<Vec<u8>> = raw.lrange(&queue.name, 0, -1).await.unwrap();
    held.extend(
        raw.lrange::<_, Vec<Vec<u8>>>(queue.processing(), 0, -1)
            .await
            .unwrap(),
    );
    let held: std::collections::HashSet<String> = held
        .iter()
        .filter_map(|body| Envelope::from_slice(body).ok()?.meta.id)
        .collect();
    let lost: Vec<u64> = (0..100)
        .filter(|n| !held.contains(&format!("paused-{n}")))
        .collect();
    assert!(lost.is_empty(), "paused orders lost: {lost:?}");
}

// ---------------------------------------------------------------- hung handler

/// A handler that never returns is dropped at the per-delivery timeout and
/// retried as a failed attempt; one id runs in one slot at a time, so the
/// messages behind it move, and after its attempts it is dead-lettered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_never_returns_is_timed_out_and_the_messages_behind_it_move() {
    const TEST: &str = "a_handler_that_never_returns";
    let Some(url) = server_url(REDIS_URL, TEST) else {
        return;
    };
    let queue = Queue::new(&url);
    let transport = queue.transport().await;
    let hung = envelope_with_id("hung", &queue.name, 0).to_vec();
    transport.publish(&queue.name, &hung).await.unwrap();
    publish_numbered(&transport, &queue.name, "behind", 40).await;

    let effects: Effects = Arc::default();
    let started = Arc::new(AtomicU64::new(0));
    let (counted, hung_runs) = (Arc::clone(&effects), Arc::clone(&started));
    let router = Router::builder()
        .max_attempts(2)
        .route(urn!("urn:babel:interop:created"), move |env: Envelope| {
            let (counted, hung_runs) = (Arc::clone(&counted), Arc::clone(&hung_runs));
            async move {
                if env.meta.id.as_deref() == Some("hung") {
                    hung_runs.fetch_add(1, Ordering::SeqCst);
                    std::future::pending::<()>().await;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
                count_effect(&counted, &env);
                Ok::<(), StoreError>(())
            }
        })
        .build()
        .unwrap();
    let consumer = Consumer::builder(router, transport, &queue.name)
        .concurrency(4)
        .delivery_timeout(Duration::from_millis(700))
        .build()
        .unwrap();
    assert_eq!(
        consumer.delivery_timeout(),
        Some(Duration::from_millis(700))
    );
    let report = run_until_idle(&consumer, QUIET).await;

    let effects = effects.lock().unwrap().clone();
    assert_eq!(effects.len(), 40, "every message behind it ran");
    assert!(effects.values().all(|&n| n == 1));
    assert_eq!(started.load(Ordering::SeqCst), 2, "one run per attempt");
    assert_eq!(report.timed_out, 2, "{report:?}");
    assert_eq!(report.retried, 1, "{report:?}");
    assert_eq!(report.dead_lettered, 1, "{report:?}");
    let blocks = dead_letters(&queue).await;
    assert_eq!(blocks.len(), 1);
    assert_eq!(blocks[0]["attempts"], 2);
    assert_eq!(blocks[0]["exception"], "timeout");
    assert!(queue.drained().await);
}

/// Where reservations are kept alive (Redis), the default per-delivery
/// timeout is a fixed one, whatever `retry_after` says; where they never
/// lapse, there is none.
#[tokio::test]
async fn the_default_delivery_timeout_does_not_follow_retry_after_where_reservations_are_kept_alive()
 {
    const TEST: &str = "the_default_delivery_timeout";
    let Some(url) = server_url(REDIS_URL, TEST) else {
        return;
    };
    let router = || Router::builder().build().unwrap();
    for seconds in [2, 30, 3600] {
        let transport = RedisTransport::builder()
            .retry_after(Duration::from_secs(seconds))
            .connect(&url)
            .await
            .unwrap();
        let consumer = Consumer::builder(router(), transport.clone(), "orders")
            .build()
            .unwrap();
        assert_eq!(
            consumer.delivery_timeout(),
            Some(DEFAULT_DELIVERY_TIMEOUT),
            "retry_after {seconds} s"
        );
        let none = Consumer::builder(router(), transport, "orders")
            .no_delivery_timeout()
            .build()
            .unwrap();
        assert_eq!(none.delivery_timeout(), None);
    }
    assert_eq!(DEFAULT_DELIVERY_TIMEOUT, Duration::from_secs(15 * 60));
    let never_lapsing = RedisTransport::builder()
        .no_recovery()
        .connect(&url)
        .await
        .unwrap();
    let consumer = Consumer::builder(router(), never_lapsing, "orders")
        .build()
        .unwrap();
    assert_eq!(consumer.delivery_timeout(), None);
}

// ---------------------------------------------------------------- kept alive

/// A handler that takes longer than a reservation lasts (3 s against a
/// `retry_after` of 2 s) under the default per-delivery timeout: the
/// consumer keeps the reservation alive while it runs, and the default
/// timeout does not follow `retry_after`, so the handler completes once;
/// nothing is timed out, taken back by a sweep or dead-lettered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_longer_than_retry_after_completes_once_under_the_default_timeout() {
    const TEST: &str = "a_handler_longer_than_retry_after_completes_once";
    let Some(url) = server_url(REDIS_URL, TEST) else {
        return;
    };
    let queue = Queue::new(&url);
    let transport = RedisTransport::builder()
        .retry_after(Duration::from_secs(2))
        .connect(&url)
        .await
        .unwrap();
    let body = envelope_with_id("slow-success", &queue.name, 0).to_vec();
    transport.publish(&queue.name, &body).await.unwrap();
    let effects: Effects = Arc::default();
    let started = Arc::new(AtomicU64::new(0));
    let (counted, runs) = (Arc::clone(&effects), Arc::clone(&started));
    let router = Router::builder()
        .route(urn!("urn:babel:interop:created"), move |env: Envelope| {
            let (counted, runs) = (Arc::clone(&counted), Arc::clone(&runs));
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_secs(3)).await;
                count_effect(&counted, &env);
                Ok::<(), StoreError>(())
            }
        })
        .build()
        .unwrap();
    let consumer = Consumer::builder(router, transport, &queue.name)
        .concurrency(2)
        .build()
        .unwrap();
    let report = run_until_idle(&consumer, QUIET).await;

    assert_eq!(started.load(Ordering::SeqCst), 1, "one run: {report:?}");
    assert_eq!(effects.lock().unwrap().get("slow-success"), Some(&1));
    assert_eq!(report.timed_out, 0, "{report:?}");
    assert_eq!(report.retried, 0, "{report:?}");
    assert_eq!(report.dead_lettered, 0, "{report:?}");
    assert_eq!(report.lapsed, 0, "taken back by a sweep: {report:?}");
    assert_eq!(report.acked, 1, "{report:?}");
    assert!(dead_letters(&queue).await.is_empty());
    assert!(queue.drained().await);
}

/// `retry_after` 3 s, a handler that fails after 2.5 s, a 2.9 s backoff:
/// together longer than a reservation, so the consumer keeps it alive
/// (the deadline moves on the server's clock) through the handler and the
/// backoff. Every attempt is counted and the message reaches the DLQ after
/// its last; nothing lapses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_outlived_by_handler_and_backoff_is_kept_alive_and_attempts_count() {
    const TEST: &str = "a_reservation_outlived_by_handler_and_backoff";
    let Some(url) = server_url(REDIS_URL, TEST) else {
        return;
    };
    let queue = Queue::new(&url);
    let transport = RedisTransport::builder()
        .retry_after(Duration::from_secs(3))
        .connect(&url)
        .await
        .unwrap();
    let body = envelope_with_id("slow-failure", &queue.name, 0).to_vec();
    transport.publish(&queue.name, &body).await.unwrap();
    let runs = Arc::new(AtomicU64::new(0));
    let counted = Arc::clone(&runs);
    let router = Router::builder()
        .max_attempts(3)
        .backoff(Backoff::fixed(Duration::from_millis(2900)))
        .route(urn!("urn:babel:interop:created"), move |_: Envelope| {
            let counted = Arc::clone(&counted);
            async move {
                counted.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(2500)).await;
                Err::<(), _>(std::io::Error::other("payment gateway timeout"))
            }
        })
        .build()
        .unwrap();
    let consumer = Consumer::builder(router, transport, &queue.name)
        .concurrency(2)
        .build()
        .unwrap();
    let report = tokio::time::timeout(
        PATIENCE,
        consumer.run_until(async {
            eventually("the message is dead-lettered", || async {
                queue.len(&queue.dlq()).await == 1
            })
            .await;
        }),
    )
    .await
    .expect("the message reaches the DLQ");

    let blocks = dead_letters(&queue).await;
    assert_eq!(blocks.len(), 1);
    assert_eq!(blocks[0]["attempts"], 3, "{blocks:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 3, "one run per attempt");
    assert_eq!(report.retried, 2, "{report:?}");
    assert_eq!(report.dead_lettered, 1, "{report:?}");
    assert_eq!(report.lapsed, 0, "{report:?}");
    assert!(queue.drained().await);
}

// ---------------------------------------------------------------- release delay

/// A message no handler knows, under `UnknownUrnStrategy::Release`, waits
/// the release delay before it goes back: over 3 s it is reserved a few
/// times, not thousands. The wait holds no handler slot: at concurrency 1
/// the messages behind it are handled meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_unknown_urn_waits_its_delay_without_a_handler_slot() {
    const TEST: &str = "a_released_unknown_urn_waits";
    let Some(url) = server_url(REDIS_URL, TEST) else {
        return;
    };
    let queue = Queue::new(&url);
    let transport = queue.transport().await;
    let unknown = Envelope::new("urn:babel:nobody:handles", json!({}))
        .with_id("unknown-1")
        .to_vec();
    transport.publish(&queue.name, &unknown).await.unwrap();
    publish_numbered(&transport, &queue.name, "known", 5).await;
    let effects: Effects = Arc::default();
    let counted = Arc::clone(&effects);
    let router = Router::builder()
        .on_unknown_urn(UnknownUrnStrategy::Release)
        .route(urn!("urn:babel:interop:created"), move |env: Envelope| {
            let counted = Arc::clone(&counted);
            async move {
                count_effect(&counted, &env);
                Ok::<(), StoreError>(())
            }
        })
        .build()
        .unwrap();
    let consumer = Consumer::builder(router, transport, &queue.name)
        .concurrency(1)
        .build()
        .unwrap();
    let report = consumer
        .run_until(tokio::time::sleep(Duration::from_secs(3)))
        .await;

    assert_eq!(effects.lock().unwrap().len(), 5, "the known ones ran");
    let unknown_reserved = report.delivered - 5;
    assert!(
        (2..=4).contains(&unknown_reserved),
        "reserved {unknown_reserved} times in 3 s: {report:?}"
    );
    assert_eq!(report.dead_lettered, 0);
}

// ---------------------------------------------------------------- one run per id

/// The worker example's scenario at concurrency 64: 1,000 ids, 100 of them
/// published twice in a row. In seen-set mode the second copy waits for its
/// original and is then skipped: 1,000 ran, 100 skipped, none twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_copies_of_one_id_never_run_at_once_in_one_consumer() {
    const TEST: &str = "two_copies_of_one_id_never_run_at_once";
    let Some(url) = server_url(REDIS_URL, TEST) else {
        return;
    };
    let queue = Queue::new(&url);
    let transport = queue.transport().await;
    for body in twice_in_a_row(&queue.name, "twice", 1000, 100) {
        transport.publish(&queue.name, &body).await.unwrap();
    }
    assert_each_id_runs_once_in_one_process(transport, &queue.name, 1000, 100).await;
    assert!(queue.drained().await);
}

// ---------------------------------------------------------------- failing broker

/// A consumer whose reservations fail is not idle: `idle_for` never fires,
/// `failing_for` does, and the report says the broker was failing, with
/// the messages still queued on the broker's restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_broker_is_never_reported_as_a_drained_queue() {
    const TEST: &str = "a_failing_broker_is_never_reported_as_drained";
    let Some(mut broker) = OwnRedis::reserve(TEST) else {
        return;
    };
    broker.start();
    let queue = Queue::new(&broker.url());
    let transport = RedisTransport::builder()
        .timeout(Duration::from_millis(300))
        .reconnect_attempts(0)
        .connect(&broker.url())
        .await
        .unwrap();
    publish_numbered(&transport, &queue.name, "queued", 50).await;
    broker.kill();

    let counts = consumer_support::RunCounts::default();
    let router = consumer_support::counting_router(
        RedisStore::connect_lazy(&broker.url()).unwrap(),
        counts,
        Duration::ZERO,
    );
    let consumer = Consumer::builder(router, transport, &queue.name)
        .build()
        .unwrap();
    let (idle, failing) = (consumer.progress(), consumer.progress());
    let idle_fired = Arc::new(AtomicU64::new(0));
    let fired = Arc::clone(&idle_fired);
    let report = tokio::time::timeout(
        PATIENCE,
        consumer.run_until(async move {
            tokio::select! {
                () = idle.idle_for(Duration::from_millis(500)) => {
                    fired.fetch_add(1, Ordering::SeqCst);
                }
                () = failing.failing_for(Duration::from_secs(3)) => {}
            }
        }),
    )
    .await
    .expect("failing_for ends the run");

    assert_eq!(idle_fired.load(Ordering::SeqCst), 0, "not idle: {report:?}");
    assert_eq!(report.failing, Some(Failing::Broker), "{report:?}");
    assert_eq!(report.delivered, 0);
    assert!(report.broker_errors > 0);
    let why = consumer
        .progress()
        .reserve_error()
        .expect("the error is kept");
    assert!(why.contains("broker"), "{why}");
    broker.start();
    assert_eq!(queue.len(&queue.name).await, 50, "still queued");
}
