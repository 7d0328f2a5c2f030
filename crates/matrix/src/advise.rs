//! Advice for the engine's own limits: from a matrix and the SLO, per context, the concurrency
//! cap (the capacity: sglang `--max-running-requests`, vLLM `--max-num-seqs`) and the queue caps
//! (vLLM `--max-num-queued-tokens` and `--max-num-queued-reqs`, sglang `--max-queued-requests`),
//! each with the figures it came from (docs/capacity.md, "Advice for the engine's limits").
//!
//! The queue caps keep a waiting request within the TTFT target: a request that waits behind
//! others starts its own prefill once theirs are done, and then needs what a request at the
//! capacity needs to its first token. So the time a queue may hold is the TTFT target less the
//! capacity cell's median TTFT, and the prompt tokens that the server prefills in that time at
//! the measured prefill rate (the context's prefill row) are the tokens that may wait:
//!
//! * wait budget = TTFT target − TTFT at the capacity;
//! * `--max-num-queued-tokens` = ⌊wait budget × prefill tok/s⌋;
//! * `--max-num-queued-reqs` = `--max-queued-requests` = ⌊queued tokens ÷ context tokens⌋
//!   (each waiting request of this context takes context ÷ prefill tok/s seconds of prefill).
//!
//! The engine's flags are one value for the whole server; [`EngineAdvice::overall`] picks it:
//!
//! * the running cap: the smallest capacity among the contexts a judged cell's SLO miss limits
//!   (a context the KV cache stops is held there by the engine's own KV admission); with none,
//!   the largest capacity measured;
//! * the queued tokens: the smallest over the contexts (a token budget that keeps every context
//!   within its target);
//! * the queued requests: that token budget ÷ the shortest context's tokens (the most requests
//!   of any context that fit it; vLLM applies both caps, so longer prompts stop at the token
//!   cap; sglang, which has no token cap, lets a queue of longer prompts wait longer).
//!
//! Pure: a document and a capacity report in, advice out.
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use super::capacity::{capacity_text, CapacityReport, Targets};
use super::doc::{CellStatus, MatrixDoc};
use super::markdown::escape as md_escape;
use super::units::{context_label, format_decimal, format_rate, MISSING};

/// The schema tag of the advice's JSON.
pub const ADVICE_SCHEMA: &str = "tokentap.engine-advice/v1";

/// One context's advice and the figures it rests on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContextAdvice {
    pub context_tokens: u64,
    /// The capacity under the SLO (the concurrency cap); `None` when no cell could be judged.
    pub capacity: Option<u32>,
    /// No judged cell above the capacity missed: the cap may be set higher once measured.
    pub capacity_is_lower_bound: bool,
    /// A judged cell missed the SLO (the capacity is the SLO's, not the KV cache's).
    pub limited_by_slo: bool,
    /// sglang `--max-running-requests`, vLLM `--max-num-seqs`: the capacity (`None` when it
    /// is unknown or 0: nothing meets the SLO at this context).
    pub max_running_requests: Option<u32>,
    /// The context's measured prefill rate (its prefill row), prompt tok/s.
    pub prefill_tok_s: Option<f64>,
    /// The capacity cell's median TTFT, ms.
    pub ttft_at_capacity_ms: Option<f64>,
    /// The TTFT target, ms.
    pub ttft_target_ms: Option<f64>,
    /// Prefill time of one request of this context: context ÷ prefill tok/s, ms.
    pub prefill_per_request_ms: Option<f64>,
    /// TTFT target − TTFT at the capacity, ms (may be negative: no time to wait).
    pub wait_budget_ms: Option<f64>,
    /// vLLM `--max-num-queued-tokens`: ⌊max(0, wait budget) × prefill tok/s⌋.
    pub max_num_queued_tokens: Option<u64>,
    /// vLLM `--max-num-queued-reqs`, sglang `--max-queued-requests`: ⌊queued tokens ÷
    /// context tokens⌋.
    pub max_queued_requests: Option<u64>,
    /// Why a figure is missing (no TTFT target, no prefill row, no capacity), when one is.
    pub note: Option<String>,
}

/// The engine-wide values, each with the context that sets it (the module's doc says how each
/// is picked).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct OverallAdvice {
    pub max_running_requests: Option<(u32, u64)>,
    pub max_num_queued_tokens: Option<(u64, u64)>,
    pub max_queued_requests: Option<(u64, u64)>,
}

/// The advice for every context of a document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EngineAdvice {
    /// Always [`ADVICE_SCHEMA`].
    pub schema: String,
    pub title: String,
    pub targets: Targets,
    pub contexts: Vec<ContextAdvice>,
    /// (value, the context that sets it) for each flag.
    pub overall: OverallAdvice,
}

/// The advice from `doc` and its capacity report under the SLO's targets.
pub fn advise(doc: &MatrixDoc, report: &CapacityReport) -> EngineAdvice {
    let contexts: Vec<ContextAdvice> = report
        .contexts
        .iter()
        .map(|context| {
            let prefill = doc
                .prefill
                .iter()
                .find(|row| row.context_tokens == context.context_tokens && row.status.is_valid())
                .and_then(|row| row.prompt_tok_s)
                .filter(|rate| rate.is_finite() && *rate > 0.0);
            let capacity_cell = context.capacity.filter(|c| *c > 0).and_then(|c| {
                doc.decode.iter().find(|cell| {
                    cell.context_tokens == context.context_tokens
                        && cell.concurrency == c
                        && cell.status == CellStatus::Valid
                })
            });
            ContextAdvice {
                limited_by_slo: context.cells.iter().any(|verdict| !verdict.meets),
                ..context_advice(
                    context.context_tokens,
                    context.capacity,
                    !context.boundary_seen,
                    prefill,
                    capacity_cell.and_then(|c| c.ttft_ms),
                    report.targets.ttft_ms,
                )
            }
        })
        .collect();
    EngineAdvice {
        schema: ADVICE_SCHEMA.to_owned(),
        title: report.title.clone(),
        targets: report.targets,
        overall: overall(&contexts),
        contexts,
    }
}

/// The engine-wide values from the contexts' (the rules of the module's doc).
pub fn overall(contexts: &[ContextAdvice]) -> OverallAdvice {
    let running = |c: &ContextAdvice| c.max_running_requests.map(|v| (v, c.context_tokens));
    let max_running_requests = contexts
        .iter()
        .filter(|c| c.limited_by_slo)
        .filter_map(running)
        .min_by_key(|(v, _)| *v)
        .or_else(|| contexts.iter().filter_map(running).max_by_key(|(v, _)| *v));
    let max_num_queued_tokens = contexts
        .iter()
        .filter_map(|c| c.max_num_queued_tokens.map(|v| (v, c.context_tokens)))
        .min_by_key(|(v, _)| *v);
    let shortest = contexts
        .iter()
        .map(|c| c.context_tokens)
        .filter(|t| *t > 0)
        .min();
    let max_queued_requests = match (max_num_queued_tokens, shortest) {
        (Some((tokens, _)), Some(shortest)) => Some((tokens / shortest, shortest)),
        _ => None,
    };
    OverallAdvice {
        max_running_requests,
        max_num_queued_tokens,
        max_queued_requests,
    }
}

/// One context's advice from its figures (the arithmetic of the module's doc).
pub fn context_advice(
    context_tokens: u64,
    capacity: Option<u32>,
    capacity_is_lower_bound: bool,
    prefill_tok_s: Option<f64>,
    ttft_at_capacity_ms: Option<f64>,
    ttft_target_ms: Option<f64>,
) -> ContextAdvice {
    let prefill_per_request_ms = prefill_tok_s.map(|rate| context_tokens as f64 / rate * 1000.0);
    let wait_budget_ms = match (ttft_target_ms, ttft_at_capacity_ms) {
        (Some(target), Some(at_capacity)) => Some(target - at_capacity),
        _ => None,
    };
    let max_num_queued_tokens = match (wait_budget_ms, prefill_tok_s) {
        (Some(budget), Some(rate)) => Some((budget.max(0.0) / 1000.0 * rate).floor() as u64),
        _ => None,
    };
    let max_queued_requests = max_num_queued_tokens
        .filter(|_| context_tokens > 0)
        .map(|tokens| tokens / context_tokens);
    let mut missing = Vec::new();
    match capacity {
        None => missing.push("no cell could be judged, so no capacity".to_owned()),
        Some(0) => missing.push("even the lowest judged cell misses the SLO".to_owned()),
        Some(_) => {}
    }
    if ttft_target_ms.is_none() {
        missing.push("no TTFT target: the queue caps keep a waiting request within it".to_owned());
    }
    if prefill_tok_s.is_none() {
        missing.push("no valid prefill row at this context".to_owned());
    }
    if capacity.is_some_and(|c| c > 0) && ttft_at_capacity_ms.is_none() {
        missing.push("the capacity cell has no TTFT".to_owned());
    }
    ContextAdvice {
        context_tokens,
        capacity,
        capacity_is_lower_bound,
        limited_by_slo: false,
        max_running_requests: capacity.filter(|c| *c > 0),
        prefill_tok_s,
        ttft_at_capacity_ms,
        ttft_target_ms,
        prefill_per_request_ms,
        wait_budget_ms,
        max_num_queued_tokens,
        max_queued_requests,
        note: (!missing.is_empty()).then(|| missing.join("; ")),
    }
}

fn or_dash<T>(value: Option<T>, show: impl Fn(T) -> String) -> String {
    value.map_or_else(|| MISSING.to_owned(), show)
}

/// The advice as Markdown: the engine-wide flags, then one row per context with its figures.
pub fn render_advice_markdown(advice: &EngineAdvice) -> String {
    let mut out = String::from("## Engine limits advised\n\n");
    let _ = writeln!(
        out,
        "From the capacity under {} and the measured prefill rate (docs/capacity.md, \"Advice for the engine's limits\").\n",
        md_escape(&advice.targets.describe())
    );
    let overall = &advice.overall;
    let flag = |value: Option<String>, context: Option<u64>| match (value, context) {
        (Some(value), Some(context)) => format!("{value} (set by {})", context_label(context)),
        _ => MISSING.to_owned(),
    };
    let _ = writeln!(
        out,
        "- sglang `--max-running-requests`, vLLM `--max-num-seqs`: {}",
        flag(
            overall.max_running_requests.map(|(v, _)| v.to_string()),
            overall.max_running_requests.map(|(_, c)| c)
        )
    );
    let _ = writeln!(
        out,
        "- vLLM `--max-num-queued-tokens`: {}",
        flag(
            overall.max_num_queued_tokens.map(|(v, _)| v.to_string()),
            overall.max_num_queued_tokens.map(|(_, c)| c)
        )
    );
    let _ = writeln!(
        out,
        "- vLLM `--max-num-queued-reqs`, sglang `--max-queued-requests`: {}\n",
        flag(
            overall.max_queued_requests.map(|(v, _)| v.to_string()),
            overall.max_queued_requests.map(|(_, c)| c)
        )
    );
    out.push_str("| Context | Capacity (running cap) | Prefill tok/s | Prefill per request | TTFT at capacity | TTFT target | Wait budget | Queued tokens | Queued requests | Note |\n");
    out.push_str("|---|---|---|---|---|---|---|---|---|---|\n");
    for context in &advice.contexts {
        let ms = |v: Option<f64>| or_dash(v, |v| format!("{} ms", format_decimal(v, 0)));
        let capacity = capacity_text_of(context);
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            context_label(context.context_tokens),
            capacity,
            or_dash(context.prefill_tok_s, format_rate),
            ms(context.prefill_per_request_ms),
            ms(context.ttft_at_capacity_ms),
            ms(context.ttft_target_ms),
            ms(context.wait_budget_ms),
            or_dash(context.max_num_queued_tokens, |v| v.to_string()),
            or_dash(context.max_queued_requests, |v| v.to_string()),
            md_escape(context.note.as_deref().unwrap_or("")),
        );
    }
    out
}

/// The capacity as the capacity report shows it (`≥ 8` for a lower bound).
fn capacity_text_of(context: &ContextAdvice) -> String {
    capacity_text(&super::capacity::ContextCapacity {
        context_tokens: context.context_tokens,
        capacity: context.capacity,
        boundary_seen: !context.capacity_is_lower_bound,
        judged_by: String::new(),
        goodput_tok_s: None,
        total_tok_s: None,
        limited_by: None,
        cells: Vec::new(),
        non_monotonic: Vec::new(),
        excluded: Vec::new(),
    })
}

/// The advice as pretty JSON (schema [`ADVICE_SCHEMA`]).
pub fn render_advice_json(advice: &EngineAdvice) -> String {
    tokentap_base::json::pretty_json_line(advice)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_queue_caps_are_the_wait_budget_prefilled_at_the_measured_rate() {
        // 8K context, prefill 16,384 tok/s (0.5 s per request), TTFT 400 ms at a capacity of
        // 8, target 2 s: 1.6 s of waiting = 26,214 tokens = 3 requests of 8,192.
        let advice = context_advice(
            8192,
            Some(8),
            false,
            Some(16_384.0),
            Some(400.0),
            Some(2000.0),
        );
        assert_eq!(advice.max_running_requests, Some(8));
        assert_eq!(advice.prefill_per_request_ms, Some(500.0));
        assert_eq!(advice.wait_budget_ms, Some(1600.0));
        assert_eq!(advice.max_num_queued_tokens, Some(26_214));
        assert_eq!(advice.max_queued_requests, Some(3));
        assert_eq!(advice.note, None);
        // TTFT at the capacity already past the target: nothing may wait.
        let none = context_advice(
            8192,
            Some(8),
            false,
            Some(16_384.0),
            Some(2500.0),
            Some(2000.0),
        );
        assert_eq!(
            (none.max_num_queued_tokens, none.max_queued_requests),
            (Some(0), Some(0))
        );
        // Without a TTFT target only the running cap is advised, and the note says why.
        let untargeted = context_advice(8192, Some(8), true, Some(16_384.0), Some(400.0), None);
        assert_eq!(untargeted.max_running_requests, Some(8));
        assert_eq!(untargeted.max_num_queued_tokens, None);
        assert!(untargeted.note.unwrap().contains("no TTFT target"));
    }
}
