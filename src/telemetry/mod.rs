//! Logs, Prometheus metrics and OpenTelemetry export.
pub mod logging;
pub mod names;
pub mod otel;
pub mod prometheus;
