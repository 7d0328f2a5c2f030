//! The sweep plan: what the user asks for ([`SweepRequest`]: the JSON body of `POST /sweeps`
//! and what the CLI flags build), what the server says about itself ([`ServerFacts`]), and the
//! resolved [`Plan`] the runner executes — contexts, concurrency levels, window, max output,
//! KV budget, which cells are over capacity, and how long every prompt is.
//!
//! Pure: no I/O, no clock. Defaults follow the seed tool: top context = context
//! length − max output − 1024, contexts doubling from 8K below it, concurrency 1…128 doubling,
//! and a prefill row at the full context length. sglang refuses a request whose prompt plus
//! `max_tokens` reaches the context length, and one of `max_req_input_len` (context − 5) tokens
//! or more, so that row's prompt is the longest the server accepts (context − 6 on sglang,
//! context − 2 elsewhere); its `prompt_tokens` says so.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::base::duration::parse_duration;
use crate::config::SweepConfig;
use crate::matrix::capacity::{Basis, CapacityQuery, Targets};
use crate::matrix::units::{context_label, parse_context};
use crate::meter::slo::SloTargets;

/// The share of a cell's streams that must meet the SLO in a capacity search, by default.
pub const DEFAULT_ATTAINMENT: f64 = 0.95;

/// Smallest context of the default ladder (8K).
pub const DEFAULT_MIN_CONTEXT: u64 = 8 << 10;
/// Tokens kept free below the context length for the top decode context (seed tool's rule).
pub const TOP_CONTEXT_MARGIN: u64 = 1024;
/// The default concurrency ladder: 1 … 128 doubling.
pub const DEFAULT_CONCURRENCY: [u32; 8] = [1, 2, 4, 8, 16, 32, 64, 128];
/// Most contexts or concurrency levels one plan may hold (keeps a mistyped request bounded).
pub const MAX_LADDER: usize = 32;
/// Most simultaneous streams of one cell.
pub const MAX_CONCURRENCY: u32 = 4096;

/// A token count written as a number (`8192`) or a context label (`"8K"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TokensValue {
    Count(u64),
    Label(String),
}

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

/// A duration written as seconds (`30`, `2.5`) or as text (`"30s"`, `"500ms"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum DurationValue {
    Seconds(f64),
    Text(String),
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

/// How prompts of exact length are made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum PromptMode {
    /// Token ids on /v1/completions; if the server refuses them, text calibrated with /tokenize.
    #[default]
    Auto,
    /// Token-id prompts only (sglang and vLLM accept `prompt: [ids]` on /v1/completions).
    TokenIds,
    /// Text prompts sized with the server's /tokenize (servers without token-id input).
    Text,
}

/// What a sweep should measure. Every field is optional; missing ones come from the server
/// and from the `[sweep]` configuration. This is the JSON body of `POST /sweeps`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SweepRequest {
    /// Decode contexts in tokens (`8192` or `"8K"`). Default: doubling from 8K up to the top
    /// context (context length − max output − 1024), plus the top context itself.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub contexts: Option<Vec<TokensValue>>,
    /// Concurrency levels. Default 1, 2, 4 … 128.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<Vec<u32>>,
    /// Measurement window per cell. Default `sweep.cell_duration` (30 s).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cell_duration: Option<DurationValue>,
    /// `max_tokens` of every decode stream. Default `sweep.max_output` (4096).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_output: Option<u64>,
    /// KV budget in tokens for the over-capacity rule; overrides what the server reports.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_budget_tokens: Option<u64>,
    /// Caps the default context ladder (ignored when `contexts` is given).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_context: Option<TokensValue>,
    /// Also measure prefill at the full context length. Default: yes when the contexts are the
    /// default ladder without `max_context`, no otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub full_context_prefill: Option<bool>,
    /// The `model` sent in every request. Default: the first model of `/v1/models`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// How prompts of exact length are built. Default `auto`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt: Option<PromptMode>,
    /// SLO targets for the sweep's streams, in the `x-tokentap-slo` header's syntax
    /// (`ttft=500ms,tbt=50ms,e2e=30s`, or `none`); sent as that header, so they replace the
    /// configured `[slo]` targets. Default: the configured ones.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slo: Option<String>,
    /// Search each context for its capacity under `slo` instead of running the whole
    /// concurrency ladder: bracket by doubling, then bisect on the ladder, measuring only the
    /// cells the answer needs (docs/capacity.md). Needs `slo`. Default: no.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub find_capacity: Option<bool>,
    /// With `find_capacity`: the share of a cell's streams that must meet the SLO (0–1).
    /// Default 0.95.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attainment: Option<f64>,
    /// With `find_capacity`: what a cell is judged by (`auto`, `attainment`, `median`, `p90`,
    /// `p99`). Default `auto` (the streams' SLO attainment).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capacity_basis: Option<String>,
}

/// Which inference engine answers (decides abort and metric names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EngineKind {
    Sglang,
    Vllm,
    #[default]
    Unknown,
}

impl EngineKind {
    pub fn name(self) -> Option<&'static str> {
        match self {
            EngineKind::Sglang => Some("sglang"),
            EngineKind::Vllm => Some("vllm"),
            EngineKind::Unknown => None,
        }
    }

    /// The gauge of running requests in the engine's `/metrics`.
    pub fn running_gauge(self) -> Option<&'static str> {
        match self {
            EngineKind::Sglang => Some("sglang:num_running_reqs"),
            EngineKind::Vllm => Some("vllm:num_requests_running"),
            EngineKind::Unknown => None,
        }
    }

    /// The gauge of queued requests in the engine's `/metrics`.
    pub fn queued_gauge(self) -> Option<&'static str> {
        match self {
            EngineKind::Sglang => Some("sglang:num_queue_reqs"),
            EngineKind::Vllm => Some("vllm:num_requests_waiting"),
            EngineKind::Unknown => None,
        }
    }
}

/// What the server says about itself (`/v1/models`, `/server_info` or `/get_server_info`,
/// `/metrics`); `discover.rs` asks for them (it depends on this file, not the reverse).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ServerFacts {
    pub engine: EngineKind,
    pub engine_version: Option<String>,
    /// The first model `/v1/models` lists.
    pub served_model: Option<String>,
    pub model_path: Option<String>,
    /// Max prompt + output tokens (`max_model_len`, `context_length`).
    pub context_length: Option<u64>,
    /// sglang's `max_req_input_len`: a prompt must be shorter than this (context − 5 when the
    /// KV cache holds a whole context).
    #[serde(default)]
    pub max_input_tokens: Option<u64>,
    /// KV cache in tokens, and where that figure came from.
    pub kv_budget_tokens: Option<u64>,
    pub kv_source: Option<String>,
    /// The engine's running-requests gauge answers on `/metrics`.
    pub has_running_gauge: bool,
    /// Any of the discovery requests got a successful answer.
    #[serde(default)]
    pub answered: bool,
    /// Labels a server may offer (the simulator does).
    pub hardware: Option<String>,
    pub gpu_count: Option<u32>,
    pub quantization: Option<String>,
    /// The upstream's configuration id (`upstream_identity`) when the sweep began, if read.
    #[serde(default)]
    pub fingerprint: Option<String>,
}

/// One prefill measurement: a scout request of `prompt_tokens` tokens reported at the nominal
/// `context` (they differ only for the full-context row).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrefillTarget {
    pub context: u64,
    pub prompt_tokens: u64,
    /// Decode cells follow this scout (false for the full-context row).
    pub decode: bool,
}

/// The resolved plan the runner executes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub model: String,
    /// Scouts in the order they run (ascending context); decode cells follow those with
    /// `decode`.
    pub steps: Vec<PrefillTarget>,
    pub concurrency: Vec<u32>,
    pub cell_duration_s: f64,
    pub max_output: u64,
    pub kv_budget_tokens: Option<u64>,
    /// Where the KV budget came from (or why there is none).
    pub kv_source: String,
    pub prompt: PromptMode,
    pub engine: EngineKind,
    /// The `x-tokentap-slo` header value of every stream (validated), if the request set one.
    pub slo_header: Option<String>,
    /// A capacity search instead of the whole ladder (`find_capacity`): the question each
    /// context's cells are judged by.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<CapacityQuery>,
}

/// A plan that cannot run; each names the field at fault.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlanError {
    #[error("{field}: {message}")]
    BadValue { field: String, message: String },
    #[error("the server reports no context length (/v1/models max_model_len, /server_info context_length); give `contexts` explicitly")]
    NoContextLength,
    #[error("the server reports no model (/v1/models); give `model` explicitly")]
    NoModel,
    #[error("the server answered none of /v1/models, /server_info, /get_server_info, /metrics, /version through the proxy: is it running at the upstream URL?")]
    Unreachable,
    #[error("contexts: {context} + max_output {max_output} reaches the server's context length {context_length}; the largest decode context is {top} (context length − max output − {TOP_CONTEXT_MARGIN})", context = context_label(*.context), top = context_label(*.top))]
    ContextTooLong {
        context: u64,
        max_output: u64,
        context_length: u64,
        top: u64,
    },
    #[error("max_output {max_output} leaves no room for a prompt in the context length {context_length}")]
    NoRoom {
        max_output: u64,
        context_length: u64,
    },
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

        Ok(Plan {
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
        })
    }

    pub fn cell_duration(&self) -> Duration {
        Duration::try_from_secs_f64(self.cell_duration_s).unwrap_or(Duration::from_secs(30))
    }

    /// The seed tool's rule: C × (context + max output) > KV budget.
    pub fn over_capacity(&self, context: u64, concurrency: u32) -> bool {
        self.kv_budget_tokens.is_some_and(|budget| {
            u128::from(concurrency) * (u128::from(context) + u128::from(self.max_output))
                > u128::from(budget)
        })
    }

    /// Decode contexts, ascending.
    pub fn decode_contexts(&self) -> Vec<u64> {
        self.steps
            .iter()
            .filter(|s| s.decode)
            .map(|s| s.context)
            .collect()
    }

    /// Decode cells that will run (not over capacity).
    pub fn runnable_cells(&self) -> usize {
        self.decode_contexts()
            .iter()
            .map(|&context| {
                self.concurrency
                    .iter()
                    .filter(|&&c| !self.over_capacity(context, c))
                    .count()
            })
            .sum()
    }

    /// Measurements the runner takes: scouts plus runnable decode cells.
    pub fn measurements(&self) -> usize {
        self.steps.len() + self.runnable_cells()
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

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> SweepConfig {
        SweepConfig {
            production_guard: 4,
            cell_duration: Duration::from_secs(30),
            max_output: 4096,
            kv_budget_tokens: 0,
        }
    }

    fn step_facts() -> ServerFacts {
        ServerFacts {
            engine: EngineKind::Sglang,
            served_model: Some("step3p7".into()),
            context_length: Some(262_144),
            kv_budget_tokens: Some(622_592),
            kv_source: Some("sglang /server_info max_total_num_tokens".into()),
            answered: true,
            ..ServerFacts::default()
        }
    }

    #[test]
    fn defaults_reproduce_the_step_seed_ladder_and_statuses() {
        let plan = Plan::resolve(&SweepRequest::default(), &step_facts(), &config()).unwrap();
        let contexts: Vec<String> = plan
            .steps
            .iter()
            .map(|s| context_label(s.context))
            .collect();
        assert_eq!(
            contexts,
            ["8K", "16K", "32K", "64K", "128K", "251K", "256K"]
        );
        let full = plan.steps.last().unwrap();
        assert_eq!((full.prompt_tokens, full.decode), (262_142, false));
        assert_eq!(plan.concurrency, DEFAULT_CONCURRENCY);
        // The seed's Over capacity cells, exactly.
        let valid: Vec<(u64, u32)> = plan
            .decode_contexts()
            .iter()
            .flat_map(|&ctx| plan.concurrency.iter().map(move |&c| (ctx, c)))
            .filter(|&(ctx, c)| !plan.over_capacity(ctx, c))
            .collect();
        let last = |ctx: u64| valid.iter().filter(|v| v.0 == ctx).map(|v| v.1).max();
        assert_eq!(last(8 << 10), Some(32));
        assert_eq!(last(16 << 10), Some(16));
        assert_eq!(last(32 << 10), Some(16));
        assert_eq!(last(64 << 10), Some(8));
        assert_eq!(last(128 << 10), Some(4));
        assert_eq!(last(257_024), Some(2));
        assert_eq!(plan.runnable_cells(), 6 + 5 + 5 + 4 + 3 + 2);
    }

    #[test]
    fn the_full_context_row_stays_below_max_req_input_len() {
        let facts = ServerFacts {
            max_input_tokens: Some(262_139),
            ..step_facts()
        };
        let plan = Plan::resolve(&SweepRequest::default(), &facts, &config()).unwrap();
        let full = plan.steps.last().unwrap();
        assert_eq!((full.context, full.prompt_tokens), (262_144, 262_138));
        assert_eq!(plan.decode_contexts().last(), Some(&257_024));
    }

    #[test]
    fn glm_top_context_is_1019k() {
        let facts = ServerFacts {
            context_length: Some(1_048_576),
            ..step_facts()
        };
        let plan = Plan::resolve(&SweepRequest::default(), &facts, &config()).unwrap();
        let labels: Vec<String> = plan
            .steps
            .iter()
            .map(|s| context_label(s.context))
            .collect();
        assert_eq!(
            labels,
            ["8K", "16K", "32K", "64K", "128K", "256K", "512K", "1019K", "1024K"]
        );
    }

    #[test]
    fn explicit_plan_from_json() {
        let request: SweepRequest = serde_json::from_str(
            r#"{"contexts": ["16K", 8192], "concurrency": [4, 1, 2], "cell_duration": "2s", "max_output": 512}"#,
        )
        .unwrap();
        let plan = Plan::resolve(&request, &step_facts(), &config()).unwrap();
        assert_eq!(plan.decode_contexts(), [8192, 16384]);
        assert_eq!(plan.steps.len(), 2, "no full-context prefill unless asked");
        assert_eq!(plan.concurrency, [1, 2, 4]);
        assert_eq!(plan.cell_duration(), Duration::from_secs(2));
        assert_eq!(plan.max_output, 512);
        assert_eq!(plan.measurements(), 2 + 6);
    }

    #[test]
    fn errors_name_the_field() {
        let facts = step_facts();
        let cases = [
            (r#"{"contexts": ["8Q"]}"#, "contexts[0]"),
            (r#"{"concurrency": [1, 1]}"#, "concurrency"),
            (r#"{"concurrency": [0, 1]}"#, "concurrency"),
            (r#"{"cell_duration": "5 parsecs"}"#, "cell_duration"),
            (r#"{"cell_duration": 0.01}"#, "cell_duration"),
            (r#"{"max_output": 0}"#, "max_output"),
            (
                r#"{"contexts": [300000]}"#,
                "contexts: 300000 + max_output 4096",
            ),
        ];
        for (json, want) in cases {
            let request: SweepRequest = serde_json::from_str(json).unwrap();
            let error = Plan::resolve(&request, &facts, &config())
                .unwrap_err()
                .to_string();
            assert!(error.contains(want), "{json}: {error}");
        }
        let unknown = serde_json::from_str::<SweepRequest>(r#"{"contxts": [1]}"#).unwrap_err();
        assert!(unknown.to_string().contains("contxts"));
    }

    #[test]
    fn kv_budget_sources() {
        let request = SweepRequest::default();
        let mut facts = step_facts();
        facts.kv_budget_tokens = None;
        let plan = Plan::resolve(&request, &facts, &config()).unwrap();
        assert_eq!(plan.kv_budget_tokens, None);
        assert!(!plan.over_capacity(1 << 20, 128));
        let mut configured = config();
        configured.kv_budget_tokens = 100_000;
        let plan = Plan::resolve(&request, &facts, &configured).unwrap();
        assert_eq!(plan.kv_budget_tokens, Some(100_000));
        assert_eq!(plan.kv_source, "sweep.kv_budget_tokens");
        let request = SweepRequest {
            kv_budget_tokens: Some(50_000),
            ..SweepRequest::default()
        };
        let plan = Plan::resolve(&request, &step_facts(), &configured).unwrap();
        assert_eq!(plan.kv_budget_tokens, Some(50_000));
    }

    #[test]
    fn slo_targets_are_checked_and_kept_as_the_header_value() {
        let request = SweepRequest {
            slo: Some(" ttft=500ms,tbt=50ms ".into()),
            ..SweepRequest::default()
        };
        let plan = Plan::resolve(&request, &step_facts(), &config()).unwrap();
        assert_eq!(plan.slo_header.as_deref(), Some("ttft=500ms,tbt=50ms"));
        let plan = Plan::resolve(&SweepRequest::default(), &step_facts(), &config()).unwrap();
        assert_eq!(plan.slo_header, None);
        let request = SweepRequest {
            slo: Some("ttft=soon".into()),
            ..SweepRequest::default()
        };
        let error = Plan::resolve(&request, &step_facts(), &config()).unwrap_err();
        assert!(error.to_string().starts_with("slo: `ttft=soon`"), "{error}");
    }

    #[test]
    fn a_silent_server_is_named_as_such() {
        let facts = ServerFacts::default();
        assert_eq!(
            Plan::resolve(&SweepRequest::default(), &facts, &config()),
            Err(PlanError::Unreachable)
        );
    }

    #[test]
    fn no_context_length_needs_explicit_contexts() {
        let facts = ServerFacts {
            context_length: None,
            ..step_facts()
        };
        assert_eq!(
            Plan::resolve(&SweepRequest::default(), &facts, &config()),
            Err(PlanError::NoContextLength)
        );
        let request = SweepRequest {
            contexts: Some(vec![TokensValue::Count(1000)]),
            ..SweepRequest::default()
        };
        assert!(Plan::resolve(&request, &facts, &config()).is_ok());
    }
}
