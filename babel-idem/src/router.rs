//! Handler registration by URN and dispatch of raw deliveries.
//!
//! - [`Urn`] and [`urn!`](crate::urn): the name a message is routed by,
//!   RFC 8141 syntax, checked at compile time for literals.
//! - [`Handler`]: the function shapes a router accepts, checked by the
//!   compiler: handlers of the [`Envelope`](crate::Envelope), and typed
//!   handlers of a [`Message`](crate::Message) type, whose `data` dispatch
//!   decodes (or fails with [`InvalidPayloadError`]).
//! - [`Router`], [`RouterBuilder`] and [`routes!`](crate::routes): handlers by
//!   URN; one URN registered twice is rejected (at compile time in a
//!   `routes!` table).
//! - [`Router::dispatch`]: raw bytes plus a [`Delivery`] in, a
//!   [`Disposition`] out for the broker loop to act on.
//!
//! ```
//! use babel_idem::{Delivery, Disposition, Envelope, Router, urn};
//! use serde_json::json;
//!
//! async fn on_order_created(env: Envelope) -> Result<(), anyhow::Error> {
//!     println!("order {}", env.data["order_id"]);
//!     Ok(())
//! }
//!
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let router = Router::builder()
//!     .route(urn!("urn:babel:orders:created"), on_order_created)
//!     .build()?;
//!
//! let bytes = br#"{"job": "urn:babel:orders:created", "trace_id": "t-1", "data": {"order_id": 7},
//!     "meta": {"id": "m-1", "queue": "orders", "lang": "go", "schema_version": 1, "created_at": 0},
//!     "attempts": 0}"#;
//! assert!(matches!(router.dispatch(bytes, Delivery::new()).await, Disposition::Ack));
//!
//! let poison = router.dispatch(b"not json", Delivery::new()).await;
//! assert_eq!(poison.kind(), "dead_letter");
//! # Ok::<(), babel_idem::router::RouterError>(())
//! # }).unwrap();
//! ```

mod delivery;
mod dispatch;
mod disposition;
mod handler;
pub(crate) mod parked;
mod payload;
mod policy;
mod routes;
mod urn;

pub use delivery::{Delivery, HEADER_REPLAY_BYPASS};
pub use disposition::{DeadLettered, DispatchError, Disposition, ReleaseReason, Retry};
pub use handler::{Handler, HandlerError, HandlerFuture, Typed, TypedArgs};
pub use payload::InvalidPayloadError;
pub use policy::{Backoff, Jitter, UnknownUrnStrategy};
pub use routes::{
    DEFAULT_MAX_ATTEMPTS, DEFAULT_MAX_PARK_DELAY, Router, RouterBuilder, RouterError,
};
pub use urn::{Urn, UrnError};
