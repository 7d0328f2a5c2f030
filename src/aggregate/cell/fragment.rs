//! A request split over the concurrency levels it lived through ([`fragments`]), and the
//! in-flight counts each level of the ladder stands for ([`bucket_range`]).

use crate::meter::buckets::Ladder;
use crate::meter::record::{RequestRecord, SloVerdict};

/// What one request contributed to one concurrency level.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Fragment {
    /// Completion tokens emitted while this level held (they sum to the request's total).
    pub output_tokens: u64,
    /// Tokens that closed a decode gap: the output tokens less this level's share of the
    /// first event's tokens, which close the TTFT instead.
    pub decode_tokens: f64,
    /// Request-seconds of decode (token gaps) spent at this level.
    pub decode_seconds: f64,
    /// Mean in-flight count while at this level.
    pub average_active: f64,
    /// Of `decode_seconds`, the seconds during which another request was in prefill; `None`
    /// when the record carries no interference figure.
    pub prefill_busy_seconds: Option<f64>,
    /// The request met every SLO target set for it (its tokens count towards goodput).
    pub slo_met: bool,
}

/// Splits a record over the concurrency levels it lived through, from its `split` arrays.
/// A request whose split is empty (non-streaming, or no token event) is one fragment at its
/// own concurrency bucket, holding its tokens but no decode time.
pub fn fragments(record: &RequestRecord, concurrency: &Ladder) -> Vec<(usize, Fragment)> {
    let split = &record.interference.split;
    let split_tokens = split.total_tokens();
    if split_tokens == 0 {
        if record.tokens.completion == 0 && split.seconds.iter().all(|s| *s <= 0.0) {
            return Vec::new();
        }
        return vec![(
            record.buckets.concurrency,
            Fragment {
                output_tokens: record.tokens.completion,
                decode_tokens: 0.0,
                decode_seconds: split.seconds.iter().sum(),
                average_active: record.interference.average_active,
                prefill_busy_seconds: record
                    .interference
                    .prefill_overlap_share
                    .map(|_| record.interference.prefill_busy.iter().sum()),
                slo_met: record.slo.verdict == SloVerdict::Met,
            },
        )];
    }
    // The first event carries tokens ÷ events on average; it ends the TTFT, not a gap.
    let decode_share = if record.tokens.events > 0 {
        1.0 - 1.0 / record.tokens.events as f64
    } else {
        0.0
    };
    let mut out = Vec::new();
    for (bucket, (&tokens, &seconds)) in split.tokens.iter().zip(split.seconds.iter()).enumerate() {
        if tokens == 0 && seconds <= 0.0 {
            continue;
        }
        out.push((
            bucket,
            Fragment {
                output_tokens: u64::from(tokens),
                decode_tokens: tokens as f64 * decode_share,
                decode_seconds: seconds.max(0.0),
                average_active: average_active_at(record, bucket, concurrency),
                prefill_busy_seconds: record.interference.prefill_overlap_share.map(|_| {
                    record
                        .interference
                        .prefill_busy
                        .get(bucket)
                        .copied()
                        .unwrap_or(0.0)
                }),
                slo_met: record.slo.verdict == SloVerdict::Met,
            },
        ));
    }
    out
}

/// The mean in-flight count of a request while at concurrency bucket `bucket`: the record's
/// exact mean over its whole decode, clamped into the range of counts that map to `bucket`
/// (exact when the request stayed at one level; within the bucket otherwise).
fn average_active_at(record: &RequestRecord, bucket: usize, ladder: &Ladder) -> f64 {
    let (low, high) = bucket_range(ladder, bucket);
    let average = record.interference.average_active;
    if average.is_finite() {
        average.clamp(low, high)
    } else {
        low
    }
}

/// The in-flight counts (as reals) that map to concurrency bucket `bucket`: between the
/// geometric means of neighbouring ladder values.
pub fn bucket_range(ladder: &Ladder, bucket: usize) -> (f64, f64) {
    let values = ladder.values();
    let value = |i: usize| values.get(i).map(|&v| v as f64);
    let low = match bucket.checked_sub(1).and_then(value) {
        Some(previous) => value(bucket).map_or(previous, |v| (previous * v).sqrt()),
        None => 1.0,
    };
    let high = match (value(bucket), value(bucket + 1)) {
        (Some(v), Some(next)) => (v * next).sqrt(),
        (Some(v), None) => {
            let previous = bucket.checked_sub(1).and_then(value).unwrap_or(v / 2.0);
            v * (v / previous).sqrt()
        }
        (None, _) => f64::INFINITY,
    };
    // The overflow bucket starts where the top bucket ends.
    let low = if value(bucket).is_none() {
        values.last().map_or(1.0, |&top| {
            let top = top as f64;
            let previous = values
                .len()
                .checked_sub(2)
                .and_then(value)
                .unwrap_or(top / 2.0);
            top * (top / previous).sqrt()
        })
    } else {
        low
    };
    (low.max(1.0), high.max(low.max(1.0)))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::aggregate::cell::test_records::{close, ladders, record};
    use crate::meter::record::Outcome;

    #[test]
    fn bucket_ranges_tile_the_ladder() {
        let (_, concurrency) = ladders();
        assert_eq!(bucket_range(&concurrency, 0), (1.0, 2f64.sqrt()));
        let (low, high) = bucket_range(&concurrency, 2);
        assert!(close(low, 8f64.sqrt(), 1e-12) && close(high, 32f64.sqrt(), 1e-12));
        let (top_low, top_high) = bucket_range(&concurrency, 7);
        let (overflow_low, overflow_high) = bucket_range(&concurrency, 8);
        assert!(
            close(top_high, overflow_low, 1e-12),
            "{top_low} {top_high} {overflow_low}"
        );
        assert!(overflow_high.is_infinite());
    }

    #[test]
    fn a_request_splits_by_the_levels_it_lived_through_or_is_one_fragment() {
        let (_, concurrency) = ladders();
        let ms = Duration::from_millis;
        // 11 tokens alone, then 10 at level 2: 21 events, the first closing the TTFT.
        let r = record(
            Some(8000),
            &[(0, 11), (1, 10)],
            ms(100),
            ms(10),
            1.5,
            Outcome::Ok,
        );
        let split = fragments(&r, &concurrency);
        assert_eq!(split.iter().map(|(b, _)| *b).collect::<Vec<_>>(), [0, 1]);
        let (alone, paired) = (split[0].1, split[1].1);
        assert_eq!((alone.output_tokens, paired.output_tokens), (11, 10));
        assert!(close(alone.decode_tokens, 11.0 * 20.0 / 21.0, 1e-12));
        assert!(close(alone.decode_seconds, 0.1, 1e-12));
        assert!(close(paired.decode_seconds, 0.1, 1e-12));
        assert!(!alone.slo_met);
        assert_eq!(alone.prefill_busy_seconds, None, "no interference figure");
        // No split (not streamed): one fragment at its own bucket, tokens and no decode.
        let mut whole = r.clone();
        whole.interference.split = Default::default();
        whole.tokens.completion = 21;
        let one = fragments(&whole, &concurrency);
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].0, whole.buckets.concurrency);
        assert_eq!(one[0].1.output_tokens, 21);
        assert_eq!(one[0].1.decode_tokens, 0.0);
        // Nothing emitted and no time: nothing.
        whole.tokens.completion = 0;
        assert!(fragments(&whole, &concurrency).is_empty());
    }
}
