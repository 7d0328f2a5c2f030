//! tokentap's own HTTP/1.1 client side for upstream connections, plain or TLS: writes a request,
//! reads its response head, and decodes the response body frame by frame from one read buffer.
//!
//! Why not hyper's `client::conn::http1`: its dispatcher keeps a request channel, a write buffer
//! and a read buffer per connection (about 25 KB while a stream waits for tokens) and runs a
//! state machine of its own per event beside the server's; an LLM stream is one request at a
//! time on a connection and one chunk per event, so what it needs is small. The server side
//! stays hyper's. What this module does is what RFC 9112 asks of a client, and no more:
//!
//! - the request is written as the proxy built it (hop-by-hop headers already removed), framed
//!   by its `Content-Length`, else by the body's exact length, else chunked;
//! - the response head is parsed by `httparse` (hyper's own parser); informational answers
//!   (1xx) are skipped; the body is framed per RFC 9112 §6.3: none for `HEAD`, 204 and 304,
//!   `Transfer-Encoding` (chunked, or read to the close), `Content-Length` (every value equal),
//!   else read to the close;
//! - chunked bodies are decoded strictly (hex sizes with CRLF, extensions ignored, trailers
//!   passed on as a trailers frame);
//! - each data frame is a slice of the read buffer (`split_to`), handed on without a copy, so
//!   an event costs no allocation: the buffer is reclaimed in place once the frames handed out
//!   before were dropped (the server side copies each into its write buffer).
//!
//! A connection is reusable only after a response read exactly to its end, with nothing more
//! in the buffer, from a server that did not say `close`.
//!
//! Over TLS ([`UpstreamStream::Tls`]) two things change meaning. What "entered the socket" means
//! for never sending a request twice: plaintext rustls took counts as sent (it is on its way
//! out), unless the very write that handed it over failed before a byte reached the socket.
//! And what the idle check sees: bytes on an idle TLS socket may be a session ticket (TLS 1.3
//! servers send them after the handshake) or a `close_notify`, not stray plaintext, so they are
//! read into rustls, without blocking, and judged by what they decrypt to.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use http::header::{HeaderName, HeaderValue, CONNECTION, CONTENT_LENGTH, TRANSFER_ENCODING};
use http::{HeaderMap, Method, Request, Response, StatusCode, Version};
use http_body::{Body, Frame, SizeHint};
use rustls::pki_types::ServerName;
use rustls::ClientConnection;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::OwnedSemaphorePermit;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;
use tokio_util::io::poll_read_buf;

use super::box_error::BoxError;
use super::request_body::RequestBody;

/// The most header fields a response head (or a trailer block) may have, as in hyper.
const MAX_HEADERS: usize = 100;
/// What the read buffer starts with: a response head, or a few SSE events (a held stream
/// keeps it while it waits for its next token; reads that fill it double it, up to
/// `proxy.max_stream_buffer`).
const INITIAL_READ: usize = 1024;
/// Below this much free room the buffer is reclaimed (or grown) before the next read.
const MIN_SPARE: usize = 256;
/// The longest chunk-size line (size and extensions) accepted.
const MAX_CHUNK_LINE: usize = 4096;

/// What went wrong on an upstream connection.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error("the upstream closed the connection before answering")]
    ClosedBeforeAnswer,
    #[error("the upstream closed the connection in the middle of the response head")]
    ClosedInHead,
    #[error("the upstream closed the connection {missing} bytes before the end of the body")]
    ClosedInBody { missing: u64 },
    #[error("the upstream closed the connection in the middle of a chunked body")]
    ClosedInChunk,
    #[error("the upstream's response head is malformed: {0}")]
    MalformedHead(httparse::Error),
    #[error("the upstream's response head is over {limit} bytes (proxy.max_stream_buffer)")]
    HeadTooLarge { limit: usize },
    #[error("the upstream sent an invalid Content-Length")]
    InvalidContentLength,
    #[error("the upstream answered 101 Switching Protocols, which tokentap does not relay")]
    SwitchedProtocols,
    #[error("the upstream's chunked body is malformed ({0})")]
    MalformedChunk(&'static str),
    #[error("the request body has {declared} bytes by its Content-Length but {sent} were sent")]
    RequestBodyLength { declared: u64, sent: u64 },
    #[error("the request body failed")]
    RequestBody(#[source] BoxError),
    #[error("upstream connection: {0}")]
    Io(#[from] io::Error),
}

impl RelayError {
    /// The upstream ended the connection before sending a byte of an answer: on a reused
    /// connection, the server closed it while it sat idle (the request may be sent again).
    pub fn closed_unanswered(&self) -> bool {
        match self {
            RelayError::ClosedBeforeAnswer => true,
            // `UnexpectedEof`: a TLS server that closed the socket without `close_notify`.
            RelayError::Io(error) => matches!(
                error.kind(),
                io::ErrorKind::ConnectionReset
                    | io::ErrorKind::BrokenPipe
                    | io::ErrorKind::ConnectionAborted
                    | io::ErrorKind::UnexpectedEof
            ),
            _ => false,
        }
    }
}

/// One upstream connection (TCP, or TLS over it), its read buffer, and the `max_connections`
/// slot it holds.
pub struct Connection {
    stream: UpstreamStream,
    buf: BytesMut,
    /// What the next read reserves room for (doubles, up to `max_buf`, while reads fill it).
    next_read: usize,
    /// The most the buffer holds unparsed: the response head limit and the read-ahead bound.
    max_buf: usize,
    _slot: OwnedSemaphorePermit,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("buffered", &self.buf.len())
            .finish()
    }
}

impl Connection {
    pub fn new(stream: UpstreamStream, max_buf: usize, slot: OwnedSemaphorePermit) -> Self {
        Self {
            stream,
            buf: BytesMut::new(),
            next_read: INITIAL_READ.min(max_buf.max(MIN_SPARE)),
            max_buf: max_buf.max(INITIAL_READ),
            _slot: slot,
        }
    }

    /// What an idle connection holds now: nothing (it can serve another request), a close, or
    /// bytes nobody asked for. Asked of the socket itself with a non-blocking peek, not of
    /// tokio's cached readiness: nobody polls an idle connection, so a close or stray bytes
    /// that arrived since its last read may not have reached the reactor's readiness yet, and
    /// `try_read` would answer "would block" without asking the kernel. Over TLS, what arrived
    /// is read into rustls and judged by what it decrypts to (`TlsUpstream::idle_state`).
    pub fn idle_state(&mut self) -> IdleState {
        if !self.buf.is_empty() {
            return IdleState::Stray;
        }
        match &mut self.stream {
            UpstreamStream::Plain(stream) => peek_socket(stream),
            UpstreamStream::Tls(tls) => tls.idle_state(),
        }
    }

    /// Drops the read buffer when it is empty: a connection idle in the pool, or a stream
    /// waiting for its first token after the head, holds no memory for it (the next read
    /// allocates it again: once per response, not per event).
    pub fn drop_empty_buffer(&mut self) {
        if self.buf.is_empty() {
            self.buf = BytesMut::new();
        }
    }

    /// Writes what it can of `request`: `Ready(Ok)` once all of it is out.
    pub fn poll_write(
        &mut self,
        request: &mut Outgoing,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), RelayError>> {
        request.poll_write(&mut self.stream, cx)
    }

    /// Reads what the socket has into the buffer: the bytes read, 0 at the end of the stream.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        let spare = self.buf.capacity() - self.buf.len();
        if spare < MIN_SPARE {
            // Unique (every frame handed out before was dropped) and mostly consumed, the
            // allocation is taken back in place; otherwise a new one is made.
            let room = self.next_read.saturating_sub(self.buf.len()).max(MIN_SPARE);
            self.buf.reserve(room);
        }
        let spare = self.buf.capacity() - self.buf.len();
        let read = ready!(self.stream.poll_read_buf(cx, &mut self.buf))?;
        if read == spare && self.next_read < self.max_buf {
            self.next_read = (self.next_read * 2).min(self.max_buf);
        }
        Poll::Ready(Ok(read))
    }

    /// Reads the response head (skipping 1xx answers); `request_method` decides the framing.
    pub fn poll_head(
        &mut self,
        cx: &mut Context<'_>,
        request_method: &Method,
        received: &mut bool,
    ) -> Poll<Result<FinalHead, RelayError>> {
        loop {
            if !self.buf.is_empty() {
                *received = true;
                match parse_head(&self.buf, request_method)? {
                    Some((length, head)) => {
                        self.buf.advance(length);
                        match head {
                            Head::Informational => continue,
                            Head::Final(head) => return Poll::Ready(Ok(head)),
                        }
                    }
                    None if self.buf.len() >= self.max_buf => {
                        return Poll::Ready(Err(RelayError::HeadTooLarge {
                            limit: self.max_buf,
                        }));
                    }
                    None => {}
                }
            }
            let read = match ready!(self.poll_fill(cx)) {
                Ok(read) => read,
                // A TLS server that closed without `close_notify`: before an answer was
                // complete, that is a close all the same (in a body it stays an error: a body
                // read to the close cannot tell it from a cut).
                Err(error) if error.kind() == io::ErrorKind::UnexpectedEof => 0,
                Err(error) => return Poll::Ready(Err(error.into())),
            };
            if read == 0 {
                return Poll::Ready(Err(if *received {
                    RelayError::ClosedInHead
                } else {
                    RelayError::ClosedBeforeAnswer
                }));
            }
        }
    }

    /// The next frame of the body `decoder` frames; `None` at its end.
    pub fn poll_body(
        &mut self,
        cx: &mut Context<'_>,
        decoder: &mut Decoder,
    ) -> Poll<Option<Result<Frame<Bytes>, RelayError>>> {
        loop {
            match decoder.decode(&mut self.buf, self.max_buf) {
                Ok(Decoded::Frame(frame)) => return Poll::Ready(Some(Ok(frame))),
                Ok(Decoded::End) => return Poll::Ready(None),
                Ok(Decoded::More) => {}
                Err(error) => return Poll::Ready(Some(Err(error))),
            }
            match ready!(self.poll_fill(cx)) {
                Ok(0) => {
                    return match decoder.closed() {
                        Ok(()) => Poll::Ready(None),
                        Err(error) => Poll::Ready(Some(Err(error))),
                    }
                }
                Ok(_) => {}
                Err(error) => return Poll::Ready(Some(Err(error.into()))),
            }
        }
    }
}

/// What a look at an idle connection's socket found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdleState {
    /// Open, nothing to read: it can carry another request.
    Clean,
    /// The server closed (or reset) it.
    Closed,
    /// Bytes arrived that belong to no request: the server sent more than its last answer's
    /// framing said. Whatever they are, they must never be read as another request's answer.
    Stray,
}

/// A non-blocking `recv(MSG_PEEK)` of one byte: a system call every time, whatever tokio's
/// readiness says.
#[cfg(unix)]
fn peek_socket(stream: &TcpStream) -> IdleState {
    use rustix::io::Errno;
    use rustix::net::{recv, RecvFlags};
    let mut probe = [0u8; 1];
    match recv(stream, &mut probe, RecvFlags::PEEK | RecvFlags::DONTWAIT) {
        Ok((_, 0)) => IdleState::Closed,
        Ok(_) => IdleState::Stray,
        Err(Errno::AGAIN) => IdleState::Clean,
        // Reset, or anything else: not a connection to trust with a request.
        Err(_) => IdleState::Closed,
    }
}

/// Elsewhere, tokio's peek (readiness as the reactor last saw it).
#[cfg(not(unix))]
fn peek_socket(stream: &TcpStream) -> IdleState {
    let mut probe = [0u8; 1];
    match stream.try_read(&mut probe) {
        Ok(0) => IdleState::Closed,
        Ok(_) => IdleState::Stray,
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => IdleState::Clean,
        Err(_) => IdleState::Closed,
    }
}

/// The socket under an upstream connection: plain TCP, or TLS over it (boxed: a rustls
/// session is over a kilobyte, and a plain connection should not carry that room).
pub enum UpstreamStream {
    Plain(TcpStream),
    Tls(Box<TlsUpstream>),
}

impl UpstreamStream {
    /// Opens TLS over `socket` (ALPN, SNI and trust as `connector`'s configuration says); the
    /// caller bounds the wait.
    pub async fn handshake(
        socket: TcpStream,
        connector: &TlsConnector,
        server_name: ServerName<'static>,
    ) -> io::Result<Self> {
        let stream = connector
            .connect(server_name, RecordCounted::new(socket))
            .await?;
        Ok(Self::Tls(Box::new(TlsUpstream {
            stream,
            write_error: None,
        })))
    }

    /// Reads what the socket has (plaintext, over TLS) into `buf`: the bytes read, 0 at the end.
    fn poll_read_buf(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut BytesMut,
    ) -> Poll<io::Result<usize>> {
        // Through `AsyncRead::poll_read`, not `try_read_buf`: tokio takes a read shorter than
        // the room given as the socket drained and waits for the next readiness, where
        // `try_read_buf` would try once more and pay a `recvfrom` answering EAGAIN per event.
        match self {
            UpstreamStream::Plain(stream) => poll_read_buf(Pin::new(stream), cx, buf),
            UpstreamStream::Tls(tls) => poll_read_buf(Pin::new(&mut tls.stream), cx, buf),
        }
    }

    /// Writes what it can of `slices`: how many bytes were taken (over TLS, by rustls, and sent
    /// on as far as the socket takes them).
    fn poll_write_vectored(
        &mut self,
        cx: &mut Context<'_>,
        slices: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self {
            UpstreamStream::Plain(stream) => Pin::new(stream).poll_write_vectored(cx, slices),
            UpstreamStream::Tls(tls) => tls.poll_write_vectored(cx, slices),
        }
    }

    /// Sends what was taken and is still held (TLS records rustls has not handed to the socket).
    fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self {
            UpstreamStream::Plain(_) => Poll::Ready(Ok(())),
            UpstreamStream::Tls(tls) => tls.poll_flush(cx),
        }
    }
}

/// A TLS connection to an upstream. Reads go through tokio-rustls; writes are tokentap's own
/// (rustls's writer, then its records to the socket) so that it knows whether any byte of a
/// request reached the socket before a write failed.
pub struct TlsUpstream {
    stream: TlsStream<RecordCounted>,
    /// A socket write that failed after rustls had taken plaintext and a first byte of its
    /// records went out: the plaintext counted as sent, the error comes with the next write.
    write_error: Option<io::Error>,
}

impl TlsUpstream {
    fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let Some(error) = self.write_error.take() {
            return Poll::Ready(Err(error));
        }
        let (socket, session) = self.stream.get_mut();
        let mut sent = false;
        send_records(&mut socket.socket, session, cx, &mut sent)
    }

    fn poll_write_vectored(
        &mut self,
        cx: &mut Context<'_>,
        slices: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        // What earlier writes left in rustls goes first: it holds one write's records at most.
        ready!(self.poll_flush(cx))?;
        let (socket, session) = self.stream.get_mut();
        let taken = io::Write::write_vectored(&mut session.writer(), slices)?;
        let mut sent = false;
        match send_records(&mut socket.socket, session, cx, &mut sent) {
            Poll::Ready(Ok(())) | Poll::Pending => Poll::Ready(Ok(taken)),
            // Some of its records reached the socket: the server may have the request.
            Poll::Ready(Err(error)) if sent && taken > 0 => {
                self.write_error = Some(error);
                Poll::Ready(Ok(taken))
            }
            // Not a byte went: as if rustls had never taken it.
            Poll::Ready(Err(error)) => Poll::Ready(Err(error)),
        }
    }

    /// What an idle TLS connection holds. The raw socket is read without blocking (a
    /// non-blocking `recv`, as the plain peek) and what came is fed to rustls: plaintext is
    /// stray bytes; a `close_notify`, the end of the socket or any error is a close; records
    /// that decrypt to nothing for the reader (session tickets, key updates) leave it clean. A
    /// record not yet whole cannot be judged, and is not trusted: stray.
    fn idle_state(&mut self) -> IdleState {
        let (socket, session) = self.stream.get_mut();
        let mut chunk = [0u8; 2048];
        let (mut fed, mut received) = (0, 0);
        loop {
            match session.process_new_packets() {
                Err(_) => return IdleState::Closed,
                Ok(io) if io.plaintext_bytes_to_read() > 0 => return IdleState::Stray,
                Ok(io) if io.peer_has_closed() => return IdleState::Closed,
                Ok(_) => {}
            }
            if fed == received {
                match receive_now(&socket.socket, &mut chunk) {
                    Received::Bytes(read) => {
                        socket.framing.count(&chunk[..read]);
                        (fed, received) = (0, read);
                    }
                    Received::Nothing if socket.framing.mid_record() => return IdleState::Stray,
                    Received::Nothing => return IdleState::Clean,
                    Received::End | Received::Failed => return IdleState::Closed,
                }
            }
            let mut rest = &chunk[fed..received];
            match session.read_tls(&mut rest) {
                Ok(0) | Err(_) => return IdleState::Closed,
                Ok(taken) => fed += taken,
            }
        }
    }
}

/// Hands rustls's pending records to the socket until none are left; `sent` turns true once
/// a byte went.
fn send_records(
    socket: &mut TcpStream,
    session: &mut ClientConnection,
    cx: &mut Context<'_>,
    sent: &mut bool,
) -> Poll<io::Result<()>> {
    while session.wants_write() {
        let mut writer = SocketWriter { socket, cx };
        match session.write_tls(&mut writer) {
            Ok(0) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
            Ok(_) => *sent = true,
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => return Poll::Pending,
            Err(error) => return Poll::Ready(Err(error)),
        }
    }
    Poll::Ready(Ok(()))
}

/// The socket as a `std::io::Write` for rustls: "would block" registers the task's waker.
struct SocketWriter<'a, 'b> {
    socket: &'a mut TcpStream,
    cx: &'a mut Context<'b>,
}

impl io::Write for SocketWriter<'_, '_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match Pin::new(&mut *self.socket).poll_write(self.cx, buf) {
            Poll::Ready(result) => result,
            Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
        }
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match Pin::new(&mut *self.socket).poll_write_vectored(self.cx, bufs) {
            Poll::Ready(result) => result,
            Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The TCP socket under a TLS connection, counting where the bytes read from it stand in
/// their TLS records, so that the idle check knows whether rustls holds half a record that
/// nothing can judge yet (rustls does not say).
struct RecordCounted {
    socket: TcpStream,
    framing: RecordFraming,
}

impl RecordCounted {
    fn new(socket: TcpStream) -> Self {
        Self {
            socket,
            framing: RecordFraming::default(),
        }
    }
}

impl AsyncRead for RecordCounted {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.socket).poll_read(cx, buf))?;
        this.framing.count(&buf.filled()[before..]);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for RecordCounted {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().socket).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().socket).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.socket.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().socket).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().socket).poll_shutdown(cx)
    }
}

/// Where a byte stream stands in TLS record framing (RFC 8446 §5.1: five header bytes, the
/// last two the length of what follows). A few steps per record, none per byte of its body.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct RecordFraming {
    /// Header bytes of the current record seen so far (0: at a record boundary or in a body).
    header_seen: u8,
    /// The high byte of the length, once the header's fourth byte was seen.
    length_high: u8,
    /// Body bytes of the current record still to come.
    body_left: usize,
}

/// The TLS record header's length.
const RECORD_HEADER: u8 = 5;

impl RecordFraming {
    fn count(&mut self, mut bytes: &[u8]) {
        while let Some((&first, rest)) = bytes.split_first() {
            if self.body_left > 0 {
                let skip = self.body_left.min(bytes.len());
                self.body_left -= skip;
                bytes = &bytes[skip..];
                continue;
            }
            match self.header_seen {
                3 => self.length_high = first,
                4 => self.body_left = usize::from(u16::from_be_bytes([self.length_high, first])),
                _ => {}
            }
            self.header_seen = (self.header_seen + 1) % RECORD_HEADER;
            bytes = rest;
        }
    }

    /// Some of a record arrived, not all of it.
    fn mid_record(&self) -> bool {
        self.header_seen > 0 || self.body_left > 0
    }
}

/// What a non-blocking read of an idle socket got.
enum Received {
    Bytes(usize),
    /// Nothing there now.
    Nothing,
    /// The server closed its side.
    End,
    /// Reset, or anything else.
    Failed,
}

/// A non-blocking `recv`: a system call every time, whatever tokio's readiness says (tokio
/// learns of what it took at its next read, which answers "would block" and waits again).
#[cfg(unix)]
fn receive_now(socket: &TcpStream, buf: &mut [u8]) -> Received {
    use rustix::io::Errno;
    use rustix::net::{recv, RecvFlags};
    match recv(socket, buf, RecvFlags::DONTWAIT) {
        Ok((_, 0)) => Received::End,
        Ok((read, _)) => Received::Bytes(read),
        Err(Errno::AGAIN) => Received::Nothing,
        Err(_) => Received::Failed,
    }
}

/// Elsewhere, tokio's read (readiness as the reactor last saw it).
#[cfg(not(unix))]
fn receive_now(socket: &TcpStream, buf: &mut [u8]) -> Received {
    match socket.try_read(buf) {
        Ok(0) => Received::End,
        Ok(read) => Received::Bytes(read),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Received::Nothing,
        Err(_) => Received::Failed,
    }
}

/// A response head, parsed.
enum Head {
    /// 1xx (other than 101): skipped, the final answer follows.
    Informational,
    Final(FinalHead),
}

/// The answer's head: the response without its body, how the body is framed, and whether
/// the server keeps the connection open after it.
pub struct FinalHead {
    pub response: Response<()>,
    pub decoder: Decoder,
    pub keep_alive: bool,
}

/// Parses a whole head from the front of `buf`: its length and what it says, or `None` when
/// more bytes are needed.
fn parse_head(buf: &[u8], request_method: &Method) -> Result<Option<(usize, Head)>, RelayError> {
    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut parsed = httparse::Response::new(&mut fields);
    let length = match parsed.parse(buf).map_err(RelayError::MalformedHead)? {
        httparse::Status::Complete(length) => length,
        httparse::Status::Partial => return Ok(None),
    };
    let code = parsed.code.unwrap_or(0);
    let status = StatusCode::from_u16(code)
        .map_err(|_| RelayError::MalformedHead(httparse::Error::Status))?;
    if status == StatusCode::SWITCHING_PROTOCOLS {
        return Err(RelayError::SwitchedProtocols);
    }
    if status.is_informational() {
        return Ok(Some((length, Head::Informational)));
    }
    let version = if parsed.version == Some(0) {
        Version::HTTP_10
    } else {
        Version::HTTP_11
    };
    let mut headers = HeaderMap::with_capacity(parsed.headers.len());
    for field in parsed.headers.iter() {
        let name = HeaderName::from_bytes(field.name.as_bytes())
            .map_err(|_| RelayError::MalformedHead(httparse::Error::HeaderName))?;
        let value = HeaderValue::from_bytes(field.value)
            .map_err(|_| RelayError::MalformedHead(httparse::Error::HeaderValue))?;
        headers.append(name, value);
    }
    let (decoder, framed_to_reuse) = response_framing(&mut headers, request_method, status)?;
    let keep_alive = framed_to_reuse && keeps_alive(&headers, version);
    let mut response = Response::new(());
    *response.status_mut() = status;
    *response.version_mut() = version;
    *response.headers_mut() = headers;
    Ok(Some((
        length,
        Head::Final(FinalHead {
            response,
            decoder,
            keep_alive,
        }),
    )))
}

/// How the body of a response is delimited (RFC 9112 §6.3), and whether that leaves the
/// connection reusable after it.
fn response_framing(
    headers: &mut HeaderMap,
    request_method: &Method,
    status: StatusCode,
) -> Result<(Decoder, bool), RelayError> {
    if request_method == Method::HEAD
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
    {
        return Ok((Decoder::Length(0), true));
    }
    if headers.contains_key(TRANSFER_ENCODING) {
        let chunked = headers
            .get_all(TRANSFER_ENCODING)
            .iter()
            .next_back()
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.rsplit(',').next())
            .is_some_and(|last| last.trim().eq_ignore_ascii_case("chunked"));
        // A length beside a transfer coding is wrong and never forwarded (RFC 9112 §6.3 ¶3);
        // the connection is not trusted after such a message.
        let with_length = headers.remove(CONTENT_LENGTH).is_some();
        return Ok(if chunked {
            (Decoder::Chunked(Chunk::Size), !with_length)
        } else {
            (Decoder::ToClose, false)
        });
    }
    let mut length = None;
    for value in headers.get_all(CONTENT_LENGTH) {
        let text = value
            .to_str()
            .map_err(|_| RelayError::InvalidContentLength)?;
        for part in text.split(',') {
            let part = part.trim();
            if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
                return Err(RelayError::InvalidContentLength);
            }
            let parsed: u64 = part.parse().map_err(|_| RelayError::InvalidContentLength)?;
            if length.is_some_and(|seen| seen != parsed) {
                return Err(RelayError::InvalidContentLength);
            }
            length = Some(parsed);
        }
    }
    Ok(match length {
        Some(length) => (Decoder::Length(length), true),
        None => (Decoder::ToClose, false),
    })
}

/// Whether the server keeps the connection open after this response.
fn keeps_alive(headers: &HeaderMap, version: Version) -> bool {
    let says = |token: &str| {
        headers
            .get_all(CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case(token))
    };
    if version == Version::HTTP_10 {
        says("keep-alive") && !says("close")
    } else {
        !says("close")
    }
}

/// Where a response body's decoding stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decoder {
    /// This many bytes are left.
    Length(u64),
    /// Chunked, at this point of a chunk.
    Chunked(Chunk),
    /// Everything until the server closes the connection.
    ToClose,
    /// Read to its end.
    Done,
}

/// The position inside a chunked body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chunk {
    /// Expecting a size line.
    Size,
    /// Inside a chunk's data: this many bytes left.
    Data(u64),
    /// Expecting the CRLF after a chunk's data.
    DataEnd,
    /// After the last chunk: trailer fields, then an empty line.
    Trailers,
}

/// What one decoding step found.
#[derive(Debug)]
pub enum Decoded {
    Frame(Frame<Bytes>),
    /// Nothing buffered makes a frame yet: read more.
    More,
    End,
}

impl Decoder {
    /// Takes the next frame (or the end) off the front of `buf`.
    pub fn decode(&mut self, buf: &mut BytesMut, max_buf: usize) -> Result<Decoded, RelayError> {
        loop {
            match *self {
                Decoder::Done | Decoder::Length(0) => {
                    *self = Decoder::Done;
                    return Ok(Decoded::End);
                }
                Decoder::Length(left) => {
                    let Some((data, left)) = take_up_to(buf, left) else {
                        return Ok(Decoded::More);
                    };
                    *self = if left == 0 {
                        Decoder::Done
                    } else {
                        Decoder::Length(left)
                    };
                    return Ok(Decoded::Frame(Frame::data(data)));
                }
                Decoder::ToClose => {
                    if buf.is_empty() {
                        return Ok(Decoded::More);
                    }
                    return Ok(Decoded::Frame(Frame::data(buf.split().freeze())));
                }
                Decoder::Chunked(Chunk::Size) => {
                    let Some(newline) = buf.iter().position(|&b| b == b'\n') else {
                        if buf.len() > MAX_CHUNK_LINE {
                            return Err(RelayError::MalformedChunk("size line too long"));
                        }
                        return Ok(Decoded::More);
                    };
                    let size = chunk_size(&buf[..newline])?;
                    buf.advance(newline + 1);
                    *self = Decoder::Chunked(if size == 0 {
                        Chunk::Trailers
                    } else {
                        Chunk::Data(size)
                    });
                }
                Decoder::Chunked(Chunk::Data(left)) => {
                    let Some((data, left)) = take_up_to(buf, left) else {
                        return Ok(Decoded::More);
                    };
                    *self = Decoder::Chunked(if left == 0 {
                        Chunk::DataEnd
                    } else {
                        Chunk::Data(left)
                    });
                    // The CRLF after the data, when it is already here, is taken now: the
                    // body's end then shows as soon as the last chunk's size line arrives.
                    if left == 0 && buf.starts_with(b"\r\n") {
                        buf.advance(2);
                        *self = Decoder::Chunked(Chunk::Size);
                    }
                    return Ok(Decoded::Frame(Frame::data(data)));
                }
                Decoder::Chunked(Chunk::DataEnd) => {
                    if buf.len() < 2 {
                        if buf.first().is_some_and(|&b| b != b'\r') {
                            return Err(RelayError::MalformedChunk("no CRLF after the data"));
                        }
                        return Ok(Decoded::More);
                    }
                    if &buf[..2] != b"\r\n" {
                        return Err(RelayError::MalformedChunk("no CRLF after the data"));
                    }
                    buf.advance(2);
                    *self = Decoder::Chunked(Chunk::Size);
                }
                Decoder::Chunked(Chunk::Trailers) => {
                    if buf.starts_with(b"\r\n") {
                        buf.advance(2);
                        *self = Decoder::Done;
                        return Ok(Decoded::End);
                    }
                    if buf.len() < 2 {
                        if buf.first().is_some_and(|&b| b == b'\n') {
                            return Err(RelayError::MalformedChunk("bare LF after the last chunk"));
                        }
                        return Ok(Decoded::More);
                    }
                    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
                    match httparse::parse_headers(buf, &mut fields) {
                        Ok(httparse::Status::Complete((length, fields))) => {
                            let mut trailers = HeaderMap::with_capacity(fields.len());
                            for field in fields {
                                let name = HeaderName::from_bytes(field.name.as_bytes());
                                let value = HeaderValue::from_bytes(field.value);
                                if let (Ok(name), Ok(value)) = (name, value) {
                                    trailers.append(name, value);
                                }
                            }
                            buf.advance(length);
                            *self = Decoder::Done;
                            return Ok(Decoded::Frame(Frame::trailers(trailers)));
                        }
                        Ok(httparse::Status::Partial) if buf.len() < max_buf => {
                            return Ok(Decoded::More);
                        }
                        Ok(httparse::Status::Partial) => {
                            return Err(RelayError::MalformedChunk("trailers too large"));
                        }
                        Err(_) => return Err(RelayError::MalformedChunk("malformed trailers")),
                    }
                }
            }
        }
    }

    /// The server closed the connection: the end of a body read to the close, else a
    /// truncation.
    fn closed(&mut self) -> Result<(), RelayError> {
        match *self {
            Decoder::ToClose | Decoder::Done => {
                *self = Decoder::Done;
                Ok(())
            }
            Decoder::Length(missing) => Err(RelayError::ClosedInBody { missing }),
            Decoder::Chunked(_) => Err(RelayError::ClosedInChunk),
        }
    }

    pub fn is_end(&self) -> bool {
        matches!(self, Decoder::Done | Decoder::Length(0))
    }

    pub fn size_hint(&self) -> SizeHint {
        match *self {
            Decoder::Length(left) => SizeHint::with_exact(left),
            Decoder::Done => SizeHint::with_exact(0),
            Decoder::Chunked(_) | Decoder::ToClose => SizeHint::default(),
        }
    }
}

/// Up to `left` bytes off the front of `buf`, as one frame's data (a slice of the buffer, not
/// a copy), and what is left after them; `None` when nothing is buffered.
fn take_up_to(buf: &mut BytesMut, left: u64) -> Option<(Bytes, u64)> {
    if buf.is_empty() {
        return None;
    }
    let take = usize::try_from(left).unwrap_or(usize::MAX).min(buf.len());
    Some((buf.split_to(take).freeze(), left - take as u64))
}

/// The size on a chunk-size line (without its LF): hex digits, then optional extensions.
fn chunk_size(line: &[u8]) -> Result<u64, RelayError> {
    let line = line
        .strip_suffix(b"\r")
        .ok_or(RelayError::MalformedChunk("size line without CRLF"))?;
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 {
        return Err(RelayError::MalformedChunk("no chunk size"));
    }
    if digits > 15 {
        return Err(RelayError::MalformedChunk("chunk size too large"));
    }
    let mut size = 0u64;
    for &digit in &line[..digits] {
        // Hex digits only (checked above); 15 of them fit a u64.
        let value = (digit as char).to_digit(16).unwrap_or(0);
        size = size * 16 + u64::from(value);
    }
    let rest = &line[digits..];
    let rest = rest.trim_ascii_start();
    if !rest.is_empty() && rest[0] != b';' {
        return Err(RelayError::MalformedChunk("junk after the chunk size"));
    }
    Ok(size)
}

/// Up to three pieces written together (a chunk's size line, its data, its CRLF).
struct Pending {
    parts: [Bytes; 3],
}

impl Pending {
    fn new(parts: [Bytes; 3]) -> Self {
        Self { parts }
    }

    fn one(bytes: Bytes) -> Self {
        Self::new([bytes, Bytes::new(), Bytes::new()])
    }

    /// Writes the pieces; `written` counts the bytes the socket (over TLS: rustls) took.
    fn poll_write(
        &mut self,
        stream: &mut UpstreamStream,
        cx: &mut Context<'_>,
        written_total: &mut u64,
    ) -> Poll<io::Result<()>> {
        loop {
            let slices = [
                IoSlice::new(&self.parts[0]),
                IoSlice::new(&self.parts[1]),
                IoSlice::new(&self.parts[2]),
            ];
            let total: usize = self.parts.iter().map(Bytes::len).sum();
            if total == 0 {
                return Poll::Ready(Ok(()));
            }
            let mut written = ready!(stream.poll_write_vectored(cx, &slices))?;
            if written == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            *written_total = written_total.saturating_add(written as u64);
            for part in &mut self.parts {
                let take = written.min(part.len());
                part.advance(take);
                written -= take;
            }
        }
    }
}

/// A request being written: its head, then its body in frames.
pub struct Outgoing {
    pending: Option<Pending>,
    body: Option<RequestBody>,
    framing: RequestFraming,
    /// Body bytes queued so far (checked against a declared length).
    sent: u64,
    /// The last bytes are queued (the terminating chunk, if chunked).
    ending: bool,
    /// Bytes of this request (head included) the connection's socket took (over TLS, rustls
    /// took: see [`TlsUpstream`]): once any did, the request may have reached the server, and
    /// it is never sent again.
    written: u64,
}

impl std::fmt::Debug for Outgoing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outgoing")
            .field("framing", &self.framing)
            .field("ending", &self.ending)
            .finish()
    }
}

/// The request head's bytes and how its body goes, from a request in origin form; its
/// headers gain the framing header the body needs.
pub fn encode_head(request: &mut Request<RequestBody>) -> (Bytes, RequestFraming) {
    let body = request.body();
    let declared = request
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let framing = if let Some(declared) = declared {
        RequestFraming::Length(declared)
    } else if body.is_end_stream() {
        RequestFraming::Length(0)
    } else if let Some(exact) = body.size_hint().exact() {
        if let Ok(value) = HeaderValue::try_from(exact.to_string()) {
            request.headers_mut().insert(CONTENT_LENGTH, value);
        }
        RequestFraming::Length(exact)
    } else {
        request
            .headers_mut()
            .insert(TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
        RequestFraming::Chunked
    };
    let path = request.uri().path_and_query().map_or("/", |p| p.as_str());
    let method = request.method().as_str();
    let mut head = Vec::with_capacity(
        method.len()
            + path.len()
            + 13
            + request
                .headers()
                .iter()
                .map(|(n, v)| n.as_str().len() + v.len() + 4)
                .sum::<usize>()
            + 2,
    );
    head.extend_from_slice(method.as_bytes());
    head.push(b' ');
    head.extend_from_slice(path.as_bytes());
    head.extend_from_slice(b" HTTP/1.1\r\n");
    for (name, value) in request.headers() {
        head.extend_from_slice(name.as_str().as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(value.as_bytes());
        head.extend_from_slice(b"\r\n");
    }
    head.extend_from_slice(b"\r\n");
    (Bytes::from(head), framing)
}

/// How a request body is framed: by a length (the declared or the known one), or chunked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestFraming {
    Length(u64),
    Chunked,
}

impl Outgoing {
    pub fn new(head: Bytes, framing: RequestFraming, body: RequestBody) -> Self {
        let mut first = [head, Bytes::new(), Bytes::new()];
        let mut sent = 0;
        let body = match (body, framing) {
            // A body read whole goes out with its head, in one write.
            (RequestBody::Full(bytes), RequestFraming::Length(_)) => {
                let bytes = bytes.unwrap_or_default();
                sent = bytes.len() as u64;
                first[1] = bytes;
                None
            }
            (body, _) => Some(body),
        };
        Self {
            pending: Some(Pending::new(first)),
            body,
            framing,
            sent,
            ending: false,
            written: 0,
        }
    }

    /// Whether any byte of this request went into the connection's socket: from then on the
    /// server may have read it (and started a generation), so it must not go again.
    pub fn reached_socket(&self) -> bool {
        self.written > 0
    }

    /// Writes what can be written: `Ready(Ok)` once the whole request is out (over TLS, its
    /// last records handed to the socket too).
    fn poll_write(
        &mut self,
        stream: &mut UpstreamStream,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), RelayError>> {
        loop {
            if let Some(pending) = self.pending.as_mut() {
                ready!(pending.poll_write(stream, cx, &mut self.written))?;
                self.pending = None;
            }
            if self.ending {
                ready!(stream.poll_flush(cx))?;
                return Poll::Ready(Ok(()));
            }
            let Some(body) = self.body.as_mut() else {
                self.finish(None)?;
                continue;
            };
            match ready!(Pin::new(body).poll_frame(cx)) {
                None => self.finish(None)?,
                Some(Err(error)) => return Poll::Ready(Err(RelayError::RequestBody(error))),
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) if data.is_empty() => {}
                    Ok(data) => self.queue(data)?,
                    // Trailers end the body (a body framed by length sends none).
                    Err(frame) => self.finish(frame.into_trailers().ok())?,
                },
            }
        }
    }

    fn queue(&mut self, data: Bytes) -> Result<(), RelayError> {
        self.sent += data.len() as u64;
        self.pending = Some(match self.framing {
            RequestFraming::Length(declared) if self.sent > declared => {
                return Err(RelayError::RequestBodyLength {
                    declared,
                    sent: self.sent,
                });
            }
            RequestFraming::Length(_) => Pending::one(data),
            RequestFraming::Chunked => {
                let size = Bytes::from(format!("{:x}\r\n", data.len()));
                Pending::new([size, data, Bytes::from_static(b"\r\n")])
            }
        });
        Ok(())
    }

    /// The body is over: the last chunk (with any trailers) queued, or its length checked.
    fn finish(&mut self, trailers: Option<HeaderMap>) -> Result<(), RelayError> {
        self.body = None;
        self.ending = true;
        match self.framing {
            RequestFraming::Length(declared) if declared != self.sent => {
                Err(RelayError::RequestBodyLength {
                    declared,
                    sent: self.sent,
                })
            }
            RequestFraming::Length(_) => Ok(()),
            RequestFraming::Chunked => {
                let mut block = b"0\r\n".to_vec();
                for (name, value) in trailers.iter().flatten() {
                    block.extend_from_slice(name.as_str().as_bytes());
                    block.extend_from_slice(b": ");
                    block.extend_from_slice(value.as_bytes());
                    block.extend_from_slice(b"\r\n");
                }
                block.extend_from_slice(b"\r\n");
                self.pending = Some(Pending::one(Bytes::from(block)));
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(text: &str) -> Result<Option<(usize, Head)>, RelayError> {
        parse_head(text.as_bytes(), &Method::GET)
    }

    fn framing_of(text: &str) -> (Decoder, bool) {
        match head(text) {
            Ok(Some((
                _,
                Head::Final(FinalHead {
                    decoder,
                    keep_alive,
                    ..
                }),
            ))) => (decoder, keep_alive),
            other => panic!("not a final head: {:?}", other.map(|o| o.map(|(l, _)| l))),
        }
    }

    /// Decodes `wire` fed in pieces of `step` bytes: the data, the trailers, whether it ended.
    fn decode_in_steps(
        mut decoder: Decoder,
        wire: &[u8],
        step: usize,
    ) -> (Vec<u8>, Option<HeaderMap>, bool) {
        let mut buf = BytesMut::new();
        let mut data = Vec::new();
        let mut trailers = None;
        for piece in wire.chunks(step.max(1)) {
            buf.extend_from_slice(piece);
            loop {
                match decoder.decode(&mut buf, 1 << 16).unwrap() {
                    Decoded::Frame(frame) => match frame.into_data() {
                        Ok(bytes) => data.extend_from_slice(&bytes),
                        Err(frame) => trailers = frame.into_trailers().ok(),
                    },
                    Decoded::More => break,
                    Decoded::End => return (data, trailers, true),
                }
            }
        }
        (data, trailers, false)
    }

    #[test]
    fn heads_are_framed_as_rfc_9112_says() {
        let (decoder, keep) = framing_of("HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n");
        assert_eq!((decoder, keep), (Decoder::Length(5), true));
        let (decoder, keep) = framing_of("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n");
        assert_eq!((decoder, keep), (Decoder::Chunked(Chunk::Size), true));
        let (decoder, keep) = framing_of(
            "HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\ncontent-length: 3\r\n\r\n",
        );
        assert_eq!((decoder, keep), (Decoder::Chunked(Chunk::Size), false));
        let (decoder, keep) = framing_of("HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n");
        assert_eq!((decoder, keep), (Decoder::ToClose, false));
        let (decoder, keep) = framing_of("HTTP/1.1 200 OK\r\n\r\n");
        assert_eq!((decoder, keep), (Decoder::ToClose, false));
        let (decoder, keep) = framing_of("HTTP/1.1 204 No Content\r\n\r\n");
        assert_eq!((decoder, keep), (Decoder::Length(0), true));
        let (_, keep) =
            framing_of("HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
        assert!(!keep);
        let (_, keep) = framing_of("HTTP/1.0 200 OK\r\ncontent-length: 0\r\n\r\n");
        assert!(!keep);
        let (_, keep) =
            framing_of("HTTP/1.0 200 OK\r\ncontent-length: 0\r\nconnection: keep-alive\r\n\r\n");
        assert!(keep);
        let (decoder, _) =
            framing_of("HTTP/1.1 200 OK\r\ncontent-length: 7, 7\r\ncontent-length: 7\r\n\r\n");
        assert_eq!(decoder, Decoder::Length(7));
        for bad in ["7, 8", "-1", "", "0x10", "1 2", "99999999999999999999999"] {
            let text = format!("HTTP/1.1 200 OK\r\ncontent-length: {bad}\r\n\r\n");
            assert!(
                matches!(head(&text), Err(RelayError::InvalidContentLength)),
                "{bad:?} was accepted"
            );
        }
        let text = "HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\n";
        let head = parse_head(text.as_bytes(), &Method::HEAD).unwrap();
        assert!(matches!(
            head,
            Some((
                _,
                Head::Final(FinalHead {
                    decoder: Decoder::Length(0),
                    ..
                })
            ))
        ));
    }

    #[test]
    fn informational_answers_are_skipped_and_101_refused() {
        assert!(matches!(
            head("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n"),
            Ok(Some((25, Head::Informational)))
        ));
        assert!(matches!(
            head("HTTP/1.1 101 Switching Protocols\r\nupgrade: x\r\n\r\n"),
            Err(RelayError::SwitchedProtocols)
        ));
        assert!(matches!(head("HTTP/1.1 200 OK\r\ncontent-le"), Ok(None)));
        assert!(matches!(
            head("HTTP/1.1 2000 OK\r\n\r\n"),
            Err(RelayError::MalformedHead(_))
        ));
        assert!(matches!(
            head("garbage\r\n\r\n"),
            Err(RelayError::MalformedHead(_))
        ));
    }

    #[test]
    fn chunked_bodies_decode_whatever_the_read_boundaries() {
        let wire = b"5\r\nhello\r\n6;name=v\r\n world\r\n0\r\nx-checksum: abc\r\n\r\n";
        for step in 1..wire.len() + 1 {
            let (data, trailers, ended) =
                decode_in_steps(Decoder::Chunked(Chunk::Size), wire, step);
            assert_eq!(data, b"hello world", "step {step}");
            assert!(ended, "step {step}");
            assert_eq!(trailers.unwrap()["x-checksum"], "abc", "step {step}");
        }
        let (data, trailers, ended) = decode_in_steps(
            Decoder::Chunked(Chunk::Size),
            b"A\r\n0123456789\r\n0\r\n\r\n",
            3,
        );
        assert_eq!(
            (data.as_slice(), trailers.is_none(), ended),
            (&b"0123456789"[..], true, true)
        );
    }

    #[test]
    fn malformed_chunks_are_errors_not_guesses() {
        for wire in [
            &b"zz\r\n"[..],
            b"5\nhello\r\n",
            b"5 x\r\nhello\r\n",
            b"5\r\nhelloXY",
            b"ffffffffffffffff\r\n",
            b"0\r\nbad trailer\r\n\r\n",
        ] {
            let mut decoder = Decoder::Chunked(Chunk::Size);
            let mut buf = BytesMut::from(wire);
            let mut failed = false;
            for _ in 0..8 {
                match decoder.decode(&mut buf, 1 << 16) {
                    Err(_) => {
                        failed = true;
                        break;
                    }
                    Ok(Decoded::More | Decoded::End) => break,
                    Ok(Decoded::Frame(_)) => {}
                }
            }
            assert!(failed, "{:?} was accepted", String::from_utf8_lossy(wire));
        }
        let mut buf = BytesMut::from(&vec![b'1'; MAX_CHUNK_LINE + 1][..]);
        assert!(Decoder::Chunked(Chunk::Size)
            .decode(&mut buf, 1 << 16)
            .is_err());
    }

    #[test]
    fn a_length_body_ends_exactly_and_a_close_before_it_is_a_truncation() {
        let mut decoder = Decoder::Length(5);
        let mut buf = BytesMut::from(&b"hel"[..]);
        assert!(matches!(
            decoder.decode(&mut buf, 64),
            Ok(Decoded::Frame(_))
        ));
        assert!(matches!(decoder.decode(&mut buf, 64), Ok(Decoded::More)));
        assert!(matches!(
            decoder.closed(),
            Err(RelayError::ClosedInBody { missing: 2 })
        ));
        let mut decoder = Decoder::Length(2);
        let mut buf = BytesMut::from(&b"okHTTP"[..]);
        assert!(matches!(
            decoder.decode(&mut buf, 64),
            Ok(Decoded::Frame(_))
        ));
        assert!(decoder.is_end());
        assert_eq!(&buf[..], b"HTTP");
        let mut decoder = Decoder::ToClose;
        assert!(decoder.closed().is_ok());
        assert!(Decoder::Chunked(Chunk::Data(3)).closed().is_err());
    }

    #[test]
    fn request_heads_are_framed_like_hyper_frames_them() {
        let request = |body: RequestBody, length: Option<&str>| {
            let mut builder = Request::builder().method(Method::POST).uri("/v1/x?y=1");
            if let Some(length) = length {
                builder = builder.header(CONTENT_LENGTH, length);
            }
            builder.header("host", "up:8000").body(body).unwrap()
        };
        let mut full = request(RequestBody::Full(Some(Bytes::from_static(b"{}"))), None);
        let (bytes, framing) = encode_head(&mut full);
        assert_eq!(framing, RequestFraming::Length(2));
        assert_eq!(
            &bytes[..],
            b"POST /v1/x?y=1 HTTP/1.1\r\nhost: up:8000\r\ncontent-length: 2\r\n\r\n"
        );
        let mut empty = request(RequestBody::empty(), None);
        let (bytes, framing) = encode_head(&mut empty);
        assert_eq!(framing, RequestFraming::Length(0));
        assert!(!String::from_utf8_lossy(&bytes).contains("content-length"));
        let mut streamed = request(
            RequestBody::Stream {
                prefix: None,
                rest: Box::pin(OneFrame(Some(Bytes::from_static(b"x")))),
            },
            None,
        );
        let (bytes, framing) = encode_head(&mut streamed);
        assert_eq!(framing, RequestFraming::Chunked);
        assert!(String::from_utf8_lossy(&bytes).contains("transfer-encoding: chunked\r\n"));
    }

    /// The chunked encoding of `pieces` (empty pieces skipped, as a sender skips them).
    fn chunked(pieces: &[Vec<u8>]) -> Vec<u8> {
        let mut wire = Vec::new();
        for piece in pieces.iter().filter(|p| !p.is_empty()) {
            wire.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
            wire.extend_from_slice(piece);
            wire.extend_from_slice(b"\r\n");
        }
        wire.extend_from_slice(b"0\r\n\r\n");
        wire
    }

    proptest::proptest! {
        #[test]
        fn any_bytes_decode_or_fail_without_panicking(
            wire in proptest::collection::vec(proptest::num::u8::ANY, 0..512),
            step in 1usize..64,
            as_head in proptest::bool::ANY,
        ) {
            if as_head {
                let _ = parse_head(&wire, &Method::GET);
            }
            for start in [Decoder::Chunked(Chunk::Size), Decoder::Length(100), Decoder::ToClose] {
                let mut decoder = start;
                let mut buf = BytesMut::new();
                'feed: for piece in wire.chunks(step) {
                    buf.extend_from_slice(piece);
                    for _ in 0..1024 {
                        match decoder.decode(&mut buf, 256) {
                            Ok(Decoded::Frame(_)) => {}
                            Ok(Decoded::More) => break,
                            Ok(Decoded::End) | Err(_) => break 'feed,
                        }
                    }
                }
                let _ = decoder.closed();
            }
        }

        #[test]
        fn chunked_data_comes_back_whole_whatever_the_reads(
            pieces in proptest::collection::vec(proptest::collection::vec(proptest::num::u8::ANY, 0..300), 0..12),
            step in 1usize..700,
        ) {
            let wire = chunked(&pieces);
            let (data, trailers, ended) = decode_in_steps(Decoder::Chunked(Chunk::Size), &wire, step);
            proptest::prop_assert!(ended);
            proptest::prop_assert!(trailers.is_none());
            proptest::prop_assert_eq!(data, pieces.concat());
        }
    }

    #[test]
    fn record_framing_follows_headers_whatever_the_reads() {
        // Two records (3 and 0 body bytes), then the start of a third.
        let wire = [23u8, 3, 3, 0, 3, b'a', b'b', b'c', 22, 3, 3, 0, 0, 23, 3];
        for split in 0..=wire.len() {
            let mut framing = RecordFraming::default();
            framing.count(&wire[..split]);
            let boundary = matches!(split, 0 | 8 | 13);
            assert_eq!(!framing.mid_record(), boundary, "after {split} bytes");
            framing.count(&wire[split..]);
            assert!(framing.mid_record(), "split at {split}");
        }
        let mut framing = RecordFraming::default();
        framing.count(&wire[..13]);
        assert!(!framing.mid_record());
    }

    /// What a TLS test server does once the handshake is over, after sending its session
    /// tickets.
    #[derive(Debug, Clone, Copy)]
    enum Then {
        /// Nothing more: the tickets alone reach the client (then it echoes what comes).
        Nothing,
        /// Application data nobody asked for.
        Plaintext,
        /// A `close_notify` alert, the TCP connection left open.
        CloseNotify,
        /// The first 15 bytes of an application-data record, the rest never.
        HalfRecord,
    }

    /// A CA and a certificate for 127.0.0.1 signed by it: the server's and the client's
    /// rustls configurations (the client's as `net::tls::client_config` makes it).
    fn tls_configs() -> (rustls::ServerConfig, rustls::ClientConfig) {
        use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec!["127.0.0.1".to_string()])
            .unwrap()
            .signed_by(&key, &ca)
            .unwrap();
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.der().clone()],
                rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
            )
            .unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.der().clone()).unwrap();
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        (server, client)
    }

    /// A TLS connection to a server that does `then` after its tickets; back once the server
    /// has written all of it (loopback: it is in the client's socket by then).
    async fn tls_connection_where(then: Then) -> UpstreamStream {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (server_config, client_config) = tls_configs();
        let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(server_config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let (written, written_now) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let (socket, _) = listener.accept().await.unwrap();
            let mut tls = acceptor.accept(socket).await.unwrap();
            // The tickets rustls queued at the client's Finished go out with this flush.
            tls.flush().await.unwrap();
            match then {
                Then::Nothing => {}
                Then::Plaintext => {
                    tls.write_all(b"HTTP/1.1 200 OK\r\n\r\n").await.unwrap();
                    tls.flush().await.unwrap();
                }
                Then::CloseNotify => {
                    tls.get_mut().1.send_close_notify();
                    tls.flush().await.unwrap();
                }
                Then::HalfRecord => {
                    let half = [23u8, 3, 3, 0, 100, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10];
                    tls.get_mut().0.write_all(&half).await.unwrap();
                }
            }
            let _ = written.send(());
            // Echo until the client goes.
            let mut echo = [0u8; 64];
            while let Ok(read @ 1..) = tls.read(&mut echo).await {
                if tls.write_all(&echo[..read]).await.is_err() || tls.flush().await.is_err() {
                    break;
                }
            }
        });
        let socket = tokio::net::TcpStream::connect(address).await.unwrap();
        let connector = TlsConnector::from(std::sync::Arc::new(client_config));
        let name = ServerName::try_from("127.0.0.1").unwrap();
        let stream = UpstreamStream::handshake(socket, &connector, name)
            .await
            .unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(10), written_now)
            .await
            .unwrap()
            .unwrap();
        stream
    }

    fn raw_socket(stream: &UpstreamStream) -> &TcpStream {
        match stream {
            UpstreamStream::Tls(tls) => &tls.stream.get_ref().0.socket,
            UpstreamStream::Plain(socket) => socket,
        }
    }

    fn tls_idle_state(stream: &mut UpstreamStream) -> IdleState {
        match stream {
            UpstreamStream::Tls(tls) => tls.idle_state(),
            UpstreamStream::Plain(_) => panic!("not TLS"),
        }
    }

    #[tokio::test]
    async fn the_tls_idle_check_takes_session_tickets_as_clean() {
        let mut stream = tls_connection_where(Then::Nothing).await;
        // The raw peek alone would call the tickets stray bytes.
        assert_eq!(peek_socket(raw_socket(&stream)), IdleState::Stray);
        assert_eq!(tls_idle_state(&mut stream), IdleState::Clean);
        assert_eq!(peek_socket(raw_socket(&stream)), IdleState::Clean);
        assert_eq!(tls_idle_state(&mut stream), IdleState::Clean);
        // The connection still carries a request and its answer after what the check read.
        let exchange = async {
            let slices = [IoSlice::new(b"ping")];
            let taken = std::future::poll_fn(|cx| stream.poll_write_vectored(cx, &slices))
                .await
                .unwrap();
            assert_eq!(taken, 4);
            std::future::poll_fn(|cx| stream.poll_flush(cx))
                .await
                .unwrap();
            let mut answer = BytesMut::with_capacity(64);
            while answer.len() < 4 {
                let read = std::future::poll_fn(|cx| stream.poll_read_buf(cx, &mut answer))
                    .await
                    .unwrap();
                assert!(read > 0, "closed after {answer:?}");
            }
            answer
        };
        let answer = tokio::time::timeout(std::time::Duration::from_secs(10), exchange)
            .await
            .unwrap();
        assert_eq!(&answer[..], b"ping");
    }

    #[tokio::test]
    async fn the_tls_idle_check_finds_plaintext_stray_and_a_close_notify_closed() {
        for (then, expected) in [
            (Then::Plaintext, IdleState::Stray),
            (Then::CloseNotify, IdleState::Closed),
            (Then::HalfRecord, IdleState::Stray),
        ] {
            let mut stream = tls_connection_where(then).await;
            // The tickets may be read before the rest has arrived (loopback hands each write
            // over on its own): a clean look then, and the next one finds it. Bounded.
            let mut state = tls_idle_state(&mut stream);
            for _ in 0..200 {
                if state != IdleState::Clean {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                state = tls_idle_state(&mut stream);
            }
            assert_eq!(state, expected, "{then:?}");
        }
    }

    /// A streamed body of one frame and no known length.
    struct OneFrame(Option<Bytes>);

    impl Body for OneFrame {
        type Data = Bytes;
        type Error = BoxError;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
            Poll::Ready(self.0.take().map(|b| Ok(Frame::data(b))))
        }
    }
}
