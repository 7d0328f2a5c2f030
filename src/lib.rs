//! tokentap: a metering reverse proxy for LLM inference servers (sglang, vLLM, any
//! OpenAI-compatible server). See ARCHITECTURE.md for the map of the crate.

pub mod admin;
pub mod aggregate;
pub mod app;
pub mod base;
pub mod config;
pub mod fleet;
pub mod matrix;
pub mod meter;
pub mod net;
pub mod proxy;
pub mod sim;
pub mod store;
pub mod stream;
pub mod sweep;
pub mod synthetic;
pub mod telemetry;
pub mod upstream_identity;
pub mod upstream_metrics;
pub mod workload;
