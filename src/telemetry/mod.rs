//! Logs, Prometheus metrics (with the drift gauges, `drift`, the capacity gauges, `capacity`,
//! and the latest sweep's gauges, `sweep`), the error-budget alerts written for Prometheus
//! (`budget`, `tokentap rules`) and OpenTelemetry export.
pub mod budget;
pub mod capacity;
pub mod drift;
pub mod logging;
pub mod names;
pub mod otel;
pub mod otel_event;
pub mod prometheus;
pub mod sweep;
