//! The tail rule: a p90 or p99 is shown only from enough samples to carry it.

use crate::aggregate::sketch::QuantileSketch;

/// Fewest samples a p90 is shown from, and a p99: below them the tail is absent ("—"), never
/// a number that is only the median again.
pub const MIN_SAMPLES_FOR_P90: f64 = 10.0;
pub const MIN_SAMPLES_FOR_P99: f64 = 100.0;

/// The `q` quantile of `sketch` in milliseconds when `samples` carry it (p90 from
/// [`MIN_SAMPLES_FOR_P90`], p99 from [`MIN_SAMPLES_FOR_P99`]).
pub fn tail_ms(sketch: &QuantileSketch, q: f64, samples: f64) -> Option<f64> {
    let needed = if q > 0.9 {
        MIN_SAMPLES_FOR_P99
    } else {
        MIN_SAMPLES_FOR_P90
    };
    (samples >= needed)
        .then(|| sketch.quantile(q).map(|s| s * 1000.0))
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tail_needs_its_own_number_of_samples() {
        let mut sketch = QuantileSketch::default();
        for i in 1..=100 {
            sketch.add(f64::from(i) / 1000.0, 1.0);
        }
        let below_p90 = MIN_SAMPLES_FOR_P90 - 1.0;
        assert_eq!(tail_ms(&sketch, 0.9, below_p90), None);
        assert_eq!(tail_ms(&sketch, 0.99, MIN_SAMPLES_FOR_P99 - 1.0), None);
        let p90 = tail_ms(&sketch, 0.9, MIN_SAMPLES_FOR_P90).unwrap();
        assert!((p90 - 90.0).abs() <= 90.0 * 0.011, "{p90} ms");
        let p99 = tail_ms(&sketch, 0.99, MIN_SAMPLES_FOR_P99).unwrap();
        assert!((p99 - 99.0).abs() <= 99.0 * 0.011, "{p99} ms");
        // An empty sketch has no tail, however many samples are claimed.
        assert_eq!(tail_ms(&QuantileSketch::default(), 0.9, 1000.0), None);
    }
}
