//! Logs, Prometheus metrics (with the drift gauges, `drift`) and OpenTelemetry export.
pub mod capacity;
pub mod drift;
pub mod logging;
pub mod names;
pub mod otel;
pub mod prometheus;
