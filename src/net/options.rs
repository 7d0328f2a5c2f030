//! How a listener serves its connections ([`ServerOptions`]: timeouts, limits, HTTP/2
//! settings, TLS) and the hyper builders made from them.

use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper_util::rt::TokioTimer;
use hyper_util::server::conn::auto;

use super::faults::FaultCounters;
use super::streams::StreamExecutor;
use super::workers::ConnectionWorkers;

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

/// The hyper builder of one connection: its HTTP/2 streams run on `executor`.
pub(super) fn connection_builder(
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
pub(super) fn http1_builder(options: &ServerOptions) -> http1::Builder {
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
