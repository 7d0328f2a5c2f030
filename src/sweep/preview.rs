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

    /// The preview as lines for a terminal or a page (each under 120 columns but the notes,
    /// which wrap where they are shown).
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
                self.largest_prompt_tokens,
                self.max_output_tokens
            ),
            match (self.kv_budget_tokens, self.peak_kv_share) {
                (Some(budget), Some(share)) => format!(
                    "KV cache: the largest cell asks for {} of {} tokens ({:.0} %; {})",
                    self.peak_kv_tokens,
                    budget,
                    share * 100.0,
                    self.kv_source
                ),
                _ => format!(
                    "KV cache: the largest cell asks for {} tokens; budget {}",
                    self.peak_kv_tokens, self.kv_source
                ),
            },
            format!(
                "Expected duration: about {} ({} measurements, {} per cell window), if nothing pauses it",
                human_duration(self.expected_duration_s),
                self.measurements,
                human_duration(self.cell_duration_s)
            ),
        ];
        lines.push(match &self.like_production {
            Some(shape) => format!(
                "Requests: shaped {shape} (cells labelled like-production, never compared with seed-method sweeps)"
            ),
            None => "Requests: the seed method (identical warm streams of max output)".to_owned(),
        });
        if self.production_in_flight > 0 {
            lines.push(format!(
                "Production in flight now: {} requests (a start is refused unless it runs beside production)",
                self.production_in_flight
            ));
        }
        lines.extend(self.notes.iter().cloned());
        lines
    }
}
