//! Flushing a request's own histograms (inter-token latency, per-frame overhead) into the
//! sink's, bucket by bucket.

use metrics::Histogram;

use crate::meter::timeline::LocalHistogram;

/// Adds `local`'s buckets to `histogram`, each as its mean value with its whole count: one
/// bucket add per non-empty local bucket (`histograms::BucketHistogram`), whatever the count,
/// so a request of a million tokens costs what one of ten does and is counted exactly.
pub(super) fn flush(histogram: &Histogram, local: &LocalHistogram) {
    for (mean, count) in local.buckets() {
        histogram.record_many(mean, usize::try_from(count).unwrap_or(usize::MAX));
    }
}

#[cfg(test)]
mod tests {
    use metrics::Key;

    use super::super::histograms::HistogramRegistry;
    use super::*;
    use crate::meter::bounds::TOKEN_GAP_BOUNDS;
    use crate::telemetry::names::INTER_TOKEN_LATENCY;

    #[test]
    fn a_local_histogram_lands_as_its_bucket_means_and_counts() {
        let registry = HistogramRegistry::default();
        let histogram = registry.register(&Key::from_name(INTER_TOKEN_LATENCY));
        let mut local = LocalHistogram::new(&TOKEN_GAP_BOUNDS);
        local.record(0.0005, 3);
        local.record(0.04, 1);
        local.record(0.06, 1);
        flush(&histogram, &local);
        let mut page = String::new();
        registry.render_into(&mut page);
        assert!(
            page.contains(&format!("{INTER_TOKEN_LATENCY}_count 5")),
            "{page}"
        );
        // The mean of each bucket times its count: the sum is exact.
        let sum = page
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{INTER_TOKEN_LATENCY}_sum ")))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap();
        assert!((sum - 0.1015).abs() < 1e-12, "{page}");
    }
}
