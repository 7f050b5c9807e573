//! Publishing on the Redis binding beyond single bodies: an [`Envelope`]
//! with its producer span, and a batch in one pipelined round trip.

use ::redis::{ErrorKind, RedisError, RedisResult, ServerErrorKind, Value};

use super::{RedisTransport, broker, frame};
use crate::broker::TransportError;
use crate::broker::{BatchOutcome, Outgoing, PublishError};
use crate::envelope::Envelope;
use crate::telemetry::{carrier, span};
use crate::transport::Transport;
use tracing::Instrument;

impl RedisTransport {
    /// Publishes `envelope` to its queue (`meta.queue`, else `default`) in
    /// the canonical encoding
    /// ([`Envelope::encode_for_publish`]), inside a PRODUCER span `publish
    /// <urn>`; with the feature `opentelemetry` the span's W3C
    /// `traceparent` travels in a `__bq_frame` frame beside the body, as
    /// the Python SDK's `publish_with_headers` writes it. An envelope that
    /// does not encode is refused before anything is sent.
    ///
    /// ```no_run
    /// use babel_idem::Envelope;
    /// use babel_idem::transport::RedisTransport;
    /// use serde_json::json;
    ///
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let transport = RedisTransport::connect("redis://127.0.0.1:6379/0").await?;
    /// let env = Envelope::new("urn:babel:orders:created", json!({"order_id": 7})).with_queue("orders");
    /// transport.publish_envelope(&env).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn publish_envelope(&self, envelope: &Envelope) -> Result<(), PublishError> {
        let body = envelope.encode_for_publish()?;
        let queue = envelope.destination();
        let span = span::producer(envelope, queue);
        let headers = carrier::trace_headers(&span);
        let value = frame::frame(&body, &headers).unwrap_or(body);
        self.publish(queue, &value).instrument(span).await?;
        Ok(())
    }

    /// Publishes every message of `messages` with one pipelined round trip
    /// (an `RPUSH` each, framed when it has headers); see [`BatchOutcome`]
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
        let mut outcomes: Vec<Option<Result<(), TransportError>>> = Vec::new();
        let mut pipeline = ::redis::pipe();
        pipeline.ignore_errors();
        let mut sent = 0;
        for message in messages {
            if let Err(error) = self.check_queue(message.queue) {
                outcomes.push(Some(Err(error)));
                continue;
            }
            let framed = frame::frame(message.body, message.headers);
            pipeline
                .cmd("RPUSH")
                .arg(message.queue)
                .arg(framed.as_deref().unwrap_or(message.body));
            outcomes.push(None);
            sent += 1;
        }
        if sent > 0 {
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
            for outcome in outcomes.iter_mut().filter(|outcome| outcome.is_none()) {
                *outcome = Some(match replies.next() {
                    Some(Ok(_)) => Ok(()),
                    Some(Err(error)) => Err(broker(error)),
                    None => Err(TransportError::Broker(
                        "the pipeline's reply was cut short".into(),
                    )),
                });
            }
        }
        Ok(outcomes
            .into_iter()
            .map(|outcome| outcome.unwrap_or(Ok(())))
            .collect())
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

impl crate::broker::Publisher for RedisTransport {
    fn check_queue(&self, queue: &str) -> Result<(), TransportError> {
        Transport::check_queue(self, queue)
    }

    fn publish_envelope<'a>(&'a self, envelope: &'a Envelope) -> crate::broker::PublishFuture<'a> {
        Box::pin(RedisTransport::publish_envelope(self, envelope))
    }

    fn publish_batch<'a>(
        &'a self,
        messages: &'a [Outgoing<'a>],
    ) -> crate::broker::TransportFuture<'a, BatchOutcome> {
        Box::pin(RedisTransport::publish_batch(self, messages))
    }
}
