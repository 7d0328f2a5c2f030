//! One prefill row being accumulated ([`PrefillAccumulator`]): the prompt rate of cold-enough
//! requests, those whose cached-token count is known kept apart from the others.

use crate::aggregate::sketch::QuantileSketch;
use crate::matrix::doc::{CellStatus, PrefillRow};
use crate::meter::record::RequestRecord;

/// Requests that feed a prefill row: a cold-enough prompt (at least this share uncached).
pub const PREFILL_MIN_UNCACHED_SHARE: f64 = 0.5;

/// Samples of one prefill row.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PrefillSamples {
    /// Uncached prompt tokens ÷ TTFT, one per request.
    pub rate: QuantileSketch,
    pub ttft: QuantileSketch,
    pub requests: u64,
    pub prompt_tokens: u64,
    /// Σ mean in-flight (for "requests at once").
    pub active_sum: f64,
}

impl PrefillSamples {
    fn add(&mut self, rate: f64, record: &RequestRecord, ttft: f64, prompt: u64) {
        self.rate.add(rate, 1.0);
        self.ttft.add(ttft, 1.0);
        self.requests += 1;
        self.prompt_tokens += prompt;
        self.active_sum += record.interference.average_active.max(1.0);
    }

    fn merge(&mut self, other: &PrefillSamples) {
        self.rate.merge(&other.rate);
        self.ttft.merge(&other.ttft);
        self.requests += other.requests;
        self.prompt_tokens += other.prompt_tokens;
        self.active_sum += other.active_sum;
    }
}

/// One prefill row being accumulated: requests whose cached-token count the server reported
/// (and that were mostly uncached), and — kept apart — requests whose count is unknown.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PrefillAccumulator {
    pub known_cache: PrefillSamples,
    pub unknown_cache: PrefillSamples,
}

impl PrefillAccumulator {
    /// Adds a record if it qualifies (docs/metrics.md, "Prefill rows"); returns whether it did.
    pub fn add_record(&mut self, record: &RequestRecord) -> bool {
        if record.outcome.is_failure() {
            return false;
        }
        let (Some(prompt), Some(ttft)) = (record.tokens.prompt, record.timing.ttft) else {
            return false;
        };
        let ttft = ttft.as_secs_f64();
        if prompt == 0 || ttft <= 0.0 {
            return false;
        }
        match record.tokens.cached {
            Some(cached) => {
                let uncached = prompt.saturating_sub(cached);
                if (uncached as f64) < PREFILL_MIN_UNCACHED_SHARE * prompt as f64 {
                    return false;
                }
                self.known_cache
                    .add(uncached as f64 / ttft, record, ttft, prompt);
            }
            None => self
                .unknown_cache
                .add(prompt as f64 / ttft, record, ttft, prompt),
        }
        true
    }

    pub fn merge(&mut self, other: &PrefillAccumulator) {
        self.known_cache.merge(&other.known_cache);
        self.unknown_cache.merge(&other.unknown_cache);
    }

    /// The row, and whether it rests on requests whose cache state is unknown.
    pub fn to_row(&self, context_tokens: u64) -> Option<(PrefillRow, bool)> {
        let (samples, assumed) = if self.known_cache.requests > 0 {
            (&self.known_cache, false)
        } else if self.unknown_cache.requests > 0 {
            (&self.unknown_cache, true)
        } else {
            return None;
        };
        let requests = samples.requests as f64;
        Some((
            PrefillRow {
                context_tokens,
                requests_at_once: (samples.active_sum / requests).round().max(1.0) as u32,
                status: CellStatus::Valid,
                prompt_tok_s: samples.rate.median(),
                ttft_ms: samples.ttft.median().map(|s| s * 1000.0),
                completed_requests: Some(samples.requests),
                prompt_tokens: Some((samples.prompt_tokens as f64 / requests).round() as u64),
            },
            assumed,
        ))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::aggregate::cell::test_records::{close, record};
    use crate::meter::record::Outcome;

    #[test]
    fn prefill_prefers_requests_with_known_cache_counts() {
        let ms = Duration::from_millis;
        let mut row = PrefillAccumulator::default();
        let mut cold = record(Some(8000), &[(0, 2)], ms(400), ms(10), 1.0, Outcome::Ok);
        cold.tokens.cached = Some(0);
        let mut warm = cold.clone();
        warm.tokens.cached = Some(7000);
        let mut half = cold.clone();
        half.tokens.cached = Some(4000);
        let unknown = record(Some(8000), &[(0, 2)], ms(40), ms(10), 1.0, Outcome::Ok);
        assert!(row.add_record(&cold));
        assert!(!row.add_record(&warm));
        assert!(row.add_record(&half));
        assert!(row.add_record(&unknown));
        let (prefill, assumed) = row.to_row(8192).unwrap();
        assert!(!assumed);
        assert_eq!(prefill.completed_requests, Some(2));
        // Rates 20,000 and 10,000 tok/s: the median of two is their mean, within 1 %.
        let rate = prefill.prompt_tok_s.unwrap();
        assert!(close(rate, 15_000.0, 0.011), "{rate}");
    }

    #[test]
    fn without_known_counts_the_row_rests_on_an_assumption() {
        let ms = Duration::from_millis;
        let mut row = PrefillAccumulator::default();
        assert_eq!(row.to_row(8192), None);
        let failed = record(
            Some(8000),
            &[(0, 2)],
            ms(400),
            ms(10),
            1.0,
            Outcome::UpstreamAborted,
        );
        assert!(!row.add_record(&failed), "a failed request feeds no row");
        let unknown = record(Some(8000), &[(0, 2)], ms(400), ms(10), 3.0, Outcome::Ok);
        assert!(row.add_record(&unknown));
        let (prefill, assumed) = row.to_row(8192).unwrap();
        assert!(assumed);
        assert_eq!(prefill.requests_at_once, 3);
        assert_eq!(prefill.prompt_tokens, Some(8000));
        assert!(close(prefill.prompt_tok_s.unwrap(), 20_000.0, 0.011));
    }
}
