//! `[capacity]`: how live headroom is computed under the configured `[slo]` (docs/capacity.md).

use std::time::Duration;

use super::error::{ConfigError, Origins};
use super::raw::RawCapacity;
use crate::matrix::capacity::Basis;

/// `[capacity]`: how live headroom is computed (docs/capacity.md).
#[derive(Debug, Clone, PartialEq)]
pub struct CapacityConfig {
    /// The production window whose load is compared with the capacity boundary.
    pub window: Duration,
    /// What the sweep's (or reference's) cells are judged by against `[slo]`.
    pub basis: Basis,
    /// The attainment a cell needs when judged by SLO attainment.
    pub attainment: f64,
}

impl CapacityConfig {
    pub(super) fn from_raw(raw: RawCapacity, origins: &Origins) -> Result<Self, ConfigError> {
        if raw.window < Duration::from_secs(60) || raw.window > Duration::from_secs(24 * 3600) {
            return Err(origins.error("capacity.window", "must lie between 1m and 24h"));
        }
        if !(raw.attainment > 0.0 && raw.attainment <= 1.0) {
            return Err(origins.error(
                "capacity.attainment",
                format!("must lie in (0, 1], found {}", raw.attainment),
            ));
        }
        Ok(CapacityConfig {
            window: raw.window,
            basis: raw.basis,
            attainment: raw.attainment,
        })
    }
}
