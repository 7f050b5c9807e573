//! Test doubles shared by the integration tests.
#![allow(dead_code, unreachable_pub)]

use std::io;
use std::sync::{Arc, Mutex};

use babel_idem::store::{StoreFuture, StoreOperation};
use babel_idem::{InMemoryStore, Store, StoreError};
use tracing_subscriber::fmt::MakeWriter;

#[cfg(feature = "kafka-transport")]
pub mod kafka;

/// A `tracing_subscriber::fmt` writer that keeps what is written, for a
/// test to read back with [`Captured::text`].
#[derive(Clone, Default)]
pub struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    /// Everything written so far.
    pub fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

impl io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Captured {
    type Writer = Captured;
    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

/// Which operation a [`FailingStore`] refuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    Seen,
    Remember,
}

/// A real in-memory seen-set whose `seen` or `remember` always fails, to
/// drive the guard's error rows. It stands in for a store whose server is
/// down; the backends' own outage tests use real servers.
pub struct FailingStore {
    inner: InMemoryStore,
    failure: Failure,
}

impl FailingStore {
    pub fn new(failure: Failure) -> Self {
        FailingStore {
            inner: InMemoryStore::new(),
            failure,
        }
    }
}

fn refused(operation: StoreOperation) -> StoreError {
    let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
    StoreError::new(operation, "test", io)
}

impl Store for FailingStore {
    fn seen<'a>(&'a self, id: &'a str) -> StoreFuture<'a, bool> {
        if self.failure == Failure::Seen {
            return StoreFuture::ready(Err(refused(StoreOperation::Seen)));
        }
        self.inner.seen(id)
    }

    fn remember<'a>(&'a self, id: &'a str) -> StoreFuture<'a, ()> {
        if self.failure == Failure::Remember {
            // Through the boxed path too, like a network backend.
            return StoreFuture::new(async { Err(refused(StoreOperation::Remember)) });
        }
        self.inner.remember(id)
    }

    fn forget<'a>(&'a self, id: &'a str) -> StoreFuture<'a, ()> {
        self.inner.forget(id)
    }
}

/// What a [`CountingStore`] was asked: calls, and ids sent in them.
#[derive(Default)]
pub struct StoreCalls {
    /// Single `seen` calls.
    pub seen: std::sync::atomic::AtomicU64,
    /// `seen_many` calls.
    pub seen_many: std::sync::atomic::AtomicU64,
    /// Ids sent in `seen` and `seen_many` together.
    pub seen_ids: std::sync::atomic::AtomicU64,
    /// Single `remember` calls.
    pub remember: std::sync::atomic::AtomicU64,
    /// `remember_many` calls.
    pub remember_many: std::sync::atomic::AtomicU64,
    /// Ids sent in `remember` and `remember_many` together.
    pub remember_ids: std::sync::atomic::AtomicU64,
}

impl StoreCalls {
    pub fn get(counter: &std::sync::atomic::AtomicU64) -> u64 {
        counter.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Calls made to answer `seen`: each a round trip to a server store.
    pub fn seen_calls(&self) -> u64 {
        Self::get(&self.seen) + Self::get(&self.seen_many)
    }

    /// Calls made to remember: each a round trip to a server store.
    pub fn remember_calls(&self) -> u64 {
        Self::get(&self.remember) + Self::get(&self.remember_many)
    }
}

/// A store that counts what it is asked and passes every call on to the
/// store inside, its batch target included (as itself, so that the calls
/// that meet reach it as one `seen_many`).
pub struct CountingStore<S> {
    pub inner: S,
    pub calls: Arc<StoreCalls>,
}

impl<S> CountingStore<S> {
    pub fn new(inner: S) -> Self {
        CountingStore {
            inner,
            calls: Arc::default(),
        }
    }
}

fn add(counter: &std::sync::atomic::AtomicU64, n: usize) {
    counter.fetch_add(n as u64, std::sync::atomic::Ordering::SeqCst);
}

impl<S: Store> Store for CountingStore<S> {
    fn seen<'a>(&'a self, id: &'a str) -> StoreFuture<'a, bool> {
        add(&self.calls.seen, 1);
        add(&self.calls.seen_ids, 1);
        self.inner.seen(id)
    }
    fn remember<'a>(&'a self, id: &'a str) -> StoreFuture<'a, ()> {
        add(&self.calls.remember, 1);
        add(&self.calls.remember_ids, 1);
        self.inner.remember(id)
    }
    fn forget<'a>(&'a self, id: &'a str) -> StoreFuture<'a, ()> {
        self.inner.forget(id)
    }
    fn seen_many<'a>(&'a self, ids: &'a [&'a str]) -> StoreFuture<'a, Vec<bool>> {
        add(&self.calls.seen_many, 1);
        add(&self.calls.seen_ids, ids.len());
        self.inner.seen_many(ids)
    }
    fn remember_many<'a>(&'a self, ids: &'a [&'a str]) -> StoreFuture<'a, ()> {
        add(&self.calls.remember_many, 1);
        add(&self.calls.remember_ids, ids.len());
        self.inner.remember_many(ids)
    }
    fn batch_target(&self) -> Option<babel_idem::store::BatchTarget> {
        self.inner.batch_target()?;
        babel_idem::store::BatchTarget::of(self)
    }
}

/// The retry `disposition` is, or a panic that says what it was.
pub fn expect_retry(disposition: babel_idem::Disposition) -> babel_idem::router::Retry {
    match disposition {
        babel_idem::Disposition::Retry(retry) => retry,
        other => panic!("expected a retry, got {other}"),
    }
}

/// The dead letter `disposition` is, or a panic that says what it was.
pub fn expect_dead_letter(
    disposition: babel_idem::Disposition,
) -> babel_idem::router::DeadLettered {
    match disposition {
        babel_idem::Disposition::DeadLetter(dead) => dead,
        other => panic!("expected a dead letter, got {other}"),
    }
}
