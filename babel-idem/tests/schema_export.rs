//! Schemas exported from Rust types (feature `schemars`): a type's schema
//! accepts every value the type serializes and refuses data the type
//! cannot deserialize (a missing required member, at the top or nested; an
//! unknown member where the type denies them; a value of the wrong type or
//! below its range); nested types are checked in place; the Python SDK's
//! validator reads the exported schema to the same verdicts and texts; a
//! registry folder written from the schemas reads back through `Registry`.
//!
//! The Python comparison needs `BABEL_IDEM_PYTHON`; without it that test
//! prints `skipped:` (and fails with `BABEL_IDEM_REQUIRE_SERVERS=1`).
#![cfg(feature = "schemars")]

#[path = "support/python.rs"]
mod python;

use std::io::Write as _;
use std::process::{Command, Stdio};

use babel_idem::schema::{Registry, Rule, Schema, SchemaError, SchemaProvider, Schemas};
use babel_idem::{Envelope, Message};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, Message)]
#[message(urn = "urn:babel:orders:created")]
struct OrderCreated {
    order_id: u64,
    customer: Customer,
    lines: Vec<Line>,
    currency: Currency,
    note: Option<String>,
    #[serde(default)]
    tags: Vec<String>,
    total: f64,
    express: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Customer {
    #[schemars(length(min = 1))]
    name: String,
    // Free-form, and undocumented: schemars writes its schema as `true`.
    profile: Value,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct Line {
    sku_code: String,
    #[schemars(range(min = 1))]
    qty: u32,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "UPPERCASE")]
enum Currency {
    Eur,
    Usd,
}

fn orders() -> Vec<OrderCreated> {
    (0..4u64)
        .map(|n| OrderCreated {
            order_id: n * 1000 + 7,
            customer: Customer {
                name: "Zoë".into(),
                profile: match n {
                    0 => json!(null),
                    1 => json!({"tier": "gold"}),
                    2 => json!([1, "two"]),
                    _ => json!(3.5),
                },
            },
            lines: (0..n)
                .map(|i| Line {
                    sku_code: format!("sku-{i}"),
                    qty: u32::try_from(i).unwrap() + 1,
                })
                .collect(),
            currency: if n % 2 == 0 {
                Currency::Eur
            } else {
                Currency::Usd
            },
            note: (n % 2 == 1).then(|| "gift".to_owned()),
            tags: vec!["a".into(); usize::try_from(n).unwrap()],
            total: n as f64 * 12.5,
            express: n == 3,
        })
        .collect()
}

fn value_of(order: &OrderCreated) -> Value {
    serde_json::to_value(order).unwrap()
}

/// `order` serialized, then changed by `change`.
fn changed(order: &OrderCreated, change: impl FnOnce(&mut Value)) -> Value {
    let mut value = value_of(order);
    change(&mut value);
    value
}

/// Data the exported schema refuses, with the violation it reports; all
/// but the ranges and lengths declared for schemars alone are data the
/// type cannot deserialize either.
fn refused() -> Vec<(&'static str, Value, &'static str)> {
    let order = &orders()[2];
    vec![
        (
            "a missing required member",
            changed(order, |v| {
                v.as_object_mut().unwrap().remove("order_id");
            }),
            "order_id: missing_required",
        ),
        (
            "a missing member of a nested type",
            changed(order, |v| {
                v["customer"].as_object_mut().unwrap().remove("name");
            }),
            "customer.name: missing_required",
        ),
        (
            "a missing member of a type in an array, by its renamed key",
            changed(order, |v| {
                v["lines"][1].as_object_mut().unwrap().remove("skuCode");
            }),
            "lines[1].skuCode: missing_required",
        ),
        (
            "an unknown member where the type denies them",
            changed(order, |v| v["customer"]["vip"] = json!(true)),
            "customer.vip: additional_not_allowed",
        ),
        (
            "a value below the type's range",
            changed(order, |v| v["lines"][0]["qty"] = json!(0)),
            "lines[0].qty: below_minimum",
        ),
        (
            "a negative value for an unsigned field",
            changed(order, |v| v["order_id"] = json!(-1)),
            "order_id: below_minimum",
        ),
        (
            "an empty string below its length",
            changed(order, |v| v["customer"]["name"] = json!("")),
            "customer.name: below_min_length",
        ),
        (
            "a variant the enum does not have",
            changed(order, |v| v["currency"] = json!("eur")),
            "currency: not_in_enum",
        ),
        (
            "a value of the wrong type",
            changed(order, |v| v["express"] = json!("yes")),
            "express: not_a_boolean",
        ),
    ]
}

#[test]
fn a_types_schema_accepts_every_value_the_type_serializes() {
    let schema = Schema::of::<OrderCreated>().unwrap();
    for order in orders() {
        let value = value_of(&order);
        assert_eq!(schema.check(&value), Ok(()), "{value}");
        assert_eq!(schema.check_json(&value.to_string()).unwrap(), Ok(()));
    }
}

/// Declared with `#[schemars(range(...))]` or `length(...)`: refused by
/// the schema, taken by serde.
const SCHEMA_ONLY: [&str; 2] = [
    "a value below the type's range",
    "an empty string below its length",
];

#[test]
fn a_types_schema_refuses_what_the_type_cannot_deserialize_and_its_declared_ranges() {
    let schema = Schema::of::<OrderCreated>().unwrap();
    for (what, data, violation) in refused() {
        assert_eq!(
            serde_json::from_value::<OrderCreated>(data.clone()).is_err(),
            !SCHEMA_ONLY.contains(&what),
            "{what}: whether the type refuses it too"
        );
        let got = schema.check(&data).expect_err(what);
        assert_eq!(got.to_string(), violation, "{what}");
    }
}

#[test]
fn a_missing_required_member_is_refused_at_its_path() {
    let schema = Schema::of::<OrderCreated>().unwrap();
    let data = changed(&orders()[0], |v| {
        v.as_object_mut().unwrap().remove("currency");
    });
    let violation = schema.check(&data).unwrap_err();
    assert_eq!(violation.rule(), Rule::MissingRequired);
    assert_eq!(violation.path(), "currency");
}

#[test]
fn members_with_a_default_or_an_option_may_be_left_out_and_others_may_be_added() {
    let schema = Schema::of::<OrderCreated>().unwrap();
    let data = changed(&orders()[1], |v| {
        let object = v.as_object_mut().unwrap();
        object.remove("tags");
        object.remove("note");
        object.insert("added_later".into(), json!(1));
    });
    assert!(serde_json::from_value::<OrderCreated>(data.clone()).is_ok());
    assert_eq!(schema.check(&data), Ok(()));
}

#[test]
fn nested_types_are_written_in_place_and_a_free_form_member_as_an_empty_schema() {
    let schema = Schema::of::<OrderCreated>().unwrap();
    let text = schema.as_value().to_string();
    assert!(!text.contains("$ref"), "no reference: {text}");
    let customer = &schema.as_value()["properties"]["customer"];
    assert_eq!(customer["type"], "object");
    assert_eq!(customer["additionalProperties"], false);
    assert_eq!(customer["properties"]["profile"], json!({}));
    assert_eq!(
        schema.as_value()["$schema"],
        "http://json-schema.org/draft-07/schema#"
    );
    assert!(
        schema.as_value().get("additionalProperties").is_none(),
        "a type that takes unknown members does not close its object"
    );
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
struct Tree {
    name: String,
    children: Vec<Tree>,
}

#[test]
fn a_recursive_type_is_checked_down_to_its_first_reference() {
    let schema = Schema::of::<Tree>().unwrap();
    assert_eq!(
        schema
            .check(&json!({"children": []}))
            .unwrap_err()
            .to_string(),
        "name: missing_required"
    );
    // Below the first level the schema refers to itself, which the subset
    // does not follow.
    assert_eq!(
        schema.check(&json!({"name": "root", "children": [{"nameless": true}]})),
        Ok(())
    );
}

#[test]
fn a_message_types_schema_is_registered_under_its_urn() {
    let schemas = Schemas::new().with_message::<OrderCreated>().unwrap();
    assert_eq!(
        schemas.urns().collect::<Vec<_>>(),
        [OrderCreated::URN.as_str()]
    );
    let invalid = Envelope::new(
        OrderCreated::URN.as_str(),
        changed(&orders()[0], |v| v["total"] = json!("12.50")),
    );
    let error = invalid.check_schema(&schemas).unwrap_err();
    assert_eq!(
        error.to_string(),
        "data for 'urn:babel:orders:created' does not match its URN schema: total: not_a_number"
    );
    let valid = Envelope::from_message(&orders()[3]).unwrap();
    assert_eq!(valid.check_schema(&schemas), Ok(()));
}

/// A folder under the system's temporary one, removed on drop.
struct Folder(std::path::PathBuf);

impl Folder {
    fn new(name: &str) -> Folder {
        let path = std::env::temp_dir().join(format!(
            "babel-idem-export-{name}-{}",
            uuid::Uuid::new_v4().simple()
        ));
        Folder(path)
    }
}

impl Drop for Folder {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[derive(Debug, Serialize, Deserialize, JsonSchema, Message)]
#[message(urn = "urn:babel:orders:shipped")]
struct OrderShipped {
    order_id: u64,
    carrier: String,
}

#[test]
fn a_registry_folder_written_from_the_schemas_reads_back_the_same_schemas() {
    let folder = Folder::new("roundtrip");
    let schemas = Schemas::new()
        .with_message::<OrderShipped>()
        .unwrap()
        .with_message::<OrderCreated>()
        .unwrap();
    let manifest = schemas.write_registry(&folder.0).unwrap();
    assert_eq!(manifest, folder.0.join("registry.json"));

    let written: Value =
        serde_json::from_str(&std::fs::read_to_string(&manifest).unwrap()).unwrap();
    assert_eq!(
        written,
        json!({"schemas": [
            {"urn": "urn:babel:orders:created", "schema": "babel.orders.created.json"},
            {"urn": "urn:babel:orders:shipped", "schema": "babel.orders.shipped.json"},
        ]})
    );
    let registry = Registry::open(&manifest).unwrap();
    for urn in schemas.urns() {
        assert_eq!(
            registry.schema_for(urn).unwrap().as_value(),
            schemas.schema_for(urn).unwrap().as_value(),
            "{urn}"
        );
    }
    let violation = registry
        .check("urn:babel:orders:shipped", &json!({"order_id": 1}))
        .unwrap_err();
    assert_eq!(violation.to_string(), "carrier: missing_required");
}

#[test]
fn a_schema_file_name_keeps_letters_digits_dashes_and_underscores_and_escapes_the_rest() {
    let folder = Folder::new("names");
    let schemas = Schemas::from_json_map([
        ("urn:babel:orders:line-item_v2", "{}"),
        ("urn:babel:a/../b:x.y", "{}"),
        ("URN:acme:Ünï", "{}"),
    ])
    .unwrap();
    let manifest = schemas.write_registry(&folder.0).unwrap();
    let mut files: Vec<String> = std::fs::read_dir(&folder.0)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .collect();
    files.sort();
    assert_eq!(
        files,
        [
            "acme.%C3%9Cn%C3%AF.json",
            "babel.a%2F%2E%2E%2Fb.x%2Ey.json",
            "babel.orders.line-item_v2.json",
            "registry.json",
        ]
    );
    assert_eq!(Registry::open(&manifest).unwrap().urns().count(), 3);
}

#[test]
fn urns_whose_files_would_clash_are_refused_before_anything_is_written() {
    let clash = Folder::new("clash");
    let schemas = Schemas::from_json_map([
        ("urn:babel:Orders:created", "{}"),
        ("urn:babel:orders:created", "{}"),
    ])
    .unwrap();
    let error = schemas.write_registry(&clash.0).unwrap_err();
    assert!(
        matches!(&error, SchemaError::UnwritableUrn { urn, .. } if urn == "urn:babel:orders:created"),
        "{error:?}"
    );
    assert!(
        error.to_string().contains("urn:babel:Orders:created"),
        "{error}"
    );
    assert!(!clash.0.exists(), "nothing was written");

    let empty = Folder::new("empty");
    let error = Schemas::from_json_map([("", "{}")])
        .unwrap()
        .write_registry(&empty.0)
        .unwrap_err();
    assert!(
        matches!(error, SchemaError::UnwritableUrn { .. }),
        "{error:?}"
    );
    assert!(!empty.0.exists());
}

#[test]
fn a_folder_that_cannot_be_made_is_an_error_naming_it() {
    let folder = Folder::new("blocked");
    std::fs::write(&folder.0, "a file, not a folder").unwrap();
    let schemas = Schemas::from_json_map([("urn:babel:orders:created", "{}")]).unwrap();
    let error = schemas.write_registry(folder.0.join("inside")).unwrap_err();
    assert!(
        matches!(&error, SchemaError::RegistryWrite { path, .. } if path.starts_with(&folder.0)),
        "{error:?}"
    );
    std::fs::remove_file(&folder.0).unwrap();
}

/// The Python SDK's verdict on each `(schema, data)` text pair
/// (`tests/python/schema_peer.py`): the violation text, or `None`.
fn python_verdicts(python: &std::path::Path, pairs: &[(String, String)]) -> Vec<Option<String>> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/schema_peer.py");
    let mut child = Command::new(python)
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the Python peer");
    let mut input = String::new();
    for (schema, data) in pairs {
        input.push_str(&json!({"schema": schema, "data": data}).to_string());
        input.push('\n');
    }
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|line| {
            let answer: Value = serde_json::from_str(line).unwrap();
            assert!(answer.get("error").is_none(), "{answer}");
            answer["violation"].as_str().map(str::to_owned)
        })
        .collect()
}

#[test]
fn the_python_sdk_reads_the_exported_schema_to_the_same_verdicts() {
    let Some(python) = python::python("schema_export_python") else {
        return;
    };
    let schema = Schema::of::<OrderCreated>().unwrap();
    let schema_text = schema.as_value().to_string();
    let mut data: Vec<(Value, Option<String>)> = orders()
        .iter()
        .map(|order| (value_of(order), None))
        .collect();
    data.extend(
        refused()
            .into_iter()
            .map(|(_, data, violation)| (data, Some(violation.to_owned()))),
    );
    let pairs: Vec<(String, String)> = data
        .iter()
        .map(|(data, _)| (schema_text.clone(), data.to_string()))
        .collect();
    let verdicts = python_verdicts(&python, &pairs);
    assert_eq!(verdicts.len(), data.len());
    for ((data, expected), python) in data.iter().zip(verdicts) {
        assert_eq!(&python, expected, "Python on {data}");
        let ours = schema
            .check_json(&data.to_string())
            .unwrap()
            .err()
            .map(|violation| violation.to_string());
        assert_eq!(ours, python, "ours and Python's on {data}");
    }
}
