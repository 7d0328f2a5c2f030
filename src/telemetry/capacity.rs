//! The capacity gauges: `tokentap_capacity_headroom_ratio{upstream, model}` (1 − load ÷
//! capacity of the traffic's context mix), `tokentap_capacity_load_streams{upstream, model}`
//! (production requests decoding at once) and `tokentap_capacity_streams{upstream, model,
//! context_bucket}` (streams each context can take under the SLO). The set the refresher
//! computed last, replaced whole on each refresh (a model without a capacity answer loses its
//! series at once) and written into `/metrics` as text. Never touched on the request path.

use std::fmt::Write as _;
use std::sync::{Arc, RwLock};

use super::names::{
    label_value, CAPACITY_HEADROOM, CAPACITY_HEADROOM_HELP, CAPACITY_LOAD, CAPACITY_LOAD_HELP,
    CAPACITY_STREAMS, CAPACITY_STREAMS_HELP,
};
use crate::base::lock;

/// One model's figures.
#[derive(Debug, Clone, PartialEq)]
pub struct HeadroomSample {
    pub upstream: String,
    pub model: String,
    /// 1 − load ÷ capacity; `None` when no context of the traffic has a capacity answer.
    pub headroom: Option<f64>,
    pub load: f64,
    /// (context ladder label, streams) for every context with an answer.
    pub capacities: Vec<(String, u32)>,
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
                let _ = writeln!(out, "{CAPACITY_HEADROOM}{{{}}} {value}", labels(sample));
            }
        }
        let _ = writeln!(out, "# HELP {CAPACITY_LOAD} {CAPACITY_LOAD_HELP}");
        let _ = writeln!(out, "# TYPE {CAPACITY_LOAD} gauge");
        for sample in samples.iter().filter(|s| s.load.is_finite()) {
            let _ = writeln!(out, "{CAPACITY_LOAD}{{{}}} {}", labels(sample), sample.load);
        }
        if samples.iter().any(|s| !s.capacities.is_empty()) {
            let _ = writeln!(out, "# HELP {CAPACITY_STREAMS} {CAPACITY_STREAMS_HELP}");
            let _ = writeln!(out, "# TYPE {CAPACITY_STREAMS} gauge");
            for sample in samples.iter() {
                for (context, streams) in &sample.capacities {
                    let _ = writeln!(
                        out,
                        "{CAPACITY_STREAMS}{{{},context_bucket=\"{}\"}} {streams}",
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
            load: 2.0,
            capacities: vec![("8K".into(), 8)],
        }]);
        gauges.render_into(&mut out);
        for line in [
            "tokentap_capacity_headroom_ratio{upstream=\"default\",model=\"m\"} 0.75\n",
            "tokentap_capacity_load_streams{upstream=\"default\",model=\"m\"} 2\n",
            "tokentap_capacity_streams{upstream=\"default\",model=\"m\",context_bucket=\"8K\"} 8\n",
        ] {
            assert!(out.contains(line), "{line}\n{out}");
        }
    }
}
