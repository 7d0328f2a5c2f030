//! Configuration: one TOML file, overridden by `TOKENTAP_<SECTION>__<KEY>` environment
//! variables, overridden by command-line flags.
//!
//! Two phases (tensorzero's `UninitializedConfig::load()`): the layers are merged into one TOML
//! table and deserialised into `raw` structs that deny unknown keys, with durations, addresses,
//! URLs and enums typed as they are read (`value.rs`), so a bad value fails naming its key path
//! (`serde_path_to_error`); then each section's `from_raw`, beside its type (`proxy.rs`,
//! `upstream.rs`, `admin.rs`, `metering.rs` with `[slo]`, `telemetry.rs`, `store.rs`, `sweep.rs`,
//! `drift.rs` with `[evidence]`, `capacity.rs`, `workload.rs`, `sessions.rs`, `fingerprint.rs`, `tenants.rs`), checks ranges
//! and the rules between its keys. Every error names the key, where it came from, and what was
//! wrong. `error.rs` is the error and the origins of values, `loader.rs` the loader and `Config`;
//! file order: `error` ← `value` ← `raw` ← each section ← `loader`. This file only declares
//! and re-exports.

mod admin;
mod capacity;
mod drift;
mod error;
mod fingerprint;
mod loader;
mod metering;
mod proxy;
mod raw;
mod sessions;
mod store;
mod sweep;
mod telemetry;
mod tenants;
mod upstream;
mod value;
mod workload;

pub use admin::AdminConfig;
pub use capacity::CapacityConfig;
pub use drift::DriftConfig;
pub use error::ConfigError;
pub use fingerprint::FingerprintConfig;
pub use loader::{Config, ConfigLoader};
pub use metering::{
    MeteringConfig, SloObjectives, DEFAULT_OBJECTIVE, MAX_OBJECTIVE, MIN_OBJECTIVE,
};
pub use proxy::{ListenerTls, ProxyConfig, RoutePolicyConfig};
pub use raw::RawConfig;
pub use sessions::{SessionKey, SessionsConfig, BODY_KEYS};
pub use store::StoreConfig;
pub use sweep::SweepConfig;
pub use telemetry::TelemetryConfig;
pub use tenants::{TenantsConfig, MAX_TENANTS, MAX_TENANT_NAME, OTHER_TENANT};
pub use upstream::UpstreamConfig;
pub use value::{CodeFields, ServerTiming, UsageUnasked};
pub use workload::WorkloadConfig;
