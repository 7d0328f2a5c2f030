//! Accumulators that turn request records into matrix cells: [`CellAccumulator`] (one
//! sustained-decode cell), [`PrefillAccumulator`] (one prefill row) and [`MatrixAccumulator`]
//! (every cell and row of one model). The definitions are in docs/metrics.md; every figure is
//! a sum or a [`QuantileSketch`], so an accumulator's size does not grow with the number of
//! requests, and two accumulators merge exactly (sums add, sketches merge).
//!
//! The same code serves production windows and the synthetic sweep: a sweep that knows which
//! cell its requests belong to calls [`CellAccumulator::add_whole_request`]; production traffic
//! goes through [`MatrixAccumulator::add_record`], which splits each request over the
//! concurrency levels it lived through. No I/O, no clock, no locks here.

use std::collections::BTreeMap;

use crate::matrix::doc::{
    CellStatus, DecodeCell, FirstTokens, PrefillRow, PromptCache, ServerState, Tails,
};
use crate::meter::buckets::Ladder;
use crate::meter::record::SloVerdict;
use crate::meter::record::{Outcome, RequestRecord};
use crate::meter::server_state::GAUGES;

use super::sketch::QuantileSketch;

/// Share of failed requests above which a cell is `Error` rather than `Valid` (a failure is a
/// request that failed on the server's side, [`Outcome::is_failure`]: client aborts are not
/// failures, people press stop).
pub const ERROR_SHARE: f64 = 0.05;

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
                output_tokens: tokens,
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

/// One sustained-decode cell being accumulated.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CellAccumulator {
    pub output_tokens: u64,
    pub decode_tokens: f64,
    pub decode_seconds: f64,
    /// Σ (mean in-flight × decode seconds): the time-weighted in-flight integral.
    pub active_seconds: f64,
    /// Requests whose own cell this is that ended `ok`.
    pub completed: u64,
    /// Failed requests by outcome (index of [`Outcome::ALL`]).
    pub failed: [u64; Outcome::ALL.len()],
    /// Requests whose own cell this is that the client aborted.
    pub client_aborted: u64,
    /// Σ prompt tokens and count of requests whose own cell this is that reported them.
    pub prompt_tokens: u64,
    pub prompt_requests: u64,
    /// Time to first token, seconds, one per request.
    pub ttft: QuantileSketch,
    /// Time between tokens, seconds per token, weighted by decode tokens.
    pub tbt: QuantileSketch,
    /// Inter-token latency, seconds, one sample per generated token after the first (each
    /// request's binned gaps, at their bin means: within a bin's width of the exact gaps).
    pub itl: QuantileSketch,
    /// Prefill interference: decode time under other prefills from the fragments, overlapping
    /// prefills from own-cell requests.
    pub interference: InterferenceSum,
    /// SLO verdicts of own-cell requests, and the decode tokens of requests that met theirs.
    pub slo: SloSum,
    /// The server's scraped state seen by own-cell requests.
    pub server_state: ServerStateSum,
    /// First answer and tool-call tokens, reasoning tokens and tools of own-cell requests.
    pub first_tokens: FirstTokenSum,
    /// The prompt cache as own-cell requests reported it.
    pub prompt_cache: PromptCacheSum,
    /// Σ completion tokens and Σ token events of own-cell streamed requests: tokens per
    /// decode step.
    pub steps: StepSum,
}

/// Tokens per decode step over a cell's streamed requests: Σ completion tokens ÷ Σ token
/// events (speculative decoding's accept length where the engine streams one event per step).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepSum {
    pub tokens: u64,
    pub events: u64,
}

impl StepSum {
    pub fn add(&mut self, record: &RequestRecord) {
        // Only exact counts say how many tokens a step gave; without usage each event is
        // counted as one token, which would say 1 whatever the engine did.
        if record.streaming && record.tokens.events > 0 && record.tokens.completion_exact {
            self.tokens = self.tokens.saturating_add(record.tokens.completion);
            self.events = self.events.saturating_add(record.tokens.events);
        }
    }

    pub fn merge(&mut self, other: &StepSum) {
        self.tokens = self.tokens.saturating_add(other.tokens);
        self.events = self.events.saturating_add(other.events);
    }

    pub fn tokens_per_step(&self) -> Option<f64> {
        (self.events > 0).then(|| self.tokens as f64 / self.events as f64)
    }
}

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

/// The first token of each kind over a cell's requests (docs/metrics.md "Answer TTFT"): the
/// production aggregator and the sweep's cells both use it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FirstTokenSum {
    /// Time to the first answer token, seconds, one per request that streamed one.
    pub answer: QuantileSketch,
    /// Time to the first tool-call delta, seconds, one per request that streamed one.
    pub tool_call: QuantileSketch,
    /// Σ reasoning tokens and the requests that reported them.
    pub reasoning_tokens: u64,
    pub reasoning_requests: u64,
    /// Requests that offered tools.
    pub with_tools: u64,
    /// Requests whose first answer token came after other output (reasoning, a tool call).
    pub answer_later: u64,
}

impl FirstTokenSum {
    pub fn add(&mut self, record: &RequestRecord) {
        // Every request that answered counts, so the cell's answer TTFT is over all of them;
        // the figures are shown only where some answer came after other output.
        if let Some(answer) = record.timing.ttft_answer {
            self.answer.add(answer.as_secs_f64(), 1.0);
            if record.timing.ttft.is_some_and(|first| answer > first) {
                self.answer_later += 1;
            }
        }
        if let Some(tool_call) = record.timing.ttft_tool_call {
            self.tool_call.add(tool_call.as_secs_f64(), 1.0);
        }
        if let Some(reasoning) = record.tokens.reasoning {
            self.reasoning_tokens = self.reasoning_tokens.saturating_add(reasoning);
            self.reasoning_requests += 1;
        }
        self.with_tools += u64::from(record.with_tools);
    }

    pub fn merge(&mut self, other: &FirstTokenSum) {
        self.answer.merge(&other.answer);
        self.tool_call.merge(&other.tool_call);
        self.reasoning_tokens = self.reasoning_tokens.saturating_add(other.reasoning_tokens);
        self.reasoning_requests += other.reasoning_requests;
        self.with_tools += other.with_tools;
        self.answer_later += other.answer_later;
    }

    /// Bins held (for the aggregator's memory bound).
    pub fn bins(&self) -> usize {
        self.answer.bins() + self.tool_call.bins()
    }

    /// The cell's figures: absent when no request had reasoning, a tool call or tools (then
    /// the answer TTFT is the TTFT, and says nothing new).
    pub fn to_first_tokens(&self) -> Option<FirstTokens> {
        let answers = self.answer.weight();
        let tool_calls = self.tool_call.weight();
        let reasoning = self.reasoning_requests > 0 && self.reasoning_tokens > 0;
        if tool_calls <= 0.0 && !reasoning && self.with_tools == 0 && !self.answer_differs() {
            return None;
        }
        let ms = |sketch: &QuantileSketch, q: f64, n: f64| {
            if q <= 0.5 {
                sketch.median().map(|s| s * 1000.0)
            } else {
                tail_ms(sketch, q, n)
            }
        };
        let count = |n: f64| (n > 0.0).then_some(n);
        FirstTokens::from_values([
            ms(&self.answer, 0.5, answers),
            ms(&self.answer, 0.9, answers),
            ms(&self.answer, 0.99, answers),
            count(answers),
            ms(&self.tool_call, 0.5, tool_calls),
            ms(&self.tool_call, 0.9, tool_calls),
            ms(&self.tool_call, 0.99, tool_calls),
            count(tool_calls),
            reasoning.then(|| self.reasoning_tokens as f64 / self.reasoning_requests as f64),
            count(self.with_tools as f64),
        ])
    }

    /// Whether some answers came later than their request's first token.
    fn answer_differs(&self) -> bool {
        self.answer_later > 0
    }
}

/// The server's scraped state summed over requests (docs/metrics.md): the production
/// aggregator and the sweep's cells both use it.
///
/// Each request brings its own time-weighted mean of each gauge over its interval (head in →
/// end) and the seconds a value was known in it; the cell's figure weights each request by
/// those seconds, so it is the state averaged over the request-seconds the cell's requests
/// spent at the server — time-weighted, like prefill interference, and a long request counts
/// for what it lived through.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ServerStateSum {
    /// Σ mean × known seconds, per gauge.
    pub weighted: [f64; GAUGES],
    /// Σ known seconds, per gauge.
    pub seconds: [f64; GAUGES],
}

impl ServerStateSum {
    /// Adds what one request saw.
    pub fn add(&mut self, record: &RequestRecord) {
        for (i, mean) in record.server_state.0.iter().enumerate() {
            let Some(mean) = mean else { continue };
            if !(mean.mean.is_finite()
                && mean.known_seconds.is_finite()
                && mean.known_seconds > 0.0)
            {
                continue;
            }
            if let (Some(weighted), Some(seconds)) =
                (self.weighted.get_mut(i), self.seconds.get_mut(i))
            {
                *weighted += mean.mean * mean.known_seconds;
                *seconds += mean.known_seconds;
            }
        }
    }

    pub fn merge(&mut self, other: &ServerStateSum) {
        for i in 0..GAUGES {
            if let (Some(w), Some(s), Some(ow), Some(os)) = (
                self.weighted.get_mut(i),
                self.seconds.get_mut(i),
                other.weighted.get(i),
                other.seconds.get(i),
            ) {
                *w += ow;
                *s += os;
            }
        }
    }

    /// The cell's figures; `None` when no request saw any state.
    pub fn to_state(&self) -> Option<ServerState> {
        let mean = |i: usize| {
            let seconds = self.seconds.get(i).copied().unwrap_or(0.0);
            (seconds > 0.0).then(|| self.weighted.get(i).copied().unwrap_or(0.0) / seconds)
        };
        ServerState::from_values([mean(0), mean(1), mean(2), mean(3)])
    }
}

/// SLO attainment and goodput summed over requests (docs/metrics.md); the production
/// aggregator and the sweep's cells both use it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SloSum {
    /// Requests that met every target set for them.
    pub met: u64,
    /// Requests that missed a target (or failed).
    pub missed: u64,
    /// Tokens of the requests that met their targets, counted like the cell's total tok/s
    /// counts its tokens (so goodput ÷ total tok/s is their share of the output).
    pub met_tokens: f64,
}

impl SloSum {
    /// Counts a request's verdict (requests without targets are not counted).
    pub fn add_verdict(&mut self, verdict: SloVerdict) {
        match verdict {
            SloVerdict::Met => self.met += 1,
            SloVerdict::Missed => self.missed += 1,
            SloVerdict::Unset => {}
        }
    }

    pub fn merge(&mut self, other: &SloSum) {
        self.met += other.met;
        self.missed += other.missed;
        self.met_tokens += other.met_tokens;
    }

    /// Share (0–1) of requests with targets that met all of them; `None` when none had any.
    pub fn attainment(&self) -> Option<f64> {
        let judged = self.met + self.missed;
        (judged > 0).then(|| self.met as f64 / judged as f64)
    }

    /// Goodput: `total_tok_s` scaled to the met requests' share of `tokens` (the tokens
    /// `total_tok_s` was computed from); `None` when no request had targets.
    pub fn goodput(&self, total_tok_s: Option<f64>, tokens: f64) -> Option<f64> {
        self.attainment()?;
        let total = total_tok_s?;
        if tokens > 0.0 {
            Some(total * (self.met_tokens / tokens).clamp(0.0, 1.0))
        } else {
            Some(0.0)
        }
    }
}

/// Prefill interference summed over requests (docs/metrics.md): the production aggregator
/// and the sweep's cells both use it, so the column means the same in either matrix.
///
/// The share is weighted by decode time, not tokens: a stalled request emits fewer tokens per
/// second, so token weights would under-count exactly the time the stalls cost, and
/// (1 − share) would no longer predict the cell's decode speed.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct InterferenceSum {
    /// Σ decode seconds (request-seconds) of requests that carry the figure.
    pub decode_seconds: f64,
    /// Σ of those seconds during which another request was in prefill.
    pub busy_seconds: f64,
    /// Requests with a figure, and Σ their overlapping prefills.
    pub requests: u64,
    pub overlapping_prefills: u64,
}

impl InterferenceSum {
    /// Adds a whole record (a sweep's cell holds whole requests); records without a decode
    /// interval carry no figure.
    pub fn add(&mut self, record: &RequestRecord) {
        if let (Some(share), Some(decode)) = (
            record.interference.prefill_overlap_share,
            record.timing.decode,
        ) {
            let decode = decode.as_secs_f64();
            self.add_decode(decode, share * decode);
        }
        self.add_count(record);
    }

    /// Adds `decode_seconds` of decode, `busy_seconds` of them under another prefill.
    pub fn add_decode(&mut self, decode_seconds: f64, busy_seconds: f64) {
        if decode_seconds > 0.0 && busy_seconds.is_finite() {
            self.decode_seconds += decode_seconds;
            self.busy_seconds += busy_seconds.clamp(0.0, decode_seconds);
        }
    }

    /// Counts a record's overlapping prefills.
    pub fn add_count(&mut self, record: &RequestRecord) {
        if let Some(overlapping) = record.interference.overlapping_prefills {
            self.requests += 1;
            self.overlapping_prefills += u64::from(overlapping);
        }
    }

    pub fn merge(&mut self, other: &InterferenceSum) {
        self.decode_seconds += other.decode_seconds;
        self.busy_seconds += other.busy_seconds;
        self.requests += other.requests;
        self.overlapping_prefills += other.overlapping_prefills;
    }

    /// Share (0–1) of the decode time during which another request was in prefill.
    pub fn share(&self) -> Option<f64> {
        (self.decode_seconds > 0.0)
            .then(|| (self.busy_seconds / self.decode_seconds).clamp(0.0, 1.0))
    }

    /// Mean number of other requests' prefills overlapping a request's decode.
    pub fn mean_overlapping_prefills(&self) -> Option<f64> {
        (self.requests > 0).then(|| self.overlapping_prefills as f64 / self.requests as f64)
    }
}

impl CellAccumulator {
    /// Adds what one request did at this cell's concurrency level.
    pub fn add_fragment(&mut self, fragment: &Fragment) {
        self.output_tokens += fragment.output_tokens;
        self.decode_tokens += fragment.decode_tokens;
        self.decode_seconds += fragment.decode_seconds;
        self.active_seconds += fragment.average_active * fragment.decode_seconds;
        if let Some(busy) = fragment.prefill_busy_seconds {
            self.interference.add_decode(fragment.decode_seconds, busy);
        }
        if fragment.slo_met {
            self.slo.met_tokens += fragment.decode_tokens;
        }
        if fragment.decode_tokens > 0.0 && fragment.decode_seconds > 0.0 {
            self.tbt.add(
                fragment.decode_seconds / fragment.decode_tokens,
                fragment.decode_tokens,
            );
        }
    }

    /// Adds what belongs to a request's own cell: its TTFT, its outcome, its prompt length.
    pub fn add_request_end(&mut self, record: &RequestRecord) {
        match record.outcome {
            Outcome::Ok => self.completed += 1,
            Outcome::ClientAborted => self.client_aborted += 1,
            outcome => {
                if let Some(i) = Outcome::ALL.iter().position(|o| *o == outcome) {
                    if let Some(count) = self.failed.get_mut(i) {
                        *count += 1;
                    }
                }
            }
        }
        if let Some(ttft) = record.timing.ttft {
            self.ttft.add(ttft.as_secs_f64(), 1.0);
        }
        for (gap, count) in record.timing.itl.buckets() {
            self.itl.add(gap, count as f64);
        }
        if let Some(prompt) = record.tokens.prompt {
            self.prompt_tokens += prompt;
            self.prompt_requests += 1;
        }
        self.interference.add_count(record);
        self.slo.add_verdict(record.slo.verdict);
        self.server_state.add(record);
        self.first_tokens.add(record);
        self.prompt_cache.add(record);
        self.steps.add(record);
    }

    /// Adds a whole request to this cell regardless of the levels it lived through: for a
    /// sweep, whose cell is known by construction.
    pub fn add_whole_request(&mut self, record: &RequestRecord) {
        let decode_seconds: f64 = record.timing.decode.map_or(0.0, |d| d.as_secs_f64());
        let decode_tokens = if record.tokens.events > 0 {
            record.tokens.completion as f64 * (1.0 - 1.0 / record.tokens.events as f64)
        } else {
            0.0
        };
        self.add_fragment(&Fragment {
            output_tokens: record.tokens.completion,
            decode_tokens,
            decode_seconds,
            average_active: record.interference.average_active,
            prefill_busy_seconds: record
                .interference
                .prefill_overlap_share
                .map(|share| share * decode_seconds),
            slo_met: record.slo.verdict == SloVerdict::Met,
        });
        self.add_request_end(record);
    }

    pub fn merge(&mut self, other: &CellAccumulator) {
        self.output_tokens += other.output_tokens;
        self.decode_tokens += other.decode_tokens;
        self.decode_seconds += other.decode_seconds;
        self.active_seconds += other.active_seconds;
        self.completed += other.completed;
        for (mine, theirs) in self.failed.iter_mut().zip(other.failed) {
            *mine += theirs;
        }
        self.client_aborted += other.client_aborted;
        self.prompt_tokens += other.prompt_tokens;
        self.prompt_requests += other.prompt_requests;
        self.ttft.merge(&other.ttft);
        self.tbt.merge(&other.tbt);
        self.itl.merge(&other.itl);
        self.interference.merge(&other.interference);
        self.slo.merge(&other.slo);
        self.server_state.merge(&other.server_state);
        self.first_tokens.merge(&other.first_tokens);
        self.prompt_cache.merge(&other.prompt_cache);
        self.steps.merge(&other.steps);
    }

    fn failures(&self) -> u64 {
        self.failed.iter().sum()
    }

    /// Whether anything measurable landed here (a cell of only client aborts with no output
    /// is not shown).
    pub fn is_empty(&self) -> bool {
        self.output_tokens == 0
            && self.decode_seconds <= 0.0
            && self.ttft.is_empty()
            && self.completed == 0
            && self.failures() == 0
    }

    /// Mean in-flight count over the cell's decode time.
    pub fn average_active(&self) -> Option<f64> {
        (self.decode_seconds > 0.0).then(|| self.active_seconds / self.decode_seconds)
    }

    /// Wall-clock seconds the cell's conditions held: request-seconds ÷ mean in-flight.
    pub fn measured_for(&self) -> Option<f64> {
        (self.active_seconds > 0.0)
            .then(|| self.decode_seconds * self.decode_seconds / self.active_seconds)
    }

    /// The cell as the matrix shows it (docs/metrics.md has each column's definition).
    pub fn to_cell(&self, context_tokens: u64, concurrency: u32) -> DecodeCell {
        let measured_for = self.measured_for();
        let tbt = self.tbt.median();
        let failures = self.failures();
        let finished = self.completed + failures;
        let status = if failures > 0 && failures as f64 > ERROR_SHARE * finished as f64 {
            let worst = Outcome::ALL
                .iter()
                .zip(self.failed)
                .max_by_key(|(_, count)| *count)
                .map_or("failed", |(outcome, _)| outcome.label());
            CellStatus::error(&format!(
                "{failures} of {finished} requests failed (mostly {worst})"
            ))
        } else {
            CellStatus::Valid
        };
        let total_tok_s = measured_for
            .filter(|m| *m > 0.0)
            .map(|m| self.decode_tokens / m);
        DecodeCell {
            prompt_cache: self.prompt_cache.to_prompt_cache(),
            tokens_per_step: self.steps.tokens_per_step(),
            first_tokens: self.first_tokens.to_first_tokens(),
            context_tokens,
            concurrency,
            status,
            total_tok_s,
            per_request_tok_s: tbt.filter(|t| *t > 0.0).map(|t| 1.0 / t),
            ttft_ms: self.ttft.median().map(|s| s * 1000.0),
            tbt_ms: tbt.map(|s| s * 1000.0),
            average_active_requests: self.average_active(),
            completed_requests: Some(self.completed),
            output_tokens: Some(self.output_tokens),
            measured_for_s: measured_for,
            prompt_tokens: (self.prompt_requests > 0)
                .then(|| (self.prompt_tokens as f64 / self.prompt_requests as f64).round() as u64),
            prefill_overlap_share: self.interference.share(),
            overlapping_prefills: self.interference.mean_overlapping_prefills(),
            slo_attainment: self.slo.attainment(),
            goodput_tok_s: self.slo.goodput(total_tok_s, self.decode_tokens),
            server_state: self.server_state.to_state(),
            tails: self.tails(),
            production_in_flight: None,
        }
    }

    /// p90 and p99 of TTFT, TBT and ITL, milliseconds, each only where its own samples carry
    /// it ([`tail_ms`]): TTFT's are the requests that ended here (TBT's too: one per request,
    /// weighted by tokens), ITL's the tokens.
    pub fn tails(&self) -> Option<Tails> {
        let requests = self.ttft.weight();
        Tails::from_values([
            tail_ms(&self.ttft, 0.9, requests),
            tail_ms(&self.ttft, 0.99, requests),
            tail_ms(&self.tbt, 0.9, requests),
            tail_ms(&self.tbt, 0.99, requests),
            tail_ms(&self.itl, 0.9, self.itl.weight()),
            tail_ms(&self.itl, 0.99, self.itl.weight()),
        ])
    }
}

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

/// Every decode cell and prefill row of one model, keyed by ladder bucket indexes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MatrixAccumulator {
    /// (context bucket, concurrency bucket) → cell.
    pub cells: BTreeMap<(usize, usize), CellAccumulator>,
    /// context bucket → prefill row.
    pub prefill: BTreeMap<usize, PrefillAccumulator>,
    /// Records added.
    pub requests: u64,
    /// Completion tokens of every record added (the conservation check's right side).
    pub output_tokens: u64,
    /// Records without a prompt token count: no context, so no cell.
    pub unplaced_requests: u64,
    pub unplaced_tokens: u64,
}

impl MatrixAccumulator {
    /// Adds a production record: its tokens and decode time to the cells of the concurrency
    /// levels it lived through, its TTFT and outcome to its own cell, and maybe a prefill
    /// sample. Records that reported no prompt token count are counted but placed nowhere.
    pub fn add_record(&mut self, record: &RequestRecord, concurrency: &Ladder) {
        self.requests += 1;
        self.output_tokens += record.tokens.completion;
        if record.tokens.prompt.is_none() {
            self.unplaced_requests += 1;
            self.unplaced_tokens += record.tokens.completion;
            return;
        }
        let context = record.buckets.context;
        for (bucket, fragment) in fragments(record, concurrency) {
            self.cells
                .entry((context, bucket))
                .or_default()
                .add_fragment(&fragment);
        }
        self.cells
            .entry((context, record.buckets.concurrency))
            .or_default()
            .add_request_end(record);
        let mut row = PrefillAccumulator::default();
        if row.add_record(record) {
            self.prefill.entry(context).or_default().merge(&row);
        }
    }

    pub fn merge(&mut self, other: &MatrixAccumulator) {
        for (key, cell) in &other.cells {
            self.cells.entry(*key).or_default().merge(cell);
        }
        for (key, row) in &other.prefill {
            self.prefill.entry(*key).or_default().merge(row);
        }
        self.requests += other.requests;
        self.output_tokens += other.output_tokens;
        self.unplaced_requests += other.unplaced_requests;
        self.unplaced_tokens += other.unplaced_tokens;
    }

    /// Sketch bins in use (memory accounting: each bin is 16 bytes).
    pub fn sketch_bins(&self) -> usize {
        self.cells
            .values()
            .map(|c| {
                c.ttft.bins()
                    + c.tbt.bins()
                    + c.itl.bins()
                    + c.first_tokens.bins()
                    + c.prompt_cache.bins()
            })
            .sum::<usize>()
            + self
                .prefill
                .values()
                .map(|p| {
                    p.known_cache.rate.bins()
                        + p.known_cache.ttft.bins()
                        + p.unknown_cache.rate.bins()
                        + p.unknown_cache.ttft.bins()
                })
                .sum::<usize>()
    }
}

impl MatrixAccumulator {
    /// The matrix document: every non-empty cell and qualifying prefill row, with notes on
    /// what could not be placed. `metadata` is taken as given (notes are appended).
    pub fn to_doc(
        &self,
        contexts: &Ladder,
        concurrency: &Ladder,
        metadata: crate::matrix::doc::Metadata,
    ) -> crate::matrix::doc::MatrixDoc {
        let mut doc = crate::matrix::doc::MatrixDoc::new(metadata);
        let mut beyond_ladders = 0u64;
        for (&(context, level), cell) in &self.cells {
            if cell.is_empty() {
                continue;
            }
            let (Some(context_tokens), Some(requests)) = (
                contexts.value(context),
                concurrency.value(level).and_then(|v| u32::try_from(v).ok()),
            ) else {
                beyond_ladders += cell.output_tokens;
                continue;
            };
            doc.decode.push(cell.to_cell(context_tokens, requests));
        }
        let mut assumed = Vec::new();
        for (&context, row) in &self.prefill {
            let Some(context_tokens) = contexts.value(context) else {
                continue;
            };
            if let Some((row, without_cache_counts)) = row.to_row(context_tokens) {
                if without_cache_counts {
                    assumed.push(contexts.label(context).to_owned());
                }
                doc.prefill.push(row);
            }
        }
        doc.sort();
        let notes = &mut doc.metadata.notes;
        if self.unplaced_requests > 0 {
            notes.push(format!(
                "{} requests ({} output tokens) reported no prompt token count and are in no cell.",
                self.unplaced_requests, self.unplaced_tokens
            ));
        }
        if beyond_ladders > 0 {
            notes.push(format!(
                "{beyond_ladders} output tokens were emitted beyond the ladders (context above {} or more than {} requests in flight) and are in no cell.",
                contexts.label(contexts.overflow().saturating_sub(1)),
                concurrency.label(concurrency.overflow().saturating_sub(1)),
            ));
        }
        if !assumed.is_empty() {
            notes.push(format!(
                "Prefill rows {} assume no prompt-cache hits: the server reported no cached-token counts for them.",
                assumed.join(", ")
            ));
        }
        doc
    }
}

/// Records built by hand for the aggregation tests.
#[cfg(test)]
pub(crate) mod test_records {
    use std::time::{Duration, SystemTime};

    use crate::meter::buckets::{Ladder, DEFAULT_CONCURRENCY, DEFAULT_CONTEXTS};
    use crate::meter::record::{
        time_between_tokens, Buckets, Interference, Outcome, Overhead, RequestRecord, Timing,
        Tokens,
    };
    use crate::meter::timeline::{ConcurrencySplit, LocalHistogram};

    static BOUNDS: [f64; 1] = [1.0];

    /// A streamed request of `prompt` tokens whose token events (one token each) arrived
    /// `tbt` apart after `ttft`, spending `(bucket, tokens)` at each concurrency bucket.
    pub fn record(
        prompt: Option<u64>,
        per_bucket: &[(usize, u64)],
        ttft: Duration,
        tbt: Duration,
        average_active: f64,
        outcome: Outcome,
    ) -> RequestRecord {
        let mut split = ConcurrencySplit::default();
        let completion: u64 = per_bucket.iter().map(|(_, t)| t).sum();
        let mut first = true;
        for &(bucket, tokens) in per_bucket {
            split.tokens[bucket] += tokens;
            // Every token but the very first closes a gap of `tbt`.
            let gaps = if first {
                tokens.saturating_sub(1)
            } else {
                tokens
            };
            first = false;
            split.seconds[bucket] += gaps as f64 * tbt.as_secs_f64();
        }
        let decode = tbt * u32::try_from(completion.saturating_sub(1)).unwrap();
        let contexts = Ladder::contexts(&DEFAULT_CONTEXTS).unwrap();
        let concurrency = Ladder::concurrency(&DEFAULT_CONCURRENCY).unwrap();
        let first_token = (completion > 0).then_some(ttft);
        RequestRecord {
            outcome,
            timing: Timing {
                started_at: SystemTime::UNIX_EPOCH + Duration::from_secs(1_750_000_000),
                to_headers: Some(ttft),
                to_first_byte: Some(ttft),
                ttft: first_token,
                ttft_answer: first_token,
                ttft_tool_call: None,
                to_first_delivery: first_token,
                duration: ttft + decode,
                decode: (completion > 0).then_some(decode),
                tbt: time_between_tokens(Some(decode), completion),
                itl: LocalHistogram::new(&BOUNDS),
            },
            tokens: Tokens {
                prompt,
                completion,
                completion_exact: true,
                events: completion,
                ..Tokens::default()
            },
            interference: Interference {
                average_active,
                split,
                ..Interference::default()
            },
            buckets: Buckets {
                context: contexts.context_bucket(prompt.unwrap_or(0)),
                concurrency: concurrency.concurrency_bucket(average_active),
            },
            overhead: Overhead {
                per_frame: LocalHistogram::new(&BOUNDS),
                ..Overhead::default()
            },
            ..RequestRecord::for_test()
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::test_records::record;
    use super::*;
    use crate::meter::buckets::{DEFAULT_CONCURRENCY, DEFAULT_CONTEXTS};

    fn ladders() -> (Ladder, Ladder) {
        (
            Ladder::contexts(&DEFAULT_CONTEXTS).unwrap(),
            Ladder::concurrency(&DEFAULT_CONCURRENCY).unwrap(),
        )
    }

    fn close(a: f64, b: f64, tolerance: f64) -> bool {
        (a - b).abs() <= tolerance * b.abs()
    }

    #[test]
    fn steady_streams_give_the_analytic_cell() {
        let (contexts, concurrency) = ladders();
        let mut matrix = MatrixAccumulator::default();
        let tbt = Duration::from_millis(20);
        let ttft = Duration::from_millis(150);
        // Four streams at 8K, 101 tokens each, all at the "4" level (bucket 2).
        for _ in 0..4 {
            let r = record(Some(8000), &[(2, 101)], ttft, tbt, 4.0, Outcome::Ok);
            matrix.add_record(&r, &concurrency);
        }
        let doc = matrix.to_doc(&contexts, &concurrency, Default::default());
        doc.validate().unwrap();
        assert_eq!(doc.decode.len(), 1);
        let cell = &doc.decode[0];
        assert_eq!((cell.context_tokens, cell.concurrency), (8192, 4));
        assert_eq!(cell.status, CellStatus::Valid);
        assert!(close(cell.total_tok_s.unwrap(), 200.0, 1e-9), "{cell:?}");
        assert!(
            close(cell.per_request_tok_s.unwrap(), 50.0, 0.01),
            "{cell:?}"
        );
        assert!(close(cell.tbt_ms.unwrap(), 20.0, 0.01), "{cell:?}");
        assert!(close(cell.ttft_ms.unwrap(), 150.0, 0.01), "{cell:?}");
        assert!(close(cell.average_active_requests.unwrap(), 4.0, 1e-9));
        assert!(close(cell.measured_for_s.unwrap(), 2.0, 1e-9), "{cell:?}");
        assert_eq!(cell.completed_requests, Some(4));
        assert_eq!(cell.output_tokens, Some(404));
        assert_eq!(cell.prompt_tokens, Some(8000));
        // No cached-token count: the prefill row rests on an assumption, and says so.
        assert_eq!(doc.prefill.len(), 1);
        assert!(doc.metadata.notes.iter().any(|n| n.contains("8K")));
    }

    #[test]
    fn prefill_overlap_follows_the_decode_time_it_stalled() {
        let (contexts, concurrency) = ladders();
        let mut matrix = MatrixAccumulator::default();
        let tbt = Duration::from_millis(10);
        // 51 tokens alone (bucket 0, 0.5 s, none of it under another prefill), then 100 tokens
        // at level 2 (bucket 1, 1 s, 0.4 s of it under another request's prefill).
        let mut r = record(
            Some(8000),
            &[(0, 51), (1, 100)],
            Duration::ZERO,
            tbt,
            1.5,
            Outcome::Ok,
        );
        r.interference.prefill_busy[1] = 0.4;
        r.interference.prefill_overlap_share = Some(0.4 / 1.5);
        r.interference.overlapping_prefills = Some(3);
        matrix.add_record(&r, &concurrency);
        // A request without the figure (one token event) changes no share.
        let mut single = record(Some(8000), &[(1, 1)], Duration::ZERO, tbt, 2.0, Outcome::Ok);
        single.interference.prefill_overlap_share = None;
        matrix.add_record(&single, &concurrency);
        let doc = matrix.to_doc(&contexts, &concurrency, Default::default());
        doc.validate().unwrap();
        let alone = doc.cell(8192, 1).unwrap();
        let paired = doc.cell(8192, 2).unwrap();
        assert_eq!(alone.prefill_overlap_share, Some(0.0));
        assert!(
            close(paired.prefill_overlap_share.unwrap(), 0.4, 1e-9),
            "{paired:?}"
        );
        // The overlapping prefills belong to the request's own cell (level 2: 1.5 rounds up).
        assert_eq!(paired.overlapping_prefills, Some(3.0));
        assert_eq!(alone.overlapping_prefills, None);
        // The sweep's way (whole requests): the share over the whole decode.
        let mut whole = CellAccumulator::default();
        whole.add_whole_request(&r);
        let cell = whole.to_cell(8192, 2);
        assert!(
            close(cell.prefill_overlap_share.unwrap(), 0.4 / 1.5, 1e-9),
            "{cell:?}"
        );
    }

    #[test]
    fn slo_attainment_counts_own_cell_requests_and_goodput_their_tokens() {
        use crate::meter::record::SloVerdict;
        let (contexts, concurrency) = ladders();
        let tbt = Duration::from_millis(10);
        let single = |verdict: SloVerdict, tokens: u64| {
            let mut r = record(Some(8000), &[(0, tokens)], tbt, tbt, 1.0, Outcome::Ok);
            r.slo.verdict = verdict;
            r
        };
        // No targets anywhere: no figure, so the columns stay absent.
        let mut matrix = MatrixAccumulator::default();
        matrix.add_record(&single(SloVerdict::Unset, 101), &concurrency);
        let doc = matrix.to_doc(&contexts, &concurrency, Default::default());
        let cell = doc.cell(8192, 1).unwrap();
        assert_eq!((cell.slo_attainment, cell.goodput_tok_s), (None, None));
        // One met (101 tokens), three missed (101 each): attainment 1/4, goodput 1/4 of total.
        matrix.add_record(&single(SloVerdict::Met, 101), &concurrency);
        for _ in 0..3 {
            matrix.add_record(&single(SloVerdict::Missed, 101), &concurrency);
        }
        let doc = matrix.to_doc(&contexts, &concurrency, Default::default());
        doc.validate().unwrap();
        let cell = doc.cell(8192, 1).unwrap();
        assert_eq!(cell.slo_attainment, Some(0.25));
        let (goodput, total) = (cell.goodput_tok_s.unwrap(), cell.total_tok_s.unwrap());
        assert!(close(goodput, total / 5.0, 1e-9), "{cell:?}");
        // All met: goodput is the total; none met: zero.
        for (verdict, share) in [(SloVerdict::Met, 1.0), (SloVerdict::Missed, 0.0)] {
            let mut whole = CellAccumulator::default();
            for _ in 0..3 {
                whole.add_whole_request(&single(verdict, 101));
            }
            let cell = whole.to_cell(8192, 1);
            assert_eq!(cell.slo_attainment, Some(share));
            let total = cell.total_tok_s.unwrap();
            assert!(close(cell.goodput_tok_s.unwrap(), total * share, 1e-9));
        }
    }

    #[test]
    fn a_request_spanning_levels_splits_its_tokens_and_time() {
        let (contexts, concurrency) = ladders();
        let mut matrix = MatrixAccumulator::default();
        let tbt = Duration::from_millis(10);
        // 51 tokens alone (bucket 0), then 100 tokens with a second request (bucket 1).
        let r = record(
            Some(20_000),
            &[(0, 51), (1, 100)],
            tbt,
            tbt,
            1.66,
            Outcome::Ok,
        );
        matrix.add_record(&r, &concurrency);
        let doc = matrix.to_doc(&contexts, &concurrency, Default::default());
        let alone = doc.cell(32768, 1).unwrap();
        let paired = doc.cell(32768, 2).unwrap();
        assert_eq!(
            alone.output_tokens.unwrap() + paired.output_tokens.unwrap(),
            151
        );
        assert!(close(
            alone.tbt_ms.unwrap(),
            10.0 * 50.0 / 51.0 * 151.0 / 150.0,
            0.011
        ));
        assert!(close(paired.tbt_ms.unwrap(), 10.0 * 151.0 / 150.0, 0.011));
        // The level's mean in-flight is clamped into the level's range.
        assert!(alone.average_active_requests.unwrap() <= 2f64.sqrt() + 1e-9);
        assert!(close(paired.average_active_requests.unwrap(), 1.66, 1e-9));
        // The request's own cell (its mean 1.66 is nearest 2) gets its end.
        assert_eq!(paired.completed_requests, Some(1));
        assert_eq!(alone.completed_requests, Some(0));
    }

    #[test]
    fn failures_beyond_the_share_mark_the_cell_error_and_unplaced_records_are_noted() {
        let (contexts, concurrency) = ladders();
        let mut matrix = MatrixAccumulator::default();
        let ms = Duration::from_millis;
        for i in 0..10 {
            let outcome = if i < 2 {
                Outcome::UpstreamAborted
            } else {
                Outcome::Ok
            };
            matrix.add_record(
                &record(Some(100), &[(0, 20)], ms(50), ms(10), 1.0, outcome),
                &concurrency,
            );
        }
        matrix.add_record(
            &record(None, &[(0, 7)], ms(50), ms(10), 1.0, Outcome::Ok),
            &concurrency,
        );
        let doc = matrix.to_doc(&contexts, &concurrency, Default::default());
        doc.validate().unwrap();
        let cell = doc.cell(8192, 1).unwrap();
        assert_eq!(
            cell.status,
            CellStatus::Error("2 of 10 requests failed (mostly upstream_aborted)".into())
        );
        assert_eq!(cell.output_tokens, Some(200));
        assert_eq!(matrix.output_tokens, 207);
        assert!(doc
            .metadata
            .notes
            .iter()
            .any(|n| n.contains("7 output tokens")));
        // Failed requests feed no prefill sample.
        assert_eq!(doc.prefill[0].completed_requests, Some(8));
    }

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
}
