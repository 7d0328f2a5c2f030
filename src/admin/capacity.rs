//! `GET /capacity`: live headroom per model — production's load over `capacity.window` against
//! the capacity boundary under the model's `[slo]` targets, the boundary taken from the latest
//! sweep of that model, else from the reference pinned for it (docs/capacity.md). The same
//! figures feed the page and the `tokentap_capacity_*` gauges (the refresher in `app::drift`
//! calls [`all_models`]).
use std::time::SystemTime;

use http::StatusCode;
use serde::Serialize;

use crate::aggregate::headroom::{headroom, Headroom};
use crate::aggregate::Window;
use crate::config::CapacityConfig;
use crate::matrix::capacity::{capacity, CapacityQuery, CapacityReport, Targets};
use crate::matrix::doc::MatrixDoc;
use crate::meter::slo::SloPolicy;
use crate::proxy::body::ResponseBody;
use crate::telemetry::capacity::HeadroomSample;

use super::{json_response, AdminState};

/// What live headroom is computed with: `[capacity]` and the `[slo]` targets.
#[derive(Debug, Clone)]
pub struct CapacitySettings {
    pub config: CapacityConfig,
    pub slo: SloPolicy,
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
}

/// The capacity matrix for `model`: the latest sweep when it measured that model, else the
/// reference pinned for (`upstream`, `model`).
fn capacity_matrix(state: &AdminState, upstream: &str, model: &str) -> Option<(MatrixDoc, String)> {
    if let Some(sweep) = state.synthetic.get() {
        if sweep.metadata.model.served_model.as_deref() == Some(model) {
            let id = sweep.metadata.run.sweep_id.clone().unwrap_or_default();
            return Some(((*sweep).clone(), format!("sweep {id}")));
        }
    }
    state.drift.reference(upstream, model).map(|reference| {
        (
            reference.matrix.clone(),
            format!("reference {}", reference.source),
        )
    })
}

/// Headroom of every model with production traffic in `capacity.window`, at `now`.
pub fn all_models(state: &AdminState, now: SystemTime) -> CapacityAnswer {
    let mut answer = CapacityAnswer::default();
    let settings = &state.capacity;
    let window = Window::Last(settings.config.window);
    for matrix in state.production.window(window, now) {
        let model = matrix.model.to_string();
        let production = state.production.document(&matrix, &[]);
        let targets = settings.slo.for_model(Some(&model));
        let mut no = |reason: String| {
            answer.unanswered.push(NoHeadroom {
                model: model.clone(),
                reason,
            })
        };
        if !targets.is_set() {
            no("no [slo] targets for this model: capacity is judged against them".to_owned());
            continue;
        }
        let upstream = state
            .proxy
            .router
            .by_model(&model)
            .unwrap_or_else(|| state.proxy.router.default_upstream())
            .name
            .to_string();
        let Some((sweep, source)) = capacity_matrix(state, &upstream, &model) else {
            no("no sweep of this model and no reference pinned for it: run `tokentap sweep` (or --find-capacity)".to_owned());
            continue;
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
        let Some(figures) = headroom(&production, &report) else {
            no("no decode load in the window".to_owned());
            continue;
        };
        answer.models.push(ModelHeadroom {
            upstream,
            model,
            capacity_from: source,
            window: window.label(),
            headroom: figures,
            capacity: report,
        });
    }
    answer
}

/// The gauge values of an answer, context labels from the metering ladder.
pub fn gauge_samples(state: &AdminState, answer: &CapacityAnswer) -> Vec<HeadroomSample> {
    let ladder = state.production.contexts();
    answer
        .models
        .iter()
        .map(|m| HeadroomSample {
            upstream: m.upstream.clone(),
            model: m.model.clone(),
            headroom: m.headroom.headroom,
            load: m.headroom.load,
            capacities: m
                .headroom
                .contexts
                .iter()
                .filter_map(|c| {
                    let label = ladder
                        .values()
                        .iter()
                        .position(|v| *v == c.context_tokens)
                        .map_or_else(
                            || c.context_tokens.to_string(),
                            |i| ladder.label(i).to_owned(),
                        );
                    c.capacity.map(|streams| (label, streams))
                })
                .collect(),
        })
        .collect()
}

/// `GET /capacity`.
pub fn handle(state: &AdminState) -> http::Response<ResponseBody> {
    json_response(StatusCode::OK, &all_models(state, SystemTime::now()))
}
