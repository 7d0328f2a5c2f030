//! The configuration as written: serde structs that deny unknown keys, with the defaults.
//! `config/tokentap.toml` documents every key; a test checks that file equals these defaults.
//!
//! Durations, listen addresses, URLs and enums are typed here (`value.rs` reads and checks
//! each as it is deserialised); counts stay the integers written, and each section's
//! `from_raw` checks their ranges. The `[slo]` targets stay text: their errors name a model's
//! table as `slo.models."<model>"`, which a serde key path does not quote.

use std::net::SocketAddr;
use std::time::Duration;

use http::Uri;
use serde::Deserialize;

use super::value::{self, ServerTiming, UsageUnasked};
use crate::matrix::capacity::Basis;
use crate::meter::buckets::{DEFAULT_CONCURRENCY, DEFAULT_CONTEXTS};

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct RawConfig {
    pub proxy: RawProxy,
    pub tls: RawTls,
    pub upstream: RawUpstream,
    pub upstreams: Vec<RawUpstream>,
    pub admin: RawAdmin,
    pub metering: RawMetering,
    pub telemetry: RawTelemetry,
    pub store: RawStore,
    pub sweep: RawSweep,
    pub slo: RawSlo,
    pub drift: RawDrift,
    pub evidence: RawEvidence,
    pub capacity: RawCapacity,
    pub workload: RawWorkload,
    pub sessions: RawSessions,
    pub fingerprint: RawFingerprint,
    pub tenants: RawTenants,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawProxy {
    #[serde(deserialize_with = "value::socket_addr")]
    pub listen: SocketAddr,
    #[serde(deserialize_with = "value::duration")]
    pub shutdown_grace: Duration,
    #[serde(deserialize_with = "value::duration")]
    pub header_read_timeout: Duration,
    pub max_header_bytes: u64,
    pub http2: bool,
    #[serde(deserialize_with = "value::duration")]
    pub body_idle_timeout: Duration,
    #[serde(deserialize_with = "value::duration")]
    pub body_read_timeout: Duration,
    pub max_connections: u64,
    pub workers: u64,
    pub http2_max_concurrent_streams: u64,
    pub max_stream_buffer: u64,
    #[serde(deserialize_with = "value::duration")]
    pub http2_keep_alive_interval: Duration,
    #[serde(deserialize_with = "value::duration")]
    pub http2_keep_alive_timeout: Duration,
    #[serde(deserialize_with = "value::duration")]
    pub send_stall_timeout: Duration,
    pub routes: RawRoutes,
    pub code_fields: value::CodeFields,
}

/// `proxy.routes`: a word (`"safe"`, `"all"`) or a list of paths (with `"safe"` among them to
/// keep the default refusals and open only what is listed).
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum RawRoutes {
    One(String),
    Many(Vec<String>),
}

impl Default for RawRoutes {
    fn default() -> Self {
        RawRoutes::One("safe".into())
    }
}

impl Default for RawProxy {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([0, 0, 0, 0], 8000)),
            shutdown_grace: Duration::from_secs(30),
            header_read_timeout: Duration::from_secs(10),
            max_header_bytes: 64 * 1024,
            http2: true,
            body_idle_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(60),
            max_connections: 0,
            workers: 0,
            http2_max_concurrent_streams: 100,
            max_stream_buffer: 64 * 1024,
            http2_keep_alive_interval: Duration::from_secs(30),
            http2_keep_alive_timeout: Duration::from_secs(10),
            send_stall_timeout: Duration::from_secs(30),
            routes: RawRoutes::default(),
            code_fields: value::CodeFields::default(),
        }
    }
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct RawTls {
    pub cert: Option<String>,
    pub key: Option<String>,
    pub client_ca: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawUpstream {
    pub name: String,
    #[serde(deserialize_with = "value::http_uri")]
    pub url: Uri,
    pub models: Vec<String>,
    pub path_prefix: Option<String>,
    pub default_model: Option<String>,
    #[serde(deserialize_with = "value::duration")]
    pub connect_timeout: Duration,
    #[serde(deserialize_with = "value::duration")]
    pub response_timeout: Duration,
    #[serde(deserialize_with = "value::duration")]
    pub stream_idle_timeout: Duration,
    #[serde(deserialize_with = "value::duration")]
    pub pool_idle_timeout: Duration,
    pub pool_max_idle: u64,
    #[serde(deserialize_with = "value::duration")]
    pub pool_reuse_after: Duration,
    pub max_connections: u64,
    pub http2: bool,
    pub inline_connections: bool,
    pub tls_ca: Option<String>,
    pub tls_client_cert: Option<String>,
    pub tls_client_key: Option<String>,
    pub sends_usage_unasked: UsageUnasked,
    pub metrics_path: String,
    #[serde(deserialize_with = "value::duration")]
    pub metrics_interval: Duration,
    pub reference_file: Option<String>,
}

impl Default for RawUpstream {
    fn default() -> Self {
        Self {
            name: "default".into(),
            url: Uri::from_static("http://127.0.0.1:30000"),
            models: Vec::new(),
            path_prefix: None,
            default_model: None,
            connect_timeout: Duration::from_secs(5),
            response_timeout: Duration::from_secs(600),
            stream_idle_timeout: Duration::from_secs(120),
            pool_idle_timeout: Duration::from_secs(90),
            pool_max_idle: 1024,
            pool_reuse_after: Duration::from_millis(50),
            max_connections: 0,
            http2: false,
            inline_connections: true,
            tls_ca: None,
            tls_client_cert: None,
            tls_client_key: None,
            sends_usage_unasked: UsageUnasked::Auto,
            metrics_path: "/metrics".into(),
            metrics_interval: Duration::from_secs(5),
            reference_file: None,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawAdmin {
    #[serde(deserialize_with = "value::socket_addr")]
    pub listen: SocketAddr,
    pub token: Option<String>,
    pub max_connections: u64,
    #[serde(deserialize_with = "value::duration")]
    pub session_ttl: Duration,
    pub max_sessions: u64,
    pub allowed_hosts: Vec<String>,
    pub max_failed_credentials_per_second: u64,
}

impl Default for RawAdmin {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 9464)),
            token: None,
            max_connections: 256,
            session_ttl: Duration::from_secs(12 * 3600),
            max_sessions: 64,
            allowed_hosts: Vec::new(),
            max_failed_credentials_per_second: 10,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawMetering {
    pub inject_usage: bool,
    pub max_parse_bytes: u64,
    pub max_buffered_bytes: u64,
    pub max_held_bytes: u64,
    pub max_event_bytes: u64,
    pub context_buckets: Vec<u64>,
    pub concurrency_buckets: Vec<u64>,
    pub max_models: u64,
    /// When a request's timing is handed back (`Server-Timing`).
    pub server_timing: ServerTiming,
    /// The request header whose presence asks for it (`server_timing = "on_request"`).
    pub server_timing_header: String,
}

impl Default for RawMetering {
    fn default() -> Self {
        Self {
            inject_usage: true,
            max_parse_bytes: 8 << 20,
            max_buffered_bytes: 256 << 20,
            max_held_bytes: 64 << 20,
            max_event_bytes: 1 << 20,
            context_buckets: DEFAULT_CONTEXTS.to_vec(),
            concurrency_buckets: DEFAULT_CONCURRENCY.to_vec(),
            max_models: 32,
            server_timing: ServerTiming::Off,
            server_timing_header: "x-tokentap-timing".to_string(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawTelemetry {
    #[serde(deserialize_with = "value::optional_http_uri")]
    pub otlp_endpoint: Option<Uri>,
    pub service_name: String,
    #[serde(deserialize_with = "value::duration")]
    pub metric_interval: Duration,
    pub max_series: u64,
    pub otlp_legacy_genai_names: bool,
    pub otlp_request_events: bool,
    pub otlp_event_salt: String,
    pub otlp_provider_name: String,
}

impl Default for RawTelemetry {
    fn default() -> Self {
        Self {
            otlp_endpoint: None,
            service_name: "tokentap".into(),
            metric_interval: Duration::from_secs(60),
            max_series: 50_000,
            otlp_legacy_genai_names: false,
            otlp_request_events: false,
            otlp_event_salt: String::new(),
            otlp_provider_name: "self_hosted".into(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawStore {
    pub data_dir: Option<String>,
    #[serde(deserialize_with = "value::duration")]
    pub snapshot_interval: Duration,
    #[serde(deserialize_with = "value::duration")]
    pub retention: Duration,
}

impl Default for RawStore {
    fn default() -> Self {
        Self {
            data_dir: Some("tokentap-data".into()),
            snapshot_interval: Duration::from_secs(3600),
            retention: Duration::from_secs(720 * 3600),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawSessions {
    pub enabled: bool,
    pub keys: Vec<String>,
    pub infer: bool,
    pub max_sessions: u64,
    #[serde(deserialize_with = "value::duration")]
    pub idle: Duration,
}

impl Default for RawSessions {
    fn default() -> Self {
        Self {
            enabled: true,
            keys: [
                "header:x-session-id",
                "header:x-smg-routing-key",
                "header:x-dynamo-session-id",
                "header:x-claude-code-session-id",
                "header:x-correlation-id",
                "header:x-litellm-session-id",
                "body:prompt_cache_key",
                "body:session_id",
                "body:user",
            ]
            .map(str::to_owned)
            .to_vec(),
            infer: true,
            max_sessions: 65_536,
            idle: Duration::from_secs(2 * 3600),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawWorkload {
    pub capture: bool,
    pub max_requests: u64,
    #[serde(deserialize_with = "value::duration")]
    pub max_age: Duration,
    pub salt: String,
    pub max_exports: u64,
}

impl Default for RawWorkload {
    fn default() -> Self {
        Self {
            capture: false,
            max_requests: 1_000_000,
            max_age: Duration::from_secs(168 * 3600),
            salt: String::new(),
            max_exports: 2,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawSweep {
    pub production_guard: u64,
    #[serde(deserialize_with = "value::duration")]
    pub cell_duration: Duration,
    pub max_output: u64,
    pub kv_budget_tokens: u64,
    #[serde(deserialize_with = "value::duration")]
    pub max_default_duration: Duration,
}

impl Default for RawSweep {
    fn default() -> Self {
        Self {
            production_guard: 4,
            cell_duration: Duration::from_secs(30),
            max_output: 4096,
            kv_budget_tokens: 0,
            max_default_duration: Duration::from_secs(600),
        }
    }
}

/// SLO targets as written: durations, each optional (absent = not set).
#[derive(Debug, Deserialize, Default, Clone)]
#[serde(deny_unknown_fields, default)]
pub struct RawSloTargets {
    #[serde(deserialize_with = "value::duration_text")]
    pub ttft: Option<String>,
    #[serde(deserialize_with = "value::duration_text")]
    pub tbt: Option<String>,
    #[serde(deserialize_with = "value::duration_text")]
    pub e2e: Option<String>,
    /// The model's own objective (`[slo] objective` when absent).
    pub objective: Option<f64>,
}

/// `[slo]`: the default targets, and `[slo.models."<model>"]` tables that replace them.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct RawSlo {
    /// `"any"` (default) or `"answer"`: which first token `ttft` judges.
    pub ttft_of: Option<String>,
    #[serde(deserialize_with = "value::duration_text")]
    pub ttft: Option<String>,
    #[serde(deserialize_with = "value::duration_text")]
    pub tbt: Option<String>,
    #[serde(deserialize_with = "value::duration_text")]
    pub e2e: Option<String>,
    /// The share of requests that must succeed and meet their targets (the error budget is
    /// 1 − it); 0.99 when absent (`metering::DEFAULT_OBJECTIVE`).
    pub objective: Option<f64>,
    pub models: std::collections::BTreeMap<String, RawSloTargets>,
}

/// `[evidence]`: what a production cell must rest on before its figures are trusted.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawEvidence {
    pub min_requests: u64,
    #[serde(deserialize_with = "value::duration")]
    pub min_measured_for: Duration,
    pub min_output_tokens: u64,
}

impl Default for RawEvidence {
    fn default() -> Self {
        // A median over fewer requests is too noisy to compare or alert on.
        Self {
            min_requests: 20,
            min_measured_for: Duration::from_secs(10),
            min_output_tokens: 500,
        }
    }
}

/// `[capacity]`: live headroom under the configured `[slo]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawCapacity {
    #[serde(deserialize_with = "value::duration")]
    pub window: Duration,
    #[serde(deserialize_with = "value::basis")]
    pub basis: Basis,
    pub attainment: f64,
}

impl Default for RawCapacity {
    fn default() -> Self {
        Self {
            window: Duration::from_secs(5 * 60),
            basis: Basis::Median,
            attainment: 0.95,
        }
    }
}

/// `[fingerprint]`: how often each upstream is asked what it is, and what the operator knows
/// of its hardware that a sidecar cannot see.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawFingerprint {
    #[serde(deserialize_with = "value::duration")]
    pub interval: Duration,
    pub hardware: String,
    pub gpu_count: u32,
    pub node: String,
    pub zone: String,
    pub launch_command: String,
}

impl Default for RawFingerprint {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(60),
            hardware: String::new(),
            gpu_count: 0,
            node: String::new(),
            zone: String::new(),
            launch_command: String::new(),
        }
    }
}

/// `[tenants]`: who a request is counted under (off by default).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawTenants {
    /// The request header naming the tenant; empty: none.
    pub header: String,
    /// The tenant names counted as themselves.
    pub allow: Vec<String>,
    /// SHA-256 of an API key → tenant name.
    pub keys: std::collections::BTreeMap<String, String>,
}

/// `[drift]`: how production is compared with pinned reference matrices.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawDrift {
    #[serde(deserialize_with = "value::duration")]
    pub window: Duration,
    #[serde(deserialize_with = "value::duration")]
    pub refresh_interval: Duration,
}

impl Default for RawDrift {
    fn default() -> Self {
        Self {
            window: Duration::from_secs(15 * 60),
            refresh_interval: Duration::from_secs(30),
        }
    }
}
