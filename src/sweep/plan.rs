//! The sweep plan: the resolved [`Plan`] the runner executes — contexts, concurrency levels,
//! window, max output, KV budget, which cells are over capacity, and how long every prompt is.
//! What the server says about itself ([`ServerFacts`]) is `facts.rs`, what the user asks for
//! ([`SweepRequest`]) is `request.rs` (both re-exported here); resolving the one against the
//! other is `resolve.rs`; this file's tests cover the resolving too.
//!
//! Pure: no I/O, no clock. Defaults follow the seed tool: top context = context
//! length − max output − 1024, contexts doubling from 8K below it, concurrency 1…128 doubling,
//! and a prefill row at the full context length. sglang refuses a request whose prompt plus
//! `max_tokens` reaches the context length, and one of `max_req_input_len` (context − 5) tokens
//! or more, so that row's prompt is the longest the server accepts (context − 6 on sglang,
//! context − 2 elsewhere); its `prompt_tokens` says so.

use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use super::facts::ServerFacts;
pub use super::request::{DurationValue, PromptMode, SweepRequest, TokensValue};
use super::shape::ProductionShape;
use crate::base::duration::human_duration;
use crate::base::engine::Engine;
use crate::matrix::capacity::CapacityQuery;
use crate::matrix::units::context_label;

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
    /// Which engine answers: how streams are aborted and tokenized, which gauges say its load.
    #[serde(default, with = "crate::base::engine::by_name")]
    pub engine: Option<Engine>,
    /// The `x-tokentap-slo` header value of every stream (validated), if the request set one.
    pub slo_header: Option<String>,
    /// A capacity search instead of the whole ladder (`find_capacity`): the question each
    /// context's cells are judged by.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<CapacityQuery>,
    /// What resolving decided that the reader should know (the default plan cut to its
    /// duration bound, and what was left out); copied into the matrix's notes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// The cells are shaped like production's traffic (`like_production`): its shape per
    /// context, read from the production matrix when the sweep starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub like_production: Option<ProductionShape>,
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

    /// Seconds the plan is expected to take, before anything is measured: each runnable
    /// cell its window plus the default overhead, each scout its prompt at the default
    /// prefill rate (`sweep::estimate`). A capacity search measures at most this many cells.
    pub fn expected_duration_s(&self) -> f64 {
        let scouts: Vec<u64> = self.steps.iter().map(|s| s.prompt_tokens).collect();
        super::estimate::eta_s(
            self.cell_duration_s,
            &[],
            None,
            &scouts,
            self.runnable_cells(),
        )
    }

    /// The longest prompt any request of the plan sends.
    pub fn largest_prompt_tokens(&self) -> u64 {
        self.steps
            .iter()
            .map(|s| s.prompt_tokens)
            .max()
            .unwrap_or(0)
    }

    /// The most KV cache one runnable cell asks for: C × (context + max output) tokens.
    pub fn peak_kv_tokens(&self) -> u64 {
        self.decode_contexts()
            .iter()
            .flat_map(|&context| {
                self.concurrency
                    .iter()
                    .filter(move |&&c| !self.over_capacity(context, c))
                    .map(move |&c| {
                        u64::from(c).saturating_mul(context.saturating_add(self.max_output))
                    })
            })
            .max()
            .unwrap_or(0)
    }

    /// Cuts the plan to be expected to end within `bound`: the full-context prefill row and
    /// the largest decode contexts first (down to one), then the highest concurrency levels
    /// (down to one). Each cut is written into `notes`. Zero: no bound.
    pub fn fit_within(&mut self, bound: Duration) {
        if bound.is_zero() {
            return;
        }
        let limit = bound.as_secs_f64();
        let before = self.expected_duration_s();
        if before <= limit {
            return;
        }
        let mut dropped_contexts = Vec::new();
        let mut dropped_levels = Vec::new();
        while self.expected_duration_s() > limit {
            let decode = self.steps.iter().filter(|s| s.decode).count();
            if let Some(at) = self.steps.iter().position(|s| !s.decode) {
                let step = self.steps.remove(at);
                dropped_contexts.push(format!(
                    "the full-context prefill ({})",
                    context_label(step.context)
                ));
            } else if decode > 1 {
                if let Some(step) = self.steps.pop() {
                    dropped_contexts.push(context_label(step.context));
                }
            } else if self.concurrency.len() > 1 {
                if let Some(level) = self.concurrency.pop() {
                    dropped_levels.push(level.to_string());
                }
            } else {
                break;
            }
        }
        let mut left_out = Vec::new();
        if !dropped_contexts.is_empty() {
            left_out.push(format!("contexts {}", dropped_contexts.join(", ")));
        }
        if !dropped_levels.is_empty() {
            left_out.push(format!("concurrency {}", dropped_levels.join(", ")));
        }
        self.notes.push(format!(
            "The default plan was cut to fit sweep.max_default_duration ({}; it would have taken about {}): {} left out. Ask for them with an explicit plan (--contexts and --concurrency on the command line, contexts and concurrency in a POST /sweeps plan).",
            human_duration(limit),
            human_duration(before),
            left_out.join("; ")
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::SweepConfig;

    fn config() -> SweepConfig {
        SweepConfig {
            production_guard: 4,
            cell_duration: Duration::from_secs(30),
            max_output: 4096,
            kv_budget_tokens: 0,
            max_default_duration: Duration::ZERO,
        }
    }

    fn step_facts() -> ServerFacts {
        ServerFacts {
            engine: Some(Engine::SGLANG),
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
    fn the_default_plan_is_cut_to_its_duration_bound_and_an_explicit_one_is_not() {
        let bounded = SweepConfig {
            max_default_duration: Duration::from_secs(600),
            ..config()
        };
        let full = Plan::resolve(&SweepRequest::default(), &step_facts(), &config()).unwrap();
        assert!(
            full.expected_duration_s() > 600.0,
            "{}",
            full.expected_duration_s()
        );
        let plan = Plan::resolve(&SweepRequest::default(), &step_facts(), &bounded).unwrap();
        assert!(
            plan.expected_duration_s() <= 600.0,
            "{}",
            plan.expected_duration_s()
        );
        // The full-context prefill and the largest contexts went first.
        assert!(plan.steps.iter().all(|s| s.decode));
        assert_eq!(plan.steps.first().map(|s| s.context), Some(8 << 10));
        assert!(plan.steps.len() < full.steps.len());
        assert_eq!(plan.notes.len(), 1);
        let note = &plan.notes[0];
        assert!(
            note.contains("cut to fit sweep.max_default_duration (10m 00s")
                && note.contains("256K")
                && note.contains("explicit plan"),
            "{note}"
        );
        // Asking for contexts (or concurrency) is an explicit plan: never cut.
        let explicit = SweepRequest {
            contexts: Some(
                full.decode_contexts()
                    .into_iter()
                    .map(TokensValue::Count)
                    .collect(),
            ),
            ..SweepRequest::default()
        };
        let plan = Plan::resolve(&explicit, &step_facts(), &bounded).unwrap();
        assert!(plan.notes.is_empty());
        assert!(plan.expected_duration_s() > 600.0);
        // The preview's figures.
        assert_eq!(full.largest_prompt_tokens(), 262_142);
        assert_eq!(full.peak_kv_tokens(), 16 * (32_768 + 4096));
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
