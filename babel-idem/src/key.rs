//! [`DedupeKey`]: the key a guard looks up, taken from a message before its
//! handler runs.
//!
//! A key is copied out of the message (a handler may move or mutate the
//! message), so it must be cheap: keys up to 62 bytes, which
//! covers a UUID with a scope of up to 22 bytes in front, live inline and
//! cost no allocation.

use std::fmt;

use arrayvec::ArrayString;

use crate::message::MessageId;

/// The longest key (length, scope, separators and id) kept without a heap
/// allocation.
pub(crate) const INLINE_CAPACITY: usize = 62;

/// The length of a canonical UUID, the id every BabelQueue SDK mints.
const UUID_LEN: usize = 36;

/// The separator after a scope's length and after the scope itself.
const SEPARATOR: char = ':';

/// The dedupe key of one delivery: the message id, prefixed by the guard's
/// scope when it has one. `None` for a message without a usable id.
///
/// # Layout
///
/// | guard | key | example (id `id-A`) |
/// |---|---|---|
/// | unscoped | the id, byte for byte (the Go SDK's key) | `id-A` |
/// | scope `s` | `<byte length of s>:<s>:<id>` | scope `billing`: `7:billing:id-A` |
///
/// The length in front says where the scope ends, so the scope and the id
/// may contain anything (`:` included) and two different `(scope, id)`
/// pairs never give one key: `orders:eu` + `123` is `9:orders:eu:123`,
/// `orders` + `eu:123` is `6:orders:eu:123`. No scope is refused, the empty
/// one included (`0::id-A`, apart from the unscoped `id-A`).
///
/// An unscoped key must stay the bare id, which leaves no string free: an
/// unscoped message whose id is literally `7:billing:id-A` shares its key
/// with the `billing` message `id-A`. Where producers are not trusted to
/// choose ids, give every guard that shares a store a scope.
///
/// ```
/// use babel_idem::Envelope;
/// use babel_idem::key::DedupeKey;
/// use serde_json::json;
///
/// let env = Envelope::new("urn:babel:orders:created", json!({})).with_id("id-A");
/// assert_eq!(DedupeKey::new(None, &env).as_str(), Some("id-A"));
/// assert_eq!(DedupeKey::new(Some("billing"), &env).as_str(), Some("7:billing:id-A"));
/// assert_eq!(DedupeKey::new(None, &env.clone().without_id()).as_str(), None);
/// ```
#[derive(Clone)]
pub struct DedupeKey(Repr);

#[derive(Clone)]
enum Repr {
    Missing,
    Inline(ArrayString<INLINE_CAPACITY>),
    Heap(Box<str>),
}

impl DedupeKey {
    /// The key of `message` under `scope`.
    #[inline]
    pub fn new<M: MessageId + ?Sized>(scope: Option<&str>, message: &M) -> Self {
        Self::with_new(scope, message, |key| key)
    }

    /// `then(key)` for [`new`](Self::new)'s key: `then` is inlined in each
    /// arm, so that a guard builds its future around the common key where
    /// it is written, rather than around a key written beside it and then
    /// moved in (the move's loads would each span several of the key's
    /// stores, and wait for them to reach the cache).
    #[inline(always)]
    pub(crate) fn with_new<M: MessageId + ?Sized, R>(
        scope: Option<&str>,
        message: &M,
        then: impl FnOnce(Self) -> R,
    ) -> R {
        match message.message_id() {
            None | Some("") => then(DedupeKey(Repr::Missing)),
            Some(id) if scope.is_none() && id.len() == UUID_LEN => {
                // The common key (an unscoped UUID), copied with a length
                // the compiler knows, so the copy is inlined.
                let mut inline = ArrayString::new();
                inline.push_str(id);
                then(DedupeKey(Repr::Inline(inline)))
            }
            Some(id) => then(Self::from_parts(scope, id)),
        }
    }

    /// Every other key, out of line, so that the inlined path of an
    /// unscoped UUID carries no formatting or allocation.
    #[inline(never)]
    fn from_parts(scope: Option<&str>, id: &str) -> Self {
        let mut inline = ArrayString::new();
        if write_key(&mut inline, scope, id).is_ok() {
            return DedupeKey(Repr::Inline(inline));
        }
        let mut heap = String::new();
        // Writing to a `String` cannot fail.
        let _ = write_key(&mut heap, scope, id);
        DedupeKey(Repr::Heap(heap.into_boxed_str()))
    }

    /// The key, for code that has already checked [`as_str`](Self::as_str)
    /// is `Some`; `""` otherwise.
    #[inline]
    pub(crate) fn id(&self) -> &str {
        self.as_str().unwrap_or_default()
    }

    /// Whether the message had no usable id ([`as_str`](Self::as_str) is `None`).
    #[inline]
    pub(crate) fn is_missing(&self) -> bool {
        matches!(self.0, Repr::Missing)
    }

    /// The key as the store sees it, or `None` when the message had no id.
    #[inline]
    pub fn as_str(&self) -> Option<&str> {
        match &self.0 {
            Repr::Missing => None,
            Repr::Inline(key) => Some(key),
            Repr::Heap(key) => Some(key),
        }
    }
}

/// Writes the key of `id` under `scope` (see [the layout](DedupeKey#layout)); fails
/// only when `out` is full.
#[inline]
fn write_key(out: &mut impl fmt::Write, scope: Option<&str>, id: &str) -> fmt::Result {
    if let Some(scope) = scope {
        // Digits by hand: no formatting machinery on every scoped delivery.
        let mut digits = [0u8; 20];
        let mut rest = scope.len();
        let mut start = digits.len();
        loop {
            start -= 1;
            digits[start] = b'0' + (rest % 10) as u8;
            rest /= 10;
            if rest == 0 {
                break;
            }
        }
        // ASCII digits are UTF-8.
        out.write_str(std::str::from_utf8(&digits[start..]).unwrap_or_default())?;
        out.write_char(SEPARATOR)?;
        out.write_str(scope)?;
        out.write_char(SEPARATOR)?;
    }
    out.write_str(id)
}

impl fmt::Debug for DedupeKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("DedupeKey").field(&self.as_str()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Id(&'static str);
    impl MessageId for Id {
        fn message_id(&self) -> Option<&str> {
            Some(self.0)
        }
    }

    #[test]
    fn empty_id_has_no_key_even_with_a_scope() {
        assert_eq!(DedupeKey::new(Some("s"), &Id("")).as_str(), None);
    }

    #[test]
    fn keys_at_the_inline_boundary_and_past_it_are_verbatim() {
        for len in [
            1,
            // The unscoped key of this length takes the constant-length copy.
            UUID_LEN,
            INLINE_CAPACITY - 1,
            INLINE_CAPACITY,
            INLINE_CAPACITY + 1,
            10_000,
        ] {
            // `len` bytes exactly, with multi-byte characters in it.
            let id = format!("{}{}", "x".repeat(len % 2), "é".repeat(len / 2));
            let id: &'static str = Box::leak(id.into_boxed_str());
            assert_eq!(id.len(), len);
            assert_eq!(DedupeKey::new(None, &Id(id)).as_str(), Some(id));
            let scoped = format!("5:scope:{id}");
            assert_eq!(
                DedupeKey::new(Some("scope"), &Id(id)).as_str(),
                Some(&*scoped)
            );
        }
    }

    /// Splits a scoped key back into its scope and id, the way the layout
    /// says it is read; `None` when the key is not in that layout.
    fn parse(key: &str) -> Option<(&str, &str)> {
        let (len, rest) = key.split_once(SEPARATOR)?;
        let len: usize = len.parse().ok()?;
        let scope = rest.get(..len)?;
        let id = rest.get(len..)?.strip_prefix(SEPARATOR)?;
        Some((scope, id))
    }

    #[test]
    fn a_scoped_key_reads_back_as_its_scope_and_id() {
        let parts = [
            "", ":", "::", "a", "a:", ":a", "7:", "10:x", "é:☕", "\\:", "\0",
        ];
        let mut keys = std::collections::HashSet::new();
        for scope in parts {
            for id in parts.iter().filter(|id| !id.is_empty()) {
                let id: &'static str = id;
                let key = DedupeKey::new(Some(scope), &Id(id));
                let key = key.as_str().unwrap();
                assert_eq!(parse(key), Some((scope, id)), "{key:?}");
                assert!(keys.insert(key.to_owned()), "{key:?} twice");
            }
        }
    }

    #[test]
    fn a_uuid_under_a_22_byte_scope_stays_inline() {
        let uuid = "f1e2d3c4-b5a6-4789-90ab-cdef01234567";
        let scope = "s".repeat(22);
        let key = DedupeKey::new(Some(&scope), &Id(uuid));
        assert!(matches!(key.0, Repr::Inline(_)), "{key:?}");
        let longer = DedupeKey::new(Some(&format!("{scope}s")), &Id(uuid));
        assert!(matches!(longer.0, Repr::Heap(_)), "{longer:?}");
        assert_eq!(parse(longer.as_str().unwrap()).unwrap().1, uuid);
        let long_scope = "s".repeat(1_234);
        let key = DedupeKey::new(Some(&long_scope), &Id(uuid));
        assert_eq!(parse(key.as_str().unwrap()), Some((&*long_scope, uuid)));
        assert!(key.as_str().unwrap().starts_with("1234:s"));
    }

    #[test]
    fn a_missing_id_is_missing_and_an_id_is_not() {
        assert!(DedupeKey::new(None, &Id("")).is_missing());
        assert!(!DedupeKey::new(None, &Id("short")).is_missing());
        assert_eq!(DedupeKey::new(None, &Id("")).id(), "");
    }

    #[test]
    fn unusual_bytes_survive() {
        let id = "a\0b\nc \"d\" ☕";
        assert_eq!(DedupeKey::new(None, &Id(id)).as_str(), Some(id));
    }
}
