//! Any other OpenAI-compatible server: what tokentap assumes of a server it cannot name.

use super::spec::{
    Detection, EngineRoute, EngineSpec, FingerprintKeys, Frontend, KvBudget, Metrics, RouteClass,
    RouteTable, SelfDescription, Tokenize, UsageReport,
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
    routes: &[RouteTable {
        version: "",
        frontend: Frontend::MAIN,
        parts: &[ROUTES],
    }],
    code_fields: &[],
    priority: None,
    sessions: None,
};

/// The OpenAI API's own routes that an OpenAI-compatible server may serve (the inference ones,
/// a client's own files and batches, the model list), and the health and metrics pages most
/// such servers add.
const ROUTES: &[EngineRoute] = &[
    EngineRoute::new(RouteClass::Inference, &["POST"], "/v1/chat/completions"),
    EngineRoute::new(RouteClass::Inference, &["POST"], "/v1/completions"),
    EngineRoute::new(RouteClass::Inference, &["POST"], "/v1/embeddings"),
    EngineRoute::new(RouteClass::Inference, &["POST"], "/v1/responses"),
    EngineRoute::new(
        RouteClass::Inference,
        &["GET", "DELETE"],
        "/v1/responses/{id}",
    ),
    EngineRoute::new(
        RouteClass::Inference,
        &["POST"],
        "/v1/responses/{id}/cancel",
    ),
    EngineRoute::new(
        RouteClass::Inference,
        &["GET"],
        "/v1/responses/{id}/input_items",
    ),
    EngineRoute::new(RouteClass::Inference, &["POST"], "/v1/audio/transcriptions"),
    EngineRoute::new(RouteClass::Inference, &["POST"], "/v1/audio/translations"),
    EngineRoute::new(RouteClass::Inference, &["POST"], "/v1/audio/speech"),
    EngineRoute::new(RouteClass::Inference, &["POST"], "/v1/moderations"),
    EngineRoute::new(RouteClass::Inference, &["POST"], "/v1/images/generations"),
    EngineRoute::new(RouteClass::Inference, &["POST"], "/v1/messages"),
    // A client's own files and batches (the Batch API).
    EngineRoute::new(RouteClass::Inference, &["GET", "POST"], "/v1/files"),
    EngineRoute::new(RouteClass::Inference, &["GET", "DELETE"], "/v1/files/{id}"),
    EngineRoute::new(RouteClass::Inference, &["GET"], "/v1/files/{id}/content"),
    EngineRoute::new(RouteClass::Inference, &["GET", "POST"], "/v1/batches"),
    EngineRoute::new(RouteClass::Inference, &["GET"], "/v1/batches/{id}"),
    EngineRoute::new(RouteClass::Inference, &["POST"], "/v1/batches/{id}/cancel"),
    EngineRoute::new(RouteClass::Read, &["GET"], "/v1/models"),
    EngineRoute::new(RouteClass::Read, &["GET"], "/v1/models/{model:path}"),
    EngineRoute::new(RouteClass::Read, &["GET"], "/health"),
    EngineRoute::new(RouteClass::Read, &["GET"], "/metrics"),
];
