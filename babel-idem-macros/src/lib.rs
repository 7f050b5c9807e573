//! The macros of `babel-idem`: the `#[idempotent]` attribute, the `urn!`
//! and `routes!` registration macros and `#[derive(Message)]`. Use them
//! through `babel_idem`; this crate only parses, checks and rewrites.
//!
//! - `attr` parses the attribute's arguments,
//! - `message` picks the parameter that carries the message id,
//! - `expand` checks the function and writes it back around a guard,
//! - `urn` and `routes` check URN literals with the validator `Urn::parse`
//!   also runs (`babel_idem_urn`), so a malformed literal fails `cargo check`;
//!   `routes` also writes the compile-time checks that no two rows share a
//!   URN,
//! - `derive_message` writes a type's `babel_idem::Message` impl, its URN
//!   literal checked the same way.

mod attr;
mod derive_message;
mod expand;
mod message;
mod routes;
mod transaction;
mod urn;

use proc_macro::TokenStream;

/// Makes an `async fn` message handler idempotent: a redelivered message
/// whose id the store has seen is acked without running the body again.
///
/// ```
/// use babel_idem::{idempotent, Envelope, InMemoryStore, StoreError};
/// use serde_json::json;
/// use std::sync::LazyLock;
/// use std::sync::atomic::{AtomicU32, Ordering};
///
/// static STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);
/// static CHARGES: AtomicU32 = AtomicU32::new(0);
///
/// /// Charges the order once, however often it is delivered.
/// #[idempotent(store = STORE)]
/// async fn on_order_created(env: Envelope) -> Result<(), StoreError> {
///     CHARGES.fetch_add(1, Ordering::Relaxed);
///     Ok(())
/// }
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let env = Envelope::new("urn:babel:orders:created", json!({"order_id": 1042}));
/// on_order_created(env.clone()).await?; // runs
/// on_order_created(env).await?;         // a redelivery: skipped
/// assert_eq!(CHARGES.load(Ordering::Relaxed), 1);
/// # Ok::<(), StoreError>(())
/// # }).unwrap();
/// ```
///
/// The rewritten function keeps its name, visibility, attributes and docs,
/// generics, lifetimes, `where` clause, receiver, parameter patterns and
/// return type, so it can be passed wherever the plain function could.
///
/// # Arguments
///
/// | argument | value | default |
/// |---|---|---|
/// | `store = EXPR` | any expression whose value is a `Store` or dereferences to one in at most two steps: a `static` (also inside a `LazyLock`), `self.store`, `ctx.store()`, an `Arc<dyn Store>`, an `Arc<LazyLock<S>>`. Evaluated on each call. | required |
/// | `message = NAME` | the parameter (or `self`) whose type implements `MessageId` | the one parameter typed `Envelope` / `&Envelope`; without one, the one typed `Delivery` / `&Delivery` (a typed handler's, whose `meta.id` dispatch fills in) |
/// | `scope = "name"` | a prefix for every key, so services sharing a store keep apart | no scope |
/// | `on_remember_failure = POLICY` | `AckAndReport` or `ReturnError`: what to return when the body succeeded but its id could not be remembered (`babel_idem::OnRememberFailure`) | `AckAndReport` |
/// | `transaction = NAME` | transactional mode (`babel_idem::Guard::transactional`): the parameter, of type `&mut sqlx::PgConnection`, `&mut sqlx::SqliteConnection` or `&mut sqlx::Transaction<'_, _>`, on which the id is marked before the body runs, so the mark commits or rolls back with the handler's writes. The store must be a `PostgresStore` / `SqliteStore` (`babel_idem::store::TransactionalStore`); the caller begins and commits the transaction. Not with `lease`. | seen-set mode |
///
/// ```
/// use babel_idem::{idempotent, MessageId, Store};
/// use std::sync::Arc;
///
/// struct Payment {
///     key: String,
/// }
///
/// impl MessageId for Payment {
///     fn message_id(&self) -> Option<&str> {
///         Some(&self.key)
///     }
/// }
///
/// struct Billing {
///     store: Arc<dyn Store>,
/// }
///
/// impl Billing {
///     #[idempotent(
///         store = self.store,
///         message = payment,
///         scope = "billing",
///         on_remember_failure = ReturnError,
///     )]
///     async fn charge(&self, payment: Payment, attempt: u32) -> anyhow::Result<()> {
///         anyhow::ensure!(attempt < 10, "payment {} keeps failing", payment.key);
///         Ok(())
///     }
/// }
/// # let billing = Billing { store: Arc::new(babel_idem::InMemoryStore::new()) };
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// # billing.charge(Payment { key: "p-1".into() }, 1).await.unwrap();
/// # assert!(billing.store.seen("7:billing:p-1").await.unwrap());
/// # });
/// ```
///
/// On a typed handler, the id is the envelope's `meta.id`, which dispatch
/// moves into the `Delivery` parameter; the macro picks that parameter
/// when no parameter is an `Envelope`:
///
/// ```
/// use babel_idem::{idempotent, Delivery, Envelope, InMemoryStore, Message, Router, StoreError};
/// use serde::{Deserialize, Serialize};
/// use std::sync::LazyLock;
/// use std::sync::atomic::{AtomicU32, Ordering};
///
/// static STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);
/// static CHARGES: AtomicU32 = AtomicU32::new(0);
///
/// #[derive(Serialize, Deserialize, Message)]
/// #[message(urn = "urn:babel:orders:created")]
/// struct OrderCreated {
///     order_id: u64,
/// }
///
/// // Deduped on `delivery`'s `meta.id`.
/// #[idempotent(store = STORE)]
/// async fn on_created(order: OrderCreated, delivery: Delivery) -> Result<(), StoreError> {
///     CHARGES.fetch_add(1, Ordering::Relaxed);
///     Ok(())
/// }
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let router = Router::builder().handle(on_created).build().unwrap();
/// let bytes = Envelope::new("urn:babel:orders:created", serde_json::json!({"order_id": 7})).to_vec();
/// assert!(router.dispatch(&bytes, Delivery::new()).await.is_ack());
/// assert!(router.dispatch(&bytes, Delivery::new()).await.is_ack()); // a redelivery: skipped
/// assert_eq!(CHARGES.load(Ordering::Relaxed), 1);
/// # });
/// ```
///
/// # What it expands to
///
/// For `#[idempotent(store = STORE, scope = "billing")]` on
/// `pub async fn on_order(env: Envelope) -> Result<(), BillingError> { BODY }`:
///
/// ```text
/// pub async fn on_order(env: Envelope) -> Result<(), BillingError> {
///     // The store, found by auto-deref (a `LazyLock` static, an `Arc`...).
///     let __babel_idem_store = &(STORE);
///     let __babel_idem_store = {
///         let (__babel_idem_store, __babel_idem_checked) = {
///             use ::babel_idem::__private::ResolveStore as _;
///             (&&&::babel_idem::__private::StoreRef(__babel_idem_store)).resolve()
///         };
///         // Never runs: a `store` that is not a `Store` fails here, once.
///         let _ = || ::babel_idem::__private::Guard::new(__babel_idem_checked);
///         __babel_idem_store
///     };
///     let __babel_idem_guard = ::babel_idem::__private::Guard::new(__babel_idem_store).scope("billing");
///     // Never runs: a return type that is not `Result<(), E: From<StoreError>>` fails here, once.
///     let _ = |error: ::babel_idem::__private::StoreError| -> Result<(), BillingError> {
///         ::core::result::Result::<(), _>::Err(::core::convert::Into::into(error))
///     };
///     let __babel_idem_key = __babel_idem_guard.key(&env);
///     {
///         use ::babel_idem::__private::RunGuarded as _;
///         (&&::babel_idem::__private::Outcome::<Result<(), BillingError>>::OF)
///             .run(&__babel_idem_guard, __babel_idem_key, async move { BODY })
///     }
///     .await
/// }
/// ```
///
/// - The store expression is evaluated, and the key copied out of the
///   message, **before** the body takes ownership of the parameters: the body
///   may move or mutate the message. The guard keeps a borrow of the store
///   expression's value while the body runs, so when that value borrows
///   something the body takes (`&mut self`, `self: Arc<Self>`, an owned
///   `ctx: Context` parameter), clone an `Arc` out instead:
///   `store = self.store.clone()`, `store = ctx.store().clone()`. Through
///   `&self` or `&ctx`, `store = self.store` and `store = ctx.store()` work.
/// - The body is quoted once, inside one `async move` block: `return` and `?`
///   leave the body, never the guard, so a failure can never skip the
///   decision of whether to remember the id. No inner `fn`, no hidden static.
/// - The returned future is `Send` whenever the body's future and the store
///   reference are.
/// - Each mistake the type checker finds is one error about a public item:
///   the two checks run at compile time only, and whatever they reject, the
///   guard is still given a `Store` and the body a `Result<(), E>`, so nothing
///   else fails with them.
/// - The decision itself (skip a seen id, run and remember on `Ok`, leave the
///   id unmarked on `Err`, run without remembering when there is no id) is
///   `babel_idem::Guard`'s; the macro adds no logic of its own.
///
/// # Compile errors
///
/// Each one points at the token to fix:
///
/// | mistake | reported at |
/// |---|---|
/// | a `fn` that is not `async` | the `fn` keyword |
/// | no `store = ...` | the attribute |
/// | an unknown or repeated argument, a missing `=`, a value of the wrong kind, an empty `scope`, an unknown policy | that argument |
/// | no `Envelope` or `Delivery` parameter, or several, without `message = ...` | the parameter list / the second one |
/// | an envelope parameter bound by a destructuring pattern | that pattern |
/// | `message = x` naming no parameter | `x` |
/// | a message type without `MessageId` | the message parameter |
/// | no return type, a non-path return type, `Result<T, E>` with `T` other than `()` | the return type |
/// | a return type that is not `Result<(), E>` (seen through aliases) | the return type: mismatched types, expected the declared type, found `Result<(), _>` |
/// | an `E` without `From<StoreError>` | the return type: `E: From<StoreError>` is not satisfied |
/// | a `store` value that is not a `Store` | the store expression, with the `Store` trait's own message |
/// | `transaction = x` naming no parameter | `x` |
/// | a transaction parameter that is not `&mut T` | its type |
/// | a transaction parameter that is no connection of the store's database | its type, with `AsConnection`'s message |
/// | `transaction` with a store that is not SQL | the store expression, with `TransactionalStore`'s message |
/// | `transaction` together with `lease` | `transaction` |
///
/// ```compile_fail
/// use babel_idem::{idempotent, Envelope, InMemoryStore, StoreError};
/// static STORE: std::sync::LazyLock<InMemoryStore> = std::sync::LazyLock::new(InMemoryStore::new);
///
/// #[idempotent(store = STORE)]
/// fn not_async(env: Envelope) -> Result<(), StoreError> { // error: works on an `async fn` only
///     Ok(())
/// }
/// ```
///
/// In transactional mode the body runs in a closure that gets the
/// connection parameter back under its own name:
///
/// ```
/// use babel_idem::{idempotent, Envelope};
/// use babel_idem::store::SqliteStore;
/// use sqlx::SqliteConnection;
///
/// struct Ledger {
///     store: SqliteStore,
/// }
///
/// impl Ledger {
///     #[idempotent(store = self.store, transaction = tx)]
///     async fn on_credited(&self, env: Envelope, tx: &mut SqliteConnection) -> anyhow::Result<()> {
///         sqlx::query("UPDATE accounts SET balance = balance + ?1")
///             .bind(env.data["amount"].as_i64())
///             .execute(&mut *tx)
///             .await?;
///         Ok(())
///     }
/// }
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let ledger = Ledger { store: SqliteStore::in_memory().await? };
/// sqlx::query("CREATE TABLE accounts (balance INTEGER)").execute(ledger.store.pool()).await?;
/// sqlx::query("INSERT INTO accounts VALUES (0)").execute(ledger.store.pool()).await?;
/// let env = Envelope::new("urn:babel:ledger:credited", serde_json::json!({"amount": 5}));
/// for _delivery in 0..3 {
///     let mut tx = ledger.store.pool().begin().await?;
///     ledger.on_credited(env.clone(), &mut tx).await?; // on `Err`: dropped, rolled back
///     tx.commit().await?; // the credit and the mark, together; then ack
/// }
/// let balance: i64 = sqlx::query_scalar("SELECT balance FROM accounts")
///     .fetch_one(ledger.store.pool())
///     .await?;
/// assert_eq!(balance, 5);
/// # Ok::<(), anyhow::Error>(())
/// # }).unwrap();
/// ```
///
/// A parse error still emits the original function next to the error, so
/// the rest of the crate keeps compiling and an editor keeps its view of it.
#[proc_macro_attribute]
pub fn idempotent(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::idempotent(args.into(), item.into()).into()
}

/// A `Urn` from a string literal, checked against RFC 8141 while the macro
/// expands: a malformed literal fails `cargo check` with an error on the
/// literal that says which rule it breaks and where. Costs no allocation.
///
/// ```
/// let created = babel_idem::urn!("urn:babel:orders:created");
/// assert_eq!(created.nss(), "orders:created");
/// ```
///
/// ```compile_fail
/// // error: malformed URN: the namespace-specific string (NSS) holds a character
/// //        that must be percent-encoded (...): found ' ' at byte 16
/// let created = babel_idem::urn!("urn:babel:orders created");
/// ```
///
/// For a URN known only at run time, use `Urn::parse`, which runs the same
/// check and returns the same `UrnError`.
#[proc_macro]
pub fn urn(input: TokenStream) -> TokenStream {
    urn::urn(input.into()).into()
}

/// Builds a `RouterBuilder` from a table of `"urn literal" => handler` and
/// `MessageType => handler` rows, checked at compile time: every URN
/// literal is validated like [`urn!`](macro@urn), and the same URN in two
/// rows is an error on the second one, whether the rows name it by a
/// literal or by a message type (whose `Message::URN` is compared in a
/// constant, so `cargo check` reports it).
///
/// ```
/// use babel_idem::{Envelope, routes};
///
/// async fn on_created(_: Envelope) -> Result<(), anyhow::Error> { Ok(()) }
/// async fn on_paid(_: Envelope) -> Result<(), anyhow::Error> { Ok(()) }
///
/// let router = routes! {
///     "urn:babel:orders:created" => on_created,
///     "urn:babel:orders:paid" => on_paid,
/// }
/// .max_attempts(5)
/// .build()?;
/// assert!(router.handles("urn:babel:orders:paid"));
/// # Ok::<(), babel_idem::router::RouterError>(())
/// ```
///
/// ```compile_fail
/// # use babel_idem::{Envelope, routes};
/// # async fn on_created(_: Envelope) -> Result<(), anyhow::Error> { Ok(()) }
/// let router = routes! {
///     "urn:babel:orders:created" => on_created,
///     "urn:babel:orders:created" => on_created, // error: appears twice
/// };
/// ```
///
/// A type row routes the URN its message type carries; its handler is
/// usually a typed handler of that type (one of another type makes `build`
/// fail with `RouterError::UrnMismatch`):
///
/// ```
/// use babel_idem::{Envelope, Message, routes};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize, Message)]
/// #[message(urn = "urn:babel:orders:created")]
/// struct OrderCreated {
///     order_id: u64,
/// }
///
/// async fn on_created(order: OrderCreated) -> Result<(), anyhow::Error> { Ok(()) }
/// async fn on_paid(_: Envelope) -> Result<(), anyhow::Error> { Ok(()) }
///
/// let router = routes! {
///     OrderCreated => on_created,
///     "urn:babel:orders:paid" => on_paid,
/// }
/// .build()?;
/// assert!(router.handles("urn:babel:orders:created"));
/// # Ok::<(), babel_idem::router::RouterError>(())
/// ```
///
/// ```compile_fail
/// # use babel_idem::{Envelope, Message, routes};
/// # use serde::{Deserialize, Serialize};
/// # #[derive(Serialize, Deserialize, Message)]
/// # #[message(urn = "urn:babel:orders:created")]
/// # struct OrderCreated {}
/// # async fn on_created(_: OrderCreated) -> Result<(), anyhow::Error> { Ok(()) }
/// # async fn on_envelope(_: Envelope) -> Result<(), anyhow::Error> { Ok(()) }
/// let router = routes! {
///     OrderCreated => on_created,
///     "urn:babel:orders:created" => on_envelope, // error: `OrderCreated` routes it already
/// };
/// ```
///
/// A type row names a concrete type: the checks are constants of their
/// own, which cannot see an enclosing function's generic parameters.
#[proc_macro]
pub fn routes(input: TokenStream) -> TokenStream {
    routes::routes(input.into()).into()
}

/// Implements `babel_idem::Message` for a type: the URN it is routed by,
/// from `#[message(urn = "...")]`, checked against RFC 8141 while the macro
/// expands, like [`urn!`](macro@urn). The type also derives (or implements)
/// `serde::Serialize` and `serde::Deserialize`, the trait's supertraits.
///
/// ```
/// use babel_idem::Message;
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Debug, Serialize, Deserialize, Message)]
/// #[message(urn = "urn:babel:orders:created")]
/// struct OrderCreated {
///     order_id: u64,
///     customer: String,
/// }
///
/// assert_eq!(OrderCreated::URN.as_str(), "urn:babel:orders:created");
/// ```
///
/// Each mistake is an error on its token: no `#[message(urn = ...)]` on
/// the type's name (saying what to add), a malformed URN on the literal
/// (saying which rule it breaks), an unknown argument on its name. Generic
/// parameters are refused: a URN names one payload shape, so implement the
/// trait by hand for each instantiation that is a message.
///
/// ```compile_fail
/// use babel_idem::Message;
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize, Message)]
/// #[message(urn = "urn:babel:orders created")] // error: the NSS holds ' ' at byte 16
/// struct OrderCreated {}
/// ```
#[proc_macro_derive(Message, attributes(message))]
pub fn derive_message(input: TokenStream) -> TokenStream {
    derive_message::derive(input.into()).into()
}
