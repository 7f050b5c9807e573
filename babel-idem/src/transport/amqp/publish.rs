//! Publishing on the RabbitMQ binding: its [`Publisher`] operations, a
//! batch across queues with one confirm round.

use super::{AmqpTransport, properties};
use crate::broker::Transport;
use crate::broker::outgoing::publish_checked;
use crate::broker::{BatchOutcome, Outgoing, Publisher, TransportError, TransportFuture};

impl AmqpTransport {
    /// Publishes every message of `messages`, each to its own queue, on one
    /// confirm channel, then waits for all the confirms at once: one round
    /// trip for the batch. See [`BatchOutcome`] for what the answer says; a
    /// queue name AMQP cannot carry fails that message only, before
    /// anything is sent. Every publish is mandatory: a message the broker
    /// returns (no queue took it) is [`TransportError::Unroutable`], never
    /// `Ok`, and its queue is declared again on the next publish; a nacked
    /// one is [`TransportError::Backpressure`]. A broker that does not
    /// answer in time fails the whole call with
    /// [`TransportError::Backpressure`].
    ///
    /// ```no_run
    /// use babel_idem::transport::{AmqpTransport, Outgoing};
    ///
    /// # async fn run() -> Result<(), babel_idem::transport::TransportError> {
    /// let transport = AmqpTransport::connect("amqp://guest:guest@127.0.0.1:5672/%2f").await?;
    /// let outcome = transport
    ///     .publish_batch(&[Outgoing::new("orders", b"{}"), Outgoing::new("amq.mine", b"{}")])
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
            let sendable: Vec<_> = sendable
                .iter()
                .map(|message| {
                    let table = properties::table(message.headers);
                    (message.queue, message.body, table)
                })
                .collect();
            self.sessions.publish_each(&sendable).await
        })
        .await
    }

    /// Whether the broker answers, on a publishing channel that works: after
    /// a batch failed, tells a broker that closed the channel over one of
    /// its messages from a broker that cannot be reached.
    pub(crate) async fn reachable(&self) -> bool {
        self.sessions.reachable().await
    }
}

impl Publisher for AmqpTransport {
    fn check_queue(&self, queue: &str) -> Result<(), TransportError> {
        Transport::check_queue(self, queue)
    }

    fn publish_body<'a>(
        &'a self,
        queue: &'a str,
        body: &'a [u8],
        headers: &'a [(String, String)],
    ) -> TransportFuture<'a, ()> {
        Box::pin(self.publish_with_headers(queue, body, headers))
    }

    fn publish_batch<'a>(
        &'a self,
        messages: &'a [Outgoing<'a>],
    ) -> TransportFuture<'a, BatchOutcome> {
        Box::pin(AmqpTransport::publish_batch(self, messages))
    }

    fn refused_while_reachable(
        &self,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send + '_>> {
        Box::pin(self.reachable())
    }
}
