//! `[proxy]` and `[tls]`: the data listener, its limits and timeouts, and its TLS.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::error::{ConfigError, Origins};
use super::raw::{RawProxy, RawRoutes, RawTls};

/// Most connection-worker threads `proxy.workers` may ask for.
pub const MAX_WORKERS: usize = 1024;

#[derive(Debug, Clone, PartialEq)]
pub struct ProxyConfig {
    pub listen: SocketAddr,
    pub shutdown_grace: Duration,
    pub header_read_timeout: Duration,
    pub max_header_bytes: usize,
    pub http2: bool,
    pub tls: Option<ListenerTls>,
    /// Longest gap between frames of a client's request body.
    pub body_idle_timeout: Duration,
    /// Most time to read a metered request body (up to the parse limit) in all.
    pub body_read_timeout: Duration,
    /// Most connections open at once on the data listener; 0: what the descriptor limit allows
    /// (`net::limits::max_connections_for`), decided at start.
    pub max_connections: usize,
    /// Threads of their own serving the data listener's connections (`net::workers`); 0: the
    /// connections are tasks of the shared runtime.
    pub workers: usize,
    /// Most HTTP/2 streams open at once on one client connection.
    pub http2_max_concurrent_streams: u32,
    /// Most response bytes held per stream on each side: the HTTP/2 send buffer per client
    /// stream, the HTTP/2 receive window per upstream stream, the HTTP/1 read buffer per
    /// upstream connection.
    pub max_stream_buffer: usize,
    /// HTTP/2 keep-alive pings this often (zero: none), each answered within the timeout.
    pub http2_keep_alive_interval: Duration,
    pub http2_keep_alive_timeout: Duration,
    /// A response the client has not taken for this long is cancelled (zero: never).
    pub send_stall_timeout: Duration,
    /// Which paths the data port forwards (`proxy::routes`).
    pub routes: RoutePolicyConfig,
    /// Request fields an engine runs as code: refused (the default) or forwarded.
    pub code_fields: super::value::CodeFields,
}

/// `proxy.routes`, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RoutePolicyConfig {
    /// `"safe"` (the default): the engines' inference and read routes (control routes and
    /// paths no engine declares refused).
    Safe,
    /// `"all"`: everything.
    All,
    /// A list of paths (`/x`, or `/x/*` for everything under `/x/`) forwarded; with `"safe"` in
    /// it, these are opened on top of the default, else only these are forwarded.
    List { safe: bool, paths: Vec<String> },
}

impl RoutePolicyConfig {
    fn from_raw(raw: RawRoutes, origins: &Origins) -> Result<Self, ConfigError> {
        const HELP: &str = "expected \"safe\" (the default: the engines' inference and read routes; control routes and paths no engine declares refused), \"all\", or a list of paths such as [\"safe\", \"/flush_cache\"] or [\"/v1/*\", \"/health\"]";
        match raw {
            RawRoutes::One(word) => match word.as_str() {
                "safe" => Ok(RoutePolicyConfig::Safe),
                "all" => Ok(RoutePolicyConfig::All),
                other => Err(origins.error("proxy.routes", format!("`{other}`: {HELP}"))),
            },
            RawRoutes::Many(entries) => {
                let mut safe = false;
                let mut paths = Vec::new();
                for entry in entries {
                    if entry == "safe" {
                        safe = true;
                    } else if entry == "all" {
                        return Err(origins.error(
                            "proxy.routes",
                            "\"all\" stands alone (routes = \"all\"), not in a list",
                        ));
                    } else if !entry.starts_with('/')
                        || entry[..entry.len().saturating_sub(1)].contains('*')
                        || (entry.ends_with('*') && !entry.ends_with("/*"))
                    {
                        return Err(origins.error(
                            "proxy.routes",
                            format!("`{entry}`: a path starts with `/`; `*` only as a last segment (`/v1/*`); {HELP}"),
                        ));
                    } else {
                        paths.push(entry);
                    }
                }
                if !safe && paths.is_empty() {
                    return Err(origins.error(
                        "proxy.routes",
                        format!("an empty list would refuse every request; {HELP}"),
                    ));
                }
                Ok(RoutePolicyConfig::List { safe, paths })
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ListenerTls {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// When set, clients must present a certificate signed by this CA.
    pub client_ca: Option<PathBuf>,
}

impl ListenerTls {
    /// `[tls]`: none, or a certificate and its key (and optionally a client CA).
    pub(super) fn from_raw(raw: RawTls, origins: &Origins) -> Result<Option<Self>, ConfigError> {
        match (raw.cert, raw.key) {
            (Some(cert), Some(key)) => Ok(Some(ListenerTls {
                cert: cert.into(),
                key: key.into(),
                client_ca: raw.client_ca.map(PathBuf::from),
            })),
            (None, None) if raw.client_ca.is_none() => Ok(None),
            (None, None) => Err(origins.error("tls.client_ca", "needs tls.cert and tls.key")),
            (Some(_), None) => Err(origins.error("tls.key", "tls.cert is set, tls.key is missing")),
            (None, Some(_)) => {
                Err(origins.error("tls.cert", "tls.key is set, tls.cert is missing"))
            }
        }
    }
}

impl ProxyConfig {
    pub(super) fn from_raw(
        raw: RawProxy,
        tls: Option<ListenerTls>,
        origins: &Origins,
    ) -> Result<Self, ConfigError> {
        let proxy = ProxyConfig {
            listen: raw.listen,
            shutdown_grace: raw.shutdown_grace,
            header_read_timeout: raw.header_read_timeout,
            max_header_bytes: origins.nonzero("proxy.max_header_bytes", raw.max_header_bytes)?,
            http2: raw.http2,
            tls,
            body_idle_timeout: raw.body_idle_timeout,
            body_read_timeout: raw.body_read_timeout,
            // 0: from the descriptor limit at start (`net::limits`).
            max_connections: origins.size("proxy.max_connections", raw.max_connections)?,
            workers: origins.size("proxy.workers", raw.workers)?,
            http2_max_concurrent_streams: u32::try_from(origins.nonzero(
                "proxy.http2_max_concurrent_streams",
                raw.http2_max_concurrent_streams,
            )?)
            .map_err(|_| origins.error("proxy.http2_max_concurrent_streams", "too large"))?,
            max_stream_buffer: origins.nonzero("proxy.max_stream_buffer", raw.max_stream_buffer)?,
            http2_keep_alive_interval: raw.http2_keep_alive_interval,
            http2_keep_alive_timeout: raw.http2_keep_alive_timeout,
            send_stall_timeout: raw.send_stall_timeout,
            routes: RoutePolicyConfig::from_raw(raw.routes, origins)?,
            code_fields: raw.code_fields,
        };
        if proxy.workers > MAX_WORKERS {
            return Err(origins.error(
                "proxy.workers",
                format!("at most {MAX_WORKERS} (0: the shared runtime)"),
            ));
        }
        if !(8192..=(16 << 20)).contains(&proxy.max_stream_buffer) {
            return Err(origins.error(
                "proxy.max_stream_buffer",
                "must lie between 8192 and 16777216 bytes",
            ));
        }
        if !proxy.http2_keep_alive_interval.is_zero() && proxy.http2_keep_alive_timeout.is_zero() {
            return Err(origins.error(
                "proxy.http2_keep_alive_timeout",
                "must be greater than zero while pings are on",
            ));
        }
        origins.positive("proxy.body_idle_timeout", proxy.body_idle_timeout)?;
        origins.positive("proxy.body_read_timeout", proxy.body_read_timeout)?;
        origins.positive("proxy.header_read_timeout", proxy.header_read_timeout)?;
        if proxy.max_header_bytes < 8192 {
            return Err(origins.error(
                "proxy.max_header_bytes",
                "must be at least 8192 (hyper's minimum)",
            ));
        }
        Ok(proxy)
    }
}
