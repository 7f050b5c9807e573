//! What lapin reads from the broker, checked frame by frame before lapin
//! parses it: a content header whose `headers` table nests deeper than
//! [`MAX_HEADER_DEPTH`] reaches lapin with that table replaced by one entry,
//! [`UNREADABLE_HEADERS`], saying why.
//!
//! lapin parses a field table recursively on its I/O thread, whose stack is
//! the standard 2 MiB: a table nested a few thousand levels deep (a frame of
//! some tens of kilobytes, well within the broker's frame size) exhausts it
//! and aborts the whole process, and the broker hands the same message to
//! the next consumer. The check here walks the table with a loop and a
//! bounded stack of its own, so no frame can reach lapin that makes it
//! recurse more than [`MAX_HEADER_DEPTH`] levels into headers. The
//! transport then dead-letters the delivery by that header, with its body.
//!
//! lapin reads its connection through a stream type of the runtime it is
//! given and offers no hook on what it reads, so the transport gives it a
//! runtime of its own, [`Checked`]: Tokio's in every respect except that its
//! TCP stream, a [`CheckedStream`], runs what it reads through a
//! [`FrameChecker`] before lapin sees it. The check runs in lapin's own
//! reads; what lapin writes goes to the socket as it is.
//!
//! Every other byte passes unchanged and in order: method and body frames
//! are counted through, not buffered; only a content header frame is held
//! until it is whole. A stream that does not look like AMQP frames (a
//! protocol header sent back by a broker that refuses the version, an
//! unknown frame type) is passed through from there on, for lapin to refuse.

use std::future::Future;
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use async_compat::Compat;
use async_rs::traits::{AsyncToSocketAddrs, Executor, Reactor, RuntimeKit};
use async_rs::util::Task;
use async_rs::{Runtime, Tokio};
use futures_core::Stream;
use futures_io::{AsyncRead, AsyncWrite};
use lapin::AsyncTcpStream;
use lapin::uri::AMQPUri;
use tokio::net::TcpStream;

use super::properties::MAX_HEADER_DEPTH;

/// The header a content header carries, in place of its own headers, when
/// they nested deeper than [`MAX_HEADER_DEPTH`]: a long string saying so.
pub(super) const UNREADABLE_HEADERS: &str = "x-babel-idem-unreadable-headers";

const HEADER: u8 = 2;
const FRAME_END: u8 = 0xCE;
/// A frame's type, channel and size.
const FRAME_PREFIX: usize = 7;
/// The largest content header frame held whole; a larger one is beyond any
/// frame size a broker negotiates, and the stream is passed through.
const MAX_HELD_FRAME: usize = 16 * 1024 * 1024;
/// How much is read from the broker at a time.
const READ_CHUNK: usize = 64 * 1024;
/// Bit of the basic class's property flags: `headers` is present.
const HEADERS_FLAG: u16 = 1 << 13;
const CONTENT_TYPE_FLAG: u16 = 1 << 15;
const CONTENT_ENCODING_FLAG: u16 = 1 << 14;
/// Bit 0 of a flags word: another flags word follows.
const MORE_FLAGS: u16 = 1;

/// Tokio's runtime kit for lapin, on the current Tokio runtime, whose TCP
/// streams are [`CheckedStream`]s.
#[derive(Clone, Debug)]
pub(super) struct Checked(Tokio);

impl Checked {
    /// The kit on the Tokio runtime this is called in.
    pub(super) fn current() -> Runtime<Checked> {
        Runtime::new(Checked(Tokio::current()))
    }
}

impl RuntimeKit for Checked {}

impl Executor for Checked {
    type Task<T: Send + 'static> = <Tokio as Executor>::Task<T>;

    fn block_on<T, F: Future<Output = T>>(&self, f: F) -> T {
        self.0.block_on(f)
    }

    fn spawn<T: Send + 'static, F: Future<Output = T> + Send + 'static>(
        &self,
        f: F,
    ) -> Task<Self::Task<T>> {
        self.0.spawn(f)
    }

    fn spawn_blocking<T: Send + 'static, F: FnOnce() -> T + Send + 'static>(
        &self,
        f: F,
    ) -> Task<Self::Task<T>> {
        self.0.spawn_blocking(f)
    }
}

impl Reactor for Checked {
    type TcpStream = CheckedStream<<Tokio as Reactor>::TcpStream>;
    type Sleep = <Tokio as Reactor>::Sleep;

    fn register<H: Read + Write + AsFd + AsRawFd + Send + 'static>(
        &self,
        socket: H,
    ) -> io::Result<impl AsyncRead + AsyncWrite + Send + Unpin + 'static> {
        self.0.register(socket)
    }

    fn sleep(&self, dur: Duration) -> Self::Sleep {
        self.0.sleep(dur)
    }

    fn interval(&self, dur: Duration) -> impl Stream<Item = Instant> + Send + 'static {
        self.0.interval(dur)
    }

    fn tcp_connect<A: AsyncToSocketAddrs + Send>(
        &self,
        addrs: A,
    ) -> impl Future<Output = io::Result<Self::TcpStream>> + Send {
        let connect = self.0.tcp_connect(addrs);
        async move { Ok(CheckedStream::new(connect.await?)) }
    }

    fn tcp_connect_addr(
        &self,
        addr: SocketAddr,
    ) -> impl Future<Output = io::Result<Self::TcpStream>> + Send + 'static {
        let connect = self.0.tcp_connect_addr(addr);
        async move { Ok(CheckedStream::new(connect.await?)) }
    }
}

/// Connects to the broker of `uri`, with Nagle's delay off, for lapin to
/// read through a [`CheckedStream`].
pub(super) async fn connect(
    uri: AMQPUri,
) -> io::Result<AsyncTcpStream<<Checked as Reactor>::TcpStream>> {
    let broker = TcpStream::connect((uri.authority.host.as_str(), uri.authority.port)).await?;
    broker.set_nodelay(true)?;
    Ok(AsyncTcpStream::Plain(CheckedStream::new(Compat::new(
        broker,
    ))))
}

/// A connection to the broker whose reads come through a [`FrameChecker`]
/// and whose writes go straight to the socket.
///
/// Invariant: a read answers only bytes the checker released, in order; it
/// returns `Pending` only when the socket did, so lapin is woken by the
/// socket when more arrives.
pub(super) struct CheckedStream<S> {
    inner: S,
    checker: FrameChecker,
    chunk: Box<[u8]>,
    /// The broker closed its side: once the released bytes are read, the
    /// stream ends.
    ended: bool,
}

impl<S> CheckedStream<S> {
    fn new(inner: S) -> Self {
        CheckedStream {
            inner,
            checker: FrameChecker::default(),
            chunk: vec![0; READ_CHUNK].into_boxed_slice(),
            ended: false,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for CheckedStream<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        loop {
            let released = this.checker.released();
            if !released.is_empty() || buf.is_empty() {
                let n = released.len().min(buf.len());
                buf[..n].copy_from_slice(&released[..n]);
                this.checker.consume(n);
                return Poll::Ready(Ok(n));
            }
            if this.ended {
                return Poll::Ready(Ok(0));
            }
            match Pin::new(&mut this.inner).poll_read(cx, &mut this.chunk) {
                Poll::Ready(Ok(0)) => {
                    this.ended = true;
                    this.checker.finish();
                }
                Poll::Ready(Ok(n)) => this.checker.push(&this.chunk[..n]),
                Poll::Ready(Err(error)) => return Poll::Ready(Err(error)),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for CheckedStream<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_close(cx)
    }
}

/// What the broker sent, checked frame by frame (see the module's docs):
/// bytes go in with [`push`](Self::push) and come out, in order, from
/// [`released`](Self::released) once they may be read.
#[derive(Default)]
pub(super) struct FrameChecker {
    /// Bytes pushed and not yet consumed; the first `released` of them may
    /// be read.
    buffer: Vec<u8>,
    released: usize,
    /// Bytes of the current method or body frame (its payload and end)
    /// not yet released: they pass without a look.
    passing: usize,
    /// The stream stopped looking like frames: everything passes.
    bypass: bool,
    /// The broker closed its side; what is buffered is released as is.
    finished: bool,
}

impl FrameChecker {
    /// Adds what the broker sent next.
    pub(super) fn push(&mut self, bytes: &[u8]) {
        self.buffer.extend_from_slice(bytes);
        self.release();
    }

    /// The broker sent its last byte: whatever is held is released.
    pub(super) fn finish(&mut self) {
        self.finished = true;
        self.release();
    }

    /// What may be read now.
    pub(super) fn released(&self) -> &[u8] {
        &self.buffer[..self.released]
    }

    /// Drops what [`released`](Self::released) gave.
    #[cfg(test)]
    pub(super) fn consume_released(&mut self) {
        self.consume(self.released);
    }

    /// Drops the first `n` bytes of what [`released`](Self::released) gave.
    pub(super) fn consume(&mut self, n: usize) {
        let n = n.min(self.released);
        self.buffer.drain(..n);
        self.released -= n;
    }

    /// Releases what can be read now: whole frames, and of a method or
    /// body frame whatever has arrived; a content header only once whole
    /// and checked.
    fn release(&mut self) {
        loop {
            let cursor = self.released;
            let available = self.buffer.len() - cursor;
            if available == 0 {
                return;
            }
            if self.bypass || self.finished {
                self.released += available;
                return;
            }
            if self.passing > 0 {
                let take = self.passing.min(available);
                self.released += take;
                self.passing -= take;
                continue;
            }
            if available < FRAME_PREFIX {
                return;
            }
            let prefix = &self.buffer[cursor..cursor + FRAME_PREFIX];
            let kind = prefix[0];
            let size = u32::from_be_bytes([prefix[3], prefix[4], prefix[5], prefix[6]]) as usize;
            let whole = FRAME_PREFIX + size + 1;
            if !matches!(kind, 1 | 2 | 3 | 8) || whole > MAX_HELD_FRAME {
                self.bypass = true;
                continue;
            }
            if kind != HEADER {
                self.passing = whole;
                continue;
            }
            if available < whole {
                return;
            }
            // A content header's payload: class id, weight and body size
            // (12 bytes), then the properties.
            let properties = cursor + FRAME_PREFIX + 12..cursor + FRAME_PREFIX + size;
            let deep = self
                .buffer
                .get(properties)
                .and_then(too_deep_headers)
                .map(|table| table.start + 12..table.end + 12);
            match deep {
                Some(table) => {
                    let frame = rewritten(&self.buffer[cursor..cursor + whole], table);
                    let length = frame.len();
                    self.buffer.splice(cursor..cursor + whole, frame);
                    self.released += length;
                }
                None => self.released += whole,
            }
        }
    }
}

/// Where the `headers` table (its length field included) sits in a basic
/// content header's property bytes (the flags, then the properties), when
/// it nests tables or arrays deeper than [`MAX_HEADER_DEPTH`]. Bytes this
/// walk cannot follow are left to lapin, which refuses them without
/// recursing past what it read.
pub(super) fn too_deep_headers(properties: &[u8]) -> Option<std::ops::Range<usize>> {
    let payload = properties;
    let flags = u16::from_be_bytes([*payload.first()?, *payload.get(1)?]);
    if flags & HEADERS_FLAG == 0 || flags & MORE_FLAGS != 0 {
        return None;
    }
    let mut at = 2;
    for flag in [CONTENT_TYPE_FLAG, CONTENT_ENCODING_FLAG] {
        if flags & flag != 0 {
            at += 1 + usize::from(*payload.get(at)?);
        }
    }
    let length = read_u32(payload, at)?;
    let table = at..at + 4 + length;
    let fields = payload.get(at + 4..table.end)?;
    nests_deeper_than(fields, MAX_HEADER_DEPTH).then_some(table)
}

/// Whether the fields of a table (its bytes after the length) nest tables
/// or arrays more than `limit` levels deep. Walks with a stack of where each
/// open table or array ends, which never holds more than `limit + 1`
/// entries; `false` for bytes it cannot follow.
pub(super) fn nests_deeper_than(fields: &[u8], limit: usize) -> bool {
    // (where it ends, whether it is an array: values without names)
    let mut open: Vec<(usize, bool)> = vec![(fields.len(), false)];
    let mut at = 0;
    loop {
        while let Some(&(end, _)) = open.last() {
            if at < end {
                break;
            }
            if at > end {
                return false;
            }
            open.pop();
        }
        let Some(&(_, array)) = open.last() else {
            return false;
        };
        if !array {
            let Some(&name) = fields.get(at) else {
                return false;
            };
            at += 1 + usize::from(name);
        }
        let Some(&kind) = fields.get(at) else {
            return false;
        };
        at += 1;
        let skip = match kind {
            b'F' | b'A' => {
                let Some(length) = read_u32(fields, at) else {
                    return false;
                };
                at += 4;
                open.push((at + length, kind == b'A'));
                if open.len() > limit + 1 {
                    return true;
                }
                continue;
            }
            b't' | b'b' | b'B' => 1,
            b's' | b'U' | b'u' => 2,
            b'I' | b'i' | b'f' => 4,
            b'l' | b'L' | b'd' | b'T' => 8,
            b'D' => 5,
            b'S' | b'x' => match read_u32(fields, at) {
                Some(length) => 4 + length,
                None => return false,
            },
            b'V' => 0,
            _ => return false,
        };
        at += skip;
    }
}

fn read_u32(bytes: &[u8], at: usize) -> Option<usize> {
    let word = bytes.get(at..at + 4)?;
    Some(u32::from_be_bytes([word[0], word[1], word[2], word[3]]) as usize)
}

/// `frame` (a whole content header frame) with the headers table at
/// `table` (within its payload) replaced by one saying why.
fn rewritten(frame: &[u8], table: std::ops::Range<usize>) -> Vec<u8> {
    let payload = &frame[FRAME_PREFIX..frame.len() - 1];
    let reason = format!("its headers nest tables or arrays deeper than {MAX_HEADER_DEPTH}");
    let mut entry = Vec::with_capacity(UNREADABLE_HEADERS.len() + reason.len() + 6);
    entry.push(UNREADABLE_HEADERS.len() as u8);
    entry.extend_from_slice(UNREADABLE_HEADERS.as_bytes());
    entry.push(b'S');
    entry.extend_from_slice(&(reason.len() as u32).to_be_bytes());
    entry.extend_from_slice(reason.as_bytes());

    let mut new_payload = Vec::with_capacity(payload.len());
    new_payload.extend_from_slice(&payload[..table.start]);
    new_payload.extend_from_slice(&(entry.len() as u32).to_be_bytes());
    new_payload.extend_from_slice(&entry);
    new_payload.extend_from_slice(&payload[table.end..]);

    let mut out = Vec::with_capacity(FRAME_PREFIX + new_payload.len() + 1);
    out.extend_from_slice(&frame[..3]);
    out.extend_from_slice(&(new_payload.len() as u32).to_be_bytes());
    out.extend_from_slice(&new_payload);
    out.push(FRAME_END);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use lapin::BasicProperties;
    use lapin::protocol::basic;
    use lapin::types::{AMQPValue, FieldTable};

    /// The fields (after the length) of a table holding one value nested
    /// `depth` tables deep, written by hand: no recursion, any depth.
    fn nested_fields(depth: usize) -> Vec<u8> {
        // Innermost first: a long string, then each level wraps the last.
        let mut value = vec![b'S', 0, 0, 0, 6];
        value.extend_from_slice(b"bottom");
        for _ in 0..depth {
            let mut field = vec![1, b'n'];
            field.extend_from_slice(&value);
            let mut table = vec![b'F'];
            table.extend_from_slice(&(field.len() as u32).to_be_bytes());
            table.extend_from_slice(&field);
            value = table;
        }
        let mut fields = vec![4];
        fields.extend_from_slice(b"deep");
        fields.extend_from_slice(&value);
        fields
    }

    /// A whole content header frame on channel 1 with a content type and
    /// the given headers table fields.
    fn header_frame(fields: &[u8]) -> Vec<u8> {
        let mut payload = Vec::new();
        payload.extend_from_slice(&60u16.to_be_bytes());
        payload.extend_from_slice(&0u16.to_be_bytes());
        payload.extend_from_slice(&5u64.to_be_bytes());
        payload.extend_from_slice(&(CONTENT_TYPE_FLAG | HEADERS_FLAG).to_be_bytes());
        payload.push(16);
        payload.extend_from_slice(b"application/json");
        payload.extend_from_slice(&(fields.len() as u32).to_be_bytes());
        payload.extend_from_slice(fields);
        let mut frame = vec![HEADER, 0, 1];
        frame.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        frame.extend_from_slice(&payload);
        frame.push(FRAME_END);
        frame
    }

    fn body_frame(body: &[u8]) -> Vec<u8> {
        let mut frame = vec![3, 0, 1];
        frame.extend_from_slice(&(body.len() as u32).to_be_bytes());
        frame.extend_from_slice(body);
        frame.push(FRAME_END);
        frame
    }

    /// What a checker releases when the broker's bytes arrive in pieces
    /// of `chunk` bytes.
    fn through_guard(input: &[u8], chunk: usize) -> Vec<u8> {
        let mut checker = FrameChecker::default();
        let mut out = Vec::new();
        for piece in input.chunks(chunk) {
            checker.push(piece);
            out.extend_from_slice(checker.released());
            checker.consume_released();
        }
        checker.finish();
        out.extend_from_slice(checker.released());
        out
    }

    fn properties_of(frame: &[u8]) -> BasicProperties {
        let payload = &frame[FRAME_PREFIX + 12..frame.len() - 1];
        basic::parse_properties(payload).unwrap().1
    }

    #[test]
    fn frames_within_the_depth_limit_pass_byte_for_byte_however_they_are_split() {
        let mut input = Vec::new();
        input.extend_from_slice(&[1, 0, 1, 0, 0, 0, 2, 0, 60, FRAME_END]);
        input.extend_from_slice(&header_frame(&nested_fields(MAX_HEADER_DEPTH - 1)));
        input.extend_from_slice(&body_frame(b"hello"));
        input.extend_from_slice(&[8, 0, 0, 0, 0, 0, 0, FRAME_END]);
        for chunk in [1, 2, 7, 8, 100, 4096] {
            assert_eq!(
                through_guard(&input, chunk),
                input,
                "reads of {chunk} bytes"
            );
        }
    }

    /// A broker side that answers each read with the next of `pieces`,
    /// then the end of the stream.
    struct Pieces(std::collections::VecDeque<Vec<u8>>);

    impl AsyncRead for Pieces {
        fn poll_read(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &mut [u8],
        ) -> Poll<io::Result<usize>> {
            let Some(mut piece) = self.get_mut().0.pop_front() else {
                return Poll::Ready(Ok(0));
            };
            let n = piece.len().min(buf.len());
            buf[..n].copy_from_slice(&piece[..n]);
            piece.drain(..n);
            Poll::Ready(Ok(n))
        }
    }

    /// Everything `stream` gives to reads of at most `read` bytes.
    fn read_all(mut stream: CheckedStream<Pieces>, read: usize) -> Vec<u8> {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let (mut out, mut buf) = (Vec::new(), vec![0; read]);
        loop {
            match Pin::new(&mut stream).poll_read(&mut cx, &mut buf) {
                Poll::Ready(Ok(0)) => return out,
                Poll::Ready(Ok(n)) => out.extend_from_slice(&buf[..n]),
                other => panic!("a read of pieces in memory answered {other:?}"),
            }
        }
    }

    #[test]
    fn a_checked_stream_gives_lapins_reads_the_checked_bytes_in_order_whatever_their_size() {
        let mut input = Vec::new();
        input.extend_from_slice(&[1, 0, 1, 0, 0, 0, 2, 0, 60, FRAME_END]);
        input.extend_from_slice(&header_frame(&nested_fields(MAX_HEADER_DEPTH + 5)));
        input.extend_from_slice(&body_frame(b"hello"));
        let expected = through_guard(&input, input.len());
        assert_ne!(expected, input, "the deep header is rewritten");
        for (piece, read) in [(1, 1), (3, 2), (7, 100), (100, 3), (4096, 4096)] {
            let pieces = input.chunks(piece).map(<[u8]>::to_vec).collect();
            assert_eq!(
                read_all(CheckedStream::new(Pieces(pieces)), read),
                expected,
                "pieces of {piece} bytes, reads of {read}"
            );
        }
    }

    #[test]
    fn headers_nested_beyond_the_limit_reach_lapin_as_one_header_saying_why() {
        let deep = header_frame(&nested_fields(20_000));
        let body = body_frame(b"hello");
        let mut input = deep.clone();
        input.extend_from_slice(&body);
        for chunk in [1, 3, 64 * 1024] {
            let out = through_guard(&input, chunk);
            assert!(out.ends_with(&body), "the body frame follows untouched");
            let header = &out[..out.len() - body.len()];
            let size = u32::from_be_bytes([header[3], header[4], header[5], header[6]]) as usize;
            assert_eq!(header.len(), FRAME_PREFIX + size + 1);
            let properties = properties_of(header);
            assert_eq!(
                properties.content_type().as_ref().unwrap().as_str(),
                "application/json"
            );
            let headers = properties.headers().as_ref().unwrap().inner();
            assert_eq!(headers.len(), 1, "{headers:?}");
            let Some(AMQPValue::LongString(why)) = headers.get(UNREADABLE_HEADERS) else {
                panic!("{headers:?}");
            };
            assert!(why.to_string().contains("deeper than 16"), "{why}");
        }
    }

    #[test]
    fn the_depth_walk_agrees_with_lapins_own_tables() {
        for depth in [0, 1, MAX_HEADER_DEPTH, MAX_HEADER_DEPTH + 1, 40] {
            let mut value = AMQPValue::LongString("bottom".into());
            for level in 0..depth {
                if level % 2 == 0 {
                    let mut table = FieldTable::default();
                    table.insert("n".into(), value);
                    table.insert("i".into(), AMQPValue::LongLongInt(7));
                    value = AMQPValue::FieldTable(table);
                } else {
                    value = AMQPValue::FieldArray(vec![AMQPValue::Boolean(true), value].into());
                }
            }
            let mut headers = FieldTable::default();
            headers.insert("deep".into(), value);
            let properties = BasicProperties::default().with_headers(headers);
            let bytes = basic::gen_properties(&properties)(Vec::new().into())
                .unwrap()
                .write;
            // flags word, then the table's length, then its fields.
            let fields = &bytes[2 + 4..];
            assert_eq!(
                nests_deeper_than(fields, MAX_HEADER_DEPTH),
                depth > MAX_HEADER_DEPTH,
                "depth {depth}"
            );
        }
    }

    #[test]
    fn a_stream_that_is_not_frames_passes_untouched() {
        let input = b"AMQP\x00\x00\x09\x01 and then anything at all".to_vec();
        assert_eq!(through_guard(&input, 5), input);
    }
}
