//! What a sweep would do, before it starts ([`PlanPreview`]): `tokentap sweep --dry-run`,
//! `POST /sweeps?dry_run=true` and the page's confirmation show it, so that nobody starts a
//! sweep against a loaded server without seeing its cells, its largest prompt, the KV cache it
//! asks for and how long it is expected to take.

use serde::{Deserialize, Serialize};

use super::plan::{Plan, PrefillTarget};
use crate::base::duration::human_duration;
use crate::matrix::units::context_label;

/// One decode cell of the plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PreviewCell {
    pub context_tokens: u64,
    pub concurrency: u32,
    /// False when the cell is over the KV budget and will not run.
    pub runs: bool,
}

/// A resolved plan, summed up for a person deciding whether to start it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanPreview {
    pub model: String,
    pub engine: Option<String>,
    /// Every decode cell, ascending by context then concurrency.
    pub cells: Vec<PreviewCell>,
    /// Decode cells that run (not over capacity).
    pub runnable_cells: usize,
    /// Prefill scouts, in the order they run.
    pub prefill: Vec<PrefillTarget>,
    /// Scouts plus runnable cells.
    pub measurements: usize,
    /// The longest prompt any request sends.
    pub largest_prompt_tokens: u64,
    pub max_output_tokens: u64,
    pub kv_budget_tokens: Option<u64>,
    pub kv_source: String,
    /// The most KV cache one runnable cell asks for (C × (context + max output)), and its share
    /// of the budget when the budget is known.
    pub peak_kv_tokens: u64,
    pub peak_kv_share: Option<f64>,
    pub cell_duration_s: f64,
    /// Seconds the sweep is expected to take if nothing pauses it (a capacity search measures
    /// at most this many cells, so it is an upper bound there).
    pub expected_duration_s: f64,
    /// A capacity search (`find_capacity`): only the cells the answer needs run.
    pub capacity_search: bool,
    /// Production requests in flight through this proxy now (a start would be refused while
    /// any are, unless `beside_production`).
    pub production_in_flight: u64,
    /// What resolving decided (the default plan cut to its bound, and what it left out).
    pub notes: Vec<String>,
    /// The requests are shaped like production's traffic (`like_production`): the shape in
    /// words; absent for the seed method.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub like_production: Option<String>,
    /// The plan itself, as the runner would execute it.
    pub plan: Plan,
}

/// The label of the page's box that lets a sweep start beside production traffic (the
/// preview's in-flight line names it, beside the CLI's `--beside-production`).
pub const BESIDE_PRODUCTION_BOX: &str = "Run beside production";

impl PlanPreview {
    pub fn new(plan: Plan, production_in_flight: u64) -> Self {
        let cells = plan
            .decode_contexts()
            .into_iter()
            .flat_map(|context| {
                plan.concurrency
                    .iter()
                    .map(move |&concurrency| (context, concurrency))
            })
            .map(|(context, concurrency)| PreviewCell {
                context_tokens: context,
                concurrency,
                runs: !plan.over_capacity(context, concurrency),
            })
            .collect();
        let peak_kv_tokens = plan.peak_kv_tokens();
        Self {
            model: plan.model.clone(),
            engine: plan.engine.map(|e| e.name().to_owned()),
            cells,
            runnable_cells: plan.runnable_cells(),
            prefill: plan.steps.clone(),
            measurements: plan.measurements(),
            largest_prompt_tokens: plan.largest_prompt_tokens(),
            max_output_tokens: plan.max_output,
            kv_budget_tokens: plan.kv_budget_tokens,
            kv_source: plan.kv_source.clone(),
            peak_kv_tokens,
            peak_kv_share: plan
                .kv_budget_tokens
                .filter(|&budget| budget > 0)
                .map(|budget| peak_kv_tokens as f64 / budget as f64),
            cell_duration_s: plan.cell_duration_s,
            expected_duration_s: plan.expected_duration_s(),
            capacity_search: plan.capacity.is_some(),
            production_in_flight,
            notes: plan.notes.clone(),
            like_production: plan.like_production.as_ref().map(|s| s.describe()),
            plan,
        }
    }

    /// The preview as lines for a terminal or a page (each under 120 columns but the notes
    /// and the production-in-flight line, which wrap where they are shown): token counts
    /// rounded (`16K`, `1.5 M of 1.9 M tokens`), each skipped cell named with its reason.
    pub fn lines(&self) -> Vec<String> {
        let contexts: Vec<String> = self
            .plan
            .decode_contexts()
            .into_iter()
            .map(context_label)
            .collect();
        let levels: Vec<String> = self.plan.concurrency.iter().map(u32::to_string).collect();
        let mut lines = vec![
            format!(
                "Model {}{}",
                self.model,
                self.engine
                    .as_deref()
                    .map(|e| format!(" ({e})"))
                    .unwrap_or_default()
            ),
            format!(
                "Decode cells: {} of {} run (contexts {}; concurrency {}){}",
                self.runnable_cells,
                self.cells.len(),
                contexts.join(", "),
                levels.join(", "),
                if self.capacity_search {
                    "; a capacity search measures only the cells its answer needs"
                } else {
                    ""
                }
            ),
            format!(
                "Prefill scouts: {} (largest prompt {} tokens, max output {} tokens)",
                self.prefill.len(),
                token_count(self.largest_prompt_tokens),
                token_count(self.max_output_tokens)
            ),
            match (self.kv_budget_tokens, self.peak_kv_share) {
                (Some(budget), Some(share)) => format!(
                    "KV cache: the largest cell asks for {} of {} tokens ({:.0} %; {})",
                    token_count(self.peak_kv_tokens),
                    token_count(budget),
                    share * 100.0,
                    self.kv_source
                ),
                _ => format!(
                    "KV cache: the largest cell asks for {} tokens; budget {}",
                    token_count(self.peak_kv_tokens),
                    self.kv_source
                ),
            },
            format!(
                "Expected duration: about {} ({} measurements, {} per cell window), if nothing pauses it",
                human_duration(self.expected_duration_s),
                self.measurements,
                human_duration(self.cell_duration_s)
            ),
        ];
        lines.extend(self.skipped_lines());
        lines.push(match &self.like_production {
            Some(shape) => format!(
                "Requests: shaped {shape} (cells labelled like-production, never compared with seed-method sweeps)"
            ),
            None => "Requests: the seed method (identical warm streams of max output)".to_owned(),
        });
        if self.production_in_flight > 0 {
            lines.push(format!(
                "Production in flight now: {} requests. A start is refused unless it runs beside them: tick \"{BESIDE_PRODUCTION_BOX}\" on the page, or pass --beside-production on the command line",
                self.production_in_flight
            ));
        }
        lines.extend(self.notes.iter().cloned());
        lines
    }
}

impl PlanPreview {
    /// One line per context with cells that will not run, each named with why: over the KV
    /// budget, C × (context + max output) tokens against it.
    pub fn skipped_lines(&self) -> Vec<String> {
        let mut lines = Vec::new();
        for context in self.plan.decode_contexts() {
            let skipped: Vec<&PreviewCell> = self
                .cells
                .iter()
                .filter(|c| c.context_tokens == context && !c.runs)
                .collect();
            if skipped.is_empty() {
                continue;
            }
            let budget = self
                .kv_budget_tokens
                .map_or_else(|| "unknown".to_owned(), token_count);
            let levels: Vec<String> = skipped.iter().map(|c| c.concurrency.to_string()).collect();
            // The smallest skipped cell's demand: every larger one asks for more.
            let least = skipped.iter().map(|c| c.concurrency).min().unwrap_or(0);
            let demand =
                u64::from(least).saturating_mul(context.saturating_add(self.max_output_tokens));
            lines.push(format!(
                "Skipped {} × {}: over the KV budget of {budget} tokens (C × (context + max output) is {}{} tokens)",
                context_label(context),
                levels.join(", "),
                if skipped.len() > 1 { "from " } else { "" },
                token_count(demand)
            ));
        }
        lines
    }
}

/// A token count for a person: `512`, `16K`, `1.5K`, `1.5 M` (K and M of 1,024, as context
/// labels are).
pub fn token_count(tokens: u64) -> String {
    const K: u64 = 1024;
    const M: u64 = 1024 * 1024;
    let tenths = |value: f64| {
        let text = format!("{value:.1}");
        text.strip_suffix(".0").map_or(text.clone(), str::to_owned)
    };
    if tokens < K {
        tokens.to_string()
    } else if tokens < M {
        if tokens % K == 0 {
            format!("{}K", tokens / K)
        } else {
            format!("{}K", tenths(tokens as f64 / K as f64))
        }
    } else {
        format!("{} M", tenths(tokens as f64 / M as f64))
    }
}

#[cfg(test)]
mod tests {
    use super::token_count;

    #[test]
    fn token_counts_are_rounded_and_named() {
        assert_eq!(token_count(512), "512");
        assert_eq!(token_count(16_384), "16K");
        assert_eq!(token_count(1_536), "1.5K");
        assert_eq!(token_count(1_572_864), "1.5 M");
        assert_eq!(token_count(1_966_080), "1.9 M");
        assert_eq!(token_count(2_097_152), "2 M");
    }
}
