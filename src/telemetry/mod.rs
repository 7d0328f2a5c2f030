//! Logs, Prometheus metrics and OpenTelemetry export.
pub mod logging;
