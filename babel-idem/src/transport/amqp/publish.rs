//! Publishing on the RabbitMQ binding: its [`Publisher`] operations, a
//! batch across queues with one confirm round.
//!
//! [`Publisher`]: crate::broker::Publisher

use super::{AmqpTransport, properties};
use crate::broker::outgoing::batch_publisher;
use crate::broker::{BatchOutcome, Outgoing, Transport, TransportError};

batch_publisher! {
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
    AmqpTransport {
        check: Transport::check_queue,
        one: publish_with_headers,
        send: publish_each,
    }

    fn refused_while_reachable(
        &self,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send + '_>> {
        Box::pin(self.reachable())
    }
}

impl AmqpTransport {
    /// Publishes `sendable` on one confirm channel and waits for all the
    /// confirms at once.
    async fn publish_each(
        &self,
        sendable: Vec<&Outgoing<'_>>,
    ) -> Result<BatchOutcome, TransportError> {
        let sendable: Vec<_> = sendable
            .iter()
            .map(|message| {
                let table = properties::table(message.headers);
                (message.queue, message.body, table)
            })
            .collect();
        self.sessions.publish_each(&sendable).await
    }

    /// Whether the broker answers, on a publishing channel that works: after
    /// a batch failed, tells a broker that closed the channel over one of
    /// its messages from a broker that cannot be reached.
    pub(crate) async fn reachable(&self) -> bool {
        self.sessions.reachable().await
    }
}
