//! The ids a command works on, as dedupe keys: from the arguments, or
//! streamed from stdin in bounded chunks (a million ids are never held at
//! once).

use std::io::{BufRead, StdinLock};

use babel_idem::MessageId;

use babel_idem::key::DedupeKey;

use crate::exit::CliError;

/// One id typed by the operator, seen through the library's key layout.
struct RawId<'a>(&'a str);

impl MessageId for RawId<'_> {
    fn message_id(&self) -> Option<&str> {
        Some(self.0)
    }
}

/// The key a guard with `scope` stores `id` under: exactly
/// [`DedupeKey`]'s, so the CLI finds what the library wrote.
pub(crate) fn key(scope: Option<&str>, id: &str) -> String {
    DedupeKey::new(scope, &RawId(id))
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// What every key of `scope` starts with: a one-byte id's key without that
/// byte, so the layout stays the library's alone.
pub(crate) fn scope_prefix(scope: &str) -> String {
    let mut prefix = key(Some(scope), "x");
    prefix.pop();
    prefix
}

/// The ids of the command line, in order; each `-` is stdin's lines.
pub(crate) struct Ids {
    args: std::vec::IntoIter<String>,
    stdin: Option<StdinLock<'static>>,
    line: String,
    line_number: u64,
}

impl Ids {
    pub(crate) fn new(args: Vec<String>) -> Self {
        Ids {
            args: args.into_iter(),
            stdin: None,
            line: String::new(),
            line_number: 0,
        }
    }

    /// Up to `max` more ids; empty once every id was read.
    pub(crate) fn next_chunk(&mut self, max: usize) -> Result<Vec<String>, CliError> {
        let mut chunk = Vec::with_capacity(max.min(1024));
        while chunk.len() < max {
            match self.next_id()? {
                Some(id) => chunk.push(id),
                None => break,
            }
        }
        Ok(chunk)
    }

    fn next_id(&mut self) -> Result<Option<String>, CliError> {
        loop {
            if let Some(stdin) = &mut self.stdin {
                self.line.clear();
                self.line_number += 1;
                let read = stdin.read_line(&mut self.line).map_err(|e| {
                    CliError::usage(format!(
                        "cannot read line {} of stdin: {e}",
                        self.line_number
                    ))
                })?;
                if read == 0 {
                    self.stdin = None;
                    continue;
                }
                let id = self.line.trim_end_matches(['\n', '\r']);
                // Blank lines (a trailing one, spacing) carry no id.
                if !id.is_empty() {
                    return Ok(Some(id.to_owned()));
                }
                continue;
            }
            return match self.args.next() {
                None => Ok(None),
                Some(dash) if dash == "-" => {
                    self.stdin = Some(std::io::stdin().lock());
                    continue;
                }
                Some(id) if id.is_empty() => Err(CliError::usage(
                    "an empty id is never marked (a message without an id is not deduplicated)",
                )),
                Some(id) => Ok(Some(id)),
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_the_librarys() {
        assert_eq!(key(None, "id-A"), "id-A");
        assert_eq!(key(Some("billing"), "id-A"), "7:billing:id-A");
        assert_eq!(scope_prefix("billing"), "7:billing:");
        assert_eq!(scope_prefix(""), "0::");
    }

    #[test]
    fn arguments_come_in_chunks() {
        let mut ids = Ids::new(vec!["a".into(), "b".into(), "c".into()]);
        assert_eq!(ids.next_chunk(2).unwrap(), ["a", "b"]);
        assert_eq!(ids.next_chunk(2).unwrap(), ["c"]);
        assert!(ids.next_chunk(2).unwrap().is_empty());
        let err = Ids::new(vec![String::new()]).next_chunk(2).unwrap_err();
        assert_eq!(err.exit, crate::exit::Exit::Usage);
    }
}
