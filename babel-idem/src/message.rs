//! [`MessageId`]: where a message keeps the identity a guard dedupes on.

use std::rc::Rc;
use std::sync::Arc;

/// A message that carries its own identity, the dedupe key of a guard.
///
/// For a BabelQueue [`Envelope`](crate::envelope::Envelope) that is `meta.id`, verbatim.
/// `None` (an absent or empty id) means the message cannot be deduplicated,
/// and the guard runs the handler without remembering anything (fail-open).
///
/// Implement it for your own message types:
///
/// ```
/// use babel_idem::MessageId;
///
/// struct Payment {
///     idempotency_key: String,
/// }
///
/// impl MessageId for Payment {
///     fn message_id(&self) -> Option<&str> {
///         Some(self.idempotency_key.as_str()).filter(|key| !key.is_empty())
///     }
/// }
///
/// let payment = Payment { idempotency_key: "pay-7".into() };
/// assert_eq!(payment.message_id(), Some("pay-7"));
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` does not carry a message id",
    label = "this type does not implement `babel_idem::MessageId`",
    note = "the guard dedupes on the message's id: implement `babel_idem::MessageId` for `{Self}`, \
            or point `message = ...` at a parameter whose type does (such as `Envelope`)"
)]
pub trait MessageId {
    /// The message's identity, or `None` when it has no usable one.
    fn message_id(&self) -> Option<&str>;
}

macro_rules! forward_message_id {
    ($($ty:ty),+ $(,)?) => {$(
        impl<M: MessageId + ?Sized> MessageId for $ty {
            #[inline]
            fn message_id(&self) -> Option<&str> {
                (**self).message_id()
            }
        }
    )+};
}

forward_message_id!(&M, &mut M, Box<M>, Arc<M>, Rc<M>);
