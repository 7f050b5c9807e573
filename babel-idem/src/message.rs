//! What a handler's message is: [`Message`], the Rust type of one URN's
//! `data`, and [`MessageId`], where a message keeps the identity a guard
//! dedupes on.

use std::rc::Rc;
use std::sync::Arc;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::router::Urn;

/// The Rust type of one kind of BabelQueue message's `data`, and the URN it
/// is routed by. A handler that takes it (`async fn(OrderCreated)` or
/// `async fn(OrderCreated, Delivery)`) gets the envelope's `data` decoded
/// into it, and registers with
/// [`RouterBuilder::handle`](crate::router::RouterBuilder::handle), which
/// reads the URN from here.
///
/// Derive it with `#[derive(Message)]` and `#[message(urn = "...")]`; the
/// derive checks the URN literal while it expands, like [`urn!`](crate::urn):
///
/// ```
/// use babel_idem::{Delivery, Message, Router};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize, Message)]
/// #[message(urn = "urn:babel:orders:created")]
/// struct OrderCreated {
///     order_id: u64,
/// }
///
/// async fn on_created(order: OrderCreated, delivery: Delivery) -> Result<(), anyhow::Error> {
///     println!("order {} (message {:?})", order.order_id, delivery.meta().and_then(|m| m.id.as_deref()));
///     Ok(())
/// }
///
/// assert_eq!(OrderCreated::URN.as_str(), "urn:babel:orders:created");
/// let router = Router::builder().handle(on_created).build()?;
/// assert!(router.handles("urn:babel:orders:created"));
/// # Ok::<(), babel_idem::router::RouterError>(())
/// ```
///
/// The bounds are what a message goes through: `DeserializeOwned`, because
/// dispatch decodes it from the envelope's `data`, which the handler then
/// owns; `Serialize`, because a producer writes the same type as `data`
/// (`serde_json::to_value(&order)`); `Send + 'static`, because the handler's
/// future holds it across awaits on a multi-threaded consumer. A type whose
/// `Serialize` writes something other than a JSON object cannot be the
/// `data` of an envelope, which is always an object.
///
/// By hand, with a URN checked by [`urn!`](crate::urn):
///
/// ```
/// use babel_idem::{Message, Urn, urn};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize)]
/// struct OrderPaid {
///     order_id: u64,
/// }
///
/// impl Message for OrderPaid {
///     const URN: Urn = urn!("urn:babel:orders:paid");
/// }
/// # assert_eq!(OrderPaid::URN.nss(), "orders:paid");
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a BabelQueue message type",
    label = "no `babel_idem::Message` impl: the URN of `{Self}` is unknown",
    note = "derive it with the URN the type is routed by: `#[derive(Message)]` and `#[message(urn = \"urn:<NID>:<NSS>\")]` on `{Self}`"
)]
pub trait Message: Serialize + DeserializeOwned + Send + 'static {
    /// The URN this type's messages are routed by.
    const URN: Urn;
}

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
            or point `message = ...` at a parameter whose type does (such as `Envelope` or `Delivery`)"
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
