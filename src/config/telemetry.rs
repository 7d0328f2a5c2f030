//! `[telemetry]`: the OpenTelemetry export and the series budget of `/metrics`.

use std::time::Duration;

use http::Uri;

use super::error::{ConfigError, Origins};
use super::raw::RawTelemetry;

#[derive(Debug, Clone, PartialEq)]
pub struct TelemetryConfig {
    pub otlp_endpoint: Option<Uri>,
    pub service_name: String,
    /// How often OTLP metrics are pushed.
    pub metric_interval: Duration,
    /// Most series tokentap's own sink puts on `/metrics` (docs/operations.md, "Metrics").
    pub max_series: usize,
}

impl TelemetryConfig {
    pub(super) fn from_raw(raw: RawTelemetry, origins: &Origins) -> Result<Self, ConfigError> {
        let telemetry = TelemetryConfig {
            otlp_endpoint: raw.otlp_endpoint,
            service_name: raw.service_name,
            metric_interval: raw.metric_interval,
            max_series: origins.nonzero("telemetry.max_series", raw.max_series)?,
        };
        origins.positive("telemetry.metric_interval", telemetry.metric_interval)?;
        Ok(telemetry)
    }
}
