//! Context and concurrency ladders: which matrix row and column a request belongs to.
//!
//! Context buckets are "up to": a prompt of P tokens belongs to the smallest ladder value
//! ≥ P (a 7,900-token prompt is an 8K request, as in the seed pages, whose prompts run ~2%
//! short of nominal). Concurrency buckets are "nearest on a log scale": an average of 1.9
//! active requests is the 2 column and 2.9 is the 4 column (the boundary between 2 and 4 is
//! 2·√2 ≈ 2.83), so small wobbles around a steady level do not flip columns. Values past the
//! top of a ladder land in an overflow bucket labelled `>top`.
//!
//! Labels are computed once when the ladder is built and handed out as `&str`, so labelling a
//! request allocates nothing.

/// A ladder of bucket values (tokens for context, requests for concurrency).
#[derive(Debug, Clone, PartialEq)]
pub struct Ladder {
    values: Vec<u64>,
    labels: Vec<String>,
    kind: LadderKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LadderKind {
    Context,
    Concurrency,
}

/// Most values a ladder may have (fixed-size per-request arrays are sized by it).
pub const MAX_LADDER: usize = 24;

/// The seed pages' context ladder: 8K … 1024K.
pub const DEFAULT_CONTEXTS: [u64; 8] = [
    8 << 10,
    16 << 10,
    32 << 10,
    64 << 10,
    128 << 10,
    256 << 10,
    512 << 10,
    1024 << 10,
];

/// The seed pages' concurrency ladder: 1 … 128.
pub const DEFAULT_CONCURRENCY: [u64; 8] = [1, 2, 4, 8, 16, 32, 64, 128];

/// Formats a token count the way the seed pages do: `8K`, `1019K`, or the plain number.
pub fn context_label(tokens: u64) -> String {
    if tokens >= 1024 && tokens % 1024 == 0 {
        format!("{}K", tokens / 1024)
    } else {
        tokens.to_string()
    }
}

impl Ladder {
    /// A context ladder; values must be strictly increasing and non-empty.
    pub fn contexts(values: &[u64]) -> Result<Self, String> {
        Self::build(values, LadderKind::Context)
    }

    /// A concurrency ladder; values must be strictly increasing, non-empty and ≥ 1.
    pub fn concurrency(values: &[u64]) -> Result<Self, String> {
        if values.first() == Some(&0) {
            return Err("concurrency levels start at 1".into());
        }
        Self::build(values, LadderKind::Concurrency)
    }

    fn build(values: &[u64], kind: LadderKind) -> Result<Self, String> {
        if values.is_empty() {
            return Err("needs at least one value".into());
        }
        if values.len() > MAX_LADDER - 1 {
            return Err(format!("at most {} values", MAX_LADDER - 1));
        }
        if values.windows(2).any(|w| w[0] >= w[1]) {
            return Err("values must be strictly increasing".into());
        }
        let mut labels: Vec<String> = values
            .iter()
            .map(|&v| match kind {
                LadderKind::Context => context_label(v),
                LadderKind::Concurrency => v.to_string(),
            })
            .collect();
        labels.push(format!(">{}", labels.last().map_or("", String::as_str)));
        Ok(Self {
            values: values.to_vec(),
            labels,
            kind,
        })
    }

    /// The ladder values.
    pub fn values(&self) -> &[u64] {
        &self.values
    }

    /// Number of buckets including the overflow bucket.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    pub fn is_empty(&self) -> bool {
        false
    }

    /// The label of bucket `index` (the overflow bucket is `>top`).
    pub fn label(&self, index: usize) -> &str {
        self.labels.get(index).map_or("", String::as_str)
    }

    /// The ladder value of bucket `index`, `None` for the overflow bucket.
    pub fn value(&self, index: usize) -> Option<u64> {
        self.values.get(index).copied()
    }

    /// Index of the overflow bucket.
    pub fn overflow(&self) -> usize {
        self.values.len()
    }

    /// Context bucket of a prompt of `tokens` tokens.
    pub fn context_bucket(&self, tokens: u64) -> usize {
        self.values
            .iter()
            .position(|&v| tokens <= v)
            .unwrap_or(self.values.len())
    }

    /// Concurrency bucket of an average of `active` requests (nearest on a log scale).
    pub fn concurrency_bucket(&self, active: f64) -> usize {
        let top = self.values.last().copied().unwrap_or(1) as f64;
        let prev = if self.values.len() >= 2 {
            self.values[self.values.len() - 2] as f64
        } else {
            top / 2.0
        };
        if !active.is_finite() || active <= 0.0 {
            return 0;
        }
        if active > top * (top / prev).sqrt() {
            return self.values.len();
        }
        let mut best = 0;
        let mut best_distance = f64::INFINITY;
        for (i, &v) in self.values.iter().enumerate() {
            let distance = (active.ln() - (v as f64).ln()).abs();
            if distance < best_distance {
                best = i;
                best_distance = distance;
            }
        }
        best
    }

    /// Concurrency bucket of an integer in-flight count, without floating point on the hot path.
    pub fn concurrency_bucket_of_count(&self, count: u32) -> usize {
        // Exact ladder hits are by far the most common case in steady traffic.
        match self.values.binary_search(&u64::from(count)) {
            Ok(i) => i,
            Err(_) => self.concurrency_bucket(f64::from(count)),
        }
    }

    /// Whether this is a context ladder (for error messages).
    pub fn is_context(&self) -> bool {
        self.kind == LadderKind::Context
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_buckets_are_up_to() {
        let ladder = Ladder::contexts(&DEFAULT_CONTEXTS).unwrap();
        assert_eq!(ladder.label(ladder.context_bucket(1)), "8K");
        assert_eq!(ladder.label(ladder.context_bucket(8192)), "8K");
        assert_eq!(ladder.label(ladder.context_bucket(8193)), "16K");
        assert_eq!(ladder.label(ladder.context_bucket(1_043_456)), "1024K");
        assert_eq!(ladder.label(ladder.context_bucket(2_000_000)), ">1024K");
        assert_eq!(context_label(1_043_456), "1019K");
    }

    #[test]
    fn concurrency_buckets_are_nearest_on_log_scale() {
        let ladder = Ladder::concurrency(&DEFAULT_CONCURRENCY).unwrap();
        let label = |a: f64| ladder.label(ladder.concurrency_bucket(a)).to_string();
        assert_eq!(label(1.0), "1");
        assert_eq!(label(1.9), "2");
        assert_eq!(label(2.8), "2");
        assert_eq!(label(2.9), "4");
        assert_eq!(label(0.2), "1");
        assert_eq!(label(150.0), "128");
        assert_eq!(label(200.0), ">128");
        assert_eq!(label(f64::NAN), "1");
        for count in 0..300u32 {
            assert_eq!(
                ladder.concurrency_bucket_of_count(count),
                ladder.concurrency_bucket(f64::from(count))
            );
        }
    }

    #[test]
    fn bad_ladders_are_refused() {
        assert!(Ladder::contexts(&[]).is_err());
        assert!(Ladder::contexts(&[16, 8]).is_err());
        assert!(Ladder::concurrency(&[0, 1]).is_err());
    }
}
