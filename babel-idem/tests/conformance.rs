//! The conformance runner on this repository's own fixtures, on the upstream
//! suite when `BABEL_IDEM_CONFORMANCE_DIR` names it, and on broken copies
//! that it must report as failures.

use std::fs;
use std::path::{Path, PathBuf};

use babel_idem::conformance::{self, Block, ConformanceError, Report};
use serde_json::{Value, json};

const ENV_VAR: &str = "BABEL_IDEM_CONFORMANCE_DIR";

fn own_fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/conformance")
}

fn manifest_of(dir: &Path) -> Value {
    let text = fs::read_to_string(dir.join("manifest.json")).expect("manifest is readable");
    serde_json::from_str(&text).expect("manifest is JSON")
}

/// The binding blocks the runner checks.
const BINDINGS: [&str; 3] = ["redis", "rabbitmq", "kafka"];

/// How many outcomes the binding block `block` of `manifest` gives when
/// its binding is built: one per static check, one per `kafka`
/// reconciliation case.
fn binding_outcomes(manifest: &Value, block: &str) -> usize {
    let block = &manifest[block];
    let checks = ["payload_identity", "property_projection"]
        .iter()
        .filter(|check| block[**check].is_object())
        .count();
    let reconciliations = block["attempts_reconciliation"]["cases"]
        .as_array()
        .map_or(0, Vec::len);
    checks + reconciliations
}

/// How many outcomes a full run of `manifest` must report: each envelope
/// case, the dedupe key, each sequence, every outcome of a binding block
/// and each `payload_schema` case. A runner that skipped one would not
/// match.
fn case_count(manifest: &Value) -> usize {
    let cases = manifest["cases"].as_array().map_or(0, Vec::len);
    let sequences = manifest["idempotency"]["sequences"]["cases"]
        .as_array()
        .map_or(0, Vec::len);
    let bindings: usize = BINDINGS
        .iter()
        .map(|block| binding_outcomes(manifest, block))
        .sum();
    let payload_schema = manifest["payload_schema"]["cases"]
        .as_array()
        .map_or(0, Vec::len);
    cases + 1 + sequences + bindings + payload_schema
}

/// The outcomes of the binding blocks this build reports as not
/// applicable.
fn bindings_left_out(report: &Report, manifest: &Value) -> usize {
    report
        .skipped_blocks()
        .filter(|(block, _)| BINDINGS.contains(block))
        .map(|(block, _)| binding_outcomes(manifest, block))
        .sum()
}

fn assert_all_pass(dir: &Path) -> Report {
    let report = conformance::run(dir).unwrap_or_else(|error| panic!("{error}"));
    println!("{report}");
    let manifest = manifest_of(dir);
    assert_eq!(
        report.outcomes().len() + bindings_left_out(&report, &manifest),
        case_count(&manifest)
    );
    assert_eq!(report.failed(), 0, "failures:\n{report}");
    assert!(report.is_success());
    // Every top-level block is in the report by name: checked, or not applicable.
    let text = report.to_string();
    for block in manifest.as_object().unwrap().keys() {
        if matches!(block.as_str(), "description" | "schema_version") {
            continue;
        }
        let named = report
            .outcomes()
            .iter()
            .any(|outcome| outcome.block.as_str().split('.').next() == Some(block.as_str()))
            || report.skipped_blocks().any(|(skipped, _)| skipped == block);
        assert!(named, "block {block} is not in the report:\n{text}");
    }
    report
}

#[test]
fn own_fixtures_all_pass() {
    let report = assert_all_pass(&own_fixtures());
    let summary = report.to_string();
    let last = summary.lines().last().unwrap();
    assert_eq!(
        last,
        format!("{} passed, 0 failed", report.outcomes().len())
    );
    let mut blocks = vec![
        Block::Envelope,
        Block::DedupKey,
        Block::Sequence,
        Block::PayloadSchema,
    ];
    if cfg!(all(feature = "redis-transport", feature = "amqp-transport")) {
        blocks.extend([Block::Redis, Block::Rabbitmq]);
    }
    if cfg!(feature = "kafka-transport") {
        blocks.push(Block::Kafka);
    }
    for block in blocks {
        assert!(
            report
                .outcomes()
                .iter()
                .any(|outcome| outcome.block == block)
        );
    }
}

#[test]
fn upstream_suite_all_pass_when_named() {
    match std::env::var_os(ENV_VAR) {
        Some(dir) => {
            println!("upstream conformance run: {}", Path::new(&dir).display());
            assert_all_pass(Path::new(&dir));
        }
        None => {
            // Straight to stderr, past the harness's capture: shown when the test passes.
            let _ = std::io::Write::write_all(
                &mut std::io::stderr(),
                format!("skipping upstream conformance: {ENV_VAR} is unset\n").as_bytes(),
            );
        }
    }
}

#[test]
fn rejections_record_their_reason() {
    let report = conformance::run(own_fixtures()).unwrap();
    let missing_urn = report
        .outcomes()
        .iter()
        .find(|outcome| outcome.name == "invalid-missing-urn")
        .expect("the case is in the report");
    assert!(missing_urn.passed);
    let reason = missing_urn.reason.as_deref().unwrap_or_default();
    assert!(reason.contains("missing_urn"), "{reason}");
    assert!(
        report
            .to_string()
            .contains("pass cases/invalid-missing-urn: rejected (missing_urn)")
    );
}

/// A copy of our fixtures in a fresh temp folder, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(test: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "babel-idem-conformance-{}-{test}",
            std::process::id()
        ));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("fixtures")).unwrap();
        for entry in fs::read_dir(own_fixtures().join("fixtures")).unwrap() {
            let entry = entry.unwrap();
            fs::copy(entry.path(), dir.join("fixtures").join(entry.file_name())).unwrap();
        }
        fs::copy(
            own_fixtures().join("manifest.json"),
            dir.join("manifest.json"),
        )
        .unwrap();
        Scratch(dir)
    }

    /// Rewrites the manifest through `edit`.
    fn edit_manifest(&self, edit: impl FnOnce(&mut Value)) {
        let mut manifest = manifest_of(&self.0);
        edit(&mut manifest);
        self.write(
            "manifest.json",
            &serde_json::to_vec_pretty(&manifest).unwrap(),
        );
    }

    fn write(&self, file: &str, bytes: &[u8]) {
        fs::write(self.0.join(file), bytes).unwrap();
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn case_mut<'a>(manifest: &'a mut Value, name: &str) -> &'a mut Value {
    manifest["cases"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|case| case["name"] == name)
        .unwrap_or_else(|| panic!("no case {name}"))
}

fn sequence_mut<'a>(manifest: &'a mut Value, name: &str) -> &'a mut Value {
    manifest["idempotency"]["sequences"]["cases"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|case| case["name"] == name)
        .unwrap_or_else(|| panic!("no sequence {name}"))
}

/// The failure reason of `name`, asserting it failed.
fn failure<'a>(report: &'a Report, name: &str) -> &'a str {
    failure_in(report, None, name)
}

/// The failure reason of `name` of `block` (any block when `None`),
/// asserting it failed.
fn failure_in<'a>(report: &'a Report, block: Option<Block>, name: &str) -> &'a str {
    let outcome = report
        .outcomes()
        .iter()
        .find(|outcome| outcome.name == name && block.is_none_or(|block| outcome.block == block))
        .unwrap_or_else(|| panic!("{name} is not in the report"));
    assert!(!outcome.passed, "{name} passed but must fail:\n{report}");
    outcome.reason.as_deref().unwrap_or_default()
}

/// The RabbitMQ projection is compared header by header and with native
/// types: an integer header expected as a string, or a property that
/// differs, fails the block.
#[cfg(feature = "amqp-transport")]
#[test]
fn a_projection_that_differs_fails_the_rabbitmq_block() {
    let scratch = Scratch::new("projection");
    scratch.edit_manifest(|manifest| {
        let projection = &mut manifest["rabbitmq"]["property_projection"];
        projection["headers"]["x-attempts"] = json!("1");
        projection["properties"]["app_id"] = json!("another-app");
    });
    let report = conformance::run(&scratch.0).unwrap();
    let reason = failure(&report, "property_projection");
    assert!(reason.contains("header x-attempts"), "{reason}");
    assert!(reason.contains("property app_id"), "{reason}");
}

/// The Kafka projection is compared header by header, and a header the
/// binding writes beyond the block's fails it too; a reconciliation case
/// that expects the body's count over the header's fails.
#[cfg(feature = "kafka-transport")]
#[test]
fn a_projection_or_reconciliation_that_differs_fails_the_kafka_block() {
    let scratch = Scratch::new("kafka");
    scratch.edit_manifest(|manifest| {
        let headers = &mut manifest["kafka"]["property_projection"]["headers"];
        headers["bq-source-lang"] = json!("go");
        headers.as_object_mut().unwrap().remove("bq-attempts");
        manifest["kafka"]["attempts_reconciliation"]["cases"][0]["expected_attempts"] = json!(7);
    });
    let report = conformance::run(&scratch.0).unwrap();
    let reason = failure_in(&report, Some(Block::Kafka), "property_projection");
    assert!(reason.contains("header bq-source-lang"), "{reason}");
    assert!(reason.contains("header bq-attempts: written"), "{reason}");
    let reason = failure(
        &report,
        "attempts_reconciliation/header-zero-overrides-body",
    );
    assert!(reason.contains("dispatched with 0, expected 7"), "{reason}");
}

/// Without the Kafka binding its block is named as not applicable, once,
/// however many cases it holds.
#[cfg(not(feature = "kafka-transport"))]
#[test]
fn the_kafka_block_without_its_binding_is_listed_once_as_not_applicable() {
    let report = conformance::run(own_fixtures()).unwrap();
    let kafka: Vec<(&str, &str)> = report
        .skipped_blocks()
        .filter(|(block, _)| *block == "kafka")
        .collect();
    assert_eq!(
        kafka,
        [("kafka", "built without the feature kafka-transport")]
    );
}

/// A block of a binding babel-idem lacks is named in the report as not
/// applicable, never passed and never an error.
#[test]
fn a_block_of_a_binding_babel_idem_lacks_is_listed_as_not_applicable() {
    let scratch = Scratch::new("not_applicable");
    scratch.edit_manifest(|manifest| {
        manifest["sqs"] = json!({"property_projection": {"attributes": {}}});
        manifest["mqtt"] = json!({});
    });
    let report = conformance::run(&scratch.0).unwrap();
    let skipped: Vec<(&str, &str)> = report.skipped_blocks().collect();
    assert!(skipped.contains(&("sqs", "babel-idem has no Amazon SQS binding")));
    assert!(skipped.contains(&("mqtt", "a block this runner does not know")));
    let text = report.to_string();
    assert!(
        text.contains("n/a sqs: babel-idem has no Amazon SQS binding"),
        "{text}"
    );
    assert!(
        report
            .outcomes()
            .iter()
            .all(|outcome| outcome.name != "sqs")
    );
    assert!(report.is_success());
}

#[test]
fn a_broken_manifest_is_reported_case_by_case() {
    let scratch = Scratch::new("broken");
    scratch.edit_manifest(|manifest| {
        sequence_mut(manifest, "duplicate-delivery-runs-once")["expected_effects"] = json!(2);
        sequence_mut(manifest, "throw-leaves-id-unmarked")["deliveries"][0]["expect_effect"] =
            json!("skip");
        sequence_mut(manifest, "forget-allows-rerun")["deliveries"][2]["expect_effect"] =
            json!("skip");
        sequence_mut(manifest, "redelivery-storm-is-noop")["deliveries"][1]["expect_effect"] =
            json!("run");
        case_mut(manifest, "invoice-issued")["valid"] = json!(false);
        case_mut(manifest, "invalid-missing-urn")["valid"] = json!(true);
        case_mut(manifest, "urn-alias")["expect"]["urn"] = json!("urn:babel:invoices:other");
        case_mut(manifest, "dead-lettered-poison")["expect"]["dead_letter"]["reason"] =
            json!("failed");
        case_mut(manifest, "unicode-and-big-numbers")["expect"]["data"]["u64_max"] = json!(0);
        case_mut(manifest, "meta-id-empty")["expect"]["priority"] = json!(1);
        case_mut(manifest, "invalid-data-array")["rejected_by"] = json!("missing_urn");
        manifest["idempotency"]["dedup_key"]["expected_key"] =
            json!("2e7d4b1a-9c3f-4a6e-8b5d-0f1e2d3c4b5a");
    });

    let report = conformance::run(&scratch.0).unwrap();
    println!("{report}");
    assert!(!report.is_success());
    assert_eq!(report.failed(), 12, "{report}");
    let own = manifest_of(&own_fixtures());
    assert_eq!(
        report.outcomes().len() + bindings_left_out(&report, &own),
        case_count(&own)
    );

    assert!(failure(&report, "duplicate-delivery-runs-once").contains("1 effects, expected 2"));
    let throw = failure(&report, "throw-leaves-id-unmarked");
    assert!(
        throw.contains("delivery 1 (meta_id \"inv-5002\"): expected skip, but the handler ran"),
        "{throw}"
    );
    assert!(failure(&report, "forget-allows-rerun").contains("delivery 3"));
    let storm = failure(&report, "redelivery-storm-is-noop");
    assert!(
        storm.contains("expected run, but the handler was skipped"),
        "{storm}"
    );
    assert!(
        failure(&report, "invoice-issued").contains("accepted an envelope that must be rejected")
    );
    assert!(failure(&report, "invalid-missing-urn").contains("rejected a valid envelope"));
    assert!(failure(&report, "urn-alias").contains("urn: expected \"urn:babel:invoices:other\""));
    assert!(failure(&report, "dead-lettered-poison").contains("dead_letter.reason"));
    assert!(failure(&report, "unicode-and-big-numbers").contains("data: expected"));
    assert!(
        failure(&report, "meta-id-empty")
            .contains("expect.priority is not a field this runner checks")
    );
    let rule = failure(&report, "invalid-data-array");
    assert!(rule.contains("rejected by data_not_object"), "{rule}");
    assert!(failure(&report, "dedup_key").contains("message_id()"));

    let text = report.to_string();
    assert!(text.contains("FAIL idempotency.sequences/duplicate-delivery-runs-once: "));
    assert!(text.lines().last().unwrap().ends_with("passed, 12 failed"));
}

fn payload_case_mut<'a>(manifest: &'a mut Value, name: &str) -> &'a mut Value {
    manifest["payload_schema"]["cases"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|case| case["name"] == name)
        .unwrap_or_else(|| panic!("no payload_schema case {name}"))
}

/// The `payload_schema` block is checked, not skipped: every case is an
/// outcome of its block, a rejection records the violation, and it is
/// never listed as not applicable.
#[test]
fn the_payload_schema_block_is_checked_case_by_case() {
    let report = conformance::run(own_fixtures()).unwrap();
    let cases = manifest_of(&own_fixtures())["payload_schema"]["cases"]
        .as_array()
        .unwrap()
        .len();
    let outcomes: Vec<_> = report
        .outcomes()
        .iter()
        .filter(|outcome| outcome.block == Block::PayloadSchema)
        .collect();
    assert_eq!(outcomes.len(), cases);
    assert!(cases >= 7);
    assert!(outcomes.iter().all(|outcome| outcome.passed), "{report}");
    assert!(
        report.to_string().contains(
            "pass payload_schema/invalid-array-item: rejected: lines[1].quantity: below_minimum"
        ),
        "{report}"
    );
    assert!(
        report
            .skipped_blocks()
            .all(|(block, _)| block != "payload_schema")
    );
}

/// A case whose verdict or violation text differs from the validator's
/// fails, each with what it found; a schema that is not an object fails
/// every case of the block.
#[test]
fn a_payload_schema_case_that_differs_fails() {
    let scratch = Scratch::new("payload-schema");
    scratch.edit_manifest(|manifest| {
        payload_case_mut(manifest, "valid-minimal")["valid"] = json!(false);
        payload_case_mut(manifest, "invalid-enum")["valid"] = json!(true);
        payload_case_mut(manifest, "invalid-const")["violation"] = json!("channel: not_in_enum");
    });
    let report = conformance::run(&scratch.0).unwrap();
    assert_eq!(report.failed(), 3, "{report}");
    let block = Some(Block::PayloadSchema);
    assert!(
        failure_in(&report, block, "valid-minimal").contains("accepted data that must be rejected")
    );
    assert_eq!(
        failure_in(&report, block, "invalid-enum"),
        "rejected valid data: currency: not_in_enum"
    );
    assert_eq!(
        failure_in(&report, block, "invalid-const"),
        "rejected with \"channel: wrong_const\", but the case expects \"channel: not_in_enum\""
    );

    scratch.edit_manifest(|manifest| manifest["payload_schema"]["schema"] = json!(["order_id"]));
    let report = conformance::run(&scratch.0).unwrap();
    let cases = manifest_of(&scratch.0)["payload_schema"]["cases"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(report.failed(), cases, "{report}");
    assert!(
        failure_in(&report, block, "valid-full").contains(
            "the block's schema is unusable: a schema must be a JSON object, not an array"
        )
    );
}

#[test]
fn a_dedup_key_on_another_field_fails() {
    let scratch = Scratch::new("key-field");
    scratch.edit_manifest(|manifest| {
        manifest["idempotency"]["dedup_key"]["key_field"] = json!("trace_id");
    });
    let report = conformance::run(&scratch.0).unwrap();
    assert!(failure(&report, "dedup_key").contains("keys on `meta.id`"));
    assert_eq!(report.failed(), 1);
}

#[test]
fn a_fixture_that_loses_its_validity_fails_its_case() {
    let scratch = Scratch::new("fixture");
    // The case still says valid: true, but the envelope now has a blank trace_id.
    let mut envelope: Value =
        serde_json::from_slice(&fs::read(scratch.0.join("fixtures/invoice-issued.json")).unwrap())
            .unwrap();
    envelope["trace_id"] = json!("");
    scratch.write(
        "fixtures/invoice-issued.json",
        &serde_json::to_vec(&envelope).unwrap(),
    );
    let report = conformance::run(&scratch.0).unwrap();
    assert!(failure(&report, "invoice-issued").contains("blank"));
    assert!(failure(&report, "dedup_key").contains("is rejected"));
}

#[test]
fn a_missing_folder_is_a_read_error_naming_the_manifest() {
    let error = conformance::run("/nonexistent/babel-idem-conformance").unwrap_err();
    let ConformanceError::Read { path, .. } = &error else {
        panic!("unexpected error: {error}");
    };
    assert!(path.ends_with("manifest.json"));
    assert!(
        error
            .to_string()
            .contains("/nonexistent/babel-idem-conformance/manifest.json")
    );
}

#[test]
fn a_manifest_that_is_not_json_is_a_typed_error() {
    let scratch = Scratch::new("not-json");
    scratch.write("manifest.json", b"{\"cases\": [");
    let error = conformance::run(&scratch.0).unwrap_err();
    assert!(
        matches!(error, ConformanceError::Manifest { .. }),
        "{error}"
    );
    assert!(error.to_string().contains("manifest.json"));
}

#[test]
fn a_block_of_the_wrong_shape_is_a_typed_error() {
    let scratch = Scratch::new("shape");
    scratch.edit_manifest(|manifest| {
        sequence_mut(manifest, "interleaved-ids")["expected_effects"] = json!("three");
    });
    let error = conformance::run(&scratch.0).unwrap_err();
    assert!(
        matches!(error, ConformanceError::Manifest { .. }),
        "{error}"
    );

    scratch.edit_manifest(|manifest| {
        sequence_mut(manifest, "interleaved-ids")["expected_effects"] = json!(3);
        sequence_mut(manifest, "interleaved-ids")["deliveries"][0]["expect_effect"] =
            json!("maybe");
    });
    let error = conformance::run(&scratch.0).unwrap_err();
    assert!(error.to_string().contains("maybe"), "{error}");
}

#[test]
fn a_missing_block_is_a_typed_error() {
    for (block, remove) in [
        ("cases", &["cases"][..]),
        ("idempotency", &["idempotency"][..]),
        ("idempotency.dedup_key", &["idempotency", "dedup_key"][..]),
        ("idempotency.sequences", &["idempotency", "sequences"][..]),
    ] {
        let scratch = Scratch::new(&format!("block-{block}"));
        scratch.edit_manifest(|manifest| {
            let (last, parents) = remove.split_last().unwrap();
            let parent = parents.iter().fold(manifest, |value, key| &mut value[*key]);
            parent.as_object_mut().unwrap().remove(*last);
        });
        match conformance::run(&scratch.0) {
            Err(ConformanceError::MissingBlock { block: missing, .. }) => {
                assert_eq!(missing, block)
            }
            other => panic!("removing {block}: {other:?}"),
        }
    }
}

#[test]
fn a_missing_fixture_is_a_read_error_naming_it() {
    let scratch = Scratch::new("missing-fixture");
    fs::remove_file(scratch.0.join("fixtures/urn-alias.json")).unwrap();
    let error = conformance::run(&scratch.0).unwrap_err();
    let ConformanceError::Read { path, .. } = &error else {
        panic!("unexpected error: {error}");
    };
    assert!(
        path.ends_with("fixtures/urn-alias.json"),
        "{}",
        path.display()
    );
}

#[test]
fn a_fixture_outside_the_folder_is_refused() {
    for file in [
        "../manifest.json",
        "/etc/hostname",
        "fixtures/../../x.json",
        "",
    ] {
        let scratch = Scratch::new("outside");
        scratch.edit_manifest(|manifest| case_mut(manifest, "urn-alias")["file"] = json!(file));
        match conformance::run(&scratch.0) {
            Err(ConformanceError::FixtureOutsideFolder { file: named, .. }) => {
                assert_eq!(named, file)
            }
            other => panic!("{file:?}: {other:?}"),
        }
    }
}

#[test]
fn a_manifest_with_empty_blocks_is_not_a_success() {
    let scratch = Scratch::new("empty");
    scratch.edit_manifest(|manifest| {
        manifest["cases"] = json!([]);
        manifest["idempotency"]["sequences"]["cases"] = json!([]);
        let blocks = manifest.as_object_mut().unwrap();
        for binding in BINDINGS {
            blocks.remove(binding);
        }
        blocks.remove("payload_schema");
    });
    let report = conformance::run(&scratch.0).unwrap();
    // Only the dedupe key is left to check; it still passes.
    assert_eq!(report.outcomes().len(), 1);
    assert!(report.is_success());

    let empty = Report::default();
    assert!(
        !empty.is_success(),
        "a run that checked nothing is not a success"
    );
    assert_eq!(empty.to_string(), "0 passed, 0 failed");
}
