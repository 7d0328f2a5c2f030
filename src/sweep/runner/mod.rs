//! The sweep procedure (the seed tool's): for each context, ascending, a scout
//! (`max_tokens` 1, cold prompt) gives the prefill row and warms the prompt cache; then for each
//! concurrency, ascending, C identical `ignore_eos` streams; wait until the server reports C
//! running (its gauge; else stream activity); a fixed window in which streams that finish are
//! restarted; at window end a targeted abort (sglang `/abort_request` by rid; otherwise a
//! disconnect) and a drain barrier before the next cell. Cells over the KV budget are skipped.
//!
//! Production keeps flowing: before every measurement, and during one, production in-flight
//! above the guard pauses the sweep (an interrupted cell is measured again), and the matrix
//! notes record each pause. A cancel aborts the streams within a second and leaves the cells
//! not yet measured `Not run`.
//!
//! The runner computes nothing from its own clock except the window boundaries: the cells come
//! from the proxy's records of the sweep's requests (collected by tag) and from its live
//! synthetic token counter.
//!
//! Files, one job each: `steps` (the loop over the plan's steps, each cell's attempts, the
//! production guard), `scout` (a context's prefill row and its prompt, the token-id → text
//! fallback), `attempt` (one attempt at a decode cell: warm-up, window, finish), `streams` (a
//! cell's stream slots, their shared book, request bodies, the load sampler, aborts), `eta`
//! (the progress clock and the ETA, pure), `skeleton` (the matrix before anything ran). The
//! data path is reached only through [`DataPath`](crate::synthetic::DataPath), so `tests` drives the runner against a
//! scripted fake in paused time.
//!
//! Files: `state` (the runner's state, constants, bookkeeping and `run`), `steps` (the procedure:
//! scouts then cells, pauses), `scout`, `attempt` (one cell's window), `streams` (its streams and
//! aborts), `eta`, `skeleton` (the matrix before anything ran). This file only declares and
//! re-exports.

mod attempt;
mod eta;
mod scout;
mod skeleton;
mod state;
mod steps;
mod streams;

pub use skeleton::initial_matrix;
pub use state::{run, RunnerInput};

#[cfg(test)]
mod fake;
#[cfg(test)]
mod tests;
