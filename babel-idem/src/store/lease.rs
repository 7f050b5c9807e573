//! A claim's lease as the servers count it: whole milliseconds.

use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

/// The lease in whole milliseconds (`PX`, `interval`, Unix-ms arithmetic).
///
/// The guard refuses such a lease when it is built; the stores check again
/// so that a direct caller gets an error, never a claim that lapses at once.
pub(crate) fn lease_millis(lease: Duration) -> Result<i64, InvalidLease> {
    match i64::try_from(lease.as_millis()) {
        Ok(0) | Err(_) => Err(InvalidLease { lease }),
        Ok(millis) => Ok(millis),
    }
}

/// A lease under one millisecond, or too long to count in milliseconds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct InvalidLease {
    lease: Duration,
}

impl fmt::Display for InvalidLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "lease {:?} is out of range: it must be at least 1 ms and at most i64::MAX ms",
            self.lease
        )
    }
}

impl StdError for InvalidLease {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leases_are_whole_milliseconds() {
        assert_eq!(lease_millis(Duration::from_millis(1500)), Ok(1500));
        assert!(lease_millis(Duration::ZERO).is_err());
        assert!(lease_millis(Duration::from_micros(999)).is_err());
        let error = lease_millis(Duration::MAX).unwrap_err();
        assert!(error.to_string().contains("out of range"), "{error}");
    }
}
