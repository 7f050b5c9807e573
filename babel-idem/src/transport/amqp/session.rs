//! The connection behind an [`AmqpTransport`](super::AmqpTransport): one
//! AMQP connection at a time (a *session*, numbered by its generation), with
//! a confirm-mode channel for publishing and one consuming channel per queue.
//!
//! A failure of the connection discards the whole session and closes it, so
//! the broker puts its unacked deliveries back; the next operation opens a
//! new one. A delivery remembers its session's generation, which is how a
//! late settlement learns that its delivery went back to the queue.
//!
//! A channel error (a refused declare, a publish the broker closes the
//! channel over) closes that channel only: the session opens another one
//! for the next operation, and the deliveries of the other channels stay
//! where they are. Queues are declared on a throwaway channel, passively
//! first, so a queue that exists with arguments of its own (a quorum queue,
//! a TTL, a length limit) is used as it is.
//!
//! Every publish is mandatory, on a confirm channel the publish holds on
//! its own until its last confirm came: a message no queue took comes back
//! (`basic.return`) before its confirm, and is reported not published,
//! never as confirmed. Its queue is forgotten as declared (someone deleted
//! it), so the next publish to it declares it again.

use std::collections::{HashMap, HashSet};
use std::error::Error as StdError;
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex as SyncMutex};
use std::task::Poll;
use std::time::Duration;

use futures_core::Stream;
use lapin::message::BasicReturnMessage;
use lapin::message::Delivery;
use lapin::options::{
    BasicConsumeOptions, BasicPublishOptions, BasicQosOptions, ConfirmSelectOptions,
    QueueDeclareOptions,
};
use lapin::types::FieldTable;
use lapin::uri::AMQPUri;
use lapin::{Acker, Channel, Confirmation, Connection, ConnectionProperties};
use tokio::sync::Mutex;

use super::acks::AckWindow;
use super::header_guard;
use super::properties;
use super::raw::RawChannel;
use crate::broker::TransportError;

/// How to open a session.
#[derive(Debug, Clone)]
pub(super) struct Connector {
    pub(super) uri: AMQPUri,
    pub(super) prefetch: u16,
    pub(super) timeout: Duration,
    pub(super) reconnect_attempts: usize,
}

/// The current session, opened again when it is lost.
pub(super) struct Sessions {
    connector: Connector,
    current: Mutex<Option<Arc<Session>>>,
    generations: SyncMutex<u64>,
    /// How many connections were opened, the first one included.
    connections: AtomicU64,
}

/// How many idle publishing channels a session keeps for the next publishes.
const IDLE_PUBLISHERS: usize = 32;

/// One message to publish: its queue, its body and its out-of-band headers.
type Message<'m> = (&'m str, &'m [u8], &'m FieldTable);

/// One outcome per message of a publish (see [`Sessions::publish_each`]).
type Outcomes = Vec<Result<(), TransportError>>;

struct Session {
    generation: u64,
    connection: Connection,
    /// Confirm-mode publishing channels no publish holds. A publish takes
    /// one for itself ([`Publisher`]), so every confirm and every returned
    /// message read on it meanwhile is its own.
    publishers: SyncMutex<Vec<Channel>>,
    /// The queues this session declared or found, and has seen no message
    /// returned from since.
    declared: SyncMutex<HashSet<String>>,
    consumers: Mutex<HashMap<String, Arc<Mutex<Consuming>>>>,
}

/// What [`Sessions::take`] returns: the session's generation, the channel's
/// ack window and the deliveries.
pub(super) type Taken = (u64, Arc<AckWindow<Acker>>, Vec<Delivery>);

/// A queue's consumer; its channel lives as long as it does.
struct Consuming {
    channel: Channel,
    consumer: lapin::Consumer,
    acks: Arc<AckWindow<Acker>>,
}

impl Sessions {
    /// Opens the first session: a broker that cannot be reached is an error
    /// here, at start.
    pub(super) async fn open(connector: Connector) -> Result<Self, TransportError> {
        let first = connector.connect(1).await?;
        Ok(Sessions {
            connector,
            current: Mutex::new(Some(Arc::new(first))),
            generations: SyncMutex::new(1),
            connections: AtomicU64::new(1),
        })
    }

    /// How many connections were opened so far, the first one included.
    pub(super) fn connections(&self) -> u64 {
        self.connections.load(Ordering::Relaxed)
    }

    /// How long one broker operation may take.
    pub(super) fn timeout(&self) -> Duration {
        self.connector.timeout
    }

    /// The live session, opening a new one (with backoff) when it was lost.
    async fn session(&self) -> Result<Arc<Session>, TransportError> {
        let mut current = self.current.lock().await;
        if let Some(session) = &*current
            && session.connection.status().connected()
        {
            return Ok(Arc::clone(session));
        }
        if let Some(lost) = current.take() {
            close_in_background(lost);
        }
        let mut delay = Duration::from_millis(50);
        let mut attempt = 0;
        let session = loop {
            let generation = {
                let mut generations = self.generations.lock().unwrap_or_else(|e| e.into_inner());
                *generations += 1;
                *generations
            };
            match self.connector.connect(generation).await {
                Ok(session) => break session,
                Err(error) if attempt >= self.connector.reconnect_attempts => return Err(error),
                Err(error) => {
                    tracing::warn!(%error, "babel-idem: reconnecting to the AMQP broker failed; trying again");
                    attempt += 1;
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(1));
                }
            }
        };
        let session = Arc::new(session);
        self.connections.fetch_add(1, Ordering::Relaxed);
        *current = Some(Arc::clone(&session));
        tracing::info!(
            generation = session.generation,
            "babel-idem: connected to the AMQP broker"
        );
        Ok(session)
    }

    /// The session of `generation` if it is still the live one.
    async fn session_of(&self, generation: u64) -> Option<Arc<Session>> {
        let current = self.current.lock().await;
        current
            .as_ref()
            .filter(|s| s.generation == generation && s.connection.status().connected())
            .cloned()
    }

    /// Whether the session of `generation` is gone (replaced or closed).
    pub(super) fn is_gone(&self, generation: u64) -> bool {
        match self.current.try_lock() {
            Ok(current) => !current
                .as_ref()
                .is_some_and(|s| s.generation == generation && s.connection.status().connected()),
            // Someone is reconnecting: the session is being replaced.
            Err(_) => true,
        }
    }

    /// Drops the session of `generation` (if still current) and closes its
    /// connection, so the broker requeues its unacked deliveries.
    pub(super) async fn discard(&self, generation: u64) {
        let mut current = self.current.lock().await;
        if current.as_ref().is_some_and(|s| s.generation == generation)
            && let Some(lost) = current.take()
        {
            close_in_background(lost);
        }
    }

    /// Whether the broker answers: the live session (or a new one) and its
    /// publishing channel, reopened when the broker closed it.
    pub(super) async fn reachable(&self) -> bool {
        let Ok(session) = self.session().await else {
            return false;
        };
        let result = session
            .publisher(self.connector.timeout)
            .await
            .map(Publisher::give_back);
        let result = self.after(&session, result).await;
        result.is_ok() && session.connection.status().connected()
    }

    /// Forgets `queue` as declared on the live session: it was deleted, so
    /// the next publish to it declares it again instead of being returned.
    pub(super) async fn forget(&self, queue: &str) {
        if let Some(session) = &*self.current.lock().await {
            session.forget(queue);
        }
    }

    /// Closes the live session, if any, and waits for the close.
    pub(super) async fn close(&self) {
        let session = self.current.lock().await.take();
        if let Some(session) = session {
            let _ = session
                .connection
                .close(200, "babel-idem closing".into())
                .await;
        }
    }

    /// Publishes each `(body, out-of-band headers)` to `queue`, then waits
    /// for every confirm. With `generation`, only on that session: a
    /// settlement's copy must not outlive the delivery it replaces. `Ok`
    /// once the queue holds every message; otherwise the first message's
    /// error: one no queue took is [`TransportError::Unroutable`], a nack
    /// [`TransportError::Backpressure`] (the others may have been taken).
    pub(super) async fn publish<'b>(
        &self,
        queue: &str,
        messages: impl Iterator<Item = (&'b [u8], &'b FieldTable)>,
        generation: Option<u64>,
    ) -> Result<(), TransportError> {
        let session = match generation {
            None => self.session().await?,
            Some(generation) => self
                .session_of(generation)
                .await
                .ok_or_else(|| broker_message("the connection the delivery came on was lost"))?,
        };
        let messages: Vec<Message<'_>> = messages
            .map(|(body, headers)| (queue, body, headers))
            .collect();
        if messages.is_empty() {
            // Nothing to send: the queue is still made sure of, as every
            // publish to it does first.
            let declared = session.declare(queue, self.connector.timeout).await;
            return self.after(&session, declared).await;
        }
        let result = self.publish_all_on(&session, &messages).await;
        self.after(&session, result)
            .await?
            .into_iter()
            .find(Result::is_err)
            .unwrap_or(Ok(()))
    }

    /// `result` of an operation on `session`; when it failed because the
    /// connection did, the session is discarded. A channel error leaves the
    /// session as it is: the failed channel is replaced when next needed.
    async fn after<T>(
        &self,
        session: &Session,
        result: Result<T, TransportError>,
    ) -> Result<T, TransportError> {
        if result.is_err() && !session.connection.status().connected() {
            self.discard(session.generation).await;
        }
        result
    }

    /// Publishes every message of `messages` (queue, body, out-of-band
    /// headers), each to its own queue, on one confirm channel, then waits
    /// for all their confirms at once. `Err` when the connection or the
    /// channel failed, or the broker did not answer in time (nothing is
    /// known of any message); otherwise one outcome per message: `Ok` once
    /// a queue holds it, [`TransportError::Unroutable`] when the broker
    /// returned it, [`TransportError::Backpressure`] when it nacked it, a
    /// broker error when it refused to declare its queue.
    pub(super) async fn publish_each(
        &self,
        messages: &[(&str, &[u8], FieldTable)],
    ) -> Result<Outcomes, TransportError> {
        let session = self.session().await?;
        let messages: Vec<Message<'_>> = messages
            .iter()
            .map(|(queue, body, headers)| (*queue, *body, headers))
            .collect();
        let result = self.publish_all_on(&session, &messages).await;
        self.after(&session, result).await
    }

    async fn publish_all_on(
        &self,
        session: &Session,
        messages: &[Message<'_>],
    ) -> Result<Outcomes, TransportError> {
        let timeout = self.connector.timeout;
        let mut refused: HashMap<&str, String> = HashMap::new();
        for (queue, _, _) in messages {
            if refused.contains_key(queue) {
                continue;
            }
            if let Err(error) = session.declare(queue, timeout).await {
                // A lost connection or a broker that does not answer is no
                // refusal of the queue: nothing of the batch is sent.
                if !session.connection.status().connected() || !error.is_refusal() {
                    return Err(error);
                }
                refused.insert(queue, error.to_string());
            }
        }
        let publisher = session.publisher(timeout).await?;
        let mut outcomes: Vec<Option<Result<(), TransportError>>> =
            messages.iter().map(|_| None).collect();
        let mut confirms = Vec::with_capacity(messages.len());
        for (index, (queue, body, headers)) in messages.iter().enumerate() {
            if let Some(reason) = refused.get(queue) {
                outcomes[index] = Some(Err(broker_message(&format!(
                    "the broker refused to declare the queue: {reason}"
                ))));
                continue;
            }
            // Mandatory: a message no queue takes comes back to us before
            // its confirm, instead of being confirmed as if published.
            let options = BasicPublishOptions {
                mandatory: true,
                ..BasicPublishOptions::default()
            };
            let publish = publisher.channel().basic_publish(
                "".into(),
                (*queue).into(),
                options,
                body,
                properties::for_body(body, headers),
            );
            confirms.push((index, within(timeout, publish).await?));
        }
        let mut returned = Vec::new();
        for (index, confirm) in confirms {
            let confirmation = within(timeout, confirm).await?;
            outcomes[index] = Some(match confirmation {
                Confirmation::Ack(message) => {
                    returned.extend(message);
                    Ok(())
                }
                Confirmation::Nack(message) => {
                    returned.extend(message);
                    Err(TransportError::Backpressure(
                        format!(
                            "the broker nacked the publish to {:?} (a full queue with x-overflow reject-publish?)",
                            messages[index].0
                        )
                        .into(),
                    ))
                }
                Confirmation::NotRequested => Err(broker_message(
                    "the publishing channel is not in confirm mode",
                )),
            });
        }
        // Every confirm came, and each return before its own: nothing of
        // this publish can reach the channel any more.
        publisher.give_back();
        for message in &returned {
            session.returned(message);
            mark_returned(messages, &mut outcomes, message);
        }
        Ok(outcomes
            .into_iter()
            .map(|outcome| outcome.unwrap_or(Ok(())))
            .collect())
    }

    /// Runs `operation` on a publishing channel of the live session.
    pub(super) async fn with_channel<F, Fut>(&self, operation: F) -> Result<(), TransportError>
    where
        F: FnOnce(Channel) -> Fut,
        Fut: Future<Output = lapin::Result<()>>,
    {
        let session = self.session().await?;
        let result = match session.publisher(self.connector.timeout).await {
            Ok(publisher) => {
                let result = within(
                    self.connector.timeout,
                    operation(publisher.channel().clone()),
                )
                .await;
                if result.is_ok() {
                    publisher.give_back();
                }
                result
            }
            Err(error) => Err(error),
        };
        self.after(&session, result).await
    }

    /// Up to `max` deliveries of `queue`: waits up to `wait` for the first,
    /// then takes only what the broker has already pushed. Starts the
    /// queue's consumer on first use. Returns the session's generation and
    /// the channel's ack window, which has recorded the deliveries.
    pub(super) async fn take(
        &self,
        queue: &str,
        max: usize,
        wait: Duration,
    ) -> Result<Taken, TransportError> {
        let session = self.session().await?;
        let generation = session.generation;
        let consuming = self
            .after(&session, session.consumer(queue, &self.connector).await)
            .await?;
        let mut consuming = consuming.lock().await;
        let acks = Arc::clone(&consuming.acks);
        let consumer = &mut consuming.consumer;
        let first =
            match tokio::time::timeout(wait, poll_fn(|cx| Pin::new(&mut *consumer).poll_next(cx)))
                .await
            {
                Err(_) => return Ok((generation, acks, Vec::new())),
                Ok(Some(Ok(delivery))) => delivery,
                Ok(Some(Err(error))) => {
                    self.discard(generation).await;
                    self.after_unparsable(queue, &error).await;
                    return Err(broker(error));
                }
                Ok(None) => {
                    drop(consuming);
                    session.stop_consuming(queue).await;
                    return Err(broker_message("the broker cancelled the consumer"));
                }
            };
        let mut deliveries = vec![first];
        while deliveries.len() < max {
            let next = poll_fn(|cx| match Pin::new(&mut *consumer).poll_next(cx) {
                Poll::Pending => Poll::Ready(None),
                Poll::Ready(next) => Poll::Ready(next),
            })
            .await;
            match next {
                Some(Ok(delivery)) => deliveries.push(delivery),
                None => break,
                // The ones taken so far are handled; their settlements
                // find the session gone and touch nothing.
                Some(Err(error)) => {
                    self.discard(generation).await;
                    self.after_unparsable(queue, &error).await;
                    break;
                }
            }
        }
        for delivery in &deliveries {
            acks.delivered(delivery.delivery_tag);
        }
        Ok((generation, acks, deliveries))
    }
}

impl Sessions {
    /// A new channel on the live session's connection, with the session's
    /// generation: for the dead-letter queue operations, which hold their
    /// own deliveries on it.
    pub(super) async fn open_channel(&self) -> Result<(u64, Channel), TransportError> {
        let session = self.session().await?;
        let channel = within(self.connector.timeout, session.connection.create_channel()).await;
        let channel = self.after(&session, channel).await?;
        Ok((session.generation, channel))
    }
}

impl Sessions {
    /// When lapin failed on a frame it cannot parse, takes the message at
    /// fault off `queue` (see [`dead_letter_unreadable`](Self::dead_letter_unreadable)),
    /// so the queue moves on; anything else is left to the reconnect.
    async fn after_unparsable(&self, queue: &str, error: &lapin::Error) {
        if !matches!(error.kind(), lapin::ErrorKind::ParsingError(_)) {
            return;
        }
        match self.dead_letter_unreadable(queue).await {
            Ok(true) => {}
            Ok(false) => tracing::warn!(
                queue,
                %error,
                "babel-idem: the AMQP client could not parse a frame, and no unreadable message was found at the head of the queue"
            ),
            Err(failed) => tracing::warn!(
                queue,
                %error,
                %failed,
                "babel-idem: the AMQP client could not parse a frame; taking the message off the queue failed, trying again on the next failure"
            ),
        }
    }

    /// Takes messages off the head of `queue` with the raw client, unacked,
    /// until one whose properties lapin cannot parse (at most one prefetch
    /// window and one more): copies its body, byte for byte, to
    /// `<queue>.dlq` with headers saying why, and acks it. The readable
    /// messages taken on the way go back when the raw connection closes.
    /// `Ok(true)` when one was dead-lettered.
    async fn dead_letter_unreadable(&self, queue: &str) -> Result<bool, TransportError> {
        let timeout = self.connector.timeout;
        let dead_letter_queue = format!("{queue}.dlq");
        let session = self.session().await?;
        let declared = session.declare(&dead_letter_queue, timeout).await;
        self.after(&session, declared).await?;
        let mut raw = RawChannel::open(&self.connector.uri, timeout).await?;
        let mut found = false;
        for _ in 0..=self.connector.prefetch {
            let Some(message) = raw.get(queue).await? else {
                break;
            };
            if let Some(reason) = message.unreadable() {
                tracing::warn!(
                    queue,
                    %reason,
                    "babel-idem: dead-lettering a message the AMQP client cannot read"
                );
                let properties = properties::dead_letter(queue, &reason);
                let published = raw
                    .publish(&dead_letter_queue, &message.body, &properties)
                    .await;
                if let Err(TransportError::Unroutable { .. }) = &published {
                    // Deleted since it was declared: declared again next time;
                    // the message goes back when the raw connection closes.
                    session.forget(&dead_letter_queue);
                }
                published?;
                raw.ack(message.delivery_tag).await?;
                found = true;
                break;
            }
        }
        raw.close().await?;
        Ok(found)
    }
}

impl Drop for Sessions {
    fn drop(&mut self) {
        if let Some(session) = self.current.get_mut().take() {
            close_in_background(session);
        }
    }
}

impl Connector {
    async fn connect(&self, generation: u64) -> Result<Session, TransportError> {
        // lapin reads through a check that no content header can make it
        // recurse past the transport's header depth (see `header_guard`).
        let connect = Connection::connector(
            self.uri.clone(),
            header_guard::Checked::current(),
            async |uri, _runtime| Ok(header_guard::connect(uri).await?),
            ConnectionProperties::default(),
        );
        let connection = match tokio::time::timeout(self.timeout, connect).await {
            Ok(Ok(connection)) => connection,
            Ok(Err(error)) => return Err(TransportError::Connect(Box::new(error))),
            Err(_) => {
                return Err(TransportError::Connect(
                    format!("no answer within {:?}", self.timeout).into(),
                ));
            }
        };
        let publisher = confirm_channel(&connection, self.timeout).await?;
        Ok(Session {
            generation,
            connection,
            publishers: SyncMutex::new(vec![publisher]),
            declared: SyncMutex::default(),
            consumers: Mutex::default(),
        })
    }
}

/// A new channel of `connection` in confirm mode.
async fn confirm_channel(
    connection: &Connection,
    timeout: Duration,
) -> Result<Channel, TransportError> {
    let channel = within(timeout, connection.create_channel()).await?;
    within(
        timeout,
        channel.confirm_select(ConfirmSelectOptions::default()),
    )
    .await?;
    Ok(channel)
}

/// A publishing channel one publish holds on its own, so that what the
/// broker answers on it (confirms, returned messages) is that publish's.
/// Given back to the session's idle ones only once every confirm of the
/// publish came; dropped otherwise, and closed, so that a late confirm or
/// return never reaches another publish.
struct Publisher<'s> {
    idle: &'s SyncMutex<Vec<Channel>>,
    channel: Option<Channel>,
}

impl Publisher<'_> {
    fn channel(&self) -> &Channel {
        self.channel
            .as_ref()
            .expect("a publisher holds its channel until it is given back or dropped")
    }

    /// Back to the session's idle channels, for the next publish.
    fn give_back(mut self) {
        let Some(channel) = self.channel.take() else {
            return;
        };
        if channel.status().connected() {
            let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
            if idle.len() < IDLE_PUBLISHERS {
                idle.push(channel);
                return;
            }
        }
        close_channel_in_background(channel);
    }
}

impl Drop for Publisher<'_> {
    fn drop(&mut self) {
        if let Some(channel) = self.channel.take() {
            close_channel_in_background(channel);
        }
    }
}

impl Session {
    /// A publishing channel of its own for one publish: an idle one, or a
    /// new one in confirm mode.
    async fn publisher(&self, timeout: Duration) -> Result<Publisher<'_>, TransportError> {
        loop {
            let idle = self
                .publishers
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .pop();
            match idle {
                Some(channel) if channel.status().connected() => {
                    return Ok(Publisher {
                        idle: &self.publishers,
                        channel: Some(channel),
                    });
                }
                // Closed by the broker (over a message it refused).
                Some(_) => continue,
                None => break,
            }
        }
        let channel = confirm_channel(&self.connection, timeout).await?;
        Ok(Publisher {
            idle: &self.publishers,
            channel: Some(channel),
        })
    }

    /// The broker returned `message`: no queue took it, so its queue is
    /// gone (deleted since it was declared); the next publish to it
    /// declares it again.
    fn returned(&self, message: &BasicReturnMessage) {
        let queue = message.delivery.routing_key.as_str();
        tracing::warn!(
            queue,
            reply_code = message.reply_code,
            reply_text = message.reply_text.as_str(),
            "babel-idem: the broker returned a message no queue took; it is not published, and the queue is declared again on the next publish"
        );
        self.forget(queue);
    }

    /// Forgets `queue` as declared, so the next publish to it declares it.
    fn forget(&self, queue: &str) {
        self.declared
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(queue);
    }

    /// Makes sure `queue` exists, once per session: a queue that exists is
    /// used as it is, whatever its arguments; a missing one is declared
    /// durable (as the Python SDK does). Both on a throwaway channel, since
    /// the broker closes the channel of a refused declare.
    async fn declare(&self, queue: &str, timeout: Duration) -> Result<(), TransportError> {
        let known = |declared: &SyncMutex<HashSet<String>>| {
            declared
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .contains(queue)
        };
        if known(&self.declared) {
            return Ok(());
        }
        let passive = QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        };
        if self.declare_once(queue, passive, timeout).await.is_err() {
            // Missing (a 404 closed the throwaway channel), or declared by
            // someone else meanwhile: then the passive retry finds it.
            if let Err(error) = self
                .declare_once(queue, QueueDeclareOptions::durable(), timeout)
                .await
            {
                self.declare_once(queue, passive, timeout)
                    .await
                    .map_err(|_| error)?;
            }
        }
        self.declared
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(queue.to_owned());
        Ok(())
    }

    /// Forgets the consumer of `queue` (its channel is closed), so the next
    /// [`take`](Sessions::take) starts it again.
    async fn stop_consuming(&self, queue: &str) {
        let stopped = self.consumers.lock().await.remove(queue);
        if let Some(consuming) = stopped {
            let channel = consuming.lock().await.channel.clone();
            if channel.status().connected() {
                let _ = channel.close(200, "consumer cancelled".into()).await;
            }
        }
    }

    /// One `queue.declare` on a channel of its own, closed afterwards.
    async fn declare_once(
        &self,
        queue: &str,
        options: QueueDeclareOptions,
        timeout: Duration,
    ) -> Result<(), TransportError> {
        let channel = within(timeout, self.connection.create_channel()).await?;
        let declared = within(
            timeout,
            channel.queue_declare(queue.into(), options, FieldTable::default()),
        )
        .await;
        if channel.status().connected() {
            let _ = within(timeout, channel.close(200, "declared".into())).await;
        }
        declared.map(drop)
    }

    /// The consumer of `queue`, started on its own channel with the prefetch.
    async fn consumer(
        &self,
        queue: &str,
        connector: &Connector,
    ) -> Result<Arc<Mutex<Consuming>>, TransportError> {
        let mut consumers = self.consumers.lock().await;
        if let Some(consuming) = consumers.get(queue) {
            return Ok(Arc::clone(consuming));
        }
        self.declare(queue, connector.timeout).await?;
        let channel = within(connector.timeout, self.connection.create_channel()).await?;
        within(
            connector.timeout,
            channel.basic_qos(connector.prefetch, BasicQosOptions::default()),
        )
        .await?;
        let consumer = within(
            connector.timeout,
            channel.basic_consume(
                queue.into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            ),
        )
        .await?;
        let consuming = Arc::new(Mutex::new(Consuming {
            channel,
            consumer,
            acks: Arc::new(AckWindow::new()),
        }));
        consumers.insert(queue.to_owned(), Arc::clone(&consuming));
        Ok(consuming)
    }
}

/// Marks the message of `messages` that the broker `returned` as
/// [`TransportError::Unroutable`]: the first one to its queue with its body
/// not marked yet. When none matches, every message to that queue is
/// marked: a message the broker returned is never reported published.
fn mark_returned(
    messages: &[Message<'_>],
    outcomes: &mut [Option<Result<(), TransportError>>],
    returned: &BasicReturnMessage,
) {
    let queue = returned.delivery.routing_key.as_str();
    let unroutable = || {
        Some(Err(TransportError::Unroutable {
            queue: queue.to_owned(),
        }))
    };
    let same = messages
        .iter()
        .zip(outcomes.iter())
        .position(|((to, body, _), outcome)| {
            *to == queue
                && *body == returned.delivery.data.as_slice()
                && !matches!(outcome, Some(Err(TransportError::Unroutable { .. })))
        });
    match same {
        Some(index) => outcomes[index] = unroutable(),
        None => {
            for (outcome, (to, _, _)) in outcomes.iter_mut().zip(messages) {
                if *to == queue {
                    *outcome = unroutable();
                }
            }
        }
    }
}

/// Closes a channel no one holds any more, without waiting for it.
fn close_channel_in_background(channel: Channel) {
    if !channel.status().connected() {
        return;
    }
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(async move {
            let _ = channel.close(200, "babel-idem publisher".into()).await;
        });
    }
}

/// Closes a lost or replaced session without waiting for it.
fn close_in_background(session: Arc<Session>) {
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(async move {
            let _ = session
                .connection
                .close(200, "babel-idem reconnecting".into())
                .await;
        });
    }
}

/// `operation`, failing after `timeout` as back-pressure: a broker that
/// does not answer in time is busy, which is no refusal of a message.
async fn within<T>(
    timeout: Duration,
    operation: impl Future<Output = lapin::Result<T>>,
) -> Result<T, TransportError> {
    match tokio::time::timeout(timeout, operation).await {
        Ok(result) => result.map_err(broker),
        Err(_) => Err(TransportError::Backpressure(
            "the broker did not answer in time".into(),
        )),
    }
}

fn broker(error: lapin::Error) -> TransportError {
    TransportError::Broker(Box::new(error))
}

fn broker_message(message: &str) -> TransportError {
    let error: Box<dyn StdError + Send + Sync> = message.into();
    TransportError::Broker(error)
}
