//! What a command meets, logged on stderr: the library's `tracing` events
//! (a broker outage, a row refused or failed, a reconnection), one line
//! each, as text or, with `--json`, as a JSON object. stdout stays the
//! command's own output.
//!
//! The level follows `-q` / `-v`: by default babel-idem's warnings and
//! infos, with `-q` only its errors, with `-v` its debug events and with
//! `-vv` its traces. No line ever shows a secret of the URLs the command
//! was given: every text an event carries is redacted before it is written.

use std::fmt;
use std::io::Write;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::level_filters::LevelFilter;
use tracing::{Event, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::{Context, SubscriberExt};

use crate::output::rfc3339_ms;
use crate::target::scrubbed;

/// The level of babel-idem's events that is logged for `-q` and the
/// number of `-v`.
pub(crate) fn level(quiet: bool, verbose: u8) -> LevelFilter {
    match (quiet, verbose) {
        (true, _) => LevelFilter::ERROR,
        (false, 0) => LevelFilter::INFO,
        (false, 1) => LevelFilter::DEBUG,
        (false, _) => LevelFilter::TRACE,
    }
}

/// Logs babel-idem's events at `level` on stderr for the rest of the
/// process, as JSON with `json`, never showing a secret of `urls`.
pub(crate) fn init(level: LevelFilter, json: bool, urls: Vec<String>) {
    let filter = Targets::new()
        .with_target("babel_idem", level)
        .with_target("babel_idem_cli", level);
    let lines = Lines { json, urls };
    let subscriber = tracing_subscriber::registry().with(lines.with_filter(filter));
    // Only `main` sets it, once; a second subscriber would change nothing.
    let _ = tracing::subscriber::set_global_default(subscriber);
}

/// The layer that writes each event as one line on stderr.
struct Lines {
    json: bool,
    /// The command's URLs: their secrets never reach a line.
    urls: Vec<String>,
}

impl Lines {
    fn redacted(&self, text: &str) -> String {
        self.urls
            .iter()
            .fold(text.to_owned(), |text, url| scrubbed(&text, url))
    }

    /// The line for an event: `TIME LEVEL TARGET: MESSAGE name=value ...`,
    /// or with `json` one object: `timestamp`, `level`, `target`,
    /// `message` and the event's other fields in `fields`.
    fn line(&self, event: &Event<'_>) -> String {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let metadata = event.metadata();
        let timestamp = rfc3339_ms(
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |since| since.as_millis() as i64),
        );
        let message = self.redacted(&fields.message);
        let values: Vec<(&str, Value)> = fields
            .values
            .into_iter()
            .map(|(name, value)| match value {
                Value::String(text) => (name, Value::String(self.redacted(&text))),
                other => (name, other),
            })
            .collect();
        if self.json {
            let mut object = Map::new();
            object.insert("timestamp".into(), timestamp.into());
            object.insert("level".into(), metadata.level().as_str().into());
            object.insert("target".into(), metadata.target().into());
            object.insert("message".into(), message.into());
            if !values.is_empty() {
                let fields: Map<String, Value> = values
                    .into_iter()
                    .map(|(name, value)| (name.to_owned(), value))
                    .collect();
                object.insert("fields".into(), fields.into());
            }
            return Value::Object(object).to_string();
        }
        let mut line = format!(
            "{timestamp} {:>5} {}: {}",
            metadata.level().as_str(),
            metadata.target(),
            message
        );
        for (name, value) in values {
            let value = match value {
                Value::String(text) => text,
                other => other.to_string(),
            };
            // One event, one line: a value's line breaks are escaped.
            let value = value.replace('\n', "\\n").replace('\r', "\\r");
            line.push_str(&format!(" {name}={value}"));
        }
        line.replace('\n', "\\n").replace('\r', "\\r")
    }
}

impl<S: Subscriber> Layer<S> for Lines {
    fn on_event(&self, event: &Event<'_>, _context: Context<'_, S>) {
        let mut line = self.line(event);
        line.push('\n');
        // Best effort: a closed stderr loses the log, not the command.
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }
}

/// An event's message and its other fields, in the order written.
#[derive(Default)]
struct Fields {
    message: String,
    values: Vec<(&'static str, Value)>,
}

impl Fields {
    fn push(&mut self, field: &Field, value: Value) {
        if field.name() == "message" {
            self.message = match value {
                Value::String(text) => text,
                other => other.to_string(),
            };
        } else {
            self.values.push((field.name(), value));
        }
    }
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.push(field, Value::String(format!("{value:?}")));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.push(field, Value::String(value.to_owned()));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.push(field, value.into());
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.push(field, value.into());
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.push(field, value.into());
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.push(field, Value::String(value.to_string()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// The lines `Lines` writes for the events `emit` sends, with `urls`.
    fn lines(json: bool, urls: &[&str], emit: impl FnOnce()) -> Vec<String> {
        let written = Arc::new(Mutex::new(Vec::new()));
        struct Capture {
            lines: Lines,
            written: Arc<Mutex<Vec<String>>>,
        }
        impl<S: Subscriber> Layer<S> for Capture {
            fn on_event(&self, event: &Event<'_>, _context: Context<'_, S>) {
                self.written.lock().unwrap().push(self.lines.line(event));
            }
        }
        let capture = Capture {
            lines: Lines {
                json,
                urls: urls.iter().map(|url| (*url).to_owned()).collect(),
            },
            written: Arc::clone(&written),
        };
        let filter = Targets::new().with_target("babel_idem", LevelFilter::INFO);
        let subscriber = tracing_subscriber::registry().with(capture.with_filter(filter));
        tracing::subscriber::with_default(subscriber, emit);
        written.lock().unwrap().clone()
    }

    #[test]
    fn an_event_is_one_line_of_text_or_one_json_object() {
        let emit = || {
            let error = "connection refused\nby peer";
            tracing::warn!(target: "babel_idem::outbox", row = 7, %error, "the broker refused a row");
            tracing::debug!(target: "babel_idem::outbox", "not at info");
            tracing::warn!(target: "sqlx::query", "another crate's");
        };
        let text = lines(false, &[], emit);
        assert_eq!(text.len(), 1, "{text:?}");
        assert!(
            text[0].ends_with(
                " WARN babel_idem::outbox: the broker refused a row row=7 error=connection refused\\nby peer"
            ),
            "{text:?}"
        );
        let json = lines(true, &[], emit);
        let event: Value = serde_json::from_str(&json[0]).unwrap();
        assert_eq!(event["level"], "WARN");
        assert_eq!(event["target"], "babel_idem::outbox");
        assert_eq!(event["message"], "the broker refused a row");
        assert_eq!(event["fields"]["row"], 7);
        assert_eq!(event["fields"]["error"], "connection refused\nby peer");
    }

    #[test]
    fn no_line_shows_a_secret_of_the_commands_urls() {
        let url = "redis:/:s3cr3t@host";
        let emit = || {
            let error = format!("cannot reach {url}: s3cr3t refused");
            tracing::warn!(target: "babel_idem", %error, "lost {url}");
        };
        for json in [false, true] {
            for line in lines(json, &[url, "postgres://u:pw@h/db"], emit) {
                assert!(!line.contains("s3cr3t"), "{line}");
            }
        }
    }

    #[test]
    fn quiet_keeps_errors_and_each_v_adds_a_level() {
        assert_eq!(level(true, 0), LevelFilter::ERROR);
        assert_eq!(level(false, 0), LevelFilter::INFO);
        assert_eq!(level(false, 1), LevelFilter::DEBUG);
        assert_eq!(level(false, 2), LevelFilter::TRACE);
    }
}
