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

use crate::base::engine::Engine;
use crate::base::exposition;
use crate::matrix::redact::redact_launch_command;
use crate::meter::identity::{ConfigFacts, FingerprintId};
pub use crate::proxy::answers::Answers;

/// Longest fact value kept (longer values are cut, on a character boundary).
pub const MAX_VALUE_CHARS: usize = 256;
/// Longest launch command kept.
pub const MAX_LAUNCH_COMMAND_CHARS: usize = 4096;
/// Most fields one configuration holds (an absurd `/server_info` cannot grow it further).
pub const MAX_FIELDS: usize = 256;

/// `*_info` metrics never read (OpenTelemetry's `target_info` names hosts and instances).
const SKIPPED_INFO_METRICS: &[&str] = &["target_info"];
/// `*_info` labels never read: which engine process or model name a series is, and anything
/// naming a time, host, port or process.
const SKIPPED_INFO_LABELS: &[&str] = &["engine", "model_name", "instance", "job", "pid"];

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
    let engine = answers.engine();
    // A generic OpenAI-compatible server is not named: nothing says which server it is.
    if let Some(engine) = engine.filter(|e| *e != Engine::OPENAI) {
        facts.field("engine", engine.name());
    }
    let describe = engine.map(|e| e.spec().describe);
    let info_text = |key: Option<&'static str>| {
        let key = key?;
        text(answers.server_info()?, key)
    };
    // Version: the engine's server info, else its version document.
    let version = info_text(describe.and_then(|d| d.version_key))
        .or_else(|| answers.version.as_ref().and_then(|v| text(v, "version")));
    if let Some(version) = version {
        facts.field("version", &version);
    }
    // The weights: the server info's path, else the model info's, else `/v1/models`' root
    // where the engine puts the path there (vLLM; sglang's is the served name).
    let model = info_text(describe.and_then(|d| d.model_path_key))
        .or_else(|| {
            answers
                .model_info
                .as_ref()
                .and_then(|v| text(v, "model_path"))
        })
        .or_else(|| {
            describe
                .is_some_and(|d| d.models_root_is_path)
                .then(|| answers.first_model().and_then(|m| text(m, "root")))
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
    if let Some(first) = answers.first_model() {
        if let Some(length) = first.get("max_model_len").and_then(Value::as_u64) {
            facts.field("max_model_len", &length.to_string());
        }
        if let Some(name) = text(first, "id") {
            facts.extra("served_model_name", &name);
        }
    }
    if let Some(info) = answers.server_info() {
        server_info(&mut facts, info, engine);
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

/// The server arguments its engine hashes (`base::engine`'s `fingerprint` keys), the launch
/// command (shown, not hashed) and the simulator's hardware labels.
fn server_info(facts: &mut Facts, info: &Value, engine: Option<Engine>) {
    let Some(map) = info.as_object() else {
        return;
    };
    if let Some(keys) = engine.map(|e| e.spec().fingerprint) {
        for (key, value) in map {
            if !keys.contains(key) {
                continue;
            }
            if let Some(value) = scalar(value) {
                facts.field(key, &value);
            }
        }
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
            server_info: Some((
                "/server_info",
                json!({
                    "model_path": "/models/m", "version": "0.5.23", "tp_size": 4,
                    "chunked_prefill_size": 8192, "speculative_algorithm": "EAGLE",
                    "enable_dp_attention": false, "api_key": "sk-secret", "port": 30000,
                    "host": "0.0.0.0", "random_seed": 7, "max_total_num_tokens": 622592,
                    "launch_command": "python -m sglang.launch_server --api-key sk-secret --tp 4",
                    "internal_states": [{"last_gen_throughput": 12.5}], "status": "ready",
                    "hf_token": "hf_x"
                }),
            )),
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
