//! `[sweep]`: the synthetic sweep's guard, cell length, output bound and KV budget.

use std::time::Duration;

use super::error::{ConfigError, Origins};
use super::raw::RawSweep;

#[derive(Debug, Clone, PartialEq)]
pub struct SweepConfig {
    /// Pause a running sweep while more production requests than this are in flight.
    pub production_guard: u64,
    pub cell_duration: Duration,
    pub max_output: u64,
    /// KV budget in tokens when the server does not report one (0: ask the server).
    pub kv_budget_tokens: u64,
    /// The default plan (no contexts, context cap or concurrency asked for) is cut to be
    /// expected to end within this (zero: never cut); a longer sweep needs an explicit plan.
    pub max_default_duration: Duration,
}

impl SweepConfig {
    pub(super) fn from_raw(raw: RawSweep, origins: &Origins) -> Result<Self, ConfigError> {
        origins.positive("sweep.cell_duration", raw.cell_duration)?;
        if raw.max_output == 0 {
            return Err(origins.error("sweep.max_output", "must be greater than zero"));
        }
        Ok(SweepConfig {
            production_guard: raw.production_guard,
            cell_duration: raw.cell_duration,
            max_output: raw.max_output,
            kv_budget_tokens: raw.kv_budget_tokens,
            max_default_duration: raw.max_default_duration,
        })
    }
}
