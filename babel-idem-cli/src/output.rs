//! What a command prints on stdout: text for people, or one JSON object
//! per line with `--json`. Best effort: a closed pipe (`| head`) stops the
//! printing, not the command, whose exit code still tells the outcome.

use std::io::{BufWriter, StdoutLock, Write};

use serde_json::Value;

pub(crate) struct Output {
    json: bool,
    out: BufWriter<StdoutLock<'static>>,
    closed: bool,
}

impl Output {
    pub(crate) fn new(json: bool) -> Self {
        Output {
            json,
            out: BufWriter::new(std::io::stdout().lock()),
            closed: false,
        }
    }

    /// Prints `text`, or `json` with `--json`.
    pub(crate) fn emit(&mut self, text: impl FnOnce() -> String, json: impl FnOnce() -> Value) {
        self.emit_line(text, || json().to_string());
    }

    /// Prints `text`, or with `--json` the JSON object `json` writes on one
    /// line (for what a [`Value`] cannot hold, such as numbers as written).
    pub(crate) fn emit_line(
        &mut self,
        text: impl FnOnce() -> String,
        json: impl FnOnce() -> String,
    ) {
        if self.closed {
            return;
        }
        let written = if self.json {
            writeln!(self.out, "{}", json())
        } else {
            writeln!(self.out, "{}", text())
        };
        self.closed = written.is_err();
    }
}

impl Drop for Output {
    fn drop(&mut self) {
        let _ = self.out.flush();
    }
}

/// `id` as a text line shows it: a control character (a newline would
/// forge a line of its own), a line or paragraph separator and the
/// backslash are escaped (`\n`, `\t`, `\r`, `\\`, `\u{..}`); any other
/// id is printed as it is.
pub(crate) fn escaped(id: &str) -> std::borrow::Cow<'_, str> {
    let needs = |c: char| c.is_control() || c == '\\' || matches!(c, '\u{2028}' | '\u{2029}');
    if !id.contains(needs) {
        return std::borrow::Cow::Borrowed(id);
    }
    let mut out = String::with_capacity(id.len() + 8);
    for c in id.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            '\\' => out.push_str("\\\\"),
            c if needs(c) => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    std::borrow::Cow::Owned(out)
}

/// `body` as one line of JSON, every value as written (a number no `f64`
/// holds included): its white space outside strings dropped. `None` when
/// `body` is not one JSON value.
pub(crate) fn compact_json(body: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(body).ok()?;
    let raw: &serde_json::value::RawValue = serde_json::from_str(text).ok()?;
    let mut out = String::with_capacity(raw.get().len());
    let mut strings = Strings::default();
    for c in raw.get().chars() {
        if strings.read(c) || !matches!(c, ' ' | '\t' | '\n' | '\r') {
            out.push(c);
        }
    }
    Some(out)
}

/// Where the characters of a JSON text stand, read one by one: inside a
/// string literal (its quotes included) or outside, where the text's
/// structure and white space are.
#[derive(Default)]
struct Strings {
    inside: bool,
    escaped: bool,
}

impl Strings {
    /// Reads `c`, the next character: whether it belongs to a string literal.
    fn read(&mut self, c: char) -> bool {
        if self.inside {
            match c {
                _ if self.escaped => self.escaped = false,
                '\\' => self.escaped = true,
                '"' => self.inside = false,
                _ => {}
            }
            true
        } else {
            self.inside = c == '"';
            self.inside
        }
    }
}

/// A [`compact_json`] text indented as `serde_json::to_string_pretty`
/// indents, its values as written.
pub(crate) fn pretty_json(compact: &str) -> String {
    let mut out = String::with_capacity(compact.len() * 2);
    let mut depth = 0usize;
    let mut strings = Strings::default();
    let newline = |out: &mut String, depth: usize| {
        out.push('\n');
        out.push_str(&"  ".repeat(depth));
    };
    let mut chars = compact.chars().peekable();
    while let Some(c) = chars.next() {
        if strings.read(c) {
            out.push(c);
            continue;
        }
        match c {
            '{' | '[' => {
                out.push(c);
                let close = if c == '{' { '}' } else { ']' };
                if chars.peek() == Some(&close) {
                    out.push(close);
                    chars.next();
                } else {
                    depth += 1;
                    newline(&mut out, depth);
                }
            }
            '}' | ']' => {
                depth = depth.saturating_sub(1);
                newline(&mut out, depth);
                out.push(c);
            }
            ',' => {
                out.push(c);
                newline(&mut out, depth);
            }
            ':' => out.push_str(": "),
            c => out.push(c),
        }
    }
    out
}

/// Unix milliseconds as RFC 3339 UTC with milliseconds:
/// `2026-12-01T02:48:19.123Z`.
pub(crate) fn rfc3339_ms(ms: i64) -> String {
    let (secs, milli) = (ms.div_euclid(1000), ms.rem_euclid(1000));
    let (days, day_secs) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{milli:03}Z",
        day_secs / 3600,
        day_secs % 3600 / 60,
        day_secs % 60
    )
}

/// The proleptic Gregorian date `days` after 1970-01-01 (Howard Hinnant's
/// `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_with_control_characters_are_escaped() {
        assert_eq!(escaped("plain id"), "plain id");
        assert_eq!(escaped("a\nseen\tforged"), "a\\nseen\\tforged");
        assert_eq!(
            escaped("\u{0}\u{7f}\u{85}\u{2028}\\"),
            "\\u{0}\\u{7f}\\u{85}\\u{2028}\\\\"
        );
    }

    #[test]
    fn json_bodies_keep_their_values_as_written() {
        let body =
            "{ \"a\" : 1e400 ,\n \"e\": {}, \"l\": [1, [ ], {\"b\": -0}], \"s\": \"x \\\" {y}\"}";
        let compact = compact_json(body.as_bytes()).unwrap();
        assert_eq!(
            compact,
            "{\"a\":1e400,\"e\":{},\"l\":[1,[],{\"b\":-0}],\"s\":\"x \\\" {y}\"}"
        );
        // Indented as serde_json indents (which reads neither 1e400 nor -0).
        let readable = compact.replace("1e400", "1").replace("-0", "2");
        let value: Value = serde_json::from_str(&readable).unwrap();
        assert_eq!(
            pretty_json(&compact)
                .replace("1e400", "1")
                .replace("-0", "2"),
            serde_json::to_string_pretty(&value).unwrap()
        );
        assert!(compact_json(b"not json").is_none());
    }

    #[test]
    fn timestamps_are_rfc3339() {
        assert_eq!(rfc3339_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339_ms(951_782_400_001), "2000-02-29T00:00:00.001Z");
        assert_eq!(rfc3339_ms(1_796_093_299_123), "2026-12-01T02:48:19.123Z");
        assert_eq!(rfc3339_ms(-1), "1969-12-31T23:59:59.999Z");
    }
}
