//! Live headroom per model: production's load over `capacity.window` against the capacity
//! boundary under the model's `[slo]` targets, the boundary taken from the latest sweep of that
//! model, else from the reference pinned for it (docs/capacity.md). `/capacity`, the page and
//! the `tokentap_capacity_*` gauges show these figures.
//!
//! Both sides are of the configuration the upstream runs now: production counts only its
//! requests (and those from before the upstream was first read), and a sweep or reference
//! that recorded another configuration's fingerprint is not a boundary for it — after a
//! restart with new flags the answer says "sweep again", not a figure of the old server.
//!
//! Headroom never contradicts production: a context whose production cells with evidence miss
//! the `[slo]` objective (`production_slo`) has no headroom whatever the sweep says (its
//! headroom, and the model's, are at most 0), and the answer names the cell, the target and its
//! attainment. Where production has no evidence the figure rests on the sweep alone, whose
//! prompts are warm, and says so ([`RestsOn`]). Shed load is demand: an engine that sheds
//! more of the window's requests than the error budget allows (`production_slo::ShedDemand`)
//! leaves the model no headroom either ("no headroom: the engine sheds 90.0% of requests").

use std::time::SystemTime;

use serde::Serialize;

use crate::aggregate::config::fingerprint_of;
use crate::aggregate::headroom::{headroom, Headroom};
use crate::aggregate::Window;
use crate::matrix::capacity::{capacity, CapacityQuery, CapacityReport, Targets};
use crate::matrix::doc::MatrixDoc;
use crate::meter::identity::FingerprintId;

use super::production_slo::{production_slo, ProductionSlo};
use super::sources::{current_configurations, View};

/// What a headroom figure rests on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RestsOn {
    /// Production's cells with evidence miss the objective, or the engine sheds more of the
    /// window's requests than the error budget allows: no headroom, whatever the sweep says.
    ProductionMisses,
    /// The sweep's boundary, and production's cells with evidence meet the objective.
    SweepAndProduction,
    /// The sweep's boundary alone, measured on warm prompts: production has no cell with
    /// evidence (at some context, for the model).
    SweepWarmPrompts,
}

impl RestsOn {
    /// The label value of `tokentap_capacity_headroom_basis`.
    pub fn label(self) -> &'static str {
        match self {
            RestsOn::ProductionMisses => "production_misses",
            RestsOn::SweepAndProduction => "sweep_and_production",
            RestsOn::SweepWarmPrompts => "sweep_warm_prompts",
        }
    }
}

/// What one context's headroom rests on, in words.
#[derive(Debug, Clone, Serialize)]
pub struct ContextBasis {
    pub context_tokens: u64,
    pub rests_on: RestsOn,
    pub text: String,
}

/// One model's answer.
#[derive(Debug, Clone, Serialize)]
pub struct ModelHeadroom {
    pub upstream: String,
    pub model: String,
    /// Where the capacity boundary comes from: `sweep <id>` or `reference <source>`.
    pub capacity_from: String,
    pub window: String,
    pub headroom: Headroom,
    pub capacity: CapacityReport,
    /// What the headroom rests on: production's verdict overrides the sweep's boundary.
    pub rests_on: RestsOn,
    /// `rests_on` in words, naming the cell, the target and its attainment where production
    /// misses.
    pub rests_on_text: String,
    /// Per context of the load.
    pub contexts_rest_on: Vec<ContextBasis>,
    /// Production against the `[slo]` objective over the same window.
    pub production: ProductionSlo,
}

/// Why a model has no headroom figure.
#[derive(Debug, Clone, Serialize)]
pub struct NoHeadroom {
    pub model: String,
    pub reason: String,
}

/// Every model with production traffic in the window, answered or not.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CapacityAnswer {
    pub models: Vec<ModelHeadroom>,
    pub unanswered: Vec<NoHeadroom>,
    /// Why `models` is empty, in one sentence that says what to do (no `[slo]` targets: the
    /// keys to set and the `--set` form; no production traffic in `capacity.window`); `null`
    /// when some model is answered. Never an empty answer without a reason.
    pub explain: Option<String>,
}

/// How to set `[slo]` targets: the keys and the `--set` form. Every answer that has no targets
/// to judge by (`GET /capacity`, the page, `GET /status` and `tokentap status`) ends with it.
pub const SET_SLO_TARGETS: &str = "set at least one of slo.ttft, slo.tbt, slo.e2e (the [slo] table of the config file: ttft = \"2s\", tbt = \"50ms\", e2e = \"60s\"; per model [slo.models.\"MODEL\"]), or on the command line: tokentap serve --set slo.ttft=2s --set slo.tbt=50ms";

/// The sentence of an answer without `[slo]` targets anywhere.
pub fn no_slo_targets() -> String {
    format!("no [slo] targets are set, and capacity is judged against them: {SET_SLO_TARGETS}")
}

/// Whether any `[slo]` target is set, the default's or a model's.
pub fn any_slo_targets(slo: &crate::meter::slo::SloPolicy) -> bool {
    slo.default.is_set() || slo.models.values().any(|t| t.is_set())
}

/// Whether a boundary measured on configuration `measured` (what its document recorded) holds
/// for `current`: yes unless both are known configurations and differ.
fn same_configuration(measured: Option<FingerprintId>, current: FingerprintId) -> bool {
    match measured {
        Some(measured) => !current.is_config() || measured == current,
        None => true,
    }
}

/// The capacity matrix for `model` on the upstream's `current` configuration: the latest sweep
/// when it measured that model there, else the reference pinned for (`upstream`, `model`)
/// when it is of that configuration. `Err` says why neither is.
fn capacity_matrix(
    view: View<'_>,
    upstream: &str,
    model: &str,
    current: FingerprintId,
) -> Result<(MatrixDoc, String), String> {
    let mut stale = None;
    if let Some(sweep) = view.synthetic.get() {
        if sweep.metadata.model.served_model.as_deref() == Some(model) {
            let id = sweep.metadata.run.sweep_id.clone().unwrap_or_default();
            let measured = fingerprint_of(&sweep.metadata);
            if same_configuration(measured, current) {
                return Ok(((*sweep).clone(), format!("sweep {id}")));
            }
            stale = measured.map(|m| format!("the latest sweep ({id}) ran on configuration {m}"));
        }
    }
    if let Some(reference) = view.drift.reference(upstream, model) {
        let measured = fingerprint_of(&reference.matrix.metadata);
        if same_configuration(measured, current) {
            return Ok((
                reference.matrix.clone(),
                format!("reference {}", reference.source),
            ));
        }
        if stale.is_none() {
            stale =
                measured.map(|m| format!("the pinned reference was measured on configuration {m}"));
        }
    }
    Err(match stale {
        Some(stale) => format!(
            "{stale}, and the upstream now runs {current}: sweep again (`tokentap sweep`, or --find-capacity) for a boundary of this configuration"
        ),
        None => "no sweep of this model and no reference pinned for it: run `tokentap sweep` (or --find-capacity)".to_owned(),
    })
}

/// Headroom of every model with production traffic in `capacity.window`, at `now`.
pub fn all_models(view: View<'_>, now: SystemTime) -> CapacityAnswer {
    let mut answer = CapacityAnswer::default();
    let settings = view.capacity;
    let window = Window::Last(settings.config.window);
    let filter = current_configurations(view);
    for matrix in view.production.window_of(window, now, &filter) {
        let model = matrix.model.to_string();
        let production = view.production.document(&matrix, &[]);
        let targets = settings.slo.for_model(Some(&model));
        let mut no = |reason: String| {
            answer.unanswered.push(NoHeadroom {
                model: model.clone(),
                reason,
            })
        };
        if !targets.is_set() {
            no(format!(
                "no [slo] targets for this model, and capacity is judged against them: {SET_SLO_TARGETS}"
            ));
            continue;
        }
        let routed = view
            .proxy
            .router
            .by_model(&model)
            .unwrap_or_else(|| view.proxy.router.default_upstream());
        let upstream = routed.name.to_string();
        let (sweep, source) =
            match capacity_matrix(view, &upstream, &model, routed.identity.current()) {
                Ok(found) => found,
                Err(reason) => {
                    no(reason);
                    continue;
                }
            };
        let ms = |d: Option<std::time::Duration>| d.map(|d| d.as_secs_f64() * 1000.0);
        let query = CapacityQuery {
            targets: Targets {
                ttft_ms: ms(targets.ttft),
                tbt_ms: ms(targets.tbt),
                e2e_ms: ms(targets.e2e),
            },
            attainment: settings.config.attainment,
            basis: settings.config.basis,
            output_tokens: None,
        };
        let report = match capacity(&sweep, &query) {
            Ok(report) => report,
            Err(error) => {
                no(format!(
                    "the capacity of {source} cannot be judged: {error}"
                ));
                continue;
            }
        };
        let slo = production_slo(
            &production,
            &matrix.accumulator.outcomes,
            &targets,
            settings.objectives.of(&model),
        );
        // Shed load is demand: an engine refusing past the budget has no headroom even when
        // what it admitted left no decode load at all.
        let Some(mut figures) = headroom(&production, &report).or_else(|| {
            slo.shed.as_ref().map(|_| Headroom {
                load: 0.0,
                capacity: None,
                headroom: Some(0.0),
                capacity_is_lower_bound: false,
                running_now: None,
                covered_share: 0.0,
                contexts: Vec::new(),
            })
        }) else {
            no("no decode load in the window".to_owned());
            continue;
        };
        // The window's mean lags a burst by minutes: the streams running now stand beside it.
        figures.running_now = Some(view.proxy.meter.inflight_of(&upstream, &model));
        let (rests_on, rests_on_text, contexts_rest_on) = overrule(&mut figures, &slo);
        answer.models.push(ModelHeadroom {
            upstream,
            model,
            capacity_from: source,
            window: window.label(),
            headroom: figures,
            capacity: report,
            rests_on,
            rests_on_text,
            contexts_rest_on,
            production: slo,
        });
    }
    if answer.models.is_empty() {
        answer.explain = Some(if !any_slo_targets(&settings.slo) {
            no_slo_targets()
        } else if answer.unanswered.is_empty() {
            format!(
                "no production request ended in the last {} (capacity.window): headroom is production's load against the capacity boundary, and there is no load to judge yet",
                window.label()
            )
        } else {
            "no model has a headroom figure: `unanswered` says why, per model".to_owned()
        });
    }
    answer
}

/// Holds the sweep's headroom to production's verdict: a context whose cells with evidence
/// miss the objective gets at most 0, and so does the model; the basis of each context and of
/// the model, in words.
fn overrule(figures: &mut Headroom, slo: &ProductionSlo) -> (RestsOn, String, Vec<ContextBasis>) {
    let objective = crate::matrix::units::format_percent(slo.objective);
    let mut bases = Vec::new();
    for context in &mut figures.contexts {
        let label = crate::matrix::units::context_label(context.context_tokens);
        let production = slo.context(context.context_tokens);
        let (rests_on, text) = match production {
            Some(p) if p.misses() => {
                context.headroom = Some(context.headroom.map_or(0.0, |h| h.min(0.0)));
                let worst = p.worst.as_ref().map_or_else(String::new, |w| w.text.clone());
                (
                    RestsOn::ProductionMisses,
                    format!("no headroom at {label}: production misses the SLO ({worst}; objective {objective})"),
                )
            }
            Some(p) if p.cells_with_evidence > 0 => (
                RestsOn::SweepAndProduction,
                format!(
                    "{label}: the sweep's boundary; production meets the SLO in {} of {} cells with evidence",
                    p.cells_meeting, p.cells_with_evidence
                ),
            ),
            _ => (
                RestsOn::SweepWarmPrompts,
                format!("{label}: the sweep alone, on warm prompts (no production cell with evidence)"),
            ),
        };
        bases.push(ContextBasis {
            context_tokens: context.context_tokens,
            rests_on,
            text,
        });
    }
    let missing: Vec<&ContextBasis> = bases
        .iter()
        .filter(|b| b.rests_on == RestsOn::ProductionMisses)
        .collect();
    if !missing.is_empty() || slo.misses() {
        figures.headroom = Some(figures.headroom.map_or(0.0, |h| h.min(0.0)));
        figures.capacity_is_lower_bound = false;
        if let Some(shed) = &slo.shed {
            return (
                RestsOn::ProductionMisses,
                format!(
                    "no headroom: the engine sheds {} of requests ({} of {}; error budget {}), whatever the sweep says",
                    crate::matrix::units::format_percent(shed.share),
                    shed.shed,
                    shed.requests,
                    crate::matrix::units::format_percent(shed.budget)
                ),
                bases,
            );
        }
        let worst = slo
            .worst
            .as_ref()
            .map_or_else(String::new, |w| w.text.clone());
        return (
            RestsOn::ProductionMisses,
            format!("no headroom: production misses the SLO ({worst}; objective {objective}), whatever the sweep says"),
            bases,
        );
    }
    if !bases.is_empty()
        && bases
            .iter()
            .all(|b| b.rests_on == RestsOn::SweepAndProduction)
    {
        (
            RestsOn::SweepAndProduction,
            format!(
                "the sweep's boundary; production meets the SLO in {} of {} cells with evidence",
                slo.cells_meeting, slo.cells_with_evidence
            ),
            bases,
        )
    } else {
        let warm: Vec<String> = bases
            .iter()
            .filter(|b| b.rests_on == RestsOn::SweepWarmPrompts)
            .map(|b| crate::matrix::units::context_label(b.context_tokens))
            .collect();
        (
            RestsOn::SweepWarmPrompts,
            format!(
                "the sweep alone, on warm prompts: production has no cell with evidence at {}",
                warm.join(", ")
            ),
            bases,
        )
    }
}

/// One model's advice for the engine's limits, or why there is none.
#[derive(Debug, Clone, Serialize)]
pub struct ModelAdvice {
    pub upstream: String,
    pub model: String,
    pub advice: Option<crate::matrix::advise::EngineAdvice>,
    pub why_none: Option<String>,
}

/// `GET /capacity`'s body: the headroom answer and the engine advice beside it.
#[derive(Debug, Clone, Serialize)]
pub struct CapacityWithAdvice {
    #[serde(flatten)]
    pub answer: CapacityAnswer,
    pub engine_advice: Vec<ModelAdvice>,
}

/// The advice for every answered model whose capacity rests on the latest sweep (its prefill
/// rows and cells give the figures).
pub fn engine_advice(view: View<'_>, answer: &CapacityAnswer) -> Vec<ModelAdvice> {
    let sweep = view.synthetic.get();
    answer
        .models
        .iter()
        .map(|m| {
            let doc = sweep.as_ref().filter(|doc| {
                m.capacity_from.starts_with("sweep")
                    && doc.metadata.model.served_model.as_deref() == Some(m.model.as_str())
            });
            ModelAdvice {
                upstream: m.upstream.clone(),
                model: m.model.clone(),
                advice: doc.map(|doc| crate::matrix::advise::advise(doc, &m.capacity)),
                why_none: doc.is_none().then(|| {
                    format!(
                        "the capacity comes from {}, not the latest sweep: run a sweep of this model to get its prefill rate",
                        m.capacity_from
                    )
                }),
            }
        })
        .collect()
}
