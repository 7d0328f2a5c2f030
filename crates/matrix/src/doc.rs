//! The matrix document itself: plain serde structs and lookups (validation is `validate.rs`).
//!
//! Owns the data model that every producer (synthetic sweep, production aggregator, importer) builds
//! and every consumer (renderers, diff, simulator, admin page) reads. It does no I/O and no
//! formatting; units are in the field names and numbers keep full precision.
use std::collections::{BTreeSet, HashMap};
use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

pub use tokentap_base::Source;

/// The schema tag every JSON document carries; bump it when a field changes meaning or is added.
pub const SCHEMA: &str = "tokentap.matrix/v1";

/// One speed-test matrix: who was measured, how, and what came out.
///
/// `decode` holds the "Sustained decode" cells (context × concurrency), `prefill` the prefill rows
/// (one per context). Either may be sparse: a production window may lack some cells.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MatrixDoc {
    /// Always [`SCHEMA`].
    pub schema: String,
    pub metadata: Metadata,
    pub prefill: Vec<PrefillRow>,
    pub decode: Vec<DecodeCell>,
}

/// Everything the seed page says about the run besides the measurements.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Metadata {
    pub model: ModelInfo,
    pub hardware: Hardware,
    pub engine: Engine,
    pub run: RunInfo,
    /// The server's launch command with secrets replaced by `<redacted>`
    /// (see [`crate::redact::redact_launch_command`]).
    pub launch_command: Option<String>,
    /// Facts the page listed that have no field of their own, kept in page order so nothing is lost.
    #[serde(default)]
    pub extra_facts: Vec<Fact>,
    /// Free-form remarks about the run, e.g. "paused 40 s for production traffic at 16K × 8".
    #[serde(default)]
    pub notes: Vec<String>,
}

/// The model being served.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelInfo {
    /// The name in the page title (e.g. `GLM-5.3-Flash-NVFP4`); `None` means "use the served model".
    pub display_name: Option<String>,
    /// The name clients send as `model` (e.g. `nvidia/GLM-5.3-Flash-NVFP4`, `step3p7`).
    pub served_model: Option<String>,
    /// The weights the server loaded (`--model-path`).
    pub model_path: Option<String>,
    /// Revision of the weights (e.g. `main`).
    pub revision: Option<String>,
}

/// Hardware labels as the page shows them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hardware {
    /// The hardware part of the title; `None` means "derive it from gpu, memory and count"
    /// (see [`Hardware::summary`]).
    pub label: Option<String>,
    /// e.g. `Discrete GPU`.
    pub kind: Option<String>,
    /// e.g. `RTX PRO 6000 Blackwell Server Edition`.
    pub gpu: Option<String>,
    pub gpu_count: Option<u32>,
    /// Memory of one GPU in GB (the page prints the total as `384 GB (4 × 96 GB)`).
    pub memory_per_gpu_gb: Option<f64>,
    /// e.g. `linux`.
    pub os: Option<String>,
}

/// The inference engine.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Engine {
    /// e.g. `sglang`, `vllm`.
    pub name: Option<String>,
    pub version: Option<String>,
    /// e.g. `NVFP4`, `FP8`.
    pub quantization: Option<String>,
    /// e.g. `cuda`.
    pub backend: Option<String>,
    pub repository: Option<String>,
    /// e.g. `cuda-13.2`.
    pub build: Option<String>,
    pub commit: Option<String>,
}

/// How the measurements were taken.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunInfo {
    /// Where the figures come from; `None` when unknown.
    pub source: Option<Source>,
    /// The tool and its version, e.g. `tokentap v0.1.0`, `llm-inference-bench v0.8.0`.
    pub benchmark_tool: Option<String>,
    /// e.g. `Fixed duration`.
    pub decode_test: Option<String>,
    /// e.g. `Measured during decode warm-up`.
    pub prefill_mode: Option<String>,
    /// Planned length of one decode measurement window, seconds.
    pub time_per_measurement_s: Option<f64>,
    /// `max_tokens` of each decode stream.
    pub max_output_tokens: Option<u64>,
    /// Identifier of the synthetic sweep that produced this document.
    pub sweep_id: Option<String>,
    /// Length of the production window this document aggregates, seconds.
    pub window_s: Option<f64>,
    /// RFC 3339 time the run or window started, e.g. `2025-06-01T12:00:00Z`.
    pub started_at: Option<String>,
    /// RFC 3339 time the run or window ended.
    pub ended_at: Option<String>,
    /// How a sweep's requests were shaped: absent for the seed method (identical warm streams
    /// of max output); [`LIKE_PRODUCTION`] for a sweep shaped like production's traffic (its
    /// cached share of the prompt, cold unique rest, production's output lengths). Figures of
    /// the two shapes answer different questions and are never compared with each other
    /// ([`MatrixDoc::like_production`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shape: Option<String>,
}

/// [`RunInfo::shape`] of a sweep shaped like production's traffic.
pub const LIKE_PRODUCTION: &str = "like-production";

impl MatrixDoc {
    /// Whether its cells were measured with requests shaped like production's
    /// ([`LIKE_PRODUCTION`]): never compared with a seed-method matrix's cells.
    pub fn like_production(&self) -> bool {
        self.metadata.run.shape.as_deref() == Some(LIKE_PRODUCTION)
    }
}

/// A fact with no dedicated field: which page section it sat in, its key and value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fact {
    /// `Hardware`, `Engine` or `Run`.
    pub section: String,
    pub key: String,
    pub value: String,
}

/// One prefill measurement: a cold prompt of `context_tokens` and how fast it was read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrefillRow {
    /// Nominal prompt length in tokens (`8K` = 8192).
    pub context_tokens: u64,
    /// Requests in flight while it was measured (1 for a sweep's scout request).
    pub requests_at_once: u32,
    pub status: CellStatus,
    /// Prompt tokens read per second: uncached prompt tokens ÷ TTFT.
    pub prompt_tok_s: Option<f64>,
    /// Time to first token of the cold request, milliseconds.
    pub ttft_ms: Option<f64>,
    /// Requests that completed (1 for a scout).
    pub completed_requests: Option<u64>,
    /// Prompt tokens the server reported, when known (the nominal context is `context_tokens`).
    #[serde(default)]
    pub prompt_tokens: Option<u64>,
}

/// One sustained-decode cell: `concurrency` identical streams at `context_tokens`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecodeCell {
    /// Nominal prompt length in tokens (`8K` = 8192, `1019K` = 1043456).
    pub context_tokens: u64,
    /// Simultaneous requests ("Requests at once").
    pub concurrency: u32,
    pub status: CellStatus,
    /// Output tokens per second across all simultaneous requests.
    pub total_tok_s: Option<f64>,
    /// Output tokens per second of one stream (1 ÷ time between tokens).
    pub per_request_tok_s: Option<f64>,
    /// Median time to first token, milliseconds (after the prompt cache was warmed, for a sweep).
    pub ttft_ms: Option<f64>,
    /// Median time between tokens, milliseconds.
    pub tbt_ms: Option<f64>,
    /// Mean number of requests the server was running during the window.
    pub average_active_requests: Option<f64>,
    /// Requests that finished inside the window.
    pub completed_requests: Option<u64>,
    /// Output tokens produced inside the window.
    pub output_tokens: Option<u64>,
    /// Length of the measurement window, seconds.
    pub measured_for_s: Option<f64>,
    /// Prompt tokens the server reported per request, when known.
    #[serde(default)]
    pub prompt_tokens: Option<u64>,
    /// Prefill interference: the share (0–1) of the cell's decode time (request-seconds) during
    /// which at least one other request to the same server and model was in prefill (head in →
    /// first token). Absent in documents that predate it.
    #[serde(default)]
    pub prefill_overlap_share: Option<f64>,
    /// Mean number of other requests' prefills that overlapped a request's decode interval.
    #[serde(default)]
    pub overlapping_prefills: Option<f64>,
    /// SLO attainment: share (0–1) of the cell's requests with SLO targets that met all of
    /// them. Absent when no request had targets (and in documents that predate it).
    #[serde(default)]
    pub slo_attainment: Option<f64>,
    /// Goodput: output tok/s of the requests that met their SLO targets, over the same window
    /// as `total_tok_s`. Absent when no request had targets.
    #[serde(default)]
    pub goodput_tok_s: Option<f64>,
    /// The server's own state (scraped from its `/metrics`) beside the cell: each a mean over
    /// the cell's requests, weighted by the time each request saw a value. Absent when the
    /// server was not scraped or exposed none of it (and in documents that predate it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_state: Option<ServerState>,
    /// The tails of the cell's latency distributions (p90 and p99 of TTFT, TBT and ITL).
    /// Absent where the source has none (a seed page, documents that predate it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tails: Option<Tails>,
    /// A sweep cell only: the mean number of production requests in flight to the same server
    /// during its window (the guard lets some run beside a sweep). Absent for production cells
    /// and documents that predate it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub production_in_flight: Option<f64>,
    /// The first token of each kind, for reasoning models and tool calls: `ttft_ms` stays the
    /// first token of any kind (the seed pages' TTFT). Absent where no request streamed an
    /// answer or a tool call apart from its first token (and in documents that predate it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_tokens: Option<FirstTokens>,
    /// The prompt cache as the server reported it per request: the cached share of prompt
    /// tokens and the TTFT of warm (mostly cached) and cold requests apart. Absent where the
    /// server reported no cached counts (and in documents that predate it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_cache: Option<PromptCache>,
    /// Mean output tokens per streamed event of the cell's requests: the tokens each decode
    /// step gave where the engine streams one event per step (speculative decoding's accept
    /// length; 1 without it). Absent where no request streamed events (and in documents that
    /// predate it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_step: Option<f64>,
}

/// A cell's prompt cache, from the cached counts the server reported per request (sglang
/// `--enable-cache-report`, vLLM `--enable-prompt-tokens-details`). A request is warm when at
/// least half of its prompt was cached, cold otherwise; each TTFT is the median of its own
/// requests, with their count.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PromptCache {
    /// Cached prompt tokens ÷ prompt tokens over the requests that reported both (0–1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_share: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm_ttft_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm_requests: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cold_ttft_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cold_requests: Option<f64>,
}

impl PromptCache {
    /// The least cached share of a prompt that makes its request warm.
    pub const WARM_SHARE: f64 = 0.5;

    /// The values in column order (see [`Self::NAMES`]).
    pub fn values(&self) -> [Option<f64>; 5] {
        [
            self.cached_share,
            self.warm_ttft_ms,
            self.warm_requests,
            self.cold_ttft_ms,
            self.cold_requests,
        ]
    }

    /// From values in column order; `None` when every one is absent.
    pub fn from_values(values: [Option<f64>; 5]) -> Option<PromptCache> {
        let [cached_share, warm_ttft_ms, warm_requests, cold_ttft_ms, cold_requests] = values;
        let cache = PromptCache {
            cached_share,
            warm_ttft_ms,
            warm_requests,
            cold_ttft_ms,
            cold_requests,
        };
        (cache != PromptCache::default()).then_some(cache)
    }

    /// Field names in column order (JSON keys, CSV headers).
    pub const NAMES: [&'static str; 5] = [
        "cached_share",
        "warm_ttft_ms",
        "warm_requests",
        "cold_ttft_ms",
        "cold_requests",
    ];
}

impl DecodeCell {
    /// The TTFT to compare across matrices: the warm requests' where the cell has them (a
    /// sweep warms the prompt cache before it measures, so warm is compared with warm), else
    /// the cell's TTFT.
    pub fn comparable_ttft_ms(&self) -> Option<f64> {
        self.prompt_cache
            .and_then(|c| c.warm_ttft_ms)
            .or(self.ttft_ms)
    }
}

/// The first answer token and the first tool-call delta of a cell's requests, milliseconds
/// from each request's arrival, with the number of requests each rests on; the reasoning
/// tokens per request where the server reported them; how many requests offered tools. A
/// tail is absent where its count cannot carry it (p90 from 10 requests, p99 from 100).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FirstTokens {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer_ttft_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer_ttft_p90_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer_ttft_p99_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer_requests: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_ttft_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_ttft_p90_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_ttft_p99_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_requests: Option<f64>,
    /// Mean reasoning tokens per request (`completion_tokens_details.reasoning_tokens`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_tokens: Option<f64>,
    /// Requests that offered tools (a `tools` list).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub with_tools_requests: Option<f64>,
}

impl FirstTokens {
    /// The values in column order (see [`Self::NAMES`]).
    pub fn values(&self) -> [Option<f64>; 10] {
        [
            self.answer_ttft_ms,
            self.answer_ttft_p90_ms,
            self.answer_ttft_p99_ms,
            self.answer_requests,
            self.tool_call_ttft_ms,
            self.tool_call_ttft_p90_ms,
            self.tool_call_ttft_p99_ms,
            self.tool_call_requests,
            self.reasoning_tokens,
            self.with_tools_requests,
        ]
    }

    /// From values in column order; `None` when every one is absent.
    pub fn from_values(values: [Option<f64>; 10]) -> Option<FirstTokens> {
        let [answer_ttft_ms, answer_ttft_p90_ms, answer_ttft_p99_ms, answer_requests, tool_call_ttft_ms, tool_call_ttft_p90_ms, tool_call_ttft_p99_ms, tool_call_requests, reasoning_tokens, with_tools_requests] =
            values;
        let first = FirstTokens {
            answer_ttft_ms,
            answer_ttft_p90_ms,
            answer_ttft_p99_ms,
            answer_requests,
            tool_call_ttft_ms,
            tool_call_ttft_p90_ms,
            tool_call_ttft_p99_ms,
            tool_call_requests,
            reasoning_tokens,
            with_tools_requests,
        };
        (first != FirstTokens::default()).then_some(first)
    }

    /// Field names in column order (JSON keys, CSV headers).
    pub const NAMES: [&'static str; 10] = [
        "answer_ttft_ms",
        "answer_ttft_p90_ms",
        "answer_ttft_p99_ms",
        "answer_requests",
        "tool_call_ttft_ms",
        "tool_call_ttft_p90_ms",
        "tool_call_ttft_p99_ms",
        "tool_call_requests",
        "reasoning_tokens",
        "with_tools_requests",
    ];
}

/// The tails of a cell's latency distributions, milliseconds. TTFT is one sample per request;
/// TBT one per request's decode, weighted by its tokens (production) or one per request
/// (sweep); ITL one per generated token after the first. A tail the source lacks is absent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tails {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttft_p90_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttft_p99_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tbt_p90_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tbt_p99_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub itl_p90_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub itl_p99_ms: Option<f64>,
}

impl Tails {
    /// The six values in column order: TTFT p90, p99, TBT p90, p99, ITL p90, p99.
    pub fn values(&self) -> [Option<f64>; 6] {
        [
            self.ttft_p90_ms,
            self.ttft_p99_ms,
            self.tbt_p90_ms,
            self.tbt_p99_ms,
            self.itl_p90_ms,
            self.itl_p99_ms,
        ]
    }

    /// From values in column order; `None` when every one is absent.
    pub fn from_values(values: [Option<f64>; 6]) -> Option<Tails> {
        let [ttft_p90_ms, ttft_p99_ms, tbt_p90_ms, tbt_p99_ms, itl_p90_ms, itl_p99_ms] = values;
        let tails = Tails {
            ttft_p90_ms,
            ttft_p99_ms,
            tbt_p90_ms,
            tbt_p99_ms,
            itl_p90_ms,
            itl_p99_ms,
        };
        (tails != Tails::default()).then_some(tails)
    }

    /// Field names in column order (JSON keys, CSV headers).
    pub const NAMES: [&'static str; 6] = [
        "ttft_p90_ms",
        "ttft_p99_ms",
        "tbt_p90_ms",
        "tbt_p99_ms",
        "itl_p90_ms",
        "itl_p99_ms",
    ];
}

/// The server's own state beside a cell; a state the server did not expose is absent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerState {
    /// Mean number of requests the server reported running (in its batch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running_requests: Option<f64>,
    /// Mean number of requests the server reported waiting for a place in the batch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queued_requests: Option<f64>,
    /// Mean share (0–1) of the KV cache in use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_cache_usage: Option<f64>,
    /// Mean share (0–1) of prompt tokens the server found in its prefix cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix_cache_hit_rate: Option<f64>,
}

impl ServerState {
    /// The four values in column order: running, queued, KV-cache usage, prefix-cache hits.
    pub fn values(&self) -> [Option<f64>; 4] {
        [
            self.running_requests,
            self.queued_requests,
            self.kv_cache_usage,
            self.prefix_cache_hit_rate,
        ]
    }

    /// From values in column order; `None` when every one is absent.
    pub fn from_values(values: [Option<f64>; 4]) -> Option<ServerState> {
        let [running_requests, queued_requests, kv_cache_usage, prefix_cache_hit_rate] = values;
        let state = ServerState {
            running_requests,
            queued_requests,
            kv_cache_usage,
            prefix_cache_hit_rate,
        };
        (state != ServerState::default()).then_some(state)
    }

    /// Field names in column order (JSON keys, CSV headers).
    pub const NAMES: [&'static str; 4] = [
        "running_requests",
        "queued_requests",
        "kv_cache_usage",
        "prefix_cache_hit_rate",
    ];
}

/// Outcome of one measurement. In JSON and on the page it is the text `Valid`, `Over capacity`,
/// `Not run`, `Low evidence`, `Off target` or `Error: <reason>`.
///
/// Only `Valid` figures enter a ratio, a colour scale, a drift comparison or a capacity answer;
/// `Low evidence` and `Off target` cells keep their figures so a reader sees what was there.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum CellStatus {
    Valid,
    /// A production (or fleet) cell below the evidence rule (too few seconds measured or
    /// output tokens for its decode figures: `matrix::evidence`). Its figures are shown greyed.
    LowEvidence,
    /// A sweep cell that did not measure its label: the server's average active requests were
    /// off the target concurrency, or production prefills overlapped its decode (see the
    /// sweep's notes for which and by how much).
    OffTarget,
    /// Skipped: this many requests at this context would exceed the server's KV cache.
    OverCapacity,
    /// Skipped by the run (cancelled, stopped early, or not planned).
    NotRun,
    /// The measurement failed; the reason is one line of text.
    Error(String),
    /// The engine shed the cell's load: more than the error share of its requests were refused
    /// for load (429/503, a queue cap: outcome `shed`). The figures are those of the admitted
    /// requests; the reason is one line (`12 of 40 requests shed`). Capacity counts the cell as
    /// a miss.
    Shed(String),
    /// A production or sweep cell whose streams came in bursts: more than one in twenty of its
    /// streams had most of their token events arrive together (an engine or a gateway that
    /// hands a finished stream over at once), so its gaps measure the delivery, not the decode
    /// steps. Its figures are shown greyed, never judged; the reason is one line (`9 of 20
    /// streams delivered in bursts`).
    Bursts(String),
}

impl CellStatus {
    /// An `Error` status whose reason is made safe for every rendering: whitespace runs (newlines
    /// included) become one space, and an empty reason becomes `unknown`.
    pub fn error(reason: &str) -> CellStatus {
        let collapsed = reason.split_whitespace().collect::<Vec<_>>().join(" ");
        let cleaned: String = collapsed.chars().filter(|c| !c.is_control()).collect();
        if cleaned.is_empty() {
            CellStatus::Error("unknown".to_owned())
        } else {
            CellStatus::Error(cleaned)
        }
    }

    /// A `Shed` status, its reason made safe as [`CellStatus::error`] makes an error's.
    pub fn shed(reason: &str) -> CellStatus {
        match CellStatus::error(reason) {
            CellStatus::Error(reason) => CellStatus::Shed(reason),
            other => other,
        }
    }

    /// A `Bursts` status, its reason made safe as [`CellStatus::error`] makes an error's.
    pub fn bursts(reason: &str) -> CellStatus {
        match CellStatus::error(reason) {
            CellStatus::Error(reason) => CellStatus::Bursts(reason),
            other => other,
        }
    }

    pub fn is_valid(&self) -> bool {
        matches!(self, CellStatus::Valid)
    }

    /// Parses the page text of a status; `None` for anything else.
    pub fn parse(text: &str) -> Option<CellStatus> {
        match text {
            "Valid" => Some(CellStatus::Valid),
            "Low evidence" => Some(CellStatus::LowEvidence),
            "Off target" => Some(CellStatus::OffTarget),
            "Over capacity" => Some(CellStatus::OverCapacity),
            "Not run" => Some(CellStatus::NotRun),
            _ => {
                if let Some(reason) = text.strip_prefix("Delivered in bursts: ") {
                    let reason = reason.trim();
                    return (!reason.is_empty()).then(|| CellStatus::Bursts(reason.to_owned()));
                }
                if let Some(reason) = text.strip_prefix("Shed: ") {
                    let reason = reason.trim();
                    return (!reason.is_empty()).then(|| CellStatus::Shed(reason.to_owned()));
                }
                let reason = text.strip_prefix("Error: ")?.trim();
                if reason.is_empty() {
                    None
                } else {
                    Some(CellStatus::Error(reason.to_owned()))
                }
            }
        }
    }

    /// Whether the cell holds measured figures that are shown but not trusted (greyed, kept
    /// out of ratios and scales): `Low evidence`, `Off target` and `Delivered in bursts`.
    pub fn is_caveated(&self) -> bool {
        matches!(
            self,
            CellStatus::LowEvidence | CellStatus::OffTarget | CellStatus::Bursts(_)
        )
    }

    /// A short machine name: `valid`, `low-evidence`, `off-target`, `over-capacity`, `not-run`,
    /// `error`, `shed`, `bursts` (CSS classes, data attributes).
    pub fn slug(&self) -> &'static str {
        match self {
            CellStatus::Valid => "valid",
            CellStatus::LowEvidence => "low-evidence",
            CellStatus::OffTarget => "off-target",
            CellStatus::OverCapacity => "over-capacity",
            CellStatus::NotRun => "not-run",
            CellStatus::Error(_) => "error",
            CellStatus::Shed(_) => "shed",
            CellStatus::Bursts(_) => "bursts",
        }
    }
}

impl fmt::Display for CellStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CellStatus::Valid => f.write_str("Valid"),
            CellStatus::LowEvidence => f.write_str("Low evidence"),
            CellStatus::OffTarget => f.write_str("Off target"),
            CellStatus::OverCapacity => f.write_str("Over capacity"),
            CellStatus::NotRun => f.write_str("Not run"),
            CellStatus::Error(reason) => write!(f, "Error: {reason}"),
            CellStatus::Shed(reason) => write!(f, "Shed: {reason}"),
            CellStatus::Bursts(reason) => write!(f, "Delivered in bursts: {reason}"),
        }
    }
}

impl Serialize for CellStatus {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for CellStatus {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        CellStatus::parse(&text).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "unknown status {text:?}, expected \"Valid\", \"Low evidence\", \"Off target\", \"Over capacity\", \"Not run\", \"Error: <reason>\", \"Shed: <reason>\" or \"Delivered in bursts: <reason>\""
            ))
        })
    }
}

impl Hardware {
    /// The hardware part of the page title: `label` when set, else
    /// `<gpu>[ <memory>GB][ ×<count>]` (e.g. `RTX PRO 6000 Blackwell Server Edition 96GB ×4`),
    /// `None` when nothing is known.
    pub fn summary(&self) -> Option<String> {
        if let Some(label) = &self.label {
            return Some(label.clone());
        }
        self.derived_summary()
    }

    /// The summary built from the individual fields, ignoring `label`.
    pub fn derived_summary(&self) -> Option<String> {
        let gpu = self.gpu.as_ref()?;
        let mut summary = gpu.clone();
        if let Some(memory) = self.memory_per_gpu_gb {
            summary.push_str(&format!(" {memory}GB"));
        }
        if let Some(count) = self.gpu_count {
            summary.push_str(&format!(" ×{count}"));
        }
        Some(summary)
    }
}

impl ModelInfo {
    /// The model name for the title: the display name, else the served model, else the model path.
    pub fn title_name(&self) -> Option<&str> {
        self.display_name
            .as_deref()
            .or(self.served_model.as_deref())
            .or(self.model_path.as_deref())
    }
}

impl DecodeCell {
    /// A cell that carries only a status (Over capacity, Not run, or an Error without figures).
    pub fn status_only(context_tokens: u64, concurrency: u32, status: CellStatus) -> DecodeCell {
        DecodeCell {
            tokens_per_step: None,
            prompt_cache: None,
            first_tokens: None,
            context_tokens,
            concurrency,
            status,
            total_tok_s: None,
            per_request_tok_s: None,
            ttft_ms: None,
            tbt_ms: None,
            average_active_requests: None,
            completed_requests: None,
            output_tokens: None,
            measured_for_s: None,
            prompt_tokens: None,
            prefill_overlap_share: None,
            overlapping_prefills: None,
            slo_attainment: None,
            goodput_tok_s: None,
            server_state: None,
            tails: None,
            production_in_flight: None,
        }
    }

    /// Whether any measured column holds a value.
    pub fn has_figures(&self) -> bool {
        self.total_tok_s.is_some()
            || self.per_request_tok_s.is_some()
            || self.ttft_ms.is_some()
            || self.tbt_ms.is_some()
            || self.average_active_requests.is_some()
            || self.completed_requests.is_some()
            || self.output_tokens.is_some()
            || self.measured_for_s.is_some()
            || self.prompt_tokens.is_some()
            || self.prefill_overlap_share.is_some()
            || self.overlapping_prefills.is_some()
            || self.slo_attainment.is_some()
            || self.goodput_tok_s.is_some()
            || self.server_state.is_some()
            || self.tails.is_some()
            || self.production_in_flight.is_some()
    }
}

impl MatrixDoc {
    /// An empty document with the current schema tag.
    pub fn new(metadata: Metadata) -> MatrixDoc {
        MatrixDoc {
            schema: SCHEMA.to_owned(),
            metadata,
            prefill: Vec::new(),
            decode: Vec::new(),
        }
    }

    /// The decode cell at `context_tokens` × `concurrency`, if present.
    pub fn cell(&self, context_tokens: u64, concurrency: u32) -> Option<&DecodeCell> {
        self.decode
            .iter()
            .find(|cell| cell.context_tokens == context_tokens && cell.concurrency == concurrency)
    }

    /// Every decode cell by (context, concurrency): for renderers that look up a whole grid, so
    /// a large matrix costs one pass instead of one scan per cell.
    pub fn cell_index(&self) -> HashMap<(u64, u32), &DecodeCell> {
        self.decode
            .iter()
            .map(|cell| ((cell.context_tokens, cell.concurrency), cell))
            .collect()
    }

    /// The prefill row at `context_tokens`, if present.
    pub fn prefill_row(&self, context_tokens: u64) -> Option<&PrefillRow> {
        self.prefill
            .iter()
            .find(|row| row.context_tokens == context_tokens)
    }

    /// Decode contexts, ascending, without repeats.
    pub fn contexts(&self) -> Vec<u64> {
        let set: BTreeSet<u64> = self.decode.iter().map(|cell| cell.context_tokens).collect();
        set.into_iter().collect()
    }

    /// Decode concurrency levels, ascending, without repeats.
    pub fn concurrencies(&self) -> Vec<u32> {
        let set: BTreeSet<u32> = self.decode.iter().map(|cell| cell.concurrency).collect();
        set.into_iter().collect()
    }

    /// Prefill contexts, ascending, without repeats.
    pub fn prefill_contexts(&self) -> Vec<u64> {
        let set: BTreeSet<u64> = self.prefill.iter().map(|row| row.context_tokens).collect();
        set.into_iter().collect()
    }

    /// Sorts prefill rows by context and decode cells by context, then concurrency: the order every
    /// rendering uses. Importers return documents in this order.
    pub fn sort(&mut self) {
        self.prefill.sort_by_key(|row| row.context_tokens);
        self.decode
            .sort_by_key(|cell| (cell.context_tokens, cell.concurrency));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokentap_base::wallclock::is_rfc3339;

    #[test]
    fn status_text_round_trips() {
        for status in [
            CellStatus::Valid,
            CellStatus::LowEvidence,
            CellStatus::OffTarget,
            CellStatus::OverCapacity,
            CellStatus::NotRun,
            CellStatus::Error("stream reset after 12 tokens".to_owned()),
            CellStatus::Shed("12 of 40 requests shed".to_owned()),
        ] {
            assert_eq!(CellStatus::parse(&status.to_string()), Some(status.clone()));
            let json = serde_json::to_string(&status).unwrap();
            assert_eq!(serde_json::from_str::<CellStatus>(&json).unwrap(), status);
        }
        assert_eq!(CellStatus::parse("Error: "), None);
        assert_eq!(CellStatus::parse("Shed: "), None);
        assert_eq!(CellStatus::shed("a\nb").slug(), "shed");
        assert_eq!(CellStatus::parse("valid"), None);
        assert_eq!(
            CellStatus::error("  line one\nline two\t "),
            CellStatus::Error("line one line two".to_owned())
        );
        assert_eq!(
            CellStatus::error("\n"),
            CellStatus::Error("unknown".to_owned())
        );
    }

    #[test]
    fn rfc3339_shapes() {
        for good in [
            "2025-06-01T12:00:00Z",
            "2025-06-01T12:00:00.123456Z",
            "2025-06-01T12:00:00+02:00",
            "2025-06-01 12:00:60-11:30",
        ] {
            assert!(is_rfc3339(good), "{good}");
        }
        for bad in [
            "",
            "2025-06-01",
            "2025-13-01T12:00:00Z",
            "2025-06-01T12:00:00",
            "2025-06-01T12:00:00.Z",
            "2025-06-01T12:00:00+0200",
            "2025-06-01T12:00:00Zjunk",
            "２０２５-06-01T12:00:00Z",
        ] {
            assert!(!is_rfc3339(bad), "{bad}");
        }
    }
}
