//! Every envelope case of a BabelQueue conformance manifest, fed to
//! `Router::dispatch`: a valid case is acked by the handler registered for
//! its URN (and the handler sees the expected URN, data and attempts); an
//! invalid case is dead-lettered as poison, its bytes unchanged.
//!
//! The cases are this repository's own (`tests/fixtures/conformance`), and
//! the upstream BabelQueue suite's when `BABEL_IDEM_CONFORMANCE_DIR` names
//! its folder; without it the test says on stderr that it skipped them.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use babel_idem::envelope::DeadLetterReason;
use babel_idem::router::{DispatchError, UnknownUrnStrategy};
use babel_idem::{Delivery, Disposition, Envelope, Router, Urn};
use serde_json::Value;

fn own_fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/conformance")
}

/// What each handler saw: (URN, data, attempts).
type Seen = Arc<Mutex<Vec<(String, Value, u64)>>>;

/// A handler that records what it was given and succeeds.
fn recorder(seen: Seen) -> impl Fn(Envelope) -> std::future::Ready<Result<(), anyhow::Error>> {
    move |env: Envelope| {
        seen.lock().unwrap().push((
            env.urn().to_owned(),
            Value::Object(env.data.clone()),
            env.attempts,
        ));
        std::future::ready(Ok(()))
    }
}

#[tokio::test]
async fn every_case_of_the_own_fixtures_gets_its_disposition() {
    every_case_gets_its_disposition(&own_fixtures()).await;
}

#[tokio::test]
async fn every_case_of_the_upstream_suite_gets_its_disposition_when_named() {
    match std::env::var_os("BABEL_IDEM_CONFORMANCE_DIR") {
        Some(dir) => every_case_gets_its_disposition(Path::new(&dir)).await,
        None => {
            // Straight to stderr, past the harness's capture: shown when the test passes.
            let _ = std::io::Write::write_all(
                &mut std::io::stderr(),
                b"skipping upstream conformance: BABEL_IDEM_CONFORMANCE_DIR is unset\n",
            );
        }
    }
}

async fn every_case_gets_its_disposition(dir: &Path) {
    let manifest_path = dir.join("manifest.json");
    let manifest: Value = serde_json::from_slice(
        &std::fs::read(&manifest_path)
            .unwrap_or_else(|e| panic!("read {}: {e}", manifest_path.display())),
    )
    .expect("manifest.json is JSON");
    let cases = manifest["cases"].as_array().expect("manifest has cases");
    assert!(!cases.is_empty(), "the suite has envelope cases");

    // One recording handler per URN a valid case expects. An unknown URN is
    // released: neither an ack nor a poison dead letter, so a case can only
    // pass through the disposition it is meant to get.
    let urns: BTreeSet<&str> = cases
        .iter()
        .filter(|case| case["valid"] == Value::Bool(true))
        .map(|case| {
            case["expect"]["urn"]
                .as_str()
                .expect("a valid case expects a URN")
        })
        .collect();
    let seen: Seen = Arc::default();
    let router = urns
        .iter()
        .fold(Router::builder(), |builder, urn| {
            let urn = Urn::parse(urn.to_string()).expect("an expected URN is well formed");
            builder.route(urn, recorder(Arc::clone(&seen)))
        })
        .on_unknown_urn(UnknownUrnStrategy::Release)
        .build()
        .expect("distinct routes");

    let (mut acked, mut poisoned) = (0, 0);
    for case in cases {
        let name = case["name"].as_str().expect("case name");
        let file = dir.join(case["file"].as_str().expect("case file"));
        let bytes = std::fs::read(&file).unwrap_or_else(|e| panic!("{name}: {e}"));
        seen.lock().unwrap().clear();

        let disposition = router.dispatch(&bytes, Delivery::new()).await;

        if case["valid"] == Value::Bool(true) {
            let expect = &case["expect"];
            assert!(
                matches!(disposition, Disposition::Ack),
                "{name}: a valid envelope with a registered handler is acked, got {disposition}"
            );
            let seen = seen.lock().unwrap();
            assert_eq!(seen.len(), 1, "{name}: the handler ran once");
            let (urn, data, attempts) = &seen[0];
            // Each field the case expects; a case may leave `data` or
            // `attempts` out.
            assert_eq!(urn, expect["urn"].as_str().unwrap(), "{name}: urn");
            if let Some(expected) = expect.get("data") {
                assert_eq!(data, expected, "{name}: data");
            }
            if let Some(expected) = expect.get("attempts") {
                assert_eq!(Some(*attempts), expected.as_u64(), "{name}: attempts");
            }
            acked += 1;
        } else {
            let Disposition::DeadLetter(dead) = disposition else {
                panic!("{name}: an invalid envelope is poison, got {disposition}");
            };
            assert_eq!(dead.reason, DeadLetterReason::Poison, "{name}");
            assert!(
                matches!(dead.error, DispatchError::Poison(_)),
                "{name}: {}",
                dead.error
            );
            assert_eq!(dead.body, bytes, "{name}: the DLQ gets the bytes unchanged");
            assert!(seen.lock().unwrap().is_empty(), "{name}: no handler ran");
            poisoned += 1;
        }
    }
    assert!(
        acked > 0 && poisoned > 0,
        "the suite has valid and invalid cases ({acked} acked, {poisoned} poison)"
    );
}
