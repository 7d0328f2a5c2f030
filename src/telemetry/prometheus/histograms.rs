//! tokentap's own Prometheus histograms: per series one atomic counter per bucket and an
//! atomic sum, registered beside the exporter's counters and gauges and written in the same
//! text format (`metrics_exporter_prometheus::formatting`'s escaping, the exporter's line
//! layout), so `/metrics` reads the same series and values as when the exporter kept them.
//!
//! Why not the exporter's histograms: they keep every sample raw until upkeep drains them
//! (every 5 s), so a request's inter-token latencies were handed over as one sample per token
//! (`Histogram::record_many` pushes `count` copies) — O(tokens) at each request's end, and
//! memory that grows with the traffic between upkeeps (docs/benchmarks.md, "A core of its
//! own, and short requests"). Here a sample is O(log buckets): a bucket search, one atomic
//! add and one compare-and-swap on the sum, whatever its weight, and nothing to drain.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use metrics::{Histogram, HistogramFn, Key};
use metrics_exporter_prometheus::formatting::{
    sanitize_description, sanitize_label_key, sanitize_label_value, sanitize_metric_name,
};

use crate::base::lock;
use crate::telemetry::names::{DESCRIPTIONS, HISTOGRAM_BUCKETS};

/// One series: counts per bucket (not cumulative; one more than `bounds`, the overflow) and
/// the sum of the samples, as `f64` bits.
#[derive(Debug)]
pub(super) struct BucketHistogram {
    bounds: &'static [f64],
    counts: Box<[AtomicU64]>,
    sum_bits: AtomicU64,
}

impl BucketHistogram {
    fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_bits: AtomicU64::new(0f64.to_bits()),
        }
    }

    /// Adds `count` samples of `value`: the first bucket whose bound is ≥ `value` (the
    /// exporter's "less than or equal" rule), else the overflow.
    fn add(&self, value: f64, count: u64) {
        if count == 0 || value.is_nan() {
            return;
        }
        let index = self.bounds.partition_point(|&bound| bound < value);
        if let Some(bucket) = self.counts.get(index) {
            bucket.fetch_add(count, Ordering::Relaxed);
        }
        let added = value * count as f64;
        // A failed update only means another request added in between: retry on its sum.
        let _ = self
            .sum_bits
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                Some((f64::from_bits(bits) + added).to_bits())
            });
    }

    /// (cumulative count per bound, total count, sum), read once each.
    fn snapshot(&self) -> (Vec<u64>, u64, f64) {
        let mut cumulative = Vec::with_capacity(self.bounds.len());
        let mut total = 0u64;
        for (i, bucket) in self.counts.iter().enumerate() {
            total = total.saturating_add(bucket.load(Ordering::Relaxed));
            if i < self.bounds.len() {
                cumulative.push(total);
            }
        }
        (
            cumulative,
            total,
            f64::from_bits(self.sum_bits.load(Ordering::Relaxed)),
        )
    }
}

impl HistogramFn for BucketHistogram {
    fn record(&self, value: f64) {
        self.add(value, 1);
    }

    fn record_many(&self, value: f64, count: usize) {
        self.add(value, u64::try_from(count).unwrap_or(u64::MAX));
    }
}

/// A series as it is written: its escaped label pairs (`k="v",…`, empty when none).
#[derive(Debug)]
struct Series {
    labels: String,
    histogram: Arc<BucketHistogram>,
}

/// Every histogram series of one sink, by metric name (registration is rare: once per label
/// set, under the handle cache's own lock; recording never touches this).
#[derive(Debug, Default)]
pub(super) struct HistogramRegistry {
    families: Mutex<HashMap<String, Vec<Series>>>,
}

impl HistogramRegistry {
    /// The histogram of `key`, made on first use with its name's bounds
    /// (`names::HISTOGRAM_BUCKETS`); the same handle again for the same key. A name without
    /// bounds gets a no-op handle (a test keeps every recorded name bounded).
    pub(super) fn register(&self, key: &Key) -> Histogram {
        let Some(bounds) = HISTOGRAM_BUCKETS
            .iter()
            .find(|(name, _)| *name == key.name())
            .map(|(_, bounds)| *bounds)
        else {
            return Histogram::noop();
        };
        let labels = label_pairs(key);
        let mut families = lock::lock(&self.families);
        let family = families
            .entry(sanitize_metric_name(key.name()))
            .or_default();
        if let Some(series) = family.iter().find(|s| s.labels == labels) {
            return Histogram::from_arc(Arc::clone(&series.histogram));
        }
        let histogram = Arc::new(BucketHistogram::new(bounds));
        family.push(Series {
            labels,
            histogram: Arc::clone(&histogram),
        });
        Histogram::from_arc(histogram)
    }

    /// Appends every family in the text format, as the exporter wrote histograms: HELP, TYPE,
    /// per series its buckets, `+Inf`, `_sum` and `_count`, a blank line after each family.
    pub(super) fn render_into(&self, out: &mut String) {
        let families = lock::lock(&self.families);
        for (name, series) in families.iter() {
            if let Some((_, help)) = DESCRIPTIONS.iter().find(|(n, _)| n == name) {
                let _ = writeln!(out, "# HELP {name} {}", sanitize_description(help));
            }
            let _ = writeln!(out, "# TYPE {name} histogram");
            for s in series {
                let (cumulative, count, sum) = s.histogram.snapshot();
                let sep = if s.labels.is_empty() { "" } else { "," };
                for (bound, n) in s.histogram.bounds.iter().zip(&cumulative) {
                    let _ = writeln!(out, "{name}_bucket{{{}{sep}le=\"{bound}\"}} {n}", s.labels);
                }
                let _ = writeln!(out, "{name}_bucket{{{}{sep}le=\"+Inf\"}} {count}", s.labels);
                if s.labels.is_empty() {
                    let _ = writeln!(out, "{name}_sum {sum}");
                    let _ = writeln!(out, "{name}_count {count}");
                } else {
                    let _ = writeln!(out, "{name}_sum{{{}}} {sum}", s.labels);
                    let _ = writeln!(out, "{name}_count{{{}}} {count}", s.labels);
                }
            }
            out.push('\n');
        }
    }
}

/// `key`'s labels written as the exporter writes them: a later label of the same key replaces
/// an earlier one in its place.
fn label_pairs(key: &Key) -> String {
    let mut pairs: Vec<(String, String)> = Vec::new();
    for label in key.labels() {
        let value = sanitize_label_value(label.value());
        match pairs.iter_mut().find(|(k, _)| k == label.key()) {
            Some(pair) => pair.1 = value,
            None => pairs.push((label.key().to_string(), value)),
        }
    }
    let mut out = String::new();
    for (i, (k, v)) in pairs.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(out, "{}=\"{v}\"", sanitize_label_key(k));
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use metrics::{Label, Recorder};
    use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};

    use super::*;
    use crate::telemetry::names::{INTER_TOKEN_LATENCY, PROXY_OVERHEAD, TIME_TO_FIRST_TOKEN};

    /// Every histogram sample line of `page` as (series, value).
    fn samples(page: &str) -> BTreeMap<String, f64> {
        page.lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .filter_map(|l| {
                let (series, value) = l.rsplit_once(' ')?;
                Some((series.to_string(), value.parse().ok()?))
            })
            .collect()
    }

    /// The same samples recorded into the exporter's histograms (as before) and into these:
    /// the same series, the same counts, the same sums (to rounding: the exporter adds a
    /// weighted sample's value once per copy).
    #[test]
    fn the_page_reads_as_the_exporters_did_for_the_same_samples() {
        let mut builder = PrometheusBuilder::new();
        for (name, buckets) in HISTOGRAM_BUCKETS {
            builder = builder
                .set_buckets_for_metric(Matcher::Full((*name).to_string()), buckets)
                .unwrap();
        }
        let exporter = builder.build_recorder();
        let ours = HistogramRegistry::default();
        let metadata = metrics::Metadata::new(module_path!(), metrics::Level::INFO, None);
        let keys = [
            Key::from_parts(
                TIME_TO_FIRST_TOKEN,
                vec![
                    Label::new("model", "m \"quoted\"\nline"),
                    Label::new("context_bucket", "8K"),
                ],
            ),
            Key::from_parts(INTER_TOKEN_LATENCY, vec![Label::new("model", "m")]),
            Key::from_name(PROXY_OVERHEAD),
        ];
        let samples_in: [(f64, usize); 8] = [
            (0.0, 1),
            (0.0123, 1),
            (0.5, 3),
            (1.0, 2),
            (7.25, 1),
            (1e9, 1),
            (0.02, 250),
            (0.000_3, 17),
        ];
        for key in &keys {
            let theirs = exporter.register_histogram(key, &metadata);
            let mine = ours.register(key);
            for (value, count) in samples_in {
                theirs.record_many(value, count);
                mine.record_many(value, count);
            }
        }
        let mut page = String::new();
        ours.render_into(&mut page);
        let (theirs, mine) = (samples(&exporter.handle().render()), samples(&page));
        assert_eq!(
            theirs.keys().collect::<Vec<_>>(),
            mine.keys().collect::<Vec<_>>(),
            "{page}"
        );
        for (series, value) in &theirs {
            let got = mine[series];
            let close = (got - value).abs() <= 1e-9 * value.abs().max(1.0);
            assert!(close, "{series}: exporter {value}, ours {got}");
        }
        assert!(page.contains("# TYPE tokentap_time_to_first_token_seconds histogram"));
        assert!(page.contains("# HELP tokentap_time_to_first_token_seconds "));
    }

    #[test]
    fn a_heavy_sample_costs_one_add_and_counts_exactly() {
        let ours = HistogramRegistry::default();
        let histogram = ours.register(&Key::from_name(INTER_TOKEN_LATENCY));
        // Past the exporter's old per-flush cap of 16,384 samples: counted exactly, not scaled.
        histogram.record_many(0.01, 1_000_000);
        histogram.record_many(f64::NAN, 5);
        let mut page = String::new();
        ours.render_into(&mut page);
        let lines = samples(&page);
        assert_eq!(lines[&format!("{INTER_TOKEN_LATENCY}_count")], 1_000_000.0);
        assert_eq!(
            lines[&format!("{INTER_TOKEN_LATENCY}_bucket{{le=\"+Inf\"}}")],
            1_000_000.0
        );
        assert!((lines[&format!("{INTER_TOKEN_LATENCY}_sum")] - 10_000.0).abs() < 1e-6);
    }

    #[test]
    fn the_same_key_is_one_series_and_an_unbounded_name_is_not_shown() {
        let ours = HistogramRegistry::default();
        let key = Key::from_parts(TIME_TO_FIRST_TOKEN, vec![Label::new("model", "m")]);
        ours.register(&key).record(0.1);
        ours.register(&key).record(0.2);
        ours.register(&Key::from_name("tokentap_not_bounded"))
            .record(1.0);
        let mut page = String::new();
        ours.render_into(&mut page);
        let lines = samples(&page);
        assert_eq!(
            lines[&format!("{TIME_TO_FIRST_TOKEN}_count{{model=\"m\"}}")],
            2.0
        );
        assert!(!page.contains("tokentap_not_bounded"), "{page}");
    }
}
