//! `[metering]` and `[slo]`: what is read of each request, the bucket ladders, the bounds on
//! buffered bytes and model labels, whether a request's timing is handed back to its client
//! (`Server-Timing`), the SLO targets per model and the objectives the error budgets of
//! `tokentap rules` are cut from.

use std::collections::BTreeMap;

use super::error::{ConfigError, Origins};
use super::raw::{RawMetering, RawSlo, RawSloTargets};
use super::value::ServerTiming;
use crate::base::duration::no_unit;
use crate::meter::buckets::Ladder;
use crate::meter::slo::{parse_target, SloPolicy, SloTargets, TtftOf};

#[derive(Debug, Clone, PartialEq)]
pub struct MeteringConfig {
    pub inject_usage: bool,
    pub max_parse_bytes: usize,
    /// Most bytes of metered request bodies held at once while they are being read, over all
    /// requests; past it bodies are forwarded as they stream, unmetered.
    pub max_buffered_bytes: usize,
    /// Most bytes of non-streamed answers held at once (for metering and for the timing
    /// header), over all requests; past it answers pass through unheld (`stream::held`).
    pub max_held_bytes: usize,
    pub max_event_bytes: usize,
    pub contexts: Ladder,
    pub concurrency: Ladder,
    /// Distinct model labels kept before further models are labelled `other`.
    pub max_models: usize,
    /// SLO targets per model (`[slo]`); none by default.
    pub slo: SloPolicy,
    /// `[slo] objective` and each model's own (`tokentap rules`).
    pub objectives: SloObjectives,
    /// When a request's own timing is handed back to its client (`Server-Timing`).
    pub server_timing: ServerTiming,
    /// The request header whose presence asks for it, with `server_timing = "on_request"`.
    pub server_timing_header: http::HeaderName,
}

/// The objective when `[slo] objective` is not set: 99 % of requests succeed and meet their
/// targets, an error budget of 1 %.
pub const DEFAULT_OBJECTIVE: f64 = 0.99;

/// The lowest objective accepted: a larger budget than 5 % would need most requests to fail
/// before the fast-burn alert (14.4 × the budget) fired.
pub const MIN_OBJECTIVE: f64 = 0.95;

/// The highest objective accepted: a budget under 0.001 % is below what an hour of request
/// counters resolves.
pub const MAX_OBJECTIVE: f64 = 0.99999;

/// The objectives of the error budgets (`[slo] objective`, `[slo.models."<model>"] objective`):
/// the share of a model's production requests that must succeed (availability) and meet their
/// targets (SLO attainment) over the SLO's period; the error budget is 1 − the objective.
#[derive(Debug, Clone, PartialEq)]
pub struct SloObjectives {
    /// Every model's, unless its own table sets one.
    pub default: f64,
    /// The models whose table sets its own.
    pub models: BTreeMap<String, f64>,
}

impl Default for SloObjectives {
    fn default() -> Self {
        Self {
            default: DEFAULT_OBJECTIVE,
            models: BTreeMap::new(),
        }
    }
}

impl SloObjectives {
    /// The objective of `model`: its table's, else the default.
    pub fn of(&self, model: &str) -> f64 {
        self.models.get(model).copied().unwrap_or(self.default)
    }
}

impl MeteringConfig {
    pub(super) fn from_raw(
        raw: RawMetering,
        slo: &RawSlo,
        origins: &Origins,
    ) -> Result<Self, ConfigError> {
        let contexts = Ladder::contexts(&raw.context_buckets)
            .map_err(|m| origins.error("metering.context_buckets", m))?;
        let concurrency = Ladder::concurrency(&raw.concurrency_buckets)
            .map_err(|m| origins.error("metering.concurrency_buckets", m))?;
        Ok(MeteringConfig {
            inject_usage: raw.inject_usage,
            max_parse_bytes: origins.nonzero("metering.max_parse_bytes", raw.max_parse_bytes)?,
            max_buffered_bytes: origins
                .nonzero("metering.max_buffered_bytes", raw.max_buffered_bytes)?,
            max_held_bytes: origins.nonzero("metering.max_held_bytes", raw.max_held_bytes)?,
            max_event_bytes: origins.nonzero("metering.max_event_bytes", raw.max_event_bytes)?,
            contexts,
            concurrency,
            max_models: origins.nonzero("metering.max_models", raw.max_models)?,
            slo: slo_policy(slo, origins)?,
            objectives: slo_objectives(slo, origins)?,
            server_timing: raw.server_timing,
            server_timing_header: http::HeaderName::from_bytes(
                raw.server_timing_header.trim().as_bytes(),
            )
            .map_err(|_| {
                origins.error(
                    "metering.server_timing_header",
                    format!(
                        "`{}` is not an HTTP header name",
                        raw.server_timing_header.trim()
                    ),
                )
            })?,
        })
    }
}

/// Why `text` is not an SLO target: a bare number (`500`, however it was written) has no
/// unit, in the words every duration of the configuration uses; anything else is not a
/// positive duration.
fn target_error(text: &str) -> String {
    let forms = "500ms, 2s or 1m";
    let bare = text.parse::<f64>().is_ok_and(|n| n.is_finite() && n > 0.0);
    if bare {
        no_unit(text, forms)
    } else {
        format!("`{text}` is not a positive duration like {forms}")
    }
}

/// Validates `[slo]`: each target a positive duration (`500ms`, `2s`, `1m`). Checked here, not
/// while deserialising, because the error names a model's table as `slo.models."<model>"`.
fn slo_policy(raw: &RawSlo, origins: &Origins) -> Result<SloPolicy, ConfigError> {
    let targets = |prefix: &str, t: &RawSloTargets| -> Result<SloTargets, ConfigError> {
        let one = |name: &str, text: &Option<String>| {
            text.as_deref()
                .map(|text| {
                    parse_target(text.trim()).ok_or_else(|| {
                        origins.error(&format!("{prefix}{name}"), target_error(text.trim()))
                    })
                })
                .transpose()
        };
        Ok(SloTargets {
            ttft: one("ttft", &t.ttft)?,
            tbt: one("tbt", &t.tbt)?,
            e2e: one("e2e", &t.e2e)?,
        })
    };
    let default = targets(
        "slo.",
        &RawSloTargets {
            ttft: raw.ttft.clone(),
            tbt: raw.tbt.clone(),
            e2e: raw.e2e.clone(),
            objective: None,
        },
    )?;
    let mut models = BTreeMap::new();
    for (model, table) in &raw.models {
        models.insert(
            model.clone(),
            targets(&format!("slo.models.\"{model}\"."), table)?,
        );
    }
    let ttft_of = match raw.ttft_of.as_deref().map(str::trim) {
        None => TtftOf::Any,
        Some(text) => TtftOf::parse(text).ok_or_else(|| {
            origins.error(
                "slo.ttft_of",
                format!("`{text}` is neither \"any\" (the first token of any kind) nor \"answer\" (the first answer token or tool call)"),
            )
        })?,
    };
    Ok(SloPolicy {
        default,
        models,
        ttft_of,
    })
}

/// Validates the objectives: each within [`MIN_OBJECTIVE`], [`MAX_OBJECTIVE`].
fn slo_objectives(raw: &RawSlo, origins: &Origins) -> Result<SloObjectives, ConfigError> {
    let check = |key: &str, objective: f64| {
        if (MIN_OBJECTIVE..=MAX_OBJECTIVE).contains(&objective) {
            Ok(objective)
        } else {
            Err(origins.error(
                key,
                format!(
                    "must lie between {MIN_OBJECTIVE} and {MAX_OBJECTIVE} (the share of requests that succeed and meet their targets; the error budget is 1 - it, and the fast-burn alert needs 14.4 x the budget to be a possible error ratio), found {objective}"
                ),
            ))
        }
    };
    let default = check("slo.objective", raw.objective.unwrap_or(DEFAULT_OBJECTIVE))?;
    let mut models = BTreeMap::new();
    for (model, table) in &raw.models {
        if let Some(objective) = table.objective {
            models.insert(
                model.clone(),
                check(&format!("slo.models.\"{model}\".objective"), objective)?,
            );
        }
    }
    Ok(SloObjectives { default, models })
}
