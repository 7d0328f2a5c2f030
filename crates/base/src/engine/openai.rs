//! Any other OpenAI-compatible server: what tokentap assumes of a server it cannot name.

use super::spec::{
    Detection, EngineSpec, FingerprintKeys, KvBudget, Metrics, SelfDescription, Tokenize,
    UsageReport,
};

pub(super) const SPEC: EngineSpec = EngineSpec {
    name: "openai",
    // Recognised by elimination (`detect`): it lists models and says nothing more.
    detect: Detection {
        owned_by: &[],
        metric_prefix: None,
        by_self_description: false,
    },
    describe: SelfDescription {
        server_info: &[],
        model_info: None,
        version: None,
        version_key: None,
        model_path_key: None,
        models_root_is_path: false,
        context_length_key: None,
        max_input_key: None,
    },
    fingerprint: FingerprintKeys {
        names: &[],
        prefixes: &[],
    },
    metrics: Metrics {
        running: &[],
        queued: &[],
        kv_usage: &[],
        prefix_hit_rate: &[],
        prefix_hits: &[],
        prefix_queries: &[],
        cached_prompt_tokens: &[],
        prompt_tokens: &[],
        rank_label: None,
    },
    kv_budget: KvBudget::Unknown,
    usage: UsageReport {
        unasked_key: None,
        cache_report_flag: None,
    },
    abort: None,
    // The common tokenizers of OpenAI-compatible servers: sglang's and vLLM's shape, then
    // llama-cpp-python's (`{"input": …}`, no switch for special tokens).
    tokenize: &[
        Tokenize {
            route: "/tokenize",
            text_field: "prompt",
            special_tokens_field: Some("add_special_tokens"),
        },
        Tokenize {
            route: "/extras/tokenize",
            text_field: "input",
            special_tokens_field: None,
        },
    ],
    // The OpenAI API has no route that acts on the server.
    control_routes: &[],
    priority: None,
};
