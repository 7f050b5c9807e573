//! The dead-letter queue operations of [`RedisTransport`]
//! ([`DeadLetters`]): the list `<queue>.dlq` read and moved from (in the
//! Laravel-compatible layout `<prefix><queue>.dlq`).
//!
//! | operation | commands |
//! |---|---|
//! | depth | `LLEN <dlq>` (a missing key is an empty queue) |
//! | look | `LRANGE <dlq> i j`: reads, takes nothing |
//! | put back | nothing: a message looked at is never taken |
//! | republish | `redis/redrive.lua`: `LPOS` finds the record, `RPUSH` appends the redriven value to the target list, `LREM <dlq> 1 <record>` removes it, in one script |
//!
//! A record stored as a `__bq_frame` frame is read unframed (its headers
//! beside it). The redriven value is the bare body, or a frame holding only
//! `bq-replay-bypass` with a bypass: the Python SDK's `redrive` stores the
//! same. In the Laravel layout the redriven value is always the bare body
//! (the layout stores no headers, as the Python SDK's redrive there
//! publishes), appended to `<prefix><target>` with a wake-up token on its
//! `:notify` list, and the dead-letter list's own `:notify` gives one up. Since the record leaves the list in the same script that appends
//! the redriven value, a process killed at any point leaves each message in
//! exactly one of the two lists.

use crate::redis_client::Connection;
use crate::transport::binding::QueueNames;
use ::redis::{RedisError, Script};

use std::sync::Arc;

use super::frame;
use super::laravel::Laravel;
use super::{RedisTransport, broker};
use crate::broker::{
    BoxedRun, DeadLetterMessage, DeadLetterRun, DeadLetters, Outgoing, TransportError,
    TransportFuture,
};

/// A missing list is an empty queue: a run always opens.
impl DeadLetters for RedisTransport {
    type Handle = Vec<u8>;

    fn open_dead_letters<'a>(
        &'a self,
        dlq: &'a str,
    ) -> TransportFuture<'a, Option<BoxedRun<Vec<u8>>>> {
        Box::pin(async move {
            self.queue_names().check(dlq)?;
            let run: BoxedRun<Vec<u8>> = Box::new(RedisDlq {
                names: self.queue_names(),
                laravel: self.laravel.clone(),
                connection: self.connection.clone(),
                name: dlq.to_owned(),
                dlq: self.key(dlq),
                offset: 0,
                script: Script::new(concat!(
                    include_str!("keys.lua"),
                    include_str!("redrive.lua")
                )),
            });
            Ok(Some(run))
        })
    }
}

/// One run over a dead-letter list: `offset` is how many records before
/// the next one to look at are still in the list (looked at, not moved).
struct RedisDlq {
    /// The queue names the transport's layout can hold.
    names: &'static QueueNames,
    laravel: Option<Arc<Laravel>>,
    connection: Connection,
    /// The dead-letter queue's name.
    name: String,
    /// The list that holds it: the name, or in the Laravel layout its ready list.
    dlq: String,
    offset: usize,
    script: Script,
}

impl RedisDlq {
    async fn list_type(&mut self) -> Result<(), TransportError> {
        let kind: String = ::redis::cmd("TYPE")
            .arg(&self.dlq)
            .query_async(&mut self.connection)
            .await
            .map_err(broker)?;
        match kind.as_str() {
            "none" | "list" => Ok(()),
            other => Err(TransportError::Broker(
                format!(
                    "WRONGTYPE {} holds a {other}, not a list of dead-letter records",
                    self.dlq
                )
                .into(),
            )),
        }
    }
}

impl DeadLetterRun for RedisDlq {
    /// The record as stored in the list.
    type Handle = Vec<u8>;

    fn depth(&mut self) -> TransportFuture<'_, usize> {
        Box::pin(async move {
            self.list_type().await?;
            ::redis::cmd("LLEN")
                .arg(&self.dlq)
                .query_async(&mut self.connection)
                .await
                .map_err(broker)
        })
    }

    fn look(&mut self, max: usize) -> TransportFuture<'_, Vec<DeadLetterMessage<Vec<u8>>>> {
        Box::pin(async move {
            if max == 0 {
                return Ok(Vec::new());
            }
            let raws: Vec<Vec<u8>> = ::redis::cmd("LRANGE")
                .arg(&self.dlq)
                .arg(self.offset)
                .arg(self.offset + max - 1)
                .query_async(&mut self.connection)
                .await
                .map_err(broker)?;
            self.offset += raws.len();
            Ok(raws
                .into_iter()
                .map(|raw| {
                    let (body, headers) = frame::unframe(raw.clone());
                    DeadLetterMessage::new(body, headers, raw)
                })
                .collect())
        })
    }

    fn republish<'a>(
        &'a mut self,
        message: DeadLetterMessage<Vec<u8>>,
        copy: Outgoing<'a>,
    ) -> TransportFuture<'a, bool> {
        Box::pin(async move {
            let raw = message.handle;
            let mut invocation = self.script.prepare_invoke();
            invocation.key(&self.dlq);
            let value = match &self.laravel {
                Some(laravel) => {
                    invocation
                        .key(laravel.ready(copy.queue))
                        .key(laravel.notify(copy.queue))
                        .key(laravel.notify(&self.name));
                    copy.body.to_vec()
                }
                None => {
                    invocation.key(copy.queue);
                    // A body that cannot be framed (not UTF-8) goes bare.
                    frame::frame(copy.body, copy.headers).unwrap_or_else(|| copy.body.to_vec())
                }
            };
            let moved: Result<i64, RedisError> = invocation
                .arg(&raw)
                .arg(&value)
                .invoke_async(&mut self.connection)
                .await;
            let moved = moved.map_err(broker)? == 1;
            // It was before the cursor and is gone now, moved by this run
            // or taken by another tool: the list is one shorter there.
            self.offset = self.offset.saturating_sub(1);
            Ok(moved)
        })
    }

    fn put_back(&mut self, message: DeadLetterMessage<Vec<u8>>) {
        // Never taken: it is where it was.
        drop(message);
    }

    fn close(&mut self) -> TransportFuture<'_, ()> {
        Box::pin(async { Ok(()) })
    }

    fn check_queue(&self, queue: &str) -> Result<(), TransportError> {
        self.names.check(queue)
    }
}
