//! Shared by the `#[idempotent]` pass cases: a runtime, envelopes, a handler
//! body that counts its runs and fails on request, and the contract every
//! annotated handler must keep (see `babel_idem::guide::modes`).
//!
//! Each pass case includes this file with `#[path]`, both when trybuild builds
//! it as a program and when `tests/idempotent.rs` runs it as a test.
#![allow(dead_code)]

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};

use babel_idem::{Envelope, Store, StoreError};
use babel_idem::store::{StoreFuture, StoreOperation};
use serde_json::json;

/// Runs `future` to completion on a fresh single-threaded runtime (with
/// timers: the SQLite store of the transactional case needs them).
pub fn block_on<F: Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime builds")
        .block_on(future)
}

/// A fresh id, so cases that share a static store never collide.
pub fn fresh_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// An envelope with `id` whose handler succeeds.
pub fn envelope(id: &str) -> Envelope {
    Envelope::new("urn:babel:orders:created", json!({ "fail": false })).with_id(id)
}

/// An envelope with `id` whose handler fails (see [`Runs::record`]).
pub fn failing_envelope(id: &str) -> Envelope {
    Envelope::new("urn:babel:orders:created", json!({ "fail": true })).with_id(id)
}

/// Requires a `Send` future, as a multi-threaded runtime's `spawn` does.
pub fn assert_send<F: Future + Send>(future: F) -> F {
    future
}

/// The error the pass-case handlers return: their own failure, or the
/// store's, which the guard hands back through `From<StoreError>`.
#[derive(Debug)]
pub enum HandlerError {
    Refused,
    Store(StoreError),
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HandlerError::Refused => f.write_str("the handler refused the message"),
            HandlerError::Store(error) => write!(f, "store: {error}"),
        }
    }
}

impl std::error::Error for HandlerError {}

impl From<StoreError> for HandlerError {
    fn from(error: StoreError) -> Self {
        HandlerError::Store(error)
    }
}

/// What a handler body did: how often it ran.
pub struct Runs(AtomicU32);

impl Runs {
    pub const fn new() -> Self {
        Runs(AtomicU32::new(0))
    }

    /// The body of a test handler: counts the run, then fails when the
    /// envelope's data says `"fail": true`.
    pub fn record(&self, env: &Envelope) -> Result<(), HandlerError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        if env.data["fail"] == json!(true) {
            return Err(HandlerError::Refused);
        }
        Ok(())
    }

    pub fn count(&self) -> u32 {
        self.0.load(Ordering::SeqCst)
    }
}

/// Delivers through `deliver` (a call of the annotated handler) the
/// sequences of the contract: an error leaves the id unmarked, a duplicate of
/// a processed id is skipped, a message without an id runs every time.
pub async fn check_contract<F, Fut, E>(runs: &Runs, mut deliver: F)
where
    F: FnMut(Envelope) -> Fut,
    Fut: Future<Output = Result<(), E>>,
    E: fmt::Debug,
{
    let id = fresh_id();
    let before = runs.count();

    let failed = deliver(failing_envelope(&id)).await;
    assert!(failed.is_err(), "a failing body's error reaches the caller");
    assert_eq!(runs.count(), before + 1);

    deliver(envelope(&id))
        .await
        .expect("the redelivery runs and succeeds");
    assert_eq!(runs.count(), before + 2, "an error left the id unmarked");

    deliver(envelope(&id)).await.expect("a duplicate is acked");
    assert_eq!(
        runs.count(),
        before + 2,
        "a duplicate of a processed id is skipped"
    );

    for _ in 0..2 {
        deliver(envelope(&id).without_id()).await.expect("runs");
    }
    assert_eq!(
        runs.count(),
        before + 4,
        "a message without an id fails open"
    );
}

/// A store that answers `seen` but cannot `remember`.
pub struct ForgetfulStore;

impl Store for ForgetfulStore {
    fn seen<'a>(&'a self, _id: &'a str) -> StoreFuture<'a, bool> {
        StoreFuture::ready(Ok(false))
    }
    fn remember<'a>(&'a self, _id: &'a str) -> StoreFuture<'a, ()> {
        StoreFuture::ready(Err(StoreError::new(
            StoreOperation::Remember,
            "forgetful",
            "disk full",
        )))
    }
    fn forget<'a>(&'a self, _id: &'a str) -> StoreFuture<'a, ()> {
        StoreFuture::ready(Ok(()))
    }
}
