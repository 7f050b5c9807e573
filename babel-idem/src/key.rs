//! [`DedupeKey`]: the key a guard looks up, taken from a message before its
//! handler runs.
//!
//! A key is copied out of the message (a handler may move or mutate the
//! message), so it must be cheap: keys up to `INLINE_CAPACITY` bytes, which
//! covers a UUID with a scope of up to 22 bytes in front, live inline and
//! cost no allocation.

use std::fmt;

use arrayvec::ArrayString;

use crate::message::MessageId;

pub(crate) mod canonical_uuid;

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

/// An inline key whose text starts on a 16-byte boundary. `ArrayString`
/// keeps its 4-byte length first, so its text began 4 bytes into every
/// 16-byte piece the compiler moves the guard's future in, and the store's
/// 16-byte reads of the key each straddled two earlier stores, which the
/// CPU cannot forward: it waited for them to reach the cache, on every
/// delivery (`perf annotate`; 65 to 78 ns per in-cache duplicate against
/// 77 to 96 before, in alternating runs).
#[derive(Clone)]
#[repr(C, align(16))]
struct Aligned {
    /// Written, so that the moves never read stale bytes either.
    _before_the_length: [u8; 12],
    text: ArrayString<INLINE_CAPACITY>,
}

impl Aligned {
    #[inline]
    fn new(text: ArrayString<INLINE_CAPACITY>) -> Self {
        Aligned {
            _before_the_length: [0; 12],
            text,
        }
    }
}

/// An unscoped id of a canonical UUID's length, the key of nearly every
/// delivery: its bytes, and the UUID they spell as two words.
#[derive(Clone, Copy)]
#[repr(C, align(16))]
struct UuidLength {
    /// The UUID's first word ([`canonical_uuid::parse`]), or 0 with `low`
    /// when the bytes are not a canonical UUID.
    ///
    /// Read when the guard is built, while the bytes are in registers: a
    /// guard polled through a call read the key back from its future on
    /// the stack and parsed it there, and a duplicate at 1,000 ids cost
    /// 16.7 against 15.6 ns (a loop calling the guard through a `&dyn Fn`,
    /// 9 alternating runs; the same in a loop calling it directly).
    high: u64,
    /// The bytes in three 16-byte pieces that are each written whole: the
    /// last holds bytes 32 to 36 and zeros. In an [`Aligned`] the last
    /// piece held those 4 bytes beside 12 that no store had written, and
    /// the compiler's 16-byte move of the key into the guard's future
    /// waited on every delivery for the 4-byte store to reach the cache (a
    /// store-forwarding stall: `perf annotate` put 40% of the delivery
    /// loop's samples on it).
    pieces: [[u8; 16]; 3],
    /// The UUID's second word, apart from `high`: side by side, the
    /// compiler wrote both with one 16-byte store that the lookup read back
    /// as two words, and the key gained 0.2 ns instead of 1.1.
    low: u64,
}

impl UuidLength {
    #[inline]
    fn new(id: &[u8; UUID_LEN]) -> Self {
        let pieces = pieces(id);
        let [high, low] = canonical_uuid::parse_pieces(&pieces).unwrap_or([0, 0]);
        UuidLength { high, pieces, low }
    }

    #[inline]
    fn bytes(&self) -> &[u8; UUID_LEN] {
        self.pieces
            .as_flattened()
            .first_chunk::<UUID_LEN>()
            .unwrap_or(&[0; UUID_LEN])
    }
}

/// `id` as three 16-byte pieces, the last holding bytes 32 to 36 and
/// zeros, each made in a register so that one 16-byte store writes it (the
/// compiler copied plain arrays through the stack in pieces of other sizes,
/// the stall all over again).
#[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
#[inline(always)]
fn pieces(id: &[u8; UUID_LEN]) -> [[u8; 16]; 3] {
    use safe_arch::{byte_shr_imm_u128_m128i, load_unaligned_m128i};
    let piece = |at: usize| match id[at..].first_chunk::<16>() {
        Some(bytes) => load_unaligned_m128i(bytes),
        None => safe_arch::zeroed_m128i(),
    };
    let last = byte_shr_imm_u128_m128i::<12>(piece(UUID_LEN - 16));
    [piece(0).into(), piece(16).into(), last.into()]
}

#[cfg(not(all(target_arch = "x86_64", target_feature = "sse2")))]
#[inline(always)]
fn pieces(id: &[u8; UUID_LEN]) -> [[u8; 16]; 3] {
    let mut pieces = [[0; 16]; 3];
    for (piece, bytes) in pieces.iter_mut().zip(id.chunks(16)) {
        piece[..bytes.len()].copy_from_slice(bytes);
    }
    pieces
}

#[derive(Clone)]
enum Repr {
    Missing,
    UuidLength(UuidLength),
    Inline(Aligned),
    Heap(Box<str>),
}

impl DedupeKey {
    /// The key of `message` under `scope`.
    #[inline]
    pub fn new<M: MessageId + ?Sized>(scope: Option<&str>, message: &M) -> Self {
        match message.message_id() {
            None | Some("") => DedupeKey(Repr::Missing),
            Some(id) if scope.is_none() && id.len() == UUID_LEN => {
                // The common key, spelled out so the copy's length is a
                // constant: the compiler inlines it instead of calling
                // `memcpy`, which made the store's read of the key straight
                // after the copy far slower.
                let mut inline = ArrayString::new();
                inline.push_str(id);
                DedupeKey(Repr::Inline(Aligned::new(inline)))
            }
            Some(id) => Self::from_parts(scope, id),
        }
    }

    /// `then(key)` for seen-set mode's key of `message`: [`new`](Self::new)'s
    /// text, but an unscoped id of a UUID's length is kept as bytes, with
    /// the UUID they spell, which its store looks up by (see
    /// [`UuidLength`]): the key of nearly every delivery, copied in 16-byte
    /// pieces that the compiler inlines. Its text costs a UTF-8 check, so
    /// the modes that ask their stores with text take `new`'s layout.
    ///
    /// `then` is inlined once per layout, so that a guard builds its future
    /// around each layout's key where it is written, not around a key built
    /// beside it and then copied in. Every other key is made out of line
    /// ([`from_parts`](Self::from_parts)), not by an inlined `new`: the
    /// compiler copies a key into the guard's future in pieces cut where
    /// any layout built in the same function has a field, and `Inline`'s
    /// 4-byte length cut the first UUID piece in three. The store's 16-byte
    /// read of that piece then waited for the three stores to reach the
    /// cache on every delivery (AMD EPYC, 11 alternating runs: 31.4 to 23.2
    /// ns per duplicate at 1,000 ids, 80.7 to 69.2 at 100,000).
    #[inline(always)]
    pub(crate) fn with_lookup_key<M: MessageId + ?Sized, R>(
        scope: Option<&str>,
        message: &M,
        then: impl FnOnce(Self) -> R,
    ) -> R {
        match message.message_id() {
            None | Some("") => then(DedupeKey(Repr::Missing)),
            Some(id) => match <&[u8; UUID_LEN]>::try_from(id.as_bytes()) {
                Ok(bytes) if scope.is_none() => {
                    then(DedupeKey(Repr::UuidLength(UuidLength::new(bytes))))
                }
                _ => then(Self::from_parts(scope, id)),
            },
        }
    }

    /// Every other key, out of line: its allocation and formatting would
    /// otherwise give every delivery's copy of a UUID their stack frame.
    #[inline(never)]
    fn from_parts(scope: Option<&str>, id: &str) -> Self {
        let mut inline = ArrayString::new();
        if write_key(&mut inline, scope, id).is_ok() {
            return DedupeKey(Repr::Inline(Aligned::new(inline)));
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

    /// The UUID an unscoped id of a canonical UUID's length (36 bytes)
    /// spells, for a store that reads it without asking for a `str` (see
    /// [`Store::seen_key`](crate::store::Store::seen_key)); `[0, 0]` when those
    /// bytes are not a canonical UUID, and `None` for every other key.
    #[inline]
    pub(crate) fn uuid_words(&self) -> Option<canonical_uuid::Uuid> {
        match &self.0 {
            Repr::UuidLength(key) => Some([key.high, key.low]),
            _ => None,
        }
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
            // Copied from a `str`, so valid UTF-8; checked again because
            // safe code cannot say so. The in-memory store's path reads
            // the UUID instead ([`uuid_words`](Self::uuid_words)).
            Repr::UuidLength(key) => std::str::from_utf8(key.bytes()).ok(),
            Repr::Inline(key) => Some(&key.text),
            Repr::Heap(key) => Some(key),
        }
    }
}

/// Writes the key of `id` under `scope` (see [the layout](DedupeKey#layout)); fails
/// only when `out` is full.
#[inline]
fn write_key(out: &mut impl fmt::Write, scope: Option<&str>, id: &str) -> fmt::Result {
    if let Some(scope) = scope {
        // Digits by hand: `write!` with `{}` tripled the cost of a scoped key.
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

    /// Seen-set mode's key of `message`.
    fn lookup_key(scope: Option<&str>, message: &Id) -> DedupeKey {
        DedupeKey::with_lookup_key(scope, message, |key| key)
    }

    #[test]
    fn an_unscoped_36_byte_id_is_kept_as_bytes_the_store_can_read() {
        for id in [
            "f1e2d3c4-b5a6-4789-90ab-cdef01234567",
            "F1E2D3C4-B5A6-4789-90AB-CDEF01234567",
            "éééééééééééééééééé",
        ] {
            assert_eq!(id.len(), UUID_LEN);
            let key = lookup_key(None, &Id(id));
            let Repr::UuidLength(bytes) = &key.0 else {
                panic!("{key:?} is not kept as bytes");
            };
            let pieces = bytes.pieces.as_flattened();
            assert_eq!(&pieces[..UUID_LEN], id.as_bytes());
            assert_eq!(&pieces[UUID_LEN..], [0; 12], "the last piece ends in zeros");
            let uuid = canonical_uuid::parse(id).unwrap_or([0, 0]);
            assert_eq!(key.uuid_words(), Some(uuid), "{id}");
            assert_eq!(DedupeKey::new(None, &Id(id)).uuid_words(), None);
            assert_eq!(key.as_str(), Some(id));
            assert_eq!(key.clone().as_str(), Some(id));
            let scoped = lookup_key(Some("s"), &Id(id));
            assert_eq!(scoped.uuid_words(), None, "{scoped:?}");
            assert_eq!(scoped.as_str(), DedupeKey::new(Some("s"), &Id(id)).as_str());
        }
        assert_ne!(
            lookup_key(None, &Id("f1e2d3c4-b5a6-4789-90ab-cdef01234567")).uuid_words(),
            Some([0, 0]),
            "a canonical UUID is read into its words"
        );
        assert_eq!(lookup_key(None, &Id("short")).uuid_words(), None);
        assert_eq!(lookup_key(None, &Id("short")).as_str(), Some("short"));
        assert!(lookup_key(None, &Id("")).is_missing());
        assert!(!lookup_key(None, &Id("short")).is_missing());
    }

    #[test]
    fn unusual_bytes_survive() {
        let id = "a\0b\nc \"d\" ☕";
        assert_eq!(DedupeKey::new(None, &Id(id)).as_str(), Some(id));
    }
}
