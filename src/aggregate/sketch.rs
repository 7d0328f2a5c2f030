//! A bounded quantile sketch for medians of latencies (TTFT, TBT) and rates (prefill tok/s).
//!
//! Log-bucketed, in the manner of DDSketch: a positive value x falls in bin
//! k = ⌈ln x / ln γ⌉ with γ = (1 + α)/(1 − α), and a bin is reported as 2γᵏ/(γ + 1), which is
//! within a relative error α of every value in the bin. Here α = 1 %. At most [`MAX_BINS`]
//! bins are kept: when a new bin would exceed that, the two lowest bins are merged, so only
//! the lowest quantiles of a distribution wider than γ^MAX_BINS (≈ 167×) lose accuracy —
//! a median stays within 1 % unless more than half of the weight lies below 1/167 of the
//! largest value. Memory is therefore bounded (≤ 256 bins of 16 bytes) whatever the traffic.
//!
//! Pure data: no I/O, no clock, no allocation beyond the bin vector.

/// Relative accuracy of every quantile this sketch reports (while no bins were collapsed).
pub const RELATIVE_ACCURACY: f64 = 0.01;

/// Most bins a sketch keeps.
pub const MAX_BINS: usize = 256;

/// γ = (1 + α)/(1 − α).
const GAMMA: f64 = (1.0 + RELATIVE_ACCURACY) / (1.0 - RELATIVE_ACCURACY);

/// Weighted values summarised in log-spaced bins.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct QuantileSketch {
    /// (bin index, weight), sorted by index, weights > 0.
    bins: Vec<(i32, f64)>,
    /// Weight of values ≤ 0 (reported as 0).
    zero_weight: f64,
    total_weight: f64,
}

fn bin_of(value: f64) -> i32 {
    // Values are clamped to ±2^30 bins, far beyond any latency or rate in f64 range.
    let index = (value.ln() / GAMMA.ln()).ceil();
    index.clamp(-(1 << 30) as f64, (1 << 30) as f64) as i32
}

fn value_of(bin: i32) -> f64 {
    2.0 * GAMMA.powi(bin) / (GAMMA + 1.0)
}

impl QuantileSketch {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `value` with weight `weight`. Non-finite values and non-positive weights are
    /// ignored (they cannot come from a clock, but a bad record must not poison a cell).
    pub fn add(&mut self, value: f64, weight: f64) {
        if !value.is_finite() || !weight.is_finite() || weight <= 0.0 {
            return;
        }
        self.total_weight += weight;
        if value <= 0.0 {
            self.zero_weight += weight;
            return;
        }
        self.add_bin(bin_of(value), weight);
    }

    fn add_bin(&mut self, bin: i32, weight: f64) {
        match self.bins.binary_search_by_key(&bin, |&(k, _)| k) {
            Ok(position) => {
                if let Some(entry) = self.bins.get_mut(position) {
                    entry.1 += weight;
                }
            }
            Err(position) => {
                self.bins.insert(position, (bin, weight));
                self.collapse();
            }
        }
    }

    /// Merges the lowest bins until at most [`MAX_BINS`] remain.
    fn collapse(&mut self) {
        while self.bins.len() > MAX_BINS {
            let lowest = self.bins.remove(0);
            if let Some(next) = self.bins.first_mut() {
                next.1 += lowest.1;
            }
        }
    }

    /// Adds every value of `other`.
    pub fn merge(&mut self, other: &QuantileSketch) {
        self.total_weight += other.total_weight;
        self.zero_weight += other.zero_weight;
        if self.bins.is_empty() {
            self.bins.clone_from(&other.bins);
            return;
        }
        let mut merged = Vec::with_capacity(self.bins.len() + other.bins.len());
        let (mut a, mut b) = (self.bins.iter().peekable(), other.bins.iter().peekable());
        loop {
            let next = match (a.peek(), b.peek()) {
                (Some(&&(ka, wa)), Some(&&(kb, wb))) => {
                    if ka == kb {
                        a.next();
                        b.next();
                        (ka, wa + wb)
                    } else if ka < kb {
                        a.next();
                        (ka, wa)
                    } else {
                        b.next();
                        (kb, wb)
                    }
                }
                (Some(&&entry), None) => {
                    a.next();
                    entry
                }
                (None, Some(&&entry)) => {
                    b.next();
                    entry
                }
                (None, None) => break,
            };
            merged.push(next);
        }
        self.bins = merged;
        self.collapse();
    }

    /// Total weight added.
    pub fn weight(&self) -> f64 {
        self.total_weight
    }

    pub fn is_empty(&self) -> bool {
        self.total_weight <= 0.0
    }

    /// Number of bins in use (for memory accounting).
    pub fn bins(&self) -> usize {
        self.bins.len()
    }

    /// The value at quantile `q` (0 ≤ q ≤ 1) of the weighted values: the bin holding the
    /// point where the cumulative weight reaches q × total. When that point falls exactly on
    /// the boundary between two bins (an even number of equal weights, for the median), the
    /// mean of the two: the textbook median, which is what the sweep computes from its records,
    /// so that a production cell and a sweep cell of the same requests report the same TTFT.
    /// `None` when empty.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        if self.is_empty() || !q.is_finite() {
            return None;
        }
        let q = q.clamp(0.0, 1.0);
        let rank = q * self.total_weight;
        let on_boundary = |cumulative: f64| {
            q > 0.0 && q < 1.0 && (cumulative - rank).abs() <= 1e-9 * self.total_weight
        };
        let mut cumulative = self.zero_weight;
        if cumulative >= rank && self.zero_weight > 0.0 {
            return Some(match self.bins.first() {
                Some(&(next, _)) if on_boundary(cumulative) => value_of(next) / 2.0,
                _ => 0.0,
            });
        }
        for (index, &(bin, weight)) in self.bins.iter().enumerate() {
            cumulative += weight;
            if cumulative >= rank {
                return Some(match self.bins.get(index + 1) {
                    Some(&(next, _)) if on_boundary(cumulative) => {
                        (value_of(bin) + value_of(next)) / 2.0
                    }
                    _ => value_of(bin),
                });
            }
        }
        self.bins.last().map(|&(bin, _)| value_of(bin))
    }

    /// The weighted median.
    pub fn median(&self) -> Option<f64> {
        self.quantile(0.5)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_value_comes_back_within_the_relative_accuracy() {
        for value in [1e-6, 0.0031, 0.05, 1.0, 17.3, 12_345.0, 9.9e8] {
            let mut sketch = QuantileSketch::new();
            sketch.add(value, 1.0);
            let median = sketch.median().unwrap();
            assert!(
                (median - value).abs() <= RELATIVE_ACCURACY * value * (1.0 + 1e-9),
                "{value} → {median}"
            );
        }
    }

    #[test]
    fn an_even_count_has_the_mean_of_the_middle_two_as_its_median() {
        // Two streams of a cell: the sweep's median of [0.144, 0.164] is 0.154.
        let mut sketch = QuantileSketch::new();
        sketch.add(0.144, 1.0);
        sketch.add(0.164, 1.0);
        let median = sketch.median().unwrap();
        assert!(
            (median - 0.154).abs() <= 0.154 * RELATIVE_ACCURACY,
            "{median}"
        );
        // Four values: the mean of the second and third.
        sketch.add(0.100, 1.0);
        sketch.add(0.300, 1.0);
        let median = sketch.median().unwrap();
        assert!(
            (median - 0.154).abs() <= 0.154 * RELATIVE_ACCURACY,
            "{median}"
        );
        // An odd count keeps the middle value.
        sketch.add(0.500, 1.0);
        let median = sketch.median().unwrap();
        assert!(
            (median - 0.164).abs() <= 0.164 * RELATIVE_ACCURACY,
            "{median}"
        );
    }

    #[test]
    fn weighted_median_and_quantiles() {
        let mut sketch = QuantileSketch::new();
        sketch.add(0.010, 3.0);
        sketch.add(0.100, 1.0);
        let median = sketch.median().unwrap();
        assert!((median - 0.010).abs() < 0.010 * 0.011, "{median}");
        let p99 = sketch.quantile(0.99).unwrap();
        assert!((p99 - 0.100).abs() < 0.100 * 0.011, "{p99}");
        assert_eq!(sketch.weight(), 4.0);
        sketch.add(f64::NAN, 1.0);
        sketch.add(1.0, -1.0);
        assert_eq!(sketch.weight(), 4.0);
        assert_eq!(QuantileSketch::new().median(), None);
    }

    #[test]
    fn memory_is_bounded_and_the_median_survives_collapsing() {
        let mut sketch = QuantileSketch::new();
        // A million values spread over twelve decades: far more bins than allowed.
        for i in 0..1_000_000u64 {
            let value = 10f64.powf(-6.0 + 12.0 * (i % 10_007) as f64 / 10_007.0);
            sketch.add(value, 1.0);
        }
        assert!(sketch.bins() <= MAX_BINS);
        // Most of the weight in a narrow band: the median is exact to 1 %.
        let mut narrow = QuantileSketch::new();
        for i in 0..10_000u64 {
            narrow.add(1e-9 * (1 + i % 1000) as f64, 1.0);
        }
        for _ in 0..30_000 {
            narrow.add(0.025, 1.0);
        }
        assert!(narrow.bins() <= MAX_BINS);
        let median = narrow.median().unwrap();
        assert!((median - 0.025).abs() < 0.025 * 0.011, "{median}");
    }

    #[test]
    fn merge_equals_adding_everything_to_one() {
        let values: Vec<f64> = (1..500).map(|i| (i as f64).sqrt() * 0.003).collect();
        let mut one = QuantileSketch::new();
        let mut left = QuantileSketch::new();
        let mut right = QuantileSketch::new();
        for (i, v) in values.iter().enumerate() {
            one.add(*v, 1.0);
            if i % 3 == 0 {
                left.add(*v, 1.0);
            } else {
                right.add(*v, 1.0);
            }
        }
        left.merge(&right);
        assert_eq!(left.bins(), one.bins());
        for q in [0.1, 0.5, 0.9] {
            assert_eq!(left.quantile(q), one.quantile(q));
        }
    }
}
