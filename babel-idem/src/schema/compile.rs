//! A schema node read once into the rules a check applies. Every reading
//! of a keyword lives here, each as the Python SDK's `validate_schema`
//! reads it:
//!
//! - `const` applies whenever the key is present (`null` included); `enum`
//!   only when it is an array;
//! - `type` selects the checks only when it is one of the seven names;
//!   another string, or a value that is not a string, checks nothing;
//! - `required`, `properties` and `additionalProperties` apply under
//!   `type: object` only; `required` is read only when it is an array and
//!   keeps its string entries in order; a `properties` that is not an
//!   object names no property, and a property whose schema is not an
//!   object counts as unnamed; only a literal `false` closes the object;
//! - `items` applies under `type: array` when it is an object;
//! - `minLength` (under `type: string`) counts code points and reads an
//!   integer, a float (truncated toward zero, as Python's `int()`) or a
//!   boolean (`true` is 1);
//! - `minimum` (under `type: integer` or `number`) reads an integer or a
//!   float, never a boolean, and is compared as a float.

use std::collections::HashMap;

use foldhash::fast::RandomState;
use serde_json::{Map, Value};

/// How deep `properties` and `items` may nest in a schema.
pub(super) const MAX_DEPTH: usize = 128;

/// The rules of one schema node.
#[derive(Debug, Clone)]
pub(super) struct Rules {
    pub(super) constant: Option<Value>,
    pub(super) one_of: Option<Vec<Value>>,
    pub(super) expect: Expect,
}

/// What `type` asks of a value, with the keywords that go with it.
#[derive(Debug, Clone)]
pub(super) enum Expect {
    /// No `type` this subset knows: nothing beyond `const` and `enum`.
    Anything,
    Object {
        required: Vec<String>,
        properties: HashMap<String, Rules, RandomState>,
        /// Whether a member `properties` does not name is allowed.
        open: bool,
    },
    Array {
        items: Option<Box<Rules>>,
    },
    String {
        /// At least this many code points; 0 when there is no bound.
        min_length: u64,
    },
    Integer {
        minimum: Option<f64>,
    },
    Number {
        minimum: Option<f64>,
    },
    Boolean,
    Null,
}

/// The schema nests `properties` and `items` deeper than [`MAX_DEPTH`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct TooDeep;

/// The rules of the schema node `schema`.
pub(super) fn rules(schema: &Map<String, Value>) -> Result<Rules, TooDeep> {
    node(schema, 0)
}

fn node(schema: &Map<String, Value>, depth: usize) -> Result<Rules, TooDeep> {
    if depth == MAX_DEPTH {
        return Err(TooDeep);
    }
    let constant = schema.get("const").cloned();
    let one_of = match schema.get("enum") {
        Some(Value::Array(values)) => Some(values.clone()),
        _ => None,
    };
    let expect = match schema.get("type").and_then(Value::as_str) {
        Some("object") => object(schema, depth)?,
        Some("array") => Expect::Array {
            items: match schema.get("items") {
                Some(Value::Object(items)) => Some(Box::new(node(items, depth + 1)?)),
                _ => None,
            },
        },
        Some("string") => Expect::String {
            min_length: min_length(schema.get("minLength")),
        },
        Some("integer") => Expect::Integer {
            minimum: minimum(schema.get("minimum")),
        },
        Some("number") => Expect::Number {
            minimum: minimum(schema.get("minimum")),
        },
        Some("boolean") => Expect::Boolean,
        Some("null") => Expect::Null,
        _ => Expect::Anything,
    };
    Ok(Rules {
        constant,
        one_of,
        expect,
    })
}

fn object(schema: &Map<String, Value>, depth: usize) -> Result<Expect, TooDeep> {
    let required = match schema.get("required") {
        Some(Value::Array(names)) => names
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect(),
        _ => Vec::new(),
    };
    let mut properties = HashMap::default();
    if let Some(Value::Object(named)) = schema.get("properties") {
        for (name, property) in named {
            if let Value::Object(property) = property {
                properties.insert(name.clone(), node(property, depth + 1)?);
            }
        }
    }
    Ok(Expect::Object {
        required,
        properties,
        open: schema.get("additionalProperties") != Some(&Value::Bool(false)),
    })
}

/// `len(value) < int(min_length)` for `min_length` an int, float or bool,
/// as the least length that passes (0: no bound).
fn min_length(bound: Option<&Value>) -> u64 {
    match bound {
        Some(Value::Bool(b)) => (*b).into(),
        Some(Value::Number(n)) => match (n.as_u64(), n.as_i64()) {
            (Some(u), _) => u,
            // A negative bound: every length passes.
            (None, Some(_)) => 0,
            // Truncated toward zero, a negative one to 0 and one beyond
            // u64 to u64::MAX: no string reaches either side's edge.
            (None, None) => n.as_f64().map_or(0, |f| f as u64),
        },
        _ => 0,
    }
}

/// `float(minimum)` for an int or float `minimum`; a boolean is not one.
fn minimum(bound: Option<&Value>) -> Option<f64> {
    match bound {
        Some(Value::Number(n)) => n.as_f64(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn expect(schema: Value) -> Expect {
        let Value::Object(schema) = schema else {
            panic!("not an object")
        };
        rules(&schema).unwrap().expect
    }

    #[test]
    fn min_length_reads_ints_floats_and_bools_as_python_int_does() {
        for (bound, least) in [
            (json!(3), 3),
            (json!(2.9), 2),
            (json!(-0.5), 0),
            (json!(-4), 0),
            (json!(true), 1),
            (json!(false), 0),
            (json!(1e30), u64::MAX),
            (json!("3"), 0),
            (json!(null), 0),
        ] {
            let Expect::String { min_length } =
                expect(json!({"type": "string", "minLength": bound}))
            else {
                panic!("not a string rule")
            };
            assert_eq!(min_length, least, "minLength {bound}");
        }
    }

    #[test]
    fn minimum_ignores_booleans_and_non_numbers() {
        for (bound, read) in [
            (json!(2), Some(2.0)),
            (json!(-1.5), Some(-1.5)),
            (json!(true), None),
            (json!("1"), None),
        ] {
            let Expect::Integer { minimum } = expect(json!({"type": "integer", "minimum": bound}))
            else {
                panic!("not an integer rule")
            };
            assert_eq!(minimum, read, "minimum {bound}");
        }
    }

    #[test]
    fn only_a_literal_false_closes_an_object() {
        for (additional, open) in [
            (json!(false), false),
            (json!(0), true),
            (json!(null), true),
            (json!(true), true),
            (json!({}), true),
        ] {
            let Expect::Object { open: read, .. } =
                expect(json!({"type": "object", "additionalProperties": additional}))
            else {
                panic!("not an object rule")
            };
            assert_eq!(read, open, "additionalProperties {additional}");
        }
    }

    #[test]
    fn an_unknown_or_non_string_type_checks_nothing() {
        for kind in [json!("float"), json!(["string"]), json!(1), json!(null)] {
            assert!(matches!(expect(json!({"type": kind})), Expect::Anything));
        }
    }

    #[test]
    fn a_schema_nested_beyond_the_limit_is_refused() {
        let mut schema = json!({"type": "array"});
        for _ in 0..MAX_DEPTH {
            schema = json!({"type": "array", "items": schema});
        }
        let Value::Object(schema) = schema else {
            unreachable!()
        };
        assert_eq!(rules(&schema).unwrap_err(), TooDeep);
    }
}
