//! The capacity gauges: `tokentap_capacity_headroom_ratio{upstream, model, lower_bound}` (1 −
//! load ÷ capacity of the traffic's context mix), `tokentap_capacity_load_streams{upstream,
//! model}` (production requests decoding at once, the window's mean),
//! `tokentap_capacity_running_streams{upstream, model}` (requests in flight now) and
//! `tokentap_capacity_streams{upstream, model, context_bucket, lower_bound}` (streams each
//! context can take under the SLO). `lower_bound="true"`: the sweep never saw a cell miss, so
//! the capacity (and the headroom) is at least the figure. The set the refresher
//! computed last, replaced whole on each refresh (a model without a capacity answer loses its
//! series at once) and written into `/metrics` as text. Never touched on the request path.

use std::fmt::Write as _;
use std::sync::{Arc, RwLock};

use super::names::{
    label_value, CAPACITY_HEADROOM, CAPACITY_HEADROOM_HELP, CAPACITY_LOAD, CAPACITY_LOAD_HELP,
    CAPACITY_RUNNING, CAPACITY_RUNNING_HELP, CAPACITY_STREAMS, CAPACITY_STREAMS_HELP,
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
        }]);
        gauges.render_into(&mut out);
        for line in [
            "tokentap_capacity_headroom_ratio{upstream=\"default\",model=\"m\",lower_bound=\"true\"} 0.75\n",
            "tokentap_capacity_load_streams{upstream=\"default\",model=\"m\"} 2\n",
            "tokentap_capacity_running_streams{upstream=\"default\",model=\"m\"} 6\n",
            "tokentap_capacity_streams{upstream=\"default\",model=\"m\",context_bucket=\"8K\",lower_bound=\"true\"} 8\n",
        ] {
            assert!(out.contains(line), "{line}\n{out}");
        }
    }
}
