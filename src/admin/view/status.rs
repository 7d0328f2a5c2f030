//! The one verdict an operator acts on (`GET /status`, `tokentap status`, the top of the page):
//! per model with production traffic in `capacity.window`, six clauses, each built only from
//! the view function whose figure it summarises and linking to that figure (a page anchor and
//! an endpoint):
//!
//! 0. **availability** — whether the model's upstream answers now (`/readyz`'s probe) and the
//!    window's failed and shed share against the error budget (`availability`); when bad, it
//!    is the verdict's [`Status::headline`], first on the page, in `tokentap status` and in
//!    `GET /status`;
//! 1. **SLO** — production against the `[slo]` objective (`production_slo`): the cells with
//!    evidence meeting it, the worst cell and its attainment, or the engine shedding past the
//!    error budget (shed load is demand);
//! 2. **sweep** — production beside the latest sweep (`matrix::side_by_side::compare_cell`, the
//!    page's ratio grid): cells agreeing (within 5 %), explained by prefill overlap,
//!    unexplained;
//! 3. **headroom** — live headroom and what it rests on (`headroom::all_models`);
//! 4. **drift** — production ÷ the pinned reference (`compare::production_compare`);
//! 5. **configuration** — a change of the upstream's configuration (fingerprint) in the window.
//!
//! Beside them, one **routes** clause per upstream (not per model: a route is the upstream's):
//! the route table its self-description holds it to (`proxy::answers::RouteFacts`) and the
//! routes it publishes that no table classifies, which the data port refuses.
//!
//! An upstream that does not answer and that no model's traffic in the window went to has an
//! availability clause of its own: it heads the verdict, and the note says it, rather than
//! "nothing to judge".
//!
//! Nothing here computes a figure of its own: it counts and words what those functions return.

use std::time::{Duration, SystemTime};

use serde::Serialize;

use crate::aggregate::cell::OutcomeSum;
use crate::aggregate::Window;
use crate::base::engine::TableFit;
use crate::base::wallclock::format_rfc3339;
use crate::matrix::diff::DiffColumn;
use crate::matrix::doc::MatrixDoc;
use crate::matrix::side_by_side::{compare_cell, ratio_band, Comparison};
use crate::matrix::units::format_percent;
use crate::proxy::answers::RouteFacts;

use super::availability::{availability, Availability, ErrorBudget};
use super::compare::production_compare;
use super::headroom::{
    all_models, any_slo_targets, no_slo_targets, CapacityAnswer, RestsOn, SET_SLO_TARGETS,
};
use super::matrices::synthetic_matrix;
use super::production_slo::{production_slo, ShedDemand};
use super::sources::{current_configurations, routed_upstream, View};

/// How a clause reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    Ok,
    /// Not known: no figure to judge by (no evidence, no sweep, no reference).
    Unknown,
    Warn,
    Bad,
}

impl State {
    /// `✓`, `?`, `!`, `✗`.
    pub fn mark(self) -> &'static str {
        match self {
            State::Ok => "✓",
            State::Unknown => "?",
            State::Warn => "!",
            State::Bad => "✗",
        }
    }
}

/// One clause of a model's verdict.
#[derive(Debug, Clone, Serialize)]
pub struct Clause {
    /// `availability`, `slo`, `sweep`, `headroom`, `drift`, `configuration`.
    pub key: &'static str,
    pub state: State,
    pub text: String,
    /// The page anchor of the figure it summarises (`/#headroom`).
    pub page: String,
    /// The endpoint that serves that figure (`/capacity`).
    pub endpoint: String,
}

/// One model's verdict.
#[derive(Debug, Clone, Serialize)]
pub struct ModelStatus {
    pub model: String,
    pub upstream: String,
    /// The worst state of its clauses.
    pub state: State,
    /// The clause to act on first (the worst, in clause order), in a line.
    pub summary: String,
    pub clauses: Vec<Clause>,
    /// The availability clause's figures: readiness, the failed and shed share, since when,
    /// the last error.
    pub availability: Availability,
}

/// One upstream's answer to `/readyz`'s probe.
#[derive(Debug, Clone, Serialize)]
pub struct UpstreamReadiness {
    pub upstream: String,
    pub answering: bool,
    /// Since when it answers so, as far as the probes know (RFC 3339).
    pub since: String,
}

/// The verdict of every model with production traffic in the window.
#[derive(Debug, Clone, Serialize)]
pub struct Status {
    pub schema: &'static str,
    /// The window every clause is judged over (`capacity.window`).
    pub window: String,
    /// The first bad availability clause (a model's, else an upstream's that no model's
    /// traffic went to): unavailable or shedding, since when, the share and the last error.
    /// Absent when every upstream answers and no model's failures exceed its budget.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub headline: Option<Clause>,
    /// Each upstream's answer to `/readyz`'s probe, in configured order.
    pub upstreams: Vec<UpstreamReadiness>,
    pub models: Vec<ModelStatus>,
    /// Said when no model had production traffic in the window.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// Each upstream's routes, in configured order.
    pub routes: Vec<RoutesClause>,
}

/// What one upstream's routes are held to, and what it serves that no table classifies.
#[derive(Debug, Clone, Serialize)]
pub struct RoutesClause {
    pub upstream: String,
    /// `ok` (its version's own table, nothing unclassified), `warn` (a version outside every
    /// table's range, or routes no table classifies), `unknown` (not described yet).
    pub state: State,
    pub text: String,
    /// The engine, the version it said, and the table it is held to (version, frontend, how
    /// the version fits it), once a read named the engine.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub engine: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub table: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frontend: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fit: Option<TableFit>,
    /// How many routes it publishes that no table classifies (absent: it publishes none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unclassified_count: Option<usize>,
    /// The first [`NAMED_IN_STATUS`] of them (`POST /v1/x`).
    pub unclassified: Vec<String>,
}

/// How many unclassified routes a routes clause names (its count says the rest).
pub const NAMED_IN_STATUS: usize = 10;

/// The routes clause of one upstream, from what its latest read says of its routes.
pub fn routes_clause(upstream: &str, facts: &RouteFacts) -> RoutesClause {
    let served = facts.served;
    let count = facts.unclassified.as_ref().map(Vec::len);
    let unclassified: Vec<String> = facts
        .unclassified
        .iter()
        .flatten()
        .take(NAMED_IN_STATUS)
        .map(ToString::to_string)
        .collect();
    let (state, mut text) = match served {
        None => (
            State::Unknown,
            "the upstream has not said what it is: its routes are classified by every engine's tables".to_string(),
        ),
        Some(served) => {
            let held = format!(
                "held to {}'s route table for {} ({} frontend)",
                served.engine,
                served.table.version,
                served.table.frontend.name
            );
            let said = facts.version.as_deref().unwrap_or("an unknown version");
            match served.fit {
                TableFit::Exact => (State::Ok, format!("{said}: {held}")),
                TableFit::VersionUnknown => (
                    State::Ok,
                    format!("no version said: {held}, the newest"),
                ),
                TableFit::NewerThanNewest => (
                    State::Warn,
                    format!("{said} is newer than the newest table: {held}; a route the newer release added is refused unless proxy.routes opens it"),
                ),
                TableFit::OlderThanOldest => (
                    State::Warn,
                    format!("{said} is older than the oldest table: {held}"),
                ),
            }
        }
    };
    let state = match count {
        Some(n) if n > 0 => {
            let more = n.saturating_sub(unclassified.len());
            let more = if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            };
            text.push_str(&format!(
                "; it serves {n} route{} no table classifies, refused unless proxy.routes opens them: {}{more}",
                if n == 1 { "" } else { "s" },
                unclassified.join(", ")
            ));
            state.max(State::Warn)
        }
        _ => state,
    };
    RoutesClause {
        upstream: upstream.to_string(),
        state,
        text,
        engine: served.map(|s| s.engine.name()),
        version: facts.version.clone(),
        table: served.map(|s| s.table.version),
        frontend: served.map(|s| s.table.frontend.name),
        fit: served.map(|s| s.fit),
        unclassified_count: count,
        unclassified,
    }
}

/// The schema tag of `GET /status`.
pub const STATUS_SCHEMA: &str = "tokentap.status/v1";

/// Production beside the sweep, counted from `compare_cell` (the page's ratio grid).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct SweepAgreement {
    /// Cells compared (Valid on both sides).
    pub compared: usize,
    /// Within 5 % of the sweep.
    pub agreeing: usize,
    /// Off by more, and production's prefill overlap explains it.
    pub explained: usize,
    /// Off by more, unexplained.
    pub unexplained: usize,
}

/// Counts `compare_cell` over the cells of `production` and `sweep`.
pub fn sweep_agreement(production: &MatrixDoc, sweep: &MatrixDoc) -> SweepAgreement {
    let sweep_cells = sweep.cell_index();
    let mut out = SweepAgreement::default();
    for cell in &production.decode {
        let theirs = sweep_cells
            .get(&(cell.context_tokens, cell.concurrency))
            .copied();
        if let Comparison::Ratio {
            ratio, explained, ..
        } = compare_cell(Some(cell), theirs)
        {
            out.compared += 1;
            if ratio_band(ratio).is_some_and(|b| (b.from - 0.95).abs() < 1e-9) {
                out.agreeing += 1;
            } else if explained {
                out.explained += 1;
            } else {
                out.unexplained += 1;
            }
        }
    }
    out
}

fn clause(key: &'static str, state: State, text: String, page: &str, endpoint: String) -> Clause {
    Clause {
        key,
        state,
        text,
        page: page.to_owned(),
        endpoint,
    }
}

/// The verdict of every model with production traffic in `capacity.window`, at `now`.
pub async fn status(view: View<'_>, now: SystemTime) -> Status {
    let span = view.capacity.config.window;
    let window = Window::Last(span);
    let capacity = all_models(view, now);
    let synthetic = synthetic_matrix(view).await.ok().flatten();
    let readiness = view.readiness.upstreams(view.proxy).await;
    let filter = current_configurations(view);
    let mut models = Vec::new();
    for matrix in view.production.window_of(window, now, &filter) {
        let model = matrix.model.to_string();
        let production = view.production.document(&matrix, &[]);
        let outcomes = &matrix.accumulator.outcomes;
        let upstream = routed_upstream(view, Some(&model));
        let escaped =
            percent_encoding::utf8_percent_encode(&model, percent_encoding::NON_ALPHANUMERIC);
        let query = |extra: &str| format!("?model={escaped}&window={}{extra}", window.label());
        let targets = view.capacity.slo.for_model(Some(&model));
        let objective = view.capacity.objectives.of(&model);
        let available = availability(
            &upstream.name,
            readiness.iter().find(|a| a.name == upstream.name),
            outcomes,
            ErrorBudget::of(targets.is_set(), objective),
            now,
        );
        let mut clauses = vec![availability_clause(&available)];
        let (slo, shed) = slo_clause(view, &model, &production, outcomes, &query(""));
        clauses.push(slo);
        clauses.push(sweep_clause(&production, synthetic.as_deref(), &model));
        clauses.push(headroom_clause(&capacity, &model, shed.as_ref()));
        clauses.push(drift_clause(
            view,
            window,
            &model,
            &query("&compare=reference"),
        ));
        clauses.push(configuration_clause(
            &upstream.identity.configs(),
            upstream.identity.current(),
            now,
            span,
        ));
        let state = clauses
            .iter()
            .map(|c| c.state)
            .max()
            .unwrap_or(State::Unknown);
        let summary = clauses
            .iter()
            .find(|c| c.state == state)
            .map_or_else(String::new, |c| c.text.clone());
        models.push(ModelStatus {
            model,
            upstream: upstream.name.to_string(),
            state,
            summary,
            clauses,
            availability: available,
        });
    }
    // An upstream that does not answer, and that none of the window's traffic went to: its
    // own clause, so a dead upstream without traffic (or without `[slo]`) is said to be one.
    let idle_down: Vec<Availability> = readiness
        .iter()
        .filter(|a| !a.answering && !models.iter().any(|m| *m.upstream == *a.name))
        .map(|a| {
            availability(
                &a.name,
                Some(a),
                &OutcomeSum::default(),
                ErrorBudget::of(false, 0.0),
                now,
            )
        })
        .collect();
    let headline = models
        .iter()
        .map(|m| &m.availability)
        .chain(&idle_down)
        .find(|a| a.bad)
        .map(availability_clause);
    let note = models.is_empty().then(|| {
        let nothing = if idle_down.is_empty() {
            format!(
                "no production request ended in the window ({}): there is nothing to judge yet",
                window.label()
            )
        } else {
            let down: Vec<&str> = idle_down.iter().map(|a| a.text.as_str()).collect();
            format!(
                "{}; no production request ended in the window ({}) to judge the SLO by",
                down.join("; "),
                window.label()
            )
        };
        if any_slo_targets(&view.capacity.slo) {
            nothing
        } else {
            format!("{nothing}; and {}", no_slo_targets())
        }
    });
    let upstreams = readiness
        .iter()
        .map(|a| UpstreamReadiness {
            upstream: a.name.to_string(),
            answering: a.answering,
            since: format_rfc3339(now.checked_sub(a.since.elapsed()).unwrap_or(now)),
        })
        .collect();
    let routes = view
        .proxy
        .router
        .all()
        .iter()
        .map(|upstream| routes_clause(&upstream.name, &upstream.route_facts()))
        .collect();
    Status {
        schema: STATUS_SCHEMA,
        window: window.label(),
        headline,
        upstreams,
        models,
        note,
        routes,
    }
}

/// Whether the upstream answers and the window's requests succeed: bad is the headline.
fn availability_clause(available: &Availability) -> Clause {
    let state = if available.bad { State::Bad } else { State::Ok };
    clause(
        "availability",
        state,
        available.text.clone(),
        "/#verdict",
        "/readyz".to_owned(),
    )
}

/// Production against the `[slo]` objective, and the engine's shedding past its budget.
fn slo_clause(
    view: View<'_>,
    model: &str,
    production: &MatrixDoc,
    outcomes: &OutcomeSum,
    query: &str,
) -> (Clause, Option<ShedDemand>) {
    let endpoint = format!("/matrix{query}&source=production");
    let targets = view.capacity.slo.for_model(Some(model));
    if !targets.is_set() {
        let text =
            format!("no [slo] targets for this model: production is not judged; {SET_SLO_TARGETS}");
        let unset = clause("slo", State::Unknown, text, "/#production", endpoint);
        return (unset, None);
    }
    let slo = production_slo(
        production,
        outcomes,
        &targets,
        view.capacity.objectives.of(model),
    );
    let objective = format_percent(slo.objective);
    let unjudged = slo.unjudged_text();
    let cells = slo.worst.as_ref().map_or_else(
        || "no production cell has evidence".to_owned(),
        |worst| {
            format!(
                "{} of {} cells with evidence meet the {objective} objective; worst: {}",
                slo.cells_meeting, slo.cells_with_evidence, worst.text
            )
        },
    );
    let (state, text) = match (&slo.shed, &slo.worst) {
        // Shed load is demand: the admitted requests' cells do not speak for the refused.
        (Some(shed), _) => (
            State::Bad,
            format!(
                "production misses the SLO: {}; {cells}{unjudged}",
                shed.text
            ),
        ),
        (None, None) => (
            State::Unknown,
            format!(
                "no production cell has evidence yet ({}; objective {objective}){unjudged}",
                slo.targets
            ),
        ),
        (None, Some(worst)) if !worst.meets => (
            State::Bad,
            format!("production misses the SLO: {cells}{unjudged}"),
        ),
        (None, Some(_)) => (
            State::Ok,
            format!("production meets the SLO: {cells}{unjudged}"),
        ),
    };
    (
        clause("slo", state, text, "/#production", endpoint),
        slo.shed,
    )
}

/// Production beside the latest sweep.
fn sweep_clause(production: &MatrixDoc, synthetic: Option<&MatrixDoc>, model: &str) -> Clause {
    let endpoint = "/matrix?source=synthetic".to_owned();
    let Some(sweep) = synthetic.filter(|s| s.metadata.model.served_model.as_deref() == Some(model))
    else {
        return clause(
            "sweep",
            State::Unknown,
            "no sweep of this model to compare production with: run `tokentap sweep`".to_owned(),
            "/#synthetic",
            endpoint,
        );
    };
    let agreement = sweep_agreement(production, sweep);
    let text = format!(
        "production beside the sweep: {} of {} compared cells agree within 5 %, {} explained by prefill overlap, {} unexplained",
        agreement.agreeing, agreement.compared, agreement.explained, agreement.unexplained
    );
    let state = if agreement.compared == 0 {
        State::Unknown
    } else if agreement.unexplained > 0 {
        State::Warn
    } else {
        State::Ok
    };
    clause("sweep", state, text, "/#comparison", endpoint)
}

/// Live headroom and what it rests on; none where the engine sheds past its budget.
fn headroom_clause(capacity: &CapacityAnswer, model: &str, shed: Option<&ShedDemand>) -> Clause {
    let endpoint = "/capacity".to_owned();
    if let Some(m) = capacity.models.iter().find(|m| m.model == model) {
        let figures = &m.headroom;
        let at_least = if figures.capacity_is_lower_bound {
            "≥ "
        } else {
            ""
        };
        let (state, text) = match (m.rests_on, figures.headroom) {
            (RestsOn::ProductionMisses, _) => (State::Bad, m.rests_on_text.clone()),
            (_, None) => (
                State::Unknown,
                format!("headroom unknown ({})", m.rests_on_text),
            ),
            (_, Some(h)) => (
                if h < 0.0 {
                    State::Bad
                } else if h < 0.2 {
                    State::Warn
                } else {
                    State::Ok
                },
                format!(
                    "{at_least}{} headroom ({:.1} streams on average against {at_least}{} for this mix, {}); rests on {}",
                    format_percent(h),
                    figures.load,
                    figures
                        .capacity
                        .map_or_else(|| "unknown".to_owned(), |c| format!("{c:.1}")),
                    m.capacity_from,
                    m.rests_on_text
                ),
            ),
        };
        return clause("headroom", state, text, "/#headroom", endpoint);
    }
    let reason = capacity
        .unanswered
        .iter()
        .find(|u| u.model == model)
        .map_or_else(|| "no headroom figure".to_owned(), |u| u.reason.clone());
    if let Some(shed) = shed {
        // No boundary to hold the load to, but the engine's refusals say there is no room.
        return clause(
            "headroom",
            State::Bad,
            format!(
                "no headroom: the engine sheds {} of requests ({} of {}; error budget {}); and {reason}",
                format_percent(shed.share),
                shed.shed,
                shed.requests,
                format_percent(shed.budget)
            ),
            "/#headroom",
            endpoint,
        );
    }
    clause(
        "headroom",
        State::Unknown,
        format!("no headroom: {reason}"),
        "/#headroom",
        endpoint,
    )
}

/// Production ÷ the pinned reference.
fn drift_clause(view: View<'_>, window: Window, model: &str, query: &str) -> Clause {
    let endpoint = format!("/matrix{query}");
    let compared = match production_compare(view, window, Some(model), None) {
        Ok(compared) => compared,
        Err((_, message)) => {
            return clause("drift", State::Unknown, message, "/#drift", endpoint);
        }
    };
    let speed = compared
        .column_summary(DiffColumn::PerRequestTokS)
        .and_then(|s| s.geometric_mean.map(|g| (g, s.cells)));
    let ttft = compared
        .column_summary(DiffColumn::TtftMs)
        .and_then(|s| s.geometric_mean);
    let (state, text) = match speed {
        None => (
            State::Unknown,
            "no production cell compared with the reference yet (evidence)".to_owned(),
        ),
        Some((g, cells)) => (
            if g < 0.8 {
                State::Bad
            } else if g < 0.95 {
                State::Warn
            } else {
                State::Ok
            },
            format!(
                "against the reference ({}): per-request tok/s (1 ÷ TBT) ×{g:.2} over {cells} cells{}",
                compared.reference.source,
                ttft.map_or_else(String::new, |t| format!(", TTFT ×{t:.2}"))
            ),
        ),
    };
    clause("drift", state, text, "/#drift", endpoint)
}

/// A configuration change of the upstream in the window.
fn configuration_clause(
    configs: &[crate::meter::identity::ConfigEntry],
    current: crate::meter::identity::FingerprintId,
    now: SystemTime,
    span: Duration,
) -> Clause {
    let since = now.checked_sub(span).unwrap_or(SystemTime::UNIX_EPOCH);
    let change = configs
        .iter()
        .rev()
        .find(|c| c.previous.is_some() && c.since >= since);
    let endpoint = "/matrix?compare=previous".to_owned();
    match change {
        Some(entry) => clause(
            "configuration",
            State::Warn,
            format!(
                "the configuration changed in the window: {} → {} at {} (figures before it are of another server)",
                entry.previous.map_or_else(String::new, |p| p.to_string()),
                entry.id,
                format_rfc3339(entry.since)
            ),
            "/#configuration",
            endpoint,
        ),
        None => clause(
            "configuration",
            State::Ok,
            format!("no configuration change in the window (fingerprint {current})"),
            "/#configuration",
            endpoint,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matrix::doc::{CellStatus, DecodeCell};

    fn cell(concurrency: u32, total: f64, overlap: Option<f64>) -> DecodeCell {
        let mut cell = DecodeCell::status_only(8192, concurrency, CellStatus::Valid);
        cell.total_tok_s = Some(total);
        cell.average_active_requests = Some(f64::from(concurrency));
        cell.prefill_overlap_share = overlap;
        cell
    }

    #[test]
    fn agreement_counts_the_ratio_grid_classes() {
        let mut production = MatrixDoc::new(Default::default());
        production.decode = vec![
            cell(1, 100.0, None),      // ×1.00: agrees
            cell(2, 100.0, Some(0.5)), // ×0.50, overlap predicts 0.5: explained
            cell(4, 100.0, None),      // ×0.50: unexplained
        ];
        let mut sweep = MatrixDoc::new(Default::default());
        sweep.decode = vec![
            cell(1, 100.0, None),
            cell(2, 200.0, None),
            cell(4, 200.0, None),
        ];
        let agreement = sweep_agreement(&production, &sweep);
        assert_eq!(
            agreement,
            SweepAgreement {
                compared: 3,
                agreeing: 1,
                explained: 1,
                unexplained: 1
            }
        );
    }
}
