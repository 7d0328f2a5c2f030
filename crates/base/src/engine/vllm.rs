//! vLLM (`vllm serve`): what tokentap knows of it, from vLLM 0.32's own sources
//! (`entrypoints/`, `v1/metrics/loggers.py`), and the routes of 0.33 and 0.34 and of the Rust
//! frontend the same wheels ship (`VLLM_USE_RUST_FRONTEND=1`), read from those wheels.

use super::spec::{
    Detection, EngineRoute, EngineSpec, FingerprintKeys, Frontend, KvBudget, Metrics,
    PriorityScheduling, RouteClass, RouteTable, SelfDescription, Tokenize, UsageReport,
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
    routes: &[
        RouteTable {
            version: "0.32",
            frontend: PYTHON,
            parts: &[ROUTES, FAULT_TOLERANCE_0_32],
        },
        RouteTable {
            version: "0.33",
            frontend: PYTHON,
            parts: &[ROUTES, DECISIONS_0_33, FAULT_TOLERANCE_0_32],
        },
        RouteTable {
            version: "0.34",
            frontend: PYTHON,
            parts: &[
                ROUTES,
                DECISIONS_0_33,
                CHECKPOINT_0_34,
                FAULT_TOLERANCE_0_34,
            ],
        },
        RouteTable {
            version: "0.34",
            frontend: RUST,
            parts: &[RUST_0_34],
        },
    ],
    code_fields: &[],
    // `--scheduling-policy priority`: the waiting queue by (priority, arrival), lower first.
    priority: Some(PriorityScheduling {
        flag: "--scheduling-policy priority",
        larger_first: false,
        reverse_flag: None,
    }),
    sessions: None,
};

/// vLLM's FastAPI server (`vllm serve`), what answers `/version` with `version` alone.
const PYTHON: Frontend = Frontend {
    name: "python",
    version_key: None,
};

/// vLLM's Rust frontend (`VLLM_USE_RUST_FRONTEND=1 vllm serve` runs the wheel's `vllm/vllm-rs`
/// on the HTTP socket): its `/version` answers `rust_frontend_version` beside `version`
/// (`vllm_server::routes::version::VersionResponse`).
const RUST: Frontend = Frontend {
    name: "rust",
    version_key: Some("rust_frontend_version"),
};

/// Every route vLLM 0.32's OpenAI-compatible server registers, with every flag that adds
/// routes, that 0.33 and 0.34 register too (`entrypoints/openai/api_server.py` and the routers
/// it includes; the list as data, with each route's source line and condition:
/// `tests/fixtures/engines/routes/vllm-0.32.tsv`, and `vllm-0.33.tsv`, `vllm-0.34.tsv`).
/// Control: the dev-mode routes (`VLLM_SERVER_DEV_MODE=1`: caches, `collective_rpc`, sleep,
/// the RL routes), runtime LoRA loading under every alias (`/v1/load_lora_adapter`, SageMaker's
/// `POST /adapters`, `DELETE /adapters/{name}`), profiling, elastic EP, fault tolerance, and
/// other clients' aborts (`/abort_requests`, `/inference/v1/abort_requests`).
const ROUTES: &[EngineRoute] = &[
    EngineRoute::new(RouteClass::Control, &["POST"], "/abort_requests"), // env VLLM_SERVER_DEV_MODE=1 | --tokens-only
    EngineRoute::new(RouteClass::Control, &["POST"], "/adapters"), // env VLLM_ALLOW_RUNTIME_LORA_UPDATING=1|true
    EngineRoute::new(RouteClass::Control, &["DELETE"], "/adapters/{adapter_name}"), // env VLLM_ALLOW_RUNTIME_LORA_UPDATING=1|true
    EngineRoute::new(RouteClass::Inference, &["POST"], "/classify"), // pooling model with task classify
    EngineRoute::new(RouteClass::Inference, &["POST"], "/cohere/v2/chat"), // task generate + env VLLM_ENABLE_COHERE_API=1 + cohere SDK installed
    EngineRoute::new(RouteClass::Inference, &["POST"], "/cohere/v2/chat/render"), // task generate + env VLLM_ENABLE_COHERE_API=1 + cohere SDK +
    EngineRoute::new(RouteClass::Control, &["POST"], "/collective_rpc"), // env VLLM_SERVER_DEV_MODE=1
    EngineRoute::new(RouteClass::Inference, &["POST"], "/detokenize"),
    EngineRoute::new(RouteClass::Read, &["GET"], "/docs"), // unless --disable-fastapi-docs; unless --disable-fastapi-docs or --enable-offline-docs
    EngineRoute::new(RouteClass::Read, &["GET"], "/docs/oauth2-redirect"), // unless --disable-fastapi-docs; unless --disable-fastapi-docs or --enable-offline-docs
    EngineRoute::new(RouteClass::Control, &["POST"], "/finish_weight_update"), // env VLLM_SERVER_DEV_MODE=1
    EngineRoute::new(RouteClass::Inference, &["POST"], "/generative_scoring"), // task generate
    EngineRoute::new(RouteClass::Control, &["GET"], "/get_world_size"), // env VLLM_SERVER_DEV_MODE=1
    EngineRoute::new(RouteClass::Read, &["GET"], "/health"),
    EngineRoute::new(
        RouteClass::Control,
        &["POST"],
        "/inference/v1/abort_requests",
    ), // task generate|render
    EngineRoute::new(RouteClass::Inference, &["POST"], "/inference/v1/generate"), // task generate|render
    EngineRoute::new(
        RouteClass::Control,
        &["POST"],
        "/init_weight_transfer_engine",
    ), // env VLLM_SERVER_DEV_MODE=1
    EngineRoute::new(RouteClass::Inference, &["POST"], "/invocations"),
    EngineRoute::new(RouteClass::Control, &["GET"], "/is_paused"), // env VLLM_SERVER_DEV_MODE=1
    EngineRoute::new(RouteClass::Control, &["POST"], "/is_scaling_elastic_ep"), // task generate
    EngineRoute::new(RouteClass::Control, &["GET"], "/is_sleeping"), // env VLLM_SERVER_DEV_MODE=1
    EngineRoute::new(RouteClass::Control, &["GET"], "/kv_event_sources"),
    EngineRoute::new(RouteClass::Read, &["GET"], "/load"),
    EngineRoute::new(RouteClass::Read, &["GET"], "/metrics"),
    EngineRoute::mount(RouteClass::Read, "/metrics"),
    EngineRoute::new(RouteClass::Read, &["GET"], "/openapi.json"), // unless --disable-fastapi-docs
    EngineRoute::new(RouteClass::Control, &["POST"], "/pause"),    // env VLLM_SERVER_DEV_MODE=1
    EngineRoute::new(RouteClass::Read, &["GET", "POST"], "/ping"),
    EngineRoute::new(RouteClass::Inference, &["POST"], "/pooling"), // pooling model with a pooling task
    EngineRoute::new(RouteClass::Read, &["GET"], "/redoc"), // unless --disable-fastapi-docs or --enable-offline-docs
    EngineRoute::new(RouteClass::Control, &["POST"], "/release_kv_cache_memory"), // env VLLM_SERVER_DEV_MODE=1
    EngineRoute::new(RouteClass::Inference, &["POST"], "/rerank"), // pooling model whose scoring API is enabled
    EngineRoute::new(RouteClass::Control, &["POST"], "/reset_encoder_cache"), // env VLLM_SERVER_DEV_MODE=1
    EngineRoute::new(RouteClass::Control, &["POST"], "/reset_mm_cache"), // env VLLM_SERVER_DEV_MODE=1
    EngineRoute::new(RouteClass::Control, &["POST"], "/reset_prefix_cache"), // env VLLM_SERVER_DEV_MODE=1
    EngineRoute::new(RouteClass::Control, &["POST"], "/resume"), // env VLLM_SERVER_DEV_MODE=1
    EngineRoute::new(RouteClass::Control, &["POST"], "/scale_elastic_ep"), // task generate
    EngineRoute::new(RouteClass::Inference, &["POST"], "/score"), // pooling model whose scoring API is enabled
    EngineRoute::new(RouteClass::Read, &["GET"], "/server_info"), // env VLLM_SERVER_DEV_MODE=1; forwarded with its credentials masked
    EngineRoute::new(
        RouteClass::Control,
        &["POST"],
        "/shutdown_weight_transfer_engine",
    ), // env VLLM_SERVER_DEV_MODE=1
    EngineRoute::new(RouteClass::Control, &["POST"], "/sleep"),   // env VLLM_SERVER_DEV_MODE=1
    EngineRoute::new(RouteClass::Control, &["POST"], "/start_draft_weight_update"), // env VLLM_SERVER_DEV_MODE=1
    EngineRoute::new(RouteClass::Control, &["POST"], "/start_profile"), // --profiler-config with profiler set
    EngineRoute::new(RouteClass::Control, &["POST"], "/start_weight_update"), // env VLLM_SERVER_DEV_MODE=1
    EngineRoute::mount(RouteClass::Read, "/static"), // --enable-offline-docs
    EngineRoute::new(RouteClass::Control, &["POST"], "/stop_profile"), // --profiler-config with profiler set
    EngineRoute::new(RouteClass::Inference, &["POST"], "/tokenize"),
    EngineRoute::new(RouteClass::Read, &["GET"], "/tokenizer_info"), // --enable-tokenizer-info-endpoint
    EngineRoute::new(RouteClass::Control, &["POST"], "/update_weight_version"), // env VLLM_SERVER_DEV_MODE=1
    EngineRoute::new(RouteClass::Control, &["POST"], "/update_weights"), // env VLLM_SERVER_DEV_MODE=1
    EngineRoute::new(RouteClass::Inference, &["POST"], "/v1/audio/transcriptions"), // task transcription
    EngineRoute::new(RouteClass::Inference, &["POST"], "/v1/audio/translations"), // task transcription
    EngineRoute::new(RouteClass::Inference, &["POST"], "/v1/chat/completions"),   // task generate
    EngineRoute::new(
        RouteClass::Inference,
        &["POST"],
        "/v1/chat/completions/batch",
    ), // task generate
    EngineRoute::new(
        RouteClass::Inference,
        &["POST"],
        "/v1/chat/completions/derender",
    ), // task generate|render
    EngineRoute::new(
        RouteClass::Inference,
        &["POST"],
        "/v1/chat/completions/render",
    ), // task generate|render
    EngineRoute::new(RouteClass::Inference, &["POST"], "/v1/completions"),        // task generate
    EngineRoute::new(RouteClass::Inference, &["POST"], "/v1/completions/derender"), // task generate|render
    EngineRoute::new(RouteClass::Inference, &["POST"], "/v1/completions/render"), // task generate|render
    EngineRoute::new(RouteClass::Inference, &["POST"], "/v1/embeddings"), // pooling model with task embed
    EngineRoute::new(RouteClass::Control, &["POST"], "/v1/load_lora_adapter"), // env VLLM_ALLOW_RUNTIME_LORA_UPDATING=1|true
    EngineRoute::new(RouteClass::Inference, &["POST"], "/v1/messages"),        // task generate
    EngineRoute::new(
        RouteClass::Inference,
        &["POST"],
        "/v1/messages/count_tokens",
    ), // task generate
    EngineRoute::new(RouteClass::Inference, &["POST"], "/v1/messages/render"), // task generate|render
    EngineRoute::new(RouteClass::Read, &["GET"], "/v1/models"),
    EngineRoute::new(RouteClass::Inference, &["GET"], "/v1/realtime"), // task realtime
    EngineRoute::new(RouteClass::Inference, &["POST"], "/v1/rerank"), // pooling model whose scoring API is enabled
    EngineRoute::new(RouteClass::Inference, &["POST"], "/v1/responses"), // task generate
    EngineRoute::new(RouteClass::Inference, &["POST"], "/v1/responses/render"), // task generate|render
    EngineRoute::new(
        RouteClass::Inference,
        &["GET"],
        "/v1/responses/{response_id}",
    ), // task generate
    EngineRoute::new(
        RouteClass::Inference,
        &["POST"],
        "/v1/responses/{response_id}/cancel",
    ), // task generate
    EngineRoute::new(RouteClass::Inference, &["POST"], "/v1/score"), // pooling model whose scoring API is enabled
    EngineRoute::new(RouteClass::Inference, &["POST"], "/v1/systemone"),
    EngineRoute::new(RouteClass::Control, &["POST"], "/v1/unload_lora_adapter"), // env VLLM_ALLOW_RUNTIME_LORA_UPDATING=1|true
    EngineRoute::new(RouteClass::Inference, &["POST"], "/v2/embed"), // pooling model with task embed
    EngineRoute::new(RouteClass::Inference, &["POST"], "/v2/rerank"), // pooling model whose scoring API is enabled
    EngineRoute::new(RouteClass::Read, &["GET"], "/version"),
    EngineRoute::new(RouteClass::Control, &["POST"], "/wake_up"), // env VLLM_SERVER_DEV_MODE=1
    EngineRoute::new(RouteClass::Control, &["POST"], "/weight_checker"), // env VLLM_SERVER_DEV_MODE=1
    EngineRoute::new(RouteClass::Control, &["GET"], "/weight_info"), // env VLLM_SERVER_DEV_MODE=1
];

/// Fault tolerance before 0.34 (`--enable-fault-tolerance`), which 0.34 moved under `/v1`.
const FAULT_TOLERANCE_0_32: &[EngineRoute] = &[
    EngineRoute::new(RouteClass::Control, &["POST"], "/fault_tolerance/apply"),
    EngineRoute::new(RouteClass::Control, &["GET"], "/fault_tolerance/status"),
];

/// Added in 0.33: structured decisions for a client's prompt (`openai/decisions/api_router.py`).
const DECISIONS_0_33: &[EngineRoute] = &[EngineRoute::new(
    RouteClass::Inference,
    &["POST"],
    "/v1/decisions",
)];

/// Added in 0.34 with `--enable-sleep-mode` (`serve/checkpoint/api_router.py`): draining every
/// client's requests and releasing the weights for a checkpoint, and the state orchestrators
/// poll (control by doubt, as the other sleep routes' reads are).
const CHECKPOINT_0_34: &[EngineRoute] = &[
    EngineRoute::new(RouteClass::Control, &["POST"], "/checkpoint/prepare"),
    EngineRoute::new(RouteClass::Control, &["POST"], "/checkpoint/restore"),
    EngineRoute::new(RouteClass::Control, &["GET"], "/checkpoint/status"),
];

/// Fault tolerance from 0.34 (`serve/fault_tolerance/api_router.py`).
const FAULT_TOLERANCE_0_34: &[EngineRoute] = &[
    EngineRoute::new(RouteClass::Control, &["POST"], "/v1/fault_tolerance/apply"),
    EngineRoute::new(RouteClass::Control, &["GET"], "/v1/fault_tolerance/status"),
];

/// Every path the Rust frontend of vLLM 0.34 routes (the path strings of `vllm/vllm-rs`'s
/// router, `tests/fixtures/engines/routes/vllm-rust-0.34.tsv`), each with the methods and class
/// of the Python frontend's route of the same path: the binary does not say its methods. The
/// Python routes it has no path for (pooling, audio, SageMaker, the LoRA aliases, the docs) are
/// unknown behind it.
const RUST_0_34: &[EngineRoute] = &[
    EngineRoute::new(RouteClass::Control, &["POST"], "/abort_requests"),
    EngineRoute::new(RouteClass::Control, &["POST"], "/checkpoint/prepare"),
    EngineRoute::new(RouteClass::Control, &["POST"], "/checkpoint/restore"),
    EngineRoute::new(RouteClass::Control, &["GET"], "/checkpoint/status"),
    EngineRoute::new(RouteClass::Inference, &["POST"], "/cohere/v2/chat"),
    EngineRoute::new(RouteClass::Inference, &["POST"], "/cohere/v2/chat/render"),
    EngineRoute::new(RouteClass::Control, &["POST"], "/collective_rpc"),
    EngineRoute::new(RouteClass::Inference, &["POST"], "/detokenize"),
    EngineRoute::new(RouteClass::Control, &["POST"], "/finish_weight_update"),
    EngineRoute::new(RouteClass::Inference, &["POST"], "/generative_scoring"),
    EngineRoute::new(RouteClass::Control, &["GET"], "/get_world_size"),
    EngineRoute::new(RouteClass::Read, &["GET"], "/health"),
    EngineRoute::new(
        RouteClass::Control,
        &["POST"],
        "/inference/v1/abort_requests",
    ),
    EngineRoute::new(RouteClass::Inference, &["POST"], "/inference/v1/generate"),
    EngineRoute::new(
        RouteClass::Control,
        &["POST"],
        "/init_weight_transfer_engine",
    ),
    EngineRoute::new(RouteClass::Control, &["GET"], "/is_paused"),
    EngineRoute::new(RouteClass::Control, &["POST"], "/is_scaling_elastic_ep"),
    EngineRoute::new(RouteClass::Control, &["GET"], "/is_sleeping"),
    EngineRoute::new(RouteClass::Control, &["GET"], "/kv_event_sources"),
    EngineRoute::new(RouteClass::Read, &["GET"], "/load"),
    EngineRoute::new(RouteClass::Read, &["GET"], "/metrics"),
    EngineRoute::new(RouteClass::Control, &["POST"], "/pause"),
    EngineRoute::new(RouteClass::Control, &["POST"], "/release_kv_cache_memory"),
    EngineRoute::new(RouteClass::Control, &["POST"], "/reset_encoder_cache"),
    EngineRoute::new(RouteClass::Control, &["POST"], "/reset_mm_cache"),
    EngineRoute::new(RouteClass::Control, &["POST"], "/reset_prefix_cache"),
    EngineRoute::new(RouteClass::Control, &["POST"], "/resume"),
    EngineRoute::new(RouteClass::Control, &["POST"], "/scale_elastic_ep"),
    EngineRoute::new(RouteClass::Read, &["GET"], "/server_info"), // forwarded with its credentials masked
    EngineRoute::new(RouteClass::Control, &["POST"], "/sleep"),
    EngineRoute::new(RouteClass::Control, &["POST"], "/start_draft_weight_update"),
    EngineRoute::new(RouteClass::Control, &["POST"], "/start_profile"),
    EngineRoute::new(RouteClass::Control, &["POST"], "/start_weight_update"),
    EngineRoute::new(RouteClass::Control, &["POST"], "/stop_profile"),
    EngineRoute::new(RouteClass::Inference, &["POST"], "/tokenize"),
    EngineRoute::new(RouteClass::Read, &["GET"], "/tokenizer_info"),
    EngineRoute::new(RouteClass::Control, &["POST"], "/update_weight_version"),
    EngineRoute::new(RouteClass::Control, &["POST"], "/update_weights"),
    EngineRoute::new(RouteClass::Inference, &["POST"], "/v1/chat/completions"),
    EngineRoute::new(
        RouteClass::Inference,
        &["POST"],
        "/v1/chat/completions/batch",
    ),
    EngineRoute::new(
        RouteClass::Inference,
        &["POST"],
        "/v1/chat/completions/derender",
    ),
    EngineRoute::new(
        RouteClass::Inference,
        &["POST"],
        "/v1/chat/completions/render",
    ),
    EngineRoute::new(RouteClass::Inference, &["POST"], "/v1/completions"),
    EngineRoute::new(RouteClass::Inference, &["POST"], "/v1/completions/derender"),
    EngineRoute::new(RouteClass::Inference, &["POST"], "/v1/completions/render"),
    EngineRoute::new(RouteClass::Inference, &["POST"], "/v1/decisions"),
    EngineRoute::new(RouteClass::Control, &["POST"], "/v1/load_lora_adapter"),
    EngineRoute::new(RouteClass::Inference, &["POST"], "/v1/messages"),
    EngineRoute::new(
        RouteClass::Inference,
        &["POST"],
        "/v1/messages/count_tokens",
    ),
    EngineRoute::new(RouteClass::Inference, &["POST"], "/v1/messages/render"),
    EngineRoute::new(RouteClass::Read, &["GET"], "/v1/models"),
    EngineRoute::new(RouteClass::Inference, &["POST"], "/v1/responses"),
    EngineRoute::new(RouteClass::Inference, &["POST"], "/v1/responses/render"),
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
    EngineRoute::new(RouteClass::Inference, &["POST"], "/v1/systemone"),
    EngineRoute::new(RouteClass::Control, &["POST"], "/v1/unload_lora_adapter"),
    EngineRoute::new(RouteClass::Read, &["GET"], "/version"),
    EngineRoute::new(RouteClass::Control, &["POST"], "/weight_checker"),
    EngineRoute::new(RouteClass::Control, &["GET"], "/weight_info"),
];
