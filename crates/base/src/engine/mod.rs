//! Everything tokentap knows of each inference engine, one file per engine (`sglang`,
//! `vllm`, `llamacpp`, and `openai` for any other OpenAI-compatible server): how it is
//! recognised, where it describes itself, its metric names and how its ranks fold, its KV
//! budget, its usage reports, its aborts, its tokenizer, every route its server registers
//! (classified) and the request fields it runs as code. Adding an engine
//! is one file here, one constant in `registry.rs`' list of engines, and its captures in
//! `tests/fixtures/engines/`; nothing outside this folder names an engine. This file only
//! declares and re-exports; the shared types are in `spec.rs`, which each engine's file
//! imports, and the list of engines and the lookups over it in `registry.rs`, which imports
//! them all.

mod llamacpp;
mod openai;
mod registry;
mod sglang;
mod spec;
mod vllm;

pub use registry::{
    by_name, classify_route, classify_route_served, code_fields, detect, load_metric_names,
    model_info_routes, register, server_info_routes, sessions, version_routes,
};
pub use spec::template_matches;
pub use spec::{
    Abort, CodeField, Detection, Engine, EngineRoute, EngineSpec, Evidence, FingerprintKeys,
    Frontend, KvBudget, Metrics, PriorityScheduling, RouteClass, RouteTable, RouteVerdict,
    SelfDescription, ServedRoutes, Sessions, TableFit, Tokenize, UsageReport,
};
