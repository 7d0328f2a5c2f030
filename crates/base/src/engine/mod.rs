//! Everything tokentap knows of each inference engine, one file per engine (`sglang`,
//! `vllm`, `llamacpp`, and `openai` for any other OpenAI-compatible server), so that adding an
//! engine is one file and one variant of [`Engine`]. This file only declares and re-exports;
//! the shared types are in `spec.rs`.

mod llamacpp;
mod openai;
mod sglang;
mod spec;
mod vllm;

pub use spec::{control_route, ControlRoute, Engine, EngineSpec, Methods};
