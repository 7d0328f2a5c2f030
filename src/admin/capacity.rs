//! `GET /capacity`: live headroom per model — production's load over `capacity.window` against
//! the capacity boundary under the model's `[slo]` targets, the boundary taken from the latest
//! sweep of that model, else from the reference pinned for it (docs/capacity.md). The same
//! figures feed the page and the `tokentap_capacity_*` gauges (the refresher in `app::drift`
//! calls [`all_models`]).
//!
//! Both sides are of the configuration the upstream runs now: production counts only its
//! requests (and those from before the upstream was first read), and a sweep or reference
//! that recorded another configuration's fingerprint is not a boundary for it — after a
//! restart with new flags the answer says "sweep again", not a figure of the old server.
use std::time::SystemTime;

use http::StatusCode;
use serde::Serialize;

use crate::aggregate::config::fingerprint_of;
use crate::aggregate::headroom::{headroom, Headroom};
use crate::aggregate::Window;
use crate::matrix::capacity::{capacity, CapacityQuery, CapacityReport, Targets};
use crate::matrix::doc::MatrixDoc;
use crate::meter::identity::FingerprintId;
use crate::proxy::body::ResponseBody;
use crate::telemetry::capacity::HeadroomSample;

pub use super::state::CapacitySettings;
use super::state::{json_response, AdminState};

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
    state: &AdminState,
    upstream: &str,
    model: &str,
    current: FingerprintId,
) -> Result<(MatrixDoc, String), String> {
    let mut stale = None;
    if let Some(sweep) = state.synthetic.get() {
        if sweep.metadata.model.served_model.as_deref() == Some(model) {
            let id = sweep.metadata.run.sweep_id.clone().unwrap_or_default();
            let measured = fingerprint_of(&sweep.metadata);
            if same_configuration(measured, current) {
                return Ok(((*sweep).clone(), format!("sweep {id}")));
            }
            stale = measured.map(|m| format!("the latest sweep ({id}) ran on configuration {m}"));
        }
    }
    if let Some(reference) = state.drift.reference(upstream, model) {
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
pub fn all_models(state: &AdminState, now: SystemTime) -> CapacityAnswer {
    let mut answer = CapacityAnswer::default();
    let settings = &state.capacity;
    let window = Window::Last(settings.config.window);
    let filter = super::matrix::current_configurations(state);
    for matrix in state.production.window_of(window, now, &filter) {
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
        let routed = state
            .proxy
            .router
            .by_model(&model)
            .unwrap_or_else(|| state.proxy.router.default_upstream());
        let upstream = routed.name.to_string();
        let (sweep, source) =
            match capacity_matrix(state, &upstream, &model, routed.identity.current()) {
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
        let Some(mut figures) = headroom(&production, &report) else {
            no("no decode load in the window".to_owned());
            continue;
        };
        // The window's mean lags a burst by minutes: the streams running now stand beside it.
        figures.running_now = Some(state.proxy.meter.inflight_of(&upstream, &model));
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
            lower_bound: m.headroom.capacity_is_lower_bound,
            load: m.headroom.load,
            running: m.headroom.running_now,
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
                    c.capacity
                        .map(|streams| (label, streams, c.capacity_is_lower_bound))
                })
                .collect(),
        })
        .collect()
}

/// `GET /capacity`.
pub fn handle(state: &AdminState) -> http::Response<ResponseBody> {
    json_response(StatusCode::OK, &all_models(state, SystemTime::now()))
}
