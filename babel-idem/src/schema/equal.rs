//! Equality as the Python SDK compares a value with `const` and `enum`:
//! `type(a) is type(b) and a == b`. At the top the two must be of one
//! type (`1` is not `1.0`, `true` is not `1`); inside arrays and objects
//! Python's plain `==` applies, where a boolean is the integer 0 or 1 and
//! an integer equals a float of exactly its value (`[1] == [1.0]`,
//! `[true] == [1]`).

use super::instance::{Instance, Kind, Members};

/// `type(a) is type(b) and a == b`.
pub(super) fn same<A: Instance, B: Instance>(a: Kind<'_, A>, b: Kind<'_, B>) -> bool {
    match (a, b) {
        (Kind::Null, Kind::Null) => true,
        (Kind::Bool(a), Kind::Bool(b)) => a == b,
        (Kind::Int(a), Kind::Int(b)) => a == b,
        (Kind::Float(a), Kind::Float(b)) => a == b,
        (Kind::Str(a), Kind::Str(b)) => a == b,
        (Kind::Array(a), Kind::Array(b)) => arrays_equal(a, b),
        (Kind::Object(a), Kind::Object(b)) => objects_equal::<A, B>(a, b),
        _ => false,
    }
}

/// Python's `a == b` between two values read from JSON.
fn equal<A: Instance, B: Instance>(a: Kind<'_, A>, b: Kind<'_, B>) -> bool {
    match (a, b) {
        (Kind::Null, Kind::Null) => true,
        (Kind::Str(a), Kind::Str(b)) => a == b,
        (Kind::Array(a), Kind::Array(b)) => arrays_equal(a, b),
        (Kind::Object(a), Kind::Object(b)) => objects_equal::<A, B>(a, b),
        (a, b) => match (Number::of(a), Number::of(b)) {
            (Some(a), Some(b)) => a.equals(b),
            _ => false,
        },
    }
}

fn arrays_equal<A: Instance, B: Instance>(a: &[A], b: &[B]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(a, b)| equal(a.kind(), b.kind()))
}

fn objects_equal<A: Instance, B: Instance>(a: &A::Object, b: &B::Object) -> bool {
    a.member_count() == b.member_count()
        && a.members()
            .all(|(name, a)| b.member(name).is_some_and(|b| equal(a.kind(), b.kind())))
}

/// A number as Python's `==` sees it: a boolean is the integer 0 or 1.
#[derive(Clone, Copy)]
enum Number {
    Int(i128),
    Float(f64),
}

impl Number {
    fn of<I: Instance>(kind: Kind<'_, I>) -> Option<Number> {
        match kind {
            Kind::Bool(b) => Some(Number::Int(b.into())),
            Kind::Int(i) => Some(Number::Int(i)),
            Kind::Float(f) => Some(Number::Float(f)),
            _ => None,
        }
    }

    /// Exact: an integer equals a float only when the float holds exactly
    /// its value, as Python compares `int` with `float`.
    fn equals(self, other: Number) -> bool {
        match (self, other) {
            (Number::Int(a), Number::Int(b)) => a == b,
            (Number::Float(a), Number::Float(b)) => a == b,
            (Number::Int(i), Number::Float(f)) | (Number::Float(f), Number::Int(i)) => {
                // Every integer here is within ±2^64, far inside i128; a
                // float beyond i128 saturates the cast and so differs, and
                // an infinity or NaN has no zero fraction.
                f.fract() == 0.0 && f as i128 == i
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn strict(a: Value, b: Value) -> bool {
        same::<Value, Value>(a.kind(), b.kind())
    }

    #[test]
    fn at_the_top_types_must_match() {
        assert!(strict(json!(1), json!(1)));
        assert!(!strict(json!(1), json!(1.0)));
        assert!(!strict(json!(true), json!(1)));
        assert!(!strict(json!(0), json!(false)));
        assert!(strict(json!(null), json!(null)));
        assert!(strict(json!(-0.0), json!(0.0)));
        assert!(strict(json!(u64::MAX), json!(u64::MAX)));
        assert!(!strict(json!(-1), json!(u64::MAX)));
    }

    #[test]
    fn inside_arrays_and_objects_numbers_compare_by_value() {
        assert!(strict(json!([1]), json!([1.0])));
        assert!(strict(json!([true]), json!([1])));
        assert!(strict(json!([false]), json!([0.0])));
        assert!(strict(
            json!({"a": [1, {"b": true}]}),
            json!({"a": [1.0, {"b": 1}]})
        ));
        assert!(!strict(json!([2]), json!([true])));
        assert!(!strict(json!([1]), json!([1, 1])));
        assert!(!strict(json!({"a": 1}), json!({"a": 1, "b": 2})));
        assert!(!strict(json!({"a": 1}), json!({"b": 1})));
        assert!(!strict(json!(["1"]), json!([1])));
        assert!(!strict(json!([null]), json!([0])));
    }

    #[test]
    fn an_integer_equals_a_float_only_when_exactly_equal() {
        // 2^53 + 1 has no f64; the nearest float is 2^53.
        assert!(!strict(
            json!([9007199254740993_u64]),
            json!([9007199254740992.0])
        ));
        assert!(strict(
            json!([9007199254740992_u64]),
            json!([9007199254740992.0])
        ));
        assert!(strict(json!([u64::MAX]), json!([u64::MAX])));
        assert!(!strict(json!([u64::MAX]), json!([18446744073709551615.0])));
        assert!(!strict(json!([1]), json!([1.5])));
    }
}
