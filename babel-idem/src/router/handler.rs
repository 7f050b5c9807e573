//! [`Handler`]: the shapes of function a [`Router`](crate::router::Router) accepts,
//! checked by the compiler.
//!
//! Two shapes, for `async fn`s and for closures that return a future:
//!
//! - `async fn(Envelope) -> Result<(), E>`
//! - `async fn(Envelope, Delivery) -> Result<(), E>`, when the handler needs
//!   the delivery's attempts or the transport headers.
//!
//! `E` is any error that converts into `Box<dyn Error + Send + Sync>`:
//! `anyhow::Error`, [`StoreError`](crate::store::StoreError), your own error type. A
//! function of any other shape does not compile, and the error lists these
//! shapes (`#[diagnostic::on_unimplemented]`).

use std::error::Error;
use std::fmt;
use std::future::Future;
use std::pin::Pin;

use crate::envelope::Envelope;
use crate::store::BoxError;

use super::Delivery;

/// The future a [`Handler`] returns once its error type is erased.
pub type HandlerFuture = Pin<Box<dyn Future<Output = Result<(), HandlerError>> + Send + 'static>>;

/// Something a [`Router`](crate::router::Router) can call for a message.
///
/// Implemented for every `async fn` and closure of the two accepted shapes;
/// `Args` only tells the shapes apart (it is `(Envelope,)` or
/// `(Envelope, Delivery)`) and is inferred.
///
/// ```
/// use babel_idem::{Delivery, Envelope, Router, urn};
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
/// let router = Router::builder()
///     .route(urn!("urn:babel:orders:created"), on_created)
///     .route(urn!("urn:babel:orders:paid"), on_paid)
///     .route(urn!("urn:babel:orders:shipped"), |env: Envelope| async move {
///         println!("shipped {}", env.data["order_id"]);
///         Ok::<(), anyhow::Error>(())
///     })
///     .build()?;
/// # Ok::<(), babel_idem::router::RouterError>(())
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a BabelQueue message handler",
    label = "not a handler: an `async fn` or closure of a supported shape is expected here",
    note = "a handler is an `async fn`, or a closure returning a future, of one of these shapes:\n  async fn(Envelope) -> Result<(), E>\n  async fn(Envelope, Delivery) -> Result<(), E>\nwhere `E: Into<Box<dyn std::error::Error + Send + Sync>>` (anyhow::Error, StoreError, your own error type)",
    note = "the function must be `Send + Sync + 'static` and its future `Send + 'static`: take the envelope by value and move what the closure captures"
)]
pub trait Handler<Args>: Send + Sync + 'static {
    /// Starts handling one message.
    fn call(&self, envelope: Envelope, delivery: Delivery) -> HandlerFuture;
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

/// The error a handler returned, with the name of its type (written to the
/// dead-letter block's `exception` field, as other SDKs write their
/// exception class).
///
/// ```
/// use babel_idem::router::HandlerError;
///
/// let error = HandlerError::new(std::io::Error::other("gateway timeout"));
/// assert_eq!(error.to_string(), "gateway timeout");
/// assert_eq!(error.error_type(), "std::io::error::Error");
/// ```
#[derive(Debug)]
pub struct HandlerError {
    error_type: &'static str,
    error: BoxError,
}

impl HandlerError {
    /// Wraps a handler's error, remembering the name of its type.
    pub fn new<E: Into<BoxError> + 'static>(error: E) -> Self {
        HandlerError {
            error_type: std::any::type_name::<E>(),
            error: error.into(),
        }
    }

    /// The Rust type name of the error the handler returned.
    pub fn error_type(&self) -> &'static str {
        self.error_type
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
