//! The performance model: pure functions from a validated [`Profile`] to durations
//! (prefill chunk time, decode step time, cache-hit TTFT) and the seeded draws that make
//! a run deterministic (splitmix64, speculative accept lengths, natural output lengths).
//!
//! This module never sleeps, never does I/O and never looks at a clock: the scheduler
//! asks it "how long" and keeps the time itself.
//!
//! Interpolation rules (documented in docs/simulator.md):
//! * Prefill rate: piecewise linear in log2(context) between the profile's points, held
//!   flat beyond the first and last point.
//! * Decode step time and cache-hit TTFT: grids over (context, batch). Missing cells
//!   (rows shorter than the batch axis: "Over capacity" / "Not run" in a seed) are filled
//!   row by row from the previous (shorter-context) row scaled by the ratio of the two rows
//!   at the last column both have; the first row is extended linearly in batch size with the
//!   slope of its last segment (never decreasing). Lookup is linear in batch size between
//!   columns (and beyond the last column, linear with the last segment's slope), and linear
//!   in log2(context) between rows, held flat outside the row range.
use std::time::Duration;

use super::profile::Profile;

/// A validated profile turned into lookup tables.
#[derive(Debug, Clone)]
pub struct PerformanceModel {
    prefill_log_ctx: Vec<f64>,
    prefill_tok_s: Vec<f64>,
    step: Grid,
    cached_ttft: Grid,
    tokens_per_step: f64,
    accept_length_spread: u32,
}

#[derive(Debug, Clone)]
struct Grid {
    log_ctx: Vec<f64>,
    batches: Vec<f64>,
    /// Filled, `values[row][col]`, every row as long as `batches`.
    values: Vec<Vec<f64>>,
}

impl PerformanceModel {
    /// Build the tables. The profile must already be valid ([`Profile::validate`]).
    pub fn new(profile: &Profile) -> PerformanceModel {
        let decode = &profile.decode;
        let step_ms: Vec<Vec<f64>> = decode
            .per_request_tok_s
            .iter()
            .map(|row| {
                row.iter()
                    .map(|tok_s| decode.tokens_per_step / tok_s * 1000.0)
                    .collect()
            })
            .collect();
        PerformanceModel {
            prefill_log_ctx: profile.prefill.contexts.iter().map(|c| log2(*c)).collect(),
            prefill_tok_s: profile.prefill.tok_s.clone(),
            step: Grid::new(&decode.contexts, &decode.batch_sizes, &step_ms),
            cached_ttft: Grid::new(
                &profile.cached_ttft.contexts,
                &profile.cached_ttft.batch_sizes,
                &profile.cached_ttft.ms,
            ),
            tokens_per_step: decode.tokens_per_step,
            accept_length_spread: decode.accept_length_spread,
        }
    }

    /// Cold prefill throughput (tokens/s) of a prompt of `context` tokens.
    pub fn prefill_tok_s(&self, context: u64) -> f64 {
        interpolate_1d(&self.prefill_log_ctx, &self.prefill_tok_s, log2(context))
    }

    /// Time to prefill `tokens` tokens of a prompt whose full length is `context`.
    pub fn prefill_time(&self, tokens: u64, context: u64) -> Duration {
        secs(tokens as f64 / self.prefill_tok_s(context))
    }

    /// Duration of one decode step of `batch` requests whose mean prompt is `context` tokens.
    pub fn decode_step_time(&self, context: f64, batch: usize) -> Duration {
        secs(self.step.lookup(context, batch as f64) / 1000.0)
    }

    /// Per-request decode speed (tokens/s) the model produces at this point.
    pub fn per_request_tok_s(&self, context: f64, batch: usize) -> f64 {
        self.tokens_per_step * 1000.0 / self.step.lookup(context, batch as f64)
    }

    /// TTFT of a prompt-cache hit of `context` tokens joining a batch of `batch` requests
    /// (itself included).
    pub fn cached_ttft(&self, context: u64, batch: usize) -> Duration {
        secs(self.cached_ttft.lookup(context as f64, batch as f64) / 1000.0)
    }

    pub fn tokens_per_step(&self) -> f64 {
        self.tokens_per_step
    }

    /// A fresh accept-length sequence for one request.
    pub fn accept_lengths(&self, seed: u64) -> AcceptLengths {
        AcceptLengths {
            rng: SplitMix64::new(seed),
            mean: self.tokens_per_step,
            spread: self.accept_length_spread,
            carry: 0.0,
            owed: None,
        }
    }
}

impl Grid {
    fn new(contexts: &[u64], batch_sizes: &[u32], rows: &[Vec<f64>]) -> Grid {
        let batches: Vec<f64> = batch_sizes.iter().map(|b| f64::from(*b)).collect();
        let width = batches.len();
        let mut values: Vec<Vec<f64>> = Vec::with_capacity(rows.len());
        for (r, row) in rows.iter().enumerate() {
            let mut filled = row.clone();
            let previous = if r > 0 { values.get(r - 1) } else { None };
            match previous {
                Some(prev) if !row.is_empty() => {
                    // Scale the shorter-context row by the ratio at this row's last column.
                    let last = row.len() - 1;
                    let ratio = row[last] / prev[last];
                    filled.extend(prev.iter().skip(row.len()).map(|v| v * ratio));
                }
                _ => {
                    for c in row.len()..width {
                        filled.push(extend_linearly(&batches, &filled, batches[c]));
                    }
                }
            }
            values.push(filled);
        }
        Grid {
            log_ctx: contexts.iter().map(|c| log2(*c)).collect(),
            batches,
            values,
        }
    }

    fn lookup(&self, context: f64, batch: f64) -> f64 {
        let at_row = |r: usize| along_batch(&self.batches, &self.values[r], batch);
        let x = context.max(1.0).log2();
        let n = self.log_ctx.len();
        if n == 1 || x <= self.log_ctx[0] {
            return at_row(0);
        }
        if x >= self.log_ctx[n - 1] {
            return at_row(n - 1);
        }
        let upper = self.log_ctx.partition_point(|v| *v <= x).min(n - 1);
        let lower = upper - 1;
        let t = (x - self.log_ctx[lower]) / (self.log_ctx[upper] - self.log_ctx[lower]);
        at_row(lower) * (1.0 - t) + at_row(upper) * t
    }
}

/// Linear in batch between columns; beyond the last column, linear with the last
/// segment's slope (never decreasing); below the first column, the first value.
fn along_batch(batches: &[f64], values: &[f64], batch: f64) -> f64 {
    let n = batches.len();
    if n == 1 || batch <= batches[0] {
        return values[0];
    }
    if batch >= batches[n - 1] {
        return extend_linearly(batches, values, batch);
    }
    let upper = batches.partition_point(|b| *b <= batch).min(n - 1);
    let lower = upper - 1;
    let t = (batch - batches[lower]) / (batches[upper] - batches[lower]);
    values[lower] * (1.0 - t) + values[upper] * t
}

/// Extend `values` (known for the first `values.len()` batch sizes) to `batch` with the
/// slope of the last known segment, never decreasing.
fn extend_linearly(batches: &[f64], values: &[f64], batch: f64) -> f64 {
    let known = values.len();
    let last = values[known - 1];
    if known < 2 {
        // A single measured column: step time held flat (per-request speed kept).
        return last;
    }
    let slope = ((last - values[known - 2]) / (batches[known - 1] - batches[known - 2])).max(0.0);
    last + slope * (batch - batches[known - 1])
}

fn interpolate_1d(xs: &[f64], ys: &[f64], x: f64) -> f64 {
    let n = xs.len();
    if n == 1 || x <= xs[0] {
        return ys[0];
    }
    if x >= xs[n - 1] {
        return ys[n - 1];
    }
    let upper = xs.partition_point(|v| *v <= x).min(n - 1);
    let lower = upper - 1;
    let t = (x - xs[lower]) / (xs[upper] - xs[lower]);
    ys[lower] * (1.0 - t) + ys[upper] * t
}

fn log2(value: u64) -> f64 {
    (value.max(1) as f64).log2()
}

fn secs(seconds: f64) -> Duration {
    if seconds.is_finite() && seconds > 0.0 {
        Duration::from_secs_f64(seconds.min(1.0e6))
    } else {
        Duration::ZERO
    }
}

/// splitmix64: tiny, fast, good enough for simulation draws, and reproducible everywhere.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64 { state: seed }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..bound` (`bound` ≥ 1).
    pub fn below(&mut self, bound: u64) -> u64 {
        // Multiply-shift: unbiased enough for simulation, no division.
        ((u128::from(self.next_u64()) * u128::from(bound.max(1))) >> 64) as u64
    }
}

/// Mix several words into one seed (request seeds from the server seed and the prompt).
pub fn mix_seed(a: u64, b: u64) -> u64 {
    let mut rng = SplitMix64::new(a ^ b.rotate_left(17));
    rng.next_u64() ^ b
}

/// Tokens emitted by each decode step of one request.
///
/// Speculative decoding emits a varying number of tokens per step. Draws come in pairs
/// `base + d`, `base − d` with `d` uniform in `−spread..=spread`, and `base` carries the
/// fractional part of the mean forward, so after every pair the running total is within
/// one token of `steps × tokens_per_step`: a short measurement window sees the profile's
/// speed, not sampling noise.
#[derive(Debug, Clone)]
pub struct AcceptLengths {
    rng: SplitMix64,
    mean: f64,
    spread: u32,
    carry: f64,
    owed: Option<i64>,
}

impl AcceptLengths {
    pub fn next_step(&mut self) -> u32 {
        let base = {
            let exact = self.mean + self.carry;
            let whole = exact.floor();
            self.carry = exact - whole;
            whole as i64
        };
        let offset = match self.owed.take() {
            Some(offset) => offset,
            None => {
                let spread = i64::from(self.spread);
                let d = self.rng.below((2 * spread + 1) as u64) as i64 - spread;
                self.owed = Some(-d);
                d
            }
        };
        (base + offset).max(1) as u32
    }
}

/// A request's natural output length when it may stop on EOS: uniform in
/// `1..=2 × mean`, so the mean is the profile's `natural_output_tokens`.
pub fn natural_output_tokens(seed: u64, mean: u32) -> u32 {
    let mut rng = SplitMix64::new(seed ^ 0x5EED_0E05);
    1 + rng.below(u64::from(mean) * 2) as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::Profile;

    fn glm() -> Profile {
        Profile::builtin("glm-5.3-flash-nvfp4-4x-rtx-pro-6000").unwrap()
    }

    #[test]
    fn a_slowdown_multiplies_prefill_and_decode_times() {
        let base = PerformanceModel::new(&glm());
        let slow = PerformanceModel::new(&glm().slowed(1.5));
        let profile = glm();
        let close = |a: Duration, b: Duration| {
            let (a, b) = (a.as_secs_f64(), b.as_secs_f64());
            (a - b).abs() <= 1e-6 * b.max(1e-9)
        };
        for &context in &profile.prefill.contexts {
            assert!(close(
                slow.prefill_time(context, context),
                base.prefill_time(context, context).mul_f64(1.5)
            ));
        }
        let row = &profile.decode.per_request_tok_s[0];
        let context = profile.decode.contexts[0] as f64;
        for (col, _) in row.iter().enumerate() {
            let batch = profile.decode.batch_sizes[col] as usize;
            assert!(close(
                slow.decode_step_time(context, batch),
                base.decode_step_time(context, batch).mul_f64(1.5)
            ));
        }
        let unchanged = PerformanceModel::new(&glm().slowed(0.0));
        assert_eq!(
            unchanged.prefill_time(8192, 8192),
            base.prefill_time(8192, 8192)
        );
    }

    #[test]
    fn grid_points_are_reproduced_exactly() {
        let profile = glm();
        let model = PerformanceModel::new(&profile);
        for (r, ctx) in profile.decode.contexts.iter().enumerate() {
            for (c, want) in profile.decode.per_request_tok_s[r].iter().enumerate() {
                let batch = profile.decode.batch_sizes[c] as usize;
                let got = model.per_request_tok_s(*ctx as f64, batch);
                assert!((got - want).abs() < 1e-9, "{ctx}x{batch}: {got} vs {want}");
            }
        }
        for (ctx, want) in profile.prefill.contexts.iter().zip(&profile.prefill.tok_s) {
            assert!((model.prefill_tok_s(*ctx) - want).abs() < 1e-9);
        }
    }

    #[test]
    fn missing_cells_are_filled_monotonically() {
        let model = PerformanceModel::new(&glm());
        // 1019K row has only c=1; higher batches must be slower per request, not faster.
        let one = model.per_request_tok_s(1_043_456.0, 1);
        let many = model.per_request_tok_s(1_043_456.0, 32);
        assert!(many < one, "{many} vs {one}");
        // Beyond the grid's last column the step time keeps growing.
        let at_128 = model.decode_step_time(8192.0, 128);
        let at_2000 = model.decode_step_time(8192.0, 2000);
        assert!(at_2000 > at_128);
    }

    #[test]
    fn accept_lengths_track_the_mean_tightly() {
        let model = PerformanceModel::new(&glm());
        let mut draws = model.accept_lengths(7);
        let mut total = 0u64;
        let mut seen = std::collections::BTreeSet::new();
        for step in 1..=1001u64 {
            let k = draws.next_step();
            seen.insert(k);
            total += u64::from(k);
            let expected = step as f64 * 3.0;
            assert!((total as f64 - expected).abs() <= 1.0 + 1e-9, "step {step}");
        }
        assert!(seen.len() > 1, "speculative steps should vary: {seen:?}");
    }

    #[test]
    fn splitmix_matches_the_reference_sequence() {
        // The first outputs of Vigna's reference `splitmix64.c` seeded with 1234567: a
        // changed constant, shift or order of operations changes every seeded run's bytes.
        let mut rng = SplitMix64::new(1_234_567);
        let got: Vec<u64> = (0..5).map(|_| rng.next_u64()).collect();
        assert_eq!(
            got,
            [
                6_457_827_717_110_365_317,
                3_203_168_211_198_807_973,
                9_817_491_932_198_370_423,
                4_593_380_528_125_082_431,
                16_408_922_859_458_223_821,
            ]
        );
    }

    #[test]
    fn bounded_draws_stay_in_range_and_cover_it() {
        let mut rng = SplitMix64::new(9);
        let mut seen = [false; 10];
        for _ in 0..1000 {
            let draw = rng.below(10);
            assert!(draw < 10, "{draw}");
            seen[draw as usize] = true;
        }
        assert!(seen.iter().all(|s| *s), "{seen:?}");
        let lengths: std::collections::BTreeSet<u32> = (0..200)
            .map(|seed| natural_output_tokens(seed, 10))
            .collect();
        assert!(lengths.iter().all(|n| (1..=20).contains(n)), "{lengths:?}");
        assert!(
            lengths.len() > 10,
            "natural lengths should vary with the seed: {lengths:?}"
        );
    }
}
