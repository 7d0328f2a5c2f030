//! Configuration: one TOML file, overridden by `TOKENTAP_<SECTION>__<KEY>` environment
//! variables, overridden by command-line flags.
//!
//! Two phases (tensorzero's `UninitializedConfig::load()`): the layers are merged into one TOML
//! table and deserialised into `raw` structs that deny unknown keys (errors name the key path
//! via `serde_path_to_error`), then `Config::from_raw` validates values and cross-field rules
//! into typed settings. Every error names the key, where it came from, and what was wrong.

mod raw;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use http::Uri;

use crate::base::duration::parse_duration;
use crate::matrix::capacity::Basis;
use crate::matrix::evidence::EvidenceRule;
use crate::meter::buckets::Ladder;
use crate::meter::slo::{parse_target, SloPolicy, SloTargets};

pub use raw::RawConfig;

/// A configuration error, naming the key and the reason. The file errors keep their cause as
/// the error's source, not in their own text (the CLI prints the chain, which would say it
/// twice).
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("config file {path} is not valid TOML")]
    Syntax {
        path: PathBuf,
        #[source]
        source: toml::de::Error,
    },
    #[error("{origin}: key `{key}`: {message}")]
    Key {
        key: String,
        origin: String,
        message: String,
    },
    #[error("environment variable {var}: {message}")]
    Env { var: String, message: String },
    #[error("--set {arg}: {message}")]
    Set { arg: String, message: String },
}

/// Where a key's value came from, for error messages.
#[derive(Debug, Clone, Default)]
pub struct Origins {
    file: Option<PathBuf>,
    /// key path → description ("environment variable X", "flag --y").
    overridden: BTreeMap<String, String>,
}

impl Origins {
    fn describe(&self, key: &str) -> String {
        if let Some(origin) = self.overridden.get(key) {
            return origin.clone();
        }
        // An error on a section (`upstreams`) blames the override that created it, if any.
        if let Some((_, origin)) = self
            .overridden
            .iter()
            .find(|(k, _)| k.split('.').next() == Some(key))
        {
            return origin.clone();
        }
        match &self.file {
            Some(path) => format!("config file {}", path.display()),
            None => "configuration".to_string(),
        }
    }

    fn error(&self, key: &str, message: impl Into<String>) -> ConfigError {
        ConfigError::Key {
            key: key.to_string(),
            origin: self.describe(key),
            message: message.into(),
        }
    }
}

/// Layered configuration source: file, environment, then flags.
#[derive(Debug, Default)]
pub struct ConfigLoader {
    table: toml::Table,
    origins: Origins,
}

impl ConfigLoader {
    pub fn new() -> Self {
        Self::default()
    }

    /// Reads a TOML file as the base layer.
    pub fn file(mut self, path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        self.table = toml::from_str(&text).map_err(|source| ConfigError::Syntax {
            path: path.to_path_buf(),
            source,
        })?;
        self.origins.file = Some(path.to_path_buf());
        Ok(self)
    }

    /// Parses TOML text as the base layer (tests, embedded defaults).
    pub fn text(mut self, text: &str, name: &str) -> Result<Self, ConfigError> {
        self.table = toml::from_str(text).map_err(|source| ConfigError::Syntax {
            path: PathBuf::from(name),
            source,
        })?;
        self.origins.file = Some(PathBuf::from(name));
        Ok(self)
    }

    /// Applies `TOKENTAP_<SECTION>__<KEY>=value` overrides from `vars`. The value is read as a
    /// TOML value when it parses as one (numbers, booleans, arrays), else as a string.
    ///
    /// Only names with a `__` after the prefix are tokentap's: the environment is shared, and
    /// other `TOKENTAP_*` names belong to someone else (`TOKENTAP_BIN` in a script, the
    /// `TOKENTAP_SERVICE_HOST` / `TOKENTAP_PORT_8000_TCP` service links Kubernetes injects for a
    /// Service named `tokentap`, `TOKENTAP_ADMIN_TOKEN` in a compose `.env`), so they are ignored.
    /// A name of tokentap's form that is malformed (`TOKENTAP__KEY`, `TOKENTAP_A__B__C`) is an
    /// error, and an unknown section or key fails at [`ConfigLoader::load`], naming the variable.
    pub fn env(
        mut self,
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        for (var, value) in vars {
            let Some((section, key)) = tokentap_key(&var) else {
                continue;
            };
            if section.is_empty() || key.is_empty() || key.contains("__") {
                return Err(ConfigError::Env {
                    var,
                    message:
                        "expected exactly one section and one key, e.g. TOKENTAP_UPSTREAM__URL"
                            .into(),
                });
            }
            let section = section.to_ascii_lowercase();
            let key = key.to_ascii_lowercase();
            let origin = format!("environment variable {var}");
            self.set(&section, &key, parse_scalar(&value), origin);
        }
        Ok(self)
    }

    /// [`ConfigLoader::env`] over the process environment, which may hold names and values that
    /// are not UTF-8 (`std::env::vars` would panic on them). Such variables are skipped unless
    /// they are of tokentap's form, which is then an error naming the variable.
    pub fn process_env(self) -> Result<Self, ConfigError> {
        let mut vars = Vec::new();
        for (name, value) in std::env::vars_os() {
            match (name.into_string(), value.into_string()) {
                (Ok(name), Ok(value)) => vars.push((name, value)),
                (name, _) => {
                    let name = match name {
                        Ok(name) => name,
                        Err(name) => name.to_string_lossy().into_owned(),
                    };
                    if tokentap_key(&name).is_some() {
                        return Err(ConfigError::Env {
                            var: name,
                            message: "its name or value is not UTF-8".into(),
                        });
                    }
                }
            }
        }
        self.env(vars)
    }

    /// Applies `--set SECTION.KEY=VALUE` flags, in order (a later one wins). The value is read
    /// as the environment layer reads it: a TOML value when it parses as one (numbers, booleans,
    /// arrays), else a string. Any key of a `[section]` can be set this way; the `[[upstreams]]`
    /// list cannot (use the file). An unknown key fails at [`ConfigLoader::load`], naming the
    /// flag.
    pub fn set_args(mut self, args: &[String]) -> Result<Self, ConfigError> {
        for arg in args {
            // The error shows what comes before `=` only: the value may be a secret.
            let malformed = |message: &str| ConfigError::Set {
                arg: arg.split('=').next().unwrap_or("").to_owned(),
                message: message.to_owned(),
            };
            let (path, value) = arg.split_once('=').ok_or_else(|| {
                malformed("expected SECTION.KEY=VALUE, e.g. --set proxy.listen=0.0.0.0:8100")
            })?;
            let path = path.trim();
            let (section, key) = path
                .split_once('.')
                .filter(|(s, k)| !s.is_empty() && !k.is_empty() && !k.contains('.'))
                .ok_or_else(|| {
                    malformed("expected one section and one key before `=`, e.g. proxy.listen")
                })?;
            self.set(
                &section.to_ascii_lowercase(),
                &key.to_ascii_lowercase(),
                parse_scalar(value.trim()),
                format!("flag --set {path}"),
            );
        }
        Ok(self)
    }

    /// Sets one key from a command-line flag.
    pub fn flag(mut self, section: &str, key: &str, value: toml::Value, flag: &str) -> Self {
        self.set(section, key, value, format!("flag {flag}"));
        self
    }

    fn set(&mut self, section: &str, key: &str, value: toml::Value, origin: String) {
        let entry = self
            .table
            .entry(section.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        if !entry.is_table() {
            *entry = toml::Value::Table(toml::Table::new());
        }
        if let toml::Value::Table(table) = entry {
            table.insert(key.to_string(), value);
        }
        self.origins
            .overridden
            .insert(format!("{section}.{key}"), origin);
    }

    /// Deserialises and validates.
    pub fn load(self) -> Result<Config, ConfigError> {
        let origins = self.origins;
        let raw: RawConfig = serde_path_to_error::deserialize(toml::Value::Table(self.table))
            .map_err(|error| {
                let key = error.path().to_string();
                let message = error.inner().message().to_string();
                origins.error(&key, message)
            })?;
        Config::from_raw(raw, &origins)
    }
}

/// `(SECTION, KEY)` of a `TOKENTAP_<SECTION>__<KEY>` name (either may be empty or hold a further
/// `__`: the caller rejects those); `None` for any other name, which is not tokentap's.
fn tokentap_key(var: &str) -> Option<(&str, &str)> {
    let rest = var.strip_prefix("TOKENTAP_")?;
    match rest.strip_prefix('_') {
        // `TOKENTAP__KEY`: the `__` follows the prefix's own underscore, the section is empty.
        Some(key) => Some(("", key)),
        None => rest.split_once("__"),
    }
}

fn parse_scalar(value: &str) -> toml::Value {
    toml::from_str::<toml::Table>(&format!("v = {value}"))
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(value.to_string()))
}

/// Validated configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub proxy: ProxyConfig,
    pub upstreams: Vec<UpstreamConfig>,
    pub admin: AdminConfig,
    pub metering: MeteringConfig,
    pub telemetry: TelemetryConfig,
    pub store: StoreConfig,
    pub sweep: SweepConfig,
    pub drift: DriftConfig,
    /// `[evidence]`: what a production cell must rest on (`matrix::evidence`).
    pub evidence: EvidenceRule,
    /// `[capacity]`: live headroom (`aggregate::headroom`).
    pub capacity: CapacityConfig,
    pub workload: WorkloadConfig,
    /// `[fingerprint]`: each upstream's configuration, read in the background.
    pub fingerprint: FingerprintConfig,
}

/// `[fingerprint]`: how each upstream's configuration is read (docs/fleet.md).
#[derive(Debug, Clone, PartialEq)]
pub struct FingerprintConfig {
    /// How often each upstream is asked what it is (0: never; the label stays `unknown`).
    pub interval: Duration,
    /// Operator-given facts (empty: not given). `hardware` and `gpu_count` enter the
    /// fingerprint; `node` and `zone` are shown only (replicas of one configuration on other
    /// nodes share a fingerprint).
    pub hardware: String,
    pub gpu_count: u32,
    pub node: String,
    pub zone: String,
    /// How the server was started, when it does not say (vLLM has no launch command to
    /// read); shown redacted, never hashed. sglang's own `launch_command` wins.
    pub launch_command: String,
}

/// `[capacity]`: how live headroom is computed (docs/capacity.md).
#[derive(Debug, Clone, PartialEq)]
pub struct CapacityConfig {
    /// The production window whose load is compared with the capacity boundary.
    pub window: Duration,
    /// What the sweep's (or reference's) cells are judged by against `[slo]`.
    pub basis: Basis,
    /// The attainment a cell needs when judged by SLO attainment.
    pub attainment: f64,
}

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
}

#[derive(Debug, Clone, PartialEq)]
pub struct ListenerTls {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// When set, clients must present a certificate signed by this CA.
    pub client_ca: Option<PathBuf>,
}

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
    /// Most connections open to this upstream at once (in use, idle and being opened); 0: the
    /// data listener's connection limit, resolved when the proxy is built.
    pub max_connections: usize,
    pub http2: bool,
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

/// Whether an upstream sends usage to streams that did not ask (`sends_usage_unasked`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UsageUnasked {
    /// Ask the server where it says so (sglang `/server_info`: then [`Self::Final`]); until it
    /// answers, no.
    Auto,
    /// `"final"`: the final usage chunk only (sglang `--stream-response-default-include-usage`).
    Final,
    /// `"every_chunk"` (or its alias `"yes"`): usage on every chunk and a final usage chunk
    /// (vLLM `--enable-force-include-usage`). tokentap then adds nothing to streamed requests,
    /// which is byte-safe on either engine; `"final"` keeps exact per-chunk counts on sglang.
    EveryChunk,
    No,
}

#[derive(Debug, Clone, PartialEq)]
pub struct AdminConfig {
    pub listen: SocketAddr,
    /// Bearer token; required when the admin listener is not on loopback, and for sweeps.
    pub token: Option<String>,
    /// Most connections open at once on the admin listener.
    pub max_connections: usize,
    /// How long a browser session (`POST /login`) lasts.
    pub session_ttl: Duration,
    /// Most browser sessions kept at once; a login past it ends the oldest.
    pub max_sessions: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub struct MeteringConfig {
    pub inject_usage: bool,
    pub max_parse_bytes: usize,
    /// Most bytes of metered request bodies held at once while they are being read, over all
    /// requests; past it bodies are forwarded as they stream, unmetered.
    pub max_buffered_bytes: usize,
    pub max_event_bytes: usize,
    pub contexts: Ladder,
    pub concurrency: Ladder,
    /// Distinct model labels kept before further models are labelled `other`.
    pub max_models: usize,
    /// SLO targets per model (`[slo]`); none by default.
    pub slo: SloPolicy,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TelemetryConfig {
    pub otlp_endpoint: Option<Uri>,
    pub service_name: String,
    /// How often OTLP metrics are pushed.
    pub metric_interval: Duration,
    /// Most series tokentap's own sink puts on `/metrics` (docs/operations.md, "Metrics").
    pub max_series: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub struct StoreConfig {
    /// Directory of the SQLite store; `None` keeps nothing on disk.
    pub data_dir: Option<PathBuf>,
    pub snapshot_interval: Duration,
    pub retention: Duration,
}

/// `[drift]`: production against pinned reference matrices.
#[derive(Debug, Clone, PartialEq)]
pub struct DriftConfig {
    /// What a production cell needs in the window before it gets ratios (`[evidence]`).
    pub evidence: EvidenceRule,
    /// The production window the drift gauges compare (`/matrix?compare=` takes `window=`).
    pub window: Duration,
    /// How often the drift gauges are recomputed.
    pub refresh_interval: Duration,
}

/// `[workload]`: the opt-in capture of request shapes for replay.
#[derive(Clone, PartialEq)]
pub struct WorkloadConfig {
    /// Keep one shape row per production request (never text).
    pub capture: bool,
    /// Most captured requests kept; the oldest go first.
    pub max_requests: u64,
    /// Captured requests older than this are deleted; zero keeps them until `max_requests`.
    pub max_age: Duration,
    /// Secret the prefix fingerprints are keyed with; `None`: a random one per process.
    pub salt: Option<String>,
    /// Most `GET /workload` exports running at once; one more is answered 503.
    pub max_exports: usize,
}

impl std::fmt::Debug for WorkloadConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The salt is a secret: never logged.
        f.debug_struct("WorkloadConfig")
            .field("capture", &self.capture)
            .field("max_requests", &self.max_requests)
            .field("max_age", &self.max_age)
            .field("salt", &self.salt.as_ref().map(|_| "<set>"))
            .field("max_exports", &self.max_exports)
            .finish()
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct SweepConfig {
    /// Pause a running sweep while more production requests than this are in flight.
    pub production_guard: u64,
    pub cell_duration: Duration,
    pub max_output: u64,
    /// KV budget in tokens when the server does not report one (0: ask the server).
    pub kv_budget_tokens: u64,
}

impl Config {
    /// The defaults, as if no file, variable or flag were given.
    pub fn defaults() -> Result<Self, ConfigError> {
        ConfigLoader::new().load()
    }

    fn from_raw(raw: RawConfig, origins: &Origins) -> Result<Self, ConfigError> {
        let err = |key: &str, message: String| origins.error(key, message);
        let duration = |key: &str, value: &str| parse_duration(value).map_err(|m| err(key, m));
        let addr = |key: &str, value: &str| {
            value.parse::<SocketAddr>().map_err(|e| {
                err(
                    key,
                    format!("`{value}` is not an address like 127.0.0.1:8000: {e}"),
                )
            })
        };
        let nonzero = |key: &str, value: u64| {
            if value == 0 {
                Err(err(key, "must be greater than zero".into()))
            } else {
                usize::try_from(value).map_err(|_| err(key, "too large".into()))
            }
        };

        let tls = match (&raw.tls.cert, &raw.tls.key) {
            (Some(cert), Some(key)) => Some(ListenerTls {
                cert: cert.into(),
                key: key.into(),
                client_ca: raw.tls.client_ca.as_ref().map(PathBuf::from),
            }),
            (None, None) if raw.tls.client_ca.is_none() => None,
            (None, None) => {
                return Err(err("tls.client_ca", "needs tls.cert and tls.key".into()));
            }
            (Some(_), None) => {
                return Err(err("tls.key", "tls.cert is set, tls.key is missing".into()))
            }
            (None, Some(_)) => {
                return Err(err(
                    "tls.cert",
                    "tls.key is set, tls.cert is missing".into(),
                ))
            }
        };
        let proxy = ProxyConfig {
            listen: addr("proxy.listen", &raw.proxy.listen)?,
            shutdown_grace: duration("proxy.shutdown_grace", &raw.proxy.shutdown_grace)?,
            header_read_timeout: duration(
                "proxy.header_read_timeout",
                &raw.proxy.header_read_timeout,
            )?,
            max_header_bytes: nonzero("proxy.max_header_bytes", raw.proxy.max_header_bytes)?,
            http2: raw.proxy.http2,
            tls,
            body_idle_timeout: duration("proxy.body_idle_timeout", &raw.proxy.body_idle_timeout)?,
            body_read_timeout: duration("proxy.body_read_timeout", &raw.proxy.body_read_timeout)?,
            // 0: from the descriptor limit at start (`net::limits`).
            max_connections: usize::try_from(raw.proxy.max_connections)
                .map_err(|_| err("proxy.max_connections", "too large".into()))?,
            http2_max_concurrent_streams: u32::try_from(nonzero(
                "proxy.http2_max_concurrent_streams",
                raw.proxy.http2_max_concurrent_streams,
            )?)
            .map_err(|_| err("proxy.http2_max_concurrent_streams", "too large".into()))?,
            max_stream_buffer: nonzero("proxy.max_stream_buffer", raw.proxy.max_stream_buffer)?,
            http2_keep_alive_interval: duration(
                "proxy.http2_keep_alive_interval",
                &raw.proxy.http2_keep_alive_interval,
            )?,
            http2_keep_alive_timeout: duration(
                "proxy.http2_keep_alive_timeout",
                &raw.proxy.http2_keep_alive_timeout,
            )?,
            send_stall_timeout: duration(
                "proxy.send_stall_timeout",
                &raw.proxy.send_stall_timeout,
            )?,
        };
        if !(8192..=(16 << 20)).contains(&proxy.max_stream_buffer) {
            return Err(err(
                "proxy.max_stream_buffer",
                "must lie between 8192 and 16777216 bytes".into(),
            ));
        }
        if !proxy.http2_keep_alive_interval.is_zero() && proxy.http2_keep_alive_timeout.is_zero() {
            return Err(err(
                "proxy.http2_keep_alive_timeout",
                "must be greater than zero while pings are on".into(),
            ));
        }
        for (key, value) in [
            ("proxy.body_idle_timeout", proxy.body_idle_timeout),
            ("proxy.body_read_timeout", proxy.body_read_timeout),
        ] {
            if value.is_zero() {
                return Err(err(key, "must be greater than zero".into()));
            }
        }
        if proxy.header_read_timeout.is_zero() {
            return Err(err(
                "proxy.header_read_timeout",
                "must be greater than zero".into(),
            ));
        }
        if proxy.max_header_bytes < 8192 {
            return Err(err(
                "proxy.max_header_bytes",
                "must be at least 8192 (hyper's minimum)".into(),
            ));
        }

        let mut upstreams = vec![upstream("upstream", &raw.upstream, origins, true)?];
        for (i, extra) in raw.upstreams.iter().enumerate() {
            let prefix = format!("upstreams[{i}]");
            let parsed = upstream(&prefix, extra, origins, false)?;
            if parsed.models.is_empty() && parsed.path_prefix.is_none() {
                return Err(err(
                    &format!("{prefix}.models"),
                    "an extra upstream needs `models` or `path_prefix` to be chosen".into(),
                ));
            }
            if upstreams.iter().any(|u| u.name == parsed.name) {
                return Err(err(
                    &format!("{prefix}.name"),
                    format!("`{}` is used twice", parsed.name),
                ));
            }
            upstreams.push(parsed);
        }

        let admin = AdminConfig {
            listen: addr("admin.listen", &raw.admin.listen)?,
            token: raw.admin.token.filter(|t| !t.is_empty()),
            max_connections: nonzero("admin.max_connections", raw.admin.max_connections)?,
            session_ttl: duration("admin.session_ttl", &raw.admin.session_ttl)?,
            max_sessions: nonzero("admin.max_sessions", raw.admin.max_sessions)?,
        };
        if admin.session_ttl.is_zero() {
            return Err(err("admin.session_ttl", "must be greater than zero".into()));
        }
        if !admin.listen.ip().is_loopback() && admin.token.is_none() {
            return Err(err(
                "admin.token",
                format!(
                    "the admin listener {} is not on loopback, so it needs a bearer token (set admin.token or TOKENTAP_ADMIN__TOKEN)",
                    admin.listen
                ),
            ));
        }

        let contexts = Ladder::contexts(&raw.metering.context_buckets)
            .map_err(|m| err("metering.context_buckets", m))?;
        let concurrency = Ladder::concurrency(&raw.metering.concurrency_buckets)
            .map_err(|m| err("metering.concurrency_buckets", m))?;
        let metering = MeteringConfig {
            inject_usage: raw.metering.inject_usage,
            max_parse_bytes: nonzero("metering.max_parse_bytes", raw.metering.max_parse_bytes)?,
            max_buffered_bytes: nonzero(
                "metering.max_buffered_bytes",
                raw.metering.max_buffered_bytes,
            )?,
            max_event_bytes: nonzero("metering.max_event_bytes", raw.metering.max_event_bytes)?,
            contexts,
            concurrency,
            max_models: nonzero("metering.max_models", raw.metering.max_models)?,
            slo: slo_policy(&raw.slo, &err)?,
        };

        let otlp_endpoint = match raw.telemetry.otlp_endpoint.as_deref() {
            None | Some("") => None,
            Some(text) => Some(http_uri("telemetry.otlp_endpoint", text, origins)?),
        };
        let telemetry = TelemetryConfig {
            otlp_endpoint,
            service_name: raw.telemetry.service_name,
            metric_interval: duration("telemetry.metric_interval", &raw.telemetry.metric_interval)?,
            max_series: nonzero("telemetry.max_series", raw.telemetry.max_series)?,
        };
        if telemetry.metric_interval.is_zero() {
            return Err(err(
                "telemetry.metric_interval",
                "must be greater than zero".into(),
            ));
        }

        let store = StoreConfig {
            data_dir: raw
                .store
                .data_dir
                .filter(|d| !d.is_empty())
                .map(PathBuf::from),
            snapshot_interval: duration("store.snapshot_interval", &raw.store.snapshot_interval)?,
            retention: duration("store.retention", &raw.store.retention)?,
        };
        if store.snapshot_interval.is_zero() {
            return Err(err(
                "store.snapshot_interval",
                "must be greater than zero".into(),
            ));
        }

        let sweep = SweepConfig {
            production_guard: raw.sweep.production_guard,
            cell_duration: duration("sweep.cell_duration", &raw.sweep.cell_duration)?,
            max_output: raw.sweep.max_output,
            kv_budget_tokens: raw.sweep.kv_budget_tokens,
        };
        if sweep.cell_duration.is_zero() {
            return Err(err(
                "sweep.cell_duration",
                "must be greater than zero".into(),
            ));
        }
        if sweep.max_output == 0 {
            return Err(err("sweep.max_output", "must be greater than zero".into()));
        }

        let evidence = EvidenceRule {
            min_requests: raw.evidence.min_requests,
            min_measured_s: duration("evidence.min_measured_for", &raw.evidence.min_measured_for)?
                .as_secs_f64(),
            min_output_tokens: raw.evidence.min_output_tokens,
        };
        let capacity = CapacityConfig {
            window: duration("capacity.window", &raw.capacity.window)?,
            basis: Basis::parse(&raw.capacity.basis).ok_or_else(|| {
                err(
                    "capacity.basis",
                    format!(
                        "`{}`: expected auto, attainment, median, p90 or p99",
                        raw.capacity.basis
                    ),
                )
            })?,
            attainment: raw.capacity.attainment,
        };
        if capacity.window < Duration::from_secs(60)
            || capacity.window > Duration::from_secs(24 * 3600)
        {
            return Err(err("capacity.window", "must lie between 1m and 24h".into()));
        }
        if !(capacity.attainment > 0.0 && capacity.attainment <= 1.0) {
            return Err(err(
                "capacity.attainment",
                format!("must lie in (0, 1], found {}", capacity.attainment),
            ));
        }
        let drift = DriftConfig {
            evidence,
            window: duration("drift.window", &raw.drift.window)?,
            refresh_interval: duration("drift.refresh_interval", &raw.drift.refresh_interval)?,
        };
        // The production aggregator keeps minute slices for up to a day.
        if drift.window < Duration::from_secs(60) || drift.window > Duration::from_secs(24 * 3600) {
            return Err(err("drift.window", "must lie between 1m and 24h".into()));
        }
        if drift.refresh_interval.is_zero() {
            return Err(err(
                "drift.refresh_interval",
                "must be greater than zero".into(),
            ));
        }
        let workload = WorkloadConfig {
            capture: raw.workload.capture,
            max_requests: raw.workload.max_requests,
            max_age: duration("workload.max_age", &raw.workload.max_age)?,
            salt: Some(raw.workload.salt).filter(|s| !s.is_empty()),
            max_exports: nonzero("workload.max_exports", raw.workload.max_exports)?,
        };
        if workload.max_requests == 0 {
            return Err(err(
                "workload.max_requests",
                "must be greater than zero".into(),
            ));
        }

        let fingerprint = FingerprintConfig {
            interval: duration("fingerprint.interval", &raw.fingerprint.interval)?,
            hardware: raw.fingerprint.hardware.trim().to_owned(),
            gpu_count: raw.fingerprint.gpu_count,
            node: raw.fingerprint.node.trim().to_owned(),
            zone: raw.fingerprint.zone.trim().to_owned(),
            launch_command: raw.fingerprint.launch_command.trim().to_owned(),
        };
        if !fingerprint.interval.is_zero() && fingerprint.interval < Duration::from_secs(1) {
            return Err(err(
                "fingerprint.interval",
                "must be 0 (off) or at least 1s".into(),
            ));
        }

        Ok(Config {
            fingerprint,
            proxy,
            upstreams,
            admin,
            metering,
            telemetry,
            store,
            sweep,
            drift,
            evidence,
            capacity,
            workload,
        })
    }
}

/// Validates `[slo]`: each target a positive duration (`500ms`, `2s`, `1m`).
fn slo_policy(
    raw: &raw::RawSlo,
    err: &dyn Fn(&str, String) -> ConfigError,
) -> Result<SloPolicy, ConfigError> {
    let targets = |prefix: &str, t: &raw::RawSloTargets| -> Result<SloTargets, ConfigError> {
        let one = |name: &str, text: &Option<String>| {
            text.as_deref()
                .map(|text| {
                    parse_target(text.trim()).ok_or_else(|| {
                        err(
                            &format!("{prefix}{name}"),
                            format!("`{text}` is not a positive duration like 500ms, 2s or 1m"),
                        )
                    })
                })
                .transpose()
        };
        Ok(SloTargets {
            ttft: one("ttft", &t.ttft)?,
            tbt: one("tbt", &t.tbt)?,
            e2e: one("e2e", &t.e2e)?,
        })
    };
    let default = targets(
        "slo.",
        &raw::RawSloTargets {
            ttft: raw.ttft.clone(),
            tbt: raw.tbt.clone(),
            e2e: raw.e2e.clone(),
        },
    )?;
    let mut models = std::collections::BTreeMap::new();
    for (model, table) in &raw.models {
        models.insert(
            model.clone(),
            targets(&format!("slo.models.\"{model}\"."), table)?,
        );
    }
    Ok(SloPolicy { default, models })
}

fn http_uri(key: &str, text: &str, origins: &Origins) -> Result<Uri, ConfigError> {
    // Messages show the URL without its secrets: they end up in logs and terminals.
    let shown = crate::net::redact::redact_url(text);
    let uri: Uri = text
        .parse()
        .map_err(|e| origins.error(key, format!("`{shown}` is not a URL: {e}")))?;
    match uri.scheme_str() {
        Some("http") | Some("https") if uri.authority().is_some() => Ok(uri),
        _ => Err(origins.error(
            key,
            format!("`{shown}` must be an http:// or https:// URL with a host"),
        )),
    }
}

fn upstream(
    prefix: &str,
    raw: &raw::RawUpstream,
    origins: &Origins,
    primary: bool,
) -> Result<UpstreamConfig, ConfigError> {
    let key = |k: &str| format!("{prefix}.{k}");
    let err = |k: &str, m: String| origins.error(&key(k), m);
    let duration = |k: &str, v: &str| parse_duration(v).map_err(|m| err(k, m));
    let mut url = http_uri(&key("url"), &raw.url, origins)?;
    // Userinfo is never sent (hyper does not turn it into credentials), so it is dropped here
    // and the URL kept is safe to show in answers, logs and traces.
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
    let path_prefix = match raw.path_prefix.as_deref() {
        None | Some("") => None,
        Some(p) if p.starts_with('/') && !p.ends_with('/') => Some(p.to_string()),
        Some(p) => {
            return Err(err(
                "path_prefix",
                format!("`{p}` must start with / and not end with /"),
            ))
        }
    };
    let tls_client = match (&raw.tls_client_cert, &raw.tls_client_key) {
        (Some(c), Some(k)) => (Some(PathBuf::from(c)), Some(PathBuf::from(k))),
        (None, None) => (None, None),
        _ => {
            return Err(err(
                "tls_client_cert",
                "tls_client_cert and tls_client_key go together".into(),
            ))
        }
    };
    if url.scheme_str() == Some("http") && (raw.tls_ca.is_some() || tls_client.0.is_some()) {
        return Err(err("tls_ca", "TLS settings need an https:// url".into()));
    }
    if raw.name.is_empty() || raw.name.len() > 64 {
        return Err(err("name", "must be 1 to 64 characters".into()));
    }
    let sends_usage_unasked = match raw.sends_usage_unasked.as_str() {
        "auto" => UsageUnasked::Auto,
        "final" => UsageUnasked::Final,
        "every_chunk" | "yes" => UsageUnasked::EveryChunk,
        "no" => UsageUnasked::No,
        other => {
            return Err(err(
                "sends_usage_unasked",
                format!(
                    "`{other}` must be \"auto\", \"final\", \"every_chunk\", \"yes\" or \"no\""
                ),
            ))
        }
    };
    let metrics_path = raw.metrics_path.clone();
    if !metrics_path.starts_with('/') || http::uri::PathAndQuery::try_from(&*metrics_path).is_err()
    {
        return Err(err(
            "metrics_path",
            format!("`{metrics_path}` must be a path starting with /"),
        ));
    }
    Ok(UpstreamConfig {
        reference_file: raw
            .reference_file
            .as_deref()
            .filter(|f| !f.is_empty())
            .map(PathBuf::from),
        name: raw.name.clone(),
        url,
        models: raw.models.clone(),
        path_prefix,
        default_model: raw.default_model.clone().filter(|m| !m.is_empty()),
        connect_timeout: duration("connect_timeout", &raw.connect_timeout)?,
        response_timeout: duration("response_timeout", &raw.response_timeout)?,
        stream_idle_timeout: duration("stream_idle_timeout", &raw.stream_idle_timeout)?,
        pool_idle_timeout: duration("pool_idle_timeout", &raw.pool_idle_timeout)?,
        pool_max_idle: usize::try_from(raw.pool_max_idle)
            .map_err(|_| err("pool_max_idle", "too large".into()))?,
        // 0: as many as the data listener's connection limit (resolved when the proxy is built).
        max_connections: usize::try_from(raw.max_connections)
            .map_err(|_| err("max_connections", "too large".into()))?
            .min(tokio::sync::Semaphore::MAX_PERMITS),
        http2: raw.http2,
        tls_ca: raw.tls_ca.as_ref().map(PathBuf::from),
        tls_client_cert: tls_client.0,
        tls_client_key: tls_client.1,
        sends_usage_unasked,
        metrics_path,
        metrics_interval: duration("metrics_interval", &raw.metrics_interval)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_example_parses_and_matches_the_defaults() {
        let text = include_str!("../../config/tokentap.toml");
        let from_file = ConfigLoader::new()
            .text(text, "config/tokentap.toml")
            .unwrap()
            .load()
            .unwrap();
        let defaults = Config::defaults().unwrap();
        assert_eq!(from_file, defaults);
        // The comparison sees the values the file sets: one changed value makes them differ.
        let changed = text.replacen("max_connections = 0", "max_connections = 4095", 1);
        assert_ne!(changed, text, "the example sets proxy.max_connections");
        let from_changed = ConfigLoader::new()
            .text(&changed, "changed.toml")
            .unwrap()
            .load()
            .unwrap();
        assert_ne!(from_changed, defaults);
    }

    #[test]
    fn usage_unasked_says_which_usage_and_yes_means_every_chunk() {
        let parse = |value: &str| {
            ConfigLoader::new()
                .text(
                    &format!("[upstream]\nsends_usage_unasked = \"{value}\"\n"),
                    "x.toml",
                )
                .and_then(ConfigLoader::load)
                .map(|config| config.upstreams.first().map(|u| u.sends_usage_unasked))
        };
        assert_eq!(parse("final").unwrap(), Some(UsageUnasked::Final));
        assert_eq!(
            parse("every_chunk").unwrap(),
            Some(UsageUnasked::EveryChunk)
        );
        assert_eq!(parse("yes").unwrap(), Some(UsageUnasked::EveryChunk));
        assert_eq!(parse("no").unwrap(), Some(UsageUnasked::No));
        let error = parse("sometimes").unwrap_err().to_string();
        assert!(error.contains("sends_usage_unasked"), "{error}");
    }

    #[test]
    fn unknown_keys_name_the_key_and_origin() {
        let error = ConfigLoader::new()
            .text("[proxy]\nlisen = \"1.2.3.4:5\"\n", "x.toml")
            .unwrap()
            .load()
            .unwrap_err()
            .to_string();
        assert!(error.contains("proxy"), "{error}");
        assert!(error.contains("lisen"), "{error}");
        let error = ConfigLoader::new()
            .env([("TOKENTAP_PROXY__NOPE".to_string(), "1".to_string())])
            .unwrap()
            .load()
            .unwrap_err()
            .to_string();
        assert!(error.contains("nope"), "{error}");
    }

    #[test]
    fn bad_values_name_the_key() {
        let cases = [
            ("TOKENTAP_PROXY__LISTEN", "nowhere", "proxy.listen"),
            ("TOKENTAP_UPSTREAM__URL", "ftp://x", "upstream.url"),
            (
                "TOKENTAP_PROXY__SHUTDOWN_GRACE",
                "10 parsecs",
                "proxy.shutdown_grace",
            ),
            (
                "TOKENTAP_METERING__CONTEXT_BUCKETS",
                "[16, 8]",
                "metering.context_buckets",
            ),
            ("TOKENTAP_ADMIN__LISTEN", "0.0.0.0:9464", "admin.token"),
            (
                "TOKENTAP_METERING__MAX_EVENT_BYTES",
                "\"lots\"",
                "metering.max_event_bytes",
            ),
        ];
        for (var, value, key) in cases {
            let error = ConfigLoader::new()
                .env([(var.to_string(), value.to_string())])
                .unwrap()
                .load()
                .unwrap_err()
                .to_string();
            assert!(error.contains(key), "{var}={value}: {error}");
            if key != "admin.token" {
                assert!(error.contains(var), "{var}={value}: {error}");
            }
        }
        for malformed in [
            "TOKENTAP__LISTEN",
            "TOKENTAP_PROXY__",
            "TOKENTAP_PROXY__LISTEN__X",
        ] {
            let error = ConfigLoader::new()
                .env([(malformed.to_string(), "x".to_string())])
                .unwrap_err()
                .to_string();
            assert!(error.contains(malformed), "{error}");
        }
    }

    #[test]
    fn other_tokentap_variables_are_not_ours() {
        // Kubernetes' service links for a Service `tokentap` with ports `proxy` and `metrics`,
        // a compose `.env` name and a script's own variable: none is a key, none is an error.
        let foreign = [
            ("TOKENTAP_SERVICE_HOST", "10.0.0.7"),
            ("TOKENTAP_SERVICE_PORT", "8000"),
            ("TOKENTAP_SERVICE_PORT_PROXY", "8000"),
            ("TOKENTAP_SERVICE_PORT_METRICS", "9464"),
            ("TOKENTAP_PORT", "tcp://10.0.0.7:8000"),
            ("TOKENTAP_PORT_8000_TCP", "tcp://10.0.0.7:8000"),
            ("TOKENTAP_PORT_8000_TCP_PROTO", "tcp"),
            ("TOKENTAP_PORT_8000_TCP_PORT", "8000"),
            ("TOKENTAP_PORT_8000_TCP_ADDR", "10.0.0.7"),
            ("TOKENTAP_ADMIN_TOKEN", "not-this-one"),
            ("TOKENTAP_BIN", "/usr/local/bin/tokentap"),
            ("TOKENTAP_PROXY", "x"),
        ];
        let config = ConfigLoader::new()
            .env(foreign.map(|(k, v)| (k.to_string(), v.to_string())))
            .unwrap()
            .load()
            .unwrap();
        let defaults = ConfigLoader::new().load().unwrap();
        assert_eq!(config.proxy.listen, defaults.proxy.listen);
        assert_eq!(
            config.admin.token, None,
            "TOKENTAP_ADMIN_TOKEN is not admin.token"
        );
        // The same names beside a real key: the key still applies.
        let config = ConfigLoader::new()
            .env(
                foreign
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .into_iter()
                    .chain([("TOKENTAP_ADMIN__TOKEN".to_string(), "t".to_string())]),
            )
            .unwrap()
            .load()
            .unwrap();
        assert!(config.admin.token.is_some());
    }

    #[test]
    fn layers_override_in_order() {
        let config = ConfigLoader::new()
            .text(
                "[upstream]\nurl = \"http://10.0.0.1:1\"\n[proxy]\nlisten = \"127.0.0.1:1\"\n",
                "f",
            )
            .unwrap()
            .env([(
                "TOKENTAP_PROXY__LISTEN".to_string(),
                "127.0.0.1:2".to_string(),
            )])
            .unwrap()
            .flag(
                "upstream",
                "url",
                toml::Value::String("http://10.0.0.3:3".into()),
                "--upstream",
            )
            .load()
            .unwrap();
        assert_eq!(config.proxy.listen.port(), 2);
        assert_eq!(config.upstreams[0].url.port_u16(), Some(3));
    }

    #[test]
    fn a_bare_zero_is_a_duration_from_any_layer() {
        let config = ConfigLoader::new()
            .text("[upstream]\nresponse_timeout = 0\n", "f")
            .unwrap()
            .env([("TOKENTAP_STORE__RETENTION".to_string(), "0".to_string())])
            .unwrap()
            .load()
            .unwrap();
        assert!(config.upstreams[0].response_timeout.is_zero());
        assert!(config.store.retention.is_zero());
        let error = ConfigLoader::new()
            .env([(
                "TOKENTAP_PROXY__SHUTDOWN_GRACE".to_string(),
                "5".to_string(),
            )])
            .unwrap()
            .load()
            .unwrap_err()
            .to_string();
        assert!(error.contains("no unit"), "{error}");
    }

    #[test]
    fn slo_targets_per_model_and_from_the_environment() {
        let ms = Duration::from_millis;
        let config = ConfigLoader::new()
            .text(
                "[slo]\nttft = \"2s\"\n[slo.models.\"a/b\"]\ntbt = \"30ms\"\n[slo.models.exempt]\n",
                "x.toml",
            )
            .unwrap()
            .env([("TOKENTAP_SLO__E2E".to_string(), "1m".to_string())])
            .unwrap()
            .load()
            .unwrap();
        let slo = &config.metering.slo;
        assert_eq!(slo.default.ttft, Some(ms(2000)));
        assert_eq!(slo.default.e2e, Some(ms(60_000)));
        let model = slo.for_model(Some("a/b"));
        assert_eq!(
            (model.ttft, model.tbt, model.e2e),
            (None, Some(ms(30)), None)
        );
        assert!(!slo.for_model(Some("exempt")).is_set());
        assert_eq!(slo.for_model(Some("other")), slo.default);
        // Off by default.
        assert!(!Config::defaults().unwrap().metering.slo.default.is_set());
        for (text, key) in [
            ("[slo]\nttft = \"0ms\"\n", "slo.ttft"),
            ("[slo]\ntbt = \"fast\"\n", "slo.tbt"),
            ("[slo.models.m]\ne2e = \"5\"\n", "slo.models.\"m\".e2e"),
        ] {
            let error = ConfigLoader::new()
                .text(text, "x.toml")
                .unwrap()
                .load()
                .unwrap_err()
                .to_string();
            assert!(error.contains(key), "{text}: {error}");
        }
        let error = ConfigLoader::new()
            .text("[slo]\nlatency = \"1s\"\n", "x.toml")
            .unwrap()
            .load()
            .unwrap_err()
            .to_string();
        assert!(error.contains("latency"), "{error}");
    }

    #[test]
    fn set_flags_override_the_file_and_name_themselves_in_errors() {
        let config = ConfigLoader::new()
            .text("[proxy]\nlisten = \"127.0.0.1:8000\"\n", "t.toml")
            .unwrap()
            .set_args(&[
                "proxy.listen=127.0.0.1:8100".to_owned(),
                "admin.max_sessions=3".to_owned(),
                "upstream.metrics_interval = 0".to_owned(),
            ])
            .unwrap()
            .load()
            .unwrap();
        assert_eq!(config.proxy.listen.port(), 8100);
        assert_eq!(config.admin.max_sessions, 3);
        assert!(config.upstreams[0].metrics_interval.is_zero());
        let unknown = ConfigLoader::new()
            .set_args(&["proxy.lisen=x".to_owned()])
            .unwrap()
            .load()
            .unwrap_err()
            .to_string();
        assert!(unknown.contains("flag --set proxy.lisen"), "{unknown}");
        for (bad, shown) in [
            ("proxy.listen", "proxy.listen"),
            ("listen=1", "listen"),
            ("a.b.c=secret", "a.b.c"),
            (".x=1", ".x"),
        ] {
            let error = ConfigLoader::new()
                .set_args(&[bad.to_owned()])
                .unwrap_err()
                .to_string();
            assert!(error.starts_with(&format!("--set {shown}:")), "{error}");
            assert!(!error.contains("secret"), "{error}");
        }
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert!(parse_duration("5").is_err());
        assert!(parse_duration("5y").is_err());
        assert!(parse_duration("-1s").is_err());
    }
}
