//! Logs, Prometheus metrics and OpenTelemetry export.
pub mod logging;
pub mod names;
pub mod prometheus;
