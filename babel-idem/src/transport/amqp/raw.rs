//! A minimal AMQP 0-9-1 client over TCP, for the one job lapin cannot do:
//! taking a message whose content header lapin cannot parse (a header name or
//! a property that is not UTF-8) off the head of its queue.
//!
//! lapin fails the whole connection on such a frame, and the broker hands
//! the same message back first on the next one. This client reads each frame
//! by its length alone and keeps a message's properties as raw bytes, so it
//! can `basic.get` the message, copy its body to the dead-letter queue and
//! ack it. Method frames (its own, and the broker's answers to them) are
//! written and read with amq-protocol's codecs; content headers are never
//! decoded beyond their length fields.
//!
//! One connection, one channel (1) in confirm mode, no heartbeats; every
//! read and write is bounded by the caller's timeout.

use std::time::Duration;

use lapin::BasicProperties;
use lapin::protocol::basic::{self, AMQPMethod as Basic};
use lapin::protocol::channel::{self, AMQPMethod as ChannelMethod};
use lapin::protocol::confirm::{self, AMQPMethod as Confirm};
use lapin::protocol::connection::{self, AMQPMethod as ConnectionMethod};
use lapin::protocol::{AMQPClass, gen_class, parse_class};
use lapin::types::{FieldTable, LongString};
use lapin::uri::AMQPUri;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::header_guard::too_deep_headers;
use super::properties::MAX_HEADER_DEPTH;
use crate::broker::TransportError;

const METHOD: u8 = 1;
const HEADER: u8 = 2;
const BODY: u8 = 3;
const HEARTBEAT: u8 = 8;
const FRAME_END: u8 = 0xCE;
/// The channel this client works on.
const CHANNEL: u16 = 1;
/// The largest frame this client asks for; the broker's limit wins when lower.
const FRAME_MAX: u32 = 128 * 1024;

/// A message taken with `basic.get`: its tag, its content header's property
/// bytes (flags and list, undecoded) and its body.
pub(super) struct RawMessage {
    pub(super) delivery_tag: u64,
    pub(super) properties: Vec<u8>,
    pub(super) body: Vec<u8>,
}

impl RawMessage {
    /// Why lapin cannot read this message's properties, or `None` when it can.
    pub(super) fn unreadable(&self) -> Option<String> {
        // lapin's parser recurses into nested headers: too deep a table is
        // answered before it is given any.
        if too_deep_headers(&self.properties).is_some() {
            return Some(format!(
                "its headers nest tables or arrays deeper than {MAX_HEADER_DEPTH}"
            ));
        }
        match basic::parse_properties(self.properties.as_slice()) {
            Ok(_) => None,
            Err(error) => Some(format!("its AMQP properties cannot be parsed: {error}")),
        }
    }
}

/// An open connection with channel 1 in confirm mode.
pub(super) struct RawChannel {
    stream: TcpStream,
    frame_max: u32,
    timeout: Duration,
    /// The publisher-confirm sequence number of the last publish.
    published: u64,
}

impl RawChannel {
    /// Connects, logs in (PLAIN) and opens channel 1 in confirm mode.
    pub(super) async fn open(uri: &AMQPUri, timeout: Duration) -> Result<Self, TransportError> {
        let address = (uri.authority.host.as_str(), uri.authority.port);
        let stream = match tokio::time::timeout(timeout, TcpStream::connect(address)).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(error)) => return Err(TransportError::Connect(Box::new(error))),
            Err(_) => {
                return Err(TransportError::Connect(
                    format!("no answer within {timeout:?}").into(),
                ));
            }
        };
        stream.set_nodelay(true).map_err(io)?;
        let mut raw = RawChannel {
            stream,
            frame_max: FRAME_MAX,
            timeout,
            published: 0,
        };
        raw.write(b"AMQP\x00\x00\x09\x01").await?;
        let ConnectionMethod::Start(_) = raw.connection_method().await? else {
            return Err(protocol("expected connection.start"));
        };
        let user = &uri.authority.userinfo;
        let response = format!("\0{}\0{}", user.username, user.password);
        raw.send(
            0,
            AMQPClass::Connection(ConnectionMethod::StartOk(connection::StartOk {
                client_properties: FieldTable::default(),
                mechanism: "PLAIN".into(),
                response: LongString::from(response),
                locale: "en_US".into(),
            })),
        )
        .await?;
        let ConnectionMethod::Tune(tune) = raw.connection_method().await? else {
            return Err(protocol(
                "expected connection.tune (was the login refused?)",
            ));
        };
        if tune.frame_max != 0 {
            raw.frame_max = tune.frame_max.min(FRAME_MAX);
        }
        raw.send(
            0,
            AMQPClass::Connection(ConnectionMethod::TuneOk(connection::TuneOk {
                channel_max: 1,
                frame_max: raw.frame_max,
                heartbeat: 0,
            })),
        )
        .await?;
        raw.send(
            0,
            AMQPClass::Connection(ConnectionMethod::Open(connection::Open {
                virtual_host: uri.vhost.as_str().into(),
            })),
        )
        .await?;
        let ConnectionMethod::OpenOk(_) = raw.connection_method().await? else {
            return Err(protocol("expected connection.open-ok"));
        };
        raw.call(AMQPClass::Channel(ChannelMethod::Open(channel::Open {})))
            .await?;
        raw.call(AMQPClass::Confirm(Confirm::Select(confirm::Select {
            nowait: false,
        })))
        .await?;
        Ok(raw)
    }

    /// `basic.get` without auto-ack: the message at the head of `queue`, or
    /// `None` when it is empty. The message stays unacked until acked here
    /// or until this connection closes (then the broker puts it back).
    pub(super) async fn get(&mut self, queue: &str) -> Result<Option<RawMessage>, TransportError> {
        let get = Basic::Get(basic::Get {
            queue: queue.into(),
            no_ack: false,
        });
        let delivery_tag = match self.call(AMQPClass::Basic(get)).await? {
            AMQPClass::Basic(Basic::GetEmpty(_)) => return Ok(None),
            AMQPClass::Basic(Basic::GetOk(ok)) => ok.delivery_tag,
            _ => return Err(protocol("expected basic.get-ok or get-empty")),
        };
        let (properties, body) = self.content().await?;
        Ok(Some(RawMessage {
            delivery_tag,
            properties,
            body,
        }))
    }

    /// The content header and body frames that follow a `basic.get-ok` or a
    /// `basic.return`: the property bytes (undecoded) and the body.
    async fn content(&mut self) -> Result<(Vec<u8>, Vec<u8>), TransportError> {
        let header = self.frame_of(HEADER).await?;
        // class-id (2), weight (2), body size (8), then flags and properties.
        let Some(size) = header.get(4..12) else {
            return Err(protocol("a content header shorter than its fixed fields"));
        };
        let size = u64::from_be_bytes(size.try_into().expect("eight bytes"));
        let properties = header[12..].to_vec();
        let mut body = Vec::with_capacity(usize::try_from(size).unwrap_or(0).min(1 << 20));
        while (body.len() as u64) < size {
            body.extend_from_slice(&self.frame_of(BODY).await?);
        }
        Ok((properties, body))
    }

    /// Publishes `body` to `queue` through the default exchange, mandatory,
    /// and waits for the broker's confirm: a message no queue took comes
    /// back first and is [`TransportError::Unroutable`], a nack
    /// [`TransportError::Backpressure`].
    pub(super) async fn publish(
        &mut self,
        queue: &str,
        body: &[u8],
        properties: &BasicProperties,
    ) -> Result<(), TransportError> {
        let publish = Basic::Publish(basic::Publish {
            exchange: "".into(),
            routing_key: queue.into(),
            mandatory: true,
            immediate: false,
        });
        self.send(CHANNEL, AMQPClass::Basic(publish)).await?;
        let mut header = Vec::with_capacity(64);
        header.extend_from_slice(&60u16.to_be_bytes());
        header.extend_from_slice(&0u16.to_be_bytes());
        header.extend_from_slice(&(body.len() as u64).to_be_bytes());
        let header = basic::gen_properties(properties)(header.into())
            .map_err(|error| protocol(&format!("cannot encode properties: {error:?}")))?
            .write;
        self.frame(HEADER, CHANNEL, &header).await?;
        // A frame's own bytes: type (1), channel (2), size (4), end (1).
        let chunk = (self.frame_max as usize).saturating_sub(8).max(1);
        for part in body.chunks(chunk) {
            self.frame(BODY, CHANNEL, part).await?;
        }
        self.published += 1;
        let mut returned = false;
        loop {
            match self.method().await? {
                // The message itself follows the return; its confirm comes after.
                AMQPClass::Basic(Basic::Return(_)) => {
                    self.content().await?;
                    returned = true;
                }
                AMQPClass::Basic(Basic::Ack(ack)) if ack.delivery_tag >= self.published => {
                    return match returned {
                        false => Ok(()),
                        true => Err(TransportError::Unroutable {
                            queue: queue.to_owned(),
                        }),
                    };
                }
                AMQPClass::Basic(Basic::Nack(_)) => {
                    return Err(TransportError::Backpressure(
                        "the broker nacked the dead-letter publish".into(),
                    ));
                }
                _ => return Err(protocol("expected the publish's confirm")),
            }
        }
    }

    /// Acks one delivery (the broker sends no answer).
    pub(super) async fn ack(&mut self, delivery_tag: u64) -> Result<(), TransportError> {
        let ack = Basic::Ack(basic::Ack {
            delivery_tag,
            multiple: false,
        });
        self.send(CHANNEL, AMQPClass::Basic(ack)).await
    }

    /// Closes the connection and waits for the broker to confirm, so every
    /// ack sent before has been taken and every unacked message is back.
    pub(super) async fn close(mut self) -> Result<(), TransportError> {
        self.send(
            0,
            AMQPClass::Connection(ConnectionMethod::Close(connection::Close {
                reply_code: 200,
                reply_text: "done".into(),
                class_id: 0,
                method_id: 0,
            })),
        )
        .await?;
        match self.connection_method().await? {
            ConnectionMethod::CloseOk(_) => Ok(()),
            _ => Err(protocol("expected connection.close-ok")),
        }
    }

    /// Sends `method` on channel 1 and reads its answer.
    async fn call(&mut self, method: AMQPClass) -> Result<AMQPClass, TransportError> {
        self.send(CHANNEL, method).await?;
        self.method().await
    }

    /// The next method frame of channel 0, as a connection method.
    async fn connection_method(&mut self) -> Result<ConnectionMethod, TransportError> {
        match self.method().await? {
            AMQPClass::Connection(method) => Ok(method),
            _ => Err(protocol("expected a connection method")),
        }
    }

    /// The next method frame; a `close` from the broker is an error that
    /// carries its reply text.
    async fn method(&mut self) -> Result<AMQPClass, TransportError> {
        let payload = self.frame_of(METHOD).await?;
        let method = match parse_class(payload.as_slice()) {
            Ok((_, method)) => method,
            Err(error) => return Err(protocol(&format!("unreadable method frame: {error}"))),
        };
        match &method {
            AMQPClass::Connection(ConnectionMethod::Close(close)) => Err(closed(
                "connection",
                close.reply_code,
                close.reply_text.as_str(),
            )),
            AMQPClass::Channel(ChannelMethod::Close(close)) => Err(closed(
                "channel",
                close.reply_code,
                close.reply_text.as_str(),
            )),
            _ => Ok(method),
        }
    }

    /// The payload of the next frame, which must be of `kind` (heartbeats
    /// are skipped).
    async fn frame_of(&mut self, kind: u8) -> Result<Vec<u8>, TransportError> {
        loop {
            let (found, payload) = self.read_frame().await?;
            if found == HEARTBEAT {
                continue;
            }
            if found == kind {
                return Ok(payload);
            }
            if found == METHOD
                && let Ok((_, AMQPClass::Connection(ConnectionMethod::Close(close)))) =
                    parse_class(payload.as_slice())
            {
                return Err(closed(
                    "connection",
                    close.reply_code,
                    close.reply_text.as_str(),
                ));
            }
            return Err(protocol(&format!(
                "expected a frame of type {kind}, got one of type {found}"
            )));
        }
    }

    /// One frame: its type and payload. Its size is checked against the
    /// frame limit before anything is allocated.
    async fn read_frame(&mut self) -> Result<(u8, Vec<u8>), TransportError> {
        let mut head = [0u8; 7];
        self.read_exact(&mut head).await?;
        let size = u32::from_be_bytes([head[3], head[4], head[5], head[6]]);
        if size > self.frame_max {
            return Err(protocol(&format!(
                "a frame of {size} bytes, over the limit of {}",
                self.frame_max
            )));
        }
        let mut payload = vec![0u8; size as usize + 1];
        self.read_exact(&mut payload).await?;
        if payload.pop() != Some(FRAME_END) {
            return Err(protocol("a frame without its end marker"));
        }
        Ok((head[0], payload))
    }

    async fn send(&mut self, channel: u16, method: AMQPClass) -> Result<(), TransportError> {
        let payload = gen_class(&method)(Vec::new().into())
            .map_err(|error| protocol(&format!("cannot encode a method: {error:?}")))?
            .write;
        self.frame(METHOD, channel, &payload).await
    }

    async fn frame(
        &mut self,
        kind: u8,
        channel: u16,
        payload: &[u8],
    ) -> Result<(), TransportError> {
        let size =
            u32::try_from(payload.len()).map_err(|_| protocol("a frame payload over 4 GiB"))?;
        let mut frame = Vec::with_capacity(payload.len() + 8);
        frame.push(kind);
        frame.extend_from_slice(&channel.to_be_bytes());
        frame.extend_from_slice(&size.to_be_bytes());
        frame.extend_from_slice(payload);
        frame.push(FRAME_END);
        self.write(&frame).await
    }

    async fn write(&mut self, bytes: &[u8]) -> Result<(), TransportError> {
        match tokio::time::timeout(self.timeout, self.stream.write_all(bytes)).await {
            Ok(result) => result.map_err(io),
            Err(_) => Err(late()),
        }
    }

    async fn read_exact(&mut self, buffer: &mut [u8]) -> Result<(), TransportError> {
        match tokio::time::timeout(self.timeout, self.stream.read_exact(buffer)).await {
            Ok(result) => result.map(drop).map_err(io),
            Err(_) => Err(late()),
        }
    }
}

fn closed(what: &str, code: u16, text: &str) -> TransportError {
    TransportError::Broker(format!("the broker closed the {what}: {code} {text}").into())
}

fn protocol(reason: &str) -> TransportError {
    TransportError::Broker(format!("AMQP protocol: {reason}").into())
}

/// A broker that does not answer in time is busy: no refusal of a message.
fn late() -> TransportError {
    TransportError::Backpressure("the broker did not answer in time".into())
}

fn io(error: std::io::Error) -> TransportError {
    TransportError::Broker(Box::new(error))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Property bytes with only `headers` set: flags, then the table.
    fn headers_only(table: &[u8]) -> Vec<u8> {
        let mut bytes = (1u16 << 13).to_be_bytes().to_vec();
        bytes.extend_from_slice(&(table.len() as u32).to_be_bytes());
        bytes.extend_from_slice(table);
        bytes
    }

    fn message(properties: Vec<u8>) -> RawMessage {
        RawMessage {
            delivery_tag: 1,
            properties,
            body: Vec::new(),
        }
    }

    #[test]
    fn properties_lapin_cannot_parse_are_told_apart_from_readable_ones() {
        // One header `ab` = long string "v".
        let readable = headers_only(b"\x02abS\x00\x00\x00\x01v");
        assert_eq!(message(readable).unreadable(), None);
        // The same with a name that is not UTF-8.
        let name = headers_only(b"\x02\xff\xfeS\x00\x00\x00\x01v");
        let reason = message(name).unreadable().unwrap();
        assert!(reason.contains("cannot be parsed"), "{reason}");
        // A message_id (flag bit 7) that is not UTF-8.
        let mut id = (1u16 << 7).to_be_bytes().to_vec();
        id.extend_from_slice(b"\x02\xff\xfe");
        assert!(message(id).unreadable().is_some());
        // Cut short.
        assert!(message(vec![0x20]).unreadable().is_some());
    }
}
