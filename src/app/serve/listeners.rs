//! The two listeners of `tokentap serve`: binding them, what a bind failure says, and how each
//! serves — the data listener's TLS, connection limit and worker threads, the admin listener's
//! limits.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;
use tokio::net::TcpListener;

use crate::app::proxy::upstream_descriptors;
use crate::config::Config;
use crate::net::workers::ConnectionWorkers;
use crate::net::{self, ServerOptions};
use crate::proxy::Proxy;

/// Which of `tokentap serve`'s listeners a bind failure is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener {
    /// The data listener: `--listen`, `proxy.listen` (default 0.0.0.0:8000).
    Data,
    /// The admin listener: `--admin`, `admin.listen` (default 127.0.0.1:9464).
    Admin,
}

impl Listener {
    /// The flag and the setting that choose its address.
    fn chosen_by(self) -> &'static str {
        match self {
            Listener::Data => "--listen or proxy.listen",
            Listener::Admin => "--admin or admin.listen",
        }
    }
}

/// What `tokentap serve` says when `listener` cannot bind `addr`. A busy port is another
/// process's, named with the flag and setting that choose another (and, only for 8000, the
/// data listener's default, that vLLM listens there too); the admin listener on the data
/// listener's port (`data`, once bound) is said as such; any other failure keeps the system's
/// reason.
pub fn bind_error(
    listener: Listener,
    addr: SocketAddr,
    error: &std::io::Error,
    data: Option<SocketAddr>,
) -> String {
    let port = addr.port();
    let chosen_by = listener.chosen_by();
    if error.kind() != std::io::ErrorKind::AddrInUse {
        return format!("cannot listen on {addr} (chosen by {chosen_by}): {error}");
    }
    if listener == Listener::Admin && data.is_some_and(|data| data.port() == port) {
        return format!(
            "cannot listen on {addr}: the data listener (--listen or proxy.listen) is on port {port}; give the admin listener another with {chosen_by}"
        );
    }
    let vllm = if listener == Listener::Data && port == 8000 {
        " (vLLM also listens on 8000 by default)"
    } else {
        ""
    };
    // The example keeps the host that was asked for: a user who bound 127.0.0.1 on purpose
    // is not told to open the port to every interface.
    let example = match listener {
        Listener::Data if port == 8000 => {
            format!(", e.g. --listen {}", SocketAddr::new(addr.ip(), 8100))
        }
        _ => String::new(),
    };
    format!("cannot listen on {addr}: another process holds port {port}{vllm}; choose another with {chosen_by}{example}")
}

/// Binds the data listener, then the admin listener, where the configuration says.
pub async fn bind(config: &Config) -> anyhow::Result<(TcpListener, TcpListener)> {
    let data = TcpListener::bind(config.proxy.listen)
        .await
        .map_err(|error| {
            anyhow::anyhow!(bind_error(
                Listener::Data,
                config.proxy.listen,
                &error,
                None
            ))
        })?;
    let data_addr = data.local_addr().ok();
    let admin = TcpListener::bind(config.admin.listen)
        .await
        .map_err(|error| {
            anyhow::anyhow!(bind_error(
                Listener::Admin,
                config.admin.listen,
                &error,
                data_addr
            ))
        })?;
    Ok((data, admin))
}

/// How each listener serves, decided once from the configuration.
pub struct ListenerOptions {
    pub data: ServerOptions,
    pub admin: ServerOptions,
    /// How many connections the data listener holds and why (logged after the first line).
    pub connection_limit: String,
}

impl ListenerOptions {
    /// The data listener's options share `proxy`'s fault counters, so a connection the
    /// listener cuts is counted beside the proxy's own faults.
    pub fn new(config: &Config, proxy: &Proxy) -> anyhow::Result<Self> {
        let tls = data_tls(config)?;
        let (max_connections, connection_limit) = data_connection_limit(config);
        let workers = connection_workers(config)?;
        let data = ServerOptions {
            name: "proxy",
            header_read_timeout: config.proxy.header_read_timeout,
            max_header_bytes: config.proxy.max_header_bytes,
            http2: config.proxy.http2,
            tls,
            grace: config.proxy.shutdown_grace,
            max_connections,
            faults: Arc::clone(&proxy.faults),
            http2_max_concurrent_streams: config.proxy.http2_max_concurrent_streams,
            http2_max_send_buffer: config.proxy.max_stream_buffer,
            http2_keep_alive_interval: config.proxy.http2_keep_alive_interval,
            http2_keep_alive_timeout: config.proxy.http2_keep_alive_timeout,
            send_stall_timeout: config.proxy.send_stall_timeout,
            // Both listeners answer with `ResponseBody`, which paces what it hands over.
            flatten_writes: true,
            workers,
        };
        let admin = ServerOptions {
            header_read_timeout: config.proxy.header_read_timeout,
            flatten_writes: true,
            max_connections: config.admin.max_connections,
            // A streamed export (`GET /workload`) whose client stops reading is cut like a
            // proxied stream, freeing its export slot.
            send_stall_timeout: config.proxy.send_stall_timeout,
            ..ServerOptions::plain("admin")
        };
        Ok(Self {
            data,
            admin,
            connection_limit,
        })
    }
}

/// The data listener's TLS (`[proxy.tls]`), offering HTTP/2 by ALPN when `proxy.http2` is on.
fn data_tls(config: &Config) -> anyhow::Result<Option<Arc<rustls::ServerConfig>>> {
    let Some(tls) = &config.proxy.tls else {
        return Ok(None);
    };
    let alpn: &[&[u8]] = if config.proxy.http2 {
        &[b"h2", b"http/1.1"]
    } else {
        &[b"http/1.1"]
    };
    Ok(Some(Arc::new(
        net::tls::server_config(&tls.cert, &tls.key, tls.client_ca.as_deref(), alpn)
            .context("cannot set up TLS on the data listener (tls.*)")?,
    )))
}

/// How many connections the data listener holds, and that number said with its reason. The
/// descriptor limit decides how many streams one process can hold.
fn data_connection_limit(config: &Config) -> (usize, String) {
    let (max_connections, descriptors) = net::limits::data_listener_limit(
        config.proxy.max_connections,
        config.admin.max_connections,
        upstream_descriptors(config),
    );
    // After the first line (`run`): a detail of sizing, not what an operator reads first.
    if config.proxy.max_connections == 0 {
        tracing::debug!(
            max_connections,
            descriptor_limit = %descriptors,
            "data listener: at most {max_connections} connections (proxy.max_connections = 0: what the descriptor limit allows after a reserve, at two descriptors per stream with HTTP/1 upstreams, one with HTTP/2 ones); raise LimitNOFILE (ulimit -Hn) to hold more"
        );
    }
    let connection_limit = format!(
        "at most {max_connections} connections ({})",
        if config.proxy.max_connections == 0 {
            format!("the descriptor limit {descriptors} allows; raise LimitNOFILE for more")
        } else {
            "proxy.max_connections".to_owned()
        }
    );
    (max_connections, connection_limit)
}

/// The data listener's own worker threads (`proxy.workers`); none at 0, where connections are
/// tasks of the shared runtime.
fn connection_workers(config: &Config) -> anyhow::Result<Option<Arc<ConnectionWorkers>>> {
    let count = config.proxy.workers;
    if count == 0 {
        return Ok(None);
    }
    let workers = ConnectionWorkers::start(count)
        .context("cannot start the connection workers (proxy.workers)")?;
    tracing::info!(
        workers = workers.len(),
        "data listener: connections served on {count} worker threads of their own (proxy.workers)"
    );
    Ok(Some(workers))
}
