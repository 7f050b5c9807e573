//! [`Handler`]: the shapes of function a [`Router`](crate::router::Router) accepts,
//! checked by the compiler.
//!
//! Four shapes, for `async fn`s and for closures that return a future:
//!
//! - `async fn(Envelope) -> Result<(), E>`
//! - `async fn(Envelope, Delivery) -> Result<(), E>`, when the handler needs
//!   the delivery's attempts or the transport headers.
//! - `async fn(M) -> Result<(), E>`, a typed handler: `M` is a
//!   [`Message`] type, decoded from the envelope's `data` before the handler
//!   runs.
//! - `async fn(M, Delivery) -> Result<(), E>`, a typed handler that also
//!   reads what the envelope said beside `data` (its `meta`, `trace_id` and
//!   URN, moved into the [`Delivery`]).
//!
//! `E` is any error that converts into `Box<dyn Error + Send + Sync>`:
//! `anyhow::Error`, [`StoreError`](crate::store::StoreError), your own error type. A
//! function of any other shape does not compile, and the error lists these
//! shapes (`#[diagnostic::on_unimplemented]`).

use std::any::type_name;
use std::error::Error;
use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;

use crate::envelope::Envelope;
use crate::message::Message;
use crate::store::BoxError;

use super::payload;
use super::{Delivery, Urn};

/// The future a [`Handler`] returns once its error type is erased.
pub type HandlerFuture = Pin<Box<dyn Future<Output = Result<(), HandlerError>> + Send + 'static>>;

/// Something a [`Router`](crate::router::Router) can call for a message.
///
/// Implemented for every `async fn` and closure of the four accepted shapes;
/// `Args` only tells the shapes apart (it is `(Envelope,)`,
/// `(Envelope, Delivery)`, `(Typed<M>,)` or `(Typed<M>, Delivery)`) and is
/// inferred.
///
/// ```
/// use babel_idem::{Delivery, Envelope, Message, Router, urn};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize, Message)]
/// #[message(urn = "urn:babel:orders:refunded")]
/// struct OrderRefunded {
///     order_id: u64,
/// }
///
/// async fn on_created(env: Envelope) -> Result<(), anyhow::Error> {
///     anyhow::ensure!(env.data.contains_key("order_id"), "order without an id");
///     Ok(())
/// }
///
/// async fn on_paid(env: Envelope, delivery: Delivery) -> Result<(), std::io::Error> {
///     println!("{} (attempt {})", env.urn(), delivery.attempts() + 1);
///     Ok(())
/// }
///
/// async fn on_refunded(refund: OrderRefunded, delivery: Delivery) -> Result<(), anyhow::Error> {
///     println!("refund of {} in trace {:?}", refund.order_id, delivery.trace_id());
///     Ok(())
/// }
///
/// let router = Router::builder()
///     .route(urn!("urn:babel:orders:created"), on_created)
///     .route(urn!("urn:babel:orders:paid"), on_paid)
///     .route(urn!("urn:babel:orders:shipped"), |env: Envelope| async move {
///         println!("shipped {}", env.data["order_id"]);
///         Ok::<(), anyhow::Error>(())
///     })
///     .handle(on_refunded)
///     .build()?;
/// # Ok::<(), babel_idem::router::RouterError>(())
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a BabelQueue message handler",
    label = "not a handler: an `async fn` or closure of a supported shape is expected here",
    note = "a handler is an `async fn`, or a closure returning a future, of one of these shapes:\n  async fn(Envelope) -> Result<(), E>\n  async fn(Envelope, Delivery) -> Result<(), E>\n  async fn(M) -> Result<(), E>\n  async fn(M, Delivery) -> Result<(), E>\nwhere `M` is a message type (`#[derive(Message)]` with `#[message(urn = \"...\")]`, or `impl babel_idem::Message`) and `E: Into<Box<dyn std::error::Error + Send + Sync>>` (anyhow::Error, StoreError, your own error type)",
    note = "the function must be `Send + Sync + 'static` and its future `Send + 'static`: take the message by value and move what the closure captures"
)]
pub trait Handler<Args>: Send + Sync + 'static {
    /// Starts handling one message.
    fn call(&self, envelope: Envelope, delivery: Delivery) -> HandlerFuture;

    /// For a typed handler, the URN its message type carries and the type's
    /// name ([`std::any::type_name`]); `None` for a handler that takes the
    /// [`Envelope`]. [`RouterBuilder::build`](crate::router::RouterBuilder::build)
    /// refuses a typed handler registered under another URN.
    ///
    /// ```
    /// use babel_idem::{Envelope, Message};
    /// use babel_idem::router::Handler;
    /// use serde::{Deserialize, Serialize};
    ///
    /// #[derive(Serialize, Deserialize, Message)]
    /// #[message(urn = "urn:babel:orders:created")]
    /// struct OrderCreated {}
    ///
    /// async fn typed(_: OrderCreated) -> Result<(), anyhow::Error> { Ok(()) }
    /// async fn untyped(_: Envelope) -> Result<(), anyhow::Error> { Ok(()) }
    ///
    /// fn message_of<H: Handler<Args>, Args>(handler: &H) -> Option<String> {
    ///     handler.message().map(|(urn, _)| urn.to_string())
    /// }
    /// assert_eq!(message_of(&typed).as_deref(), Some("urn:babel:orders:created"));
    /// assert_eq!(message_of(&untyped), None);
    /// ```
    fn message(&self) -> Option<(Urn, &'static str)> {
        None
    }
}

impl<F, Fut, E> Handler<(Envelope,)> for F
where
    F: Fn(Envelope) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), E>> + Send + 'static,
    E: Into<BoxError> + 'static,
{
    fn call(&self, envelope: Envelope, _delivery: Delivery) -> HandlerFuture {
        let future = self(envelope);
        Box::pin(async move { future.await.map_err(HandlerError::new) })
    }
}

impl<F, Fut, E> Handler<(Envelope, Delivery)> for F
where
    F: Fn(Envelope, Delivery) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), E>> + Send + 'static,
    E: Into<BoxError> + 'static,
{
    fn call(&self, envelope: Envelope, delivery: Delivery) -> HandlerFuture {
        let future = self(envelope, delivery);
        Box::pin(async move { future.await.map_err(HandlerError::new) })
    }
}

/// In a [`Handler`]'s `Args`, the argument of a typed handler: a value of
/// the [`Message`] type `M`, decoded from the envelope's `data`. A marker
/// the compiler infers, never built; it keeps the typed shapes apart from
/// the envelope ones.
///
/// ```
/// use babel_idem::{Delivery, Message};
/// use babel_idem::router::{Handler, Typed};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize, Message)]
/// #[message(urn = "urn:babel:orders:created")]
/// struct OrderCreated {}
///
/// async fn on_created(_: OrderCreated, _: Delivery) -> Result<(), anyhow::Error> { Ok(()) }
///
/// fn typed_with_delivery<M, H: Handler<(Typed<M>, Delivery)>>(_: &H) {}
/// typed_with_delivery(&on_created);
/// ```
pub struct Typed<M>(PhantomData<fn() -> M>);

impl<F, Fut, E, M> Handler<(Typed<M>,)> for F
where
    F: Fn(M) -> Fut + Send + Sync + 'static,
    M: Message,
    Fut: Future<Output = Result<(), E>> + Send + 'static,
    E: Into<BoxError> + 'static,
{
    fn call(&self, envelope: Envelope, _delivery: Delivery) -> HandlerFuture {
        let Envelope { job, data, .. } = envelope;
        match payload::decode::<M>(&data, &job) {
            Ok(message) => run(self(message)),
            Err(invalid) => refuse(invalid),
        }
    }

    fn message(&self) -> Option<(Urn, &'static str)> {
        Some((M::URN, type_name::<M>()))
    }
}

impl<F, Fut, E, M> Handler<(Typed<M>, Delivery)> for F
where
    F: Fn(M, Delivery) -> Fut + Send + Sync + 'static,
    M: Message,
    Fut: Future<Output = Result<(), E>> + Send + 'static,
    E: Into<BoxError> + 'static,
{
    fn call(&self, envelope: Envelope, delivery: Delivery) -> HandlerFuture {
        let (data, delivery) = delivery.take_envelope(envelope);
        let urn = delivery.urn().unwrap_or_default();
        match payload::decode::<M>(&data, urn) {
            Ok(message) => run(self(message, delivery)),
            Err(invalid) => refuse(invalid),
        }
    }

    fn message(&self) -> Option<(Urn, &'static str)> {
        Some((M::URN, type_name::<M>()))
    }
}

/// A typed handler's future, its error type erased.
fn run<Fut, E>(future: Fut) -> HandlerFuture
where
    Fut: Future<Output = Result<(), E>> + Send + 'static,
    E: Into<BoxError> + 'static,
{
    Box::pin(async move { future.await.map_err(HandlerError::new) })
}

/// The failed attempt of a message whose `data` its type cannot take: the
/// handler does not run, and dispatch fails the attempt as it fails a
/// handler's error (a retry, then a dead letter with reason `failed`).
fn refuse(invalid: payload::InvalidPayloadError) -> HandlerFuture {
    Box::pin(std::future::ready(Err(HandlerError::new(invalid))))
}

/// The argument shapes of typed handlers, `(Typed<M>,)` and
/// `(Typed<M>, Delivery)`, and the message type they take:
/// [`RouterBuilder::handle`](crate::router::RouterBuilder::handle) registers
/// a handler under `M::URN` through it.
///
/// ```
/// use babel_idem::{Message, Urn};
/// use babel_idem::router::{Handler, TypedArgs};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize, Message)]
/// #[message(urn = "urn:babel:orders:created")]
/// struct OrderCreated {}
///
/// async fn on_created(_: OrderCreated) -> Result<(), anyhow::Error> { Ok(()) }
///
/// fn urn_of<H: Handler<Args>, Args: TypedArgs>(_: &H) -> Urn {
///     <Args::Message as Message>::URN
/// }
/// assert_eq!(urn_of(&on_created), "urn:babel:orders:created");
/// ```
#[diagnostic::on_unimplemented(
    message = "`.handle(...)` needs a handler that takes a message type, and this one takes the `Envelope`",
    label = "this handler has no message type to read a URN from",
    note = "register a handler of `Envelope` under its URN with `.route(urn!(\"urn:...\"), handler)`, or make it take a `#[derive(Message)]` type: `async fn(OrderCreated) -> Result<(), E>`"
)]
pub trait TypedArgs: 'static {
    /// The message type the handler takes.
    type Message: Message;
}

impl<M: Message> TypedArgs for (Typed<M>,) {
    type Message = M;
}

impl<M: Message> TypedArgs for (Typed<M>, Delivery) {
    type Message = M;
}

/// The error a handler returned, with the name of its type (written to the
/// dead-letter block's `exception` field, as the Python SDK writes its
/// exception's class name).
///
/// The name is taken where the handler's error is converted, from its
/// static type. A handler whose error type is a boxed trait object
/// (`Box<dyn Error + Send + Sync>`, `anyhow::Error`) hides the concrete
/// type; for those, the boxed value is recognised when it is a
/// `HandlerError` (a handler can wrap its error with [`HandlerError::new`]
/// before boxing it, to keep the name) or one of the standard library's
/// error types, and is otherwise named `Error`.
///
/// ```
/// use babel_idem::router::HandlerError;
/// use std::error::Error;
///
/// let error = HandlerError::new(std::io::Error::other("gateway timeout"));
/// assert_eq!(error.to_string(), "gateway timeout");
/// assert_eq!(error.error_type(), "std::io::error::Error");
/// assert_eq!(error.name(), "Error");
///
/// // Boxed, the name captured by `HandlerError::new` survives.
/// #[derive(Debug)]
/// struct PaymentDeclined;
/// impl std::fmt::Display for PaymentDeclined {
///     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
///         f.write_str("declined")
///     }
/// }
/// impl Error for PaymentDeclined {}
///
/// let boxed: Box<dyn Error + Send + Sync> = Box::new(HandlerError::new(PaymentDeclined));
/// assert_eq!(HandlerError::new(boxed).name(), "PaymentDeclined");
/// let parse: Box<dyn Error + Send + Sync> = "x".parse::<u8>().unwrap_err().into();
/// assert_eq!(HandlerError::new(parse).name(), "ParseIntError");
/// ```
#[derive(Debug)]
pub struct HandlerError {
    error_type: &'static str,
    error: BoxError,
}

impl HandlerError {
    /// Wraps a handler's error, remembering the name of its type: `E`'s,
    /// or for a boxed error the boxed value's where it can be known (see
    /// above). A `HandlerError` boxed inside `error` is taken out as it
    /// is, never wrapped twice.
    pub fn new<E: Into<BoxError> + 'static>(error: E) -> Self {
        let static_type = std::any::type_name::<E>();
        let error: BoxError = error.into();
        let error = match error.downcast::<HandlerError>() {
            Ok(wrapped) => return *wrapped,
            Err(error) => error,
        };
        let error_type = if is_opaque(static_type) {
            std_error_type(&*error).unwrap_or(static_type)
        } else {
            static_type
        };
        HandlerError { error_type, error }
    }

    /// The Rust type name of the error the handler returned (with its
    /// module path), or of the boxed value when it could be known.
    pub fn error_type(&self) -> &'static str {
        self.error_type
    }

    /// The short, stable name of the error's type: [`error_type`](Self::error_type)
    /// without its module path or generic arguments (`Error` for
    /// `std::io::Error`, `PaymentDeclined` for `billing::PaymentDeclined<T>`),
    /// the boxed type for a `Box<T>`, and `Error` for a trait object whose
    /// value could not be known. What the dead-letter block's `exception`
    /// holds.
    pub fn name(&self) -> &'static str {
        short_type_name(self.error_type)
    }

    /// The error itself.
    pub fn error(&self) -> &(dyn Error + Send + Sync + 'static) {
        &*self.error
    }

    /// Takes the error out.
    pub fn into_inner(self) -> BoxError {
        self.error
    }
}

/// Whether `type_name` hides its value's type: a trait object, boxed or
/// not, or one of the usual error boxes (`anyhow::Error`, `eyre::Report`).
fn is_opaque(type_name: &str) -> bool {
    type_name.contains("dyn ")
        || matches!(
            type_name,
            "anyhow::Error" | "eyre::Report" | "eyre::error::Report"
        )
}

/// The type name of `error` when it is one of the standard library's error
/// types a handler commonly boxes.
fn std_error_type(error: &(dyn Error + Send + Sync + 'static)) -> Option<&'static str> {
    macro_rules! first_of {
        ($($ty:ty),+ $(,)?) => {
            $(if error.is::<$ty>() {
                return Some(std::any::type_name::<$ty>());
            })+
        };
    }
    first_of!(
        std::io::Error,
        std::fmt::Error,
        std::num::ParseIntError,
        std::num::ParseFloatError,
        std::num::TryFromIntError,
        std::str::ParseBoolError,
        std::str::Utf8Error,
        std::string::FromUtf8Error,
        std::char::ParseCharError,
        std::net::AddrParseError,
        std::time::SystemTimeError,
        std::array::TryFromSliceError,
        serde_json::Error,
        crate::store::StoreError,
        crate::envelope::EnvelopeError,
    );
    None
}

/// The last path segment of a type's name, without generic arguments,
/// references or `dyn`; a `Box<T>`, `Arc<T>` or `Rc<T>` named by `T`.
/// `Error` when nothing of a name is left.
fn short_type_name(type_name: &str) -> &str {
    let mut name = type_name.trim();
    loop {
        name = name.trim_start_matches('&').trim_start();
        // A lifetime (`'a `) and `mut ` / `dyn ` before the type itself.
        if let Some(rest) = name.strip_prefix('\'') {
            name = rest.split_once(' ').map_or("", |(_, after)| after);
            continue;
        }
        if let Some(rest) = name
            .strip_prefix("mut ")
            .or_else(|| name.strip_prefix("dyn "))
        {
            name = rest;
            continue;
        }
        let path = name.split('<').next().unwrap_or_default();
        let last = path.rsplit("::").next().unwrap_or_default();
        let is_box = matches!(last, "Box" | "Arc" | "Rc");
        match (is_box, name.find('<'), name.rfind('>')) {
            (true, Some(open), Some(close)) if open < close => {
                name = &name[open + 1..close];
            }
            _ => break,
        }
    }
    // The type's own path: up to generics, a trait object's `+ Send`, a
    // tuple's or an array's separators.
    let end = name
        .find(['<', ' ', '+', ',', ';', ']', ')', '>'])
        .unwrap_or(name.len());
    let last = name[..end].rsplit("::").next().unwrap_or_default();
    let last = last.trim_start_matches(['(', '[']);
    if !last.is_empty() && last.chars().all(|c| c.is_alphanumeric() || c == '_') {
        last
    } else {
        "Error"
    }
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.error, f)
    }
}

impl Error for HandlerError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.error.source()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_type_name_is_cut_to_its_last_segment_without_generics() {
        let cases = [
            ("std::io::error::Error", "Error"),
            ("billing::PaymentDeclined", "PaymentDeclined"),
            ("billing::Declined<alloc::string::String>", "Declined"),
            (
                "alloc::boxed::Box<dyn core::error::Error + core::marker::Send + core::marker::Sync>",
                "Error",
            ),
            (
                "alloc::boxed::Box<billing::PaymentDeclined>",
                "PaymentDeclined",
            ),
            ("alloc::sync::Arc<billing::Declined<u8>>", "Declined"),
            ("&str", "str"),
            ("&'static str", "str"),
            ("alloc::string::String", "String"),
            ("anyhow::Error", "Error"),
            ("(u8, u8)", "u8"),
            ("", "Error"),
            ("<>", "Error"),
        ];
        for (full, short) in cases {
            assert_eq!(short_type_name(full), short, "{full}");
        }
    }

    #[test]
    fn a_boxed_error_is_named_by_its_value_where_known() {
        let io: BoxError = std::io::Error::other("down").into();
        let io = HandlerError::new(io);
        assert_eq!(io.error_type(), "std::io::error::Error");
        assert_eq!(io.name(), "Error");

        let text: BoxError = "plain text".into();
        assert_eq!(HandlerError::new(text).name(), "Error");

        let twice = HandlerError::new(HandlerError::new(std::fmt::Error));
        assert_eq!(twice.name(), "Error");
        assert_eq!(twice.error_type(), "core::fmt::Error");
        assert_eq!(twice.to_string(), std::fmt::Error.to_string());
    }
}
