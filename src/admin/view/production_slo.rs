//! Whether production meets the SLO: per model, its production cells with evidence (`Valid`
//! under `[evidence]`) judged by their SLO attainment against the `[slo]` objective (e.g.
//! 99 %), the worst cell of each context and of the model, and the target it misses
//! ("32K×4 meets TTFT ≤ 2 s on 84.8 % of requests"). Live headroom (`headroom`) never
//! contradicts it, and the one verdict (`status`) cites it (docs/capacity.md, "Production
//! against the SLO").
//!
//! Only cells with evidence count: a cell below the evidence rule says nothing either way,
//! and a context without any rests on the sweep alone ("on warm prompts").
//!
//! Shed load is demand: requests the engine refused for load end in milliseconds, add almost
//! no load and sit in cells that are never `Valid`, so no cell's attainment sees them. A shed
//! share of the window's requests above the error budget (1 − the objective) is a miss of
//! its own ([`ShedDemand`]), whatever the admitted requests did.

use std::time::Duration;

use serde::Serialize;

use crate::aggregate::cell::OutcomeSum;
use crate::matrix::doc::{CellStatus, DecodeCell, MatrixDoc};
use crate::matrix::units::{context_label, format_percent};
use crate::meter::record::Outcome;
use crate::meter::slo::SloTargets;

/// One production cell with evidence, judged against the objective.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CellAttainment {
    pub context_tokens: u64,
    pub concurrency: u32,
    /// `32K×4`.
    pub cell: String,
    /// Share (0–1) of the cell's requests that met every target.
    pub attainment: f64,
    /// `attainment` ≥ the objective.
    pub meets: bool,
    /// The targets the cell's tail exceeds (`TTFT ≤ 2 s`), else every target: what it misses.
    pub target: String,
    /// Ids of those targets (`ttft`, `tbt`, `e2e`), for the gauge's `target` label.
    pub target_ids: Vec<&'static str>,
    /// `32K×4 meets TTFT ≤ 2 s on 84.8 % of requests`.
    pub text: String,
}

/// One context's production against the SLO.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ContextSlo {
    pub context_tokens: u64,
    /// Its cells with evidence and an attainment.
    pub cells_with_evidence: usize,
    /// Of those, the ones meeting the objective.
    pub cells_meeting: usize,
    /// The cell with the lowest attainment (`None`: no cell with evidence).
    pub worst: Option<CellAttainment>,
}

impl ContextSlo {
    /// Some cell of the context has evidence and misses the objective.
    pub fn misses(&self) -> bool {
        self.worst.as_ref().is_some_and(|w| !w.meets)
    }
}

/// A model's production against the SLO over a window.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProductionSlo {
    /// The `[slo]` objective of the model (0–1).
    pub objective: f64,
    /// The targets, as text (`TTFT ≤ 2 s, TBT ≤ 50 ms`).
    pub targets: String,
    pub cells_with_evidence: usize,
    pub cells_meeting: usize,
    /// The model's worst cell with evidence.
    pub worst: Option<CellAttainment>,
    /// Per context with production cells, ascending.
    pub contexts: Vec<ContextSlo>,
    /// Completed requests whose own cell was not judged (no evidence, delivered in bursts,
    /// failed, no attainment): what the verdict does not rest on.
    pub unjudged_requests: u64,
    /// Of those, the requests of cells delivered in bursts (their gaps were not decode steps).
    pub requests_in_bursts: u64,
    /// The engine shed more of the window's requests than the error budget allows: the model
    /// misses the SLO, whatever its cells say.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shed: Option<ShedDemand>,
}

/// Requests the engine shed past the error budget.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ShedDemand {
    /// Requests shed, of `requests` (every request in the window but client aborts).
    pub shed: u64,
    pub requests: u64,
    /// `shed ÷ requests`.
    pub share: f64,
    /// The error budget, 1 − the objective.
    pub budget: f64,
    /// `90.0% of requests (9 of 10) were shed by the engine, over the 1.0% error budget`.
    pub text: String,
}

/// The window's shed requests against the error budget of `objective`; `None` within it.
pub fn shed_demand(outcomes: &OutcomeSum, objective: f64) -> Option<ShedDemand> {
    let requests = outcomes.judged();
    let shed = outcomes.count(Outcome::Shed);
    let budget = (1.0 - objective).max(0.0);
    if requests == 0 || shed == 0 {
        return None;
    }
    let share = shed as f64 / requests as f64;
    (share > budget).then(|| ShedDemand {
        shed,
        requests,
        share,
        budget,
        text: format!(
            "{} of requests ({shed} of {requests}) were shed by the engine, over the {} error budget",
            format_percent(share),
            format_percent(budget)
        ),
    })
}

impl ProductionSlo {
    /// `; 340 completed requests sit in cells not judged (120 of them in cells delivered in
    /// bursts)`, or nothing when every request's cell was judged.
    pub fn unjudged_text(&self) -> String {
        if self.unjudged_requests == 0 {
            return String::new();
        }
        let bursts = if self.requests_in_bursts > 0 {
            format!(
                " ({} of them in cells delivered in bursts)",
                self.requests_in_bursts
            )
        } else {
            String::new()
        };
        format!(
            "; {} completed requests sit in cells not judged{bursts}",
            self.unjudged_requests
        )
    }

    /// Some cell with evidence misses the objective, or the engine sheds past the budget.
    pub fn misses(&self) -> bool {
        self.shed.is_some() || self.worst.as_ref().is_some_and(|w| !w.meets)
    }

    pub fn context(&self, context_tokens: u64) -> Option<&ContextSlo> {
        self.contexts
            .iter()
            .find(|c| c.context_tokens == context_tokens)
    }
}

/// `2 s`, `1.5 s`, `50 ms`.
pub fn duration_text(duration: Duration) -> String {
    let ms = duration.as_secs_f64() * 1000.0;
    if ms >= 1000.0 {
        let s = format!("{:.3}", ms / 1000.0);
        format!("{} s", s.trim_end_matches('0').trim_end_matches('.'))
    } else {
        let s = format!("{ms:.1}");
        format!("{} ms", s.trim_end_matches('0').trim_end_matches('.'))
    }
}

/// The targets as text: `TTFT ≤ 2 s, TBT ≤ 50 ms`.
pub fn targets_text(targets: &SloTargets) -> String {
    target_list(targets)
        .iter()
        .map(|(_, text, _)| text.clone())
        .collect::<Vec<_>>()
        .join(", ")
}

/// (id, text, target in ms) of each target set.
fn target_list(targets: &SloTargets) -> Vec<(&'static str, String, f64)> {
    let mut out = Vec::new();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    if let Some(t) = targets.ttft {
        out.push(("ttft", format!("TTFT ≤ {}", duration_text(t)), ms(t)));
    }
    if let Some(t) = targets.tbt {
        out.push(("tbt", format!("TBT ≤ {}", duration_text(t)), ms(t)));
    }
    if let Some(t) = targets.e2e {
        out.push(("e2e", format!("end to end ≤ {}", duration_text(t)), ms(t)));
    }
    out
}

/// The cell's highest-resolution tail of a target's figure: p99, else p90, else the median
/// (`None` for end to end, which a cell does not hold).
fn tail_of(cell: &DecodeCell, id: &str) -> Option<f64> {
    let tails = cell.tails.as_ref();
    match id {
        "ttft" => tails
            .and_then(|t| t.ttft_p99_ms.or(t.ttft_p90_ms))
            .or(cell.ttft_ms),
        "tbt" => tails
            .and_then(|t| t.tbt_p99_ms.or(t.tbt_p90_ms))
            .or(cell.tbt_ms),
        _ => None,
    }
}

/// Judges one cell; `None` unless it is `Valid` (has evidence) and has an attainment.
fn judge_cell(cell: &DecodeCell, targets: &SloTargets, objective: f64) -> Option<CellAttainment> {
    if !cell.status.is_valid() {
        return None;
    }
    let attainment = cell.slo_attainment.filter(|a| a.is_finite())?;
    let meets = attainment >= objective;
    let list = target_list(targets);
    // The targets the cell's tail exceeds name what it misses; where none does (or the cell
    // meets), every target is named.
    let exceeded: Vec<&(&'static str, String, f64)> = list
        .iter()
        .filter(|(id, _, target)| tail_of(cell, id).is_some_and(|v| v > *target))
        .collect();
    let named: Vec<&(&'static str, String, f64)> = if meets || exceeded.is_empty() {
        list.iter().collect()
    } else {
        exceeded
    };
    let target = named
        .iter()
        .map(|(_, text, _)| text.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    let label = format!(
        "{}×{}",
        context_label(cell.context_tokens),
        cell.concurrency
    );
    Some(CellAttainment {
        context_tokens: cell.context_tokens,
        concurrency: cell.concurrency,
        text: format!(
            "{label} meets {target} on {} of requests",
            format_percent(attainment)
        ),
        cell: label,
        attainment,
        meets,
        target,
        target_ids: named.iter().map(|(id, _, _)| *id).collect(),
    })
}

/// The lower attainment of two (the first on a tie).
fn worse(a: Option<CellAttainment>, b: &CellAttainment) -> Option<CellAttainment> {
    match a {
        Some(a) if a.attainment <= b.attainment => Some(a),
        _ => Some(b.clone()),
    }
}

/// Production (`doc`: a window's production matrix, evidence applied; `outcomes`: how the
/// same window's requests ended) against `targets` and `objective` (pure).
pub fn production_slo(
    doc: &MatrixDoc,
    outcomes: &OutcomeSum,
    targets: &SloTargets,
    objective: f64,
) -> ProductionSlo {
    let mut contexts = Vec::new();
    let (mut unjudged_requests, mut requests_in_bursts) = (0u64, 0u64);
    for context in doc.contexts() {
        let mut slo = ContextSlo {
            context_tokens: context,
            cells_with_evidence: 0,
            cells_meeting: 0,
            worst: None,
        };
        for cell in doc.decode.iter().filter(|c| c.context_tokens == context) {
            let Some(judged) = judge_cell(cell, targets, objective) else {
                let requests = cell.completed_requests.unwrap_or(0);
                unjudged_requests = unjudged_requests.saturating_add(requests);
                if matches!(cell.status, CellStatus::Bursts(_)) {
                    requests_in_bursts = requests_in_bursts.saturating_add(requests);
                }
                continue;
            };
            slo.cells_with_evidence += 1;
            slo.cells_meeting += usize::from(judged.meets);
            slo.worst = worse(slo.worst.take(), &judged);
        }
        contexts.push(slo);
    }
    let mut worst = None;
    for c in &contexts {
        if let Some(w) = &c.worst {
            worst = worse(worst, w);
        }
    }
    ProductionSlo {
        objective,
        targets: targets_text(targets),
        cells_with_evidence: contexts.iter().map(|c| c.cells_with_evidence).sum(),
        cells_meeting: contexts.iter().map(|c| c.cells_meeting).sum(),
        worst,
        contexts,
        unjudged_requests,
        requests_in_bursts,
        shed: shed_demand(outcomes, objective),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matrix::doc::Tails;

    fn cell(context: u64, concurrency: u32, status: CellStatus, attainment: f64) -> DecodeCell {
        let mut cell = DecodeCell::status_only(context, concurrency, status);
        cell.slo_attainment = Some(attainment);
        cell.ttft_ms = Some(900.0);
        cell.tbt_ms = Some(20.0);
        cell.tails = Some(Tails {
            ttft_p90_ms: Some(2600.0),
            ..Tails::default()
        });
        cell
    }

    #[test]
    fn the_worst_cell_with_evidence_names_the_target_its_tail_exceeds() {
        let mut doc = MatrixDoc::new(Default::default());
        doc.decode = vec![
            cell(8192, 4, CellStatus::Valid, 0.967),
            cell(32768, 4, CellStatus::Valid, 0.848),
            // No evidence: says nothing, however low.
            cell(65536, 4, CellStatus::LowEvidence, 0.1),
            // Delivered in bursts: its gaps are not decode steps, so it says nothing either.
            cell(65536, 8, CellStatus::Bursts("9 of 9 streams".into()), 0.1),
        ];
        doc.decode[2].completed_requests = Some(3);
        doc.decode[3].completed_requests = Some(9);
        let targets = SloTargets {
            ttft: Some(Duration::from_secs(2)),
            tbt: Some(Duration::from_millis(50)),
            e2e: None,
        };
        let slo = production_slo(&doc, &OutcomeSum::default(), &targets, 0.99);
        assert_eq!(slo.targets, "TTFT ≤ 2 s, TBT ≤ 50 ms");
        assert_eq!((slo.cells_with_evidence, slo.cells_meeting), (2, 0));
        let worst = slo.worst.as_ref().unwrap();
        assert_eq!(worst.text, "32K×4 meets TTFT ≤ 2 s on 84.8% of requests");
        assert_eq!(worst.target_ids, ["ttft"]);
        assert!(slo.misses());
        assert!(slo.context(32768).unwrap().misses());
        assert!(!slo.context(65536).unwrap().misses());
        assert_eq!(slo.context(65536).unwrap().cells_with_evidence, 0);
        // The verdict says what it does not rest on.
        assert_eq!((slo.unjudged_requests, slo.requests_in_bursts), (12, 9));
        assert_eq!(
            slo.unjudged_text(),
            "; 12 completed requests sit in cells not judged (9 of them in cells delivered in bursts)"
        );
        // At a 95 % objective 8K meets, naming every target.
        let slo = production_slo(&doc, &OutcomeSum::default(), &targets, 0.95);
        let eight = slo.context(8192).unwrap().worst.clone().unwrap();
        assert!(eight.meets);
        assert_eq!(eight.target, "TTFT ≤ 2 s, TBT ≤ 50 ms");
    }

    #[test]
    fn shed_past_the_budget_misses_whatever_the_cells_say() {
        let mut doc = MatrixDoc::new(Default::default());
        doc.decode = vec![cell(8192, 1, CellStatus::Valid, 1.0)];
        let targets = SloTargets {
            ttft: Some(Duration::from_secs(30)),
            ..SloTargets::default()
        };
        let shed_index = Outcome::ALL
            .iter()
            .position(|o| *o == Outcome::Shed)
            .unwrap();
        let ok_index = Outcome::ALL.iter().position(|o| *o == Outcome::Ok).unwrap();
        let mut outcomes = OutcomeSum::default();
        outcomes.counts[ok_index] = 1;
        outcomes.counts[shed_index] = 9;
        let slo = production_slo(&doc, &outcomes, &targets, 0.99);
        assert!(slo.worst.as_ref().unwrap().meets);
        assert!(slo.misses());
        assert_eq!(
            slo.shed.as_ref().unwrap().text,
            "90.0% of requests (9 of 10) were shed by the engine, over the 1.0% error budget"
        );
        // Within the budget: no miss of its own.
        outcomes.counts[ok_index] = 999;
        outcomes.counts[shed_index] = 1;
        assert!(!production_slo(&doc, &outcomes, &targets, 0.99).misses());
    }

    #[test]
    fn durations_read_as_an_operator_writes_them() {
        assert_eq!(duration_text(Duration::from_secs(2)), "2 s");
        assert_eq!(duration_text(Duration::from_millis(1500)), "1.5 s");
        assert_eq!(duration_text(Duration::from_millis(50)), "50 ms");
    }
}
