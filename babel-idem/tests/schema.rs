//! The payload schema check through its public API: each rule's violation
//! text, the edges where the family's reading of a keyword or a number is
//! not the obvious one, the providers (in code and from a registry
//! manifest on disk) and the typed errors.

use std::fs;
use std::path::{Path, PathBuf};

use babel_idem::schema::{Registry, Rule, Schema, SchemaError, SchemaProvider, Schemas, Violation};
use serde_json::{Value, json};

fn schema(value: Value) -> Schema {
    Schema::from_value(value).unwrap_or_else(|error| panic!("{error}"))
}

/// The violation text of `data` (JSON text, read in document order), or
/// `None` when it is valid.
fn first(schema: &Schema, data: &str) -> Option<String> {
    schema
        .check_json(data)
        .unwrap_or_else(|error| panic!("{data}: {error}"))
        .err()
        .map(|violation| violation.to_string())
}

#[test]
fn each_rule_is_written_as_the_python_sdk_writes_it() {
    let order = schema(json!({
        "type": "object",
        "required": ["order_id"],
        "properties": {
            "order_id": {"type": "integer", "minimum": 1},
            "channel": {"const": "web"},
            "currency": {"enum": ["EUR", "USD"]},
            "note": {"type": "string", "minLength": 2},
            "amount": {"type": "number"},
            "gift": {"type": "boolean"},
            "parent": {"type": "null"},
            "lines": {"type": "array", "items": {"type": "object", "properties": {"sku": {"type": "string"}}}},
            "customer": {"type": "object", "additionalProperties": false}
        }
    }));
    for (data, text, rule) in [
        (r#"[]"#, "<root>: not_an_object", Rule::NotAnObject),
        (r#"{}"#, "order_id: missing_required", Rule::MissingRequired),
        (
            r#"{"order_id": 0}"#,
            "order_id: below_minimum",
            Rule::BelowMinimum,
        ),
        (
            r#"{"order_id": 1.5}"#,
            "order_id: not_an_integer",
            Rule::NotAnInteger,
        ),
        (
            r#"{"order_id": 1, "channel": "app"}"#,
            "channel: wrong_const",
            Rule::WrongConst,
        ),
        (
            r#"{"order_id": 1, "currency": "GBP"}"#,
            "currency: not_in_enum",
            Rule::NotInEnum,
        ),
        (
            r#"{"order_id": 1, "note": "é"}"#,
            "note: below_min_length",
            Rule::BelowMinLength,
        ),
        (
            r#"{"order_id": 1, "note": 12}"#,
            "note: not_a_string",
            Rule::NotAString,
        ),
        (
            r#"{"order_id": 1, "amount": "12"}"#,
            "amount: not_a_number",
            Rule::NotANumber,
        ),
        (
            r#"{"order_id": 1, "gift": 1}"#,
            "gift: not_a_boolean",
            Rule::NotABoolean,
        ),
        (
            r#"{"order_id": 1, "parent": 0}"#,
            "parent: not_null",
            Rule::NotNull,
        ),
        (
            r#"{"order_id": 1, "lines": {}}"#,
            "lines: not_an_array",
            Rule::NotAnArray,
        ),
        (
            r#"{"order_id": 1, "lines": [{}, {"sku": 9}]}"#,
            "lines[1].sku: not_a_string",
            Rule::NotAString,
        ),
        (
            r#"{"order_id": 1, "customer": {"tier": 1}}"#,
            "customer.tier: additional_not_allowed",
            Rule::AdditionalNotAllowed,
        ),
    ] {
        let violation = order.check_json(data).unwrap().unwrap_err();
        assert_eq!(violation.to_string(), text, "{data}");
        assert_eq!(violation.rule(), rule, "{data}");
        let path = text.rsplit_once(": ").unwrap().0;
        let path = if path == "<root>" { "" } else { path };
        assert_eq!(violation.path(), path);
        assert_eq!(text.rsplit_once(": ").unwrap().1, rule.as_str());
    }
    assert_eq!(first(&order, r#"{"order_id": 1}"#), None);
}

#[test]
fn an_array_at_the_root_writes_its_items_without_a_name() {
    let list = schema(json!({"type": "array", "items": {"type": "integer"}}));
    assert_eq!(
        first(&list, "[1, 2, \"3\"]").as_deref(),
        Some("[2]: not_an_integer")
    );
}

#[test]
fn an_empty_member_name_leaves_the_path_as_python_joins_it() {
    // Python joins "" under the root to "", and "a" under "" to "a".
    let nested = schema(json!({
        "type": "object",
        "properties": {"": {"type": "object", "properties": {"a": {"type": "string"}}}}
    }));
    assert_eq!(
        first(&nested, r#"{"": {"a": 1}}"#).as_deref(),
        Some("a: not_a_string")
    );
    assert_eq!(
        first(&nested, r#"{"": 1}"#).as_deref(),
        Some("<root>: not_an_object")
    );
}

#[test]
fn const_then_enum_then_type_decide_which_violation_comes_first() {
    let all = schema(json!({"const": "a", "enum": ["b"], "type": "integer"}));
    assert_eq!(first(&all, "\"b\"").as_deref(), Some("<root>: wrong_const"));
    let no_const = schema(json!({"enum": ["b"], "type": "integer"}));
    assert_eq!(
        first(&no_const, "\"c\"").as_deref(),
        Some("<root>: not_in_enum")
    );
    assert_eq!(
        first(&no_const, "\"b\"").as_deref(),
        Some("<root>: not_an_integer")
    );
}

#[test]
fn required_names_come_in_list_order_before_any_member() {
    let object = schema(json!({
        "type": "object",
        "required": ["z", "a"],
        "properties": {"m": {"type": "string"}},
        "additionalProperties": false
    }));
    assert_eq!(
        first(&object, r#"{"m": 1, "x": 1}"#).as_deref(),
        Some("z: missing_required")
    );
    assert_eq!(
        first(&object, r#"{"z": 1, "m": 1}"#).as_deref(),
        Some("a: missing_required")
    );
}

#[test]
fn members_are_checked_in_document_order_from_text_and_map_order_from_a_value() {
    let object = schema(json!({
        "type": "object",
        "properties": {"a": {"type": "string"}, "b": {"type": "string"}}
    }));
    let text = r#"{"b": 1, "a": 1}"#;
    assert_eq!(first(&object, text).as_deref(), Some("b: not_a_string"));
    let value: Value = serde_json::from_str(text).unwrap();
    assert_eq!(
        object.check(&value).unwrap_err().to_string(),
        "a: not_a_string"
    );
    let Value::Object(map) = &value else {
        unreachable!()
    };
    assert_eq!(
        object.check_map(map).unwrap_err().to_string(),
        "a: not_a_string"
    );
}

#[test]
fn a_name_given_twice_counts_once_with_its_last_value_in_its_first_place() {
    let object = schema(json!({
        "type": "object",
        "properties": {"a": {"type": "string"}, "b": {"type": "string"}}
    }));
    assert_eq!(
        first(&object, r#"{"a": 1, "b": 2, "a": "x"}"#).as_deref(),
        Some("b: not_a_string")
    );
    assert_eq!(
        first(&object, r#"{"b": "x", "a": "x", "b": 2}"#).as_deref(),
        Some("b: not_a_string")
    );
    assert_eq!(first(&object, r#"{"a": 1, "a": "x"}"#), None);
}

#[test]
fn integers_numbers_and_booleans_are_told_apart_as_python_tells_them() {
    let integer = schema(json!({"type": "integer"}));
    let number = schema(json!({"type": "number"}));
    let boolean = schema(json!({"type": "boolean"}));
    for valid in [
        "1",
        "1.0",
        "-0",
        "-0.0",
        "1e2",
        "18446744073709551615",
        "-9223372036854775808",
    ] {
        assert_eq!(first(&integer, valid), None, "{valid}");
        assert_eq!(first(&number, valid), None, "{valid}");
    }
    for data in ["true", "false"] {
        assert_eq!(
            first(&integer, data).as_deref(),
            Some("<root>: not_an_integer")
        );
        assert_eq!(
            first(&number, data).as_deref(),
            Some("<root>: not_a_number")
        );
        assert_eq!(first(&boolean, data), None);
    }
    assert_eq!(
        first(&integer, "1.5").as_deref(),
        Some("<root>: not_an_integer")
    );
    // Python reads 1e400 as infinity: a number, but not an integer.
    assert_eq!(first(&number, "1e400"), None);
    assert_eq!(
        first(&integer, "1e400").as_deref(),
        Some("<root>: not_an_integer")
    );
    assert_eq!(
        first(&boolean, "1").as_deref(),
        Some("<root>: not_a_boolean")
    );
}

#[test]
fn minimum_compares_as_floats_and_ignores_a_boolean_bound() {
    let at_least = |bound: Value| schema(json!({"type": "number", "minimum": bound}));
    assert_eq!(
        first(&at_least(json!(1)), "0.5").as_deref(),
        Some("<root>: below_minimum")
    );
    assert_eq!(first(&at_least(json!(1)), "1.0"), None);
    assert_eq!(
        first(&at_least(json!(0.5)), "0").as_deref(),
        Some("<root>: below_minimum")
    );
    assert_eq!(first(&at_least(json!(true)), "-5"), None);
    assert_eq!(first(&at_least(json!("1")), "-5"), None);
    // 2^53 + 1 becomes 2^53 as a float on both sides: not below.
    assert_eq!(
        first(&at_least(json!(9007199254740993_u64)), "9007199254740992"),
        None
    );
    assert_eq!(
        first(&at_least(json!(0)), "-1e400").as_deref(),
        Some("<root>: below_minimum")
    );
}

#[test]
fn min_length_counts_code_points_and_reads_its_bound_as_python_int_does() {
    let at_least = |bound: Value| schema(json!({"type": "string", "minLength": bound}));
    let three = at_least(json!(3));
    assert_eq!(first(&three, "\"日本語\""), None);
    assert_eq!(
        first(&three, "\"\\ud834\\udd1e\u{1d11e}\"").as_deref(),
        Some("<root>: below_min_length")
    );
    assert_eq!(first(&three, "\"e\u{301}e\""), None);
    assert_eq!(first(&at_least(json!(2.9)), "\"ab\""), None);
    assert_eq!(
        first(&at_least(json!(2.9)), "\"a\"").as_deref(),
        Some("<root>: below_min_length")
    );
    assert_eq!(
        first(&at_least(json!(true)), "\"\"").as_deref(),
        Some("<root>: below_min_length")
    );
    assert_eq!(first(&at_least(json!(false)), "\"\""), None);
    assert_eq!(first(&at_least(json!(-1)), "\"\""), None);
    assert_eq!(first(&at_least(json!("3")), "\"\""), None);
    assert_eq!(
        first(&at_least(json!(1e30)), "\"long enough?\"").as_deref(),
        Some("<root>: below_min_length")
    );
}

#[test]
fn const_and_enum_tell_types_apart_at_the_top_but_not_inside() {
    let one = schema(json!({"const": 1}));
    assert_eq!(first(&one, "1"), None);
    assert_eq!(first(&one, "1.0").as_deref(), Some("<root>: wrong_const"));
    assert_eq!(first(&one, "true").as_deref(), Some("<root>: wrong_const"));
    let flag = schema(json!({"enum": [true]}));
    assert_eq!(first(&flag, "1").as_deref(), Some("<root>: not_in_enum"));
    let nested = schema(json!({"const": [1, {"a": true}]}));
    assert_eq!(first(&nested, r#"[1.0, {"a": 1}]"#), None);
    assert_eq!(first(&nested, r#"[true, {"a": 1.0}]"#), None);
    assert_eq!(
        first(&nested, r#"[1, {"a": 2}]"#).as_deref(),
        Some("<root>: wrong_const")
    );
    let none = schema(json!({"const": null}));
    assert_eq!(first(&none, "null"), None);
    assert_eq!(first(&none, "0").as_deref(), Some("<root>: wrong_const"));
    // `-0` in a schema's text is the integer 0, as Python reads it.
    let zero = Schema::from_json(r#"{"const": -0}"#).unwrap();
    assert_eq!(first(&zero, "0"), None);
    assert_eq!(first(&zero, "0.0").as_deref(), Some("<root>: wrong_const"));
    let empty = schema(json!({"enum": []}));
    assert_eq!(
        first(&empty, "null").as_deref(),
        Some("<root>: not_in_enum")
    );
    let not_a_list = schema(json!({"enum": "a"}));
    assert_eq!(first(&not_a_list, "\"b\""), None);
}

#[test]
fn keywords_of_another_shape_check_nothing_and_unknown_ones_are_ignored() {
    for (ignored, data) in [
        (json!({"type": ["string"]}), r#"{"a": 1}"#),
        (json!({"type": "float"}), r#"{"a": 1}"#),
        (json!({"type": 1}), r#"{"a": 1}"#),
        // Without `type: object`, the object keywords are not read.
        (
            json!({"properties": {"a": {"type": "string"}}, "required": ["b"]}),
            r#"{"a": 1}"#,
        ),
        (
            json!({"minLength": 5, "minimum": 5, "items": {"type": "string"}}),
            r#"[1]"#,
        ),
        (json!({"type": "object", "required": "b"}), r#"{"a": 1}"#),
        (
            json!({"type": "object", "properties": ["a"], "additionalProperties": 0}),
            r#"{"a": 1}"#,
        ),
        (
            json!({"type": "array", "items": [{"type": "string"}]}),
            r#"[1]"#,
        ),
        (
            json!({"type": "object", "maxProperties": 0, "pattern": "^x$", "$schema": "x"}),
            r#"{"a": 1}"#,
        ),
    ] {
        assert_eq!(first(&schema(ignored.clone()), data), None, "{ignored}");
    }
    let required = schema(json!({"type": "object", "required": [1, null, ["a"], "b"]}));
    assert_eq!(
        first(&required, "{}").as_deref(),
        Some("b: missing_required")
    );
}

#[test]
fn a_property_whose_schema_is_not_an_object_counts_as_unnamed() {
    let closed = schema(json!({
        "type": "object",
        "properties": {"a": true, "b": {"type": "string"}},
        "additionalProperties": false
    }));
    assert_eq!(
        first(&closed, r#"{"b": "x", "a": 1}"#).as_deref(),
        Some("a: additional_not_allowed")
    );
    let open = schema(json!({"type": "object", "properties": {"a": true}}));
    assert_eq!(first(&open, r#"{"a": 1}"#), None);
}

#[test]
fn only_a_literal_false_closes_an_object() {
    for (additional, closed) in [
        (json!(false), true),
        (json!(0), false),
        (json!(null), false),
        (json!(true), false),
        (json!({}), false),
    ] {
        let object = schema(json!({"type": "object", "additionalProperties": additional}));
        let verdict = first(&object, r#"{"x": 1}"#);
        assert_eq!(
            verdict.is_some(),
            closed,
            "additionalProperties {additional}"
        );
    }
}

#[test]
fn violations_compare_and_show_their_parts() {
    let object = schema(json!({"type": "object", "required": ["a"]}));
    let a = object.check(&json!({})).unwrap_err();
    let b = object.check_json("{}").unwrap().unwrap_err();
    assert_eq!(a, b);
    let error: Box<dyn std::error::Error> = Box::new(a.clone());
    assert_eq!(error.to_string(), "a: missing_required");
    assert_eq!(Rule::MissingRequired.to_string(), "missing_required");
    let _: &Violation = &a;
}

#[test]
fn a_schema_that_is_not_an_object_or_not_json_is_a_typed_error() {
    for (value, found) in [
        (json!([]), "an array"),
        (json!("object"), "a string"),
        (json!(1), "a number"),
        (json!(true), "a boolean"),
        (json!(null), "null"),
    ] {
        let error = Schema::from_value(value).unwrap_err();
        assert!(matches!(error, SchemaError::NotAnObject { found: f } if f == found));
        assert_eq!(
            error.to_string(),
            format!("a schema must be a JSON object, not {found}")
        );
    }
    let error = Schema::from_json(r#"{"type": "object",}"#).unwrap_err();
    assert!(
        matches!(error, SchemaError::SchemaText { offset: 18, .. }),
        "{error:?}"
    );
    assert_eq!(
        error.to_string(),
        "cannot read the schema's JSON text: expected a member name in double quotes at byte 18"
    );
    let error = Schema::from_json(r#"{"minimum": 1e400}"#).unwrap_err();
    assert!(
        matches!(error, SchemaError::SchemaText { offset: 12, .. }),
        "{error:?}"
    );
    assert!(
        error
            .to_string()
            .contains("beyond the range of a 64-bit float")
    );

    let mut deep = json!({"type": "string"});
    for _ in 0..200 {
        deep = json!({"type": "array", "items": deep});
    }
    let error = Schema::from_value(deep).unwrap_err();
    assert!(
        matches!(error, SchemaError::TooDeep { limit: 128 }),
        "{error:?}"
    );
}

#[test]
fn data_that_is_not_json_is_a_typed_error() {
    let any = schema(json!({}));
    let error = any.check_json(r#"{"a": [1, 2}"#).unwrap_err();
    assert!(
        matches!(error, SchemaError::DataText { offset: 11, .. }),
        "{error:?}"
    );
    assert_eq!(
        error.to_string(),
        "cannot read the data's JSON text: expected `,` or `]` after an array item at byte 11"
    );
    for text in [
        "",
        "NaN",
        "{\"a\": 1} 2",
        "\"\\ud800\"",
        "[1,]",
        &"[".repeat(200),
    ] {
        assert!(
            matches!(any.check_json(text), Err(SchemaError::DataText { .. })),
            "{text}"
        );
    }
}

#[test]
fn schemas_in_code_are_opt_in_per_urn() {
    let schemas = Schemas::new()
        .with(
            "urn:babel:orders:created",
            schema(json!({"type": "object", "required": ["id"]})),
        )
        .with("urn:babel:orders:voided", schema(json!({"type": "array"})))
        .with("urn:babel:orders:voided", schema(json!({"type": "object"})));
    assert_eq!(
        schemas
            .check("urn:babel:orders:created", &json!({}))
            .unwrap_err()
            .to_string(),
        "id: missing_required"
    );
    assert!(schemas.check("urn:babel:orders:voided", &json!({})).is_ok());
    assert!(
        schemas
            .check("urn:babel:orders:unknown", &json!([]))
            .is_ok()
    );
    // A URN without a schema never reads its data's text.
    assert!(
        schemas
            .check_json("urn:babel:orders:unknown", "not json")
            .unwrap()
            .is_ok()
    );
    assert!(
        schemas
            .check_json("urn:babel:orders:created", "not json")
            .is_err()
    );
    let mut urns: Vec<&str> = schemas.urns().collect();
    urns.sort_unstable();
    assert_eq!(
        urns,
        ["urn:babel:orders:created", "urn:babel:orders:voided"]
    );
}

#[test]
fn schemas_from_json_name_the_urn_whose_text_is_unusable() {
    let schemas =
        Schemas::from_json_map([("urn:a", r#"{"const": 1}"#), ("urn:a", r#"{"const": 2}"#)])
            .unwrap();
    assert!(schemas.check("urn:a", &json!(2)).is_ok());
    let error = Schemas::from_json_map(vec![
        ("urn:a".to_owned(), "{}".to_owned()),
        ("urn:b".to_owned(), "[1]".to_owned()),
    ])
    .unwrap_err();
    let SchemaError::ForUrn { urn, source } = &error else {
        panic!("{error:?}")
    };
    assert_eq!(urn, "urn:b");
    assert!(matches!(
        **source,
        SchemaError::NotAnObject { found: "an array" }
    ));
    assert_eq!(
        error.to_string(),
        "the schema for \"urn:b\" is unusable: a schema must be a JSON object, not an array"
    );
}

/// A fresh folder for one test, removed on drop.
struct Folder(PathBuf);

impl Folder {
    fn new(test: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("babel-idem-schema-{}-{test}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        Folder(dir)
    }

    fn write(&self, file: &str, text: &str) -> PathBuf {
        let path = self.0.join(file);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(&path, text).unwrap();
        path
    }
}

impl Drop for Folder {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

#[test]
fn a_registry_reads_every_schema_its_manifest_names() {
    let folder = Folder::new("registry");
    folder.write(
        "orders/created.json",
        r#"{"type": "object", "required": ["order_id"]}"#,
    );
    let absolute = folder.write(
        "elsewhere/paid.json",
        r#"{"type": "object", "required": ["invoice"]}"#,
    );
    folder.write("voided-old.json", r#"{"type": "array"}"#);
    folder.write(
        "voided.json",
        r#"{"type": "object", "additionalProperties": false}"#,
    );
    let manifest = json!({
        "registry": "orders",
        "schemas": [
            {"urn": "urn:babel:orders:created", "schema": "orders/created.json"},
            {"urn": "urn:babel:invoices:paid", "schema": absolute.to_str().unwrap()},
            {"urn": "urn:babel:orders:voided", "schema": "voided-old.json"},
            {"urn": "urn:babel:orders:voided", "schema": "voided.json"},
            // Skipped as the Python SDK skips them: none of these is read.
            {"urn": "", "schema": "missing.json"},
            {"urn": "urn:babel:orders:blank", "schema": ""},
            {"urn": 7, "schema": "missing.json"},
            {"urn": "urn:babel:orders:no-file"},
            "urn:babel:orders:text",
            null
        ]
    });
    let path = folder.write("registry.json", &manifest.to_string());
    let registry = Registry::open(&path).unwrap();

    let mut urns: Vec<&str> = registry.urns().collect();
    urns.sort_unstable();
    assert_eq!(
        urns,
        [
            "urn:babel:invoices:paid",
            "urn:babel:orders:created",
            "urn:babel:orders:voided"
        ]
    );
    let check = |urn: &str, data: Value| registry.check(urn, &data).err().map(|v| v.to_string());
    assert_eq!(
        check("urn:babel:orders:created", json!({})).as_deref(),
        Some("order_id: missing_required")
    );
    assert_eq!(
        check("urn:babel:invoices:paid", json!({})).as_deref(),
        Some("invoice: missing_required")
    );
    // The later entry of a URN wins.
    assert_eq!(
        check("urn:babel:orders:voided", json!({"x": 1})).as_deref(),
        Some("x: additional_not_allowed")
    );
    assert_eq!(check("urn:babel:orders:blank", json!([])), None);

    // Lookups never touch the disk again.
    drop(folder);
    assert!(registry.schema_for("urn:babel:orders:created").is_some());
}

#[test]
fn a_registry_later_entry_replaces_a_missing_file_of_an_earlier_one() {
    let folder = Folder::new("replaced");
    folder.write("b.json", "{}");
    let path = folder.write(
        "registry.json",
        r#"{"schemas": [{"urn": "urn:a", "schema": "gone.json"}, {"urn": "urn:a", "schema": "b.json"}]}"#,
    );
    let registry = Registry::open(path).unwrap();
    assert!(registry.schema_for("urn:a").is_some());
}

#[test]
fn a_registry_without_a_list_of_schemas_names_none() {
    let folder = Folder::new("no-list");
    for manifest in [
        r#"{}"#,
        r#"{"schemas": null}"#,
        r#"{"schemas": {"urn": "urn:a"}}"#,
        r#"{"schemas": "urn:a"}"#,
    ] {
        let path = folder.write("registry.json", manifest);
        assert_eq!(
            Registry::open(path).unwrap().urns().count(),
            0,
            "{manifest}"
        );
    }
}

#[test]
fn a_schema_file_that_is_missing_or_unusable_is_an_error_naming_it_and_its_urn() {
    let folder = Folder::new("bad-file");
    let manifest = folder.write(
        "registry.json",
        r#"{"schemas": [{"urn": "urn:babel:orders:created", "schema": "orders/created.json"}]}"#,
    );
    let expected = folder.0.join("orders/created.json");

    let error = Registry::open(&manifest).unwrap_err();
    let SchemaError::SchemaFileUnreadable { urn, path, .. } = &error else {
        panic!("{error:?}")
    };
    assert_eq!(
        (urn.as_str(), path.as_path()),
        ("urn:babel:orders:created", expected.as_path())
    );
    let text = error.to_string();
    assert!(
        text.contains("orders/created.json") && text.contains("urn:babel:orders:created"),
        "{text}"
    );

    for (content, found) in [
        ("[1]", "a schema must be a JSON object, not an array"),
        ("{\"type\": ", "cannot read the schema's JSON text"),
    ] {
        folder.write("orders/created.json", content);
        let error = Registry::open(&manifest).unwrap_err();
        let SchemaError::SchemaFileUnusable { urn, path, source } = &error else {
            panic!("{error:?}")
        };
        assert_eq!(
            (urn.as_str(), path.as_path()),
            ("urn:babel:orders:created", expected.as_path())
        );
        assert!(source.to_string().starts_with(found), "{source}");
        assert!(error.to_string().contains("orders/created.json"));
    }
}

#[test]
fn a_manifest_that_is_missing_not_json_or_not_an_object_is_a_typed_error() {
    let folder = Folder::new("bad-manifest");
    let missing = folder.0.join("registry.json");
    let error = Registry::open(&missing).unwrap_err();
    assert!(matches!(&error, SchemaError::RegistryUnreadable { path, .. } if path == &missing));
    assert!(error.to_string().contains("registry.json"));

    let path = folder.write("registry.json", "{\"schemas\": [");
    let error = Registry::open(&path).unwrap_err();
    assert!(
        matches!(&error, SchemaError::RegistryNotJson { path: p, .. } if p == &path),
        "{error:?}"
    );

    let path = folder.write("registry.json", "[]");
    let error = Registry::open(&path).unwrap_err();
    assert!(
        matches!(
            &error,
            SchemaError::RegistryNotAnObject {
                found: "an array",
                ..
            }
        ),
        "{error:?}"
    );
    assert!(
        error
            .to_string()
            .ends_with("must be a JSON object, not an array")
    );
}

#[test]
fn a_registry_opened_by_a_relative_path_finds_its_files_beside_it() {
    let folder = Folder::new("relative");
    folder.write("schemas/a.json", r#"{"type": "object"}"#);
    folder.write(
        "registry.json",
        r#"{"schemas": [{"urn": "urn:a", "schema": "schemas/a.json"}]}"#,
    );
    // Relative to the working directory: the manifest's folder as given.
    let cwd = std::env::current_dir().unwrap();
    let relative = pathdiff(&folder.0.join("registry.json"), &cwd);
    let registry = Registry::open(&relative).unwrap();
    assert!(registry.check("urn:a", &json!([])).is_err());
}

/// `path` relative to `base`, through `..` as needed.
fn pathdiff(path: &Path, base: &Path) -> PathBuf {
    let path: Vec<_> = path.components().collect();
    let base: Vec<_> = base.components().collect();
    let common = path.iter().zip(&base).take_while(|(a, b)| a == b).count();
    let mut relative = PathBuf::new();
    for _ in common..base.len() {
        relative.push("..");
    }
    for part in &path[common..] {
        relative.push(part);
    }
    relative
}
