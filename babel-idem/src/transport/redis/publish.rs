//! Publishing on the Redis binding: its [`Publisher`] operations, a body
//! with headers and a batch in one pipelined round trip.

use ::redis::{ErrorKind, RedisError, RedisResult, ServerErrorKind, Value};

use super::{RedisTransport, broker, frame};
use crate::broker::Transport;
use crate::broker::outgoing::publish_checked;
use crate::broker::{BatchOutcome, Outgoing, Publisher, TransportError, TransportFuture};

impl RedisTransport {
    /// Publishes every message of `messages` with one pipelined round trip
    /// (an `RPUSH` each, framed when it has headers; in the Laravel layout
    /// its push script each, headers dropped); see [`BatchOutcome`]
    /// for what the answer says. A queue name the layout cannot hold fails
    /// that message only, before anything is sent.
    ///
    /// ```no_run
    /// use babel_idem::transport::{Outgoing, RedisTransport};
    ///
    /// # async fn run() -> Result<(), babel_idem::transport::TransportError> {
    /// let transport = RedisTransport::connect("redis://127.0.0.1:6379/0").await?;
    /// let outcome = transport
    ///     .publish_batch(&[Outgoing::new("orders", b"{}"), Outgoing::new("bad queue", b"{}")])
    ///     .await?;
    /// assert!(outcome[0].is_ok() && outcome[1].is_err());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn publish_batch(
        &self,
        messages: &[Outgoing<'_>],
    ) -> Result<BatchOutcome, TransportError> {
        let check = |queue: &str| Transport::check_queue(self, queue);
        publish_checked(messages, check, |sendable| async move {
            let mut pipeline = ::redis::pipe();
            pipeline.ignore_errors();
            for message in &sendable {
                if let Some(laravel) = &self.laravel {
                    pipeline.add_command(laravel.push_command(message.queue, message.body));
                    continue;
                }
                let framed = frame::frame(message.body, message.headers);
                pipeline
                    .cmd("RPUSH")
                    .arg(message.queue)
                    .arg(framed.as_deref().unwrap_or(message.body));
            }
            let mut connection = self.connection.clone();
            let replies: Vec<RedisResult<Value>> = pipeline
                .query_async(&mut connection)
                .await
                .map_err(broker)?;
            // A server that is loading, busy, read-only or down answers
            // every command so: that is the broker's state, not a message's
            // fault, and the whole batch fails with it.
            if let Some(Err(error)) = replies
                .iter()
                .find(|reply| reply.as_ref().is_err_and(is_server_state))
            {
                return Err(broker(error.clone()));
            }
            let mut replies = replies.into_iter();
            Ok(sendable
                .iter()
                .map(|_| match replies.next() {
                    Some(Ok(_)) => Ok(()),
                    Some(Err(error)) => Err(broker(error)),
                    None => Err(TransportError::Broker(
                        "the pipeline's reply was cut short".into(),
                    )),
                })
                .collect())
        })
        .await
    }
}

/// Whether `error` is the server's state (loading its data set, busy
/// running a script or function, read-only, its cluster, primary or
/// replicas down, out of memory, unable to persist) rather than a refusal
/// of the one command: the whole batch failed, and no message is to blame.
fn is_server_state(error: &RedisError) -> bool {
    matches!(
        error.kind(),
        ErrorKind::Server(
            ServerErrorKind::BusyLoading
                | ServerErrorKind::ReadOnly
                | ServerErrorKind::TryAgain
                | ServerErrorKind::ClusterDown
                | ServerErrorKind::MasterDown
        ) | ErrorKind::Io
    ) || error
        .code()
        .is_some_and(|code| matches!(code, "BUSY" | "NOREPLICAS" | "OOM" | "MISCONF"))
}

impl Publisher for RedisTransport {
    fn check_queue(&self, queue: &str) -> Result<(), TransportError> {
        Transport::check_queue(self, queue)
    }

    fn publish_body<'a>(
        &'a self,
        queue: &'a str,
        body: &'a [u8],
        headers: &'a [(String, String)],
    ) -> TransportFuture<'a, ()> {
        Box::pin(async move {
            // The Laravel layout stores no headers: the body goes bare.
            if self.laravel.is_some() {
                return self.publish(queue, body).await;
            }
            // A body that cannot be framed (not UTF-8, no headers left) goes bare.
            let framed = frame::frame(body, headers);
            self.publish(queue, framed.as_deref().unwrap_or(body)).await
        })
    }

    fn publish_batch<'a>(
        &'a self,
        messages: &'a [Outgoing<'a>],
    ) -> TransportFuture<'a, BatchOutcome> {
        Box::pin(RedisTransport::publish_batch(self, messages))
    }
}
