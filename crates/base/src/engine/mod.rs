//! Everything tokentap knows of each inference engine, one file per engine (`sglang`,
//! `vllm`, `llamacpp`, and `openai` for any other OpenAI-compatible server): how it is
//! recognised, where it describes itself, its metric names and how its ranks fold, its KV
//! budget, its usage reports, its aborts, its tokenizer and its control routes. Adding an engine
//! is one file here, one constant in `spec.rs`' [`Engine`], and its captures in
//! `tests/fixtures/engines/`; nothing outside this folder names an engine. This file only
//! declares and re-exports; the shared types are in `spec.rs`.

mod llamacpp;
mod openai;
mod sglang;
mod spec;
mod vllm;

pub use spec::{
    by_name, control_route, detect, load_metric_names, register, server_info_routes, Abort,
    ControlRoute, Detection, Engine, EngineSpec, Evidence, FingerprintKeys, KvBudget, Methods,
    Metrics, PriorityScheduling, SelfDescription, Tokenize, UsageReport,
};
