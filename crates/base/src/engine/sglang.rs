//! sglang (`python -m sglang.launch_server`): what tokentap knows of it, from sglang 0.5.23's
//! own sources (`entrypoints/http_server.py`, `observability/metrics_collector.py`).

use super::spec::{
    Abort, CodeField, Detection, EngineRoute, EngineSpec, FingerprintKeys, Frontend, KvBudget,
    Metrics, PriorityScheduling, RouteClass, RouteTable, SelfDescription, Sessions, Tokenize,
    UsageReport,
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
    routes: &[RouteTable {
        version: "0.5.23",
        frontend: Frontend::MAIN,
        parts: &[ROUTES],
    }],
    // `--enable-custom-logit-processor`: the field is a hex-encoded dill pickle the scheduler
    // unpickles (`sampling/custom_logit_processor.py`), read by `GenerateReqInput`,
    // `CompletionRequest` and `ChatCompletionRequest` (`/invocations` is chat;
    // `/vertex_generate` passes its `parameters` on as a generate request).
    code_fields: &[CodeField {
        field: "custom_logit_processor",
        routes: &[
            "/generate",
            "/v1/completions",
            "/v1/chat/completions",
            "/invocations",
            "/vertex_generate",
        ],
        opened_by: "--enable-custom-logit-processor",
    }],
    // sglang `--enable-priority-scheduling` (`schedule_policy.py`: `priority_sign = -1` unless
    // `--schedule-low-priority-values-first`); vLLM `--scheduling-policy priority`, lower first.
    priority: Some(PriorityScheduling {
        flag: "--enable-priority-scheduling",
        larger_first: true,
        reverse_flag: Some("--schedule-low-priority-values-first"),
    }),
    // `POST /open_session` answers the id (`http_server.py`; the client may choose it in the
    // body's `session_id`), `/close_session` takes `{"session_id": …}` and closes it for
    // whoever asks. `session_params.id` continues a session on the generate path
    // (`GenerateReqInput`; `/vertex_generate` spreads its `parameters` into one): the
    // scheduler builds the request on the session's prompts and answers
    // (`session_controller.py`). The OpenAI routes take only the top-level `session_id` of the
    // session radix cache, which groups cache entries and reads no context.
    sessions: Some(Sessions {
        open: "/open_session",
        close: "/close_session",
        close_id_field: "session_id",
        params_field: "session_params",
        params_id_field: "id",
        params_routes: &["/generate", "/vertex_generate"],
    }),
};

/// Every route sglang 0.5.23's HTTP server registers (`entrypoints/http_server.py` and the
/// routers it includes; the list as data, with each route's source line and condition:
/// `tests/fixtures/engines/routes/sglang-0.5.23.tsv`). Control: caches, weights, memory,
/// profiling, logging, scheduling, LoRA adapters, other clients' requests, scale-out, the
/// dumper, expert records. `/server_info` (`/get_server_info`) hands out the resolved server
/// arguments, API keys included: a read that clients use (sglang's own `bench_serving`), so it
/// is forwarded with every credential masked (`proxy::phase::admit`, `net::redact`). Sessions
/// (`/open_session`, `/close_session`) are an inference feature. Paths some environment
/// variables move (the Ollama routes, `/vertex_generate`) are listed at their defaults.
const ROUTES: &[EngineRoute] = &[
    EngineRoute::new(RouteClass::Read, &["GET"], "/"),
    EngineRoute::new(RouteClass::Control, &["POST"], "/abort_request"),
    EngineRoute::new(RouteClass::Control, &["POST"], "/add_external_corpus"),
    EngineRoute::new(RouteClass::Inference, &["POST"], "/api/chat"),
    EngineRoute::new(RouteClass::Inference, &["POST"], "/api/generate"),
    EngineRoute::new(RouteClass::Read, &["POST"], "/api/show"),
    EngineRoute::new(RouteClass::Read, &["GET"], "/api/tags"),
    EngineRoute::new(RouteClass::Control, &["POST"], "/begin_weight_update"),
    EngineRoute::new(RouteClass::Inference, &["POST", "PUT"], "/classify"),
    EngineRoute::new(RouteClass::Inference, &["GET", "POST"], "/close_session"),
    EngineRoute::new(RouteClass::Control, &["GET", "POST"], "/configure_logging"),
    EngineRoute::new(RouteClass::Control, &["POST"], "/continue_generation"),
    EngineRoute::new(
        RouteClass::Control,
        &["POST"],
        "/destroy_weights_update_group",
    ),
    EngineRoute::new(RouteClass::Inference, &["POST"], "/detokenize"),
    EngineRoute::new(RouteClass::Read, &["GET"], "/docs"), // unless env DISABLE_OPENAPI_DOC=true|1
    EngineRoute::new(RouteClass::Read, &["GET"], "/docs/oauth2-redirect"), // unless env DISABLE_OPENAPI_DOC=true|1
    EngineRoute::new(
        RouteClass::Control,
        &["GET", "POST"],
        "/dump_expert_distribution_record",
    ),
    EngineRoute::new(RouteClass::Control, &["POST"], "/dumper/{method}"), // env DUMPER_SERVER_PORT=reuse
    EngineRoute::new(RouteClass::Inference, &["POST", "PUT"], "/encode"),
    EngineRoute::new(RouteClass::Control, &["POST"], "/end_weight_update"),
    EngineRoute::new(RouteClass::Control, &["GET", "POST"], "/flush_cache"),
    EngineRoute::new(RouteClass::Control, &["GET", "POST"], "/freeze_gc"),
    EngineRoute::new(RouteClass::Inference, &["POST", "PUT"], "/generate"),
    EngineRoute::new(
        RouteClass::Control,
        &["GET"],
        "/get_hicache_l3_cache_layout",
    ),
    EngineRoute::new(RouteClass::Read, &["GET"], "/get_model_info"),
    EngineRoute::new(
        RouteClass::Control,
        &["GET"],
        "/get_remote_instance_transfer_engine_info",
    ),
    EngineRoute::new(RouteClass::Read, &["GET"], "/get_server_info"), // forwarded with its credentials masked
    EngineRoute::new(
        RouteClass::Control,
        &["GET", "POST"],
        "/get_weights_by_name",
    ),
    EngineRoute::new(RouteClass::Read, &["GET"], "/health"),
    EngineRoute::new(RouteClass::Read, &["GET"], "/health_generate"),
    EngineRoute::new(
        RouteClass::Control,
        &["DELETE", "GET", "PUT"],
        "/hicache/storage-backend",
    ),
    EngineRoute::new(
        RouteClass::Control,
        &["POST"],
        "/hicache/storage-backend/clear",
    ),
    EngineRoute::new(
        RouteClass::Control,
        &["POST"],
        "/init_weights_send_group_for_remote_instance",
    ),
    EngineRoute::new(RouteClass::Control, &["POST"], "/init_weights_update_group"),
    EngineRoute::new(RouteClass::Inference, &["POST"], "/invocations"),
    EngineRoute::new(RouteClass::Control, &["GET"], "/is_scaling_elastic_ep"),
    EngineRoute::new(RouteClass::Control, &["GET"], "/list_external_corpora"),
    EngineRoute::new(RouteClass::Control, &["POST"], "/load_lora_adapter"),
    EngineRoute::new(
        RouteClass::Control,
        &["POST"],
        "/load_lora_adapter_from_tensors",
    ),
    EngineRoute::mount(RouteClass::Read, "/metrics"), // --enable-metrics
    EngineRoute::new(RouteClass::Read, &["GET"], "/model_info"),
    EngineRoute::new(RouteClass::Inference, &["GET", "POST"], "/open_session"),
    EngineRoute::new(RouteClass::Read, &["GET"], "/openapi.json"), // unless env DISABLE_OPENAPI_DOC=true|1
    EngineRoute::new(RouteClass::Inference, &["POST"], "/parse_function_call"),
    EngineRoute::new(RouteClass::Control, &["POST"], "/pause_generation"),
    EngineRoute::new(RouteClass::Control, &["POST"], "/pd_role_switch"),
    EngineRoute::new(RouteClass::Read, &["GET"], "/ping"),
    EngineRoute::new(RouteClass::Read, &["GET"], "/ready"),
    EngineRoute::new(RouteClass::Read, &["GET"], "/redoc"), // unless env DISABLE_OPENAPI_DOC=true|1
    EngineRoute::new(
        RouteClass::Control,
        &["GET", "POST"],
        "/release_memory_occupation",
    ),
    EngineRoute::new(
        RouteClass::Control,
        &["GET"],
        "/remote_instance_transfer_engine_info",
    ),
    EngineRoute::new(RouteClass::Control, &["POST"], "/remove_external_corpus"),
    EngineRoute::new(
        RouteClass::Control,
        &["GET", "POST"],
        "/resume_memory_occupation",
    ),
    EngineRoute::new(RouteClass::Control, &["POST"], "/scale_elastic_ep"),
    EngineRoute::new(
        RouteClass::Control,
        &["POST"],
        "/send_weights_to_remote_instance",
    ),
    EngineRoute::new(RouteClass::Inference, &["POST"], "/separate_reasoning"),
    EngineRoute::new(RouteClass::Read, &["GET"], "/server_info"), // forwarded with its credentials masked
    EngineRoute::new(RouteClass::Control, &["POST", "PUT"], "/set_internal_state"),
    EngineRoute::new(RouteClass::Control, &["GET", "POST"], "/set_trace_level"),
    EngineRoute::new(RouteClass::Control, &["GET", "POST"], "/slow_down"),
    EngineRoute::new(
        RouteClass::Control,
        &["GET", "POST"],
        "/start_expert_distribution_record",
    ),
    EngineRoute::new(RouteClass::Control, &["GET", "POST"], "/start_profile"),
    EngineRoute::new(
        RouteClass::Control,
        &["GET", "POST"],
        "/stop_expert_distribution_record",
    ),
    EngineRoute::new(RouteClass::Control, &["GET", "POST"], "/stop_profile"),
    EngineRoute::new(RouteClass::Inference, &["POST"], "/tokenize"),
    EngineRoute::new(RouteClass::Control, &["POST"], "/unload_lora_adapter"),
    EngineRoute::new(RouteClass::Control, &["POST"], "/update_weight_version"),
    EngineRoute::new(RouteClass::Control, &["POST"], "/update_weights_from_disk"),
    EngineRoute::new(
        RouteClass::Control,
        &["POST"],
        "/update_weights_from_distributed",
    ),
    EngineRoute::new(RouteClass::Control, &["POST"], "/update_weights_from_ipc"),
    EngineRoute::new(
        RouteClass::Control,
        &["POST"],
        "/update_weights_from_tensor",
    ),
    EngineRoute::new(RouteClass::Inference, &["POST"], "/v1/audio/transcriptions"),
    EngineRoute::new(RouteClass::Inference, &["POST"], "/v1/chat/completions"),
    EngineRoute::new(RouteClass::Inference, &["POST"], "/v1/classify"),
    EngineRoute::new(RouteClass::Inference, &["POST"], "/v1/completions"),
    EngineRoute::new(RouteClass::Inference, &["POST"], "/v1/decisions"),
    EngineRoute::new(RouteClass::Inference, &["POST"], "/v1/detokenize"),
    EngineRoute::new(RouteClass::Inference, &["POST"], "/v1/embeddings"),
    EngineRoute::new(RouteClass::Read, &["GET"], "/v1/loads"),
    EngineRoute::new(RouteClass::Inference, &["POST"], "/v1/messages"),
    EngineRoute::new(
        RouteClass::Inference,
        &["POST"],
        "/v1/messages/count_tokens",
    ),
    EngineRoute::new(RouteClass::Read, &["GET"], "/v1/models"),
    EngineRoute::new(RouteClass::Read, &["GET"], "/v1/models/{model:path}"),
    EngineRoute::new(RouteClass::Inference, &["GET"], "/v1/realtime"),
    EngineRoute::new(RouteClass::Inference, &["POST", "PUT"], "/v1/rerank"),
    EngineRoute::new(RouteClass::Inference, &["POST"], "/v1/responses"),
    EngineRoute::new(
        RouteClass::Inference,
        &["GET"],
        "/v1/responses/{response_id}",
    ),
    EngineRoute::new(
        RouteClass::Inference,
        &["POST"],
        "/v1/responses/{response_id}/cancel",
    ),
    EngineRoute::new(RouteClass::Inference, &["POST"], "/v1/score"),
    EngineRoute::new(RouteClass::Inference, &["POST"], "/v1/systemone"),
    EngineRoute::new(RouteClass::Inference, &["POST"], "/v1/tokenize"),
    EngineRoute::new(RouteClass::Inference, &["POST"], "/vertex_generate"),
    EngineRoute::new(RouteClass::Control, &["GET", "POST"], "/weights_checker"),
];
