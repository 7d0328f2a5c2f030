//! Accumulators that turn request records into matrix cells, one file per measure:
//! [`CellAccumulator`] (one sustained-decode cell, `decode`), [`PrefillAccumulator`] (one
//! prefill row, `prefill`) and [`MatrixAccumulator`] (every cell and row of one model,
//! `matrix`), the split of a request over the concurrency levels it lived through
//! (`fragment`), the tail rule (`tails`), and one `*Sum` per measure a cell carries: its
//! decode steps ([`StepSum`]), streams delivered in bursts ([`BurstSum`]), prompt cache ([`PromptCacheSum`]), first tokens
//! ([`FirstTokenSum`]), the server's state ([`ServerStateSum`]), SLO verdicts ([`SloSum`]) and
//! prefill interference ([`InterferenceSum`]); and, per model, how every request ended
//! ([`OutcomeSum`], placed in a cell or not: what the verdict's availability reads). The
//! definitions are in docs/metrics.md; every figure is a sum or a [`QuantileSketch`](crate::aggregate::sketch::QuantileSketch), so an
//! accumulator's size does not grow with the number of requests, and two accumulators merge
//! exactly (sums add, sketches merge).
//!
//! The same code serves production windows and the synthetic sweep: a sweep that knows which
//! cell its requests belong to calls [`CellAccumulator::add_whole_request`]; production traffic
//! goes through [`MatrixAccumulator::add_record`], which splits each request over the
//! concurrency levels it lived through. No I/O, no clock, no locks here.

mod bursts;
mod decode;
mod first_tokens;
mod fragment;
mod interference;
mod matrix;
mod outcomes;
mod prefill;
mod prompt_cache;
mod server_state;
mod slo;
mod steps;
mod tails;
#[cfg(test)]
pub(crate) mod test_records;

pub use bursts::{BurstSum, BURST_SHARE};
pub use decode::{CellAccumulator, ERROR_SHARE};
pub use first_tokens::FirstTokenSum;
pub use fragment::{bucket_range, fragments, Fragment};
pub use interference::InterferenceSum;
pub use matrix::MatrixAccumulator;
pub use outcomes::{Failure, OutcomeSum};
pub use prefill::{PrefillAccumulator, PrefillSamples, PREFILL_MIN_UNCACHED_SHARE};
pub use prompt_cache::PromptCacheSum;
pub use server_state::ServerStateSum;
pub use slo::SloSum;
pub use steps::StepSum;
pub use tails::{tail_ms, MIN_SAMPLES_FOR_P90, MIN_SAMPLES_FOR_P99};
