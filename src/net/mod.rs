//! Listeners: accepting TCP (and TLS) connections, serving HTTP/1.1 and HTTP/2 on them with
//! hyper, and shutting down gracefully. Shared by the data listener, the admin listener and
//! the simulator. Owns every connection task it spawns, and the limits that keep a hostile
//! peer from holding them: the first-request deadline (TLS handshake, protocol detection and
//! request head together), the connection limit, and the back-off when descriptors run out.

pub mod faults;
pub mod limits;
pub mod redact;
pub mod streams;
pub mod tls;
pub mod workers;

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
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify, Semaphore};
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;

use faults::{Fault, FaultCounters};
use streams::{ConnStreams, StallTimer, StreamExecutor, StreamWatch};
use workers::ConnectionWorkers;

/// Fires shutdown for every listener holding a [`Shutdown`] from it.
#[derive(Debug)]
pub struct ShutdownTrigger(watch::Sender<bool>);

/// Resolves once shutdown has been triggered (or the trigger was dropped).
#[derive(Debug, Clone)]
pub struct Shutdown(watch::Receiver<bool>);

/// A trigger and the first of its listeners.
pub fn shutdown_pair() -> (ShutdownTrigger, Shutdown) {
    let (tx, rx) = watch::channel(false);
    (ShutdownTrigger(tx), Shutdown(rx))
}

impl ShutdownTrigger {
    pub fn trigger(&self) {
        let _ = self.0.send(true);
    }

    pub fn subscribe(&self) -> Shutdown {
        Shutdown(self.0.subscribe())
    }
}

impl Drop for ShutdownTrigger {
    fn drop(&mut self) {
        let _ = self.0.send(true);
    }
}

impl Shutdown {
    /// Waits for the trigger.
    pub async fn wait(&mut self) {
        let _ = self.0.wait_for(|&down| down).await;
    }

    pub fn is_triggered(&self) -> bool {
        *self.0.borrow()
    }
}

/// The stop signals: SIGTERM, SIGINT (Ctrl-C) and SIGHUP all drain (tokentap does not reload
/// its configuration: restart it for a new one), and one arriving while a drain runs cuts the
/// grace period short.
#[derive(Debug)]
pub struct Signals {
    #[cfg(unix)]
    term: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    hup: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    /// Listens from now on (a signal that arrives before the first [`Signals::next`] is kept).
    pub fn new() -> Self {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let listen = |kind: SignalKind, name: &str| match signal(kind) {
                Ok(listener) => Some(listener),
                Err(error) => {
                    tracing::warn!(%error, "cannot listen for {name}");
                    None
                }
            };
            Self {
                term: listen(SignalKind::terminate(), "SIGTERM"),
                hup: listen(SignalKind::hangup(), "SIGHUP"),
            }
        }
        #[cfg(not(unix))]
        {
            Self {}
        }
    }

    /// The next stop signal's name.
    pub async fn next(&mut self) -> &'static str {
        #[cfg(unix)]
        {
            async fn one(listener: &mut Option<tokio::signal::unix::Signal>) {
                match listener {
                    Some(listener) => {
                        if listener.recv().await.is_none() {
                            std::future::pending::<()>().await;
                        }
                    }
                    None => std::future::pending().await,
                }
            }
            tokio::select! {
                _ = tokio::signal::ctrl_c() => "SIGINT",
                _ = one(&mut self.term) => "SIGTERM",
                _ = one(&mut self.hup) => "SIGHUP",
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
            "Ctrl-C"
        }
    }
}

impl Default for Signals {
    fn default() -> Self {
        Self::new()
    }
}

/// How a listener serves its connections.
#[derive(Clone)]
pub struct ServerOptions {
    /// Name used in logs and fault counters ("proxy", "admin", "simulator").
    pub name: &'static str,
    /// Time from accept to a complete first request head: TLS handshake, HTTP/1 vs HTTP/2
    /// detection (an HTTP/2 preface alone does not count) and the head itself. Later request
    /// heads on an HTTP/1 keep-alive connection get the same time from hyper, and an HTTP/2
    /// connection without a stream for this long is closed.
    pub header_read_timeout: Duration,
    pub max_header_bytes: usize,
    pub http2: bool,
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// After shutdown, connections still open this long are closed.
    pub grace: Duration,
    /// Most connections open at once. At the limit the listener stops accepting (newcomers
    /// wait in the kernel's backlog) until one closes; open connections are never dropped.
    pub max_connections: usize,
    /// Where this listener counts the faults it cuts short.
    pub faults: Arc<FaultCounters>,
    /// Most HTTP/2 streams one connection may have open at once.
    pub http2_max_concurrent_streams: u32,
    /// Most response bytes buffered per HTTP/2 stream, whatever window the client advertises.
    pub http2_max_send_buffer: usize,
    /// HTTP/2 keep-alive pings this often (zero: none); a ping unanswered for
    /// `http2_keep_alive_timeout` closes the connection.
    pub http2_keep_alive_interval: Duration,
    pub http2_keep_alive_timeout: Duration,
    /// A response body the connection has not taken for this long (the client does not
    /// read) is dropped, cancelling its upstream request; zero: never.
    pub send_stall_timeout: Duration,
    /// HTTP/1 responses are written flattened: hyper copies each body frame into the
    /// connection's write buffer and writes it with one `write`, instead of queueing the frame
    /// and writing vectored. The frame is then dropped at once, so the upstream connection's
    /// read buffer, which the frame is a slice of, is free again before its next read; queued,
    /// hyper found it shared and allocated a fresh 8 KiB buffer for every event (the A/B in
    /// docs/benchmarks.md). Only for listeners whose bodies are `proxy::body::ResponseBody`,
    /// which hands frames in pieces of at most `PIECE_BYTES` and lets the connection write
    /// them out between pieces, so the write buffer, which keeps its capacity, stays at the
    /// 8 KiB it starts with for a client that keeps up.
    pub flatten_writes: bool,
    /// Where accepted connections are served: on these threads, each its own single-threaded
    /// runtime (the data listener with `proxy.workers` ≥ 1), or, with `None`, as tasks of the
    /// runtime the listener runs on.
    pub workers: Option<Arc<ConnectionWorkers>>,
}

impl std::fmt::Debug for ServerOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerOptions")
            .field("name", &self.name)
            .field("http2", &self.http2)
            .field("tls", &self.tls.is_some())
            .field("max_connections", &self.max_connections)
            .field("workers", &self.workers.as_ref().map(|w| w.len()))
            .finish_non_exhaustive()
    }
}

/// Connection limit of listeners built with [`ServerOptions::plain`] (admin, simulator).
pub const PLAIN_MAX_CONNECTIONS: usize = 1024;

/// HTTP/2 streams per connection of listeners built with [`ServerOptions::plain`] (and the
/// data listener's default, `proxy.http2_max_concurrent_streams`).
pub const DEFAULT_MAX_CONCURRENT_STREAMS: u32 = 100;

/// Bytes buffered per stream on each side by default (`proxy.max_stream_buffer`).
pub const DEFAULT_STREAM_BUFFER: usize = 64 * 1024;

impl ServerOptions {
    /// Plain HTTP/1.1 + h2c with conservative limits (admin, simulator, tests).
    pub fn plain(name: &'static str) -> Self {
        Self {
            name,
            header_read_timeout: Duration::from_secs(10),
            max_header_bytes: 64 * 1024,
            http2: true,
            tls: None,
            grace: Duration::from_secs(5),
            max_connections: PLAIN_MAX_CONNECTIONS,
            faults: Arc::default(),
            http2_max_concurrent_streams: DEFAULT_MAX_CONCURRENT_STREAMS,
            http2_max_send_buffer: DEFAULT_STREAM_BUFFER,
            http2_keep_alive_interval: Duration::from_secs(30),
            http2_keep_alive_timeout: Duration::from_secs(10),
            send_stall_timeout: Duration::from_secs(30),
            flatten_writes: false,
            workers: None,
        }
    }
}

/// First pause after accepting failed for lack of resources, doubled up to [`BACKOFF_MAX`].
const BACKOFF_START: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(1);

/// The accept loop's back-off when the process runs out of descriptors (EMFILE, ENFILE) or
/// buffers: retrying at once would spin and log thousands of times a second, so it pauses,
/// longer each time, and says so once per episode.
#[derive(Debug, Default)]
struct AcceptBackoff {
    /// Failures in the current episode (0: accepting works).
    failures: u64,
    delay: Duration,
}

impl AcceptBackoff {
    /// Whether an accept error concerns one connection only (it went away before we took
    /// it): those are skipped at once. Every other error means the listener itself cannot
    /// accept now, EMFILE included.
    fn is_per_connection(error: &std::io::Error) -> bool {
        use std::io::ErrorKind;
        matches!(
            error.kind(),
            ErrorKind::ConnectionAborted
                | ErrorKind::ConnectionReset
                | ErrorKind::Interrupted
                | ErrorKind::WouldBlock
        )
    }

    /// The pause after a failed accept, logging the first failure of an episode.
    fn failed(&mut self, listener: &'static str, error: &std::io::Error) -> Duration {
        self.failures += 1;
        if self.failures == 1 {
            self.delay = BACKOFF_START;
            tracing::warn!(
                listener,
                %error,
                "cannot accept connections; backing off until it works again"
            );
        } else {
            self.delay = (self.delay * 2).min(BACKOFF_MAX);
        }
        self.delay
    }

    /// An accept worked: ends the episode, saying so if there was one.
    fn accepted(&mut self, listener: &'static str) {
        if self.failures > 0 {
            tracing::warn!(
                listener,
                failures = self.failures,
                "accepting connections again"
            );
            self.failures = 0;
        }
    }
}

/// Tells the connection task that a request head arrived (hyper calls the service once per
/// request), which ends the first-request deadline, and gives each request its send watch.
struct ConnService<S> {
    inner: S,
    seen: Arc<Notify>,
    streams: Arc<ConnStreams>,
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

/// The hyper builder of one connection: its HTTP/2 streams run on `executor`.
fn connection_builder(
    options: &ServerOptions,
    executor: StreamExecutor,
) -> auto::Builder<StreamExecutor> {
    let mut builder = auto::Builder::new(executor);
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(options.header_read_timeout)
        .max_buf_size(options.max_header_bytes.max(8192));
    if options.flatten_writes {
        builder.http1().writev(false);
    }
    let keep_alive =
        (!options.http2_keep_alive_interval.is_zero()).then_some(options.http2_keep_alive_interval);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(options.http2_max_concurrent_streams.max(1))
        // hyper asserts the send buffer fits a u32.
        .max_send_buf_size(options.http2_max_send_buffer.clamp(1024, u32::MAX as usize))
        .keep_alive_interval(keep_alive)
        .keep_alive_timeout(options.http2_keep_alive_timeout);
    if !options.http2 {
        builder = builder.http1_only();
    }
    builder
}

/// hyper's HTTP/1 server settings, for connections known to be HTTP/1: those of
/// [`connection_builder`]'s HTTP/1 side, and the head limit exact.
fn http1_builder(options: &ServerOptions) -> http1::Builder {
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(options.header_read_timeout)
        .max_buf_size(options.max_header_bytes.max(8192))
        .max_header_size(options.max_header_bytes);
    if options.flatten_writes {
        builder.writev(false);
    }
    builder
}

/// How long connections get to close once the grace period is over and they were told to.
const CLOSE_WAIT: Duration = Duration::from_secs(2);

/// Serves `listener` until `shutdown`, then waits up to `options.grace` for open connections,
/// then closes those still open (their requests end as client aborts, recorded) and waits
/// for them to finish.
/// `make_service` builds one service per connection from the peer address.
pub async fn serve<M, S, B>(
    listener: TcpListener,
    options: ServerOptions,
    make_service: M,
    shutdown: Shutdown,
) where
    M: Fn(SocketAddr) -> S,
    S: ConnectionService<B>,
    B: ServedBody,
{
    serve_until(listener, options, make_service, shutdown, None).await;
}

/// [`serve`], with a second signal that cuts the grace period short.
pub async fn serve_until<M, S, B>(
    listener: TcpListener,
    options: ServerOptions,
    make_service: M,
    mut shutdown: Shutdown,
    cut_short: Option<Shutdown>,
) where
    M: Fn(SocketAddr) -> S,
    S: ConnectionService<B>,
    B: ServedBody,
{
    let acceptor = options.tls.clone().map(TlsAcceptor::from);
    let http1 = http1_builder(&options);
    let (drain_tx, drain_rx) = watch::channel(Drain::Serving);
    // At most u32::MAX: the drain below takes every permit back in one call.
    let limit = options
        .max_connections
        .clamp(1, Semaphore::MAX_PERMITS.min(u32::MAX as usize));
    let slots = Arc::new(Semaphore::new(limit));
    let mut backoff = AcceptBackoff::default();
    let mut at_limit = false;
    loop {
        // A free slot first: at the limit, stop accepting until a connection closes.
        let permit = match Arc::clone(&slots).try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                options.faults.add(Fault::ConnectionLimit);
                if !at_limit {
                    at_limit = true;
                    tracing::warn!(
                        listener = options.name,
                        limit = options.max_connections,
                        "connection limit reached; accepting paused until a connection closes (each open stream holds a connection: raise proxy.max_connections, or the descriptor limit it follows when 0)"
                    );
                }
                tokio::select! {
                    permit = Arc::clone(&slots).acquire_owned() => match permit {
                        Ok(permit) => permit,
                        Err(_) => break, // the semaphore is never closed
                    },
                    _ = shutdown.wait() => break,
                }
            }
        };
        if at_limit && slots.available_permits() > 0 {
            at_limit = false;
            tracing::info!(listener = options.name, "below the connection limit again");
        }
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.wait() => break,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(error) if AcceptBackoff::is_per_connection(&error) => {
                tracing::debug!(listener = options.name, %error, "a connection went away before it was accepted");
                continue;
            }
            Err(error) => {
                options.faults.add(Fault::AcceptBackoff);
                let pause = backoff.failed(options.name, &error);
                // The slot goes back while we wait: nothing holds it.
                drop(permit);
                tokio::select! {
                    _ = tokio::time::sleep(pause) => continue,
                    _ = shutdown.wait() => break,
                }
            }
        };
        backoff.accepted(options.name);
        let _ = stream.set_nodelay(true);
        let deadline = Instant::now() + options.header_read_timeout;
        let seen = Arc::new(Notify::new());
        let placement = options.workers.as_ref().and_then(|w| w.place());
        let (worker, open) = match placement {
            Some(placement) => (Some(placement.handle), Some(placement.open)),
            None => (None, None),
        };
        let streams = Arc::new(ConnStreams::new(
            options.send_stall_timeout,
            Arc::clone(&options.faults),
            options.name,
            permit,
            open,
        ));
        let service = ConnService {
            inner: make_service(peer),
            seen: Arc::clone(&seen),
            streams: Arc::clone(&streams),
        };
        let connection = Connection {
            builder: connection_builder(
                &options,
                StreamExecutor {
                    streams: Arc::clone(&streams),
                },
            ),
            http1: http1.clone(),
            bounds: Bounds {
                streams,
                drain: drain_rx.clone(),
                deadline,
                idle: options.header_read_timeout,
                seen,
                faults: Arc::clone(&options.faults),
                name: options.name,
                peer,
            },
        };
        // Two task types, so that a plain connection's task is its `serve` future alone
        // (~2 KiB): one async block holding both arms was sized for the TLS arm, handshake
        // and stream included (8.5 KiB), and a task's future is copied whole into its
        // allocation, so every idle HTTP/1 stream paid for it in resident memory.
        let name = options.name;
        match acceptor.clone() {
            None => spawn_connection(worker, stream, (name, peer), move |stream| {
                serve_plain(connection, stream, service)
            }),
            Some(acceptor) => spawn_connection(worker, stream, (name, peer), move |stream| {
                serve_tls(connection, acceptor, stream, service)
            }),
        }
    }
    drop(listener);
    drop(drain_rx);
    tracing::info!(listener = options.name, grace = ?options.grace, "stopped accepting; draining connections");
    let _ = drain_tx.send(Drain::Draining);
    // Every connection holds a slot: all of them free means all connections closed.
    let all_closed = slots.acquire_many(u32::try_from(limit).unwrap_or(u32::MAX));
    tokio::pin!(all_closed);
    let mut cut_short = cut_short;
    let cut = async {
        match cut_short.as_mut() {
            Some(cut) => cut.wait().await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = &mut all_closed => return,
        _ = tokio::time::sleep(options.grace) => {
            tracing::warn!(listener = options.name, "grace period over; closing remaining connections");
        }
        _ = cut => {
            tracing::warn!(listener = options.name, "second signal; closing remaining connections now");
        }
    }
    let _ = drain_tx.send(Drain::Close);
    if tokio::time::timeout(CLOSE_WAIT, all_closed).await.is_err() {
        tracing::warn!(
            listener = options.name,
            "connections still open after being closed"
        );
    }
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
async fn serve_plain<S, B>(mut connection: Connection, stream: TcpStream, service: ConnService<S>)
where
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
fn spawn_connection<F, Fut>(
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
async fn serve_tls<S, B>(
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
enum Drain {
    Serving,
    /// Finish what is in flight, take nothing new (HTTP/2 GOAWAY, HTTP/1 `connection: close`).
    Draining,
    /// The grace period is over: close now.
    Close,
}

/// One accepted connection: how to serve it, and what bounds it.
struct Connection {
    /// For connections whose protocol is not known before hyper reads (HTTP/2, TLS without
    /// ALPN, undecided first bytes).
    builder: auto::Builder<StreamExecutor>,
    /// For connections known to be HTTP/1: hyper's own, whose head limit is exact
    /// (`max_header_size`; hyper-util's detection exposes only the read buffer's limit,
    /// which a head already waiting in the socket can overshoot by up to twice).
    http1: http1::Builder,
    bounds: Bounds,
}

/// What bounds one connection, whichever protocol it speaks.
struct Bounds {
    streams: Arc<ConnStreams>,
    drain: watch::Receiver<Drain>,
    /// When the first request head must have arrived.
    deadline: Instant,
    /// An HTTP/2 connection without streams for this long is closed.
    idle: Duration,
    seen: Arc<Notify>,
    faults: Arc<FaultCounters>,
    name: &'static str,
    peer: SocketAddr,
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
            let idle_deadline = idle.map(|(_, at)| at);
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
                _ = tokio::time::sleep_until(self.deadline), if !first_seen => {
                    self.faults.add(Fault::HeaderTimeout);
                    tracing::debug!(listener = self.name, peer = %self.peer, "no request head within the header read timeout; closed");
                    return;
                }
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
                _ = sleep_until_some(idle_deadline), if !closing => {
                    self.faults.add(Fault::IdleClosed);
                    tracing::debug!(listener = self.name, peer = %self.peer, "HTTP/2 connection idle; closed");
                    closing = true;
                    idle_close_by = Some(Instant::now() + IDLE_CLOSE_GRACE);
                    shut_down(conn.as_mut());
                }
                _ = sleep_until_some(idle_close_by) => {
                    tracing::debug!(listener = self.name, peer = %self.peer, "idle HTTP/2 connection did not finish its GOAWAY; dropped");
                    return;
                }
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

/// Sleeps until `deadline`, or forever without one.
async fn sleep_until_some(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
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
