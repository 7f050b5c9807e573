//! Delayed publishing and the retry-tier re-injector on a real Kafka
//! broker (`BABEL_IDEM_KAFKA_URL`), with the BabelQueue Python SDK
//! (`BABEL_IDEM_PYTHON`, `kafka` extra) as the peer on either side of a
//! tier. Without them a test prints `skipped:`; with
//! `BABEL_IDEM_REQUIRE_SERVERS=1` it fails instead.
#![cfg(feature = "kafka-transport")]

#[path = "support/python.rs"]
mod python;
mod support;

use std::time::{Duration, Instant};

use babel_idem::Envelope;
use babel_idem::transport::KafkaTransport;
use babel_idem::transport::kafka::{DelayError, Reinjector, RetryTiers, TierError};
use python::{peer, python};
use serde_json::json;
use support::kafka::{
    READ_QUIET, Raw, Topics, committed, kafka_url, now_ms, produce, producer, read_all, unique,
};

const URN: &str = "urn:babel:orders:remind";

/// The Python peer of these tests: `tests/python/kafka_peer.py`.
const PEER: &str = "kafka_peer.py";

/// The longest a test waits for a condition (a guard against hanging,
/// never a timing assertion).
const PATIENCE: Duration = Duration::from_secs(60);

/// A test's work topic and its two tiers (1 s and 3 s), made on the broker.
struct Work {
    name: String,
    tiers: RetryTiers,
    topics: Topics,
}

impl Work {
    async fn new(url: &str) -> Work {
        let name = unique("bi-kafka-reinject");
        let tiers = RetryTiers::new([Duration::from_secs(1), Duration::from_secs(3)]).unwrap();
        let mut names = vec![name.clone()];
        names.extend(tiers.topics(&name));
        let topics = Topics::create(url, &names, 1).await;
        Work {
            name,
            tiers,
            topics,
        }
    }

    fn tier(&self, n: usize) -> String {
        self.tiers.topic(&self.name, n)
    }

    async fn transport(&self, url: &str) -> KafkaTransport {
        KafkaTransport::builder()
            .retry_tiers(self.tiers.clone())
            .connect(url)
            .await
            .unwrap()
    }

    async fn reinjector(&self, transport: &KafkaTransport, group: &str) -> Reinjector {
        Reinjector::builder()
            .topic(&self.name)
            .group(group)
            .poll_interval(Duration::from_millis(200))
            .build(transport)
            .unwrap()
    }

    /// Steps `reinjector` until it wrote `count` records; when it wrote the
    /// first.
    async fn reinject(&self, reinjector: &mut Reinjector, count: usize) -> Instant {
        let deadline = Instant::now() + PATIENCE;
        let mut written = 0;
        let mut first = None;
        while written < count {
            assert!(
                Instant::now() < deadline,
                "re-injected {written} of {count}"
            );
            if let Ok(n) = reinjector.run_once().await {
                written += n;
                if n > 0 {
                    first.get_or_insert_with(Instant::now);
                }
            }
        }
        first.unwrap()
    }
}

fn envelope(id: &str, queue: &str) -> Vec<u8> {
    Envelope::new(URN, json!({"order": id, "text": "héllo"}))
        .with_id(id)
        .with_queue(queue)
        .to_vec()
}

#[tokio::test]
async fn a_delayed_publish_is_parked_on_the_smallest_tier_covering_it_with_its_headers() {
    let test = "a_delayed_publish_is_parked_on_the_smallest_tier_covering_it_with_its_headers";
    let Some(url) = kafka_url(test) else { return };
    let work = Work::new(&url).await;
    let transport = work.transport(&url).await;
    let body = envelope("d-1", &work.name);

    transport
        .publish_delayed(&work.name, &body, Duration::from_millis(1500))
        .await
        .unwrap();

    assert!(
        read_all(&url, &work.tier(1), None, READ_QUIET)
            .await
            .is_empty()
    );
    assert!(
        read_all(&url, &work.name, None, READ_QUIET)
            .await
            .is_empty()
    );
    let parked = read_all(&url, &work.tier(2), None, READ_QUIET).await;
    assert_eq!(parked.len(), 1);
    let record = &parked[0];
    assert_eq!(record.value, &body[..]);
    assert_eq!(record.key.as_deref(), None);
    let names: Vec<String> = record.headers.clone().into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        names,
        [
            "bq-job",
            "bq-trace-id",
            "bq-message-id",
            "bq-schema-version",
            "bq-source-lang",
            "bq-attempts",
            "bq-delay",
            "bq-original-topic"
        ]
    );
    assert_eq!(record.header("bq-delay").as_deref(), Some("1500"));
    assert_eq!(record.header("bq-original-topic"), Some(work.name.clone()));
    assert_eq!(record.header("bq-message-id").as_deref(), Some("d-1"));
    let created_at: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(record.timestamp, created_at["meta"]["created_at"].as_i64());
}

#[tokio::test]
async fn a_delay_no_tier_holds_is_refused_and_nothing_is_produced() {
    let test = "a_delay_no_tier_holds_is_refused_and_nothing_is_produced";
    let Some(url) = kafka_url(test) else { return };
    let work = Work::new(&url).await;
    let transport = work.transport(&url).await;
    let body = envelope("d-2", &work.name);

    let too_long = transport
        .publish_delayed(&work.name, &body, Duration::from_secs(4))
        .await
        .unwrap_err();
    assert!(
        matches!(too_long, DelayError::Tiers(TierError::TooLong { .. })),
        "{too_long}"
    );
    let untiered = KafkaTransport::connect(&url).await.unwrap();
    let no_tiers = untiered
        .publish_delayed(&work.name, &body, Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(
        matches!(no_tiers, DelayError::Tiers(TierError::None)),
        "{no_tiers}"
    );
    let bad_name = transport
        .publish_delayed("no spaces", &body, Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(matches!(bad_name, DelayError::Transport(_)), "{bad_name}");

    for topic in [work.name.clone(), work.tier(1), work.tier(2)] {
        assert!(
            read_all(&url, &topic, None, READ_QUIET).await.is_empty(),
            "{topic}"
        );
    }
}

#[tokio::test]
async fn the_reinjector_writes_a_delayed_message_to_its_work_topic_once_due_without_the_tier_headers()
 {
    let test = "the_reinjector_writes_a_delayed_message_to_its_work_topic_once_due_without_the_tier_headers";
    let Some(url) = kafka_url(test) else { return };
    let work = Work::new(&url).await;
    let transport = work.transport(&url).await;
    // `meta.created_at`, the record's timestamp, is taken after this.
    let before = Instant::now();
    let body = envelope("d-3", &work.name);
    let delay = Duration::from_millis(2500);

    transport
        .publish_delayed(&work.name, &body, delay)
        .await
        .unwrap();
    let mut reinjector = work.reinjector(&transport, &unique("bi-reinject")).await;
    let written = work.reinject(&mut reinjector, 1).await;

    // Tier 2 holds it 3 s from its timestamp: never released before.
    assert!(
        written + Duration::from_millis(20) >= before + Duration::from_secs(3),
        "written {:?} after the envelope was made",
        written - before
    );
    let delivered = read_all(work.topics.url(), &work.name, None, READ_QUIET).await;
    assert_eq!(delivered.len(), 1);
    let record = &delivered[0];
    assert_eq!(record.value, &body[..]);
    assert_eq!(record.key.as_deref(), None);
    assert_eq!(record.header("bq-delay"), None);
    assert_eq!(record.header("bq-original-topic"), None);
    assert_eq!(record.header("bq-job").as_deref(), Some(URN));
    assert_eq!(record.header("bq-message-id").as_deref(), Some("d-3"));
}

#[tokio::test]
async fn the_reinjector_copies_key_value_and_other_headers_byte_for_byte_and_falls_back_to_the_topic_name()
 {
    let test = "the_reinjector_copies_key_value_and_other_headers_byte_for_byte_and_falls_back_to_the_topic_name";
    let Some(url) = kafka_url(test) else { return };
    let work = Work::new(&url).await;
    let transport = work.transport(&url).await;
    let value: &[u8] = b"\xff\x00not an envelope";
    // No bq-original-topic: the work part of the tier's name is the target.
    produce(
        &producer(&url),
        &work.tier(1),
        Raw {
            key: Some(b"customer-\x01"),
            value,
            headers: vec![
                (
                    "traceparent",
                    Some(b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
                ),
                ("bq-delay", Some(b"1000")),
                ("x-null", None),
                ("x-bytes", Some(b"\xfe\xff")),
            ],
            timestamp: Some(now_ms()),
            partition: None,
        },
    )
    .await;
    // An empty key stays empty, after the first record (order kept).
    produce(
        &producer(&url),
        &work.tier(1),
        Raw {
            key: Some(b""),
            value: b"second",
            headers: vec![("bq-original-topic", Some(work.name.as_bytes()))],
            timestamp: Some(now_ms()),
            partition: None,
        },
    )
    .await;

    let mut reinjector = work.reinjector(&transport, &unique("bi-reinject")).await;
    work.reinject(&mut reinjector, 2).await;

    let delivered = read_all(&url, &work.name, None, READ_QUIET).await;
    assert_eq!(delivered.len(), 2);
    assert_eq!(delivered[0].value, value);
    assert_eq!(delivered[0].key.as_deref(), Some(&b"customer-\x01"[..]));
    assert_eq!(
        delivered[0].headers,
        vec![
            (
                "traceparent".to_owned(),
                Some(b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".to_vec())
            ),
            ("x-null".to_owned(), None),
            ("x-bytes".to_owned(), Some(b"\xfe\xff".to_vec())),
        ]
    );
    assert_eq!(delivered[1].value, &b"second"[..]);
    assert_eq!(delivered[1].key.as_deref(), Some(&b""[..]));
    assert!(delivered[1].headers.is_empty());
}

#[tokio::test]
async fn a_due_record_never_overtakes_an_earlier_one_of_its_partition() {
    let test = "a_due_record_never_overtakes_an_earlier_one_of_its_partition";
    let Some(url) = kafka_url(test) else { return };
    let work = Work::new(&url).await;
    let transport = work.transport(&url).await;
    // First due in a whole tier (3 s), second due at once (an old
    // timestamp): the second waits behind the first.
    for (value, timestamp) in [
        (&b"first"[..], now_ms()),
        (&b"second"[..], now_ms() - 60_000),
    ] {
        produce(
            &producer(&url),
            &work.tier(2),
            Raw {
                value,
                headers: vec![("bq-original-topic", Some(work.name.as_bytes()))],
                timestamp: Some(timestamp),
                ..Raw::default()
            },
        )
        .await;
    }

    let mut reinjector = work.reinjector(&transport, &unique("bi-reinject")).await;
    work.reinject(&mut reinjector, 2).await;

    let delivered = read_all(&url, &work.name, None, READ_QUIET).await;
    let values: Vec<&[u8]> = delivered.iter().map(|r| r.value.as_slice()).collect();
    assert_eq!(values, [&b"first"[..], &b"second"[..]]);
}

#[tokio::test]
async fn two_reinjectors_of_one_group_share_the_tiers_and_lose_no_record() {
    let test = "two_reinjectors_of_one_group_share_the_tiers_and_lose_no_record";
    let Some(url) = kafka_url(test) else { return };
    let name = unique("bi-kafka-reinject");
    let tiers = RetryTiers::new([Duration::from_secs(4)]).unwrap();
    let names = vec![name.clone(), tiers.topic(&name, 1)];
    let topics = Topics::create(&url, &names, 4).await;
    let wanted: std::collections::BTreeSet<String> = (0..24).map(|n| format!("s-{n}")).collect();
    for (n, value) in wanted.iter().enumerate() {
        produce(
            &producer(topics.url()),
            &names[1],
            Raw {
                value: value.as_bytes(),
                headers: vec![("bq-original-topic", Some(name.as_bytes()))],
                timestamp: Some(now_ms()),
                partition: Some(n as i32 % 4),
                ..Raw::default()
            },
        )
        .await;
    }
    let transport = KafkaTransport::builder()
        .retry_tiers(tiers)
        .connect(&url)
        .await
        .unwrap();
    let group = unique("bi-reinject");
    let reinjector = |transport: &KafkaTransport| {
        Reinjector::builder()
            .topic(&name)
            .group(&group)
            .poll_interval(Duration::from_millis(100))
            .build(transport)
            .unwrap()
    };
    // The first holds records of every partition when the second joins:
    // the group takes some away from it, held and unwritten.
    let mut one = reinjector(&transport);
    let deadline = Instant::now() + PATIENCE;
    while one.held_count() < 4 {
        assert!(Instant::now() < deadline, "the first read nothing");
        let _ = one.run_once().await;
    }
    let mut two = reinjector(&transport);

    // Both step side by side until the work topic holds every record.
    loop {
        let _ = tokio::join!(one.run_once(), two.run_once());
        let delivered: std::collections::BTreeSet<String> =
            read_all(topics.url(), &name, None, READ_QUIET)
                .await
                .iter()
                .map(|r| String::from_utf8(r.value.clone()).unwrap())
                .collect();
        assert!(delivered.is_subset(&wanted), "{delivered:?}");
        if delivered == wanted {
            break;
        }
        assert!(Instant::now() < deadline, "delivered {delivered:?}");
    }
}

#[tokio::test]
async fn a_reinjector_stopped_before_it_commits_leaves_the_record_for_the_next_one() {
    let test = "a_reinjector_stopped_before_it_commits_leaves_the_record_for_the_next_one";
    let Some(url) = kafka_url(test) else { return };
    let work = Work::new(&url).await;
    let transport = work.transport(&url).await;
    let group = unique("bi-reinject");
    let body = envelope("d-4", &work.name);
    transport
        .publish_delayed(&work.name, &body, Duration::from_secs(3))
        .await
        .unwrap();

    // The first re-injector reads the record and holds it (3 s to go),
    // and is gone before it is due: nothing written, nothing committed.
    let mut first = work.reinjector(&transport, &group).await;
    let deadline = Instant::now() + PATIENCE;
    while first.held_count() == 0 {
        assert!(Instant::now() < deadline, "the record was never read");
        assert_eq!(first.run_once().await.unwrap_or(0), 0);
    }
    drop(first);
    assert!(
        read_all(work.topics.url(), &work.name, None, READ_QUIET)
            .await
            .is_empty()
    );

    let mut second = work.reinjector(&transport, &group).await;
    work.reinject(&mut second, 1).await;
    let delivered = read_all(work.topics.url(), &work.name, None, READ_QUIET).await;
    assert_eq!(delivered.len(), 1);
    assert_eq!(delivered[0].value, &body[..]);
    // Committed past it: a third finds nothing.
    drop(second);
    let committed = committed(work.topics.url(), &group, &work.tier(2), 1).await;
    assert_eq!(committed[&0], Some(1));
}

#[tokio::test]
async fn a_write_that_fails_leaves_the_record_on_its_tier_and_it_is_written_once_the_target_exists()
{
    let test =
        "a_write_that_fails_leaves_the_record_on_its_tier_and_it_is_written_once_the_target_exists";
    let Some(url) = kafka_url(test) else { return };
    let work = Work::new(&url).await;
    let transport = KafkaTransport::builder()
        .retry_tiers(work.tiers.clone())
        .delivery_timeout(Duration::from_secs(2))
        .connect(&url)
        .await
        .unwrap();
    let missing = unique("bi-kafka-missing");
    produce(
        &producer(&url),
        &work.tier(1),
        Raw {
            key: Some(b"k"),
            value: b"to a topic made later",
            headers: vec![("bq-original-topic", Some(missing.as_bytes()))],
            timestamp: Some(now_ms() - 10_000),
            partition: None,
        },
    )
    .await;
    let group = unique("bi-reinject");
    let mut reinjector = work.reinjector(&transport, &group).await;
    let deadline = Instant::now() + PATIENCE;
    loop {
        assert!(Instant::now() < deadline, "the write never failed");
        match reinjector.run_once().await {
            Err(error) => {
                assert!(error.to_string().contains(&missing), "{error}");
                break;
            }
            Ok(n) => assert_eq!(n, 0),
        }
    }
    let committed = committed(&url, &group, &work.tier(1), 1).await;
    assert_eq!(
        committed[&0], None,
        "nothing committed past the failed record"
    );

    let _target = Topics::create(&url, std::slice::from_ref(&missing), 1).await;
    work.reinject(&mut reinjector, 1).await;
    let delivered = read_all(&url, &missing, None, READ_QUIET).await;
    assert_eq!(delivered.len(), 1);
    assert_eq!(delivered[0].value, &b"to a topic made later"[..]);
}

#[tokio::test]
async fn a_message_the_python_sdk_parks_is_reinjected_by_ours() {
    let test = "a_message_the_python_sdk_parks_is_reinjected_by_ours";
    let Some(url) = kafka_url(test) else { return };
    let Some(python) = python(test) else { return };
    let work = Work::new(&url).await;
    let body = String::from_utf8(envelope("py-1", &work.name)).unwrap();
    let args = ["publish-delayed", &url, &work.name, "800", "1000,3000"]
        .map(str::to_owned)
        .to_vec();
    peer(&python, PEER, args, Some(json!({ "body": body }))).await;
    let parked = read_all(work.topics.url(), &work.tier(1), None, READ_QUIET).await;
    assert_eq!(parked.len(), 1, "Python parks 800 ms on the 1 s tier");

    let transport = work.transport(&url).await;
    let mut reinjector = work.reinjector(&transport, &unique("bi-reinject")).await;
    work.reinject(&mut reinjector, 1).await;

    let delivered = read_all(work.topics.url(), &work.name, None, READ_QUIET).await;
    assert_eq!(delivered.len(), 1);
    assert_eq!(delivered[0].value, body.as_bytes());
    assert_eq!(delivered[0].header("bq-delay"), None);
    assert_eq!(delivered[0].header("bq-original-topic"), None);
    assert_eq!(
        delivered[0].header("bq-message-id").as_deref(),
        Some("py-1")
    );
}

#[tokio::test]
async fn a_message_we_park_is_reinjected_by_the_python_sdk() {
    let test = "a_message_we_park_is_reinjected_by_the_python_sdk";
    let Some(url) = kafka_url(test) else { return };
    let Some(python) = python(test) else { return };
    let work = Work::new(&url).await;
    let transport = work.transport(&url).await;
    let body = envelope("rs-1", &work.name);
    transport
        .publish_delayed(&work.name, &body, Duration::from_millis(800))
        .await
        .unwrap();

    let group = unique("bi-py-reinject");
    let args = [
        "reinject",
        &url,
        &work.name,
        "1000,3000",
        "60",
        "--group",
        &group,
        "--count",
        "1",
    ]
    .map(str::to_owned)
    .to_vec();
    let answer = peer(&python, PEER, args, None).await;
    assert_eq!(answer["written"], 1, "{answer}");

    let delivered = read_all(work.topics.url(), &work.name, None, READ_QUIET).await;
    assert_eq!(delivered.len(), 1);
    assert_eq!(delivered[0].value, &body[..]);
    assert_eq!(delivered[0].header("bq-delay"), None);
    assert_eq!(delivered[0].header("bq-original-topic"), None);
    assert_eq!(
        delivered[0].header("bq-message-id").as_deref(),
        Some("rs-1")
    );
}
