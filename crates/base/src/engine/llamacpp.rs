//! llama.cpp's server (`llama-server`): what tokentap knows of it, from its sources
//! (`tools/server/server.cpp`).

use super::spec::{
    ControlRoute, Detection, EngineSpec, FingerprintKeys, KvBudget, Methods, Metrics,
    SelfDescription, Tokenize, UsageReport,
};

pub(super) const SPEC: EngineSpec = EngineSpec {
    name: "llamacpp",
    detect: Detection {
        owned_by: &["llamacpp"],
        metric_prefix: Some("llamacpp:"),
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
        running: &["llamacpp:requests_processing"],
        queued: &["llamacpp:requests_deferred"],
        kv_usage: &["llamacpp:kv_cache_usage_ratio"],
        prefix_hit_rate: &[],
        prefix_hits: &[],
        prefix_queries: &[],
        cached_prompt_tokens: &[],
        prompt_tokens: &["llamacpp:prompt_tokens_total"],
        rank_label: None,
    },
    kv_budget: KvBudget::Unknown,
    usage: UsageReport {
        unasked_key: None,
        cache_report_flag: None,
    },
    abort: None,
    tokenize: &[Tokenize {
        route: "/tokenize",
        text_field: "content",
        special_tokens_field: Some("add_special"),
    }],
    control_routes: CONTROL_ROUTES,
    priority: None,
};

/// `llama-server`'s routes that act on it (`tools/server/server.cpp`): a slot's KV cache saved,
/// restored or erased (`POST /slots/{id}?action=`), LoRA scales and server properties changed,
/// models loaded and unloaded in router mode. Their `GET`s only read.
const CONTROL_ROUTES: &[ControlRoute] = &[
    ControlRoute::under("/slots/", Methods::Only(&["POST"])),
    ControlRoute::only("/lora-adapters", &["POST"]),
    ControlRoute::only("/props", &["POST"]),
    ControlRoute::only("/models/load", &["POST"]),
    ControlRoute::only("/models/unload", &["POST"]),
];
