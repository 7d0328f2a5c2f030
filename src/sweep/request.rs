//! What the user asks a sweep for: [`SweepRequest`] (the JSON body of `POST /sweeps` and what
//! the CLI flags build) and the values it is written in. Data only; `resolve.rs` checks it
//! against the server's facts and the configuration.

use serde::{Deserialize, Serialize};

/// A token count written as a number (`8192`) or a context label (`"8K"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TokensValue {
    Count(u64),
    Label(String),
}

/// A duration written as seconds (`30`, `2.5`) or as text (`"30s"`, `"500ms"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum DurationValue {
    Seconds(f64),
    Text(String),
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
    /// Start even while production requests are in flight through this proxy (a sweep then
    /// slows them, and its cells show the production they ran beside). Default: no, a start
    /// is refused with 409 while any are.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub beside_production: Option<bool>,
    /// Shape the cells like production's traffic of the model (docs/sweep.md, "Like
    /// production"): per context, production's cached share of the prompt shared by every
    /// stream, the rest cold and unique per request, output lengths drawn from production's.
    /// Needs production evidence for the model. Default: no, except with `find_capacity`,
    /// which uses it when production has evidence (`false` keeps the seed method).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub like_production: Option<bool>,
}
