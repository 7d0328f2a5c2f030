//! The drift gauges, `tokentap_drift_ratio{upstream, model, context_bucket, concurrency_bucket,
//! metric}`: the set of values the drift refresher computed last, written into `/metrics` as
//! text. The set is replaced whole on each refresh, so a cell that falls below the request
//! threshold loses its series at once (the exporter's own gauges would keep their last value).
//! Never touched on the request path: the refresher writes, the scrape reads.

use std::fmt::Write as _;
use std::sync::{Arc, RwLock};

use super::names::{label_value, DRIFT_RATIO, DRIFT_RATIO_HELP};
use crate::base::lock;
pub use crate::matrix::compare::DriftSample;

/// The current drift values, shared by the refresher and the Prometheus renderer.
#[derive(Debug, Default)]
pub struct DriftGauges(RwLock<Arc<Vec<DriftSample>>>);

impl DriftGauges {
    /// Replaces every value (an empty set removes every series).
    pub fn replace(&self, samples: Vec<DriftSample>) {
        *lock::write(&self.0) = Arc::new(samples);
    }

    pub fn samples(&self) -> Arc<Vec<DriftSample>> {
        Arc::clone(&lock::read(&self.0))
    }

    /// Appends the exposition lines (nothing at all when there is no value).
    pub fn render_into(&self, out: &mut String) {
        let samples = self.samples();
        if samples.is_empty() {
            return;
        }
        let _ = writeln!(out, "# HELP {DRIFT_RATIO} {DRIFT_RATIO_HELP}");
        let _ = writeln!(out, "# TYPE {DRIFT_RATIO} gauge");
        for sample in samples.iter().filter(|s| s.value.is_finite()) {
            let _ = writeln!(
                out,
                "{DRIFT_RATIO}{{upstream=\"{}\",model=\"{}\",context_bucket=\"{}\",concurrency_bucket=\"{}\",metric=\"{}\"}} {}",
                label_value(&sample.upstream),
                label_value(&sample.model),
                label_value(&sample.context_bucket),
                label_value(&sample.concurrency_bucket),
                label_value(sample.metric),
                sample.value
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_escaped_labels_and_nothing_when_empty() {
        let gauges = DriftGauges::default();
        let mut out = String::new();
        gauges.render_into(&mut out);
        assert!(out.is_empty());
        gauges.replace(vec![DriftSample {
            upstream: "default".into(),
            model: "a\"b\\c\nd".into(),
            context_bucket: "8K".into(),
            concurrency_bucket: "8".into(),
            metric: "ttft",
            value: 1.5,
        }]);
        gauges.render_into(&mut out);
        assert!(out.contains("# TYPE tokentap_drift_ratio gauge\n"), "{out}");
        assert!(
            out.contains("tokentap_drift_ratio{upstream=\"default\",model=\"a\\\"b\\\\c\\nd\",context_bucket=\"8K\",concurrency_bucket=\"8\",metric=\"ttft\"} 1.5\n"),
            "{out}"
        );
        gauges.replace(Vec::new());
        let mut again = String::new();
        gauges.render_into(&mut again);
        assert!(again.is_empty());
    }
}
