//! The payload schema check against the reference, the BabelQueue Python
//! SDK's `babelqueue.schema` (its interpreter in `BABEL_IDEM_PYTHON`).
//!
//! A seeded generator makes 12,000 (schema, data) pairs within the family's
//! subset and around its edges: `1.0` as an integer, booleans against
//! numbers, `minLength` counted in code points over non-ASCII and astral
//! characters (raw or `\u`-escaped), `const` and `enum` with `1`, `1.0`
//! and `true`, nested `[1]` against `[1.0]`, a `null` const,
//! `additionalProperties` false, `0` and `true`, `required` with
//! non-string entries, keywords of the wrong shape, nested arrays and
//! objects, several violations in one value, members out of sorted order
//! and names given twice. One Python process checks every pair
//! (`tests/python/schema_peer.py`), and [`Schema::check_json`] must agree
//! with it on every verdict and every violation text. [`Schema::check`]
//! over a `serde_json::Value` must agree on every verdict.
//!
//! Without `BABEL_IDEM_PYTHON` the test prints `skipped:` and passes (fails
//! with `BABEL_IDEM_REQUIRE_SERVERS=1`).

#[path = "support/python.rs"]
mod python;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::process::{Command, Stdio};

use babel_idem::schema::Schema;
use serde_json::{Value, json};

const PAIRS: usize = 12_000;
const SEED: u64 = 0x5c4e_3a11_d00d_f00d;
const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/schema_peer.py");
/// Every reason the validators report; each must come up in the run.
const REASONS: [&str; 13] = [
    "wrong_const",
    "not_in_enum",
    "not_an_object",
    "missing_required",
    "additional_not_allowed",
    "not_an_array",
    "not_a_string",
    "below_min_length",
    "not_an_integer",
    "not_a_number",
    "below_minimum",
    "not_a_boolean",
    "not_null",
];

/// SplitMix64: the same pairs on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    fn word(&mut self, words: &[&'static str]) -> &'static str {
        words[self.below(words.len())]
    }

    fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            items.swap(i, self.below(i + 1));
        }
    }
}

/// A JSON value as it is written: numbers as their literal, objects in
/// the order given, a name possibly twice.
#[derive(Debug, Clone)]
enum J {
    Null,
    Bool(bool),
    Num(String),
    Str(String),
    Arr(Vec<J>),
    Obj(Vec<(String, J)>),
}

fn num(literal: &str) -> J {
    J::Num(literal.to_owned())
}

fn text(s: &str) -> J {
    J::Str(s.to_owned())
}

impl J {
    /// The JSON text, with escapes and whitespace chosen by `rng`.
    fn render(&self, rng: &mut Rng, out: &mut String) {
        if rng.chance(4) {
            out.push_str(rng.word(&[" ", "\n", "\t ", "\r\n"]));
        }
        match self {
            J::Null => out.push_str("null"),
            J::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            J::Num(literal) => out.push_str(literal),
            J::Str(s) => render_str(s, rng, out),
            J::Arr(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    item.render(rng, out);
                }
                out.push(']');
            }
            J::Obj(members) => {
                out.push('{');
                for (i, (name, value)) in members.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    render_str(name, rng, out);
                    out.push_str(if rng.chance(30) { ": " } else { ":" });
                    value.render(rng, out);
                }
                out.push('}');
            }
        }
    }

    fn to_text(&self, rng: &mut Rng) -> String {
        let mut out = String::new();
        self.render(rng, &mut out);
        out
    }
}

/// A string literal, its characters written raw or as `\u` escapes
/// (astral ones as surrogate pairs).
fn render_str(s: &str, rng: &mut Rng, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str(if rng.chance(50) { "\\\\" } else { "\\u005c" }),
            '\n' => out.push_str(if rng.chance(50) { "\\n" } else { "\\u000a" }),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if (!c.is_ascii() && rng.chance(35)) || rng.chance(3) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04X}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// The names of members, shared by schemas and data so they meet.
const NAMES: [&str; 13] = [
    "a", "b", "c", "id", "order_id", "é", "𝄞", "", "a.b", "x y", "[0]", "B", "aa",
];

const STRINGS: [&str; 22] = [
    "",
    "a",
    "ab",
    "abc",
    "abcd",
    "é",
    "éé",
    "e\u{301}",
    "𝄞",
    "𝄞𝄞",
    "𝄞é",
    "日本",
    "日本語",
    "web",
    "EUR",
    "x y",
    "a.b",
    "\n\t",
    "\"q\"",
    "\\",
    "\u{0}\u{7f}",
    "1",
];

/// Number literals a schema and data share.
const NUMBERS: [&str; 34] = [
    "0",
    "-0",
    "1",
    "-1",
    "2",
    "3",
    "7",
    "-7",
    "100",
    "9007199254740992",
    "9007199254740993",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775808",
    "18446744073709551615",
    "0.0",
    "-0.0",
    "1.0",
    "1.5",
    "2.0",
    "-1.5",
    "0.5",
    "1e0",
    "1E+0",
    "10e-1",
    "2.5e0",
    "1e2",
    "1e20",
    "9007199254740993.0",
    "18446744073709551615.0",
    "1.7976931348623157e308",
    "5e-324",
    "0.1",
    "-2.9",
];

/// Literals only data holds: Python reads them as infinities, which a
/// schema (a `serde_json::Value`) cannot hold.
const DATA_ONLY_NUMBERS: [&str; 2] = ["1e400", "-1e400"];

/// A value of any kind, small, as data or (`in_schema`) as a keyword's value.
fn value(rng: &mut Rng, depth: usize, in_schema: bool) -> J {
    let kinds = if depth >= 4 { 5 } else { 8 };
    match rng.below(kinds) {
        0 => J::Null,
        1 => J::Bool(rng.chance(50)),
        2 | 3 if !in_schema && rng.chance(3) => num(rng.word(&DATA_ONLY_NUMBERS)),
        2 | 3 => num(rng.word(&NUMBERS)),
        4 => text(rng.word(&STRINGS)),
        5 | 6 => J::Arr(
            (0..rng.below(4))
                .map(|_| value(rng, depth + 1, in_schema))
                .collect(),
        ),
        _ => J::Obj(
            (0..rng.below(4))
                .map(|_| {
                    let name = rng.word(&NAMES).to_owned();
                    (name, value(rng, depth + 1, in_schema))
                })
                .collect(),
        ),
    }
}

/// A value equal to `v` under Python's `==`, or a near miss: `1` as `1.0`
/// or `true`, `[1]` as `[1.0]`, members reordered.
fn twin(rng: &mut Rng, v: &J) -> J {
    match v {
        J::Num(literal) if rng.chance(60) => {
            let float: f64 = literal.parse().unwrap();
            let integral = !literal.contains(['.', 'e', 'E']);
            let mut forms = vec![literal.clone()];
            if integral && float.abs() < 1e15 {
                forms.push(format!("{literal}.0"));
                forms.push(format!("{literal}e0"));
            }
            if !integral && float.fract() == 0.0 && float.abs() < 1e15 {
                forms.push(format!("{}", float as i64));
            }
            if float == 1.0 {
                return if rng.chance(50) {
                    J::Bool(true)
                } else {
                    J::Num(rng.pick(&forms).clone())
                };
            }
            if float == 0.0 {
                return if rng.chance(50) {
                    J::Bool(false)
                } else {
                    J::Num(rng.pick(&forms).clone())
                };
            }
            J::Num(rng.pick(&forms).clone())
        }
        J::Bool(b) if rng.chance(40) => num(match (b, rng.chance(50)) {
            (true, true) => "1",
            (true, false) => "1.0",
            (false, true) => "0",
            (false, false) => "0.0",
        }),
        J::Arr(items) => {
            let mut items: Vec<J> = items.iter().map(|item| twin(rng, item)).collect();
            if rng.chance(8) {
                items.push(value(rng, 3, false));
            }
            J::Arr(items)
        }
        J::Obj(members) => {
            let mut members: Vec<(String, J)> = members
                .iter()
                .map(|(name, value)| (name.clone(), twin(rng, value)))
                .collect();
            rng.shuffle(&mut members);
            J::Obj(members)
        }
        J::Null if rng.chance(15) => num("0"),
        other => other.clone(),
    }
}

/// A schema node as generated: the keywords kept apart, so data can be
/// made to meet (or just miss) them.
#[derive(Debug, Default)]
struct S {
    kind: Option<J>,
    constant: Option<J>,
    one_of: Option<J>,
    required: Option<J>,
    properties: Option<Properties>,
    additional: Option<J>,
    items: Option<Items>,
    min_length: Option<J>,
    minimum: Option<J>,
    unknown: Vec<(String, J)>,
}

#[derive(Debug)]
enum Properties {
    Named(Vec<(String, Property)>),
    Odd(J),
}

#[derive(Debug)]
enum Property {
    Schema(Box<S>),
    Odd(J),
}

#[derive(Debug)]
enum Items {
    Schema(Box<S>),
    Odd(J),
}

impl S {
    fn kind(&self) -> Option<&str> {
        match &self.kind {
            Some(J::Str(kind)) => Some(kind),
            _ => None,
        }
    }

    fn to_j(&self, rng: &mut Rng) -> J {
        let mut members: Vec<(String, J)> = Vec::new();
        let mut put = |name: &str, value: &Option<J>| {
            if let Some(value) = value {
                members.push((name.to_owned(), value.clone()));
            }
        };
        put("type", &self.kind);
        put("const", &self.constant);
        put("enum", &self.one_of);
        put("required", &self.required);
        put("additionalProperties", &self.additional);
        put("minLength", &self.min_length);
        put("minimum", &self.minimum);
        match &self.properties {
            Some(Properties::Named(named)) => {
                let named = named
                    .iter()
                    .map(|(name, property)| {
                        let value = match property {
                            Property::Schema(schema) => schema.to_j(rng),
                            Property::Odd(odd) => odd.clone(),
                        };
                        (name.clone(), value)
                    })
                    .collect();
                members.push(("properties".to_owned(), J::Obj(named)));
            }
            Some(Properties::Odd(odd)) => members.push(("properties".to_owned(), odd.clone())),
            None => {}
        }
        match &self.items {
            Some(Items::Schema(schema)) => members.push(("items".to_owned(), schema.to_j(rng))),
            Some(Items::Odd(odd)) => members.push(("items".to_owned(), odd.clone())),
            None => {}
        }
        members.extend(self.unknown.iter().cloned());
        rng.shuffle(&mut members);
        J::Obj(members)
    }
}

fn odd(rng: &mut Rng) -> J {
    match rng.below(5) {
        0 => num("1"),
        1 => text("a"),
        2 => J::Arr(vec![text("a")]),
        3 => J::Null,
        _ => J::Bool(true),
    }
}

fn schema(rng: &mut Rng, depth: usize) -> S {
    let nested = depth < 4;
    let kind = match rng.below(20) {
        0..=4 if nested => Some(text("object")),
        5..=6 if nested => Some(text("array")),
        0..=8 => Some(text("string")),
        9..=10 => Some(text("integer")),
        11..=12 => Some(text("number")),
        13 => Some(text("boolean")),
        14 => Some(text("null")),
        15..=16 => None,
        17 => Some(
            rng.pick(&[
                text("float"),
                J::Arr(vec![text("string")]),
                num("1"),
                J::Null,
                text("Object"),
            ])
            .clone(),
        ),
        _ if nested => Some(text("object")),
        _ => Some(text("string")),
    };
    let mut s = S {
        kind,
        ..S::default()
    };
    if rng.chance(12) {
        s.constant = Some(value(rng, depth + 2, true));
    }
    if rng.chance(12) {
        s.one_of = Some(if rng.chance(88) {
            J::Arr(
                (0..rng.below(5))
                    .map(|_| value(rng, depth + 2, true))
                    .collect(),
            )
        } else {
            odd(rng)
        });
    }
    let kind = s.kind().unwrap_or_default().to_owned();
    if kind == "object" || rng.chance(4) {
        if rng.chance(70) {
            s.required = Some(if rng.chance(90) {
                J::Arr(
                    (0..1 + rng.below(3))
                        .map(|_| match rng.below(10) {
                            0 => num("1"),
                            1 => J::Null,
                            _ => text(rng.word(&NAMES)),
                        })
                        .collect(),
                )
            } else {
                text("a")
            });
        }
        if rng.chance(85) && nested {
            s.properties = Some(if rng.chance(93) {
                let mut names: Vec<&str> = NAMES.to_vec();
                rng.shuffle(&mut names);
                Properties::Named(
                    names[..rng.below(5)]
                        .iter()
                        .map(|name| {
                            let property = if rng.chance(90) {
                                Property::Schema(Box::new(schema(rng, depth + 1)))
                            } else {
                                Property::Odd(odd(rng))
                            };
                            (name.to_string(), property)
                        })
                        .collect(),
                )
            } else {
                Properties::Odd(J::Arr(vec![text("a")]))
            });
        }
        if rng.chance(45) {
            s.additional = Some(
                rng.pick(&[
                    J::Bool(false),
                    J::Bool(false),
                    J::Bool(false),
                    J::Bool(true),
                    num("0"),
                    J::Null,
                    text("no"),
                    J::Obj(Vec::new()),
                ])
                .clone(),
            );
        }
    }
    if (kind == "array" || rng.chance(3)) && nested && rng.chance(80) {
        s.items = Some(if rng.chance(90) {
            Items::Schema(Box::new(schema(rng, depth + 1)))
        } else {
            Items::Odd(odd(rng))
        });
    }
    if (kind == "string" || rng.chance(4)) && rng.chance(60) {
        s.min_length = Some(
            rng.pick(&[
                num("0"),
                num("1"),
                num("2"),
                num("3"),
                num("4"),
                num("2.9"),
                num("1.5"),
                num("-1"),
                num("-0.5"),
                J::Bool(true),
                J::Bool(false),
                num("1e30"),
                text("3"),
                J::Null,
                num("0.0"),
            ])
            .clone(),
        );
    }
    if (kind == "integer" || kind == "number" || rng.chance(4)) && rng.chance(60) {
        s.minimum = Some(if rng.chance(80) {
            num(rng.word(&NUMBERS))
        } else {
            rng.pick(&[J::Bool(true), J::Bool(false), text("1"), J::Null])
                .clone()
        });
    }
    if rng.chance(10) {
        let unknown = [
            ("maxLength", num("1")),
            ("$schema", text("http://json-schema.org/draft-07/schema#")),
            ("pattern", text("^a$")),
            ("maximum", num("0")),
        ];
        let (name, value) = rng.pick(&unknown);
        s.unknown.push((name.to_string(), value.clone()));
    }
    s
}

/// Data for `s`: mostly near it (valid, or off by one rule), sometimes
/// anything.
fn data(rng: &mut Rng, s: &S, depth: usize) -> J {
    if depth > 6 || rng.chance(10) {
        return value(rng, depth, false);
    }
    if let Some(constant) = &s.constant
        && rng.chance(55)
    {
        return twin(rng, constant);
    }
    if let Some(J::Arr(allowed)) = &s.one_of
        && !allowed.is_empty()
        && rng.chance(55)
    {
        let chosen = rng.pick(allowed).clone();
        return twin(rng, &chosen);
    }
    match s.kind() {
        Some("object") => object_data(rng, s, depth),
        Some("array") => J::Arr(
            (0..rng.below(5))
                .map(|_| match &s.items {
                    Some(Items::Schema(items)) if rng.chance(90) => data(rng, items, depth + 1),
                    _ => value(rng, depth + 1, false),
                })
                .collect(),
        ),
        Some("string") => match rng.below(12) {
            0 => num("1"),
            _ => text(rng.word(&STRINGS)),
        },
        Some("integer" | "number") => match rng.below(14) {
            0 => J::Bool(rng.chance(50)),
            1 => text("1"),
            2 => num(rng.word(&DATA_ONLY_NUMBERS)),
            _ => num(rng.word(&NUMBERS)),
        },
        Some("boolean") => match rng.below(6) {
            0 => num(rng.word(&["0", "1"])),
            _ => J::Bool(rng.chance(50)),
        },
        Some("null") if rng.chance(80) => J::Null,
        _ => value(rng, depth, false),
    }
}

fn object_data(rng: &mut Rng, s: &S, depth: usize) -> J {
    let named: &[(String, Property)] = match &s.properties {
        Some(Properties::Named(named)) => named,
        _ => &[],
    };
    let mut names: Vec<String> = Vec::new();
    if let Some(J::Arr(required)) = &s.required {
        for name in required {
            if let J::Str(name) = name
                && rng.chance(88)
            {
                names.push(name.clone());
            }
        }
    }
    for (name, _) in named {
        if rng.chance(60) {
            names.push(name.clone());
        }
    }
    if rng.chance(25) {
        names.push(rng.word(&NAMES).to_owned());
    }
    let mut seen = Vec::new();
    names.retain(|name| {
        let first = !seen.contains(name);
        seen.push(name.clone());
        first
    });
    let mut members: Vec<(String, J)> = names
        .into_iter()
        .map(|name| {
            let value = match named.iter().find(|(named, _)| *named == name) {
                Some((_, Property::Schema(property))) => data(rng, property, depth + 1),
                _ => value(rng, depth + 1, false),
            };
            (name, value)
        })
        .collect();
    rng.shuffle(&mut members);
    // A name given twice: Python keeps its first place and last value.
    if !members.is_empty() && rng.chance(6) {
        let (name, _) = members[rng.below(members.len())].clone();
        let value = match named.iter().find(|(named, _)| *named == name) {
            Some((_, Property::Schema(property))) => data(rng, property, depth + 1),
            _ => value(rng, depth + 1, false),
        };
        let at = rng.below(members.len() + 1);
        members.insert(at, (name, value));
    }
    J::Obj(members)
}

/// One generated pair, as the texts both sides read.
struct Pair {
    schema: String,
    data: String,
    /// Whether an object of the data gives a member name twice.
    repeats_a_name: bool,
}

fn repeats_a_name(value: &J) -> bool {
    match value {
        J::Obj(members) => {
            members
                .iter()
                .enumerate()
                .any(|(i, (name, _))| members[..i].iter().any(|(other, _)| other == name))
                || members.iter().any(|(_, value)| repeats_a_name(value))
        }
        J::Arr(items) => items.iter().any(repeats_a_name),
        _ => false,
    }
}

fn pairs() -> Vec<Pair> {
    let mut rng = Rng(SEED);
    (0..PAIRS)
        .map(|_| {
            let mut root = schema(&mut rng, 0);
            if rng.chance(80) {
                root.kind = Some(text("object"));
                if root.properties.is_none() {
                    root.properties = Some(Properties::Named(vec![(
                        rng.word(&NAMES).to_owned(),
                        Property::Schema(Box::new(schema(&mut rng, 1))),
                    )]));
                }
            }
            let data = data(&mut rng, &root, 0);
            Pair {
                schema: root.to_j(&mut rng).to_text(&mut rng),
                data: data.to_text(&mut rng),
                repeats_a_name: repeats_a_name(&data),
            }
        })
        .collect()
}

/// Python's answer for each pair: its violation text, or `None` when valid.
fn ask_python(python: &std::path::Path, pairs: &[Pair]) -> Vec<Result<Option<String>, String>> {
    let mut child = Command::new(python)
        .arg(SCRIPT)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|error| panic!("cannot run {}: {error}", python.display()));
    let mut input = String::new();
    for pair in pairs {
        let line = json!({"schema": pair.schema, "data": pair.data});
        input.push_str(&line.to_string());
        input.push('\n');
    }
    let mut stdin = child.stdin.take().unwrap();
    // Written from another thread: the script answers while it reads, and
    // both pipes have bounded buffers.
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let output = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    assert!(
        output.status.success(),
        "schema_peer.py failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let answers: Vec<_> = String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|line| {
            let answer: Value = serde_json::from_str(line).unwrap();
            match (&answer["violation"], &answer["error"]) {
                (_, Value::String(error)) => Err(error.clone()),
                (Value::String(violation), _) => Ok(Some(violation.clone())),
                _ => Ok(None),
            }
        })
        .collect();
    assert_eq!(answers.len(), pairs.len(), "one answer per pair");
    answers
}

/// The check of one pair through the document-ordered path.
fn ours(pair: &Pair) -> Result<Option<String>, String> {
    let schema = Schema::from_json(&pair.schema).map_err(|error| error.to_string())?;
    let verdict = schema
        .check_json(&pair.data)
        .map_err(|error| error.to_string())?;
    Ok(verdict.err().map(|violation| violation.to_string()))
}

/// The verdict through a `serde_json::Value`, where serde_json reads the
/// data as Python does: everywhere but the literal `-0`, which it reads as
/// a float.
fn value_verdict(pair: &Pair) -> Option<bool> {
    if pair.data.contains("-0") {
        return None;
    }
    let data: Value = serde_json::from_str(&pair.data).ok()?;
    let schema = Schema::from_json(&pair.schema).ok()?;
    let verdict = schema.check(&data).is_ok();
    if let Value::Object(map) = &data {
        assert_eq!(
            schema.check_map(map).is_ok(),
            verdict,
            "check_map of {}",
            pair.data
        );
    }
    Some(verdict)
}

#[test]
fn every_verdict_and_violation_text_matches_the_python_sdk() {
    let Some(python) = python::python("schema_parity") else {
        return;
    };
    let pairs = pairs();
    let answers = ask_python(&python, &pairs);

    let mut disagreements = Vec::new();
    let mut value_disagreements = Vec::new();
    let mut reasons: BTreeMap<&str, usize> = BTreeMap::new();
    let mut valid = 0;
    for (pair, theirs) in pairs.iter().zip(&answers) {
        let mine = ours(pair);
        if mine != *theirs {
            disagreements.push((pair, mine.clone(), theirs.clone()));
        }
        match theirs {
            Ok(None) => valid += 1,
            Ok(Some(violation)) => {
                let reason = violation.rsplit_once(": ").map_or("", |(_, reason)| reason);
                if let Some(known) = REASONS.iter().find(|known| **known == reason) {
                    *reasons.entry(known).or_default() += 1;
                }
            }
            Err(_) => {}
        }
        if let (Some(verdict), Ok(theirs)) = (value_verdict(pair), theirs)
            && verdict != theirs.is_none()
        {
            value_disagreements.push(pair);
        }
    }

    let mut report = String::new();
    for (pair, mine, theirs) in disagreements.iter().take(5) {
        let _ = writeln!(
            report,
            "schema: {:?}\ndata:   {:?}\nrust:   {mine:?}\npython: {theirs:?}\n",
            pair.schema, pair.data
        );
    }
    assert!(
        disagreements.is_empty(),
        "{} of {} pairs disagree with the Python SDK; the first:\n{report}",
        disagreements.len(),
        pairs.len()
    );
    let first_value = value_disagreements
        .first()
        .map(|pair| format!("schema: {:?}\ndata:   {:?}", pair.schema, pair.data));
    assert!(
        value_disagreements.is_empty(),
        "{} verdicts of Schema::check differ; the first:\n{}",
        value_disagreements.len(),
        first_value.unwrap_or_default()
    );

    // The generator reaches every rule, both verdicts and the edges the
    // module docs name, so agreement means something.
    println!("{} pairs, {valid} valid; reasons: {reasons:?}", pairs.len());
    let count = |edge: fn(&Pair) -> bool| pairs.iter().filter(|pair| edge(pair)).count();
    for (edge, found) in [
        (
            "a member name given twice",
            count(|pair| pair.repeats_a_name),
        ),
        (
            "data that is not an object",
            count(|pair| !pair.data.trim_start().starts_with('{')),
        ),
        (
            "an astral character as a surrogate pair",
            count(|pair| pair.data.contains("\\uD834")),
        ),
        (
            "an astral character written raw",
            count(|pair| pair.data.contains('𝄞')),
        ),
        (
            "the integer literal -0",
            count(|pair| {
                pair.data.contains("-0,") || pair.data.contains("-0]") || pair.data.contains("-0}")
            }),
        ),
        (
            "an integral float",
            count(|pair| pair.data.contains(".0") || pair.data.contains("e0")),
        ),
        (
            "a number beyond f64",
            count(|pair| pair.data.contains("1e400")),
        ),
    ] {
        assert!(found >= 50, "only {found} pairs hold {edge}");
    }
    for reason in REASONS {
        let count = reasons.get(reason).copied().unwrap_or(0);
        assert!(
            count >= 20,
            "only {count} pairs report {reason}: {reasons:?}"
        );
    }
    assert!(
        (PAIRS / 5..=PAIRS * 4 / 5).contains(&valid),
        "{valid} of {PAIRS} pairs are valid"
    );
}
