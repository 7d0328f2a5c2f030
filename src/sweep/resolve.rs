//! [`Plan::resolve`]: a [`SweepRequest`] checked against what the server says about itself
//! and the `[sweep]` configuration, into the [`Plan`] the runner executes — model, SLO and
//! capacity query, window, concurrency ladder, contexts (the default ladder: doubling from 8K
//! up to context length − max output − 1024), prefill steps, KV budget. Every error names the
//! field at fault. Pure: no I/O, no clock.

use std::time::Duration;

use super::plan::{
    Plan, PlanError, PrefillTarget, ServerFacts, DEFAULT_ATTAINMENT, DEFAULT_CONCURRENCY,
    DEFAULT_MIN_CONTEXT, MAX_CONCURRENCY, MAX_LADDER, TOP_CONTEXT_MARGIN,
};
use super::request::{DurationValue, SweepRequest, TokensValue};
use crate::base::duration::parse_duration;
use crate::config::SweepConfig;
use crate::matrix::capacity::{Basis, CapacityQuery, Targets};
use crate::matrix::units::parse_context;
use crate::meter::slo::SloTargets;

impl TokensValue {
    fn resolve(&self, field: &str) -> Result<u64, PlanError> {
        match self {
            TokensValue::Count(n) => Ok(*n),
            TokensValue::Label(text) => {
                parse_context(text.trim()).map_err(|error| PlanError::BadValue {
                    field: field.to_owned(),
                    message: error.to_string(),
                })
            }
        }
    }
}

impl DurationValue {
    fn resolve(&self, field: &str) -> Result<Duration, PlanError> {
        let bad = |message: String| PlanError::BadValue {
            field: field.to_owned(),
            message,
        };
        match self {
            DurationValue::Seconds(s) => Duration::try_from_secs_f64(*s)
                .map_err(|_| bad(format!("{s} is not a duration in seconds"))),
            DurationValue::Text(text) => parse_duration(text).map_err(bad),
        }
    }
}

impl Plan {
    /// Resolves `request` against the server's facts and the `[sweep]` configuration.
    pub fn resolve(
        request: &SweepRequest,
        facts: &ServerFacts,
        config: &SweepConfig,
    ) -> Result<Plan, PlanError> {
        let bad = |field: &str, message: String| PlanError::BadValue {
            field: field.to_owned(),
            message,
        };
        let model = match request.model.as_deref().map(str::trim) {
            Some("") => return Err(bad("model", "must not be empty".into())),
            Some(model) => model.to_owned(),
            None if !facts.answered => return Err(PlanError::Unreachable),
            None => facts.served_model.clone().ok_or(PlanError::NoModel)?,
        };
        let slo_header = match request.slo.as_deref().map(str::trim) {
            Some(text) => {
                SloTargets::parse_header(text.as_bytes()).map_err(|error| {
                    bad(
                        "slo",
                        format!("`{text}`: {error} (write e.g. ttft=500ms,tbt=50ms,e2e=30s)"),
                    )
                })?;
                Some(text.to_owned())
            }
            None => None,
        };
        let capacity = if request.find_capacity.unwrap_or(false) {
            let targets = match request.slo.as_deref().map(str::trim) {
                Some(text) => SloTargets::parse_header(text.as_bytes()).unwrap_or_default(),
                None => SloTargets::NONE,
            };
            if !targets.is_set() {
                return Err(bad(
                    "find_capacity",
                    "needs the SLO to search under: set `slo` (e.g. ttft=2s,tbt=50ms)".into(),
                ));
            }
            let attainment = request.attainment.unwrap_or(DEFAULT_ATTAINMENT);
            if !(attainment > 0.0 && attainment <= 1.0) {
                return Err(bad(
                    "attainment",
                    format!("must lie in (0, 1], found {attainment}"),
                ));
            }
            let basis = match request.capacity_basis.as_deref() {
                None => Basis::Auto,
                Some(text) => Basis::parse(text).ok_or_else(|| {
                    bad(
                        "capacity_basis",
                        format!("`{text}`: expected auto, attainment, median, p90 or p99"),
                    )
                })?,
            };
            let ms = |d: Option<Duration>| d.map(|d| d.as_secs_f64() * 1000.0);
            Some(CapacityQuery {
                targets: Targets {
                    ttft_ms: ms(targets.ttft),
                    tbt_ms: ms(targets.tbt),
                    e2e_ms: ms(targets.e2e),
                },
                attainment,
                basis,
                output_tokens: None,
            })
        } else {
            for (field, given) in [
                ("attainment", request.attainment.is_some()),
                ("capacity_basis", request.capacity_basis.is_some()),
            ] {
                if given {
                    return Err(bad(field, "applies only with find_capacity".into()));
                }
            }
            None
        };
        let max_output = request.max_output.unwrap_or(config.max_output);
        if max_output == 0 {
            return Err(bad("max_output", "must be at least 1".into()));
        }
        let cell_duration = match &request.cell_duration {
            Some(value) => value.resolve("cell_duration")?,
            None => config.cell_duration,
        };
        if cell_duration < Duration::from_millis(100) {
            return Err(bad(
                "cell_duration",
                format!(
                    "{:?} is too short to measure anything (at least 100ms)",
                    cell_duration
                ),
            ));
        }
        if cell_duration > Duration::from_secs(3600) {
            return Err(bad(
                "cell_duration",
                "more than an hour per cell is surely a typo".into(),
            ));
        }

        let concurrency = match &request.concurrency {
            Some(levels) => checked_ladder("concurrency", levels, |&c| u64::from(c))?,
            None => DEFAULT_CONCURRENCY.to_vec(),
        };
        if let Some(&zero) = concurrency.iter().find(|&&c| c == 0) {
            return Err(bad("concurrency", format!("{zero}: levels start at 1")));
        }
        if let Some(&big) = concurrency.iter().find(|&&c| c > MAX_CONCURRENCY) {
            return Err(bad(
                "concurrency",
                format!("{big}: at most {MAX_CONCURRENCY} streams per cell"),
            ));
        }

        let context_length = facts.context_length;
        // The longest prompt the server accepts (sglang also refuses max_req_input_len or more).
        let longest_prompt = |length: u64| {
            let by_context = length.saturating_sub(2);
            match facts.max_input_tokens {
                Some(max_input) => by_context.min(max_input.saturating_sub(1)),
                None => by_context,
            }
        };
        let top = context_length.map(|length| {
            length
                .saturating_sub(max_output)
                .saturating_sub(TOP_CONTEXT_MARGIN)
                .min(longest_prompt(length))
        });
        let (contexts, default_ladder) = match &request.contexts {
            Some(values) => {
                let mut contexts = Vec::with_capacity(values.len());
                for (index, value) in values.iter().enumerate() {
                    contexts.push(value.resolve(&format!("contexts[{index}]"))?);
                }
                let contexts = checked_ladder("contexts", &contexts, |&c| c)?;
                if contexts.first() == Some(&0) {
                    return Err(bad("contexts", "a context must be at least 1 token".into()));
                }
                (contexts, false)
            }
            None => {
                if !facts.answered {
                    return Err(PlanError::Unreachable);
                }
                let top = top.ok_or(PlanError::NoContextLength)?;
                let cap = match &request.max_context {
                    Some(value) => value.resolve("max_context")?,
                    None => u64::MAX,
                };
                let top = top.min(cap);
                if top == 0 {
                    return Err(PlanError::NoRoom {
                        max_output,
                        context_length: context_length.unwrap_or(0),
                    });
                }
                (default_contexts(top), request.max_context.is_none())
            }
        };
        if let (Some(length), Some(top)) = (context_length, top) {
            if let Some(&context) = contexts.iter().find(|&&c| c > top) {
                return Err(PlanError::ContextTooLong {
                    context,
                    max_output,
                    context_length: length,
                    top,
                });
            }
        }

        let mut steps: Vec<PrefillTarget> = contexts
            .iter()
            .map(|&context| PrefillTarget {
                context,
                prompt_tokens: context,
                decode: true,
            })
            .collect();
        let full_prefill = request.full_context_prefill.unwrap_or(default_ladder);
        if full_prefill {
            let length = context_length.ok_or(PlanError::NoContextLength)?;
            // One output token must fit (prompt + max_tokens < context length), and sglang
            // wants the prompt below max_req_input_len.
            let prompt_tokens = longest_prompt(length);
            if prompt_tokens > 0 && !contexts.contains(&length) {
                steps.push(PrefillTarget {
                    context: length,
                    prompt_tokens,
                    decode: false,
                });
            }
        }

        let (kv_budget_tokens, kv_source) = match (request.kv_budget_tokens, facts.kv_budget_tokens)
        {
            (Some(0), _) => (None, "none: the request set kv_budget_tokens 0".to_owned()),
            (Some(budget), _) => (Some(budget), "the request's kv_budget_tokens".to_owned()),
            (None, Some(budget)) => (
                Some(budget),
                facts
                    .kv_source
                    .clone()
                    .unwrap_or_else(|| "the server".to_owned()),
            ),
            (None, None) if config.kv_budget_tokens > 0 => (
                Some(config.kv_budget_tokens),
                "sweep.kv_budget_tokens".to_owned(),
            ),
            (None, None) => (
                None,
                "unknown: the server reports none and sweep.kv_budget_tokens is 0, so no cell is skipped as over capacity".to_owned(),
            ),
        };

        let default_plan = request.contexts.is_none()
            && request.max_context.is_none()
            && request.concurrency.is_none();
        let mut plan = Plan {
            model,
            steps,
            concurrency,
            cell_duration_s: cell_duration.as_secs_f64(),
            max_output,
            kv_budget_tokens,
            kv_source,
            prompt: request.prompt.unwrap_or_default(),
            engine: facts.engine,
            slo_header,
            capacity: capacity.map(|query| CapacityQuery {
                output_tokens: Some(max_output),
                ..query
            }),
            notes: Vec::new(),
            like_production: None,
        };
        if default_plan {
            plan.fit_within(config.max_default_duration);
        }
        Ok(plan)
    }
}

/// 8K, 16K, … doubling while below `top`, then `top` itself.
pub fn default_contexts(top: u64) -> Vec<u64> {
    let mut contexts = Vec::new();
    let mut context = DEFAULT_MIN_CONTEXT;
    while context < top {
        contexts.push(context);
        context = context.saturating_mul(2);
    }
    contexts.push(top);
    contexts
}

/// Sorts, checks for duplicates and length.
fn checked_ladder<T: Copy + Ord + std::fmt::Display>(
    field: &str,
    values: &[T],
    _key: impl Fn(&T) -> u64,
) -> Result<Vec<T>, PlanError> {
    let bad = |message: String| PlanError::BadValue {
        field: field.to_owned(),
        message,
    };
    if values.is_empty() {
        return Err(bad("needs at least one value".into()));
    }
    if values.len() > MAX_LADDER {
        return Err(bad(format!("at most {MAX_LADDER} values")));
    }
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    if let Some(pair) = sorted.windows(2).find(|w| w[0] == w[1]) {
        return Err(bad(format!("{} appears twice", pair[0])));
    }
    Ok(sorted)
}
