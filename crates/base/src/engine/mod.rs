//! Everything tokentap knows of each inference engine, one file per engine (`sglang`,
//! `vllm`, `llamacpp`, and `openai` for any other OpenAI-compatible server): how it is
//! recognised, where it describes itself, its metric names and how its ranks fold, its KV
//! budget, its usage reports, its aborts, its tokenizer, every route its server registers
//! (classified) and the request fields it runs as code. Adding an engine
//! is one file here, one constant in `spec.rs`' [`Engine`], and its captures in
//! `tests/fixtures/engines/`; nothing outside this folder names an engine. This file only
//! declares and re-exports; the shared types are in `spec.rs`.

mod llamacpp;
mod openai;
mod sglang;
mod spec;
mod vllm;

pub use spec::{
    by_name, classify_route, code_fields, detect, load_metric_names, register, server_info_routes,
    Abort, CodeField, Detection, Engine, EngineRoute, EngineSpec, Evidence, FingerprintKeys,
    KvBudget, Metrics, PriorityScheduling, RouteClass, RouteTable, RouteVerdict, SelfDescription,
    Tokenize, UsageReport,
};
