//! tokentap: a metering reverse proxy for LLM inference servers (sglang, vLLM, any
//! OpenAI-compatible server). See ARCHITECTURE.md for the map of the crate.

pub mod admin;
pub mod aggregate;
pub mod app;
pub mod config;
pub mod fleet;
pub mod meter;
pub mod net;
pub mod proxy;
pub mod store;
pub mod stream;
pub mod sweep;
pub mod synthetic;
pub mod telemetry;
pub mod upstream_identity;
pub mod upstream_metrics;
pub mod workload;

// The lower crates of the workspace, under the names the rest of the crate uses
// (`crate::base::…`, `tokentap::sim::…`). They cannot import the proxy: the compiler keeps that.
pub use tokentap_base as base;
pub use tokentap_matrix as matrix;
pub use tokentap_sim as sim;
