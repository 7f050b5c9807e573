//! [`Urn`]: the name a message is routed by, checked against RFC 8141.
//!
//! One `const fn` ([`validate`]) holds the syntax rules. [`Urn::parse`] runs
//! it at run time and returns a typed [`UrnError`]; the [`urn!`](crate::urn)
//! macro runs it inside a `const { }` block, so a malformed literal is a
//! compile error whose message is the same [`UrnError::description`].

use std::borrow::{Borrow, Cow};
use std::fmt;
use std::hash::{Hash, Hasher};

/// The longest namespace identifier RFC 8141 allows.
const NID_MAX_LEN: usize = 32;

/// A URN in the RFC 8141 syntax `urn:<NID>:<NSS>`, such as
/// `urn:babel:orders:created`.
///
/// A literal is checked at compile time by [`urn!`](crate::urn) and costs no
/// allocation; a URN known only at run time goes through [`Urn::parse`].
///
/// ```
/// use babel_idem::{urn, Urn};
///
/// let created = urn!("urn:babel:orders:created");
/// assert_eq!(created.as_str(), "urn:babel:orders:created");
/// assert_eq!(created.nid(), "babel");
/// assert_eq!(created.nss(), "orders:created");
///
/// let parsed = Urn::parse("urn:babel:orders:created".to_owned())?;
/// assert_eq!(parsed, created);
/// # Ok::<(), babel_idem::UrnError>(())
/// ```
///
/// Two URNs are equal when their text is equal, the way every BabelQueue SDK
/// matches a message's `job` against its registered handlers.
#[derive(Clone)]
pub struct Urn {
    text: Cow<'static, str>,
    /// Byte offset of the `:` that ends the NID, kept so `nid` and `nss`
    /// need no second scan.
    nid_end: usize,
}

impl Urn {
    /// Checks `text` and returns it as a `Urn`, or says what is wrong.
    ///
    /// ```
    /// use babel_idem::{Urn, UrnError};
    ///
    /// assert!(Urn::parse("urn:babel:orders:created").is_ok());
    /// assert_eq!(Urn::parse("orders:created").unwrap_err(), UrnError::MissingScheme);
    /// assert_eq!(
    ///     Urn::parse("urn:babel:orders created").unwrap_err(),
    ///     UrnError::InvalidNssChar { at: 16 },
    /// );
    /// ```
    pub fn parse(text: impl Into<Cow<'static, str>>) -> Result<Self, UrnError> {
        let text = text.into();
        let nid_end = validate(&text)?;
        Ok(Urn { text, nid_end })
    }

    /// Used by [`urn!`](crate::urn) inside a `const { }` block: a malformed
    /// literal stops compilation with the error's description. Not public API.
    #[doc(hidden)]
    pub const fn __from_literal(text: &'static str) -> Self {
        match validate(text) {
            Ok(nid_end) => Urn {
                text: Cow::Borrowed(text),
                nid_end,
            },
            Err(error) => panic!("{}", error.description()),
        }
    }

    /// The whole URN, as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The namespace identifier (`babel` in `urn:babel:orders:created`).
    ///
    /// ```
    /// assert_eq!(babel_idem::urn!("urn:babel:orders:created").nid(), "babel");
    /// ```
    pub fn nid(&self) -> &str {
        &self.text[SCHEME.len()..self.nid_end]
    }

    /// The namespace-specific string (`orders:created` in `urn:babel:orders:created`).
    ///
    /// ```
    /// assert_eq!(babel_idem::urn!("urn:babel:orders:created").nss(), "orders:created");
    /// ```
    pub fn nss(&self) -> &str {
        &self.text[self.nid_end + 1..]
    }
}

impl fmt::Display for Urn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl fmt::Debug for Urn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Urn({:?})", self.text)
    }
}

// Equality and hashing go through the text only, so a `HashMap<Urn, _>` can
// be searched with the `&str` an envelope carries (see `Borrow<str>`).
impl PartialEq for Urn {
    fn eq(&self, other: &Self) -> bool {
        self.text == other.text
    }
}

impl Eq for Urn {}

impl Hash for Urn {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

impl Borrow<str> for Urn {
    fn borrow(&self) -> &str {
        self.as_str()
    }
}

impl AsRef<str> for Urn {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl PartialEq<str> for Urn {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for Urn {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl std::str::FromStr for Urn {
    type Err = UrnError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Urn::parse(text.to_owned())
    }
}

impl TryFrom<String> for Urn {
    type Error = UrnError;

    fn try_from(text: String) -> Result<Self, Self::Error> {
        Urn::parse(text)
    }
}

impl TryFrom<&'static str> for Urn {
    type Error = UrnError;

    fn try_from(text: &'static str) -> Result<Self, Self::Error> {
        Urn::parse(text)
    }
}

/// A [`Urn`] from a string literal, checked at compile time against RFC
/// 8141: a malformed literal does not compile, and the error says what is
/// wrong. Costs no allocation.
///
/// ```
/// let created = babel_idem::urn!("urn:babel:orders:created");
/// assert_eq!(created.nss(), "orders:created");
/// ```
///
/// ```compile_fail
/// // error: malformed URN: it must start with `urn:` (RFC 8141: urn:<NID>:<NSS>)
/// let created = babel_idem::urn!("orders:created");
/// ```
///
/// For a URN known only at run time, use [`Urn::parse`].
#[macro_export]
macro_rules! urn {
    ($urn:literal $(,)?) => {
        const { $crate::Urn::__from_literal($urn) }
    };
    ($($other:tt)*) => {
        ::core::compile_error!(
            "urn! takes one string literal, such as urn!(\"urn:babel:orders:created\"); \
             for a URN known only at run time use Urn::parse"
        )
    };
}

/// What is wrong with a URN. Positions are byte offsets into the text.
///
/// ```
/// use babel_idem::{Urn, UrnError};
///
/// let err = Urn::parse("urn:b:orders").unwrap_err();
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
    /// What is wrong, without positions: the text a malformed `urn!` literal
    /// reports at compile time.
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

impl std::error::Error for UrnError {}

const SCHEME: &str = "urn:";

/// The RFC 8141 syntax check behind both [`Urn::parse`] and
/// [`urn!`](crate::urn). On success returns the byte offset of the `:` that
/// ends the NID.
///
/// `const` so the macro can run it at compile time; that is also why it
/// walks bytes with `while` loops instead of iterators.
pub(crate) const fn validate(text: &str) -> Result<usize, UrnError> {
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

/// Whether two strings are byte-for-byte equal, usable in `const` code.
pub(crate) const fn const_str_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
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
            assert!(Urn::parse(text).is_ok(), "{text} should be a URN");
        }
    }

    #[test]
    fn names_each_rule_that_fails() {
        let cases: [(&str, UrnError); 13] = [
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
        ];
        for (text, expected) in cases {
            assert_eq!(Urn::parse(text).unwrap_err(), expected, "{text:?}");
        }
        assert_eq!(
            Urn::parse("urn:babel:caf\u{e9}").unwrap_err(),
            UrnError::InvalidNssChar { at: 13 }
        );
    }

    #[test]
    fn splits_nid_and_nss() {
        let urn = Urn::parse("urn:babel:orders:created").unwrap();
        assert_eq!((urn.nid(), urn.nss()), ("babel", "orders:created"));
    }

    #[test]
    fn const_str_eq_compares_bytes() {
        assert!(const_str_eq("urn:a", "urn:a"));
        assert!(!const_str_eq("urn:a", "urn:b"));
        assert!(!const_str_eq("urn:a", "urn:ab"));
    }
}
