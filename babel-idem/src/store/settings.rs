//! Settings the persistent stores share, checked once when a store is built:
//! the TTL and, for the SQL stores, the table name.
//!
//! SQL placeholders bind values, not identifiers, so the stores have to put
//! the table name into their statements as text. Only a plain identifier is
//! accepted, which needs no quoting and cannot change what a statement means.

use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

/// The TTL in whole milliseconds, the unit every backend expires in.
///
/// A TTL under a millisecond would forget each id as it is remembered (and
/// Redis refuses `PX 0`), so it is refused here rather than by the server.
pub(crate) fn ttl_millis(ttl: Duration) -> Result<i64, InvalidTtl> {
    match i64::try_from(ttl.as_millis()) {
        Ok(0) | Err(_) => Err(InvalidTtl { ttl }),
        Ok(millis) => Ok(millis),
    }
}

/// A TTL under one millisecond, or too long to count in milliseconds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct InvalidTtl {
    ttl: Duration,
}

impl fmt::Display for InvalidTtl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "TTL {:?} is out of range: it must be at least 1 ms and at most i64::MAX ms",
            self.ttl
        )
    }
}

impl StdError for InvalidTtl {}

/// Fails unless a Tokio runtime is running: the clients of the server stores
/// start background tasks when they are built and would panic without one.
#[cfg(any(feature = "redis", feature = "postgres"))]
pub(crate) fn require_tokio_runtime() -> Result<(), NoTokioRuntime> {
    tokio::runtime::Handle::try_current()
        .map(drop)
        .map_err(|_| NoTokioRuntime)
}

/// A server store was built outside a Tokio runtime.
#[cfg(any(feature = "redis", feature = "postgres"))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NoTokioRuntime;

#[cfg(any(feature = "redis", feature = "postgres"))]
impl fmt::Display for NoTokioRuntime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("no Tokio runtime is running: build this store inside one (for example in `#[tokio::main]`)")
    }
}

#[cfg(any(feature = "redis", feature = "postgres"))]
impl StdError for NoTokioRuntime {}

/// The table the SQL stores use unless told otherwise; the Go SDK's name.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) const DEFAULT_TABLE: &str = "babelqueue_idempotency";

/// The longest identifier PostgreSQL keeps without truncating it.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
const MAX_LEN: usize = 63;

/// Returns `name` when it matches `[A-Za-z_][A-Za-z0-9_]{0,62}`.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn checked_table_name(name: &str) -> Result<&str, InvalidTableName> {
    let mut bytes = name.bytes();
    let starts_well = bytes
        .next()
        .is_some_and(|first| first.is_ascii_alphabetic() || first == b'_');
    let rest_is_plain = bytes.all(|byte| byte.is_ascii_alphanumeric() || byte == b'_');
    if starts_well && rest_is_plain && name.len() <= MAX_LEN {
        Ok(name)
    } else {
        Err(InvalidTableName {
            name: name.to_owned(),
        })
    }
}

/// A table name that is not a plain SQL identifier.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct InvalidTableName {
    name: String,
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
impl fmt::Display for InvalidTableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "table name {:?} is not a plain identifier: it must match [A-Za-z_][A-Za-z0-9_]{{0,62}}",
            self.name
        )
    }
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
impl StdError for InvalidTableName {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_is_counted_in_whole_milliseconds() {
        assert_eq!(ttl_millis(Duration::from_millis(1)), Ok(1));
        assert_eq!(ttl_millis(Duration::from_secs(86_400)), Ok(86_400_000));
        assert!(ttl_millis(Duration::ZERO).is_err());
        assert!(ttl_millis(Duration::from_micros(999)).is_err());
        assert!(ttl_millis(Duration::MAX).is_err());
    }

    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    #[test]
    fn plain_identifiers_pass() {
        for name in ["babelqueue_idempotency", "_t", "T9", &"a".repeat(63)] {
            assert_eq!(checked_table_name(name), Ok(name));
        }
    }

    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    #[test]
    fn anything_else_is_refused() {
        for name in [
            "",
            "9table",
            "my-table",
            "t; DROP TABLE users",
            "\"quoted\"",
            "schema.table",
            "tablé",
            &"a".repeat(64),
        ] {
            let err = checked_table_name(name).unwrap_err();
            assert!(err.to_string().contains("not a plain identifier"), "{name}");
        }
    }
}
