//! JSON text read into a tree that keeps every object's members in document
//! order, with numbers typed as Python's `json.loads` types them.
//!
//! Python's reading is the reference: an integer literal (no fraction, no
//! exponent, `-0` included) is an `int`, anything else a `float` (`1e400`
//! is infinity); a name given twice keeps the place of its first occurrence
//! and the value of its last. Strings borrow from the text unless they hold
//! an escape. The grammar is RFC 8259's, which Python's strict reading also
//! follows, without its `NaN`/`Infinity` extensions.

use std::borrow::Cow;

use super::instance::{Instance, Kind, Members};

/// How deep arrays and objects may nest, as `serde_json` allows.
pub(super) const MAX_DEPTH: usize = 128;

/// A JSON value with its objects in document order.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Json<'t> {
    Null,
    Bool(bool),
    /// An integer literal within the range of `i64` or `u64`.
    Int(i128),
    /// A literal with a fraction or an exponent, or an integer beyond 64 bits.
    Float(f64),
    Str(Cow<'t, str>),
    Array(Vec<Json<'t>>),
    Object(Vec<(Cow<'t, str>, Json<'t>)>),
}

/// Where and why a text is not JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct SyntaxError {
    /// The byte offset in the text where reading stopped.
    pub(super) offset: usize,
    pub(super) reason: &'static str,
}

/// Whether a literal beyond `f64` (`1e400`) is read as an infinity, as
/// Python reads it, or refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Infinite {
    Read,
    Refuse,
}

/// Reads `text`, which must hold one JSON value and nothing else but
/// whitespace.
pub(super) fn parse(text: &str, infinite: Infinite) -> Result<Json<'_>, SyntaxError> {
    let mut reader = Reader {
        text,
        bytes: text.as_bytes(),
        at: 0,
        depth: 0,
        infinite,
    };
    reader.skip_whitespace();
    let value = reader.value()?;
    reader.skip_whitespace();
    if reader.at < reader.bytes.len() {
        return Err(reader.error("trailing characters after the value"));
    }
    Ok(value)
}

struct Reader<'t> {
    text: &'t str,
    bytes: &'t [u8],
    at: usize,
    depth: usize,
    infinite: Infinite,
}

impl<'t> Reader<'t> {
    fn error(&self, reason: &'static str) -> SyntaxError {
        SyntaxError {
            offset: self.at,
            reason,
        }
    }

    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.at).copied()
    }

    fn skip_whitespace(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.at += 1;
        }
    }

    fn expect(&mut self, byte: u8, reason: &'static str) -> Result<(), SyntaxError> {
        if self.peek() == Some(byte) {
            self.at += 1;
            Ok(())
        } else {
            Err(self.error(reason))
        }
    }

    fn value(&mut self) -> Result<Json<'t>, SyntaxError> {
        match self.peek() {
            Some(b'{') => self.nested(Self::object),
            Some(b'[') => self.nested(Self::array),
            Some(b'"') => self.string().map(Json::Str),
            Some(b't') => self.word("true", Json::Bool(true)),
            Some(b'f') => self.word("false", Json::Bool(false)),
            Some(b'n') => self.word("null", Json::Null),
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(_) => Err(self.error("expected a value")),
            None => Err(self.error("the text ends where a value is expected")),
        }
    }

    /// Runs `read` one level deeper, refusing to pass [`MAX_DEPTH`].
    fn nested(
        &mut self,
        read: fn(&mut Self) -> Result<Json<'t>, SyntaxError>,
    ) -> Result<Json<'t>, SyntaxError> {
        if self.depth == MAX_DEPTH {
            return Err(self.error("arrays and objects nest deeper than 128 levels"));
        }
        self.depth += 1;
        let value = read(self);
        self.depth -= 1;
        value
    }

    fn word(&mut self, word: &'static str, value: Json<'t>) -> Result<Json<'t>, SyntaxError> {
        if self.bytes[self.at..].starts_with(word.as_bytes()) {
            self.at += word.len();
            Ok(value)
        } else {
            Err(self.error("expected a value"))
        }
    }

    fn array(&mut self) -> Result<Json<'t>, SyntaxError> {
        self.at += 1;
        let mut items = Vec::new();
        self.skip_whitespace();
        if self.peek() == Some(b']') {
            self.at += 1;
            return Ok(Json::Array(items));
        }
        loop {
            self.skip_whitespace();
            items.push(self.value()?);
            self.skip_whitespace();
            match self.peek() {
                Some(b',') => self.at += 1,
                Some(b']') => {
                    self.at += 1;
                    return Ok(Json::Array(items));
                }
                _ => return Err(self.error("expected `,` or `]` after an array item")),
            }
        }
    }

    fn object(&mut self) -> Result<Json<'t>, SyntaxError> {
        self.at += 1;
        let mut members = Vec::new();
        self.skip_whitespace();
        if self.peek() == Some(b'}') {
            self.at += 1;
            return Ok(Json::Object(members));
        }
        loop {
            self.skip_whitespace();
            if self.peek() != Some(b'"') {
                return Err(self.error("expected a member name in double quotes"));
            }
            let name = self.string()?;
            self.skip_whitespace();
            self.expect(b':', "expected `:` after a member name")?;
            self.skip_whitespace();
            let value = self.value()?;
            members.push((name, value));
            self.skip_whitespace();
            match self.peek() {
                Some(b',') => self.at += 1,
                Some(b'}') => {
                    self.at += 1;
                    dedupe(&mut members);
                    return Ok(Json::Object(members));
                }
                _ => return Err(self.error("expected `,` or `}` after an object member")),
            }
        }
    }

    /// A string at the opening quote; borrowed when it holds no escape.
    fn string(&mut self) -> Result<Cow<'t, str>, SyntaxError> {
        self.at += 1;
        let start = self.at;
        let mut owned: Option<String> = None;
        let mut chunk = start;
        loop {
            let Some(byte) = self.peek() else {
                return Err(self.error("the text ends inside a string"));
            };
            match byte {
                b'"' => {
                    let text = &self.text[chunk..self.at];
                    self.at += 1;
                    return Ok(match owned {
                        Some(mut owned) => {
                            owned.push_str(text);
                            Cow::Owned(owned)
                        }
                        None => Cow::Borrowed(text),
                    });
                }
                b'\\' => {
                    let decoded = owned.get_or_insert_with(String::new);
                    decoded.push_str(&self.text[chunk..self.at]);
                    self.at += 1;
                    decoded.push(self.escape()?);
                    chunk = self.at;
                }
                0x00..=0x1f => return Err(self.error("a control character inside a string")),
                _ => self.at += 1,
            }
        }
    }

    /// The character of the escape after a backslash.
    fn escape(&mut self) -> Result<char, SyntaxError> {
        let Some(byte) = self.peek() else {
            return Err(self.error("the text ends inside a string"));
        };
        self.at += 1;
        Ok(match byte {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => return self.unicode_escape(),
            _ => {
                self.at -= 1;
                return Err(self.error("an unknown escape in a string"));
            }
        })
    }

    /// A `\uXXXX` escape after its `u`, joined with the low surrogate
    /// that must follow a high one.
    fn unicode_escape(&mut self) -> Result<char, SyntaxError> {
        let first = self.hex4()?;
        let code = match first {
            0xD800..=0xDBFF => {
                if !self.bytes[self.at..].starts_with(b"\\u") {
                    return Err(self.error("a high surrogate escape without its low surrogate"));
                }
                self.at += 2;
                let second = self.hex4()?;
                if !(0xDC00..=0xDFFF).contains(&second) {
                    return Err(self.error("a high surrogate escape without its low surrogate"));
                }
                0x10000 + ((first - 0xD800) << 10) + (second - 0xDC00)
            }
            0xDC00..=0xDFFF => {
                return Err(self.error("a low surrogate escape without its high surrogate"));
            }
            other => other,
        };
        char::from_u32(code).ok_or_else(|| self.error("an escape that is no character"))
    }

    fn hex4(&mut self) -> Result<u32, SyntaxError> {
        let digits = self
            .bytes
            .get(self.at..self.at + 4)
            .filter(|digits| digits.iter().all(u8::is_ascii_hexdigit))
            .ok_or_else(|| self.error("`\\u` without four hex digits"))?;
        // Four ASCII hex digits: the text and the number are both valid.
        let digits = std::str::from_utf8(digits).unwrap_or_default();
        let value = u32::from_str_radix(digits, 16).unwrap_or_default();
        self.at += 4;
        Ok(value)
    }

    fn digits(&mut self) -> usize {
        let start = self.at;
        while let Some(b'0'..=b'9') = self.peek() {
            self.at += 1;
        }
        self.at - start
    }

    fn number(&mut self) -> Result<Json<'t>, SyntaxError> {
        let start = self.at;
        if self.peek() == Some(b'-') {
            self.at += 1;
        }
        match self.peek() {
            Some(b'0') => self.at += 1,
            Some(b'1'..=b'9') => {
                self.digits();
            }
            _ => return Err(self.error("a number without digits")),
        }
        let mut integer = true;
        if self.peek() == Some(b'.') {
            integer = false;
            self.at += 1;
            if self.digits() == 0 {
                return Err(self.error("a number without digits after its `.`"));
            }
        }
        if let Some(b'e' | b'E') = self.peek() {
            integer = false;
            self.at += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.at += 1;
            }
            if self.digits() == 0 {
                return Err(self.error("a number without digits in its exponent"));
            }
        }
        let literal = &self.text[start..self.at];
        if integer {
            let int = match literal.strip_prefix('-') {
                Some(_) => literal.parse::<i64>().ok().map(i128::from),
                None => literal.parse::<u64>().ok().map(i128::from),
            };
            if let Some(int) = int {
                return Ok(Json::Int(int));
            }
        }
        // Rust's float reading rounds correctly, as Python's does; a grammar
        // checked above always reads.
        let float = literal.parse::<f64>().unwrap_or(f64::NAN);
        if float.is_infinite() && self.infinite == Infinite::Refuse {
            self.at = start;
            return Err(self.error("a number beyond the range of a 64-bit float"));
        }
        Ok(Json::Float(float))
    }
}

/// Leaves each member name once, where it first occurs, with the value of
/// its last occurrence (Python's `dict` filled in document order).
fn dedupe(members: &mut Vec<(Cow<'_, str>, Json<'_>)>) {
    let count = members.len();
    if count < 2 {
        return;
    }
    // Small objects are searched in place, without allocating.
    if count <= 16
        && !(1..count).any(|i| members[..i].iter().any(|(name, _)| *name == members[i].0))
    {
        return;
    }
    let mut order: Vec<usize> = (0..count).collect();
    // Stable: the occurrences of one name stay in document order.
    order.sort_by(|a, b| members[*a].0.cmp(&members[*b].0));
    let mut later = vec![false; count];
    // Each name given twice: (its first place, its last occurrence).
    let mut moves = Vec::new();
    for group in order.chunk_by(|a, b| members[*a].0 == members[*b].0) {
        if let [first, .., last] = *group {
            moves.push((first, last));
            for &index in &group[1..] {
                later[index] = true;
            }
        }
    }
    let any = !moves.is_empty();
    for (first, last) in moves {
        members[first].1 = std::mem::replace(&mut members[last].1, Json::Null);
    }
    if any {
        let mut index = 0;
        members.retain(|_| {
            let keep = !later[index];
            index += 1;
            keep
        });
    }
}

impl<'t> Instance for Json<'t> {
    type Object = [(Cow<'t, str>, Json<'t>)];

    fn kind(&self) -> Kind<'_, Self> {
        match self {
            Json::Null => Kind::Null,
            Json::Bool(b) => Kind::Bool(*b),
            Json::Int(i) => Kind::Int(*i),
            Json::Float(f) => Kind::Float(*f),
            Json::Str(s) => Kind::Str(s),
            Json::Array(items) => Kind::Array(items),
            Json::Object(members) => Kind::Object(members.as_slice()),
        }
    }
}

impl<'t> Members<Json<'t>> for [(Cow<'t, str>, Json<'t>)] {
    fn member_count(&self) -> usize {
        self.len()
    }

    fn member(&self, name: &str) -> Option<&Json<'t>> {
        self.iter()
            .find(|(member, _)| member == name)
            .map(|(_, value)| value)
    }

    fn members<'a>(&'a self) -> impl Iterator<Item = (&'a str, &'a Json<'t>)>
    where
        Json<'t>: 'a,
    {
        self.iter().map(|(name, value)| (&**name, value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &str) -> Json<'_> {
        parse(text, Infinite::Read).unwrap_or_else(|e| panic!("{text}: {e:?}"))
    }

    fn names<'a>(json: &'a Json<'_>) -> Vec<&'a str> {
        let Json::Object(members) = json else {
            panic!("not an object: {json:?}")
        };
        members.iter().map(|(name, _)| &**name).collect()
    }

    #[test]
    fn members_keep_document_order() {
        assert_eq!(names(&read(r#"{"z": 1, "a": 2, "m": 3}"#)), ["z", "a", "m"]);
    }

    #[test]
    fn a_repeated_name_keeps_its_first_place_and_last_value() {
        let json = read(r#"{"b": 1, "a": 2, "b": 3, "c": 4, "b": 5}"#);
        assert_eq!(names(&json), ["b", "a", "c"]);
        let Json::Object(members) = &json else {
            unreachable!()
        };
        assert_eq!(members[0].1, Json::Int(5));
        assert_eq!(members[2].1, Json::Int(4));
    }

    #[test]
    fn integers_and_floats_are_typed_as_python_types_them() {
        assert_eq!(read("-0"), Json::Int(0));
        assert_eq!(read("1"), Json::Int(1));
        assert_eq!(read("1.0"), Json::Float(1.0));
        assert_eq!(read("1e2"), Json::Float(100.0));
        assert_eq!(read("-9223372036854775808"), Json::Int(i64::MIN.into()));
        assert_eq!(read("18446744073709551615"), Json::Int(u64::MAX.into()));
        assert_eq!(
            read("18446744073709551616"),
            Json::Float(18446744073709551616.0)
        );
        assert_eq!(read("1e400"), Json::Float(f64::INFINITY));
        assert!(parse("1e400", Infinite::Refuse).is_err());
    }

    #[test]
    fn strings_borrow_unless_escaped_and_join_surrogate_pairs() {
        assert!(matches!(
            read(r#""plain é""#),
            Json::Str(Cow::Borrowed("plain é"))
        ));
        assert_eq!(
            read(r#""a\u00e9\ud834\udd1e\n\"""#),
            Json::Str(Cow::Owned("aé𝄞\n\"".to_owned()))
        );
    }

    #[test]
    fn malformed_text_is_an_error_with_its_offset() {
        for (text, offset) in [
            ("", 0),
            ("{", 1),
            ("[1,]", 3),
            ("{\"a\" 1}", 5),
            ("01", 1),
            ("1.", 2),
            ("-", 1),
            ("\"\\ud800\"", 7),
            ("\"\\udc00\"", 7),
            ("\"a\u{1}\"", 2),
            ("\"\\x\"", 2),
            ("tru", 0),
            ("NaN", 0),
            ("{} x", 3),
        ] {
            let error = parse(text, Infinite::Read).unwrap_err();
            assert_eq!(error.offset, offset, "{text:?}: {error:?}");
        }
    }

    #[test]
    fn nesting_beyond_the_limit_is_an_error_not_a_stack_overflow() {
        let deep = "[".repeat(MAX_DEPTH + 1) + &"]".repeat(MAX_DEPTH + 1);
        let error = parse(&deep, Infinite::Read).unwrap_err();
        assert_eq!(error.offset, MAX_DEPTH);
        let limit = "[".repeat(MAX_DEPTH) + &"]".repeat(MAX_DEPTH);
        assert!(parse(&limit, Infinite::Read).is_ok());
    }
}
