//! Dead-letter redrive on a real Redis (`Redrive::redrive` on a `RedisTransport`), with the
//! BabelQueue Python SDK (pinned by `.ci/python.sh`) as the peer that
//! dead-letters, redrives and consumes.
//!
//! Environment: `BABEL_IDEM_REDIS_URL` (the shared server), `BABEL_IDEM_PYTHON`
//! (the peer's virtualenv python); without them a test prints `skipped:`,
//! and with `BABEL_IDEM_REQUIRE_SERVERS=1` it fails instead. The outage test
//! starts a server of its own.
#![cfg(all(
    feature = "redis-transport",
    feature = "redrive",
    feature = "redis",
    feature = "sqlite"
))]

mod consumer_support;
mod store_contract;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use babel_idem::envelope::{DeadLetter, DeadLetterReason};
use babel_idem::redrive::{LeftReason, Outcome, Redrive, RedriveError, RedriveOptions, Selection};
use babel_idem::transport::RedisTransport;
use babel_idem::{Consumer, Envelope};
use redis::AsyncCommands;
use serde_json::{Value, json};
use store_contract::servers::{REDIS_URL, server_url};
use store_contract::spawned::OwnRedis;

use consumer_support::redis_queue::Queue;
use consumer_support::{
    QUIET, SeenLog, TRACEPARENT, URN, eventually, python, python_consumes, python_publishes,
    recording_router, run_until_idle,
};

/// The Python peer of these tests: `tests/python/consumer_peer.py`.
const PEER: &str = "consumer_peer.py";

async fn peer(python: &Path, args: &[&str]) -> Value {
    let args = args.iter().map(|a| (*a).to_owned()).collect();
    consumer_support::peer(python, PEER, args, None).await
}

/// A dead-letter record as babel-idem's consumer writes it: `id`, `urn`,
/// from `queue`, for `reason`, at `failed_at`.
fn record(id: &str, urn: &str, queue: &str, reason: DeadLetterReason, failed_at: u64) -> Vec<u8> {
    let mut envelope = Envelope::new(urn, json!({"id": id}))
        .with_id(id)
        .with_queue(queue)
        .with_attempts(3);
    let mut block = DeadLetter::new(reason, queue, 3).with_error("payment gateway timeout");
    block.failed_at = failed_at;
    envelope.dead_letter = Some(block);
    envelope.to_vec()
}

async fn push(queue: &Queue, key: &str, values: &[Vec<u8>]) {
    let mut raw = queue.raw().await;
    for value in values {
        let _: () = raw.rpush(key, value).await.unwrap();
    }
}

async fn values(queue: &Queue, key: &str) -> Vec<Vec<u8>> {
    queue.raw().await.lrange(key, 0, -1).await.unwrap()
}

/// The `meta.id`s of the envelopes in `key`, in order.
async fn ids(queue: &Queue, key: &str) -> Vec<String> {
    values(queue, key)
        .await
        .iter()
        .map(|value| {
            let value: Value = serde_json::from_slice(value).unwrap();
            let body: Value = match value.get("body").and_then(Value::as_str) {
                Some(framed) => serde_json::from_str(framed).unwrap(),
                None => value,
            };
            body["meta"]["id"].as_str().unwrap().to_owned()
        })
        .collect()
}

/// Records that Python and babel-idem both redrive, spelled every way the
/// two readers could part: number forms, escapes, key order, repeated keys,
/// the `urn` alias, non-canonical keys, pretty printing, no `attempts`.
fn spelled_records(queue: &str) -> Vec<String> {
    let mut records = hand_spelled_records(queue);
    records.extend(float_records(queue));
    records
}

/// Records whose `data` holds floats from random bit patterns, each
/// written three ways (Rust's shortest, `{:e}`, 17 significant digits):
/// Python reads each as a float and writes it as `repr` does.
fn float_records(queue: &str) -> Vec<String> {
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    (0..20)
        .map(|record| {
            let floats: Vec<String> = (0..30)
                .filter_map(|_| {
                    let number = f64::from_bits(next());
                    number.is_finite().then_some(number)
                })
                .flat_map(|n| [format!("{n:?}"), format!("{n:e}"), format!("{n:.16e}")])
                .collect();
            format!(
                r#"{{"job":"{URN}","trace_id":"f-{record}","data":{{"floats":[{}],"scaled":[{}]}},"meta":{{"id":"id-floats-{record}","queue":"{queue}","lang":"rust","schema_version":1,"created_at":1}},"attempts":1,"dead_letter":{{"reason":"failed","original_queue":"{queue}","failed_at":1,"attempts":1}}}}"#,
                floats.join(","),
                (0..30)
                    .map(|i| format!("{}", (next() % 1_000_000) as f64 / 10f64.powi(i % 12)))
                    .collect::<Vec<_>>()
                    .join(",")
            )
        })
        .collect()
}

fn hand_spelled_records(queue: &str) -> Vec<String> {
    let block = format!(
        r#"{{"reason":"failed","error":"boom","exception":"RuntimeError","failed_at":1796093299123,"original_queue":"{queue}","attempts":3,"lang":"python"}}"#
    );
    vec![
        format!(
            r#"{{"job":"{URN}","trace_id":"t-1","data":{{"n":1}},"meta":{{"id":"id-plain","queue":"{queue}","lang":"python","schema_version":1,"created_at":1764512400123}},"attempts":3,"dead_letter":{block}}}"#
        ),
        format!(
            "{{\n  \"job\": \"{URN}\",\n  \"trace_id\": \"t-2\",\n  \"data\": {{\"price\": 2.50, \"ratio\": 1E2, \"tiny\": 1e-7, \"huge\": 1e16, \"neg\": -0, \"big\": 123456789012345678901234567890, \"text\": \"\\u00e9\\/ \\u2028 \\\"q\\\" \\u001F\", \"list\": [1.0, 2, {{\"b\": 1, \"a\": 2}}]}},\n  \"meta\": {{\"id\": \"id-spelled\", \"queue\": \"{queue}\", \"lang\": \"go\", \"schema_version\": 1, \"created_at\": 1764512400123, \"ext\": {{\"z\": 1, \"a\": null}}}},\n  \"attempts\": 3,\n  \"dead_letter\": {block}\n}}"
        ),
        format!(
            r#"{{"urn":"{URN}","trace_id":"t-3","data":{{}},"meta":{{"id":"id-alias","queue":"{queue}","lang":"php","schema_version":1,"created_at":1,"ts":5,"source":"x"}},"timestamp":1,"attempts":2,"dead_letter":{block}}}"#
        ),
        format!(
            r#"{{"dead_letter":{block},"meta":{{"id":"id-order","queue":"{queue}","lang":"node","schema_version":1,"created_at":2}},"data":{{"k":1,"k":2}},"trace_id":"t-4","job":"{URN}","extra":{{"keep":true}}}}"#
        ),
        format!(
            r#"{{"job":"{URN}","trace_id":"t-5","data":{{"ü":"ß"}},"meta":{{"id":"id-unicode","queue":"{queue}","lang":"rust","schema_version":1,"created_at":3}},"attempts":0,"dead_letter":{block}}}"#
        ),
    ]
}

// ---------------------------------------------------------------- bytes

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redriven_values_equal_the_python_sdks_byte_for_byte() {
    const TEST: &str = "redriven_values_equal_the_python_sdks";
    let (Some(url), Some(python)) = (server_url(REDIS_URL, TEST), python(TEST)) else {
        return;
    };
    let queue = Queue::new(&url);
    let transport = queue.transport().await;
    for bypass in [false, true] {
        let (python_dlq, ours_dlq) = (queue.key("py.dlq"), queue.key("ours.dlq"));
        let (python_to, ours_to) = (queue.key("py.to"), queue.key("ours.to"));
        for dlq in [&python_dlq, &ours_dlq] {
            for (n, text) in spelled_records(&queue.name).into_iter().enumerate() {
                // Every other record framed, with a header beside it.
                if n % 2 == 1 {
                    let headers = [("traceparent".to_owned(), TRACEPARENT.to_owned())];
                    transport
                        .publish_with_headers(dlq, &text, &headers)
                        .await
                        .unwrap();
                } else {
                    transport.publish(dlq, text.as_bytes()).await.unwrap();
                }
            }
        }
        let mut args = vec!["redrive", &url, &python_dlq, "--to", &python_to];
        if bypass {
            args.extend(["--bypass", "1"]);
        }
        let out = peer(&python, &args).await;
        let count = spelled_records(&queue.name).len();
        assert_eq!(out["redriven"], count, "{out}");

        let options = RedriveOptions::new().to(&ours_to).bypass(bypass);
        let report = transport.redrive(&ours_dlq, &options).await.unwrap();
        assert_eq!((report.moved, report.left, report.skipped), (count, 0, 0));

        let (python_values, ours) = (
            values(&queue, &python_to).await,
            values(&queue, &ours_to).await,
        );
        assert_eq!(python_values.len(), count);
        for (python_value, our_value) in python_values.iter().zip(&ours) {
            assert_eq!(
                String::from_utf8_lossy(our_value),
                String::from_utf8_lossy(python_value),
                "bypass {bypass}"
            );
        }
        assert_eq!(ours, python_values);
        assert_eq!(values(&queue, &ours_dlq).await.len(), 0);
        let mut raw = queue.raw().await;
        let _: () = raw
            .del(&[&python_dlq, &ours_dlq, &python_to, &ours_to])
            .await
            .unwrap();
    }
}

/// `tests/fixtures/redrive/go_redrive.json`: records and what the Go SDK's
/// `Redrive` (over its `InMemoryTransport`) wrote for each. CI has no Go,
/// so its outputs are kept as written. Go writes its own key order (`data`
/// sorted), so the two agree field by field, not byte by byte.
#[tokio::test]
async fn redriven_envelopes_agree_with_the_go_sdks_field_by_field() {
    const TEST: &str = "redriven_envelopes_agree_with_the_go_sdks";
    let Some(url) = server_url(REDIS_URL, TEST) else {
        return;
    };
    let fixtures: Vec<Value> =
        serde_json::from_str(include_str!("fixtures/redrive/go_redrive.json")).unwrap();
    let queue = Queue::new(&url);
    let records: Vec<Vec<u8>> = fixtures
        .iter()
        .map(|f| f["record"].as_str().unwrap().as_bytes().to_vec())
        .collect();
    push(&queue, &queue.dlq(), &records).await;
    let transport = queue.transport().await;
    // The records name the queue `orders`: this test's own queue instead.
    let report = transport
        .redrive(&queue.dlq(), &RedriveOptions::new().to(&queue.name))
        .await
        .unwrap();
    assert_eq!(report.moved, fixtures.len());
    let ours = values(&queue, &queue.name).await;
    assert_eq!(ours.len(), fixtures.len());
    for (ours, fixture) in ours.iter().zip(&fixtures) {
        let go = Envelope::from_slice(fixture["go_redriven"].as_str().unwrap().as_bytes()).unwrap();
        let ours = Envelope::from_slice(ours).unwrap();
        assert_eq!(ours, go);
        assert_eq!((ours.attempts, ours.dead_letter.is_none()), (0, true));
    }
}

// ---------------------------------------------------------------- rules

#[tokio::test]
async fn a_dry_run_moves_nothing_and_leaves_the_dlq_as_it_was() {
    const TEST: &str = "a_dry_run_moves_nothing";
    let Some(url) = server_url(REDIS_URL, TEST) else {
        return;
    };
    let queue = Queue::new(&url);
    let records: Vec<Vec<u8>> = (0..5)
        .map(|n| {
            record(
                &format!("dry-{n}"),
                URN,
                &queue.name,
                DeadLetterReason::Failed,
                1,
            )
        })
        .chain([b"not json".to_vec()])
        .collect();
    push(&queue, &queue.dlq(), &records).await;
    let transport = queue.transport().await;
    let report = transport
        .redrive(
            &queue.dlq(),
            &RedriveOptions::new().dry_run(true).bypass(true),
        )
        .await
        .unwrap();
    assert_eq!((report.moved, report.would_move, report.left), (0, 5, 1));
    assert!(report.dry_run);
    assert!(
        report.items[..5]
            .iter()
            .all(|item| item.outcome == Outcome::WouldMove
                && item.to.as_deref() == Some(queue.name.as_str()))
    );
    assert_eq!(values(&queue, &queue.dlq()).await, records);
    assert_eq!(queue.len(&queue.name).await, 0);
}

#[tokio::test]
async fn selection_moves_exactly_the_selected_messages() {
    const TEST: &str = "selection_moves_exactly_the_selected";
    let Some(url) = server_url(REDIS_URL, TEST) else {
        return;
    };
    let queue = Queue::new(&url);
    let other = "urn:babel:interop:other";
    let at = |n: u64| 1_796_000_000_000 + n * 1_000;
    let records = vec![
        record("s-0", URN, &queue.name, DeadLetterReason::Failed, at(0)),
        record("s-1", other, &queue.name, DeadLetterReason::Failed, at(1)),
        record("s-2", URN, &queue.name, DeadLetterReason::UnknownUrn, at(2)),
        record("s-3", URN, &queue.name, DeadLetterReason::Failed, at(3)),
        record(
            "s-4",
            other,
            &queue.name,
            DeadLetterReason::UnknownUrn,
            at(4),
        ),
        record("s-5", URN, &queue.name, DeadLetterReason::Failed, at(5)),
    ];
    push(&queue, &queue.dlq(), &records).await;
    let transport = queue.transport().await;
    let to = queue.key("sandbox");
    let cases: Vec<(Selection, Vec<&str>)> = vec![
        (Selection::new().id("s-3"), vec!["s-3"]),
        (Selection::new().urn(other).reason("failed"), vec!["s-1"]),
        (Selection::new().reason("unknown_urn"), vec!["s-2", "s-4"]),
        (Selection::new().since(at(5)), vec!["s-5"]),
        (Selection::new().until(at(0)), vec!["s-0"]),
    ];
    let mut moved_so_far = Vec::new();
    for (selection, expected) in cases {
        let report = transport
            .redrive(
                &queue.dlq(),
                &RedriveOptions::new().select(selection).to(&to),
            )
            .await
            .unwrap();
        assert_eq!(report.moved, expected.len(), "{expected:?}: {report:?}");
        moved_so_far.extend(expected.iter().map(|id| (*id).to_owned()));
        assert_eq!(ids(&queue, &to).await, moved_so_far);
        let left: Vec<String> = ids(&queue, &queue.dlq()).await;
        assert!(
            left.iter().all(|id| !moved_so_far.contains(id)),
            "{left:?} {moved_so_far:?}"
        );
        assert_eq!(left.len() + moved_so_far.len(), 6);
    }
    // A predicate over the envelope: what is left has no n > 0 (none has).
    let report = transport
        .redrive(
            &queue.dlq(),
            &RedriveOptions::new().select(Selection::new().filter(|e| e.data.contains_key("nope"))),
        )
        .await
        .unwrap();
    assert_eq!((report.moved, report.skipped), (0, 0));
    assert!(report.items.is_empty(), "the DLQ is empty now: {report:?}");
}

#[tokio::test]
async fn an_undecodable_body_and_a_poison_record_stay_in_the_dlq_untouched() {
    const TEST: &str = "an_undecodable_body_stays";
    let Some(url) = server_url(REDIS_URL, TEST) else {
        return;
    };
    let queue = Queue::new(&url);
    let poison = format!(
        r#"{{"raw":"not an envelope","dead_letter":{{"reason":"poison","error":"bad","exception":null,"failed_at":1,"original_queue":"{}","attempts":0,"lang":"python"}}}}"#,
        queue.name
    )
    .into_bytes();
    let spliced = format!(
        r#"{{"job":7,"dead_letter":{{"reason":"poison","failed_at":1,"original_queue":"{}","attempts":0}}}}"#,
        queue.name
    )
    .into_bytes();
    let records = vec![
        record("u-0", URN, &queue.name, DeadLetterReason::Failed, 1),
        b"\xff\xfe not json".to_vec(),
        poison.clone(),
        record("u-1", URN, &queue.name, DeadLetterReason::Failed, 1),
        spliced.clone(),
    ];
    push(&queue, &queue.dlq(), &records).await;
    let transport = queue.transport().await;
    let report = transport
        .redrive(&queue.dlq(), &RedriveOptions::new())
        .await
        .unwrap();
    assert_eq!((report.moved, report.left), (2, 3));
    let reasons: Vec<&Outcome> = report.items.iter().map(|i| &i.outcome).collect();
    assert_eq!(
        reasons,
        [
            &Outcome::Moved,
            &Outcome::Left(LeftReason::Undecodable),
            &Outcome::Left(LeftReason::Poison),
            &Outcome::Moved,
            &Outcome::Left(LeftReason::Poison),
        ]
    );
    assert_eq!(
        values(&queue, &queue.dlq()).await,
        [b"\xff\xfe not json".to_vec(), poison, spliced]
    );
    assert_eq!(ids(&queue, &queue.name).await, ["u-0", "u-1"]);

    // Asked to, the poison records' payloads go back as the records hold
    // them; the undecodable body names no queue and stays.
    let report = transport
        .redrive(&queue.dlq(), &RedriveOptions::new().include_poison(true))
        .await
        .unwrap();
    assert_eq!((report.moved, report.left), (2, 1));
    let work = values(&queue, &queue.name).await;
    assert_eq!(
        work[2..],
        [b"not an envelope".to_vec(), br#"{"job":7}"#.to_vec()]
    );
    assert_eq!(
        values(&queue, &queue.dlq()).await,
        [b"\xff\xfe not json".to_vec()]
    );
}

#[tokio::test]
async fn max_caps_the_messages_moved_and_the_rest_keep_their_order() {
    const TEST: &str = "max_caps_the_messages_moved";
    let Some(url) = server_url(REDIS_URL, TEST) else {
        return;
    };
    let queue = Queue::new(&url);
    let records: Vec<Vec<u8>> = (0..10)
        .map(|n| {
            record(
                &format!("m-{n}"),
                URN,
                &queue.name,
                DeadLetterReason::Failed,
                1,
            )
        })
        .collect();
    push(&queue, &queue.dlq(), &records).await;
    let transport = queue.transport().await;
    let report = transport
        .redrive(&queue.dlq(), &RedriveOptions::new().max(3))
        .await
        .unwrap();
    assert_eq!(report.moved, 3);
    assert_eq!(ids(&queue, &queue.name).await, ["m-0", "m-1", "m-2"]);
    assert_eq!(values(&queue, &queue.dlq()).await, records[3..]);
}

#[tokio::test]
async fn an_empty_or_missing_dlq_is_nothing_to_redrive_and_bad_names_are_refused() {
    const TEST: &str = "an_empty_or_missing_dlq";
    let Some(url) = server_url(REDIS_URL, TEST) else {
        return;
    };
    let queue = Queue::new(&url);
    let transport = queue.transport().await;
    let report = transport
        .redrive(&queue.dlq(), &RedriveOptions::new())
        .await
        .unwrap();
    assert!(report.items.is_empty());
    push(
        &queue,
        &queue.dlq(),
        &[record("b-0", URN, &queue.name, DeadLetterReason::Failed, 1)],
    )
    .await;
    for bad in ["has space", "q:processing"] {
        let error = transport
            .redrive(&queue.dlq(), &RedriveOptions::new().to(bad))
            .await
            .unwrap_err();
        assert!(matches!(error, RedriveError::Transport(_)), "{error}");
        assert!(error.to_string().contains("invalid queue name"), "{error}");
    }
    assert_eq!(queue.len(&queue.dlq()).await, 1);
}

#[tokio::test]
async fn an_empty_dlq_is_watched_for_the_wait_given() {
    const TEST: &str = "an_empty_dlq_is_watched";
    let Some(url) = server_url(REDIS_URL, TEST) else {
        return;
    };
    let queue = Queue::new(&url);
    let transport = queue.transport().await;
    let late = record("w-0", URN, &queue.name, DeadLetterReason::Failed, 1);
    let pushed = {
        let url = url.clone();
        let dlq = queue.dlq();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let client = redis::Client::open(url.as_str()).unwrap();
            let mut raw = client.get_multiplexed_async_connection().await.unwrap();
            let _: () = raw.rpush(dlq, late).await.unwrap();
        })
    };
    let report = transport
        .redrive(
            &queue.dlq(),
            &RedriveOptions::new().wait(Duration::from_secs(30)),
        )
        .await
        .unwrap();
    pushed.await.unwrap();
    assert_eq!(report.moved, 1, "{report:?}");
    assert_eq!(ids(&queue, &queue.name).await, ["w-0"]);
}

// ---------------------------------------------------------------- interop

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_dead_letters_babel_idem_redrives_with_bypass_and_python_sees_replays() {
    const TEST: &str = "python_dead_letters_babel_idem_redrives";
    let (Some(url), Some(python)) = (server_url(REDIS_URL, TEST), python(TEST)) else {
        return;
    };
    let queue = Queue::new(&url);
    let sent = python_publishes(&python, PEER, &url, &queue.name, 4).await;
    let out = peer(
        &python,
        &["consume", &url, &queue.name, "0.5", "--fail", "1"],
    )
    .await;
    assert!(out["received"].as_array().unwrap().is_empty(), "{out}");
    eventually("Python dead-lettered every message", || async {
        queue.len(&queue.dlq()).await == 4
    })
    .await;

    let transport = queue.transport().await;
    let report = transport
        .redrive(&queue.dlq(), &RedriveOptions::new().bypass(true))
        .await
        .unwrap();
    assert_eq!(report.moved, 4, "{report:?}");
    assert!(
        report
            .items
            .iter()
            .all(|i| i.reason == "failed" && i.bypassed)
    );

    let out = python_consumes(&python, PEER, &url, &queue.name).await;
    let received = out["received"].as_array().unwrap();
    assert_eq!(received.len(), 4, "{out}");
    let sent_ids: Vec<&str> = sent
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    for message in received {
        assert!(
            sent_ids.contains(&message["id"].as_str().unwrap()),
            "{message}"
        );
        assert_eq!(message["replay"], true, "{message}");
        assert_eq!(message["attempts"], 0, "{message}");
    }
    assert_eq!(queue.len(&queue.dlq()).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn babel_idem_dead_letters_python_redrives_and_babel_idem_runs_them_again() {
    const TEST: &str = "babel_idem_dead_letters_python_redrives";
    let (Some(url), Some(python)) = (server_url(REDIS_URL, TEST), python(TEST)) else {
        return;
    };
    let queue = Queue::new(&url);
    let transport = queue.transport().await;
    let mut sent = Vec::new();
    for n in 0..4 {
        let envelope = Envelope::new(URN, json!({"n": n})).with_queue(&queue.name);
        sent.push(envelope.meta.id.clone().unwrap());
        transport
            .publish(&queue.name, &envelope.to_vec())
            .await
            .unwrap();
    }
    let failing = Consumer::builder(
        recording_router(SeenLog::default(), true),
        transport.clone(),
        &queue.name,
    )
    .build()
    .unwrap();
    let report = run_until_idle(&failing, QUIET).await;
    assert_eq!(report.dead_lettered, 4, "{report:?}");

    let out = peer(&python, &["redrive", &url, &queue.dlq(), "--bypass", "1"]).await;
    assert_eq!(out["redriven"], 4, "{out}");

    let log = SeenLog::default();
    let consumer = Consumer::builder(
        recording_router(Arc::clone(&log), false),
        transport,
        &queue.name,
    )
    .build()
    .unwrap();
    let report = run_until_idle(&consumer, QUIET).await;
    assert_eq!(report.acked, 4, "{report:?}");
    let seen = log.lock().unwrap().clone();
    let mut seen_ids: Vec<String> = seen.iter().map(|s| s.id.clone()).collect();
    seen_ids.sort();
    sent.sort();
    assert_eq!(seen_ids, sent);
    assert!(seen.iter().all(|s| s.attempts == 0 && s.replay), "{seen:?}");
}

// ---------------------------------------------------------------- outage

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_lost_mid_run_stops_the_redrive_with_what_moved_and_loses_nothing() {
    const TEST: &str = "a_server_lost_mid_run";
    let Some(mut server) = OwnRedis::reserve(TEST) else {
        return;
    };
    server.start();
    let url = server.url();
    let queue = Queue::new(&url);
    let total = 600;
    let records: Vec<Vec<u8>> = (0..total)
        .map(|n| {
            record(
                &format!("o-{n}"),
                URN,
                &queue.name,
                DeadLetterReason::Failed,
                1,
            )
        })
        .collect();
    push(&queue, &queue.dlq(), &records).await;
    let transport = RedisTransport::builder()
        .timeout(Duration::from_millis(500))
        .reconnect_attempts(1)
        .connect(&url)
        .await
        .unwrap();
    let options = RedriveOptions::new().rate(200);
    let dlq = queue.dlq();
    let run = tokio::spawn(async move { transport.redrive(&dlq, &options).await });
    eventually("some messages moved", || async {
        queue.len(&queue.name).await >= 50
    })
    .await;
    server.kill();
    let error = run
        .await
        .unwrap()
        .expect_err("the server went away mid-run");
    let RedriveError::Stopped { report, .. } = &error else {
        panic!("stopped with a report: {error}");
    };
    assert!(report.moved >= 50 && report.moved < total, "{report:?}");
    assert!(
        error.to_string().contains("still in the dead-letter queue"),
        "{error}"
    );

    // appendfsync always: what the server acknowledged is still there.
    server.start();
    let (work, dead) = (
        ids(&queue, &queue.name).await,
        ids(&queue, &queue.dlq()).await,
    );
    // The move in flight when the server died may have been applied with
    // its answer lost: then it is on the work list and not in the report.
    // Either way it is in one list only (below).
    let on_work = work.len();
    assert!(
        on_work == report.moved || on_work == report.moved + 1,
        "{on_work} on the work list, {} reported moved",
        report.moved
    );
    let mut all: Vec<String> = work.into_iter().chain(dead).collect();
    all.sort();
    let mut expected: Vec<String> = (0..total).map(|n| format!("o-{n}")).collect();
    expected.sort();
    assert_eq!(
        all, expected,
        "every message is in exactly one of the two lists"
    );

    // Run again: it picks up where the first stopped.
    let transport = queue.transport().await;
    let again = transport
        .redrive(&queue.dlq(), &RedriveOptions::new())
        .await
        .unwrap();
    assert_eq!(again.moved, total - on_work);
    assert_eq!(queue.len(&queue.name).await, total);
}

// ---------------------------------------------------------------- numbers beyond a float

/// A 400-digit integer: no `f64` holds it.
fn huge_integer() -> String {
    format!("1{}", "7".repeat(399))
}

/// Records the Python SDK dead-letters holding numbers no `f64` holds:
/// poison bodies it splices as written, two without identity and an
/// envelope (the family refuses a number that is not a finite double).
/// Each is read as the poison it is, the envelope with its id and URN;
/// neither SDK redrives one as an envelope; each body goes back byte for
/// byte when asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_records_python_writes_with_numbers_beyond_a_float_are_read_and_give_back_their_bodies()
 {
    const TEST: &str = "records_with_numbers_beyond_a_float";
    let (Some(url), Some(python)) = (server_url(REDIS_URL, TEST), python(TEST)) else {
        return;
    };
    let queue = Queue::new(&url);
    let transport = queue.transport().await;
    let huge = huge_integer();
    let bodies = [
        r#"{"order":"p-1","amount":1e400}"#.to_owned(),
        format!(r#"{{"order": "p-2", "n": {huge}, "n": -1E+400, "x": [2.5e-400]}}"#),
        format!(
            r#"{{"job":"{URN}","trace_id":"t-big","data":{{"n":{huge}}},"meta":{{"id":"big-1","queue":"{}","lang":"rust","schema_version":1,"created_at":1}},"attempts":0}}"#,
            queue.name
        ),
    ];
    for body in &bodies {
        transport
            .publish(&queue.name, body.as_bytes())
            .await
            .unwrap();
    }
    peer(&python, &["consume", &url, &queue.name, "0.5"]).await;
    eventually("Python dead-lettered every message", || async {
        queue.len(&queue.dlq()).await == 3
    })
    .await;
    let records = values(&queue, &queue.dlq()).await;
    for body in &bodies {
        // The family's splice keeps every byte of the body.
        let kept = &body.as_bytes()[..body.len() - 1];
        assert!(
            records.iter().any(|record| record.starts_with(kept)),
            "{body} spliced as written"
        );
    }

    let looked = transport.dead_letters(&queue.dlq(), None).await.unwrap();
    assert_eq!(looked.len(), 3);
    for record in &looked {
        let body = String::from_utf8_lossy(&record.body);
        assert_eq!(
            record.kind,
            babel_idem::redrive::RecordKind::Poison,
            "{body}"
        );
        assert_eq!(record.reason, "poison", "{body}");
        assert_eq!(
            record.original_queue.as_deref(),
            Some(queue.name.as_str()),
            "{body}"
        );
        assert!(record.error.is_some(), "{body}");
    }
    let envelope = looked
        .iter()
        .find(|record| record.id.as_deref() == Some("big-1"))
        .expect("the envelope's id read from its record");
    assert_eq!(envelope.urn.as_deref(), Some(URN));

    // Neither SDK redrives them as envelopes: both leave every record.
    let python_dlq = queue.key("py.dlq");
    push(&queue, &python_dlq, &records).await;
    let out = peer(&python, &["redrive", &url, &python_dlq]).await;
    assert_eq!(out["redriven"], 0, "{out}");
    let report = transport
        .redrive(&queue.dlq(), &RedriveOptions::new())
        .await
        .unwrap();
    assert_eq!((report.moved, report.left), (0, 3), "{report:?}");
    assert_eq!(values(&queue, &queue.dlq()).await, records);

    // Asked to, each body goes back to its queue as written.
    let report = transport
        .redrive(&queue.dlq(), &RedriveOptions::new().include_poison(true))
        .await
        .unwrap();
    assert_eq!((report.moved, report.left), (3, 0), "{report:?}");
    let mut back: Vec<Vec<u8>> = values(&queue, &queue.name).await;
    back.sort();
    let mut sent: Vec<Vec<u8>> = bodies.iter().map(|b| b.clone().into_bytes()).collect();
    sent.sort();
    assert_eq!(back, sent);
    assert_eq!(queue.len(&queue.dlq()).await, 0);
    let mut raw = queue.raw().await;
    let _: () = raw.del(&[&python_dlq]).await.unwrap();
}
