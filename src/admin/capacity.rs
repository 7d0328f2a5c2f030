//! `GET /capacity`: live headroom per model as JSON, and the `tokentap_capacity_*` gauges'
//! values (the refresher in `app::drift` calls [`all_models`] and [`gauge_samples`]). The
//! figures come from the view layer (`view::headroom`), the same the page shows. The answer
//! adds `engine_advice`: per model whose capacity rests on the latest sweep, the engine's own
//! limits advised from that sweep and its capacity report (`matrix::advise`, docs/capacity.md).

use std::time::SystemTime;

use http::StatusCode;

use crate::admin::view::RestsOn;
use crate::proxy::body::ResponseBody;
use crate::telemetry::capacity::{HeadroomSample, ProductionCellSample};

use super::state::{json_response, AdminState};
pub use super::view::{
    engine_advice, CapacityAnswer, CapacitySettings, CapacityWithAdvice, ModelAdvice,
};

/// Headroom of every model with production traffic in `capacity.window`, at `now`.
pub fn all_models(state: &AdminState, now: SystemTime) -> CapacityAnswer {
    super::view::all_models(state.view(), now)
}

/// The gauge values of an answer, context labels from the metering ladder.
pub fn gauge_samples(state: &AdminState, answer: &CapacityAnswer) -> Vec<HeadroomSample> {
    let ladder = state.production.contexts();
    let concurrency = state.production.concurrency();
    let context_label = |tokens: u64| {
        ladder
            .values()
            .iter()
            .position(|v| *v == tokens)
            .map_or_else(|| tokens.to_string(), |i| ladder.label(i).to_owned())
    };
    let concurrency_label = |level: u32| {
        concurrency
            .values()
            .iter()
            .position(|v| *v == u64::from(level))
            .map_or_else(|| level.to_string(), |i| concurrency.label(i).to_owned())
    };
    answer
        .models
        .iter()
        .map(|m| HeadroomSample {
            rests_on: m.rests_on.label(),
            objective: m.production.objective,
            production: m
                .production
                .contexts
                .iter()
                .filter_map(|c| c.worst.as_ref())
                .map(|w| ProductionCellSample {
                    context: context_label(w.context_tokens),
                    concurrency: concurrency_label(w.concurrency),
                    target: w.target_ids.join(","),
                    attainment: w.attainment,
                })
                .collect(),
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
                // The sweep's boundary is no capacity where production misses.
                .filter(|c| {
                    !m.contexts_rest_on.iter().any(|b| {
                        b.context_tokens == c.context_tokens
                            && b.rests_on == RestsOn::ProductionMisses
                    })
                })
                .filter_map(|c| {
                    let label = context_label(c.context_tokens);
                    c.capacity
                        .map(|streams| (label, streams, c.capacity_is_lower_bound))
                })
                .collect(),
        })
        .collect()
}

/// `GET /capacity`.
pub fn handle(state: &AdminState) -> http::Response<ResponseBody> {
    let answer = all_models(state, SystemTime::now());
    let engine_advice = engine_advice(state.view(), &answer);
    json_response(
        StatusCode::OK,
        &CapacityWithAdvice {
            answer,
            engine_advice,
        },
    )
}
