//! The prompt cache over a cell's requests ([`PromptCacheSum`]): the share of prompt tokens
//! served from cache, and the TTFT of warm and cold requests.

use crate::aggregate::sketch::QuantileSketch;
use crate::matrix::doc::PromptCache;
use crate::meter::record::RequestRecord;

/// The prompt cache over a cell's requests (docs/metrics.md "Prompt cache"): the production
/// aggregator and the sweep's cells both use it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PromptCacheSum {
    /// Σ prompt and Σ cached tokens of the requests that reported both.
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    /// TTFT, seconds, of warm requests (at least [`PromptCache::WARM_SHARE`] of the prompt
    /// cached) and of cold ones.
    pub warm: QuantileSketch,
    pub cold: QuantileSketch,
}

impl PromptCacheSum {
    pub fn add(&mut self, record: &RequestRecord) {
        let (Some(prompt), Some(cached)) = (record.tokens.prompt, record.tokens.cached) else {
            return;
        };
        if prompt == 0 {
            return;
        }
        // A count above the prompt was already read as all of it (`meter`); min again so a
        // hand-made record cannot give a share above 1.
        let cached = cached.min(prompt);
        self.prompt_tokens = self.prompt_tokens.saturating_add(prompt);
        self.cached_tokens = self.cached_tokens.saturating_add(cached);
        if let Some(ttft) = record.timing.ttft {
            let warm = cached as f64 >= PromptCache::WARM_SHARE * prompt as f64;
            let sketch = if warm { &mut self.warm } else { &mut self.cold };
            sketch.add(ttft.as_secs_f64(), 1.0);
        }
    }

    pub fn merge(&mut self, other: &PromptCacheSum) {
        self.prompt_tokens = self.prompt_tokens.saturating_add(other.prompt_tokens);
        self.cached_tokens = self.cached_tokens.saturating_add(other.cached_tokens);
        self.warm.merge(&other.warm);
        self.cold.merge(&other.cold);
    }

    /// Bins held (for the aggregator's memory bound).
    pub fn bins(&self) -> usize {
        self.warm.bins() + self.cold.bins()
    }

    /// The cell's figures; absent when no request reported its cached tokens.
    pub fn to_prompt_cache(&self) -> Option<PromptCache> {
        if self.prompt_tokens == 0 {
            return None;
        }
        let median = |sketch: &QuantileSketch| sketch.median().map(|s| s * 1000.0);
        let count = |sketch: &QuantileSketch| Some(sketch.weight()).filter(|n| *n > 0.0);
        PromptCache::from_values([
            Some(self.cached_tokens as f64 / self.prompt_tokens as f64),
            median(&self.warm),
            count(&self.warm),
            median(&self.cold),
            count(&self.cold),
        ])
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn reported(prompt: u64, cached: Option<u64>, ttft_ms: u64) -> RequestRecord {
        let mut r = RequestRecord::for_test();
        r.tokens.prompt = Some(prompt);
        r.tokens.cached = cached;
        r.timing.ttft = Some(Duration::from_millis(ttft_ms));
        r
    }

    #[test]
    fn only_requests_that_report_their_cache_count() {
        let mut sum = PromptCacheSum::default();
        sum.add(&reported(1000, None, 100));
        sum.add(&reported(0, Some(0), 100));
        assert_eq!(sum.to_prompt_cache(), None);
    }

    #[test]
    fn warm_and_cold_requests_are_timed_apart_and_the_share_is_over_tokens() {
        let mut sum = PromptCacheSum::default();
        sum.add(&reported(1000, Some(900), 20));
        sum.add(&reported(1000, Some(100), 200));
        // A count above the prompt is the whole prompt.
        sum.add(&reported(2000, Some(5000), 20));
        let cache = sum.to_prompt_cache().unwrap();
        assert_eq!(cache.cached_share, Some(3000.0 / 4000.0));
        assert_eq!(
            (cache.warm_requests, cache.cold_requests),
            (Some(2.0), Some(1.0))
        );
        let warm = cache.warm_ttft_ms.unwrap();
        let cold = cache.cold_ttft_ms.unwrap();
        assert!(
            (warm - 20.0).abs() < 0.5 && (cold - 200.0).abs() < 3.0,
            "{cache:?}"
        );
    }

    #[test]
    fn merged_sums_are_the_sum_of_all_requests() {
        let (mut a, mut b) = (PromptCacheSum::default(), PromptCacheSum::default());
        a.add(&reported(1000, Some(1000), 20));
        b.add(&reported(1000, Some(0), 200));
        a.merge(&b);
        let cache = a.to_prompt_cache().unwrap();
        assert_eq!(cache.cached_share, Some(0.5));
        assert_eq!(
            (cache.warm_requests, cache.cold_requests),
            (Some(1.0), Some(1.0))
        );
        assert_eq!(a.bins(), a.warm.bins() + a.cold.bins());
    }
}
