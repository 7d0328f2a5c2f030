//! Listeners: accepting TCP (and TLS) connections, serving HTTP/1.1 and HTTP/2 on them with
//! hyper, and shutting down gracefully. Shared by the data listener, the admin listener and
//! the simulator. Owns every connection task it spawns, and the limits that keep a hostile
//! peer from holding them: the first-request deadline (TLS handshake, protocol detection and
//! request head together), the connection limit, and the back-off when descriptors run out.

pub mod faults;
pub mod limits;
pub mod redact;
pub mod tls;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::{watch, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;

use faults::{Fault, FaultCounters};

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

/// Waits for SIGINT or SIGTERM.
pub async fn os_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(
            tokio::signal::unix::SignalKind::terminate(),
        ) {
            Ok(term) => term,
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM; only Ctrl-C will stop tokentap");
                let _ = ctrl_c.await;
                return;
            }
        };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

/// How a listener serves its connections.
#[derive(Clone)]
pub struct ServerOptions {
    /// Name used in logs and fault counters ("proxy", "admin", "simulator").
    pub name: &'static str,
    /// Time from accept to a complete first request head: TLS handshake, HTTP/1 vs HTTP/2
    /// detection (an HTTP/2 preface alone does not count) and the head itself. Later request
    /// heads on an HTTP/1 keep-alive connection get the same time from hyper.
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
}

impl std::fmt::Debug for ServerOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerOptions")
            .field("name", &self.name)
            .field("http2", &self.http2)
            .field("tls", &self.tls.is_some())
            .field("max_connections", &self.max_connections)
            .finish_non_exhaustive()
    }
}

/// Connection limit of listeners built with [`ServerOptions::plain`] (admin, simulator).
pub const PLAIN_MAX_CONNECTIONS: usize = 1024;

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
/// request), which ends the first-request deadline.
struct FirstRequest<S> {
    inner: S,
    seen: Arc<Notify>,
}

impl<S, R> hyper::service::Service<R> for FirstRequest<S>
where
    S: hyper::service::Service<R>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn call(&self, request: R) -> Self::Future {
        self.seen.notify_one();
        self.inner.call(request)
    }
}

/// Serves `listener` until `shutdown`, then waits up to `options.grace` for open connections.
/// `make_service` builds one service per connection from the peer address.
pub async fn serve<M, S, B>(
    listener: TcpListener,
    options: ServerOptions,
    make_service: M,
    mut shutdown: Shutdown,
) where
    M: Fn(SocketAddr) -> S,
    S: hyper::service::Service<Request<Incoming>, Response = Response<B>, Error = Infallible>
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(options.header_read_timeout)
        .max_buf_size(options.max_header_bytes.max(8192));
    builder.http2().timer(TokioTimer::new());
    if !options.http2 {
        builder = builder.http1_only();
    }
    let acceptor = options.tls.clone().map(TlsAcceptor::from);
    let graceful = GracefulShutdown::new();
    let slots = Arc::new(Semaphore::new(options.max_connections.max(1)));
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
        let service = FirstRequest {
            inner: make_service(peer),
            seen: Arc::clone(&seen),
        };
        let connection = Connection {
            builder: builder.clone(),
            watcher: graceful.watcher(),
            deadline,
            seen,
            faults: Arc::clone(&options.faults),
            name: options.name,
            peer,
            _slot: permit,
        };
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            match acceptor {
                None => connection.serve(stream, service).await,
                Some(acceptor) => {
                    let tls = match tokio::time::timeout_at(deadline, acceptor.accept(stream)).await
                    {
                        Ok(Ok(tls)) => tls,
                        Ok(Err(error)) => {
                            tracing::debug!(listener = connection.name, peer = %connection.peer, %error, "TLS handshake failed");
                            return;
                        }
                        Err(_) => {
                            connection.faults.add(Fault::HeaderTimeout);
                            tracing::debug!(listener = connection.name, peer = %connection.peer, "TLS handshake timed out");
                            return;
                        }
                    };
                    connection.serve(tls, service).await;
                }
            }
        });
    }
    drop(listener);
    tracing::info!(listener = options.name, grace = ?options.grace, "stopped accepting; draining connections");
    tokio::select! {
        _ = graceful.shutdown() => {}
        _ = tokio::time::sleep(options.grace) => {
            tracing::warn!(listener = options.name, "grace period over; closing remaining connections");
        }
    }
}

/// One accepted connection and what bounds it.
struct Connection {
    builder: auto::Builder<TokioExecutor>,
    watcher: Watcher,
    /// When the first request head must have arrived.
    deadline: Instant,
    seen: Arc<Notify>,
    faults: Arc<FaultCounters>,
    name: &'static str,
    peer: SocketAddr,
    /// The listener's connection slot, given back when the connection ends.
    _slot: OwnedSemaphorePermit,
}

impl Connection {
    /// Serves HTTP on `io` until the connection ends; closes it if no request head arrives by
    /// the deadline. hyper's own header timeout starts only once HTTP/1 is detected, so a peer
    /// that sends nothing, or only an HTTP/2 preface, is bounded here.
    async fn serve<I, S, B>(self, io: I, service: FirstRequest<S>)
    where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
        S: hyper::service::Service<Request<Incoming>, Response = Response<B>, Error = Infallible>
            + Send
            + 'static,
        S::Future: Send + 'static,
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let conn = self
            .builder
            .serve_connection(TokioIo::new(io), service)
            .into_owned();
        let conn = self.watcher.watch(conn);
        tokio::pin!(conn);
        let ended_early = tokio::select! {
            biased;
            result = &mut conn => Some(result),
            _ = self.seen.notified() => None,
            _ = tokio::time::sleep_until(self.deadline) => {
                self.faults.add(Fault::HeaderTimeout);
                tracing::debug!(listener = self.name, peer = %self.peer, "no request head within the header read timeout; closed");
                return;
            }
        };
        let result = match ended_early {
            Some(result) => result,
            None => conn.await,
        };
        if let Err(error) = result {
            tracing::debug!(listener = self.name, peer = %self.peer, error = %error, "connection ended with an error");
        }
    }
}
