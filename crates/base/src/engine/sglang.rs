//! sglang (`python -m sglang.launch_server`): what tokentap knows of it, from sglang 0.5.23's
//! own sources (`entrypoints/http_server.py`, `observability/metrics_collector.py`).

use super::spec::{
    Abort, ControlRoute, Detection, EngineSpec, FingerprintKeys, KvBudget, Methods, Metrics,
    PriorityScheduling, SelfDescription, Tokenize, UsageReport,
};

pub(super) const SPEC: EngineSpec = EngineSpec {
    name: "sglang",
    detect: Detection {
        owned_by: &["sglang"],
        metric_prefix: Some("sglang:"),
        // Only sglang answers its server and model info (the HTTP process, without its
        // scheduler for the model info).
        by_self_description: true,
    },
    describe: SelfDescription {
        // `/get_server_info` before 0.4.7; both from one handler since.
        server_info: &["/server_info", "/get_server_info"],
        model_info: Some("/model_info"),
        version: None,
        version_key: Some("version"),
        model_path_key: Some("model_path"),
        // `/v1/models`' `root` is the served name.
        models_root_is_path: false,
        context_length_key: Some("context_length"),
        // A prompt must be shorter than this.
        max_input_key: Some("max_req_input_len"),
    },
    fingerprint: FingerprintKeys {
        names: &[
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
            "enable_priority_scheduling",
            "schedule_low_priority_values_first",
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
            // The KV budget it computed.
            "max_total_num_tokens",
        ],
        // Speculative decoding, the `enable_…`/`disable_…` switches, MoE, CUDA graphs, the
        // hierarchical cache.
        prefixes: &[
            "speculative_",
            "enable_",
            "disable_",
            "moe_",
            "deepep_",
            "cuda_graph_",
            "hicache_",
        ],
    },
    metrics: Metrics {
        running: &["sglang:num_running_reqs"],
        queued: &["sglang:num_queue_reqs"],
        kv_usage: &["sglang:token_usage"],
        prefix_hit_rate: &["sglang:cache_hit_rate"],
        prefix_hits: &[],
        prefix_queries: &[],
        cached_prompt_tokens: &["sglang:cached_tokens_total", "sglang:cached_tokens"],
        prompt_tokens: &["sglang:prompt_tokens_total", "sglang:prompt_tokens"],
        // Each data-parallel rank's scheduler exports its own series.
        rank_label: Some("dp_rank"),
    },
    kv_budget: KvBudget::ServerInfo("max_total_num_tokens"),
    usage: UsageReport {
        unasked_key: Some("stream_response_default_include_usage"),
        cache_report_flag: Some("--enable-cache-report"),
    },
    // By the request id sent in the body's `rid`; never `abort_all` (other clients share it).
    abort: Some(Abort {
        route: "/abort_request",
        id_field: "rid",
    }),
    tokenize: &[Tokenize {
        route: "/tokenize",
        text_field: "prompt",
        special_tokens_field: Some("add_special_tokens"),
    }],
    control_routes: CONTROL_ROUTES,
    // sglang `--enable-priority-scheduling` (`schedule_policy.py`: `priority_sign = -1` unless
    // `--schedule-low-priority-values-first`); vLLM `--scheduling-policy priority`, lower first.
    priority: Some(PriorityScheduling {
        flag: "--enable-priority-scheduling",
        larger_first: true,
        reverse_flag: Some("--schedule-low-priority-values-first"),
    }),
};

/// sglang 0.5.23's routes that act on the server (`entrypoints/http_server.py`,
/// `entrypoints/elastic_ep.py`): caches, weights, memory, profiling, logging, scheduling,
/// LoRA adapters, other clients' requests. `GET /get_weights_by_name` only reads, but it hands
/// out the model's weights and costs the GPU a copy: refused too. Sessions (`/open_session`)
/// are an inference feature and forwarded.
const CONTROL_ROUTES: &[ControlRoute] = &[
    ControlRoute::any("/flush_cache"),
    ControlRoute::any("/set_internal_state"),
    ControlRoute::under("/dumper/", Methods::Any),
    ControlRoute::any("/add_external_corpus"),
    ControlRoute::any("/remove_external_corpus"),
    ControlRoute::only("/hicache/storage-backend/clear", &["POST"]),
    ControlRoute::only("/hicache/storage-backend", &["PUT", "DELETE", "POST"]),
    ControlRoute::any("/start_profile"),
    ControlRoute::any("/stop_profile"),
    ControlRoute::any("/set_trace_level"),
    ControlRoute::any("/freeze_gc"),
    ControlRoute::any("/start_expert_distribution_record"),
    ControlRoute::any("/stop_expert_distribution_record"),
    ControlRoute::any("/dump_expert_distribution_record"),
    ControlRoute::any("/update_weights_from_disk"),
    ControlRoute::any("/init_weights_send_group_for_remote_instance"),
    ControlRoute::any("/send_weights_to_remote_instance"),
    ControlRoute::any("/init_weights_update_group"),
    ControlRoute::any("/destroy_weights_update_group"),
    ControlRoute::any("/update_weights_from_tensor"),
    ControlRoute::any("/begin_weight_update"),
    ControlRoute::any("/end_weight_update"),
    ControlRoute::any("/update_weights_from_distributed"),
    ControlRoute::any("/update_weights_from_ipc"),
    ControlRoute::any("/update_weight_version"),
    ControlRoute::any("/get_weights_by_name"),
    ControlRoute::any("/release_memory_occupation"),
    ControlRoute::any("/resume_memory_occupation"),
    ControlRoute::any("/weights_checker"),
    ControlRoute::any("/slow_down"),
    ControlRoute::any("/pd_role_switch"),
    ControlRoute::any("/load_lora_adapter"),
    ControlRoute::any("/load_lora_adapter_from_tensors"),
    ControlRoute::any("/unload_lora_adapter"),
    ControlRoute::any("/configure_logging"),
    ControlRoute::any("/abort_request"),
    ControlRoute::any("/pause_generation"),
    ControlRoute::any("/continue_generation"),
    ControlRoute::any("/scale_elastic_ep"),
];
