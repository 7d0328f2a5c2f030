//! One sustained-decode cell being accumulated ([`CellAccumulator`]) and the cell the matrix
//! shows from it: the fragments of the requests that decoded at its level, the ends of the
//! requests whose own cell it is, and one `*Sum` per measure.

use crate::aggregate::sketch::QuantileSketch;
use crate::matrix::doc::{CellStatus, DecodeCell, Tails};
use crate::meter::record::{Outcome, RequestRecord, SloVerdict};

use super::bursts::BurstSum;
use super::first_tokens::FirstTokenSum;
use super::fragment::Fragment;
use super::interference::InterferenceSum;
use super::prompt_cache::PromptCacheSum;
use super::server_state::ServerStateSum;
use super::slo::SloSum;
use super::steps::StepSum;
use super::tails::tail_ms;

/// Share of failed requests above which a cell is `Error` (or `Shed`, when shed requests are
/// the most common failure) rather than `Valid` (a failure is a request that failed on the
/// server's side, [`Outcome::is_failure`], shed requests included: client aborts are not
/// failures, people press stop).
pub const ERROR_SHARE: f64 = 0.05;

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
    /// Own-cell streams, and those delivered in bursts: whether the gaps are decode steps.
    pub bursts: BurstSum,
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
        self.bursts.add(record);
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
        self.bursts.merge(&other.bursts);
    }

    fn failures(&self) -> u64 {
        self.failed.iter().sum()
    }

    /// Requests whose own cell this is that the engine shed (outcome `shed`).
    pub fn shed(&self) -> u64 {
        Outcome::ALL
            .iter()
            .position(|o| *o == Outcome::Shed)
            .and_then(|i| self.failed.get(i))
            .copied()
            .unwrap_or(0)
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
                .map_or(Outcome::UpstreamError, |(outcome, _)| *outcome);
            if worst == Outcome::Shed {
                // The engine refused the load rather than failing it: a status of its own.
                CellStatus::shed(&format!("{} of {finished} requests shed", self.shed()))
            } else {
                CellStatus::error(&format!(
                    "{failures} of {finished} requests failed (mostly {})",
                    worst.label()
                ))
            }
        } else if let Some(bursts) = self.bursts.status() {
            // The gaps measure how the stream was handed over, not the engine's steps.
            bursts
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::aggregate::cell::test_records::record;

    /// A cell of `ok` whole requests and `failed` upstream aborts.
    fn cell_with(ok: usize, failed: usize) -> DecodeCell {
        let ms = Duration::from_millis;
        let mut cell = CellAccumulator::default();
        for i in 0..ok + failed {
            let outcome = if i < failed {
                Outcome::UpstreamAborted
            } else {
                Outcome::Ok
            };
            cell.add_whole_request(&record(Some(100), &[(0, 20)], ms(50), ms(10), 1.0, outcome));
        }
        cell.to_cell(8192, 1)
    }

    #[test]
    fn a_cell_is_an_error_only_past_the_failure_share() {
        // 1 of 20 is exactly the share: still valid; 2 of 20 is past it.
        assert_eq!(cell_with(19, 1).status, CellStatus::Valid);
        assert_eq!(
            cell_with(18, 2).status,
            CellStatus::Error("2 of 20 requests failed (mostly upstream_aborted)".into())
        );
    }

    #[test]
    fn a_cell_whose_failures_are_mostly_shed_is_shed() {
        let ms = Duration::from_millis;
        let mut cell = CellAccumulator::default();
        for i in 0..20 {
            let outcome = match i {
                0..=2 => Outcome::Shed,
                3 => Outcome::UpstreamAborted,
                _ => Outcome::Ok,
            };
            cell.add_whole_request(&record(Some(100), &[(0, 20)], ms(50), ms(10), 1.0, outcome));
        }
        assert_eq!(cell.shed(), 3);
        let shown = cell.to_cell(8192, 1);
        assert_eq!(
            shown.status,
            CellStatus::Shed("3 of 20 requests shed".into())
        );
        shown.validate().unwrap();
        // The admitted requests' figures stay.
        assert!(shown.ttft_ms.is_some());
    }

    #[test]
    fn client_aborts_are_not_failures_and_an_empty_cell_is_empty() {
        let mut cell = CellAccumulator::default();
        assert!(cell.is_empty());
        let mut aborted = RequestRecord::for_test();
        aborted.outcome = Outcome::ClientAborted;
        cell.add_request_end(&aborted);
        assert!(
            cell.is_empty(),
            "a cell of only client aborts with no output"
        );
        assert_eq!(cell.client_aborted, 1);
        assert_eq!(cell.to_cell(8192, 1).status, CellStatus::Valid);
    }

    #[test]
    fn merged_cells_give_the_cell_of_all_their_requests() {
        let ms = Duration::from_millis;
        let r = record(Some(100), &[(0, 11)], ms(50), ms(10), 2.0, Outcome::Ok);
        let (mut a, mut b, mut both) = (
            CellAccumulator::default(),
            CellAccumulator::default(),
            CellAccumulator::default(),
        );
        a.add_whole_request(&r);
        b.add_whole_request(&r);
        both.add_whole_request(&r);
        both.add_whole_request(&r);
        a.merge(&b);
        assert_eq!(a, both);
        assert_eq!(a.average_active(), Some(2.0));
        // 0.2 request-seconds at 2 in flight: 0.1 s of wall clock.
        assert!((a.measured_for().unwrap() - 0.1).abs() < 1e-12);
    }
}
