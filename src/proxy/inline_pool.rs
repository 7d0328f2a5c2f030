//! HTTP/1 upstream connections, plain or TLS, driven inside the task that reads their response.
//!
//! hyper-util's pooled client spawns one task per upstream connection: each SSE event then
//! crosses tasks twice (the connection task reads it and wakes the client's connection task,
//! which takes it and wakes the connection task back to read on), and on a multi-threaded
//! runtime a cross-task wake often unparks another worker thread: a futex call per event.
//! Here a connection is a value, not a task: the request future writes the request and reads
//! the response head, then the response body ([`DrivenBody`]) reads the socket itself for each
//! frame, so the upstream socket, its HTTP/1 decoding (tokentap's own, [`super::relay`]) and
//! the client's connection all run in the client's task, as nginx runs them in one event loop.
//!
//! The pool keeps idle connections (LIFO, at most `upstream.pool_max_idle`, dropped after
//! `upstream.pool_idle_timeout`). Every open connection holds one of
//! `upstream.max_connections` slots (as [`super::connector::Limited`] does for the pooled
//! client). Used for `http://` and `https://` upstreams without `http2` (TLS by rustls, with
//! the configuration hyper's client would use, offering only `http/1.1`); HTTP/2 upstreams keep
//! hyper-util's client (HTTP/2 multiplexes streams on one connection, so there is no
//! connection per stream to drive), and so does `upstream.inline_connections = false`.
//!
//! What a sidecar must never do to production, and how this pool keeps it:
//! - **Never a request twice.** A request goes again on a fresh connection only when not one
//!   byte of it entered the first connection's socket (the write itself failed at once; over
//!   TLS, plaintext rustls took counts as entered unless that very write failed before a byte
//!   reached the socket, `relay::TlsUpstream`). Once a byte went, the server may have read the
//!   request and started a generation, whatever it did next (closed, reset, said nothing), so
//!   the client gets the failure instead.
//! - **Never another client's bytes.** A connection goes back to the pool only after a
//!   response read exactly to its framing (a length or a chunked body, never one read to the
//!   close), with the whole request written before the answer came (a server that answers
//!   early may not have read the rest), no `close` from the server, and nothing after the
//!   answer: a non-blocking peek of the socket itself at release and again at checkout (not
//!   tokio's cached readiness, which nobody updates while a connection sits idle; over TLS,
//!   what arrived is read into rustls and judged by what it decrypts to, so a session ticket
//!   is no stray byte). A connection is checked out only once it has sat idle
//!   `upstream.pool_reuse_after` (50 ms by default), so bytes a server sends that late show up
//!   in the peek from the first reuse on. Bytes found there are stray (the server sent more
//!   than its answer's framing said): the connection is dropped,
//!   `tokentap_faults_total{fault="upstream_stray_bytes"}` counts it, and the pool turns
//!   careful for [`CAREFUL_FOR`]: a connection is reused only after it has sat idle
//!   [`CAREFUL_SETTLE`] with nothing arriving, so later stray bytes too show up in the peek
//!   rather than in front of the next request. Bytes that arrive after the next request was
//!   written cannot be told apart from its answer in HTTP/1 (docs/operations.md).

use std::collections::VecDeque;
use std::future::poll_fn;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderValue, HOST};
use http::{Request, Response, Uri};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use rustls::pki_types::ServerName;
use rustls::ClientConfig;
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_rustls::TlsConnector;

use super::box_error::BoxError;
use super::connector::acquire_slot;
use super::relay::{
    self, Connection, Decoder, FinalHead, IdleState, Outgoing, RelayError, UpstreamStream,
};
use super::request_body::RequestBody;
use crate::base::lock;
use crate::net::faults::{Fault, FaultCounters};
use crate::stream::body::BodyFailure;

/// A connection not serving a request (a close by the server is seen when it is checked out).
struct Idle {
    connection: Connection,
    since: Instant,
    /// The connection worker whose reactor watches its socket (`net::workers::current`).
    worker: usize,
}

/// How many of the most recently idled connections a checkout looks through for one of its
/// own worker's before it takes the freshest of any.
const SAME_WORKER_SCAN: usize = 64;

/// How long a pool stays careful after it last found stray bytes on a connection.
pub const CAREFUL_FOR: Duration = Duration::from_secs(600);

/// While careful, how long a connection sits idle, with nothing arriving on it, before it
/// carries another request (servers that send stray bytes sent them 3–30 ms late in the
/// cases we reproduced; a second covers those with a wide margin).
pub const CAREFUL_SETTLE: Duration = Duration::from_secs(1);

/// The idle connections, and whether the upstream has been seen sending stray bytes.
#[derive(Default)]
struct IdleSet {
    /// Oldest first.
    connections: VecDeque<Idle>,
    /// Until when reuse waits for [`CAREFUL_SETTLE`] (the last stray bytes + [`CAREFUL_FOR`]).
    careful_until: Option<Instant>,
}

/// What the pool needs to open connections to one upstream.
#[derive(Debug, Clone)]
pub struct InlineOptions {
    pub connect_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_idle: usize,
    /// Least idle time before a connection carries another request
    /// (`upstream.pool_reuse_after`).
    pub reuse_after: Duration,
    pub max_connections: usize,
    /// The read-ahead bound per connection, and the largest response head
    /// (`proxy.max_stream_buffer`, at least 8 KiB).
    pub max_buf_size: usize,
}

/// How an `https://` upstream's connections open TLS.
struct TlsTarget {
    connector: TlsConnector,
    /// SNI, and the name the certificate must carry: the URL's host.
    server_name: ServerName<'static>,
}

/// The connections of one HTTP/1 upstream.
pub struct InlinePool {
    host: String,
    port: u16,
    /// `Some` for an `https://` upstream.
    tls: Option<TlsTarget>,
    /// `Host` of every request (the client's was removed: it addressed tokentap).
    host_header: HeaderValue,
    options: InlineOptions,
    slots: Arc<Semaphore>,
    limit: usize,
    faults: Arc<FaultCounters>,
    idle: Mutex<IdleSet>,
    reaper_started: AtomicBool,
}

impl std::fmt::Debug for InlinePool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InlinePool")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("tls", &self.tls.is_some())
            .field("idle", &lock::lock(&self.idle).connections.len())
            .finish()
    }
}

/// The upstream is not `http://` or `https://` with a host (or an `https://` one came without
/// a TLS configuration, or its host is no name TLS can check): those keep hyper-util's client.
#[derive(Debug)]
pub struct NotInlineUpstream;

impl InlinePool {
    /// `tls` is the client configuration of `https://` upstreams (its ALPN is set to
    /// `http/1.1` here); plain `http://` ones need none.
    pub fn new(
        url: &Uri,
        options: InlineOptions,
        tls: Option<ClientConfig>,
        faults: Arc<FaultCounters>,
    ) -> Result<Arc<Self>, NotInlineUpstream> {
        let default_port = match url.scheme_str() {
            Some("http") => 80,
            Some("https") => 443,
            _ => return Err(NotInlineUpstream),
        };
        let authority = url.authority().ok_or(NotInlineUpstream)?;
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let port = authority.port_u16().unwrap_or(default_port);
        // hyper-util's `set_host`: the port only when it is not the scheme's default.
        let host_header = match authority.port_u16() {
            None => HeaderValue::from_str(authority.host()),
            Some(port) if port == default_port => HeaderValue::from_str(authority.host()),
            Some(port) => HeaderValue::from_str(&format!("{}:{port}", authority.host())),
        }
        .map_err(|_| NotInlineUpstream)?;
        let tls = match (default_port, tls) {
            (80, _) => None,
            (_, None) => return Err(NotInlineUpstream),
            (_, Some(mut config)) => {
                // This client speaks HTTP/1.1 only: a server must not pick h2 over ALPN.
                config.alpn_protocols = vec![b"http/1.1".to_vec()];
                let server_name =
                    ServerName::try_from(host.clone()).map_err(|_| NotInlineUpstream)?;
                Some(TlsTarget {
                    connector: TlsConnector::from(Arc::new(config)),
                    server_name,
                })
            }
        };
        let limit = options.max_connections.clamp(1, Semaphore::MAX_PERMITS);
        Ok(Arc::new(Self {
            host,
            port,
            tls,
            host_header,
            slots: Arc::new(Semaphore::new(limit)),
            limit,
            faults,
            idle: Mutex::new(IdleSet::default()),
            reaper_started: AtomicBool::new(false),
            options,
        }))
    }

    /// Sends `request` (absolute URI towards this upstream) and answers with its response,
    /// whose body drives the connection.
    pub async fn send(
        self: &Arc<Self>,
        mut request: Request<RequestBody>,
    ) -> Result<Response<DrivenBody>, BoxError> {
        origin_form(request.uri_mut());
        request
            .headers_mut()
            .entry(HOST)
            .or_insert_with(|| self.host_header.clone());
        let (head, framing) = relay::encode_head(&mut request);
        let method = request.method().clone();
        let mut body = request.into_body();
        let mut attempts_left = 2u8;
        loop {
            attempts_left -= 1;
            let (reused, mut connection) = self.next_connection().await?;
            // A body read whole can go again, but only if not a byte of it reaches the socket.
            let again = match &body {
                RequestBody::Full(bytes) => Some(RequestBody::Full(bytes.clone())),
                RequestBody::Stream { .. } => None,
            };
            let mut outgoing = Some(Outgoing::new(head.clone(), framing, body));
            let mut write_failed = None;
            let mut received = false;
            // Any byte of the request went into the socket: the server may have it.
            let mut reached = false;
            let answer = poll_fn(|cx| {
                if let Some(out) = outgoing.as_mut() {
                    let written = connection.poll_write(out, cx);
                    reached |= out.reached_socket();
                    match written {
                        Poll::Ready(Ok(())) => outgoing = None,
                        // The client's body failed (or stalled): that is the answer.
                        Poll::Ready(Err(error @ RelayError::RequestBody(_))) => {
                            return Poll::Ready(Err(error))
                        }
                        // The server may have answered early and stopped reading: its
                        // answer, if one comes, still counts.
                        Poll::Ready(Err(error)) => {
                            outgoing = None;
                            write_failed = Some(error);
                        }
                        Poll::Pending => {}
                    }
                }
                connection.poll_head(cx, &method, &mut received)
            })
            .await;
            match answer {
                Ok(FinalHead {
                    response,
                    decoder,
                    keep_alive,
                }) => {
                    connection.drop_empty_buffer();
                    // An answer that came before the whole request was written: the server
                    // may not read the rest, so nothing after it on this connection is
                    // trustworthy.
                    let whole_request_first = outgoing.is_none() && write_failed.is_none();
                    let driver = Driver {
                        connection,
                        outgoing,
                        decoder,
                        keep_alive: keep_alive && whole_request_first,
                        pool: Arc::downgrade(self),
                    };
                    let mut body = DrivenBody {
                        source: Source::Driven(Box::new(driver)),
                    };
                    // A body with nothing in it (HEAD, 204, a zero length) is never polled:
                    // its connection is free now.
                    if body.is_end_stream() {
                        body.end();
                    }
                    return Ok(response.map(|()| body));
                }
                Err(error) => {
                    let error = match write_failed {
                        Some(write) if !received => write,
                        _ => error,
                    };
                    // Garbage where an answer's head should be, on a connection that carried
                    // an answer before: most likely the tail of that answer, sent late.
                    if reused && matches!(error, RelayError::MalformedHead(_)) {
                        self.saw_stray_bytes();
                    }
                    match again {
                        Some(body_again)
                            if !reached
                                && !received
                                && attempts_left > 0
                                && error.closed_unanswered() =>
                        {
                            body = body_again;
                        }
                        _ => return Err(Box::new(error)),
                    }
                }
            }
        }
    }

    /// The server sent bytes no request asked for: counted, and the pool turns careful.
    fn saw_stray_bytes(&self) {
        self.faults.add(Fault::UpstreamStrayBytes);
        let now = Instant::now();
        let was_careful = {
            let mut idle = lock::lock(&self.idle);
            let was = idle.careful_until.is_some_and(|until| until > now);
            idle.careful_until = Some(now + CAREFUL_FOR);
            was
        };
        if !was_careful {
            tracing::warn!(
                upstream = %self.host_header.to_str().unwrap_or("?"),
                "the upstream sent bytes after the end of an answer (more than its framing said); \
                 its connections are reused only after {CAREFUL_SETTLE:?} idle for the next {CAREFUL_FOR:?}"
            );
        }
    }

    /// The most recently idled connection that is still open and clean, of this connection
    /// worker's own when one is among the latest: its socket is registered with the reactor
    /// of the worker that used it last, and one of another worker's would make every event of
    /// this stream wake that worker's thread before this one's. While the pool is careful,
    /// only connections idle [`CAREFUL_SETTLE`] or longer are candidates.
    fn checkout(&self) -> Result<Connection, Option<Instant>> {
        let now = Instant::now();
        let worker = crate::net::workers::current();
        loop {
            let mut connection = {
                let mut idle = lock::lock(&self.idle);
                // The oldest are at the front: those idle past the timeout go first.
                while idle.connections.front().is_some_and(|i| {
                    now.saturating_duration_since(i.since) >= self.options.idle_timeout
                }) {
                    idle.connections.pop_front();
                }
                let settle = match idle.careful_until {
                    Some(until) if until > now => CAREFUL_SETTLE.max(self.options.reuse_after),
                    _ => self.options.reuse_after,
                };
                let settled = if settle.is_zero() {
                    idle.connections.len()
                } else {
                    idle.connections
                        .partition_point(|i| now.saturating_duration_since(i.since) >= settle)
                };
                let from_back = idle
                    .connections
                    .range(..settled)
                    .rev()
                    .take(SAME_WORKER_SCAN)
                    .position(|i| i.worker == worker)
                    .unwrap_or(0);
                let Some(at) = settled.checked_sub(from_back + 1) else {
                    // None settled: when the first of the others will.
                    return Err(idle.connections.get(settled).map(|i| i.since + settle));
                };
                let Some(idle) = idle.connections.remove(at) else {
                    return Err(None);
                };
                idle.connection
            };
            match connection.idle_state() {
                IdleState::Clean => return Ok(connection),
                IdleState::Closed => {}
                IdleState::Stray => self.saw_stray_bytes(),
            }
        }
    }

    /// A connection for the next request: a settled idle one (`true`: reused), else a new one.
    /// When every slot is taken and some of them are idle connections still settling, the
    /// request waits for one to settle (at most `pool_reuse_after`) rather than for a slot.
    async fn next_connection(self: &Arc<Self>) -> Result<(bool, Connection), BoxError> {
        for _ in 0..3 {
            match self.checkout() {
                Ok(connection) => return Ok((true, connection)),
                Err(Some(settles_at)) if self.slots.available_permits() == 0 => {
                    tokio::time::sleep_until(settles_at).await;
                }
                Err(_) => break,
            }
        }
        Ok((false, self.connect().await?))
    }

    /// A new connection, holding a slot (waiting up to `connect_timeout` for one); the TCP
    /// connect and the TLS handshake together take at most `connect_timeout` more.
    async fn connect(self: &Arc<Self>) -> Result<Connection, BoxError> {
        let wait = self.options.connect_timeout;
        let slot = acquire_slot(&self.slots, self.limit, wait, &self.faults).await?;
        let connecting = self.open();
        let stream = if wait.is_zero() {
            connecting.await?
        } else {
            tokio::time::timeout(wait, connecting)
                .await
                .map_err(|_| ConnectTimeout(wait))??
        };
        Ok(Connection::new(stream, self.options.max_buf_size, slot))
    }

    /// The TCP connect, and the TLS handshake for an `https://` upstream.
    async fn open(&self) -> std::io::Result<UpstreamStream> {
        let socket = TcpStream::connect((self.host.as_str(), self.port)).await?;
        socket.set_nodelay(true)?;
        match &self.tls {
            None => Ok(UpstreamStream::Plain(socket)),
            Some(tls) => {
                UpstreamStream::handshake(socket, &tls.connector, tls.server_name.clone()).await
            }
        }
    }

    /// Back to the pool: a connection whose response was read exactly to the end, when
    /// nothing arrived after it.
    fn release(self: &Arc<Self>, mut connection: Connection) {
        match connection.idle_state() {
            IdleState::Clean => {}
            IdleState::Closed => return,
            IdleState::Stray => return self.saw_stray_bytes(),
        }
        if self.options.max_idle == 0 {
            return;
        }
        connection.drop_empty_buffer();
        let mut idle = lock::lock(&self.idle);
        if idle.connections.len() >= self.options.max_idle {
            idle.connections.pop_front();
        }
        idle.connections.push_back(Idle {
            connection,
            since: Instant::now(),
            worker: crate::net::workers::current(),
        });
        drop(idle);
        self.start_reaper();
    }

    /// Closes connections idle past `idle_timeout` even when no request comes to check them
    /// out (their descriptors and slots are freed). One task per pool, ended with the pool.
    fn start_reaper(self: &Arc<Self>) {
        if self.options.idle_timeout.is_zero() || self.reaper_started.swap(true, Ordering::Relaxed)
        {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.reaper_started.store(false, Ordering::Relaxed);
            return;
        };
        let pool = Arc::downgrade(self);
        let idle_timeout = self.options.idle_timeout;
        let every = idle_timeout.max(Duration::from_secs(1));
        runtime.spawn(async move {
            let mut ticks = tokio::time::interval(every);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                let Some(pool) = pool.upgrade() else { return };
                let now = Instant::now();
                let expired: Vec<Idle> = {
                    let mut idle = lock::lock(&pool.idle);
                    let keep = idle.connections.partition_point(|i| {
                        now.saturating_duration_since(i.since) >= idle_timeout
                    });
                    idle.connections.drain(..keep).collect()
                };
                // Closed outside the lock.
                drop(expired);
            }
        });
    }

    /// Connections idle in the pool now.
    pub fn idle_connections(&self) -> usize {
        lock::lock(&self.idle).connections.len()
    }
}

/// The TCP connect (and TLS handshake) took longer than `upstream.connect_timeout`.
#[derive(Debug, thiserror::Error)]
#[error("connecting took longer than {0:?} (upstream.connect_timeout)")]
struct ConnectTimeout(Duration);

fn origin_form(uri: &mut Uri) {
    let origin = match uri.path_and_query() {
        Some(path) if path.as_str() != "/" => {
            let mut parts = http::uri::Parts::default();
            parts.path_and_query = Some(path.clone());
            Uri::from_parts(parts).unwrap_or_default()
        }
        _ => Uri::default(),
    };
    *uri = origin;
}

/// The connection under a response body, back to its pool when the body has ended.
struct Driver {
    connection: Connection,
    /// The rest of the request body, when the upstream answered before it was all sent.
    outgoing: Option<Outgoing>,
    decoder: Decoder,
    /// The server keeps the connection open after this response.
    keep_alive: bool,
    pool: Weak<InlinePool>,
}

/// Why an upstream response body broke off.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamBodyError {
    /// From hyper-util's pooled client (HTTP/2 upstreams, or `inline_connections = false`).
    #[error(transparent)]
    Pooled(#[from] hyper::Error),
    /// From a connection of the inline pool.
    #[error(transparent)]
    Driven(#[from] RelayError),
}

impl BodyFailure for UpstreamBodyError {}

/// An upstream response body; from an [`InlinePool`] it carries and drives its connection.
pub struct DrivenBody {
    source: Source,
}

enum Source {
    /// A body whose connection some other task drives (hyper-util's client).
    Pooled(Incoming),
    /// Boxed: the connection and its buffers are not moved with the response.
    Driven(Box<Driver>),
    /// Read to its end (or broken off): its connection went back to the pool or closed.
    Ended,
}

impl DrivenBody {
    /// A body whose connection some other task drives (hyper-util's client).
    pub fn pooled(incoming: Incoming) -> Self {
        Self {
            source: Source::Pooled(incoming),
        }
    }

    /// The body is over: its connection goes back to the pool when it can serve another.
    fn end(&mut self) {
        let Source::Driven(driver) = std::mem::replace(&mut self.source, Source::Ended) else {
            return;
        };
        let Driver {
            connection,
            outgoing,
            decoder,
            keep_alive,
            pool,
        } = *driver;
        if keep_alive && outgoing.is_none() && decoder.is_end() {
            if let Some(pool) = pool.upgrade() {
                pool.release(connection);
            }
        }
    }
}

impl std::fmt::Debug for DrivenBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match self.source {
            Source::Pooled(_) => "pooled",
            Source::Driven(_) => "driven",
            Source::Ended => "ended",
        };
        f.debug_struct("DrivenBody")
            .field("source", &state)
            .finish()
    }
}

impl Body for DrivenBody {
    type Data = Bytes;
    type Error = UpstreamBodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, UpstreamBodyError>>> {
        let this = self.get_mut();
        let driver = match &mut this.source {
            Source::Pooled(incoming) => {
                return Pin::new(incoming)
                    .poll_frame(cx)
                    .map_err(UpstreamBodyError::from)
            }
            Source::Ended => return Poll::Ready(None),
            Source::Driven(driver) => driver,
        };
        if let Some(out) = driver.outgoing.as_mut() {
            match driver.connection.poll_write(out, cx) {
                Poll::Ready(Ok(())) => driver.outgoing = None,
                // The answer is coming anyway; the connection is not reused after it.
                Poll::Ready(Err(_)) => {
                    driver.outgoing = None;
                    driver.keep_alive = false;
                }
                Poll::Pending => {}
            }
        }
        let frame = ready!(driver.connection.poll_body(cx, &mut driver.decoder));
        // The end shows as `None`, or as `is_end_stream` after the last data frame of a body
        // with a length (hyper's server then never polls for the `None`).
        match &frame {
            None => this.end(),
            Some(Ok(_)) if driver.decoder.is_end() => this.end(),
            Some(Ok(_)) => {}
            Some(Err(_)) => this.source = Source::Ended,
        }
        Poll::Ready(frame.map(|frame| frame.map_err(UpstreamBodyError::from)))
    }

    fn is_end_stream(&self) -> bool {
        match &self.source {
            Source::Pooled(incoming) => incoming.is_end_stream(),
            Source::Driven(driver) => driver.decoder.is_end(),
            Source::Ended => true,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.source {
            Source::Pooled(incoming) => incoming.size_hint(),
            Source::Driven(driver) => driver.decoder.size_hint(),
            Source::Ended => SizeHint::with_exact(0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use std::sync::atomic::AtomicUsize;
    use tokio::net::TcpListener;

    /// A loopback HTTP/1 server answering `host path` (chunked, in `chunks` pieces), counting
    /// the connections it accepted; `close_after_one` answers with `Connection: close`.
    async fn upstream(chunks: usize, close: bool) -> (Uri, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&accepted);
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                        let host = request
                            .headers()
                            .get(HOST)
                            .and_then(|h| h.to_str().ok())
                            .unwrap_or("-")
                            .to_string();
                        let line = format!("{host} {}", request.uri());
                        async move {
                            let pieces: VecDeque<Bytes> = (0..chunks)
                                .map(|i| {
                                    Bytes::from(if i == 0 {
                                        line.clone()
                                    } else {
                                        format!(" {i}")
                                    })
                                })
                                .collect();
                            let body = Chunks(pieces);
                            let mut response = Response::new(body);
                            if close {
                                response.headers_mut().insert(
                                    http::header::CONNECTION,
                                    HeaderValue::from_static("close"),
                                );
                            }
                            Ok::<_, std::convert::Infallible>(response)
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        (format!("http://{address}").parse().unwrap(), accepted)
    }

    /// A body of ready chunks.
    struct Chunks(VecDeque<Bytes>);

    impl Body for Chunks {
        type Data = Bytes;
        type Error = std::convert::Infallible;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            Poll::Ready(self.0.pop_front().map(|chunk| Ok(Frame::data(chunk))))
        }
    }

    fn pool(url: &Uri, idle_timeout: Duration) -> Arc<InlinePool> {
        InlinePool::new(
            url,
            InlineOptions {
                connect_timeout: Duration::from_secs(5),
                idle_timeout,
                max_idle: 8,
                reuse_after: Duration::ZERO,
                max_connections: 4,
                max_buf_size: 8192,
            },
            None,
            Arc::new(FaultCounters::default()),
        )
        .unwrap()
    }

    fn get(url: &Uri, path: &str) -> Request<RequestBody> {
        let uri: Uri = format!("{url}{}", path.trim_start_matches('/'))
            .parse()
            .unwrap();
        Request::builder()
            .uri(uri)
            .body(RequestBody::empty())
            .unwrap()
    }

    async fn text(response: Response<DrivenBody>) -> String {
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn a_connection_read_to_the_end_serves_the_next_request_with_host_and_origin_form() {
        let (url, accepted) = upstream(3, false).await;
        let pool = pool(&url, Duration::from_secs(60));
        let authority = url.authority().unwrap().to_string();
        for round in 0..3 {
            let response = pool
                .send(get(&url, &format!("/v1/x?round={round}")))
                .await
                .unwrap();
            assert_eq!(
                text(response).await,
                format!("{authority} /v1/x?round={round} 1 2")
            );
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
        assert_eq!(pool.idle_connections(), 1);
    }

    #[tokio::test]
    async fn a_body_dropped_early_closes_its_connection() {
        let (url, accepted) = upstream(3, false).await;
        let pool = pool(&url, Duration::from_secs(60));
        let mut body = pool.send(get(&url, "/")).await.unwrap().into_body();
        let first = body.frame().await.unwrap().unwrap();
        assert!(first.is_data());
        drop(body);
        assert_eq!(pool.idle_connections(), 0);
        let response = pool.send(get(&url, "/")).await.unwrap();
        assert!(text(response).await.ends_with("/ 1 2"));
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_connection_the_server_closed_is_not_reused() {
        let (url, accepted) = upstream(1, true).await;
        let pool = pool(&url, Duration::from_secs(60));
        for _ in 0..3 {
            let response = pool.send(get(&url, "/a")).await.unwrap();
            assert!(text(response).await.ends_with(" /a"));
            // Let the server's close reach the idle connection.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn an_idle_connection_the_server_dropped_is_replaced_unseen() {
        use tokio::io::AsyncWriteExt;
        // Keep-alive answers, then the server drops the idle connection 30 ms later.
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url: Uri = format!("http://{}", listener.local_addr().unwrap())
            .parse()
            .unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&accepted);
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    if !read_head(&mut stream).await {
                        return;
                    }
                    let _ = stream
                        .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                        .await;
                    tokio::time::sleep(Duration::from_millis(30)).await;
                });
            }
        });
        let pool = pool(&url, Duration::from_secs(60));
        for _ in 0..2 {
            let response = pool.send(get(&url, "/")).await.unwrap();
            assert_eq!(text(response).await, "ok");
            assert_eq!(pool.idle_connections(), 1);
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn at_most_max_connections_then_at_capacity() {
        let (url, _) = upstream(2, false).await;
        let pool = InlinePool::new(
            &url,
            InlineOptions {
                connect_timeout: Duration::from_millis(100),
                idle_timeout: Duration::from_secs(60),
                max_idle: 8,
                reuse_after: Duration::ZERO,
                max_connections: 1,
                max_buf_size: 8192,
            },
            None,
            Arc::new(FaultCounters::default()),
        )
        .unwrap();
        // The first response's body is held open (not read to the end): its connection is busy.
        let held = pool.send(get(&url, "/")).await.unwrap();
        let error = pool.send(get(&url, "/")).await.unwrap_err();
        assert!(
            super::super::connector::at_capacity(&*error).is_some(),
            "{error}"
        );
        drop(held);
        let response = pool.send(get(&url, "/")).await.unwrap();
        assert!(text(response).await.ends_with("/ 1"));
    }

    #[tokio::test]
    async fn idle_connections_close_after_the_idle_timeout() {
        let (url, _) = upstream(1, false).await;
        let pool = pool(&url, Duration::from_secs(1));
        let response = pool.send(get(&url, "/")).await.unwrap();
        text(response).await;
        assert_eq!(pool.idle_connections(), 1);
        // The reaper runs every second; bounded wait.
        for _ in 0..40 {
            if pool.idle_connections() == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(pool.idle_connections(), 0);
    }

    /// Reads one request head off `stream`, byte by byte: false when the client closed first.
    async fn read_head(stream: &mut tokio::net::TcpStream) -> bool {
        use tokio::io::AsyncReadExt;
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            if stream.read(&mut byte).await.unwrap_or(0) == 0 {
                return false;
            }
            head.push(byte[0]);
        }
        true
    }

    /// A raw upstream: on each connection it reads one request head per answer in `answers`
    /// and writes that answer, then closes. Counts connections and request heads.
    async fn scripted(
        answers: &'static [&'static [u8]],
    ) -> (Uri, Arc<AtomicUsize>, Arc<AtomicUsize>) {
        use tokio::io::AsyncWriteExt;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url: Uri = format!("http://{}", listener.local_addr().unwrap())
            .parse()
            .unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let heads = Arc::new(AtomicUsize::new(0));
        let (count, seen) = (Arc::clone(&accepted), Arc::clone(&heads));
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                let seen = Arc::clone(&seen);
                tokio::spawn(async move {
                    for answer in answers {
                        if !read_head(&mut stream).await {
                            return;
                        }
                        seen.fetch_add(1, Ordering::SeqCst);
                        if stream.write_all(answer).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (url, accepted, heads)
    }

    #[tokio::test]
    async fn an_empty_answer_frees_its_connection_without_being_read() {
        // A third answer keeps the connection open after the second (a server's close shows
        // in the release's peek).
        let (url, accepted, _) = scripted(&[
            b"HTTP/1.1 204 No Content\r\n\r\n",
            b"HTTP/1.1 204 No Content\r\n\r\n",
            b"HTTP/1.1 204 No Content\r\n\r\n",
        ])
        .await;
        let pool = pool(&url, Duration::from_secs(60));
        for _ in 0..2 {
            let response = pool.send(get(&url, "/")).await.unwrap();
            assert_eq!(response.status(), 204);
            assert!(response.body().is_end_stream());
            assert_eq!(pool.idle_connections(), 1);
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_request_the_server_read_is_never_sent_again() {
        // The first connection answers once and then closes on reading the next head (the
        // keep-alive race, or a server that dropped the request): that request reached the
        // server, so it fails rather than going again.
        let (url, accepted, heads) =
            scripted(&[b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\na", b""]).await;
        let pool = pool(&url, Duration::from_secs(60));
        let response = pool.send(get(&url, "/")).await.unwrap();
        assert_eq!(text(response).await, "a");
        let error = pool.send(get(&url, "/")).await.unwrap_err();
        assert!(error.to_string().contains("before answering"), "{error}");
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
        assert_eq!(heads.load(Ordering::SeqCst), 2);
        // A fresh connection that closes unanswered is an error, not a loop.
        let (url, accepted, _) = scripted(&[b""]).await;
        let pool = pool_for(&url);
        let error = pool.send(get(&url, "/")).await.unwrap_err();
        assert!(error.to_string().contains("before answering"), "{error}");
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_connection_is_reused_only_once_it_has_settled() {
        let (url, accepted) = upstream(1, false).await;
        let pool = InlinePool::new(
            &url,
            InlineOptions {
                connect_timeout: Duration::from_secs(5),
                idle_timeout: Duration::from_secs(60),
                max_idle: 8,
                reuse_after: Duration::from_millis(200),
                max_connections: 4,
                max_buf_size: 8192,
            },
            None,
            Arc::new(FaultCounters::default()),
        )
        .unwrap();
        for _ in 0..2 {
            text(pool.send(get(&url, "/")).await.unwrap()).await;
        }
        // Back to back: the first connection had not settled, so a second one was opened.
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
        tokio::time::sleep(Duration::from_millis(250)).await;
        text(pool.send(get(&url, "/")).await.unwrap()).await;
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn stray_bytes_after_an_answer_drop_the_connection_and_make_the_pool_careful() {
        // An answer framed by its length, then more bytes in the same write.
        let (url, accepted, heads) = scripted(&[
            b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\naHTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nstray",
        ])
        .await;
        let faults = Arc::new(FaultCounters::default());
        let pool = InlinePool::new(
            &url,
            InlineOptions {
                connect_timeout: Duration::from_secs(5),
                idle_timeout: Duration::from_secs(60),
                max_idle: 8,
                reuse_after: Duration::ZERO,
                max_connections: 4,
                max_buf_size: 8192,
            },
            None,
            Arc::clone(&faults),
        )
        .unwrap();
        assert_eq!(text(pool.send(get(&url, "/")).await.unwrap()).await, "a");
        assert_eq!(
            pool.idle_connections(),
            0,
            "a connection with stray bytes was kept"
        );
        assert_eq!(faults.get(Fault::UpstreamStrayBytes), 1);
        assert!(lock::lock(&pool.idle)
            .careful_until
            .is_some_and(|until| until > Instant::now()));
        assert_eq!(text(pool.send(get(&url, "/")).await.unwrap()).await, "a");
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
        assert_eq!(heads.load(Ordering::SeqCst), 2);
    }

    fn pool_for(url: &Uri) -> Arc<InlinePool> {
        pool(url, Duration::from_secs(60))
    }

    #[tokio::test]
    async fn a_body_to_the_close_ends_with_the_close_and_its_connection_is_not_kept() {
        let (url, _, _) =
            scripted(&[b"HTTP/1.0 200 OK\r\ncontent-type: text/plain\r\n\r\nhello"]).await;
        let pool = pool_for(&url);
        let response = pool.send(get(&url, "/")).await.unwrap();
        assert_eq!(response.version(), http::Version::HTTP_10);
        assert_eq!(text(response).await, "hello");
        assert_eq!(pool.idle_connections(), 0);
        // Cut short: an error, never a clean end.
        let (url, _, _) = scripted(&[b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\nhel"]).await;
        let pool = pool_for(&url);
        let body = pool.send(get(&url, "/")).await.unwrap().into_body();
        let error = body.collect().await.unwrap_err();
        assert!(
            error.to_string().contains("6 bytes before the end"),
            "{error}"
        );
        let (url, _, _) =
            scripted(&[b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n"]).await;
        let pool = pool_for(&url);
        let body = pool.send(get(&url, "/")).await.unwrap().into_body();
        assert!(body.collect().await.is_err());
    }

    #[tokio::test]
    async fn streamed_request_bodies_go_chunked_and_an_early_answer_is_taken() {
        // An echo of the body the upstream received, as hyper's server decoded it.
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url: Uri = format!("http://{}", listener.local_addr().unwrap())
            .parse()
            .unwrap();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let service =
                        hyper::service::service_fn(|request: Request<Incoming>| async move {
                            let chunked = request
                                .headers()
                                .get(http::header::TRANSFER_ENCODING)
                                .is_some_and(|v| v == "chunked");
                            let body = request.into_body().collect().await?.to_bytes();
                            let answer = format!("{chunked} {}", String::from_utf8_lossy(&body));
                            Ok::<_, hyper::Error>(Response::new(http_body_util::Full::new(
                                Bytes::from(answer),
                            )))
                        });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        let pool = pool_for(&url);
        let pieces: VecDeque<Bytes> = ["one ", "two ", "three"]
            .into_iter()
            .map(Bytes::from)
            .collect();
        let request = Request::builder()
            .method(http::Method::POST)
            .uri(format!("{url}echo"))
            .body(RequestBody::Stream {
                prefix: Some(Bytes::from_static(b"zero ")),
                rest: Box::pin(
                    Chunks(pieces)
                        .map_err(|never: std::convert::Infallible| -> BoxError { match never {} }),
                ),
            })
            .unwrap();
        let response = pool.send(request).await.unwrap();
        assert_eq!(text(response).await, "true zero one two three");
        assert_eq!(pool.idle_connections(), 1);

        // An upstream that answers 413 on the head alone, while the body is still coming.
        let (url, _, _) =
            scripted(&[b"HTTP/1.1 413 Payload Too Large\r\ncontent-length: 7\r\n\r\ntoo big"])
                .await;
        let pool = pool_for(&url);
        let request = Request::builder()
            .method(http::Method::POST)
            .uri(format!("{url}upload"))
            .body(RequestBody::Stream {
                prefix: Some(Bytes::from_static(b"start")),
                rest: Box::pin(Never),
            })
            .unwrap();
        let response = pool.send(request).await.unwrap();
        assert_eq!(response.status(), 413);
        assert_eq!(text(response).await, "too big");
        // Its request was never finished: the connection is not kept.
        assert_eq!(pool.idle_connections(), 0);
    }

    /// A streamed body that never sends anything more.
    struct Never;

    impl Body for Never {
        type Data = Bytes;
        type Error = BoxError;
        fn poll_frame(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
            Poll::Pending
        }
    }

    #[test]
    fn http_and_https_upstreams_with_their_default_ports() {
        let faults = Arc::new(FaultCounters::default());
        let options = InlineOptions {
            connect_timeout: Duration::ZERO,
            idle_timeout: Duration::ZERO,
            max_idle: 0,
            reuse_after: Duration::ZERO,
            max_connections: 1,
            max_buf_size: 8192,
        };
        let tls = crate::net::tls::client_config(None, None).unwrap();
        let new = |url: &str, tls: Option<ClientConfig>| {
            let url: Uri = url.parse().unwrap();
            InlinePool::new(&url, options.clone(), tls, Arc::clone(&faults))
        };
        // An https:// upstream needs its TLS configuration; other schemes are not for it.
        assert!(new("https://example.test/", None).is_err());
        assert!(new("ftp://example.test/", Some(tls.clone())).is_err());
        let pool = new("http://[::1]:8000/", None).unwrap();
        assert_eq!((pool.host.as_str(), pool.port), ("::1", 8000));
        assert_eq!(pool.host_header, "[::1]:8000");
        assert!(pool.tls.is_none());
        for (url, port, host_header) in [
            ("https://example.test/", 443, "example.test"),
            ("https://example.test:443/", 443, "example.test"),
            ("https://example.test:8443/", 8443, "example.test:8443"),
            ("https://127.0.0.1:80/", 80, "127.0.0.1:80"),
        ] {
            let pool = new(url, Some(tls.clone())).unwrap();
            assert_eq!(pool.port, port, "{url}");
            assert_eq!(pool.host_header, host_header, "{url}");
            assert!(pool.tls.is_some(), "{url}");
        }
        let pool = new("http://example.test:80/", None).unwrap();
        assert_eq!(pool.host_header, "example.test");
    }
}
