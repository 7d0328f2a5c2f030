//! llama.cpp's server (`llama-server`): what tokentap knows of it.

use super::spec::{ControlRoute, EngineSpec, Methods};

pub(super) static SPEC: EngineSpec = EngineSpec {
    name: "llamacpp",
    control_routes: CONTROL_ROUTES,
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
