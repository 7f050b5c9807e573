//! Publishes on RabbitMQ that no queue took: a queue deleted while the relay,
//! a consumer or a redrive runs is declared again and gets its messages,
//! never a confirm for a message routed nowhere; a full queue with
//! `x-overflow: reject-publish` holds the relay's rows back without
//! spending their attempts.
//!
//! Environment: `BABEL_IDEM_AMQP_URL` (the shared broker); without it the
//! tests print `skipped:`, and with `BABEL_IDEM_REQUIRE_SERVERS=1` fail.
//! Every queue has a unique name and is deleted when its test ends.
#![cfg(all(
    feature = "outbox",
    feature = "amqp-transport",
    feature = "redis",
    feature = "sqlite",
    feature = "postgres"
))]

mod consumer_support;
mod outbox_support;
mod store_contract;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

#[cfg(feature = "redrive")]
use babel_idem::broker::Publisher;
use babel_idem::envelope::{DeadLetter, DeadLetterReason};
use babel_idem::outbox::{Relay, RelayError};
#[cfg(feature = "redrive")]
use babel_idem::redrive::{Redrive, RedriveOptions};
use babel_idem::transport::{AmqpTransport, PublishError, TransportError};
use babel_idem::{Consumer, Envelope};
use consumer_support::{
    PATIENCE, QUIET, SeenLog, URN, eventually, recording_router, run_until_idle,
};
use lapin::options::QueueDeclareOptions;
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Connection, ConnectionProperties};
use outbox_support::db::{Db, Kind};
use outbox_support::{AMQP_URL, Broker, Landed};
use serde_json::json;
use store_contract::servers::{server_url, unique_suffix};
use tokio::sync::oneshot;

fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}

/// Queues of one test, each with a unique name, deleted on drop.
struct Queues {
    url: String,
    prefix: String,
    names: std::sync::Mutex<Vec<String>>,
}

impl Queues {
    fn new(url: &str) -> Self {
        Queues {
            url: url.to_owned(),
            prefix: format!("bi-ret-{}", unique_suffix()),
            names: Default::default(),
        }
    }

    /// A queue name of this test's own, deleted when the test ends.
    fn name(&self, what: &str) -> String {
        let name = format!("{}-{what}", self.prefix);
        self.names.lock().unwrap().push(name.clone());
        name
    }

    fn broker(&self) -> Broker {
        Broker::Amqp(self.url.clone())
    }

    /// Deletes `queue` as an operator would, with a client of its own.
    async fn delete(&self, queue: &str) {
        self.broker().delete(&[queue.to_owned()]).await;
        assert!(!self.exists(queue).await, "{queue} was deleted");
    }

    async fn exists(&self, queue: &str) -> bool {
        let connection = Connection::connect(&self.url, ConnectionProperties::default())
            .await
            .unwrap();
        let channel = connection.create_channel().await.unwrap();
        let passive = QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        };
        let exists = channel
            .queue_declare(queue.into(), passive, FieldTable::default())
            .await
            .is_ok();
        let _ = connection.close(200, "looked".into()).await;
        exists
    }

    /// Declares `queue` durable with `arguments`, as another tool would.
    async fn declare(&self, queue: &str, arguments: &[(&str, AMQPValue)]) {
        let connection = Connection::connect(&self.url, ConnectionProperties::default())
            .await
            .unwrap();
        let channel = connection.create_channel().await.unwrap();
        let mut table = FieldTable::default();
        for (key, value) in arguments {
            table.insert((*key).into(), value.clone());
        }
        channel
            .queue_declare(queue.into(), QueueDeclareOptions::durable(), table)
            .await
            .unwrap();
        let _ = connection.close(200, "declared".into()).await;
    }
}

impl Drop for Queues {
    fn drop(&mut self) {
        let (url, names) = (self.url.clone(), self.names.lock().unwrap().clone());
        // Drop cannot await: a thread of its own, with a runtime of its own.
        let _ = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(Broker::Amqp(url).delete(&names));
        })
        .join();
    }
}

fn envelopes(queue: &str, from: u64, count: u64) -> Vec<Envelope> {
    (from..from + count)
        .map(|n| Envelope::new("urn:babel:outbox:test", json!({"n": n})).with_queue(queue))
        .collect()
}

fn ids<'e>(envelopes: impl IntoIterator<Item = &'e Envelope>) -> HashSet<String> {
    envelopes
        .into_iter()
        .map(|env| env.meta.id.clone().unwrap())
        .collect()
}

/// Every message of `queue`, taken off it: their ids.
async fn landed(broker: &Broker, queue: &str) -> Vec<String> {
    broker.drain(queue).await.iter().map(Landed::id).collect()
}

async fn all_published(db: &Db) -> bool {
    db.rows().await.iter().all(|row| row.status == "published")
}

/// No row spent an attempt or failed.
async fn assert_no_attempt_spent(db: &Db) {
    let rows = db.rows().await;
    assert!(
        rows.iter()
            .all(|row| row.attempts == 0 && row.status != "failed" && row.last_error.is_none()),
        "a row spent an attempt: {rows:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_deleted_while_the_relay_runs_is_declared_again_and_receives_every_row() {
    const TEST: &str = "amqp_returns_relay_queue_deleted";
    let Some(url) = server_url(AMQP_URL, TEST) else {
        return;
    };
    let db = Db::open(Kind::Sqlite, TEST).await.unwrap();
    db.migrate().await;
    let queues = Queues::new(&url);
    let (gone, kept) = (queues.name("gone"), queues.name("kept"));
    let broker = queues.broker();
    let transport = AmqpTransport::connect(&url).await.unwrap();
    let relay = Relay::builder(db.source().await, transport)
        .backoff(ms(5), ms(50))
        .poll_interval(ms(100))
        .build()
        .await
        .unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let running = tokio::spawn(async move { relay.run(stopped).await });

    // The relay's connection declares both queues.
    let first: Vec<Envelope> = envelopes(&gone, 0, 10)
        .into_iter()
        .chain(envelopes(&kept, 0, 10))
        .collect();
    db.save_all(&first).await;
    broker.wait_for(&gone, 10).await;
    broker.wait_for(&kept, 10).await;
    queues.delete(&gone).await;

    // One batch across both queues: the deleted queue's rows come back.
    let second_gone = envelopes(&gone, 10, 10);
    let second_kept = envelopes(&kept, 10, 10);
    let second: Vec<Envelope> = second_gone
        .iter()
        .zip(&second_kept)
        .flat_map(|(a, b)| [a.clone(), b.clone()])
        .collect();
    db.save_all(&second).await;
    eventually("every row of the mixed batch is published", || {
        all_published(&db)
    })
    .await;
    let got: Vec<String> = landed(&broker, &gone).await;
    assert_eq!(
        got.iter().cloned().collect::<HashSet<_>>(),
        ids(&second_gone),
        "the deleted queue was declared again and holds every row published to it since"
    );
    assert_eq!(got.len(), 10, "each once: {got:?}");

    // Deleted again: a batch for that queue alone.
    queues.delete(&gone).await;
    let third = envelopes(&gone, 100, 20);
    db.save_all(&third).await;
    eventually("every row for the deleted queue alone is published", || {
        all_published(&db)
    })
    .await;
    let got = landed(&broker, &gone).await;
    assert_eq!(
        got.iter().cloned().collect::<HashSet<_>>(),
        ids(&third),
        "declared again a second time"
    );

    stop.send(()).unwrap();
    let report = running.await.unwrap().unwrap();
    assert_eq!(report.refused, 0, "{report:?}");
    // The mixed batch's returns wait; the batch for the deleted queue
    // alone is paced as an outage.
    assert_eq!(report.waiting, 10, "{report:?}");
    assert!(report.outages >= 1, "{report:?}");
    assert_no_attempt_spent(&db).await;
    let kept_ids = ids(first
        .iter()
        .filter(|env| env.destination() == kept)
        .chain(&second_kept));
    assert_eq!(
        landed(&broker, &kept)
            .await
            .into_iter()
            .collect::<HashSet<_>>(),
        kept_ids
    );
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_reject_publish_queue_holds_rows_back_without_an_attempt_until_it_drains() {
    const TEST: &str = "amqp_returns_reject_publish";
    let Some(url) = server_url(AMQP_URL, TEST) else {
        return;
    };
    let db = Db::open(Kind::Sqlite, TEST).await.unwrap();
    db.migrate().await;
    let queues = Queues::new(&url);
    let full = queues.name("full");
    queues
        .declare(
            &full,
            &[
                ("x-max-length", AMQPValue::LongInt(5)),
                ("x-overflow", AMQPValue::LongString("reject-publish".into())),
            ],
        )
        .await;
    let saved = envelopes(&full, 0, 30);
    db.save_all(&saved).await;
    let transport = AmqpTransport::connect(&url).await.unwrap();
    let relay = Relay::builder(db.source().await, transport)
        .max_attempts(2)
        .backoff(ms(1), ms(1))
        .build()
        .await
        .unwrap();

    // Passes against the full queue: more than enough to fail every row
    // if a nack counted as a refusal.
    let mut passes = Vec::new();
    for _ in 0..5 {
        passes.push(relay.run_once().await);
        tokio::time::sleep(ms(20)).await;
    }
    let broker = queues.broker();
    assert_eq!(broker.len(&full).await, 5, "the queue is full");
    assert_no_attempt_spent(&db).await;
    let rows = db.rows().await;
    assert_eq!(
        rows.iter().filter(|row| row.status == "pending").count(),
        25,
        "{rows:?}"
    );
    // The first pass filled the queue and held the rest back; the next
    // ones took nothing, which the relay reports as back-pressure.
    let first = passes[0].as_ref().unwrap();
    assert_eq!(
        (first.published, first.waiting, first.refused),
        (5, 25, 0),
        "{passes:?}"
    );
    assert!(
        passes[1..].iter().all(|pass| matches!(
            pass,
            Err(RelayError::Broker(TransportError::Backpressure(_)))
        )),
        "{passes:?}"
    );

    // A consumer drains the queue; the relay goes on as room appears.
    let mut got = Vec::new();
    let give_up = tokio::time::Instant::now() + PATIENCE;
    while !all_published(&db).await {
        assert!(tokio::time::Instant::now() < give_up, "never drained");
        got.extend(landed(&broker, &full).await);
        let _ = relay.run_once().await;
    }
    got.extend(landed(&broker, &full).await);
    assert_eq!(got.len(), 30, "each row once: {got:?}");
    assert_eq!(got.into_iter().collect::<HashSet<_>>(), ids(&saved));
    assert_no_attempt_spent(&db).await;
    db.cleanup().await;
}

/// A poison body: the recording router dead-letters it at once.
fn consumer(transport: &AmqpTransport, queue: &str, log: &SeenLog) -> Consumer<AmqpTransport> {
    Consumer::builder(
        recording_router(Arc::clone(log), false),
        transport.clone(),
        queue,
    )
    .concurrency(4)
    .shutdown_timeout(ms(500))
    .build()
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dlq_deleted_while_the_consumer_runs_is_declared_again_and_the_poison_reaches_it() {
    const TEST: &str = "amqp_returns_dlq_deleted";
    let Some(url) = server_url(AMQP_URL, TEST) else {
        return;
    };
    let queues = Queues::new(&url);
    let work = queues.name("work");
    let dlq = format!("{work}.dlq");
    queues.names.lock().unwrap().push(dlq.clone());
    let broker = queues.broker();
    let transport = AmqpTransport::builder()
        .reserve_wait(ms(50))
        .connect(&url)
        .await
        .unwrap();
    let log = SeenLog::default();

    // The consumer's connection declares the DLQ with the first poison.
    transport.publish(&work, b"first poison").await.unwrap();
    let report = run_until_idle(&consumer(&transport, &work, &log), QUIET).await;
    assert_eq!(report.dead_lettered, 1, "{report:?}");
    broker.wait_for(&dlq, 1).await;
    queues.delete(&dlq).await;

    transport.publish(&work, b"second poison").await.unwrap();
    let report = run_until_idle(&consumer(&transport, &work, &log), QUIET).await;
    let dead = broker.drain(&dlq).await;
    assert_eq!(
        dead.len(),
        1,
        "the DLQ was declared again and holds the record: {report:?}"
    );
    assert!(String::from_utf8_lossy(&dead[0].body).contains("second poison"));
    // The returned copy failed the settlement once; the retry declared
    // the DLQ again.
    assert_eq!(report.dead_lettered, 1, "{report:?}");
    assert!(report.broker_errors >= 1, "{report:?}");
    assert_eq!(broker.len(&work).await, 0, "{report:?}");
    transport.close().await;
}

#[cfg(feature = "redrive")]
fn record(id: &str, queue: &str) -> Vec<u8> {
    let mut envelope = Envelope::new(URN, json!({"id": id}))
        .with_id(id)
        .with_queue(queue)
        .with_attempts(3);
    envelope.dead_letter = Some(DeadLetter::new(DeadLetterReason::Failed, queue, 3));
    envelope.to_vec()
}

#[cfg(feature = "redrive")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redrive_to_a_queue_deleted_since_leaves_the_dead_letter_in_the_dlq() {
    const TEST: &str = "amqp_returns_redrive_target_deleted";
    let Some(url) = server_url(AMQP_URL, TEST) else {
        return;
    };
    let queues = Queues::new(&url);
    let target = queues.name("orders");
    let dlq = queues.name("orders.dlq");
    let broker = queues.broker();
    let transport = AmqpTransport::connect(&url).await.unwrap();

    // The redrive's connection declares the target with the first record.
    transport
        .publish(&dlq, &record("r-1", &target))
        .await
        .unwrap();
    let report = transport
        .redrive(&dlq, &RedriveOptions::new())
        .await
        .unwrap();
    assert_eq!(report.moved, 1, "{report:?}");
    queues.delete(&target).await;

    transport
        .publish(&dlq, &record("r-2", &target))
        .await
        .unwrap();
    let stopped = transport.redrive(&dlq, &RedriveOptions::new()).await;
    let held: Vec<Option<String>> = transport
        .dead_letters(&dlq, None)
        .await
        .unwrap()
        .into_iter()
        .map(|record| record.id)
        .collect();
    assert_eq!(
        held,
        [Some("r-2".to_owned())],
        "the dead letter stays in the DLQ: {stopped:?}"
    );
    assert!(stopped.is_err(), "{stopped:?}");

    // The next run declares the target again and moves it.
    let report = transport
        .redrive(&dlq, &RedriveOptions::new())
        .await
        .unwrap();
    assert_eq!(report.moved, 1, "{report:?}");
    let moved = broker.drain(&target).await;
    assert_eq!(moved.len(), 1);
    assert_eq!(moved[0].id(), "r-2");
    transport.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_to_a_queue_deleted_since_is_an_error_and_the_next_declares_it_again() {
    const TEST: &str = "amqp_returns_publish_queue_deleted";
    let Some(url) = server_url(AMQP_URL, TEST) else {
        return;
    };
    let queues = Queues::new(&url);
    let queue = queues.name("orders");
    let transport = AmqpTransport::connect(&url).await.unwrap();
    let first = Envelope::new(URN, json!({"n": 1})).with_queue(&queue);
    transport.publish_envelope(&first).await.unwrap();
    queues.delete(&queue).await;

    let second = Envelope::new(URN, json!({"n": 2})).with_queue(&queue);
    let returned = transport.publish_envelope(&second).await;
    assert!(
        matches!(
            &returned,
            Err(PublishError::Transport(TransportError::Unroutable { queue: to })) if *to == queue
        ),
        "a publish no queue took: {returned:?}"
    );
    transport.publish_envelope(&second).await.unwrap();
    let got = landed(&queues.broker(), &queue).await;
    assert_eq!(got, [second.meta.id.clone().unwrap()]);
    transport.close().await;
}

/// A queue the transport deletes itself is forgotten as declared: the next
/// publish through the same transport declares it again and lands, with
/// no message returned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_the_transport_deleted_itself_is_declared_again_by_the_next_publish() {
    const TEST: &str = "amqp_returns_delete_queue_forgets";
    let Some(url) = server_url(AMQP_URL, TEST) else {
        return;
    };
    let queues = Queues::new(&url);
    let queue = queues.name("orders");
    let transport = AmqpTransport::connect(&url).await.unwrap();
    let first = Envelope::new(URN, json!({"n": 1})).with_queue(&queue);
    transport.publish_envelope(&first).await.unwrap();
    transport.delete_queue(&queue).await.unwrap();
    assert!(!queues.exists(&queue).await, "{queue} was deleted");

    let second = Envelope::new(URN, json!({"n": 2})).with_queue(&queue);
    transport.publish_envelope(&second).await.unwrap();
    let got = landed(&queues.broker(), &queue).await;
    assert_eq!(got, [second.meta.id.clone().unwrap()]);
    transport.close().await;
}
