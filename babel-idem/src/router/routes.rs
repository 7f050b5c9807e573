//! [`Router`] and its builder: which handler serves which URN, and the
//! failure policies dispatch applies.

use std::collections::HashMap;
use std::fmt;
#[cfg(feature = "schema")]
use std::sync::Arc;
use std::time::Duration;

use super::handler::{Handler, HandlerFuture, TypedArgs};
use super::{Backoff, Delivery, UnknownUrnStrategy, Urn};
use crate::builders::setters;
use crate::envelope::Envelope;
use crate::message::Message;
#[cfg(feature = "schema")]
use crate::schema::SchemaProvider;

/// The default number of attempts a message gets before it is dead-lettered,
/// as in the other BabelQueue SDKs.
pub const DEFAULT_MAX_ATTEMPTS: u64 = 3;

/// Handlers by URN, and what to do when a delivery cannot be handled. Built
/// with [`Router::builder`] or [`routes!`](crate::routes); fed with
/// [`Router::dispatch`].
///
/// `Router` is `Send + Sync`: share one behind an `Arc` across consumer tasks.
///
/// ```
/// use babel_idem::{Delivery, Disposition, Envelope, Router, urn};
/// use serde_json::json;
///
/// async fn on_order_created(env: Envelope) -> Result<(), anyhow::Error> {
///     println!("order {}", env.data["order_id"]);
///     Ok(())
/// }
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let router = Router::builder()
///     .route(urn!("urn:babel:orders:created"), on_order_created)
///     .max_attempts(5)
///     .build()?;
///
/// let bytes = Envelope::new("urn:babel:orders:created", json!({"order_id": 1})).to_vec();
/// let disposition = router.dispatch(&bytes, Delivery::new()).await;
/// assert!(matches!(disposition, Disposition::Ack));
/// # Ok::<(), babel_idem::router::RouterError>(())
/// # }).unwrap();
/// ```
pub struct Router {
    pub(super) routes: HashMap<Urn, Route, foldhash::fast::RandomState>,
    pub(super) max_attempts: u64,
    pub(super) unknown_urn: UnknownUrnStrategy,
    pub(super) backoff: Backoff,
    pub(super) max_park_delay: Duration,
    /// The payload schemas dispatch checks `data` against, if any.
    #[cfg(feature = "schema")]
    pub(super) schemas: Option<Arc<dyn SchemaProvider>>,
}

/// How long a delivery parked behind another owner's claim waits at most
/// before it is tried again, unless [`RouterBuilder::max_park_delay`] says
/// otherwise.
pub const DEFAULT_MAX_PARK_DELAY: Duration = Duration::from_secs(5);

/// One registered handler with its argument shape erased.
pub(super) struct Route {
    handler: Box<dyn ErasedHandler>,
}

impl Route {
    pub(super) fn call(&self, envelope: Envelope, delivery: Delivery) -> HandlerFuture {
        self.handler.call(envelope, delivery)
    }
}

/// `Handler<Args>` without the `Args`, so handlers of both shapes fit in one
/// map.
trait ErasedHandler: Send + Sync + 'static {
    fn call(&self, envelope: Envelope, delivery: Delivery) -> HandlerFuture;
}

/// Pins the `Args` of a handler, so it can be erased.
struct Shaped<H, Args> {
    handler: H,
    shape: std::marker::PhantomData<fn(Args)>,
}

impl<H: Handler<Args>, Args: 'static> ErasedHandler for Shaped<H, Args> {
    fn call(&self, envelope: Envelope, delivery: Delivery) -> HandlerFuture {
        self.handler.call(envelope, delivery)
    }
}

impl Router {
    /// Starts a router: no routes, [`DEFAULT_MAX_ATTEMPTS`] attempts,
    /// [`UnknownUrnStrategy::Fail`], no backoff.
    pub fn builder() -> RouterBuilder {
        RouterBuilder {
            routes: Vec::new(),
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            unknown_urn: UnknownUrnStrategy::default(),
            backoff: Backoff::default(),
            max_park_delay: DEFAULT_MAX_PARK_DELAY,
            #[cfg(feature = "schema")]
            schemas: None,
        }
    }

    /// Whether a handler is registered for `urn`.
    ///
    /// ```
    /// use babel_idem::{Envelope, Router, urn};
    ///
    /// let router = Router::builder()
    ///     .route(urn!("urn:babel:orders:created"), |_: Envelope| async { Ok::<(), anyhow::Error>(()) })
    ///     .build()?;
    /// assert!(router.handles("urn:babel:orders:created"));
    /// assert!(!router.handles("urn:babel:orders:paid"));
    /// # Ok::<(), babel_idem::router::RouterError>(())
    /// ```
    pub fn handles(&self, urn: &str) -> bool {
        self.routes.contains_key(urn)
    }

    /// The registered URNs, in no particular order.
    pub fn urns(&self) -> impl Iterator<Item = &Urn> {
        self.routes.keys()
    }

    /// How many attempts a message gets before it is dead-lettered.
    pub fn max_attempts(&self) -> u64 {
        self.max_attempts
    }

    /// What happens to a message whose URN has no handler.
    pub fn unknown_urn_strategy(&self) -> UnknownUrnStrategy {
        self.unknown_urn
    }

    /// The delay a retry asks for.
    pub fn backoff(&self) -> Backoff {
        self.backoff
    }

    /// The longest a delivery parked behind another owner's claim waits
    /// before it is tried again.
    pub fn max_park_delay(&self) -> Duration {
        self.max_park_delay
    }

    /// The payload schemas dispatch checks each routed message's `data`
    /// against ([`RouterBuilder::schemas`]), if the router has any
    /// (feature `schema`).
    ///
    /// ```
    /// use babel_idem::Router;
    /// use babel_idem::schema::Schemas;
    ///
    /// let schemas = Schemas::from_json_map([("urn:babel:orders:created", r#"{"type": "object"}"#)])?;
    /// let router = Router::builder().schemas(schemas).build()?;
    /// let schemas = router.schemas().expect("the router checks payloads");
    /// assert!(schemas.schema_for("urn:babel:orders:created").is_some());
    /// assert!(Router::builder().build()?.schemas().is_none());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[cfg(feature = "schema")]
    pub fn schemas(&self) -> Option<&dyn SchemaProvider> {
        self.schemas.as_deref()
    }

    /// The longest delay a retry of this router asks for: the ceiling after
    /// the first or the last attempt that is retried (`max_attempts - 1`;
    /// every backoff's delays grow or shrink monotonically, so one of the
    /// two ends is the longest), `None` when no retry waits.
    #[cfg(feature = "consumer")]
    pub(crate) fn longest_backoff(&self) -> Option<std::time::Duration> {
        let last_retried = self.max_attempts.checked_sub(1).filter(|n| *n >= 1)?;
        let first = self.backoff.ceiling(1)?;
        Some(first.max(self.backoff.ceiling(last_retried)?))
    }
}

impl fmt::Debug for Router {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut urns: Vec<&str> = self.routes.keys().map(Urn::as_str).collect();
        urns.sort_unstable();
        let mut debug = f.debug_struct("Router");
        debug
            .field("urns", &urns)
            .field("max_attempts", &self.max_attempts)
            .field("unknown_urn", &self.unknown_urn)
            .field("backoff", &self.backoff)
            .field("max_park_delay", &self.max_park_delay);
        #[cfg(feature = "schema")]
        debug.field("schemas", &self.schemas.is_some());
        debug.finish()
    }
}

/// Collects routes and policies; [`build`](Self::build) checks them.
#[must_use = "call .build() to get a Router"]
pub struct RouterBuilder {
    routes: Vec<Registered>,
    max_attempts: u64,
    unknown_urn: UnknownUrnStrategy,
    backoff: Backoff,
    max_park_delay: Duration,
    #[cfg(feature = "schema")]
    schemas: Option<Arc<dyn SchemaProvider>>,
}

/// One route as registered, before [`RouterBuilder::build`] checks it.
struct Registered {
    urn: Urn,
    route: Route,
    /// A typed handler's message type: its URN and its name.
    message: Option<(Urn, &'static str)>,
}

impl RouterBuilder {
    /// Registers `handler` for `urn`. A second handler for the same URN makes
    /// [`build`](Self::build) fail with [`RouterError::DuplicateUrn`]; a
    /// typed handler whose message type carries another URN makes it fail
    /// with [`RouterError::UrnMismatch`].
    ///
    /// A handler annotated with `#[idempotent]` registers exactly like the
    /// plain function: the attribute keeps its signature.
    pub fn route<H, Args>(mut self, urn: Urn, handler: H) -> Self
    where
        H: Handler<Args>,
        Args: 'static,
    {
        let message = handler.message();
        let handler = Shaped {
            handler,
            shape: std::marker::PhantomData,
        };
        self.routes.push(Registered {
            urn,
            route: Route {
                handler: Box::new(handler),
            },
            message,
        });
        self
    }

    /// Registers a typed handler under the URN its message type carries
    /// ([`Message::URN`]). The handler gets the envelope's `data` decoded
    /// into its message type; `data` that does not decode fails the attempt
    /// with [`InvalidPayloadError`](crate::router::InvalidPayloadError),
    /// without running the handler.
    ///
    /// ```
    /// use babel_idem::{Delivery, Disposition, Envelope, Message, Router};
    /// use serde::{Deserialize, Serialize};
    /// use serde_json::json;
    ///
    /// #[derive(Serialize, Deserialize, Message)]
    /// #[message(urn = "urn:babel:orders:created")]
    /// struct OrderCreated {
    ///     order_id: u64,
    /// }
    ///
    /// async fn on_created(order: OrderCreated) -> Result<(), anyhow::Error> {
    ///     anyhow::ensure!(order.order_id > 0, "order 0 does not exist");
    ///     Ok(())
    /// }
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let router = Router::builder().handle(on_created).build()?;
    /// let bytes = Envelope::new("urn:babel:orders:created", json!({"order_id": 7})).to_vec();
    /// assert!(router.dispatch(&bytes, Delivery::new()).await.is_ack());
    /// # Ok::<(), babel_idem::router::RouterError>(())
    /// # }).unwrap();
    /// ```
    ///
    /// A handler that takes the [`Envelope`] has no message type to read a
    /// URN from: register it with [`route`](Self::route).
    ///
    /// ```compile_fail
    /// use babel_idem::{Envelope, Router};
    ///
    /// async fn on_created(_: Envelope) -> Result<(), anyhow::Error> { Ok(()) }
    ///
    /// let router = Router::builder().handle(on_created); // error: needs a message type
    /// ```
    pub fn handle<H, Args>(self, handler: H) -> Self
    where
        H: Handler<Args>,
        Args: TypedArgs,
    {
        self.route(<Args::Message as Message>::URN, handler)
    }

    /// Checks each routed message's `data` against the payload schema
    /// `provider` has for its URN, before its handler runs (and before a
    /// typed handler's message is decoded); a URN `provider` has no schema
    /// for is not checked. Feature `schema`.
    ///
    /// `data` is read in its document order, as the Python SDK's
    /// `babelqueue.schema.wrap` reads it, so the first violation reported is
    /// the one the Python SDK reports. Data that breaks its schema fails the
    /// attempt with an [`InvalidPayloadError`](crate::router::InvalidPayloadError)
    /// and the handler does not run: the message is retried and, once its
    /// attempts run out, dead-lettered with reason `failed`, `exception`
    /// `InvalidPayloadError` and `error` `data for '<urn>' does not match
    /// its URN schema: <path>: <rule>`, the block the Python SDK writes for
    /// the same message. The consumer span records the violation, and the
    /// feature `metrics` counts the attempt (`INVALID_PAYLOADS_TOTAL` in
    /// [`telemetry::metrics`](crate::telemetry::metrics)).
    ///
    /// A router without schemas reads no `data` text. Calling this again
    /// replaces the provider.
    ///
    /// ```
    /// use babel_idem::{Delivery, Disposition, Envelope, Message, Router};
    /// use babel_idem::schema::Schemas;
    /// use serde::{Deserialize, Serialize};
    /// use serde_json::json;
    ///
    /// #[derive(Serialize, Deserialize, Message)]
    /// #[message(urn = "urn:babel:orders:created")]
    /// struct OrderCreated {
    ///     order_id: u64,
    /// }
    ///
    /// async fn on_created(_: OrderCreated) -> Result<(), anyhow::Error> {
    ///     Ok(())
    /// }
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// // In production, `babel_idem::schema::Registry::open("schemas/registry.json")?`.
    /// let schemas = Schemas::from_json_map([(
    ///     "urn:babel:orders:created",
    ///     r#"{"type": "object", "required": ["order_id"],
    ///         "properties": {"order_id": {"type": "integer", "minimum": 1}}}"#,
    /// )])?;
    /// let router = Router::builder().handle(on_created).max_attempts(1).schemas(schemas).build()?;
    ///
    /// let valid = Envelope::new("urn:babel:orders:created", json!({"order_id": 7})).to_vec();
    /// assert!(router.dispatch(&valid, Delivery::new()).await.is_ack());
    ///
    /// let invalid = Envelope::new("urn:babel:orders:created", json!({"order_id": 0})).to_vec();
    /// let Disposition::DeadLetter(dead) = router.dispatch(&invalid, Delivery::new()).await else {
    ///     panic!("expected a dead letter");
    /// };
    /// let block = dead.envelope.unwrap().dead_letter.unwrap();
    /// assert_eq!(block.exception.as_deref(), Some("InvalidPayloadError"));
    /// assert_eq!(
    ///     block.error.as_deref(),
    ///     Some("data for 'urn:babel:orders:created' does not match its URN schema: order_id: below_minimum"),
    /// );
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    #[cfg(feature = "schema")]
    pub fn schemas(mut self, provider: impl SchemaProvider) -> Self {
        self.schemas = Some(Arc::new(provider));
        self
    }

    setters! {
        /// How many attempts a message gets: after the `max_attempts`-th failed
        /// delivery it is dead-lettered with reason `failed`. Default 3; 0 makes
        /// [`build`](Self::build) fail with [`RouterError::ZeroMaxAttempts`].
        pub fn max_attempts(max_attempts: u64) => self.max_attempts;

        /// What happens to a message whose URN has no handler. Default
        /// [`UnknownUrnStrategy::Fail`].
        pub fn on_unknown_urn(strategy: UnknownUrnStrategy) => self.unknown_urn;

        /// The delay a [`Retry`](crate::router::Retry) asks for. Default none.
        pub fn backoff(backoff: Backoff) => self.backoff;

        /// The longest a delivery parked behind another owner's claim waits
        /// before it is tried again. Default [`DEFAULT_MAX_PARK_DELAY`] (5 s).
        ///
        /// A parked delivery is released with the other owner's lease time left
        /// as its delay, but never longer than this: a foreign claim (the PHP
        /// SDK's layout, `RedisStoreBuilder::php_claims` with the feature `redis`,
        /// writes its claim with a TTL that may be an hour) can turn done long
        /// before it expires, and the delivery then comes back within this
        /// bound to find it done. `Duration::ZERO` releases a parked delivery
        /// with no delay at all.
        ///
        /// ```
        /// use babel_idem::Router;
        /// use std::time::Duration;
        ///
        /// let router = Router::builder().max_park_delay(Duration::from_secs(2)).build()?;
        /// assert_eq!(router.max_park_delay(), Duration::from_secs(2));
        /// # Ok::<(), babel_idem::router::RouterError>(())
        /// ```
        pub fn max_park_delay(max: Duration) => self.max_park_delay;
    }

    /// Checks the routes and policies and returns the router.
    ///
    /// ```
    /// use babel_idem::{Envelope, Router, urn};
    /// use babel_idem::router::RouterError;
    ///
    /// async fn first(_: Envelope) -> Result<(), anyhow::Error> { Ok(()) }
    /// async fn second(_: Envelope) -> Result<(), anyhow::Error> { Ok(()) }
    ///
    /// let err = Router::builder()
    ///     .route(urn!("urn:babel:orders:created"), first)
    ///     .route(urn!("urn:babel:orders:created"), second)
    ///     .build()
    ///     .unwrap_err();
    /// assert!(matches!(&err, RouterError::DuplicateUrn { urn } if urn == "urn:babel:orders:created"));
    /// assert_eq!(err.to_string(), "urn:babel:orders:created is routed to more than one handler");
    /// ```
    ///
    /// A typed handler under the URN of another message type:
    ///
    /// ```
    /// use babel_idem::{Message, Router, urn};
    /// use babel_idem::router::RouterError;
    /// use serde::{Deserialize, Serialize};
    ///
    /// #[derive(Serialize, Deserialize, Message)]
    /// #[message(urn = "urn:babel:orders:created")]
    /// struct OrderCreated {}
    ///
    /// async fn on_created(_: OrderCreated) -> Result<(), anyhow::Error> { Ok(()) }
    ///
    /// let err = Router::builder()
    ///     .route(urn!("urn:babel:orders:paid"), on_created)
    ///     .build()
    ///     .unwrap_err();
    /// assert!(matches!(&err, RouterError::UrnMismatch { urn, message_urn, .. }
    ///     if urn == "urn:babel:orders:paid" && message_urn == "urn:babel:orders:created"));
    /// ```
    pub fn build(self) -> Result<Router, RouterError> {
        if self.max_attempts == 0 {
            return Err(RouterError::ZeroMaxAttempts);
        }
        if let Some(multiplier) = self.backoff.invalid_multiplier() {
            return Err(RouterError::BackoffMultiplier {
                multiplier: multiplier.to_string(),
            });
        }
        let mut routes = HashMap::with_capacity_and_hasher(self.routes.len(), Default::default());
        for Registered {
            urn,
            route,
            message,
        } in self.routes
        {
            if let Some((message_urn, type_name)) = message
                && message_urn != urn
            {
                return Err(RouterError::UrnMismatch {
                    urn,
                    message_urn,
                    type_name,
                });
            }
            if routes.contains_key(&urn) {
                return Err(RouterError::DuplicateUrn { urn });
            }
            routes.insert(urn, route);
        }
        Ok(Router {
            routes,
            max_attempts: self.max_attempts,
            unknown_urn: self.unknown_urn,
            backoff: self.backoff,
            max_park_delay: self.max_park_delay,
            #[cfg(feature = "schema")]
            schemas: self.schemas,
        })
    }
}

impl fmt::Debug for RouterBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut debug = f.debug_struct("RouterBuilder");
        debug
            .field(
                "urns",
                &self
                    .routes
                    .iter()
                    .map(|registered| &registered.urn)
                    .collect::<Vec<_>>(),
            )
            .field("max_attempts", &self.max_attempts)
            .field("unknown_urn", &self.unknown_urn)
            .field("backoff", &self.backoff)
            .field("max_park_delay", &self.max_park_delay);
        #[cfg(feature = "schema")]
        debug.field("schemas", &self.schemas.is_some());
        debug.finish()
    }
}

/// Why a router could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RouterError {
    /// Two handlers were registered for one URN.
    #[error("{urn} is routed to more than one handler")]
    DuplicateUrn {
        /// The URN registered twice.
        urn: Urn,
    },
    /// A typed handler was registered under a URN other than the one its
    /// message type carries: dispatch would decode another message's `data`
    /// into it.
    #[error(
        "the handler registered for {urn} takes `{type_name}`, whose URN is {message_urn}: \
         register it with `.handle(handler)`, which reads the URN from its message type"
    )]
    UrnMismatch {
        /// The URN the handler was registered under.
        urn: Urn,
        /// The URN its message type carries ([`Message::URN`]).
        message_urn: Urn,
        /// The message type's name, as [`std::any::type_name`] gives it.
        type_name: &'static str,
    },
    /// `max_attempts(0)`: a message needs at least one attempt.
    #[error("max_attempts must be at least 1: a message needs one attempt")]
    ZeroMaxAttempts,
    /// A [`Backoff::Geometric`] whose multiplier is negative or not a
    /// finite number: it names no delay.
    #[error("the backoff multiplier must be a finite number of at least 0, got {multiplier}")]
    BackoffMultiplier {
        /// The multiplier given, as text.
        multiplier: String,
    },
}

#[cfg(all(test, feature = "consumer"))]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_longest_backoff_is_the_last_retried_attempts() {
        let secs = Duration::from_secs;
        let longest = |backoff: Backoff, max_attempts: u64| {
            Router::builder()
                .backoff(backoff)
                .max_attempts(max_attempts)
                .build()
                .unwrap()
                .longest_backoff()
        };
        let exponential = Backoff::exponential(secs(1), secs(600));
        // Attempts 1..=4 are retried after 1, 2, 4 and 8 s; the fifth fails for good.
        assert_eq!(longest(exponential, 5), Some(secs(8)));
        assert_eq!(longest(exponential, 2), Some(secs(1)));
        assert_eq!(longest(exponential, 100), Some(secs(600)));
        assert_eq!(longest(Backoff::fixed(secs(7)), 3), Some(secs(7)));
        // One attempt: nothing is retried, so nothing waits.
        assert_eq!(longest(Backoff::fixed(secs(7)), 1), None);
        assert_eq!(longest(Backoff::None, 5), None);
        // The family's form: a shrinking multiplier waits longest first;
        // jitter never waits longer than the ceiling.
        let shrinking = Backoff::geometric(secs(8)).with_multiplier(0.5);
        assert_eq!(longest(shrinking, 5), Some(secs(8)));
        let jittered = Backoff::geometric(secs(1))
            .with_multiplier(3.0)
            .with_full_jitter();
        assert_eq!(longest(jittered, 4), Some(secs(9)));
    }
}
