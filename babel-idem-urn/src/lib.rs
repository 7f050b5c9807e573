//! The RFC 8141 URN syntax (`urn:<NID>:<NSS>`) that babel-idem routes
//! messages by: one [`validate`] function and the [`UrnError`] it returns.
//!
//! Two crates run this check: `babel_idem::router::Urn::parse` at run time,
//! and the `urn!` / `routes!` macros of `babel-idem-macros` at expansion
//! time, so a malformed literal fails `cargo check` with the same words a
//! run-time parse returns. It is a crate of its own because a proc-macro
//! crate cannot depend on the runtime crate that re-exports it. Use it
//! through `babel_idem`, which re-exports [`UrnError`].
#![no_std]

use core::fmt;

/// The longest namespace identifier RFC 8141 allows.
const NID_MAX_LEN: usize = 32;

/// The scheme every URN starts with (compared case-insensitively).
pub const SCHEME: &str = "urn:";

/// What is wrong with a URN. Positions are byte offsets into the text.
///
/// ```
/// use babel_idem_urn::{UrnError, validate};
///
/// let err = validate("urn:b:orders").unwrap_err();
/// assert_eq!(err, UrnError::NidTooShort);
/// assert_eq!(
///     err.to_string(),
///     "malformed URN: the namespace identifier (NID) must be 2 to 32 characters long",
/// );
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum UrnError {
    /// The text does not start with `urn:`.
    MissingScheme,
    /// The NID has fewer than 2 characters.
    NidTooShort,
    /// The NID has more than 32 characters.
    NidTooLong,
    /// The NID holds a character other than a letter, a digit or `-`.
    InvalidNidChar {
        /// Where the character starts.
        at: usize,
    },
    /// The NID starts or ends with `-`.
    NidEdgeHyphen,
    /// No `:` separates the NID from the NSS, or the NSS is empty.
    MissingNss,
    /// The NSS starts with `/`.
    NssStartsWithSlash,
    /// The NSS holds a character RFC 8141 does not allow unescaped.
    InvalidNssChar {
        /// Where the character starts.
        at: usize,
    },
    /// A `%` is not followed by two hexadecimal digits.
    BadPercentEscape {
        /// Where the `%` is.
        at: usize,
    },
    /// The URN carries `?+`, `?=` or `#` components, which do not belong in a
    /// name that routes messages.
    HasComponents {
        /// Where the `?` or `#` is.
        at: usize,
    },
}

impl UrnError {
    /// What is wrong, without the position.
    pub const fn description(&self) -> &'static str {
        match self {
            UrnError::MissingScheme => {
                "malformed URN: it must start with `urn:` (RFC 8141: urn:<NID>:<NSS>)"
            }
            UrnError::NidTooShort | UrnError::NidTooLong => {
                "malformed URN: the namespace identifier (NID) must be 2 to 32 characters long"
            }
            UrnError::InvalidNidChar { .. } => {
                "malformed URN: the namespace identifier (NID) may hold only letters, digits and `-`"
            }
            UrnError::NidEdgeHyphen => {
                "malformed URN: the namespace identifier (NID) must start and end with a letter or digit"
            }
            UrnError::MissingNss => {
                "malformed URN: the namespace-specific string (NSS) is missing; write urn:<NID>:<NSS>"
            }
            UrnError::NssStartsWithSlash => {
                "malformed URN: the namespace-specific string (NSS) must not start with `/`"
            }
            UrnError::InvalidNssChar { .. } => {
                "malformed URN: the namespace-specific string (NSS) holds a character that must be \
                 percent-encoded (allowed: letters, digits, - . _ ~ ! $ & ' ( ) * + , ; = : @ / and %XX)"
            }
            UrnError::BadPercentEscape { .. } => {
                "malformed URN: `%` must be followed by two hexadecimal digits"
            }
            UrnError::HasComponents { .. } => {
                "malformed URN: `?` and `#` components are not allowed in a routing URN"
            }
        }
    }

    /// The byte offset of the offending character, when there is one.
    pub const fn position(&self) -> Option<usize> {
        match self {
            UrnError::InvalidNidChar { at }
            | UrnError::InvalidNssChar { at }
            | UrnError::BadPercentEscape { at }
            | UrnError::HasComponents { at } => Some(*at),
            _ => None,
        }
    }
}

impl fmt::Display for UrnError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.description())?;
        if let Some(at) = self.position() {
            write!(f, " (at byte {at})")?;
        }
        Ok(())
    }
}

impl core::error::Error for UrnError {}

/// Checks `text` against the RFC 8141 syntax `urn:<NID>:<NSS>`. On success
/// returns the byte offset of the `:` that ends the NID.
///
/// `const`, so a caller can check a constant at compile time; that is why it
/// walks bytes with `while` loops instead of iterators.
///
/// ```
/// use babel_idem_urn::{UrnError, validate};
///
/// assert_eq!(validate("urn:babel:orders:created"), Ok(9));
/// assert_eq!(validate("urn:babel:orders created"), Err(UrnError::InvalidNssChar { at: 16 }));
/// ```
pub const fn validate(text: &str) -> Result<usize, UrnError> {
    let bytes = text.as_bytes();
    if !has_scheme(bytes) {
        return Err(UrnError::MissingScheme);
    }
    let nid_end = match check_nid(bytes, SCHEME.len()) {
        Ok(end) => end,
        Err(error) => return Err(error),
    };
    match check_nss(bytes, nid_end + 1) {
        Ok(()) => Ok(nid_end),
        Err(error) => Err(error),
    }
}

/// `urn:`, case-insensitively (the scheme name is case-insensitive).
const fn has_scheme(bytes: &[u8]) -> bool {
    let scheme = SCHEME.as_bytes();
    if bytes.len() < scheme.len() {
        return false;
    }
    let mut i = 0;
    while i < scheme.len() {
        if bytes[i].to_ascii_lowercase() != scheme[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// NID = alphanum 0*30(alphanum / "-") alphanum, ended by `:`.
const fn check_nid(bytes: &[u8], start: usize) -> Result<usize, UrnError> {
    let mut end = start;
    while end < bytes.len() && bytes[end] != b':' {
        let byte = bytes[end];
        if !(byte.is_ascii_alphanumeric() || byte == b'-') {
            return Err(UrnError::InvalidNidChar { at: end });
        }
        end += 1;
    }
    let len = end - start;
    if len < 2 {
        return Err(UrnError::NidTooShort);
    }
    if len > NID_MAX_LEN {
        return Err(UrnError::NidTooLong);
    }
    if bytes[start] == b'-' || bytes[end - 1] == b'-' {
        return Err(UrnError::NidEdgeHyphen);
    }
    if end == bytes.len() {
        return Err(UrnError::MissingNss);
    }
    Ok(end)
}

/// NSS = pchar *(pchar / "/"), with pchar from RFC 3986.
const fn check_nss(bytes: &[u8], start: usize) -> Result<(), UrnError> {
    if start >= bytes.len() {
        return Err(UrnError::MissingNss);
    }
    if bytes[start] == b'/' {
        return Err(UrnError::NssStartsWithSlash);
    }
    let mut i = start;
    while i < bytes.len() {
        let byte = bytes[i];
        if byte == b'%' {
            if i + 2 >= bytes.len()
                || !bytes[i + 1].is_ascii_hexdigit()
                || !bytes[i + 2].is_ascii_hexdigit()
            {
                return Err(UrnError::BadPercentEscape { at: i });
            }
            i += 3;
            continue;
        }
        if byte == b'?' || byte == b'#' {
            return Err(UrnError::HasComponents { at: i });
        }
        if !is_nss_char(byte) {
            return Err(UrnError::InvalidNssChar { at: i });
        }
        i += 1;
    }
    Ok(())
}

/// pchar minus the escapes, plus `/`: unreserved, sub-delims, `:`, `@`, `/`.
const fn is_nss_char(byte: u8) -> bool {
    byte.is_ascii_alphanumeric()
        || matches!(
            byte,
            b'-' | b'.'
                | b'_'
                | b'~'
                | b'!'
                | b'$'
                | b'&'
                | b'\''
                | b'('
                | b')'
                | b'*'
                | b'+'
                | b','
                | b';'
                | b'='
                | b':'
                | b'@'
                | b'/'
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_rfc_8141_examples_and_babel_urns() {
        for text in [
            "urn:babel:orders:created",
            "urn:babel:catalog:item.indexed",
            "URN:Babel:orders:created",
            "urn:ietf:rfc:2648",
            "urn:example:a123,z456",
            "urn:example:foo-bar-baz-qux",
            "urn:example:a%2Fb",
            "urn:example:weird/path@host;x=1",
        ] {
            assert!(validate(text).is_ok(), "{text} should be a URN");
        }
    }

    #[test]
    fn returns_where_the_nid_ends() {
        assert_eq!(validate("urn:babel:orders:created"), Ok(9));
        assert_eq!(validate("urn:ab:x"), Ok(6));
    }

    #[test]
    fn names_each_rule_that_fails() {
        let cases: [(&str, UrnError); 14] = [
            ("", UrnError::MissingScheme),
            ("urn", UrnError::MissingScheme),
            ("orders:created", UrnError::MissingScheme),
            ("urn::orders", UrnError::NidTooShort),
            ("urn:b:orders", UrnError::NidTooShort),
            (
                "urn:abcdefghijklmnopqrstuvwxyz0123456:x",
                UrnError::NidTooLong,
            ),
            ("urn:ba_bel:x", UrnError::InvalidNidChar { at: 6 }),
            ("urn:-babel:x", UrnError::NidEdgeHyphen),
            ("urn:babel", UrnError::MissingNss),
            ("urn:babel:", UrnError::MissingNss),
            ("urn:babel:/orders", UrnError::NssStartsWithSlash),
            ("urn:babel:or%2", UrnError::BadPercentEscape { at: 12 }),
            ("urn:babel:orders?=x", UrnError::HasComponents { at: 16 }),
            ("urn:babel:caf\u{e9}", UrnError::InvalidNssChar { at: 13 }),
        ];
        for (text, expected) in cases {
            assert_eq!(validate(text), Err(expected), "{text:?}");
        }
    }

    #[test]
    fn display_adds_the_position() {
        extern crate std;
        use std::string::ToString;
        let error = validate("urn:babel:orders created").unwrap_err();
        assert_eq!(error.position(), Some(16));
        assert!(error.to_string().ends_with(" (at byte 16)"), "{error}");
        assert_eq!(UrnError::MissingNss.position(), None);
    }
}
