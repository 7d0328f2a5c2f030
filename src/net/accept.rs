//! The accept loop: connections taken while under the connection limit (accepting pauses at
//! it), the back-off when descriptors run out, each connection handed to a task of its own (or
//! to a connection worker), and the drain and close at shutdown.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{watch, Notify, Semaphore};
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;

use super::connection::{
    serve_plain, serve_tls, spawn_connection, Bounds, ConnService, Connection, ConnectionService,
    Drain, ServedBody,
};
use super::faults::Fault;
use super::options::{connection_builder, http1_builder, ServerOptions};
use super::shutdown::Shutdown;
use super::streams::{ConnStreams, StreamExecutor};

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

#[cfg(test)]
#[path = "accept_tests.rs"]
mod tests;
