//! llama.cpp's server (`llama-server`): what tokentap knows of it, from its sources
//! (`tools/server/server.cpp`).

use super::spec::{
    Detection, EngineRoute, EngineSpec, FingerprintKeys, Frontend, KvBudget, Metrics, RouteClass,
    RouteTable, SelfDescription, Tokenize, UsageReport,
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
    routes: &[RouteTable {
        version: "",
        frontend: Frontend::MAIN,
        parts: &[ROUTES],
    }],
    code_fields: &[],
    priority: None,
    sessions: None,
};

/// `llama-server`'s routes (`tools/server/server.cpp`). Control: a slot's KV cache saved,
/// restored or erased (`POST /slots/{id}?action=`), LoRA scales and server properties changed,
/// models loaded and unloaded in router mode, and `GET /slots`, which shows the prompts other
/// clients' requests are running. Their other `GET`s only read. (No version is pinned: the
/// conformance harness drives llama-cpp-python's server, a FastAPI app of its own.)
const ROUTES: &[EngineRoute] = &[
    EngineRoute::new(RouteClass::Read, &["GET"], "/"),
    EngineRoute::new(RouteClass::Read, &["GET"], "/health"),
    EngineRoute::new(RouteClass::Read, &["GET"], "/v1/health"),
    EngineRoute::new(RouteClass::Read, &["GET"], "/metrics"),
    EngineRoute::new(RouteClass::Read, &["GET"], "/props"),
    EngineRoute::new(RouteClass::Control, &["POST"], "/props"),
    EngineRoute::new(RouteClass::Read, &["GET"], "/models"),
    EngineRoute::new(RouteClass::Read, &["GET"], "/v1/models"),
    EngineRoute::new(RouteClass::Read, &["GET"], "/api/tags"),
    EngineRoute::new(RouteClass::Read, &["POST"], "/api/show"),
    EngineRoute::new(RouteClass::Inference, &["POST"], "/completion"),
    EngineRoute::new(RouteClass::Inference, &["POST"], "/completions"),
    EngineRoute::new(RouteClass::Inference, &["POST"], "/v1/completions"),
    EngineRoute::new(RouteClass::Inference, &["POST"], "/chat/completions"),
    EngineRoute::new(RouteClass::Inference, &["POST"], "/v1/chat/completions"),
    EngineRoute::new(RouteClass::Inference, &["POST"], "/api/chat"),
    EngineRoute::new(RouteClass::Inference, &["POST"], "/v1/messages"),
    EngineRoute::new(
        RouteClass::Inference,
        &["POST"],
        "/v1/messages/count_tokens",
    ),
    EngineRoute::new(RouteClass::Inference, &["POST"], "/infill"),
    EngineRoute::new(RouteClass::Inference, &["POST"], "/embedding"),
    EngineRoute::new(RouteClass::Inference, &["POST"], "/embeddings"),
    EngineRoute::new(RouteClass::Inference, &["POST"], "/v1/embeddings"),
    EngineRoute::new(RouteClass::Inference, &["POST"], "/rerank"),
    EngineRoute::new(RouteClass::Inference, &["POST"], "/reranking"),
    EngineRoute::new(RouteClass::Inference, &["POST"], "/v1/rerank"),
    EngineRoute::new(RouteClass::Inference, &["POST"], "/v1/reranking"),
    EngineRoute::new(RouteClass::Inference, &["POST"], "/tokenize"),
    EngineRoute::new(RouteClass::Inference, &["POST"], "/detokenize"),
    EngineRoute::new(RouteClass::Inference, &["POST"], "/apply-template"),
    EngineRoute::new(RouteClass::Read, &["GET"], "/lora-adapters"),
    EngineRoute::new(RouteClass::Control, &["POST"], "/lora-adapters"),
    EngineRoute::new(RouteClass::Control, &["GET"], "/slots"),
    EngineRoute::new(RouteClass::Control, &["POST"], "/slots/{id}"),
    EngineRoute::new(RouteClass::Control, &["POST"], "/models/load"),
    EngineRoute::new(RouteClass::Control, &["POST"], "/models/unload"),
];
