//! Generators shared by the envelope property tests (`envelope_props.rs`,
//! `envelope_python.rs`).
#![allow(dead_code, unreachable_pub)]

use proptest::collection::vec;
use proptest::prelude::*;

/// Strings that lean on the hard cases: printable unicode, any `char` at all
/// (control characters and NUL included), and a few fixed awkward ones.
pub fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => any::<String>(),
        2 => vec(any::<char>(), 0..12).prop_map(String::from_iter),
        1 => Just(String::new()),
        1 => Just("\0\n\r\t\"\\/\u{7f}\u{85}\u{2028}\u{feff}\u{200d}\u{10ffff}".to_owned()),
        1 => Just("Çay — 日本語 🚀 עברית".to_owned()),
    ]
}

/// Finite floats at and near the edges (JSON has no NaN or infinity),
/// spelled differently by Python (`1e-07`, `1e+16`) and Rust (`1e-7`, `1e16`).
pub fn finite_float() -> impl Strategy<Value = f64> {
    prop_oneof![
        Just(f64::MAX),
        Just(f64::MIN),
        Just(f64::MIN_POSITIVE),
        Just(5e-324),
        Just(-0.0),
        Just(0.1),
        Just(1e-7),
        Just(1e16),
        Just(1e22),
        any::<f64>().prop_filter("JSON has no NaN or infinity", |f| f.is_finite()),
    ]
}

/// The known members of each block, as the wire spells them.
pub const TOP_LEVEL_FIELDS: &[&str] = &[
    "job",
    "urn",
    "trace_id",
    "data",
    "meta",
    "attempts",
    "dead_letter",
];
pub const META_FIELDS: &[&str] = &["id", "queue", "lang", "schema_version", "created_at"];
pub const DEAD_LETTER_FIELDS: &[&str] = &[
    "reason",
    "error",
    "exception",
    "failed_at",
    "original_queue",
    "attempts",
    "lang",
];
