//! Consumer-side idempotency for at-least-once BabelQueue message handlers.
//!
//! Brokers deliver at least once: a message can arrive twice after a crash
//! before ack, a redelivery or a manual replay. A [`run_once`] keyed on the
//! envelope's `meta.id` skips a message that was already processed, runs it
//! otherwise, and remembers the id only when the handler succeeds.
//! The [`guide`] explains the modes, the stores' layouts and the consumer's
//! rules page by page.
//!
//! ```
//! use babel_idem::{idempotent, Envelope, InMemoryStore, StoreError};
//! use serde_json::json;
//! use std::sync::LazyLock;
//! use std::sync::atomic::{AtomicU32, Ordering};
//!
//! static STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);
//! static CHARGES: AtomicU32 = AtomicU32::new(0);
//!
//! #[idempotent(store = STORE)]
//! async fn on_order_created(env: Envelope) -> Result<(), StoreError> {
//!     println!("charging order {}", env.data["order_id"]);
//!     CHARGES.fetch_add(1, Ordering::Relaxed);
//!     Ok(())
//! }
//!
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let env = Envelope::new("urn:babel:orders:created", json!({"order_id": 1042}));
//! on_order_created(env.clone()).await?; // runs
//! on_order_created(env).await?;         // a redelivery: skipped
//! assert_eq!(CHARGES.load(Ordering::Relaxed), 1);
//! # Ok::<(), StoreError>(())
//! # }).unwrap();
//! ```
//!
//! The crate root holds what a handler author needs; everything else lives in
//! its module ([`envelope`], [`guard`](mod@guard), [`key`], [`store`],
//! [`router`], [`telemetry`]):
//!
//! - [`Envelope`]: the BabelQueue v1 wire envelope, decoded and checked.
//! - [`Message`] (trait and derive): the Rust type of one URN's `data`, which
//!   a typed handler takes.
//! - [`MessageId`]: where a message keeps its identity.
//! - [`Store`]: the seen-set (`seen` / `remember` / `forget`); [`InMemoryStore`]
//!   is the reference one, persistent stores sit behind cargo features.
//!   [`ClaimStore`] and [`TransactionalStore`] are the capabilities of claim
//!   mode and transactional mode.
//! - [`run_once`], [`Guard`], [`wrap`] and [`idempotent`]: the decision and the
//!   ways to put it in front of a handler.
//! - [`telemetry`]: the consumer and producer spans, and
//!   [`telemetry::metrics`]: what the guards decided, counted.
//! - [`Router`], [`Urn`], [`urn!`] and [`routes!`]: handlers registered by
//!   URN, raw deliveries dispatched to a [`Disposition`] a broker loop acts on.
//! - [`adapters`]: the guard in other frameworks, such as a tower `Layer`
//!   (feature `tower`).
//! - `conformance` (feature `conformance`): the BabelQueue conformance runner.
//! - `schema` (feature `schema`): per-URN payload schemas, checked with the
//!   family's verdicts and the Python SDK's violation texts.
//! - `Consumer`, `consumer` and `transport` (features `consumer`,
//!   `redis-transport`, `amqp-transport`): a broker loop that reserves,
//!   dispatches and settles, with the BabelQueue Redis and RabbitMQ bindings;
//!   `consumer::is_replay` and `consumer::bypass_external_effects` for
//!   replays.
//!
//! Backends are cargo features: `sqlite` (default, `store::SqliteStore`),
//! `redis` (`store::RedisStore`) and `postgres` (`store::PostgresStore`).
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod adapters;
pub mod broker;
mod builders;
mod coalesce;
pub mod envelope;
pub mod guard;
pub mod guide;
pub mod key;
mod message;
mod names;
#[cfg(feature = "outbox")]
pub mod outbox;
#[cfg(any(feature = "redis", feature = "redis-transport"))]
mod redis_client;
pub mod router;
pub mod store;
pub mod telemetry;

#[cfg(feature = "conformance")]
pub mod conformance;
#[cfg(feature = "consumer")]
pub mod consumer;
#[cfg(feature = "redrive")]
pub mod redrive;
#[cfg(feature = "schema")]
pub mod schema;
#[cfg(feature = "consumer")]
pub mod transport;

#[doc(hidden)]
pub mod __private;

// The macros name this crate as `::babel_idem`; this makes that path resolve
// inside the crate too, so its own modules and unit tests can use them.
extern crate self as babel_idem;

pub use babel_idem_macros::{Message, idempotent, routes, urn};
#[cfg(feature = "consumer")]
pub use consumer::Consumer;
pub use envelope::{Envelope, EnvelopeError};
pub use guard::{Guard, OnRememberFailure, run_once, wrap};
pub use message::{Message, MessageId};
pub use router::{Delivery, Disposition, Router, Urn};
pub use store::{ClaimStore, InMemoryStore, Store, StoreError, TransactionalStore};
