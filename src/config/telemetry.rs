//! `[telemetry]`: the OpenTelemetry export (its GenAI names, the opt-in per-request log event and
//! that event's salt) and the series budget of `/metrics`.

use std::time::Duration;

use http::Uri;

use super::error::{ConfigError, Origins};
use super::raw::RawTelemetry;

#[derive(Clone, PartialEq)]
pub struct TelemetryConfig {
    pub otlp_endpoint: Option<Uri>,
    pub service_name: String,
    /// How often OTLP metrics are pushed.
    pub metric_interval: Duration,
    /// Most series tokentap's own sink puts on `/metrics` (docs/operations.md, "Metrics").
    pub max_series: usize,
    /// Also push the GenAI metric names the current conventions replaced
    /// (`gen_ai.client.token.usage`, `gen_ai.client.operation.duration`), for one release, so
    /// dashboards built on them keep working while they move (docs/metrics.md, "OpenTelemetry").
    pub otlp_legacy_genai_names: bool,
    /// Push one `gen_ai.client.inference.operation.details` log event per metered request.
    pub otlp_request_events: bool,
    /// Secret the event's hashed identities (tenant) are keyed with; `None`: a random one per
    /// process, so hashes compare within one process only.
    pub otlp_event_salt: Option<String>,
    /// `gen_ai.provider.name` on every span, metric point and event (the conventions require
    /// one; the record does not say which engine answered, so the operator names it).
    pub otlp_provider_name: String,
}

impl std::fmt::Debug for TelemetryConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The salt is a secret: never logged.
        f.debug_struct("TelemetryConfig")
            .field("otlp_endpoint", &self.otlp_endpoint)
            .field("service_name", &self.service_name)
            .field("metric_interval", &self.metric_interval)
            .field("max_series", &self.max_series)
            .field("otlp_legacy_genai_names", &self.otlp_legacy_genai_names)
            .field("otlp_request_events", &self.otlp_request_events)
            .field(
                "otlp_event_salt",
                &self.otlp_event_salt.as_ref().map(|_| "<set>"),
            )
            .field("otlp_provider_name", &self.otlp_provider_name)
            .finish()
    }
}

impl TelemetryConfig {
    pub(super) fn from_raw(raw: RawTelemetry, origins: &Origins) -> Result<Self, ConfigError> {
        let telemetry = TelemetryConfig {
            otlp_endpoint: raw.otlp_endpoint,
            service_name: raw.service_name,
            metric_interval: raw.metric_interval,
            max_series: origins.nonzero("telemetry.max_series", raw.max_series)?,
            otlp_legacy_genai_names: raw.otlp_legacy_genai_names,
            otlp_request_events: raw.otlp_request_events,
            otlp_event_salt: Some(raw.otlp_event_salt).filter(|s| !s.is_empty()),
            otlp_provider_name: raw.otlp_provider_name,
        };
        if telemetry.otlp_provider_name.is_empty() {
            return Err(origins.error(
                "telemetry.otlp_provider_name",
                "must not be empty: the GenAI conventions require gen_ai.provider.name (e.g. \"vllm\", \"sglang\")",
            ));
        }
        origins.positive("telemetry.metric_interval", telemetry.metric_interval)?;
        if telemetry.otlp_request_events && telemetry.otlp_endpoint.is_none() {
            // Asked for events with nowhere to send them: say so rather than drop them unseen.
            return Err(origins.error(
                "telemetry.otlp_request_events",
                "needs telemetry.otlp_endpoint: the events are sent over OTLP/HTTP to <endpoint>/v1/logs",
            ));
        }
        Ok(telemetry)
    }
}

#[cfg(test)]
mod tests {
    use crate::config::ConfigLoader;

    fn load(text: &str) -> Result<super::TelemetryConfig, String> {
        ConfigLoader::new()
            .text(&format!("[telemetry]\n{text}\n"), "x.toml")
            .and_then(ConfigLoader::load)
            .map(|config| config.telemetry)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn request_events_are_off_by_default_and_need_an_endpoint() {
        let defaults = load("").unwrap();
        assert!(!defaults.otlp_request_events);
        assert!(!defaults.otlp_legacy_genai_names);
        assert_eq!(defaults.otlp_event_salt, None);
        let error = load("otlp_request_events = true").unwrap_err();
        assert!(
            error.contains("telemetry.otlp_request_events") && error.contains("otlp_endpoint"),
            "{error}"
        );
        let on = load(
            "otlp_endpoint = \"http://127.0.0.1:4318\"\notlp_request_events = true\notlp_event_salt = \"s3cret\"",
        )
        .unwrap();
        assert!(on.otlp_request_events);
        assert_eq!(on.otlp_event_salt.as_deref(), Some("s3cret"));
        assert!(
            !format!("{on:?}").contains("s3cret"),
            "the salt is never shown"
        );
    }
}
