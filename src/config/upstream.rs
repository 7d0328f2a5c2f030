//! `[upstream]` and `[[upstreams]]`: where requests go, how each server is reached, timed and
//! read, and the rules between them (an extra upstream is chosen by model or path; names are
//! unique).

use std::path::PathBuf;
use std::time::Duration;

use http::Uri;

use super::error::{ConfigError, Origins};
use super::raw::RawUpstream;
use super::value::UsageUnasked;

#[derive(Debug, Clone, PartialEq)]
pub struct UpstreamConfig {
    pub name: String,
    /// Scheme and authority (and optional base path) requests are forwarded to.
    pub url: Uri,
    /// Requests whose `model` is one of these go here (extra upstreams only).
    pub models: Vec<String>,
    /// Requests whose path starts with this go here, with the prefix stripped (extra upstreams only).
    pub path_prefix: Option<String>,
    /// Model label for requests that name none (sglang `/generate`). `None`: the model the
    /// server serves (the first of its `/v1/models`, asked in the background), `"default"`
    /// until it has answered.
    pub default_model: Option<String>,
    pub connect_timeout: Duration,
    /// Longest wait for the response head; zero waits forever (sglang sends headers only at
    /// the first token, which can take minutes for a 1M-token prompt).
    pub response_timeout: Duration,
    /// Longest gap between frames of the response body; zero waits forever.
    pub stream_idle_timeout: Duration,
    pub pool_idle_timeout: Duration,
    pub pool_max_idle: usize,
    /// A kept-alive connection carries another request only after it sat idle this long
    /// (HTTP/1 upstreams, plain or TLS, `proxy::inline_pool`; 50 ms by default): a server that
    /// closes right after its
    /// answer, or sends bytes past its framing, shows it in the socket before the next request
    /// is written there, not after.
    pub pool_reuse_after: Duration,
    /// Most connections open to this upstream at once (in use, idle and being opened); 0: the
    /// data listener's connection limit, resolved when the proxy is built.
    pub max_connections: usize,
    pub http2: bool,
    /// HTTP/1 upstreams, plain or TLS: connections driven inside the client's task
    /// (`proxy::inline_pool`); false: hyper-util's pooled client, a task per connection
    /// (HTTP/2 upstreams always use it).
    pub inline_connections: bool,
    pub tls_ca: Option<PathBuf>,
    pub tls_client_cert: Option<PathBuf>,
    pub tls_client_key: Option<PathBuf>,
    /// What usage the server sends to streams that did not ask for it.
    pub sends_usage_unasked: UsageUnasked,
    /// Path of the server's Prometheus page, read for its own state (running and queued
    /// requests, KV-cache usage, prefix-cache hits).
    pub metrics_path: String,
    /// How often that page is read; zero never reads it.
    pub metrics_interval: Duration,
    /// A reference matrix file (seed page, Markdown or JSON) pinned for this upstream at start.
    pub reference_file: Option<PathBuf>,
}

/// `[upstream]` first, then each `[[upstreams]]` entry: chosen by `models` or `path_prefix`,
/// under a name no other upstream has.
pub(super) fn upstreams(
    primary: RawUpstream,
    extras: Vec<RawUpstream>,
    origins: &Origins,
) -> Result<Vec<UpstreamConfig>, ConfigError> {
    let mut upstreams = vec![UpstreamConfig::from_raw(
        "upstream", primary, origins, true,
    )?];
    for (i, extra) in extras.into_iter().enumerate() {
        let prefix = format!("upstreams[{i}]");
        let parsed = UpstreamConfig::from_raw(&prefix, extra, origins, false)?;
        if parsed.models.is_empty() && parsed.path_prefix.is_none() {
            return Err(origins.error(
                &format!("{prefix}.models"),
                "an extra upstream needs `models` or `path_prefix` to be chosen",
            ));
        }
        if upstreams.iter().any(|u| u.name == parsed.name) {
            return Err(origins.error(
                &format!("{prefix}.name"),
                format!("`{}` is used twice", parsed.name),
            ));
        }
        upstreams.push(parsed);
    }
    Ok(upstreams)
}

impl UpstreamConfig {
    /// One upstream's table; `prefix` is its key path (`upstream`, `upstreams[0]`), and only
    /// the `primary` one may not claim models or paths.
    fn from_raw(
        prefix: &str,
        raw: RawUpstream,
        origins: &Origins,
        primary: bool,
    ) -> Result<Self, ConfigError> {
        let err = |k: &str, m: String| origins.error(&format!("{prefix}.{k}"), m);
        let mut url = raw.url;
        // Userinfo is never sent (hyper does not turn it into credentials), so it is dropped
        // here and the URL kept is safe to show in answers, logs and traces.
        if let Some(stripped) = crate::net::redact::without_userinfo(&url) {
            tracing::warn!(
                upstream = %raw.name,
                url = %stripped,
                "credentials in the upstream URL are not used and have been removed"
            );
            url = stripped;
        }
        if url.query().is_some() {
            return Err(err("url", "must not have a query string".into()));
        }
        if primary && (!raw.models.is_empty() || raw.path_prefix.is_some()) {
            return Err(err(
                "models",
                "the default [upstream] takes every request no other upstream claims; put `models` and `path_prefix` on [[upstreams]] entries".into(),
            ));
        }
        let path_prefix = match raw.path_prefix {
            None => None,
            Some(p) if p.is_empty() => None,
            Some(p) if p.starts_with('/') && !p.ends_with('/') => Some(p),
            Some(p) => {
                return Err(err(
                    "path_prefix",
                    format!("`{p}` must start with / and not end with /"),
                ))
            }
        };
        let (tls_client_cert, tls_client_key) = match (raw.tls_client_cert, raw.tls_client_key) {
            (Some(c), Some(k)) => (Some(PathBuf::from(c)), Some(PathBuf::from(k))),
            (None, None) => (None, None),
            _ => {
                return Err(err(
                    "tls_client_cert",
                    "tls_client_cert and tls_client_key go together".into(),
                ))
            }
        };
        if url.scheme_str() == Some("http") && (raw.tls_ca.is_some() || tls_client_cert.is_some()) {
            return Err(err("tls_ca", "TLS settings need an https:// url".into()));
        }
        if raw.name.is_empty() || raw.name.len() > 64 {
            return Err(err("name", "must be 1 to 64 characters".into()));
        }
        let metrics_path = raw.metrics_path;
        if !metrics_path.starts_with('/')
            || http::uri::PathAndQuery::try_from(&*metrics_path).is_err()
        {
            return Err(err(
                "metrics_path",
                format!("`{metrics_path}` must be a path starting with /"),
            ));
        }
        Ok(UpstreamConfig {
            reference_file: raw
                .reference_file
                .filter(|f| !f.is_empty())
                .map(PathBuf::from),
            name: raw.name,
            url,
            models: raw.models,
            path_prefix,
            default_model: raw.default_model.filter(|m| !m.is_empty()),
            connect_timeout: raw.connect_timeout,
            response_timeout: raw.response_timeout,
            stream_idle_timeout: raw.stream_idle_timeout,
            pool_idle_timeout: raw.pool_idle_timeout,
            pool_max_idle: usize::try_from(raw.pool_max_idle)
                .map_err(|_| err("pool_max_idle", "too large".into()))?,
            pool_reuse_after: raw.pool_reuse_after,
            // 0: as many as the data listener's connection limit (resolved when the proxy is
            // built).
            max_connections: usize::try_from(raw.max_connections)
                .map_err(|_| err("max_connections", "too large".into()))?
                .min(tokio::sync::Semaphore::MAX_PERMITS),
            http2: raw.http2,
            inline_connections: raw.inline_connections,
            tls_ca: raw.tls_ca.map(PathBuf::from),
            tls_client_cert,
            tls_client_key,
            sends_usage_unasked: raw.sends_usage_unasked,
            metrics_path,
            metrics_interval: raw.metrics_interval,
        })
    }
}
