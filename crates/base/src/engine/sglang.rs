//! sglang (`python -m sglang.launch_server`): what tokentap knows of it.

use super::spec::{ControlRoute, EngineSpec, Methods};

pub(super) static SPEC: EngineSpec = EngineSpec {
    name: "sglang",
    control_routes: CONTROL_ROUTES,
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
