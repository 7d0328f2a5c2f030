//! The configuration as written: serde structs that deny unknown keys, with the defaults.
//! `config/tokentap.toml` documents every key; a test checks that file equals these defaults.

use serde::{Deserialize, Deserializer};

/// A duration as written: `30s`, `500ms`, or a bare `0` (which TOML and the environment layer
/// read as a number). Validation parses it (`base::duration::parse_duration`).
fn duration_text<'de, D: Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Text {
        Text(String),
        Number(i64),
    }
    Ok(match Text::deserialize(deserializer)? {
        Text::Text(text) => text,
        Text::Number(n) => n.to_string(),
    })
}

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
    pub fingerprint: RawFingerprint,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawProxy {
    pub listen: String,
    #[serde(deserialize_with = "duration_text")]
    pub shutdown_grace: String,
    #[serde(deserialize_with = "duration_text")]
    pub header_read_timeout: String,
    pub max_header_bytes: u64,
    pub http2: bool,
    #[serde(deserialize_with = "duration_text")]
    pub body_idle_timeout: String,
    #[serde(deserialize_with = "duration_text")]
    pub body_read_timeout: String,
    pub max_connections: u64,
    pub http2_max_concurrent_streams: u64,
    pub max_stream_buffer: u64,
    #[serde(deserialize_with = "duration_text")]
    pub http2_keep_alive_interval: String,
    #[serde(deserialize_with = "duration_text")]
    pub http2_keep_alive_timeout: String,
    #[serde(deserialize_with = "duration_text")]
    pub send_stall_timeout: String,
}

impl Default for RawProxy {
    fn default() -> Self {
        Self {
            listen: "0.0.0.0:8000".into(),
            shutdown_grace: "30s".into(),
            header_read_timeout: "10s".into(),
            max_header_bytes: 64 * 1024,
            http2: true,
            body_idle_timeout: "10s".into(),
            body_read_timeout: "60s".into(),
            max_connections: 0,
            http2_max_concurrent_streams: 100,
            max_stream_buffer: 64 * 1024,
            http2_keep_alive_interval: "30s".into(),
            http2_keep_alive_timeout: "10s".into(),
            send_stall_timeout: "30s".into(),
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
    pub url: String,
    pub models: Vec<String>,
    pub path_prefix: Option<String>,
    pub default_model: Option<String>,
    #[serde(deserialize_with = "duration_text")]
    pub connect_timeout: String,
    #[serde(deserialize_with = "duration_text")]
    pub response_timeout: String,
    #[serde(deserialize_with = "duration_text")]
    pub stream_idle_timeout: String,
    #[serde(deserialize_with = "duration_text")]
    pub pool_idle_timeout: String,
    pub pool_max_idle: u64,
    pub max_connections: u64,
    pub http2: bool,
    pub tls_ca: Option<String>,
    pub tls_client_cert: Option<String>,
    pub tls_client_key: Option<String>,
    pub sends_usage_unasked: String,
    pub metrics_path: String,
    #[serde(deserialize_with = "duration_text")]
    pub metrics_interval: String,
    pub reference_file: Option<String>,
}

impl Default for RawUpstream {
    fn default() -> Self {
        Self {
            name: "default".into(),
            url: "http://127.0.0.1:30000".into(),
            models: Vec::new(),
            path_prefix: None,
            default_model: None,
            connect_timeout: "5s".into(),
            response_timeout: "600s".into(),
            stream_idle_timeout: "120s".into(),
            pool_idle_timeout: "90s".into(),
            pool_max_idle: 1024,
            max_connections: 0,
            http2: false,
            tls_ca: None,
            tls_client_cert: None,
            tls_client_key: None,
            sends_usage_unasked: "auto".into(),
            metrics_path: "/metrics".into(),
            metrics_interval: "5s".into(),
            reference_file: None,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawAdmin {
    pub listen: String,
    pub token: Option<String>,
    pub max_connections: u64,
    #[serde(deserialize_with = "duration_text")]
    pub session_ttl: String,
    pub max_sessions: u64,
}

impl Default for RawAdmin {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:9464".into(),
            token: None,
            max_connections: 256,
            session_ttl: "12h".into(),
            max_sessions: 64,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawMetering {
    pub inject_usage: bool,
    pub max_parse_bytes: u64,
    pub max_buffered_bytes: u64,
    pub max_event_bytes: u64,
    pub context_buckets: Vec<u64>,
    pub concurrency_buckets: Vec<u64>,
    pub max_models: u64,
}

impl Default for RawMetering {
    fn default() -> Self {
        Self {
            inject_usage: true,
            max_parse_bytes: 8 << 20,
            max_buffered_bytes: 256 << 20,
            max_event_bytes: 1 << 20,
            context_buckets: DEFAULT_CONTEXTS.to_vec(),
            concurrency_buckets: DEFAULT_CONCURRENCY.to_vec(),
            max_models: 32,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawTelemetry {
    pub otlp_endpoint: Option<String>,
    pub service_name: String,
    #[serde(deserialize_with = "duration_text")]
    pub metric_interval: String,
    pub max_series: u64,
}

impl Default for RawTelemetry {
    fn default() -> Self {
        Self {
            otlp_endpoint: None,
            service_name: "tokentap".into(),
            metric_interval: "60s".into(),
            max_series: 50_000,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawStore {
    pub data_dir: Option<String>,
    #[serde(deserialize_with = "duration_text")]
    pub snapshot_interval: String,
    #[serde(deserialize_with = "duration_text")]
    pub retention: String,
}

impl Default for RawStore {
    fn default() -> Self {
        Self {
            data_dir: Some("tokentap-data".into()),
            snapshot_interval: "1h".into(),
            retention: "720h".into(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawWorkload {
    pub capture: bool,
    pub max_requests: u64,
    #[serde(deserialize_with = "duration_text")]
    pub max_age: String,
    pub salt: String,
    pub max_exports: u64,
}

impl Default for RawWorkload {
    fn default() -> Self {
        Self {
            capture: false,
            max_requests: 1_000_000,
            max_age: "168h".into(),
            salt: String::new(),
            max_exports: 2,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawSweep {
    pub production_guard: u64,
    #[serde(deserialize_with = "duration_text")]
    pub cell_duration: String,
    pub max_output: u64,
    pub kv_budget_tokens: u64,
}

impl Default for RawSweep {
    fn default() -> Self {
        Self {
            production_guard: 4,
            cell_duration: "30s".into(),
            max_output: 4096,
            kv_budget_tokens: 0,
        }
    }
}

/// SLO targets as written: durations, each optional (absent = not set).
#[derive(Debug, Deserialize, Default, Clone)]
#[serde(deny_unknown_fields, default)]
pub struct RawSloTargets {
    pub ttft: Option<String>,
    pub tbt: Option<String>,
    pub e2e: Option<String>,
}

/// `[slo]`: the default targets, and `[slo.models."<model>"]` tables that replace them.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct RawSlo {
    pub ttft: Option<String>,
    pub tbt: Option<String>,
    pub e2e: Option<String>,
    pub models: std::collections::BTreeMap<String, RawSloTargets>,
}

/// `[evidence]`: what a production cell must rest on before its figures are trusted.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawEvidence {
    pub min_requests: u64,
    #[serde(deserialize_with = "duration_text")]
    pub min_measured_for: String,
    pub min_output_tokens: u64,
}

impl Default for RawEvidence {
    fn default() -> Self {
        // A median over fewer requests is too noisy to compare or alert on.
        Self {
            min_requests: 20,
            min_measured_for: "10s".into(),
            min_output_tokens: 500,
        }
    }
}

/// `[capacity]`: live headroom under the configured `[slo]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawCapacity {
    #[serde(deserialize_with = "duration_text")]
    pub window: String,
    pub basis: String,
    pub attainment: f64,
}

impl Default for RawCapacity {
    fn default() -> Self {
        Self {
            window: "5m".into(),
            basis: "median".into(),
            attainment: 0.95,
        }
    }
}

/// `[fingerprint]`: how often each upstream is asked what it is, and what the operator knows
/// of its hardware that a sidecar cannot see.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawFingerprint {
    #[serde(deserialize_with = "duration_text")]
    pub interval: String,
    pub hardware: String,
    pub gpu_count: u32,
    pub node: String,
    pub zone: String,
    pub launch_command: String,
}

impl Default for RawFingerprint {
    fn default() -> Self {
        Self {
            interval: "60s".into(),
            hardware: String::new(),
            gpu_count: 0,
            node: String::new(),
            zone: String::new(),
            launch_command: String::new(),
        }
    }
}

/// `[drift]`: how production is compared with pinned reference matrices.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawDrift {
    #[serde(deserialize_with = "duration_text")]
    pub window: String,
    #[serde(deserialize_with = "duration_text")]
    pub refresh_interval: String,
}

impl Default for RawDrift {
    fn default() -> Self {
        Self {
            window: "15m".into(),
            refresh_interval: "30s".into(),
        }
    }
}
