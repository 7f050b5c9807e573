//! Every envelope case of the upstream BabelQueue conformance suite, fed to
//! `Router::dispatch`: a valid case is acked by the handler registered for
//! its URN (and the handler sees the expected URN, data and attempts); an
//! invalid case is dead-lettered as poison, its bytes unchanged.
//!
//! The suite is read from `BABEL_IDEM_CONFORMANCE_DIR`, by default
//! `../shared/conformance` next to the workspace. When the folder is absent the
//! test says so on stderr and checks nothing.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use babel_idem::envelope::DeadLetterReason;
use babel_idem::router::{DispatchError, UnknownUrnStrategy};
use babel_idem::{Delivery, Disposition, Envelope, Router, urn};
use serde_json::Value;

fn suite_dir() -> PathBuf {
    match std::env::var_os("BABEL_IDEM_CONFORMANCE_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/conformance"),
    }
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
async fn every_conformance_case_gets_its_disposition() {
    let dir = suite_dir();
    let manifest_path = dir.join("manifest.json");
    if !manifest_path.is_file() {
        // Written straight to stderr so it shows even though the test passes.
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED router_conformance: no conformance suite at {} (set BABEL_IDEM_CONFORMANCE_DIR)",
            dir.display()
        );
        return;
    }
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(&manifest_path).expect("read manifest.json"))
            .expect("manifest.json is JSON");
    let cases = manifest["cases"].as_array().expect("manifest has cases");
    assert!(!cases.is_empty(), "the suite has envelope cases");

    let seen: Seen = Arc::default();
    // An unknown URN is released: neither an ack nor a poison dead letter, so
    // a case can only pass through the disposition it is meant to get.
    let router = Router::builder()
        .route(
            urn!("urn:babel:orders:created"),
            recorder(Arc::clone(&seen)),
        )
        .route(
            urn!("urn:babel:catalog:item.indexed"),
            recorder(Arc::clone(&seen)),
        )
        .on_unknown_urn(UnknownUrnStrategy::Release)
        .build()
        .expect("two distinct routes");

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
            assert_eq!(urn, expect["urn"].as_str().unwrap(), "{name}: urn");
            assert_eq!(data, &expect["data"], "{name}: data");
            assert_eq!(
                Some(*attempts),
                expect["attempts"].as_u64(),
                "{name}: attempts"
            );
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
