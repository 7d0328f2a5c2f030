//! vLLM (`vllm serve`): what tokentap knows of it, from vLLM 0.32's own sources
//! (`entrypoints/`, `v1/metrics/loggers.py`).

use super::spec::{
    ControlRoute, Detection, EngineSpec, FingerprintKeys, KvBudget, Metrics, PriorityScheduling,
    SelfDescription, Tokenize, UsageReport,
};

pub(super) const SPEC: EngineSpec = EngineSpec {
    name: "vllm",
    detect: Detection {
        owned_by: &["vllm"],
        metric_prefix: Some("vllm:"),
        by_self_description: false,
    },
    describe: SelfDescription {
        // Its `/server_info` exists only with VLLM_SERVER_DEV_MODE=1.
        server_info: &[],
        model_info: None,
        version: Some("/version"),
        version_key: None,
        model_path_key: None,
        // `/v1/models`' `root` is the path the weights were loaded from.
        models_root_is_path: true,
        context_length_key: None,
        max_input_key: None,
    },
    fingerprint: FingerprintKeys {
        names: &[],
        prefixes: &[],
    },
    metrics: Metrics {
        running: &["vllm:num_requests_running"],
        queued: &["vllm:num_requests_waiting"],
        // A 0–1 share despite its name; `gpu_cache_usage_perc` before 0.10.
        kv_usage: &["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"],
        prefix_hit_rate: &[],
        prefix_hits: &["vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits"],
        prefix_queries: &[
            "vllm:prefix_cache_queries_total",
            "vllm:prefix_cache_queries",
        ],
        cached_prompt_tokens: &[
            "vllm:prompt_tokens_cached_total",
            "vllm:prompt_tokens_cached",
        ],
        prompt_tokens: &["vllm:prompt_tokens_total", "vllm:prompt_tokens"],
        // One series per engine core: data parallelism runs several.
        rank_label: Some("engine"),
    },
    // Blocks × block size of each engine core's cache, summed over the cores.
    kv_budget: KvBudget::InfoMetric {
        metric: "vllm:cache_config_info",
        blocks: "num_gpu_blocks",
        block_size: "block_size",
    },
    usage: UsageReport {
        // `--enable-force-include-usage` is not visible over HTTP (`upstream.sends_usage_unasked`).
        unasked_key: None,
        cache_report_flag: Some("--enable-prompt-tokens-details"),
    },
    // A dropped connection aborts a request; there is no route for one request.
    abort: None,
    tokenize: &[Tokenize {
        route: "/tokenize",
        text_field: "prompt",
        special_tokens_field: Some("add_special_tokens"),
    }],
    control_routes: CONTROL_ROUTES,
    // `--scheduling-policy priority`: the waiting queue by (priority, arrival), lower first.
    priority: Some(PriorityScheduling {
        flag: "--scheduling-policy priority",
        larger_first: false,
        reverse_flag: None,
    }),
};

/// vLLM 0.32's routes that act on the server (`entrypoints/serve/dev/`, `serve/profile/`,
/// `serve/lora/`, `serve/elastic_ep/`, `serve/fault_tolerance/`, `rl/online/`). The dev routes
/// exist only with `VLLM_SERVER_DEV_MODE=1`, the RL ones only in RL deployments: refused
/// wherever they exist.
const CONTROL_ROUTES: &[ControlRoute] = &[
    ControlRoute::any("/reset_prefix_cache"),
    ControlRoute::any("/reset_mm_cache"),
    ControlRoute::any("/reset_encoder_cache"),
    ControlRoute::any("/collective_rpc"),
    ControlRoute::any("/sleep"),
    ControlRoute::any("/wake_up"),
    ControlRoute::any("/release_kv_cache_memory"),
    ControlRoute::any("/start_profile"),
    ControlRoute::any("/stop_profile"),
    ControlRoute::any("/v1/load_lora_adapter"),
    ControlRoute::any("/v1/unload_lora_adapter"),
    ControlRoute::any("/scale_elastic_ep"),
    ControlRoute::any("/fault_tolerance/apply"),
    ControlRoute::any("/abort_requests"),
    ControlRoute::any("/pause"),
    ControlRoute::any("/resume"),
    ControlRoute::any("/init_weight_transfer_engine"),
    ControlRoute::any("/shutdown_weight_transfer_engine"),
    ControlRoute::any("/start_weight_update"),
    ControlRoute::any("/start_draft_weight_update"),
    ControlRoute::any("/finish_weight_update"),
    ControlRoute::any("/update_weights"),
    ControlRoute::any("/update_weight_version"),
    ControlRoute::any("/weight_checker"),
];
