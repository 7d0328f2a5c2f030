//! What an upstream's answers say it is (pure): the answers of one read ([`Answers`]) and the
//! operator's labels ([`Operator`]) → [`ConfigFacts`], whose `fields` are hashed into the
//! fingerprint ([`fingerprint`]: FNV-1a 64 over `key=value\n` lines in key order, low 48
//! bits), and the field-by-field difference of two configurations ([`diff`]).
//!
//! Which fields enter the hash is the documented list in docs/fleet.md ("What enters the
//! fingerprint"); keep the two in step. Start times, pids, ports, hosts, counters, seeds and
//! secrets never enter it; the launch command is shown (redacted by `matrix::redact`) but not
//! hashed, as are the node, the zone and the served model name.

use crate::base::json::field_text as text;
use std::collections::BTreeMap;

use serde_json::Value;

use crate::base::exposition;
use crate::matrix::redact::redact_launch_command;
use crate::meter::identity::{ConfigFacts, FingerprintId};

/// Longest fact value kept (longer values are cut, on a character boundary).
pub const MAX_VALUE_CHARS: usize = 256;
/// Longest launch command kept.
pub const MAX_LAUNCH_COMMAND_CHARS: usize = 4096;
/// Most fields one configuration holds (an absurd `/server_info` cannot grow it further).
pub const MAX_FIELDS: usize = 256;

/// sglang server arguments (`/server_info`) that enter the fingerprint by name.
pub const SGLANG_ARGS: &[&str] = &[
    "tp_size",
    "dp_size",
    "pp_size",
    "ep_size",
    "quantization",
    "dtype",
    "kv_cache_dtype",
    "context_length",
    "chunked_prefill_size",
    "max_prefill_tokens",
    "max_running_requests",
    "max_total_tokens",
    "mem_fraction_static",
    "page_size",
    "schedule_policy",
    "schedule_conservativeness",
    "attention_backend",
    "prefill_attention_backend",
    "decode_attention_backend",
    "sampling_backend",
    "grammar_backend",
    "stream_interval",
    "load_format",
    "lora_paths",
    "max_loras_per_batch",
    "num_continuous_decode_steps",
    "torch_compile_max_bs",
    "triton_attention_num_kv_splits",
    "reasoning_parser",
    "tool_call_parser",
];

/// sglang server arguments that enter the fingerprint by prefix (speculative decoding, the
/// `enable_…`/`disable_…` switches, MoE, CUDA graphs, the hierarchical cache).
pub const SGLANG_ARG_PREFIXES: &[&str] = &[
    "speculative_",
    "enable_",
    "disable_",
    "moe_",
    "deepep_",
    "cuda_graph_",
    "hicache_",
];

/// `*_info` metrics never read (OpenTelemetry's `target_info` names hosts and instances).
const SKIPPED_INFO_METRICS: &[&str] = &["target_info"];
/// `*_info` labels never read: which engine process or model name a series is, and anything
/// naming a time, host, port or process.
const SKIPPED_INFO_LABELS: &[&str] = &["engine", "model_name", "instance", "job", "pid"];

/// The answers of one read of an upstream (each `None` when it did not answer in time, or
/// not with 2xx JSON / text).
#[derive(Debug, Clone, Default)]
pub struct Answers {
    /// sglang `/server_info` (or `/get_server_info`).
    pub server_info: Option<Value>,
    /// sglang `/model_info`.
    pub model_info: Option<Value>,
    /// `/v1/models`.
    pub models: Option<Value>,
    /// `/version` (vLLM, and sglang).
    pub version: Option<Value>,
    /// The Prometheus page (`metrics_path`).
    pub metrics: Option<String>,
}

impl Answers {
    /// Whether anything answered.
    pub fn any(&self) -> bool {
        self.server_info.is_some()
            || self.model_info.is_some()
            || self.models.is_some()
            || self.version.is_some()
            || self.metrics.is_some()
    }

    /// Which questions answered, for the facts' `read` entry.
    pub fn answered(&self) -> Vec<&'static str> {
        let mut out = Vec::new();
        for (name, present) in [
            ("server_info", self.server_info.is_some()),
            ("model_info", self.model_info.is_some()),
            ("models", self.models.is_some()),
            ("version", self.version.is_some()),
            ("metrics", self.metrics.is_some()),
        ] {
            if present {
                out.push(name);
            }
        }
        out
    }

    /// Fills what `self` lacks from `earlier` (an answer that timed out this time but came
    /// last time: a busy sglang answers `/server_info` late, and its absence must not read as
    /// another configuration).
    pub fn or_from(mut self, earlier: &Answers) -> Answers {
        self.server_info = self.server_info.or_else(|| earlier.server_info.clone());
        self.model_info = self.model_info.or_else(|| earlier.model_info.clone());
        self.models = self.models.or_else(|| earlier.models.clone());
        self.version = self.version.or_else(|| earlier.version.clone());
        self.metrics = self.metrics.or_else(|| earlier.metrics.clone());
        self
    }
}

/// What the operator says about the upstream (`[fingerprint]`): `hardware` and `gpu_count`
/// enter the fingerprint; `node`, `zone` and `launch_command` (for servers that do not say
/// theirs) are shown only.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Operator {
    pub hardware: String,
    pub gpu_count: u32,
    pub node: String,
    pub zone: String,
    pub launch_command: String,
}

/// The facts of one read.
pub fn facts(answers: &Answers, operator: &Operator) -> ConfigFacts {
    let mut facts = Facts::default();
    let engine = engine(answers);
    if let Some(engine) = engine {
        facts.field("engine", engine);
    }
    // Version: sglang's /server_info, else /version.
    let version = answers
        .server_info
        .as_ref()
        .and_then(|v| text(v, "version"))
        .or_else(|| answers.version.as_ref().and_then(|v| text(v, "version")));
    if let Some(version) = version {
        facts.field("version", &version);
    }
    // The weights: sglang's model_path, else vLLM's /v1/models root.
    let model = answers
        .server_info
        .as_ref()
        .and_then(|v| text(v, "model_path"))
        .or_else(|| {
            answers
                .model_info
                .as_ref()
                .and_then(|v| text(v, "model_path"))
        })
        .or_else(|| {
            (engine != Some("sglang"))
                .then(|| first_model(answers).and_then(|m| text(m, "root")))
                .flatten()
        });
    if let Some(model) = model {
        facts.field("model", &model);
    }
    if let Some(info) = &answers.model_info {
        if let Some(weights) = text(info, "weight_version") {
            facts.field("weight_version", &weights);
        }
    }
    if let Some(first) = first_model(answers) {
        if let Some(length) = first.get("max_model_len").and_then(Value::as_u64) {
            facts.field("max_model_len", &length.to_string());
        }
        if let Some(name) = text(first, "id") {
            facts.extra("served_model_name", &name);
        }
    }
    if let Some(info) = &answers.server_info {
        server_info(&mut facts, info);
    }
    if let Some(page) = &answers.metrics {
        info_metrics(&mut facts, page);
    }
    if !operator.hardware.is_empty() {
        facts.field("hardware", &operator.hardware);
    }
    if operator.gpu_count > 0 {
        facts.field("gpu_count", &operator.gpu_count.to_string());
    }
    if !operator.node.is_empty() {
        facts.extra("node", &operator.node);
    }
    if !operator.zone.is_empty() {
        facts.extra("zone", &operator.zone);
    }
    if !operator.launch_command.is_empty() && !facts.0.extra.contains_key("launch_command") {
        let command = redact_launch_command(&operator.launch_command);
        let command: String = command.chars().take(MAX_LAUNCH_COMMAND_CHARS).collect();
        facts.0.extra.insert("launch_command".into(), command);
    }
    facts.extra("read", &answers.answered().join(", "));
    facts.0
}

/// The fingerprint of `facts`: FNV-1a 64 over each field as `key=value\n`, in key order,
/// cut to its low 48 bits. Stable across runs, builds and platforms.
pub fn fingerprint(facts: &ConfigFacts) -> FingerprintId {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut hash = OFFSET;
    let mut eat = |bytes: &[u8]| {
        for &b in bytes {
            hash ^= u64::from(b);
            hash = hash.wrapping_mul(PRIME);
        }
    };
    for (key, value) in &facts.fields {
        eat(key.as_bytes());
        eat(b"=");
        eat(value.as_bytes());
        eat(b"\n");
    }
    FingerprintId::from_hash(hash)
}

/// One fact that differs between two configurations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FactChange {
    pub key: String,
    pub before: Option<String>,
    pub after: Option<String>,
    /// Whether the fact enters the fingerprint.
    pub hashed: bool,
}

/// Field by field, what changed from `before` to `after` (hashed fields first, by key; the
/// `read` bookkeeping entry is left out).
pub fn diff(before: &ConfigFacts, after: &ConfigFacts) -> Vec<FactChange> {
    let mut out = Vec::new();
    for (hashed, old, new) in [
        (true, &before.fields, &after.fields),
        (false, &before.extra, &after.extra),
    ] {
        let keys: std::collections::BTreeSet<&String> = old.keys().chain(new.keys()).collect();
        for key in keys {
            if key == "read" {
                continue;
            }
            let (a, b) = (old.get(key), new.get(key));
            if a != b {
                out.push(FactChange {
                    key: key.clone(),
                    before: a.cloned(),
                    after: b.cloned(),
                    hashed,
                });
            }
        }
    }
    out
}

#[derive(Default)]
struct Facts(ConfigFacts);

impl Facts {
    fn field(&mut self, key: &str, value: &str) {
        if self.0.fields.len() < MAX_FIELDS && !is_secret(key) {
            self.0
                .fields
                .insert(cut(key, 128), cut(value, MAX_VALUE_CHARS));
        }
    }

    fn extra(&mut self, key: &str, value: &str) {
        if self.0.extra.len() < MAX_FIELDS && !is_secret(key) {
            self.0
                .extra
                .insert(cut(key, 128), cut(value, MAX_VALUE_CHARS));
        }
    }
}

/// Which engine: `/v1/models`' `owned_by`, else the metric prefix, else sglang's own routes.
fn engine(answers: &Answers) -> Option<&'static str> {
    match first_model(answers)
        .and_then(|m| m.get("owned_by"))
        .and_then(Value::as_str)
    {
        Some("sglang") => return Some("sglang"),
        Some("vllm") => return Some("vllm"),
        _ => {}
    }
    if let Some(page) = &answers.metrics {
        for sample in exposition::samples(page) {
            if sample.name.starts_with("vllm:") {
                return Some("vllm");
            }
            if sample.name.starts_with("sglang:") {
                return Some("sglang");
            }
        }
    }
    if answers.server_info.is_some() || answers.model_info.is_some() {
        return Some("sglang");
    }
    None
}

fn first_model(answers: &Answers) -> Option<&Value> {
    answers.models.as_ref()?.get("data")?.as_array()?.first()
}

/// sglang's server arguments: the listed ones, the KV budget it computed, the launch command
/// (shown, not hashed) and the simulator's hardware labels.
fn server_info(facts: &mut Facts, info: &Value) {
    let Some(map) = info.as_object() else {
        return;
    };
    for (key, value) in map {
        let listed = SGLANG_ARGS.contains(&key.as_str())
            || SGLANG_ARG_PREFIXES.iter().any(|p| key.starts_with(p));
        if !listed {
            continue;
        }
        if let Some(value) = scalar(value) {
            facts.field(key, &value);
        }
    }
    if let Some(kv) = map.get("max_total_num_tokens").and_then(Value::as_u64) {
        facts.field("max_total_num_tokens", &kv.to_string());
    }
    if let Some(command) = map.get("launch_command").and_then(Value::as_str) {
        let command = redact_launch_command(command);
        let command: String = command.chars().take(MAX_LAUNCH_COMMAND_CHARS).collect();
        facts.0.extra.insert("launch_command".into(), command);
    }
    // The simulator names the hardware it imitates (a real server cannot see it).
    if let Some(profile) = map.get("tokentap_profile") {
        if let Some(hardware) = text(profile, "hardware") {
            facts.field("hardware", &hardware);
        }
        if let Some(count) = profile.get("gpu_count").and_then(Value::as_u64) {
            if count > 0 {
                facts.field("gpu_count", &count.to_string());
            }
        }
    }
}

/// The labels of every `*_info` series on the page (vLLM's `vllm:cache_config_info`, …), as
/// `metric.label`; the first series of each name only.
fn info_metrics(facts: &mut Facts, page: &str) {
    let mut seen: Vec<&str> = Vec::new();
    for sample in exposition::samples(page) {
        let name = sample.name;
        if !name.ends_with("_info") || SKIPPED_INFO_METRICS.contains(&name) || seen.contains(&name)
        {
            continue;
        }
        if seen.len() >= 32 {
            break;
        }
        seen.push(name);
        for (label, value) in sample.labels() {
            if skipped_label(label) {
                continue;
            }
            facts.field(&format!("{name}.{label}"), &value);
        }
    }
}

fn skipped_label(label: &str) -> bool {
    let lower = label.to_ascii_lowercase();
    SKIPPED_INFO_LABELS.contains(&lower.as_str())
        || ["time", "host", "port", "start", "uptime"]
            .iter()
            .any(|w| lower.split(['_', '.']).any(|part| part == *w))
}

/// A key that names a secret: never kept, hashed or shown (`api_key`, `hf_token`,
/// `*_secret`, `*password*`; `max_total_tokens` and `*_num_tokens` are counts, not secrets).
pub fn is_secret(key: &str) -> bool {
    let lower = key.to_ascii_lowercase();
    let parts: Vec<&str> = lower.split(['_', '-', '.', ':']).collect();
    parts.iter().any(|p| {
        matches!(
            *p,
            "key" | "token" | "secret" | "password" | "passwd" | "credential" | "credentials"
        ) || p.contains("secret")
            || p.contains("password")
            || *p == "apikey"
    })
}

/// A scalar (or an array of scalars) as text; objects and nulls are not facts.
fn scalar(value: &Value) -> Option<String> {
    match value {
        Value::Null | Value::Object(_) => None,
        Value::String(s) => Some(s.clone()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Number(n) => Some(n.to_string()),
        Value::Array(items) => {
            if items.iter().all(|i| !matches!(i, Value::Object(_))) {
                Some(Value::Array(items.clone()).to_string())
            } else {
                None
            }
        }
    }
}

fn cut(text: &str, max_chars: usize) -> String {
    text.chars().take(max_chars).collect()
}

/// Facts as one `key=value` line each (the log line and the page's tooltip).
pub fn summary(facts: &BTreeMap<String, String>) -> String {
    facts
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn secrets_and_counts() {
        for secret in [
            "api_key",
            "admin_api_key",
            "hf_token",
            "token",
            "client_secret",
            "db_password",
            "OPENAI_API_KEY",
        ] {
            assert!(is_secret(secret), "{secret}");
        }
        for fine in [
            "max_total_tokens",
            "max_total_num_tokens",
            "kv_cache_dtype",
            "block_size",
            "tokenizer_path",
        ] {
            assert!(!is_secret(fine), "{fine}");
        }
    }

    #[test]
    fn the_hash_is_stable_and_covers_only_fields() {
        let mut a = ConfigFacts::default();
        a.fields.insert("engine".into(), "sglang".into());
        a.fields.insert("version".into(), "0.5.23".into());
        // Pinned (checked with an independent FNV-1a in Python): FNV-1a 64 of
        // "engine=sglang\nversion=0.5.23\n", low 48 bits. A change
        // here changes every deployed fingerprint: do not.
        assert_eq!(fingerprint(&a).to_string(), "eb3cfc33a773");
        let mut b = a.clone();
        b.extra.insert("launch_command".into(), "other".into());
        assert_eq!(fingerprint(&a), fingerprint(&b));
        b.fields.insert("version".into(), "0.5.24".into());
        assert_ne!(fingerprint(&a), fingerprint(&b));
        let changes = diff(&a, &b);
        assert_eq!(changes.len(), 2);
        assert_eq!(changes[0].key, "version");
        assert!(changes[0].hashed);
        assert_eq!(changes[1].key, "launch_command");
        assert!(!changes[1].hashed);
    }

    #[test]
    fn sglang_server_info_gives_args_and_redacted_command_but_no_state() {
        let answers = Answers {
            server_info: Some(json!({
                "model_path": "/models/m", "version": "0.5.23", "tp_size": 4,
                "chunked_prefill_size": 8192, "speculative_algorithm": "EAGLE",
                "enable_dp_attention": false, "api_key": "sk-secret", "port": 30000,
                "host": "0.0.0.0", "random_seed": 7, "max_total_num_tokens": 622592,
                "launch_command": "python -m sglang.launch_server --api-key sk-secret --tp 4",
                "internal_states": [{"last_gen_throughput": 12.5}], "status": "ready",
                "hf_token": "hf_x"
            })),
            ..Answers::default()
        };
        let facts = facts(&answers, &Operator::default());
        assert_eq!(
            facts.fields.get("engine").map(String::as_str),
            Some("sglang")
        );
        assert_eq!(facts.fields.get("tp_size").map(String::as_str), Some("4"));
        assert_eq!(
            facts.fields.get("max_total_num_tokens").map(String::as_str),
            Some("622592")
        );
        for absent in [
            "api_key",
            "port",
            "host",
            "random_seed",
            "internal_states",
            "status",
        ] {
            assert!(!facts.fields.contains_key(absent), "{absent}");
        }
        let all = format!("{facts:?}");
        assert!(!all.contains("sk-secret") && !all.contains("hf_x"), "{all}");
        assert_eq!(
            facts.extra.get("launch_command").map(String::as_str),
            Some("python -m sglang.launch_server --api-key <redacted> --tp 4")
        );
    }
}
