//! One connection: what it speaks (decided before hyper reads: a plain connection's first
//! bytes, TLS by ALPN), serving it with hyper on a task of its own, and what bounds it while it
//! lives (the first-request deadline, the send-stall timer, the HTTP/2 idle close, the drain).

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;

use super::faults::{Fault, FaultCounters};
use super::streams::{ConnStreams, StallTimer, StreamExecutor, StreamWatch};

/// Tells the connection task that a request head arrived (hyper calls the service once per
/// request), which ends the first-request deadline, and gives each request its send watch.
pub(super) struct ConnService<S> {
    pub(super) inner: S,
    pub(super) seen: Arc<Notify>,
    pub(super) streams: Arc<ConnStreams>,
}

impl<S, B> hyper::service::Service<Request<B>> for ConnService<S>
where
    S: hyper::service::Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn call(&self, mut request: Request<B>) -> Self::Future {
        self.seen.notify_one();
        let watch = self.streams.watch_for(request.version());
        request.extensions_mut().insert(StreamWatch(watch));
        self.inner.call(request)
    }
}

/// What a listener serves each connection with: hyper's service, one connection's requests
/// in and `Response<B>` out, never an error (failures are answered as responses).
pub trait ConnectionService<B>:
    hyper::service::Service<
        Request<Incoming>,
        Response = Response<B>,
        Error = Infallible,
        Future: Send + 'static,
    > + Send
    + 'static
{
}

impl<T, B> ConnectionService<B> for T where
    T: hyper::service::Service<
            Request<Incoming>,
            Response = Response<B>,
            Error = Infallible,
            Future: Send + 'static,
        > + Send
        + 'static
{
}

/// A response body hyper can write from any task: bytes, its error boxable.
pub trait ServedBody:
    Body<Data = Bytes, Error: Into<Box<dyn std::error::Error + Send + Sync>>> + Send + 'static
{
}

impl<T> ServedBody for T where
    T: Body<Data = Bytes, Error: Into<Box<dyn std::error::Error + Send + Sync>>> + Send + 'static
{
}

/// What a connection speaks, when known before hyper reads from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Protocol {
    Http1,
    Http2,
}

/// The HTTP/2 client connection preface (RFC 9113 §3.4), which an h2c prior-knowledge client
/// sends first.
const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

impl Protocol {
    /// The protocol of a plain connection whose first bytes are `first`; `None` while they
    /// are a proper prefix of the HTTP/2 preface (undecided).
    fn of_first_bytes(first: &[u8]) -> Option<Self> {
        if !H2_PREFACE.starts_with(first) {
            Some(Self::Http1)
        } else if first.len() == H2_PREFACE.len() {
            Some(Self::Http2)
        } else {
            None
        }
    }

    /// The protocol the TLS handshake agreed on (ALPN), if it agreed on one.
    fn of_alpn(alpn: Option<&[u8]>) -> Option<Self> {
        match alpn {
            Some(b"h2") => Some(Self::Http2),
            Some(b"http/1.1") => Some(Self::Http1),
            _ => None,
        }
    }
}

/// Decides a plain connection's protocol from its first bytes by peeking at them, so that
/// hyper then reads the request into a fresh buffer. hyper-util's detection reads them
/// instead and hands them back as a prefix, which made the HTTP/1 connection's read buffer
/// grow to 16 KiB on its second read, half of it copied: ~4 KiB resident per idle stream
/// (`docs/benchmarks.md`). First bytes that do not decide (a proper prefix of the HTTP/2
/// preface, e.g. a lone `P`) leave the detection to hyper-util, as before.
pub(super) async fn serve_plain<S, B>(
    mut connection: Connection,
    stream: TcpStream,
    service: ConnService<S>,
) where
    S: ConnectionService<B>,
    B: ServedBody,
{
    let mut first = [0u8; H2_PREFACE.len()];
    let peeked = tokio::select! {
        peeked = stream.peek(&mut first) => peeked,
        _ = tokio::time::sleep_until(connection.bounds.deadline) => {
            connection.bounds.faults.add(Fault::HeaderTimeout);
            tracing::debug!(listener = connection.bounds.name, peer = %connection.bounds.peer, "no request head within the header read timeout; closed");
            return;
        }
        // Told to drain or close before the peer sent a byte: nothing is in flight.
        _ = connection.bounds.drain.wait_for(|drain| *drain != Drain::Serving) => return,
    };
    match peeked {
        Ok(0) | Err(_) => {}
        Ok(n) => {
            let protocol = first.get(..n).and_then(Protocol::of_first_bytes);
            connection.spawn_serving(stream, service, protocol);
        }
    }
}

/// Runs `serve` on `stream` as a task of this runtime, or, given a connection worker's
/// runtime, there: the socket leaves this runtime's reactor and is registered with the
/// worker's on its thread, where every task of the connection then runs. A socket that cannot
/// move is closed (logged with `listener` and `peer`).
pub(super) fn spawn_connection<F, Fut>(
    worker: Option<tokio::runtime::Handle>,
    stream: TcpStream,
    (listener, peer): (&'static str, SocketAddr),
    serve: F,
) where
    F: FnOnce(TcpStream) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let Some(worker) = worker else {
        tokio::spawn(serve(stream));
        return;
    };
    let moved = stream
        .into_std()
        .map(|stream| {
            worker.spawn(async move {
                match TcpStream::from_std(stream) {
                    Ok(stream) => serve(stream).await,
                    Err(error) => {
                        tracing::debug!(listener, %peer, %error, "a connection worker could not take the connection; closed");
                    }
                }
            });
        });
    if let Err(error) = moved {
        tracing::debug!(listener, %peer, %error, "could not hand the connection to a worker; closed");
    }
}

/// Completes the TLS handshake by the connection's header deadline, then serves it.
pub(super) async fn serve_tls<S, B>(
    connection: Connection,
    acceptor: TlsAcceptor,
    stream: TcpStream,
    service: ConnService<S>,
) where
    S: ConnectionService<B>,
    B: ServedBody,
{
    let tls = match tokio::time::timeout_at(connection.bounds.deadline, acceptor.accept(stream))
        .await
    {
        Ok(Ok(tls)) => tls,
        Ok(Err(error)) => {
            tracing::debug!(listener = connection.bounds.name, peer = %connection.bounds.peer, %error, "TLS handshake failed");
            return;
        }
        Err(_) => {
            connection.bounds.faults.add(Fault::HeaderTimeout);
            tracing::debug!(listener = connection.bounds.name, peer = %connection.bounds.peer, "TLS handshake timed out");
            return;
        }
    };
    let protocol = Protocol::of_alpn(tls.get_ref().1.alpn_protocol());
    connection.spawn_serving(tls, service, protocol);
}

/// What the listener tells its connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Drain {
    Serving,
    /// Finish what is in flight, take nothing new (HTTP/2 GOAWAY, HTTP/1 `connection: close`).
    Draining,
    /// The grace period is over: close now.
    Close,
}

/// One accepted connection: how to serve it, and what bounds it.
pub(super) struct Connection {
    /// For connections whose protocol is not known before hyper reads (HTTP/2, TLS without
    /// ALPN, undecided first bytes).
    pub(super) builder: auto::Builder<StreamExecutor>,
    /// For connections known to be HTTP/1: hyper's own, whose head limit is exact
    /// (`max_header_size`; hyper-util's detection exposes only the read buffer's limit,
    /// which a head already waiting in the socket can overshoot by up to twice).
    pub(super) http1: http1::Builder,
    pub(super) bounds: Bounds,
}

/// What bounds one connection, whichever protocol it speaks.
pub(super) struct Bounds {
    pub(super) streams: Arc<ConnStreams>,
    pub(super) drain: watch::Receiver<Drain>,
    /// When the first request head must have arrived.
    pub(super) deadline: Instant,
    /// An HTTP/2 connection without streams for this long is closed.
    pub(super) idle: Duration,
    pub(super) seen: Arc<Notify>,
    pub(super) faults: Arc<FaultCounters>,
    pub(super) name: &'static str,
    pub(super) peer: SocketAddr,
}

impl Connection {
    /// Serves HTTP on `io` on a task of its own (see [`Bounds::drive`]), so that what stays
    /// in memory while a stream is open is the connection and its bounds, not also what
    /// decided its protocol (an async fn keeps its arguments beside the futures it awaits,
    /// and a task's future is copied whole into its allocation). `protocol`, when known,
    /// spares hyper-util's detection (which reads the first bytes itself).
    fn spawn_serving<I, S, B>(self, io: I, service: ConnService<S>, protocol: Option<Protocol>)
    where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
        S: ConnectionService<B>,
        B: ServedBody,
    {
        let Connection {
            builder,
            http1,
            bounds,
        } = self;
        if protocol == Some(Protocol::Http1) {
            let conn = Box::pin(http1.serve_connection(TokioIo::new(io), service));
            tokio::spawn(bounds.drive(conn, |conn| conn.graceful_shutdown(), Streams::One));
            return;
        }
        // A builder already limited to HTTP/1 (`http2 = false`) stays as it is.
        let builder = match protocol {
            Some(Protocol::Http2) if builder.is_http2_available() => builder.http2_only(),
            _ => builder,
        };
        let conn = Box::pin(
            builder
                .serve_connection(TokioIo::new(io), service)
                .into_owned(),
        );
        tokio::spawn(bounds.drive(conn, |conn| conn.graceful_shutdown(), Streams::Many));
    }
}

impl Bounds {
    /// Drives `conn` until it ends; closes it if no request head arrives by the deadline
    /// (hyper's own header timeout starts only once HTTP/1 is detected, so a peer that sends
    /// nothing, or only an HTTP/2 preface, is bounded here), when its HTTP/1 response has
    /// waited for the client past the send stall timeout, and when it is HTTP/2 and has had
    /// no stream for the idle time. `shut_down` asks `conn` to finish gracefully.
    /// `conn` comes boxed: pinned here, it would be stored twice in this future's state (as
    /// the argument and as the pinned local).
    async fn drive<C, E>(
        mut self,
        mut conn: Pin<Box<C>>,
        shut_down: fn(Pin<&mut C>),
        streams_of: Streams,
    ) where
        C: Future<Output = Result<(), E>>,
        E: std::fmt::Display,
    {
        let mut first_seen = false;
        let mut closing = false;
        // When an idle HTTP/2 connection is dropped whatever its client does: its graceful
        // GOAWAY waits for the answer to a PING, which a client that never answers would
        // otherwise make last until the keep-alive timeout ran out (40 s by default).
        let mut idle_close_by: Option<Instant> = None;
        let mut stall = StallTimer::new(self.streams.send_stall());
        // The stream activity the idle deadline was set for.
        let mut idle: Option<(u64, Instant)> = None;
        let streams = Arc::clone(&self.streams);
        // Every HTTP/1 event wakes this task, and the connection's shared state is cold by
        // then (a line of memory read per wake-up): the HTTP/1 send watch is kept here, and
        // HTTP/2's stream changes are not looked at on a connection that cannot have any.
        let http1_watch = Arc::clone(&streams.http1);
        // A second receiver of the drain signal, read only with `has_changed` (an atomic
        // load), so the connection's wake-ups poll the drain future only once it has fired.
        let mut drain_probe = self.drain.clone();
        // One timer for whichever deadline applies (the first request head's; then, on an
        // HTTP/2 connection, the idle close and its grace: never two at once), made when one
        // applies and moved when it changes. A timer made in the `select!` below would be made
        // anew at every wake-up of this task, which is every frame of an HTTP/1 response, and
        // each of the three it had took room in this task's allocation, which every open
        // stream holds (docs/benchmarks.md, "Memory per idle stream").
        let mut timer = std::pin::pin!(Some(tokio::time::sleep_until(self.deadline)));
        let result = loop {
            let drain = *self.drain.borrow_and_update();
            drain_probe.mark_unchanged();
            match drain {
                Drain::Close => return,
                Drain::Draining if !closing => {
                    closing = true;
                    shut_down(conn.as_mut());
                }
                _ => {}
            }
            // HTTP/2 with no stream in flight: idle since the last change.
            let (active, changes) = streams.activity();
            if first_seen && active == 0 && changes > 0 {
                if idle.is_none_or(|(seen, _)| seen != changes) {
                    idle = Some((changes, Instant::now() + self.idle));
                }
            } else {
                idle = None;
            }
            let deadline = if !first_seen {
                Some((self.deadline, Deadline::FirstHead))
            } else if let (Some((_, at)), false) = (idle, closing) {
                Some((at, Deadline::Idle))
            } else {
                idle_close_by.map(|at| (at, Deadline::CloseGrace))
            };
            // Without a deadline the timer is dropped, not left in the runtime's timer wheel to
            // wake this task for nothing when it runs out.
            match (deadline, timer.as_mut().as_pin_mut()) {
                (Some((at, _)), Some(set)) if set.deadline() != at => set.reset(at),
                (Some(_), Some(_)) | (None, None) => {}
                (Some((at, _)), None) => timer.set(Some(tokio::time::sleep_until(at))),
                (None, Some(_)) => timer.set(None),
            }
            // Every frame of an HTTP/1 response wakes this task. Polling a registered `Notify`
            // takes the lock of its waiter list (the drain signal's is shared by all
            // connections), so each of the two waits below is polled once to register and then
            // only after a lock-free check says its signal fired (the change counter, the
            // watch's version); the waker stays this task's in between.
            let mut streams_changed = std::pin::pin!(streams.changed.notified());
            let mut drain_changed = std::pin::pin!(self.drain.changed());
            let (mut streams_armed, mut drain_armed) = (false, false);
            tokio::select! {
                biased;
                result = conn.as_mut() => break result,
                _ = std::future::poll_fn(|cx| stall.poll_stalled(&http1_watch, cx)) => {
                    // The HTTP/1 client took nothing of its response for the timeout.
                    streams.stalled();
                    return;
                }
                _ = self.seen.notified(), if !first_seen => first_seen = true,
                _ = std::future::poll_fn(|cx| poll_once_fired(
                    &mut streams_armed,
                    streams.activity().1 != changes,
                    streams_changed.as_mut(),
                    cx,
                )), if streams_of == Streams::Many => {}
                _ = std::future::poll_fn(|cx| poll_once_fired(
                    &mut drain_armed,
                    drain_probe.has_changed().unwrap_or(true),
                    drain_changed.as_mut(),
                    cx,
                )) => {}
                () = std::future::poll_fn(|cx| match timer.as_mut().as_pin_mut() {
                    Some(set) => set.poll(cx),
                    None => std::task::Poll::Pending,
                }), if deadline.is_some() => match deadline.map(|(_, which)| which) {
                    Some(Deadline::FirstHead) => {
                        self.faults.add(Fault::HeaderTimeout);
                        tracing::debug!(listener = self.name, peer = %self.peer, "no request head within the header read timeout; closed");
                        return;
                    }
                    Some(Deadline::Idle) => {
                        self.faults.add(Fault::IdleClosed);
                        tracing::debug!(listener = self.name, peer = %self.peer, "HTTP/2 connection idle; closed");
                        closing = true;
                        idle_close_by = Some(Instant::now() + IDLE_CLOSE_GRACE);
                        shut_down(conn.as_mut());
                    }
                    Some(Deadline::CloseGrace) | None => {
                        tracing::debug!(listener = self.name, peer = %self.peer, "idle HTTP/2 connection did not finish its GOAWAY; dropped");
                        return;
                    }
                },
            }
        };
        if let Err(error) = result {
            tracing::debug!(listener = self.name, peer = %self.peer, error = %error, "connection ended with an error");
        }
    }
}

/// How long an idle HTTP/2 connection's graceful close (GOAWAY, then a PING to be answered)
/// may take before the connection is dropped: a client that answers does so in a round trip.
const IDLE_CLOSE_GRACE: Duration = Duration::from_secs(1);

/// Whether a connection may carry several streams at once (HTTP/2, or not yet known), or one
/// request at a time (HTTP/1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Streams {
    One,
    Many,
}

/// Polls `wait` the first time (registering this task's waker) and after that only once
/// `fired`, so a wake-up for anything else costs an atomic load, not the wait's lock.
fn poll_once_fired<F: Future>(
    armed: &mut bool,
    fired: bool,
    wait: Pin<&mut F>,
    cx: &mut std::task::Context<'_>,
) -> std::task::Poll<F::Output> {
    if *armed && !fired {
        return std::task::Poll::Pending;
    }
    *armed = true;
    wait.poll(cx)
}

/// Which of a connection's deadlines its timer is set for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Deadline {
    /// No request head yet: the header read timeout.
    FirstHead,
    /// An HTTP/2 connection without streams: the idle close.
    Idle,
    /// An idle HTTP/2 connection's graceful close: dropped when it takes longer.
    CloseGrace,
}

#[cfg(test)]
mod tests {
    use super::{Protocol, H2_PREFACE};

    #[test]
    fn the_first_bytes_decide_the_protocol_only_once_they_can() {
        assert_eq!(
            Protocol::of_first_bytes(b"GET / HTTP/1.1\r\n"),
            Some(Protocol::Http1)
        );
        assert_eq!(Protocol::of_first_bytes(b"POST /v1"), Some(Protocol::Http1));
        assert_eq!(Protocol::of_first_bytes(b"PRX"), Some(Protocol::Http1));
        assert_eq!(Protocol::of_first_bytes(H2_PREFACE), Some(Protocol::Http2));
        // A proper prefix of the preface (a lone `P` of a POST, half a preface) is undecided.
        assert_eq!(Protocol::of_first_bytes(b"P"), None);
        assert_eq!(Protocol::of_first_bytes(b"PRI * HTTP/2.0\r\n"), None);
        assert_eq!(Protocol::of_first_bytes(b""), None);
    }

    #[test]
    fn alpn_names_the_protocol_when_it_was_agreed() {
        assert_eq!(Protocol::of_alpn(Some(b"h2")), Some(Protocol::Http2));
        assert_eq!(Protocol::of_alpn(Some(b"http/1.1")), Some(Protocol::Http1));
        assert_eq!(Protocol::of_alpn(Some(b"spdy/3")), None);
        assert_eq!(Protocol::of_alpn(None), None);
    }
}
