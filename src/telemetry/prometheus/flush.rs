//! Flushing a request's own histograms (inter-token latency, per-frame overhead) into the
//! exporter's, bucket by bucket, with a bounded number of samples.

use metrics::Histogram;

use crate::meter::timeline::LocalHistogram;

/// Most samples one request's histogram adds to the exporter. `record_many` pushes one sample
/// per count (the exporter keeps raw samples until upkeep), so a count is never handed over
/// unbounded: above this, buckets are down-sampled in proportion (each non-empty bucket keeps
/// at least one sample). 16,384 covers every request up to that many tokens exactly and costs
/// well under a millisecond when an upstream reports an absurd count.
pub const MAX_SAMPLES_PER_FLUSH: u64 = 16_384;

/// Adds `local`'s buckets to `histogram`, each as its mean value.
pub(super) fn flush(histogram: &Histogram, local: &LocalHistogram) {
    let total = local.count();
    for (mean, count) in local.buckets() {
        histogram.record_many(mean, flushed_samples(count, total));
    }
}

/// Samples flushed for a bucket of `count` out of `total`: exact up to
/// [`MAX_SAMPLES_PER_FLUSH`], proportional above it. O(1), never more than the cap per bucket.
fn flushed_samples(count: u64, total: u64) -> usize {
    let samples = if total <= MAX_SAMPLES_PER_FLUSH {
        count
    } else {
        let scaled = u128::from(count) * u128::from(MAX_SAMPLES_PER_FLUSH) / u128::from(total);
        u64::try_from(scaled)
            .unwrap_or(MAX_SAMPLES_PER_FLUSH)
            .max(1)
    };
    usize::try_from(samples.min(MAX_SAMPLES_PER_FLUSH)).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use metrics::{Key, Recorder};
    use metrics_exporter_prometheus::PrometheusBuilder;

    use super::*;

    #[test]
    fn counts_up_to_the_cap_are_flushed_exactly() {
        assert_eq!(flushed_samples(7, 10), 7);
        assert_eq!(
            flushed_samples(MAX_SAMPLES_PER_FLUSH, MAX_SAMPLES_PER_FLUSH),
            MAX_SAMPLES_PER_FLUSH as usize
        );
    }

    #[test]
    fn counts_past_the_cap_are_scaled_down_and_never_vanish() {
        let total = 4 * MAX_SAMPLES_PER_FLUSH;
        assert_eq!(
            flushed_samples(total / 2, total),
            (MAX_SAMPLES_PER_FLUSH / 2) as usize
        );
        assert_eq!(flushed_samples(1, total), 1, "a non-empty bucket keeps one");
        assert_eq!(
            flushed_samples(u64::MAX, u64::MAX),
            MAX_SAMPLES_PER_FLUSH as usize,
            "an absurd count costs the cap, no more"
        );
    }

    #[test]
    fn a_local_histogram_lands_as_its_bucket_means_and_counts() {
        static BOUNDS: &[f64] = &[1.0, 10.0];
        let recorder = PrometheusBuilder::new()
            .set_buckets(BOUNDS)
            .unwrap()
            .build_recorder();
        let metadata = metrics::Metadata::new(module_path!(), metrics::Level::INFO, None);
        let histogram = recorder.register_histogram(&Key::from_name("flushed"), &metadata);
        let mut local = LocalHistogram::new(&BOUNDS);
        local.record(0.5, 3);
        local.record(4.0, 1);
        local.record(6.0, 1);
        flush(&histogram, &local);
        let page = recorder.handle().render();
        assert!(page.contains("flushed_bucket{le=\"1\"} 3"), "{page}");
        assert!(page.contains("flushed_bucket{le=\"10\"} 5"), "{page}");
        assert!(page.contains("flushed_count 5"), "{page}");
        // The mean of each bucket times its count: the sum is exact.
        assert!(page.contains("flushed_sum 11.5"), "{page}");
    }
}
