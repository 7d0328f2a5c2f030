//! The capacity gauges: `tokentap_capacity_headroom_ratio{upstream, model, lower_bound}` (1 −
//! load ÷ capacity of the traffic's context mix), `tokentap_capacity_load_streams{upstream,
//! model}` (production requests decoding at once, the window's mean),
//! `tokentap_capacity_running_streams{upstream, model}` (requests in flight now) and
//! `tokentap_capacity_streams{upstream, model, context_bucket, lower_bound}` (streams each
//! context can take under the SLO). `lower_bound="true"`: the sweep never saw a cell miss, so
//! the capacity (and the headroom) is at least the figure. Beside them, production's verdict
//! that overrules the sweep: `tokentap_capacity_headroom_basis{upstream, model, rests_on}` (1
//! for what the headroom rests on: `production_misses`, `sweep_and_production`,
//! `sweep_warm_prompts`), `tokentap_capacity_production_attainment_ratio{upstream, model,
//! context_bucket, concurrency_bucket, target}` (each context's worst production cell with
//! evidence, its SLO attainment, `target` the targets it misses) and
//! `tokentap_capacity_objective_ratio{upstream, model}` (the `[slo]` objective it is held to);
//! a context whose production misses loses its `tokentap_capacity_streams` series (the sweep's
//! boundary is no capacity there). The set the refresher
//! computed last, replaced whole on each refresh (a model without a capacity answer loses its
//! series at once) and written into `/metrics` as text. Never touched on the request path.

use std::fmt::Write as _;
use std::sync::{Arc, RwLock};

use super::names::{
    label_value, CAPACITY_ATTAINMENT, CAPACITY_ATTAINMENT_HELP, CAPACITY_BASIS,
    CAPACITY_BASIS_HELP, CAPACITY_HEADROOM, CAPACITY_HEADROOM_HELP, CAPACITY_LOAD,
    CAPACITY_LOAD_HELP, CAPACITY_OBJECTIVE, CAPACITY_OBJECTIVE_HELP, CAPACITY_RUNNING,
    CAPACITY_RUNNING_HELP, CAPACITY_STREAMS, CAPACITY_STREAMS_HELP,
};
use crate::base::lock;

/// One model's figures.
#[derive(Debug, Clone, PartialEq)]
pub struct HeadroomSample {
    pub upstream: String,
    pub model: String,
    /// 1 − load ÷ capacity; `None` when no context of the traffic has a capacity answer.
    pub headroom: Option<f64>,
    /// The capacity of some context of the mix is a lower bound (so is the headroom).
    pub lower_bound: bool,
    /// The window's mean of production requests decoding at once.
    pub load: f64,
    /// Requests in flight now.
    pub running: Option<u32>,
    /// (context ladder label, streams, whether that is a lower bound) for every context with
    /// an answer.
    pub capacities: Vec<(String, u32, bool)>,
    /// What the headroom rests on (`production_misses`, `sweep_and_production`,
    /// `sweep_warm_prompts`).
    pub rests_on: &'static str,
    /// The `[slo]` objective production is held to (0–1).
    pub objective: f64,
    /// Each context's worst production cell with evidence.
    pub production: Vec<ProductionCellSample>,
}

/// A context's worst production cell with evidence.
#[derive(Debug, Clone, PartialEq)]
pub struct ProductionCellSample {
    /// Context ladder label.
    pub context: String,
    /// Concurrency ladder label.
    pub concurrency: String,
    /// The targets it misses (ids joined by `,`: `ttft`, `ttft,tbt`); every target where it
    /// meets.
    pub target: String,
    /// Its SLO attainment (0–1).
    pub attainment: f64,
}

/// The current capacity values, shared by the refresher and the Prometheus renderer.
#[derive(Debug, Default)]
pub struct CapacityGauges(RwLock<Arc<Vec<HeadroomSample>>>);

impl CapacityGauges {
    /// Replaces every value (an empty set removes every series).
    pub fn replace(&self, samples: Vec<HeadroomSample>) {
        *lock::write(&self.0) = Arc::new(samples);
    }

    pub fn samples(&self) -> Arc<Vec<HeadroomSample>> {
        Arc::clone(&lock::read(&self.0))
    }

    /// Appends the exposition lines (nothing at all when there is no value).
    pub fn render_into(&self, out: &mut String) {
        let samples = self.samples();
        if samples.is_empty() {
            return;
        }
        let labels = |s: &HeadroomSample| {
            format!(
                "upstream=\"{}\",model=\"{}\"",
                label_value(&s.upstream),
                label_value(&s.model)
            )
        };
        let headrooms: Vec<_> = samples
            .iter()
            .filter_map(|s| s.headroom.filter(|h| h.is_finite()).map(|h| (s, h)))
            .collect();
        if !headrooms.is_empty() {
            let _ = writeln!(out, "# HELP {CAPACITY_HEADROOM} {CAPACITY_HEADROOM_HELP}");
            let _ = writeln!(out, "# TYPE {CAPACITY_HEADROOM} gauge");
            for (sample, value) in headrooms {
                let _ = writeln!(
                    out,
                    "{CAPACITY_HEADROOM}{{{},lower_bound=\"{}\"}} {value}",
                    labels(sample),
                    sample.lower_bound
                );
            }
        }
        let _ = writeln!(out, "# HELP {CAPACITY_LOAD} {CAPACITY_LOAD_HELP}");
        let _ = writeln!(out, "# TYPE {CAPACITY_LOAD} gauge");
        for sample in samples.iter().filter(|s| s.load.is_finite()) {
            let _ = writeln!(out, "{CAPACITY_LOAD}{{{}}} {}", labels(sample), sample.load);
        }
        if samples.iter().any(|s| s.running.is_some()) {
            let _ = writeln!(out, "# HELP {CAPACITY_RUNNING} {CAPACITY_RUNNING_HELP}");
            let _ = writeln!(out, "# TYPE {CAPACITY_RUNNING} gauge");
            for sample in samples.iter() {
                if let Some(running) = sample.running {
                    let _ = writeln!(out, "{CAPACITY_RUNNING}{{{}}} {running}", labels(sample));
                }
            }
        }
        let _ = writeln!(out, "# HELP {CAPACITY_BASIS} {CAPACITY_BASIS_HELP}");
        let _ = writeln!(out, "# TYPE {CAPACITY_BASIS} gauge");
        for sample in samples.iter() {
            let _ = writeln!(
                out,
                "{CAPACITY_BASIS}{{{},rests_on=\"{}\"}} 1",
                labels(sample),
                sample.rests_on
            );
        }
        let _ = writeln!(out, "# HELP {CAPACITY_OBJECTIVE} {CAPACITY_OBJECTIVE_HELP}");
        let _ = writeln!(out, "# TYPE {CAPACITY_OBJECTIVE} gauge");
        for sample in samples.iter().filter(|s| s.objective.is_finite()) {
            let _ = writeln!(
                out,
                "{CAPACITY_OBJECTIVE}{{{}}} {}",
                labels(sample),
                sample.objective
            );
        }
        if samples.iter().any(|s| !s.production.is_empty()) {
            let _ = writeln!(
                out,
                "# HELP {CAPACITY_ATTAINMENT} {CAPACITY_ATTAINMENT_HELP}"
            );
            let _ = writeln!(out, "# TYPE {CAPACITY_ATTAINMENT} gauge");
            for sample in samples.iter() {
                for cell in sample
                    .production
                    .iter()
                    .filter(|c| c.attainment.is_finite())
                {
                    let _ = writeln!(
                        out,
                        "{CAPACITY_ATTAINMENT}{{{},context_bucket=\"{}\",concurrency_bucket=\"{}\",target=\"{}\"}} {}",
                        labels(sample),
                        label_value(&cell.context),
                        label_value(&cell.concurrency),
                        label_value(&cell.target),
                        cell.attainment
                    );
                }
            }
        }
        if samples.iter().any(|s| !s.capacities.is_empty()) {
            let _ = writeln!(out, "# HELP {CAPACITY_STREAMS} {CAPACITY_STREAMS_HELP}");
            let _ = writeln!(out, "# TYPE {CAPACITY_STREAMS} gauge");
            for sample in samples.iter() {
                for (context, streams, lower_bound) in &sample.capacities {
                    let _ = writeln!(
                        out,
                        "{CAPACITY_STREAMS}{{{},context_bucket=\"{}\",lower_bound=\"{lower_bound}\"}} {streams}",
                        labels(sample),
                        label_value(context)
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_the_three_gauges_and_nothing_when_empty() {
        let gauges = CapacityGauges::default();
        let mut out = String::new();
        gauges.render_into(&mut out);
        assert!(out.is_empty());
        gauges.replace(vec![HeadroomSample {
            upstream: "default".into(),
            model: "m".into(),
            headroom: Some(0.75),
            lower_bound: true,
            load: 2.0,
            running: Some(6),
            capacities: vec![("8K".into(), 8, true)],
            rests_on: "production_misses",
            objective: 0.99,
            production: vec![ProductionCellSample {
                context: "32K".into(),
                concurrency: "4".into(),
                target: "ttft".into(),
                attainment: 0.848,
            }],
        }]);
        gauges.render_into(&mut out);
        for line in [
            "tokentap_capacity_headroom_ratio{upstream=\"default\",model=\"m\",lower_bound=\"true\"} 0.75\n",
            "tokentap_capacity_load_streams{upstream=\"default\",model=\"m\"} 2\n",
            "tokentap_capacity_running_streams{upstream=\"default\",model=\"m\"} 6\n",
            "tokentap_capacity_streams{upstream=\"default\",model=\"m\",context_bucket=\"8K\",lower_bound=\"true\"} 8\n",
            "tokentap_capacity_headroom_basis{upstream=\"default\",model=\"m\",rests_on=\"production_misses\"} 1\n",
            "tokentap_capacity_objective_ratio{upstream=\"default\",model=\"m\"} 0.99\n",
            "tokentap_capacity_production_attainment_ratio{upstream=\"default\",model=\"m\",context_bucket=\"32K\",concurrency_bucket=\"4\",target=\"ttft\"} 0.848\n",
        ] {
            assert!(out.contains(line), "{line}\n{out}");
        }
    }
}
