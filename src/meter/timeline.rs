//! The per-request timeline: timestamps and fixed-size accumulators updated per event.
//!
//! Everything here is plain data updated in place: recording an event touches a few fields
//! and two bucket arrays, with no lock or await, and no allocation after each array's first
//! value. Histograms are accumulated per request into fixed buckets (count and sum per
//! bucket) and flushed to the exporter once, when the request ends.

use std::time::Duration;

use tokio::time::Instant;

use super::buckets::MAX_LADDER;

/// Most buckets a local histogram may have.
pub const MAX_HISTOGRAM_BUCKETS: usize = 32;

/// Two output events of one stream closer than this were delivered together, not decoded
/// apart: no engine decodes a step and streams it in 200 µs (a decode step is milliseconds;
/// several tokens of one step come as one event), but a stream that an engine (or a gateway)
/// buffers and hands over at once arrives in one read, its events microseconds apart.
pub const BURST_GAP: f64 = 0.000_2;

/// No bounds: a histogram with only the overflow bucket (a record's empty default).
pub static NO_BOUNDS: &[f64] = &[];

/// A per-request histogram over fixed upper bounds: count and sum per bucket, so the flushed
/// exporter histogram gets exact bucket counts and an exact sum (each bucket is flushed as its
/// mean value, which lies inside the bucket, times its count).
///
/// The values of consecutive records mostly fall in one bucket (a stream's decode steps, the
/// proxy's own time per frame): they are staged in the histogram itself, which sits in the
/// request's hot cache lines, and added to the bucket array only when a value lands in another
/// bucket. The array is on the heap, cold by a stream's next event: touching it on every
/// record was a memory read per histogram per event (2.0–2.7 % of the proxy's samples under
/// the overhead bench; docs/benchmarks.md, "The histograms' staged bucket").
///
/// The array is allocated when a second bucket is first needed, sized to the bounds: a request
/// that waits for its answer (queued at the engine, 10,000 of them held open) or has seen one
/// bucket's values carries none — two inline arrays of 32 buckets were 1 KiB of every such
/// request (docs/benchmarks.md, "Memory per held stream"). One allocation per histogram per
/// request at most, never per event.
#[derive(Debug, Clone)]
pub struct LocalHistogram {
    /// A thin pointer to the bounds (a static slice of them): every open stream carries two
    /// histograms, and the staged bucket's fields take the room a slice's length took.
    bounds: &'static &'static [f64],
    /// (count, sum) per bucket, one more than `bounds` (the overflow); `None` until values
    /// fell in two buckets.
    buckets: Option<Box<[(u64, f64)]>>,
    /// Sum of the staged values (each times its weight), not yet in `buckets`.
    staged_sum: f64,
    /// Weight staged (0: nothing staged, whatever `staged_index` says).
    staged_count: u32,
    /// The bucket the staged values belong to (bounds are capped at
    /// [`MAX_HISTOGRAM_BUCKETS`], so it fits).
    staged_index: u8,
}

impl LocalHistogram {
    /// `bounds` are increasing upper bounds; values above the last go to an overflow bucket.
    pub fn new(bounds: &'static &'static [f64]) -> Self {
        Self {
            bounds,
            buckets: None,
            staged_sum: 0.0,
            staged_count: 0,
            staged_index: 0,
        }
    }

    /// The bounds, at most [`MAX_HISTOGRAM_BUCKETS`] − 1 of them.
    fn bounds(&self) -> &'static [f64] {
        let bounds: &'static [f64] = self.bounds;
        bounds.get(..MAX_HISTOGRAM_BUCKETS - 1).unwrap_or(bounds)
    }

    /// Records `value` with weight `count`.
    #[inline]
    pub fn record(&mut self, value: f64, count: u64) {
        let index = self.bounds().partition_point(|&bound| bound < value);
        let weighted = value * count as f64;
        if self.staged_count > 0 && usize::from(self.staged_index) != index {
            self.unstage();
        }
        match u32::try_from(count)
            .ok()
            .and_then(|weight| self.staged_count.checked_add(weight))
        {
            Some(staged) => {
                // `index` ≤ bounds.len() < MAX_HISTOGRAM_BUCKETS.
                self.staged_index = u8::try_from(index).unwrap_or(u8::MAX);
                self.staged_count = staged;
                self.staged_sum += weighted;
            }
            // More weight than the staged count holds: straight into the array (the staged
            // values of the same bucket stay staged; readers add the two).
            None => self.add(index, count, weighted),
        }
    }

    /// Moves the staged values into their bucket.
    fn unstage(&mut self) {
        let count = std::mem::take(&mut self.staged_count);
        let sum = std::mem::take(&mut self.staged_sum);
        if count > 0 {
            self.add(usize::from(self.staged_index), u64::from(count), sum);
        }
    }

    /// Adds to bucket `index` of the array, allocating it at its first use.
    fn add(&mut self, index: usize, count: u64, sum: f64) {
        let size = self.bounds().len() + 1;
        let buckets = self
            .buckets
            .get_or_insert_with(|| vec![(0, 0.0); size].into_boxed_slice());
        if let Some((c, s)) = buckets.get_mut(index) {
            *c = c.saturating_add(count);
            *s += sum;
        }
    }

    /// Moves what was recorded out, leaving this histogram empty: a request's end hands its
    /// histograms to its record without copying or allocating.
    pub fn take(&mut self) -> Self {
        std::mem::replace(self, Self::new(self.bounds))
    }

    /// Bucket `index`: what the array holds, with the staged values when they belong there.
    fn bucket(&self, index: usize) -> (u64, f64) {
        let (mut count, mut sum) = self
            .buckets
            .as_deref()
            .and_then(|buckets| buckets.get(index).copied())
            .unwrap_or((0, 0.0));
        if self.staged_count > 0 && usize::from(self.staged_index) == index {
            count = count.saturating_add(u64::from(self.staged_count));
            sum += self.staged_sum;
        }
        (count, sum)
    }

    /// Non-empty buckets as (mean value, count).
    pub fn buckets(&self) -> impl Iterator<Item = (f64, u64)> + '_ {
        (0..=self.bounds().len())
            .map(|index| self.bucket(index))
            .filter(|(c, _)| *c > 0)
            .map(|(c, s)| (s / c as f64, c))
    }

    /// Spreads what was recorded over `factor` times as many samples, each `factor` times
    /// smaller: the sum is kept, each bucket's count becomes its count × `factor` (rounded, at
    /// least 1). For a stream whose events were counted as one token each and whose final
    /// usage says how many tokens they carried (Responses and Messages deltas, chat without
    /// per-chunk usage): the events' gaps are divided over the tokens, as they are when the
    /// per-event counts are exact. Called once, at a request's end (it may allocate); a factor
    /// that is not finite and positive changes nothing.
    pub fn spread(&mut self, factor: f64) {
        if !factor.is_finite() || factor <= 0.0 || (factor - 1.0).abs() < 1e-9 {
            return;
        }
        let was: Vec<(f64, u64)> = self.buckets().collect();
        *self = Self::new(self.bounds);
        for (mean, count) in was {
            let spread = ((count as f64) * factor).round().max(1.0);
            // Saturating float-to-int: a count past u64 is not a real stream's.
            let samples = spread as u64;
            self.record(mean * count as f64 / spread, samples);
        }
    }

    /// Total weight recorded.
    pub fn count(&self) -> u64 {
        self.buckets().map(|(_, c)| c).sum()
    }

    /// Largest bucket mean (an upper estimate of the maximum within bucket resolution).
    pub fn max_mean(&self) -> Option<f64> {
        self.buckets().map(|(mean, _)| mean).reduce(f64::max)
    }
}

/// A count for a per-request `u32` counter (saturating: no request streams that many).
fn narrow(count: u64) -> u32 {
    u32::try_from(count).unwrap_or(u32::MAX)
}

/// Tokens and decode time of one request split by the concurrency bucket in force when each
/// token event arrived. Summing these over requests gives production matrix cells whose
/// conditions changed mid-request (docs/metrics.md).
#[derive(Debug, Clone, Copy)]
pub struct ConcurrencySplit {
    /// Tokens per bucket, as `u32` (more than any one request streams): every in-flight stream
    /// carries this array, and the narrower counts keep its metering box in jemalloc's
    /// 1,536-byte class (docs/benchmarks.md, "Memory per idle stream").
    pub tokens: [u32; MAX_LADDER],
    /// Request-seconds of decode time per bucket (the gap before each token event).
    pub seconds: [f64; MAX_LADDER],
}

impl Default for ConcurrencySplit {
    fn default() -> Self {
        Self {
            tokens: [0; MAX_LADDER],
            seconds: [0.0; MAX_LADDER],
        }
    }
}

impl ConcurrencySplit {
    /// Rescales token counts so they sum to `total` exactly (used when per-event counts were
    /// estimates and the upstream's final usage is known), keeping each bucket's share.
    pub fn rescale_tokens(&mut self, total: u64) {
        let sum = self.total_tokens();
        if sum == total || sum == 0 {
            return;
        }
        // The rounding remainder goes to the bucket that had the most tokens.
        let largest = (0..self.tokens.len())
            .max_by_key(|&i| self.tokens[i])
            .unwrap_or(0);
        let mut assigned = 0u64;
        for tokens in self.tokens.iter_mut() {
            let share = u128::from(*tokens) * u128::from(total) / u128::from(sum);
            *tokens = u32::try_from(share).unwrap_or(u32::MAX);
            assigned += u64::from(*tokens);
        }
        self.add_tokens(largest, total.saturating_sub(assigned));
    }

    /// Adds `tokens` to `bucket`'s count (saturating; a bucket past the ladder is ignored).
    pub fn add_tokens(&mut self, bucket: usize, tokens: u64) {
        if let Some(t) = self.tokens.get_mut(bucket) {
            *t = t.saturating_add(u32::try_from(tokens).unwrap_or(u32::MAX));
        }
    }

    pub fn total_tokens(&self) -> u64 {
        self.tokens.iter().map(|&t| u64::from(t)).sum()
    }
}

/// Timestamps (monotonic, taken when bytes arrive) and per-event accumulators.
///
/// Laid out in declaration order (`repr(C)`), the fields every event or frame updates first:
/// a stream's timeline is cold in the cache by its next event (a thousand streams' states do
/// not fit), so each cache line an event touches is a memory read.
#[derive(Debug, Clone)]
#[repr(C)]
pub struct Timeline {
    pub last_token: Option<Instant>,
    /// The first event that delivered a token, visible or not (a silent token counts): when
    /// prefill ended. Never later than `first_token`.
    pub first_delivery: Option<Instant>,
    pub first_byte: Option<Instant>,
    /// Events that carried output. This count and the three below are `u32` (added
    /// saturating; no request streams four billion tokens): every open stream carries them,
    /// and the narrower counts keep the metering box in jemalloc's 1,536-byte class with the
    /// histograms' staged buckets (docs/benchmarks.md, "The histograms' staged bucket").
    pub token_events: u32,
    /// Tokens carried by those events (exact with per-chunk usage).
    pub streamed_tokens: u32,
    /// Tokens delivered without visible output since the last output event: the next output
    /// event's gap is shared among them too.
    pub pending_silent: u32,
    pub frames: u32,
    /// Output events that came less than [`BURST_GAP`] after the previous one (the same read,
    /// or as good as): an upstream that hands a stream over at once, not as it decodes.
    pub coalesced_events: u32,
    /// ∫inflight·dt at the latest token event (and, below, at the first).
    pub area_at_last_token: f64,
    /// Inter-token latency, per token: the gap between two output events divided over every
    /// token delivered since the earlier one (silent tokens included), each token one sample
    /// (docs/metrics.md "ITL"). Both histograms are recorded on every event or frame, and
    /// what they record is staged in them: they sit with the other per-event fields.
    pub itl: LocalHistogram,
    /// Time spent inside tokentap per forwarded frame.
    pub frame_overhead: LocalHistogram,
    pub split: ConcurrencySplit,
    pub head_in: Instant,
    /// When the request body was fully read (metered routes read it before forwarding).
    pub body_read: Option<Instant>,
    pub upstream_sent: Option<Instant>,
    pub response_head: Option<Instant>,
    pub first_token: Option<Instant>,
    /// The first answer token (content, not reasoning), and the first tool-call delta: with a
    /// reasoning model the first token is reasoning, and a user waits for these.
    pub first_answer: Option<Instant>,
    pub first_tool_call: Option<Instant>,
    pub end: Option<Instant>,
    pub area_at_first_token: f64,
    /// In-flight count when the first token arrived (the fallback average).
    pub inflight_at_first_token: u32,
}

impl Timeline {
    pub fn new(
        head_in: Instant,
        itl_bounds: &'static &'static [f64],
        overhead_bounds: &'static &'static [f64],
    ) -> Self {
        Self {
            head_in,
            body_read: None,
            upstream_sent: None,
            response_head: None,
            first_byte: None,
            first_token: None,
            first_answer: None,
            first_tool_call: None,
            first_delivery: None,
            last_token: None,
            end: None,
            token_events: 0,
            streamed_tokens: 0,
            itl: LocalHistogram::new(itl_bounds),
            pending_silent: 0,
            frame_overhead: LocalHistogram::new(overhead_bounds),
            frames: 0,
            coalesced_events: 0,
            split: ConcurrencySplit::default(),
            area_at_first_token: 0.0,
            area_at_last_token: 0.0,
            inflight_at_first_token: 0,
        }
    }

    /// Records an event carrying `tokens` tokens at `now`, with the in-flight count, its
    /// concurrency bucket and the in-flight integral read at that moment.
    pub fn token_event(
        &mut self,
        now: Instant,
        tokens: u64,
        inflight: u32,
        bucket: usize,
        area: f64,
    ) {
        let tokens = tokens.max(1);
        self.first_delivery.get_or_insert(now);
        // Silent tokens before the first output event belong to the time to first token.
        let silent = std::mem::take(&mut self.pending_silent);
        match self.last_token {
            None => {
                self.first_token = Some(now);
                self.area_at_first_token = area;
                self.inflight_at_first_token = inflight;
            }
            Some(last) => {
                let gap = now.saturating_duration_since(last).as_secs_f64();
                if gap < BURST_GAP {
                    self.coalesced_events = self.coalesced_events.saturating_add(1);
                }
                let delivered = tokens.saturating_add(u64::from(silent));
                self.itl.record(gap / delivered as f64, delivered);
                if let Some(seconds) = self.split.seconds.get_mut(bucket) {
                    *seconds += gap;
                }
            }
        }
        self.split.add_tokens(bucket, tokens);
        self.area_at_last_token = area;
        self.last_token = Some(now);
        self.token_events = self.token_events.saturating_add(1);
        self.streamed_tokens = self.streamed_tokens.saturating_add(narrow(tokens));
    }

    /// Records tokens delivered at `now` without visible output (held-back partial UTF-8, a
    /// swallowed marker): they count for throughput and share the next output event's gap.
    pub fn silent_tokens(&mut self, now: Instant, tokens: u64) {
        if tokens > 0 {
            self.first_delivery.get_or_insert(now);
        }
        self.pending_silent = self.pending_silent.saturating_add(narrow(tokens));
        self.streamed_tokens = self.streamed_tokens.saturating_add(narrow(tokens));
    }

    /// Records that a frame arrived at `arrived` and was handed on at `forwarded`.
    pub fn frame(&mut self, arrived: Instant, forwarded: Instant) {
        if self.first_byte.is_none() {
            self.first_byte = Some(arrived);
        }
        self.frames = self.frames.saturating_add(1);
        self.frame_overhead.record(
            forwarded.saturating_duration_since(arrived).as_secs_f64(),
            1,
        );
    }

    /// Duration from request head in to `t`.
    pub fn since_head(&self, t: Option<Instant>) -> Option<Duration> {
        t.map(|t| t.saturating_duration_since(self.head_in))
    }

    /// First token → last token.
    pub fn decode_time(&self) -> Option<Duration> {
        match (self.first_token, self.last_token) {
            (Some(first), Some(last)) => Some(last.saturating_duration_since(first)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static BOUNDS: &[f64] = &[0.001, 0.01, 0.1];

    #[test]
    fn a_histogram_holds_no_buckets_until_a_second_bucket_is_needed() {
        static BOUNDS: &[f64] = &[1.0, 2.0, 3.0];
        let mut histogram = LocalHistogram::new(&BOUNDS);
        assert_eq!(histogram.count(), 0);
        assert_eq!(histogram.buckets().count(), 0);
        assert_eq!(histogram.max_mean(), None);
        // Two pointers and the staged bucket, not 32 inline buckets: what a waiting request
        // carries.
        assert!(std::mem::size_of::<LocalHistogram>() <= 40);
        // Values in one bucket are staged in the histogram itself: no array yet.
        histogram.record(9.0, 2);
        histogram.record(7.0, 1);
        assert!(histogram.buckets.is_none());
        assert_eq!(
            histogram.buckets().collect::<Vec<_>>(),
            vec![(25.0 / 3.0, 3)]
        );
        // A second bucket: the array, sized to the bounds and the overflow bucket.
        histogram.record(0.5, 1);
        assert_eq!(histogram.buckets.as_deref().map(<[_]>::len), Some(4));
        assert_eq!(
            histogram.buckets().collect::<Vec<_>>(),
            vec![(0.5, 1), (25.0 / 3.0, 3)]
        );
        // Taken, it leaves an empty histogram over the same bounds.
        let taken = histogram.take();
        assert_eq!(taken.count(), 4);
        assert_eq!(histogram.count(), 0);
        assert!(histogram.buckets.is_none());
        assert!(std::ptr::eq(histogram.bounds(), BOUNDS));
    }

    /// Ten deltas 20 ms apart that the final usage says carried 25 tokens: 25 samples of 8 ms
    /// (the sum, the decode time, kept); a factor of one or nonsense changes nothing.
    #[test]
    fn spreading_divides_each_gap_over_the_tokens_it_carried() {
        static BOUNDS: &[f64] = &[0.005, 0.01, 0.05];
        let mut histogram = LocalHistogram::new(&BOUNDS);
        histogram.record(0.020, 10);
        histogram.spread(2.5);
        let buckets: Vec<(f64, u64)> = histogram.buckets().collect();
        assert_eq!(buckets.len(), 1);
        let (mean, count) = buckets[0];
        assert_eq!(count, 25);
        assert!((mean - 0.008).abs() < 1e-12, "{mean}");
        for nonsense in [1.0, 0.0, -2.0, f64::NAN, f64::INFINITY] {
            let before: Vec<(f64, u64)> = histogram.buckets().collect();
            histogram.spread(nonsense);
            assert_eq!(histogram.buckets().collect::<Vec<_>>(), before);
        }
        // Fewer tokens than counted events: fewer, longer samples, none lost to rounding.
        let mut histogram = LocalHistogram::new(&BOUNDS);
        histogram.record(0.004, 1);
        histogram.spread(0.25);
        assert_eq!(histogram.count(), 1);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]

        /// Staging changes where a value waits, never what is counted: every bucket's count
        /// and sum equal those of a plain array filled value by value, whatever the order,
        /// the weights (past `u32` too) and the buckets they fall in.
        #[test]
        fn staging_agrees_with_filling_the_array_directly(
            records in proptest::collection::vec(
                (0usize..6, 0.0f64..1.0, proptest::prop_oneof![
                    0u64..4,
                    proptest::prelude::Just(u64::from(u32::MAX)),
                    proptest::prelude::Just(u64::from(u32::MAX) + 7),
                ]),
                0..64,
            ),
        ) {
            static BOUNDS: &[f64] = &[1.0, 2.0, 3.0, 4.0, 5.0];
            let mut histogram = LocalHistogram::new(&BOUNDS);
            let mut plain = [(0u64, 0.0f64); 6];
            for &(bucket, fraction, count) in &records {
                // A value strictly inside bucket `bucket` (the last is the overflow).
                let value = bucket as f64 + 0.01 + fraction * 0.98;
                histogram.record(value, count);
                plain[bucket].0 += count;
                plain[bucket].1 += value * count as f64;
            }
            let mut expected = Vec::new();
            for &(count, sum) in &plain {
                if count > 0 {
                    expected.push((sum / count as f64, count));
                }
            }
            let got: Vec<_> = histogram.buckets().collect();
            proptest::prop_assert_eq!(got.len(), expected.len());
            for ((mean, count), (want_mean, want_count)) in got.into_iter().zip(expected) {
                proptest::prop_assert_eq!(count, want_count);
                proptest::prop_assert!((mean - want_mean).abs() <= 1e-9 * want_mean.abs().max(1.0));
            }
            proptest::prop_assert_eq!(histogram.count(), plain.iter().map(|(c, _)| c).sum::<u64>());
        }
    }

    #[test]
    fn local_histogram_keeps_exact_bucket_counts_and_sums() {
        let mut h = LocalHistogram::new(&BOUNDS);
        h.record(0.005, 2);
        h.record(0.007, 1);
        h.record(5.0, 1);
        let buckets: Vec<_> = h.buckets().collect();
        assert_eq!(buckets.len(), 2);
        assert!((buckets[0].0 - 0.017 / 3.0).abs() < 1e-12);
        assert_eq!(buckets[0].1, 3);
        assert_eq!(buckets[1], (5.0, 1));
        assert_eq!(h.count(), 4);
    }

    #[test]
    fn itl_is_per_token_and_silent_tokens_share_the_next_gap() {
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let mut timeline = Timeline::new(t0, &BOUNDS, &BOUNDS);
        timeline.silent_tokens(ms(4), 1); // before the first output: part of TTFT
        timeline.token_event(ms(10), 1, 1, 0, 0.0);
        timeline.token_event(ms(13), 1, 1, 0, 0.0);
        timeline.silent_tokens(ms(16), 1); // vLLM's `"content":""` while it holds back partial UTF-8
        timeline.silent_tokens(ms(19), 1);
        timeline.token_event(ms(22), 1, 1, 0, 0.0);
        // 1 + 3 tokens after the first output event, over 12 ms of decode.
        assert_eq!(timeline.itl.count(), 4);
        let sum: f64 = timeline
            .itl
            .buckets()
            .map(|(mean, n)| mean * n as f64)
            .sum();
        assert!((sum - 0.012).abs() < 1e-9, "ITL sum {sum} = decode time");
        assert_eq!(timeline.decode_time(), Some(Duration::from_millis(12)));
        assert_eq!(timeline.streamed_tokens, 6);
        assert_eq!(timeline.pending_silent, 0);
        // The silent first token ended prefill; the first visible one came later.
        assert_eq!(timeline.first_delivery, Some(ms(4)));
        assert_eq!(timeline.first_token, Some(ms(10)));
    }

    #[test]
    fn rescale_keeps_the_total_exact() {
        let mut split = ConcurrencySplit::default();
        split.tokens[0] = 3;
        split.tokens[1] = 7;
        split.rescale_tokens(31);
        assert_eq!(split.total_tokens(), 31);
        assert!(split.tokens[1] > split.tokens[0]);
    }
}
