//! Test doubles shared by the integration tests.
#![allow(dead_code)]

use std::io;
use std::sync::{Arc, Mutex};

use babel_idem::store::{StoreFuture, StoreOperation};
use babel_idem::{InMemoryStore, Store, StoreError};
use tracing_subscriber::fmt::MakeWriter;

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
