//! Listeners: accepting TCP (and TLS) connections, serving HTTP/1.1 and HTTP/2 on them with
//! hyper, and shutting down gracefully. Shared by the data listener, the admin listener and
//! the simulator. Owns every connection task it spawns.

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
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

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
    /// Name used in logs ("proxy", "admin", "simulator").
    pub name: &'static str,
    pub header_read_timeout: Duration,
    pub max_header_bytes: usize,
    pub http2: bool,
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// After shutdown, connections still open this long are closed.
    pub grace: Duration,
}

impl std::fmt::Debug for ServerOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerOptions")
            .field("name", &self.name)
            .field("http2", &self.http2)
            .field("tls", &self.tls.is_some())
            .finish_non_exhaustive()
    }
}

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
        }
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
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        // EMFILE and friends: back off briefly instead of spinning.
                        tracing::warn!(listener = options.name, %error, "accept failed");
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let service = make_service(peer);
                let builder = builder.clone();
                let watcher = graceful.watcher();
                let acceptor = acceptor.clone();
                let handshake_timeout = options.header_read_timeout;
                let name = options.name;
                tokio::spawn(async move {
                    let result = match acceptor {
                        None => {
                            let conn = builder.serve_connection(TokioIo::new(stream), service);
                            watcher.watch(conn.into_owned()).await
                        }
                        Some(acceptor) => {
                            let tls = match tokio::time::timeout(handshake_timeout, acceptor.accept(stream)).await {
                                Ok(Ok(tls)) => tls,
                                Ok(Err(error)) => {
                                    tracing::debug!(listener = name, %peer, %error, "TLS handshake failed");
                                    return;
                                }
                                Err(_) => {
                                    tracing::debug!(listener = name, %peer, "TLS handshake timed out");
                                    return;
                                }
                            };
                            let conn = builder.serve_connection(TokioIo::new(tls), service);
                            watcher.watch(conn.into_owned()).await
                        }
                    };
                    if let Err(error) = result {
                        tracing::debug!(listener = name, %peer, error = %error, "connection ended with an error");
                    }
                });
            }
            _ = shutdown.wait() => break,
        }
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
