//! [`DedupeKey`]: the key a guard looks up, taken from a message before its
//! handler runs.
//!
//! A key is copied out of the message (a handler may move or mutate the
//! message), so it must be cheap: ids up to [`INLINE_CAPACITY`] bytes, which
//! covers a UUID with a scope in front, live inline and cost no allocation.

use std::fmt;

use arrayvec::ArrayString;

use crate::MessageId;

/// The longest key (scope, separator and id) kept without a heap allocation.
pub(crate) const INLINE_CAPACITY: usize = 62;

/// The separator between a guard's scope and the message id.
pub(crate) const SCOPE_SEPARATOR: char = ':';

/// The dedupe key of one delivery: the message id, prefixed by the guard's
/// scope when it has one. `None` for a message without a usable id.
///
/// ```
/// use babel_idem::{DedupeKey, Envelope};
/// use serde_json::json;
///
/// let env = Envelope::new("urn:babel:orders:created", json!({})).with_id("id-A");
/// assert_eq!(DedupeKey::new(None, &env).as_str(), Some("id-A"));
/// assert_eq!(DedupeKey::new(Some("billing"), &env).as_str(), Some("billing:id-A"));
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
        match message.message_id() {
            None | Some("") => DedupeKey(Repr::Missing),
            Some(id) => Self::from_parts(scope, id),
        }
    }

    #[inline]
    fn from_parts(scope: Option<&str>, id: &str) -> Self {
        let mut inline = ArrayString::new();
        let fits = match scope {
            None => inline.try_push_str(id).is_ok(),
            Some(scope) => {
                inline.try_push_str(scope).is_ok()
                    && inline.try_push(SCOPE_SEPARATOR).is_ok()
                    && inline.try_push_str(id).is_ok()
            }
        };
        if fits {
            return DedupeKey(Repr::Inline(inline));
        }
        let key = match scope {
            None => id.to_owned(),
            Some(scope) => format!("{scope}{SCOPE_SEPARATOR}{id}"),
        };
        DedupeKey(Repr::Heap(key.into_boxed_str()))
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
            let scoped = format!("scope:{id}");
            assert_eq!(
                DedupeKey::new(Some("scope"), &Id(id)).as_str(),
                Some(&*scoped)
            );
        }
    }

    #[test]
    fn unusual_bytes_survive() {
        let id = "a\0b\nc \"d\" ☕";
        assert_eq!(DedupeKey::new(None, &Id(id)).as_str(), Some(id));
    }
}
