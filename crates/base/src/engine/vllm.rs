//! vLLM (`vllm serve`): what tokentap knows of it.

use super::spec::{ControlRoute, EngineSpec};

pub(super) static SPEC: EngineSpec = EngineSpec {
    name: "vllm",
    control_routes: CONTROL_ROUTES,
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
