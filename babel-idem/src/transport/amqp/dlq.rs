//! The dead-letter queue operations of [`AmqpTransport`]
//! ([`DeadLetters`]): AMQP 0-9-1 has no way to read a message without
//! taking it, so looking is get-then-requeue.
//!
//! | operation | commands |
//! |---|---|
//! | open | `queue.declare` passive on a throwaway channel (a missing queue is an error, never created), then a channel of its own |
//! | depth | `queue.declare` passive: the ready messages |
//! | look | `basic.get` without auto-ack: the message stays unacked on the run's channel, so no other `basic.get` of the run sees it again |
//! | republish | `basic.publish` (mandatory) of the redriven body to the target (declared durable unless it exists), broker-confirmed and not returned, then `basic.ack` of the original, on the same connection |
//! | put back | `basic.nack` with `requeue` when the run ends: a classic queue puts each message back at its place |
//!
//! A copy the broker returns (no queue took it: the target was deleted
//! since the connection declared it) stops the run with
//! [`TransportError::Unroutable`] and acks nothing: the dead letter stays
//! in the dead-letter queue, and the next run declares the target again.
//! A run that dies puts every message it held back: the broker requeues a
//! closed channel's unacked deliveries. One killed between the confirm and
//! the ack leaves that message in both queues, with the same `meta.id`.
//!
//! On a quorum queue before RabbitMQ 4.3 every requeue counts: a
//! message returned by `basic.nack` (or by a closed channel) gets one more
//! in its `x-delivery-count`, and a quorum queue with a delivery limit
//! (RabbitMQ 4.0 to 4.2 set 20 by default) drops or dead-letters a message
//! whose count passes it. So a look never requeues a message that carries
//! `x-delivery-count` (it was returned before, so its queue counts):
//! it publishes a copy of it, body and headers (without
//! `x-delivery-count`), to the end of the same queue, broker-confirmed, and
//! acks the original. The copy starts again at a delivery count of 0, so
//! looks never bring a message to any limit above 0; the copy moves to the
//! end of the queue. From RabbitMQ 4.3 on, `basic.nack` no longer counts.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use lapin::Channel;
use lapin::options::{BasicAckOptions, BasicGetOptions, BasicNackOptions, QueueDeclareOptions};
use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
use lapin::types::{AMQPValue, FieldTable};

use super::session::Sessions;
use super::{AmqpTransport, QUEUE_NAMES, properties};
use crate::broker::{
    BoxedRun, DeadLetterMessage, DeadLetterRun, DeadLetters, Death, Outgoing, TransportError,
    TransportFuture,
};

/// The header a quorum queue counts returns in.
const DELIVERY_COUNT: &str = "x-delivery-count";

/// A queue that does not exist opens no run, and is not created.
impl DeadLetters for AmqpTransport {
    type Handle = u64;

    fn open_dead_letters<'a>(&'a self, dlq: &'a str) -> TransportFuture<'a, Option<BoxedRun<u64>>> {
        Box::pin(async move {
            QUEUE_NAMES.check(dlq)?;
            let timeout = self.sessions.timeout();
            // A refused passive declare closes its channel: a throwaway one.
            let (_, probe) = self.sessions.open_channel().await?;
            let passive = QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            };
            let declared = within(
                timeout,
                probe.queue_declare(dlq.into(), passive, FieldTable::default()),
            )
            .await?;
            match declared {
                Ok(_) => {
                    let _ = within(timeout, probe.close(200, "babel-idem".into())).await;
                }
                Err(error) if is_not_found(&error) => return Ok(None),
                Err(error) => return Err(TransportError::Broker(Box::new(error))),
            }
            let (generation, channel) = self.sessions.open_channel().await?;
            let run: BoxedRun<u64> = Box::new(AmqpDlq {
                sessions: Arc::clone(&self.sessions),
                dlq: dlq.to_owned(),
                generation,
                channel,
                timeout,
                held: Vec::new(),
                counted: HashMap::new(),
            });
            Ok(Some(run))
        })
    }
}

fn is_not_found(error: &lapin::Error) -> bool {
    matches!(error.kind(), lapin::ErrorKind::ProtocolError(amqp)
        if matches!(amqp.kind(), AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND)))
}

/// One run over a dead-letter queue: its channel, and the deliveries it
/// holds to put back when it ends.
struct AmqpDlq {
    sessions: Arc<Sessions>,
    dlq: String,
    generation: u64,
    channel: Channel,
    timeout: Duration,
    held: Vec<Held>,
    /// The headers of the deliveries looked at that carry `x-delivery-count`
    /// (without it): what their copy is published with.
    counted: HashMap<u64, FieldTable>,
}

/// A delivery to put back: requeued, or (a quorum queue's) copied.
struct Held {
    tag: u64,
    copy: Option<(Vec<u8>, FieldTable)>,
}

async fn within<T>(
    timeout: Duration,
    operation: impl Future<Output = T>,
) -> Result<T, TransportError> {
    tokio::time::timeout(timeout, operation)
        .await
        .map_err(|_| TransportError::Broker(format!("no answer within {timeout:?}").into()))
}

async fn lapin_within<T>(
    timeout: Duration,
    operation: impl Future<Output = lapin::Result<T>>,
) -> Result<T, TransportError> {
    within(timeout, operation)
        .await?
        .map_err(|error| TransportError::Broker(Box::new(error)))
}

/// The latest `x-death` entry: why, from where and when RabbitMQ
/// dead-lettered the message.
fn death(headers: &FieldTable) -> Option<Death> {
    let entry = match field(headers, "x-death")? {
        AMQPValue::FieldArray(entries) => match entries.as_slice().first()? {
            AMQPValue::FieldTable(entry) => entry,
            _ => return None,
        },
        _ => return None,
    };
    let text = |name: &str| match field(entry, name) {
        Some(AMQPValue::LongString(text)) => {
            Some(String::from_utf8_lossy(text.as_bytes()).into_owned())
        }
        Some(AMQPValue::ShortString(text)) => Some(text.to_string()),
        _ => None,
    };
    let time_ms = match field(entry, "time") {
        Some(AMQPValue::Timestamp(seconds)) => seconds.checked_mul(1000),
        _ => None,
    };
    let death = Death::new(
        text("reason").unwrap_or_default(),
        text("queue").unwrap_or_default(),
    );
    Some(Death { time_ms, ..death })
}

fn field<'t>(table: &'t FieldTable, name: &str) -> Option<&'t AMQPValue> {
    table
        .inner()
        .iter()
        .find(|(key, _)| key.as_str() == name)
        .map(|(_, value)| value)
}

impl DeadLetterRun for AmqpDlq {
    /// The delivery tag of the unacked `basic.get`.
    type Handle = u64;

    fn depth(&mut self) -> TransportFuture<'_, usize> {
        Box::pin(async move {
            let passive = QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            };
            let queue = lapin_within(
                self.timeout,
                self.channel.queue_declare(
                    self.dlq.as_str().into(),
                    passive,
                    FieldTable::default(),
                ),
            )
            .await?;
            Ok(queue.message_count() as usize)
        })
    }

    fn look(&mut self, max: usize) -> TransportFuture<'_, Vec<DeadLetterMessage<u64>>> {
        Box::pin(async move {
            let mut messages = Vec::with_capacity(max);
            for _ in 0..max {
                let got = lapin_within(
                    self.timeout,
                    self.channel
                        .basic_get(self.dlq.as_str().into(), BasicGetOptions { no_ack: false }),
                )
                .await?;
                let Some(got) = got else { break };
                let delivery = got.delivery;
                let headers = delivery.properties.headers().clone().unwrap_or_default();
                if field(&headers, DELIVERY_COUNT).is_some() {
                    let mut copy = FieldTable::default();
                    for (name, value) in properties::out_of_band(&delivery.properties).inner() {
                        if name.as_str() != DELIVERY_COUNT {
                            copy.insert(name.clone(), value.clone());
                        }
                    }
                    self.counted.insert(delivery.delivery_tag, copy);
                }
                let message = DeadLetterMessage::new(
                    delivery.data,
                    properties::as_strings(&delivery.properties),
                    delivery.delivery_tag,
                );
                messages.push(message.with_death(death(&headers)));
            }
            Ok(messages)
        })
    }

    fn republish<'a>(
        &'a mut self,
        message: DeadLetterMessage<u64>,
        copy: Outgoing<'a>,
    ) -> TransportFuture<'a, bool> {
        Box::pin(async move {
            let tag = message.handle;
            self.counted.remove(&tag);
            let table = properties::table(copy.headers);
            // On the connection the delivery came on: once it is gone the
            // broker has put the delivery back, and a copy would be a second.
            // The original is acked only once a queue holds the copy.
            self.sessions
                .publish(
                    copy.queue,
                    std::iter::once((copy.body, &table)),
                    Some(self.generation),
                )
                .await?;
            lapin_within(
                self.timeout,
                self.channel.basic_ack(tag, BasicAckOptions::default()),
            )
            .await?;
            Ok(true)
        })
    }

    fn put_back(&mut self, message: DeadLetterMessage<u64>) {
        let tag = message.handle;
        let copy = self.counted.remove(&tag).map(|table| (message.body, table));
        self.held.push(Held { tag, copy });
    }

    fn close(&mut self) -> TransportFuture<'_, ()> {
        Box::pin(async move {
            let held = std::mem::take(&mut self.held);
            let mut result = Ok(());
            for Held { tag, copy } in held {
                let step = match copy {
                    Some((body, table)) => {
                        let published = self
                            .sessions
                            .publish(
                                &self.dlq,
                                std::iter::once((&body[..], &table)),
                                Some(self.generation),
                            )
                            .await;
                        match published {
                            Ok(()) => {
                                lapin_within(
                                    self.timeout,
                                    self.channel.basic_ack(tag, BasicAckOptions::default()),
                                )
                                .await
                            }
                            Err(error) => Err(error),
                        }
                    }
                    None => {
                        let requeue = BasicNackOptions {
                            multiple: false,
                            requeue: true,
                        };
                        lapin_within(self.timeout, self.channel.basic_nack(tag, requeue)).await
                    }
                };
                if let Err(error) = step {
                    // The channel's close below puts back what is still held.
                    result = Err(error);
                    break;
                }
            }
            let _ = within(self.timeout, self.channel.close(200, "babel-idem".into())).await;
            result
        })
    }

    fn check_queue(&self, queue: &str) -> Result<(), TransportError> {
        QUEUE_NAMES.check(queue)
    }
}
