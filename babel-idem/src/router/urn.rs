//! [`Urn`]: the name a message is routed by, checked against RFC 8141.
//!
//! The syntax rules live in one function, `babel_idem_urn::validate`, shared
//! with the macro crate: [`Urn::parse`] runs it at run time and returns a
//! typed [`UrnError`]; the [`urn!`](crate::urn) and [`routes!`](crate::routes)
//! macros run it while they expand, so a malformed literal fails `cargo check`
//! with the same [`UrnError::description`], pointing at the literal.

use std::borrow::{Borrow, Cow};
use std::fmt;
use std::hash::{Hash, Hasher};

use babel_idem_urn::{SCHEME, validate};

pub use babel_idem_urn::UrnError;

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
/// # Ok::<(), babel_idem::router::UrnError>(())
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
    /// use babel_idem::Urn;
    /// use babel_idem::router::UrnError;
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

    /// A literal the `urn!` macro has already validated; `nid_end` is what
    /// the validator returned for it.
    pub(crate) const fn from_validated_literal(text: &'static str, nid_end: usize) -> Self {
        Urn {
            text: Cow::Borrowed(text),
            nid_end,
        }
    }

    /// The whole URN, as written. `const`, so a constant URN's text can be
    /// compared at compile time (as `routes!` does for message types).
    ///
    /// ```
    /// use babel_idem::{Urn, urn};
    ///
    /// const CREATED: &Urn = &urn!("urn:babel:orders:created");
    /// const TEXT: &str = CREATED.as_str();
    /// assert_eq!(TEXT, "urn:babel:orders:created");
    /// ```
    pub const fn as_str(&self) -> &str {
        match &self.text {
            Cow::Borrowed(text) => text,
            Cow::Owned(text) => text.as_str(),
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_nid_and_nss() {
        let urn = Urn::parse("urn:babel:orders:created").unwrap();
        assert_eq!((urn.nid(), urn.nss()), ("babel", "orders:created"));
    }

    #[test]
    fn parse_returns_the_shared_validators_error() {
        assert_eq!(
            Urn::parse("urn:babel:orders created").unwrap_err(),
            UrnError::InvalidNssChar { at: 16 }
        );
        assert_eq!(
            "orders".parse::<Urn>().unwrap_err(),
            UrnError::MissingScheme
        );
    }

    #[test]
    fn a_validated_literal_equals_its_parse() {
        let literal = Urn::from_validated_literal("urn:babel:orders:created", 9);
        let parsed = Urn::parse("urn:babel:orders:created").unwrap();
        assert_eq!(literal, parsed);
        assert_eq!(literal.nid(), parsed.nid());
    }
}
