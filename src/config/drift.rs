//! `[evidence]` and `[drift]`: what a production cell must rest on before its figures are
//! trusted, and how production is compared with pinned reference matrices.

use std::time::Duration;

use super::error::{ConfigError, Origins};
use super::raw::{RawDrift, RawEvidence};
use crate::matrix::evidence::EvidenceRule;

/// `[drift]`: production against pinned reference matrices.
#[derive(Debug, Clone, PartialEq)]
pub struct DriftConfig {
    /// What a production cell needs in the window before it gets ratios (`[evidence]`).
    pub evidence: EvidenceRule,
    /// The production window the drift gauges compare (`/matrix?compare=` takes `window=`).
    pub window: Duration,
    /// How often the drift gauges are recomputed.
    pub refresh_interval: Duration,
}

/// `[evidence]`: every value is a valid rule.
pub(super) fn evidence_rule(raw: RawEvidence) -> EvidenceRule {
    EvidenceRule {
        min_requests: raw.min_requests,
        min_measured_s: raw.min_measured_for.as_secs_f64(),
        min_output_tokens: raw.min_output_tokens,
    }
}

impl DriftConfig {
    pub(super) fn from_raw(
        raw: RawDrift,
        evidence: EvidenceRule,
        origins: &Origins,
    ) -> Result<Self, ConfigError> {
        // The production aggregator keeps minute slices for up to a day.
        if raw.window < Duration::from_secs(60) || raw.window > Duration::from_secs(24 * 3600) {
            return Err(origins.error("drift.window", "must lie between 1m and 24h"));
        }
        origins.positive("drift.refresh_interval", raw.refresh_interval)?;
        Ok(DriftConfig {
            evidence,
            window: raw.window,
            refresh_interval: raw.refresh_interval,
        })
    }
}
