//! Typed publishing on real brokers: a value of a `Message` type published
//! with `Publisher::publish_message` (Redis, RabbitMQ, Kafka) or saved with
//! an outbox's `save_message` and relayed (SQLite to Redis, PostgreSQL to
//! RabbitMQ) reaches the Python SDK's worker as an envelope of the type's
//! URN whose `data` equals the value; a value that is not a JSON object is
//! refused before anything is sent or written.
//!
//! Environment: `BABEL_IDEM_REDIS_URL`, `BABEL_IDEM_AMQP_URL`,
//! `BABEL_IDEM_KAFKA_URL`, `BABEL_IDEM_POSTGRES_URL` and `BABEL_IDEM_PYTHON`;
//! without them the tests print `skipped:`, and with
//! `BABEL_IDEM_REQUIRE_SERVERS=1` fail.
#![cfg(all(feature = "redis-transport", feature = "amqp-transport"))]

mod outbox_support;
#[path = "support/python.rs"]
mod python;
mod store_contract;
#[cfg(feature = "kafka-transport")]
mod support;

use babel_idem::broker::{PublishError, Publisher};
use babel_idem::envelope::{DataError, ProduceError};
use babel_idem::transport::{AmqpTransport, RedisTransport};
use babel_idem::{Envelope, Message, MessageId};
use outbox_support::{AMQP_URL, Broker};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use store_contract::servers::{REDIS_URL, server_url, unique_suffix};

/// The URN the Python peers' workers handle.
const URN: &str = "urn:babel:interop:created";

#[derive(Debug, Clone, Serialize, Deserialize, Message)]
#[message(urn = "urn:babel:interop:created")]
struct Interop {
    n: u64,
    text: String,
    lines: Vec<Line>,
    ratio: f64,
    note: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Line {
    sku: String,
    qty: u32,
}

/// A message type whose value is an array: never an envelope's `data`.
#[derive(Debug, Serialize, Deserialize, Message)]
#[message(urn = "urn:babel:interop:created")]
struct Tags(Vec<String>);

fn values() -> Vec<Interop> {
    (0..3)
        .map(|n| Interop {
            n,
            text: "héllo \u{2028} \"q\" é/ü".to_owned(),
            lines: vec![Line {
                sku: format!("sku-{n}"),
                qty: 2,
            }],
            ratio: 0.25 * n as f64,
            note: (n == 1).then(|| "gift".to_owned()),
        })
        .collect()
}

/// What the Python worker `peer` received from `queue` (with `extra`
/// options), checked to be `values` once each, in order, as envelopes of
/// [`URN`] written by Rust with no attempt spent and distinct ids.
async fn python_received_values(
    python: &std::path::Path,
    peer: &str,
    url: &str,
    queue: &str,
    extra: &[&str],
    values: &[Interop],
) {
    let mut args = vec!["consume".to_owned(), url.to_owned(), queue.to_owned()];
    args.extend(extra.iter().map(|arg| (*arg).to_owned()));
    let answer = python::peer(python, peer, args, None).await;
    let received = answer["received"].as_array().expect("the worker's answer");
    assert_eq!(received.len(), values.len(), "{answer}");
    let mut ids = std::collections::HashSet::new();
    for (got, value) in received.iter().zip(values) {
        assert_eq!(got["urn"], URN);
        assert_eq!(
            got["data"],
            serde_json::to_value(value).unwrap(),
            "the data is the value"
        );
        assert_eq!(got["lang"], "rust");
        assert_eq!(got["attempts"], 0);
        assert!(ids.insert(got["id"].as_str().unwrap().to_owned()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_typed_publish_on_redis_reaches_the_python_sdk_as_its_value() {
    const TEST: &str = "publish_typed_redis_python";
    let (Some(url), Some(python)) = (server_url(REDIS_URL, TEST), python::python(TEST)) else {
        return;
    };
    let queue = format!("bi-typed-{}", unique_suffix());
    let transport = RedisTransport::connect(&url).await.unwrap();
    let values = values();
    for value in &values {
        transport.publish_message(&queue, value).await.unwrap();
    }
    python_received_values(&python, "consumer_peer.py", &url, &queue, &["1"], &values).await;
    Broker::Redis(url).delete(&[queue]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_typed_publish_on_rabbitmq_reaches_the_python_sdk_as_its_value() {
    const TEST: &str = "publish_typed_amqp_python";
    let (Some(url), Some(python)) = (server_url(AMQP_URL, TEST), python::python(TEST)) else {
        return;
    };
    let queue = format!("bi-typed-{}", unique_suffix());
    let transport = AmqpTransport::connect(&url).await.unwrap();
    let values = values();
    for value in &values {
        transport.publish_message(&queue, value).await.unwrap();
    }
    transport.close().await;
    python_received_values(&python, "amqp_peer.py", &url, &queue, &["1"], &values).await;
    Broker::Amqp(url).delete(&[queue]).await;
}

#[cfg(feature = "kafka-transport")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_typed_publish_on_kafka_reaches_the_python_sdk_as_its_value() {
    use babel_idem::transport::KafkaTransport;
    use support::kafka::{Topics, kafka_url, unique};

    const TEST: &str = "publish_typed_kafka_python";
    let (Some(url), Some(python)) = (kafka_url(TEST), python::python(TEST)) else {
        return;
    };
    let topic = unique("bi-typed");
    let topics = Topics::create(&url, std::slice::from_ref(&topic), 1).await;
    let transport = KafkaTransport::builder()
        .group(topics.group())
        .connect(&url)
        .await
        .unwrap();
    let values = values();
    for value in &values {
        transport.publish_message(&topic, value).await.unwrap();
    }
    transport.close().await;
    // The worker's idle wait outlasts its group join.
    let group = topics.group();
    python_received_values(
        &python,
        "kafka_peer.py",
        &url,
        &topic,
        &["5", "--group", &group],
        &values,
    )
    .await;
    topics.delete().await;
}

#[tokio::test]
async fn a_value_that_is_not_a_json_object_is_refused_before_anything_is_sent() {
    let Some(url) = server_url(REDIS_URL, "publish_typed_not_an_object") else {
        return;
    };
    let queue = format!("bi-typed-{}", unique_suffix());
    let transport = RedisTransport::connect(&url).await.unwrap();
    let error = transport
        .publish_message(&queue, &Tags(vec!["a".into()]))
        .await
        .unwrap_err();
    assert!(
        matches!(
            &error,
            PublishError::Envelope(ProduceError::Data(DataError::NotAnObject {
                found: "array",
                ..
            }))
        ),
        "{error:?}"
    );
    assert!(error.to_string().contains(URN), "{error}");
    assert_eq!(Broker::Redis(url).len(&queue).await, 0);
}

#[tokio::test]
async fn a_typed_publish_lands_as_the_envelope_of_its_value_on_the_queue_given() {
    let Some(url) = server_url(REDIS_URL, "publish_typed_landed") else {
        return;
    };
    let queue = format!("bi-typed-{}", unique_suffix());
    let transport = RedisTransport::connect(&url).await.unwrap();
    let value = values().remove(1);
    transport.publish_message(&queue, &value).await.unwrap();
    transport.publish_message(&queue, &value).await.unwrap();
    let landed = Broker::Redis(url).drain(&queue).await;
    assert_eq!(landed.len(), 2);
    let mut envelopes = Vec::new();
    for landed in &landed {
        let envelope = Envelope::from_slice(&landed.body).unwrap();
        assert_eq!(envelope.urn(), URN);
        assert_eq!(envelope.meta.queue, queue);
        assert_eq!(
            Value::Object(envelope.data.clone()),
            serde_json::to_value(&value).unwrap()
        );
        // Re-encoded from its value alone, the envelope is the same bytes:
        // the canonical layout every producer of the family writes.
        let parsed: Value = serde_json::from_slice(&landed.body).unwrap();
        let canonical = Envelope::from_value(parsed).unwrap().encode_for_publish();
        assert_eq!(canonical.unwrap(), landed.body);
        envelopes.push(envelope);
    }
    assert_ne!(
        envelopes[0].message_id(),
        envelopes[1].message_id(),
        "each publish is a new message"
    );
}

#[cfg(all(feature = "outbox", feature = "sqlite", feature = "postgres"))]
mod outbox {
    use babel_idem::envelope::{DataError, ProduceError};
    use babel_idem::outbox::{OutboxError, Relay, RelaySink};
    use babel_idem::transport::{AmqpTransport, RedisTransport};

    use super::outbox_support::db::{Db, Kind};
    use super::outbox_support::{AMQP_URL, Broker};
    use super::store_contract::servers::{REDIS_URL, server_url, unique_suffix};
    use super::{Interop, Tags, python, python_received_values, values};

    /// Saves each of `values` with `save_message` on `queue`, in one
    /// committed transaction; the rows' ids.
    async fn save_all(db: &Db, queue: &str, values: &[Interop]) -> Vec<i64> {
        let mut ids = Vec::new();
        match db {
            Db::Sqlite { pool, .. } => {
                let outbox = db.sqlite();
                let mut tx = pool.begin().await.unwrap();
                for value in values {
                    ids.push(outbox.save_message(&mut tx, queue, value).await.unwrap());
                }
                tx.commit().await.unwrap();
            }
            Db::Postgres { pool, .. } => {
                let outbox = db.postgres();
                let mut tx = pool.begin().await.unwrap();
                for value in values {
                    ids.push(outbox.save_message(&mut tx, queue, value).await.unwrap());
                }
                tx.commit().await.unwrap();
            }
        }
        ids
    }

    async fn relayed(kind: Kind, redis: bool, test: &str) {
        let broker = if redis {
            server_url(REDIS_URL, test).map(Broker::Redis)
        } else {
            server_url(AMQP_URL, test).map(Broker::Amqp)
        };
        let (Some(db), Some(broker), Some(python)) =
            (Db::open(kind, test).await, broker, python::python(test))
        else {
            return;
        };
        db.migrate().await;
        let queue = format!("bi-typed-obx-{}", unique_suffix());
        let values = values();
        let ids = save_all(&db, &queue, &values).await;
        assert_eq!(ids.len(), values.len());
        assert!(db.rows().await.iter().all(|row| row.queue == queue));

        let (sink, peer, url): (RelaySink, _, _) = match &broker {
            Broker::Redis(url) => (
                RedisTransport::connect(url).await.unwrap().into(),
                "consumer_peer.py",
                url.clone(),
            ),
            Broker::Amqp(url) => (
                AmqpTransport::connect(url).await.unwrap().into(),
                "amqp_peer.py",
                url.clone(),
            ),
        };
        let relay = Relay::builder(db.source().await, sink)
            .build()
            .await
            .unwrap();
        assert_eq!(relay.drain().await.unwrap().published, values.len() as u64);
        python_received_values(&python, peer, &url, &queue, &["1"], &values).await;
        broker.delete(&[queue]).await;
        db.cleanup().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_typed_save_on_sqlite_is_relayed_to_redis_and_read_by_python_as_its_value() {
        relayed(Kind::Sqlite, true, "outbox_typed_sqlite_redis").await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_typed_save_on_postgres_is_relayed_to_rabbitmq_and_read_by_python_as_its_value() {
        relayed(Kind::Postgres, false, "outbox_typed_postgres_amqp").await;
    }

    async fn refused(kind: Kind, test: &str) {
        let Some(db) = Db::open(kind, test).await else {
            return;
        };
        db.migrate().await;
        let tags = Tags(vec!["a".into()]);
        let error = match &db {
            Db::Sqlite { pool, .. } => {
                let mut tx = pool.begin().await.unwrap();
                let error = db
                    .sqlite()
                    .save_message(&mut tx, "orders", &tags)
                    .await
                    .unwrap_err();
                tx.commit().await.unwrap();
                error
            }
            Db::Postgres { pool, .. } => {
                let mut tx = pool.begin().await.unwrap();
                let error = db
                    .postgres()
                    .save_message(&mut tx, "orders", &tags)
                    .await
                    .unwrap_err();
                tx.commit().await.unwrap();
                error
            }
        };
        assert!(
            matches!(
                &error,
                OutboxError::Envelope(ProduceError::Data(DataError::NotAnObject { .. }))
            ),
            "{error:?}"
        );
        assert!(db.rows().await.is_empty(), "nothing was written");
        db.cleanup().await;
    }

    #[tokio::test]
    async fn sqlite_a_value_that_is_not_a_json_object_is_refused_before_anything_is_written() {
        refused(Kind::Sqlite, "outbox_typed_refused_sqlite").await;
    }

    #[tokio::test]
    async fn postgres_a_value_that_is_not_a_json_object_is_refused_before_anything_is_written() {
        refused(Kind::Postgres, "outbox_typed_refused_postgres").await;
    }
}
