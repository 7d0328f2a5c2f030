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
//! data path is reached only through [`DataPath`], so `tests` drives the runner against a
//! scripted fake in paused time.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::latest::LatestMatrix;
use super::plan::{Plan, PromptMode, ServerFacts};
use super::status::{CurrentStep, StatusCell, SweepState};
use crate::base::json::push_json_string;
use crate::matrix::capacity::{capacity, CapacityQuery, CapacityReport};
use crate::matrix::{CellStatus, DecodeCell, MatrixDoc, PrefillRow};
use crate::synthetic::prompt::{run_seed, PromptKind};
use crate::synthetic::{DataPath, RecordCollector};

mod attempt;
mod eta;
mod scout;
mod skeleton;
mod steps;
mod streams;

use eta::Clock;
pub use skeleton::initial_matrix;

/// How long a `/metrics` scrape or an abort may take.
const CONTROL_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the runner looks at its streams, the guard and the cancel flag.
const TICK: Duration = Duration::from_millis(50);
/// After an abort, how long streams get to end by themselves before they are dropped.
const ABORT_GRACE: Duration = Duration::from_secs(2);
/// The same when cancelling (the issue asks for "within a second").
const CANCEL_GRACE: Duration = Duration::from_millis(500);
/// Longest drain barrier before the next cell goes ahead anyway (noted in the matrix).
const DRAIN_LIMIT: Duration = Duration::from_secs(30);
/// When every stream streams but the gauge never shows C running, go ahead after this long.
const GAUGE_GRACE: Duration = Duration::from_secs(10);
/// How often a cell interrupted by production traffic is tried again.
const MAX_ATTEMPTS: usize = 3;
/// How often the guard is looked at while the sweep is paused for production traffic.
const GUARD_POLL: Duration = Duration::from_millis(100);

/// While paused, how often the status is published again (how long it has waited, the ETA).
const PAUSE_SHOWN_EVERY: Duration = Duration::from_secs(1);
/// Longest wait for production traffic to settle before an off-target cell is measured again:
/// the cell's window, within these bounds.
const SETTLE_LIMIT_MIN: Duration = Duration::from_secs(2);
const SETTLE_LIMIT_MAX: Duration = Duration::from_secs(30);
/// After the last stream is stopped, how long a slot task may take to end before it is
/// dropped.
const DISCONNECT_LIMIT: Duration = Duration::from_secs(10);
/// The one path every synthetic request goes to.
const COMPLETIONS_PATH: &str = "/v1/completions";
/// A scout asks for one output token: its time to first token is the prefill.
const SCOUT_MAX_TOKENS: u64 = 1;
/// A scout's request may take this long, plus its prompt at [`SLOWEST_PREFILL_TOK_S`]…
const SCOUT_LIMIT_BASE: Duration = Duration::from_secs(60);
/// …a prefill rate even a slow CPU server reaches.
const SLOWEST_PREFILL_TOK_S: u64 = 500;
/// The warm-up may take this long, plus [`WARM_UP_PREFILL_FACTOR`] × C × the scout's TTFT
/// (capped at [`WARM_UP_PREFILL_MAX`])…
const WARM_UP_LIMIT_BASE: Duration = Duration::from_secs(60);
/// …twice every stream's prefill one after another: the streams start together, and a server
/// may prefill them in turn…
const WARM_UP_PREFILL_FACTOR: f64 = 2.0;
/// …bounded (a day), so an absurd scout TTFT cannot overflow the limit.
const WARM_UP_PREFILL_MAX: Duration = Duration::from_secs(24 * 3600);
/// The scout TTFT the warm-up limit assumes when the scout gave none.
const DEFAULT_SCOUT_TTFT: Duration = Duration::from_secs(1);
/// The running gauge is sampled about this many times per window…
const SAMPLES_PER_WINDOW: u32 = 30;
/// …but not more often than this…
const SAMPLE_EVERY_MIN: Duration = Duration::from_millis(100);
/// …nor less often than this.
const SAMPLE_EVERY_MAX: Duration = Duration::from_secs(1);
/// Room in a request body for everything but the prompt (model, options, rid).
const BODY_FIELDS_BYTES: usize = 256;

/// Everything a run needs.
#[derive(Debug)]
pub struct RunnerInput {
    /// The one door to the data path (the proxy's, or a scripted fake in tests).
    pub path: Arc<dyn DataPath>,
    pub id: String,
    pub plan: Plan,
    pub facts: ServerFacts,
    /// Pause while more production requests than this are in flight.
    pub production_guard: u64,
    pub status: Arc<StatusCell>,
    /// The page's latest synthetic matrix: written with every published status, so no reader
    /// sees the sweep finished before its last cell is there.
    pub latest: LatestMatrix,
    pub cancel: watch::Receiver<bool>,
}

struct Runner {
    path: Arc<dyn DataPath>,
    id: String,
    plan: Plan,
    facts: ServerFacts,
    guard: u64,
    status: Arc<StatusCell>,
    latest: LatestMatrix,
    cancel: watch::Receiver<bool>,
    /// A capacity search's misses so far: (context, level, why).
    search_misses: Vec<(u64, u32, String)>,
    /// A capacity search's answer so far.
    capacity: Option<CapacityReport>,
    records: Arc<RecordCollector>,
    seed: u64,
    tag_prefix: String,
    model_json: String,
    prompt_kind: PromptKind,
    /// A token-id request has succeeded, so a later refusal is about something else (length).
    token_ids_work: bool,
    /// Token ids of the served vocabulary (from `/tokenize`), drawn for token-id prompts.
    id_pool: Option<Arc<[u64]>>,
    matrix: MatrixDoc,
    clock: Clock,
}

/// Runs a sweep to its end (finished or cancelled), writing progress and the matrix into
/// `input.status` as it goes. Returns the final matrix.
pub async fn run(input: RunnerInput) -> MatrixDoc {
    let tag_prefix = format!("tokentap-{}-", input.id);
    let records = RecordCollector::new(tag_prefix.clone());
    // Removed from the meter however the run ends (its future dropped included).
    let _scope = input.path.collect(records.clone());
    let mut model_json = String::new();
    push_json_string(&mut model_json, &input.plan.model);
    let matrix = initial_matrix(&input.id, &input.plan, &input.facts);
    let clock = Clock::new(
        input.plan.steps.iter().map(|s| s.prompt_tokens).collect(),
        input.plan.runnable_cells(),
    );
    let mut runner = Runner {
        seed: run_seed(&input.id),
        path: input.path,
        id: input.id,
        prompt_kind: match input.plan.prompt {
            PromptMode::Text => PromptKind::Text,
            PromptMode::Auto | PromptMode::TokenIds => PromptKind::TokenIds,
        },
        token_ids_work: false,
        id_pool: None,
        plan: input.plan,
        facts: input.facts,
        guard: input.production_guard,
        status: input.status,
        latest: input.latest,
        cancel: input.cancel,
        search_misses: Vec::new(),
        capacity: None,
        records,
        tag_prefix,
        model_json,
        matrix,
        clock,
    };
    if runner.prompt_kind == PromptKind::TokenIds {
        runner.harvest_token_ids().await;
    }
    runner.run().await
}

impl Runner {
    fn cancelled(&self) -> bool {
        *self.cancel.borrow()
    }

    fn production(&self) -> u64 {
        self.path.production_in_flight()
    }

    fn note(&mut self, note: String) {
        tracing::info!(sweep = %self.id, "{note}");
        self.matrix.metadata.notes.push(note);
    }

    /// Publishes progress (state, current step, ETA) and the matrix so far.
    fn publish(&self, state: SweepState, current: Option<CurrentStep>) {
        let clock = &self.clock;
        let paused_now = clock.paused_now();
        let eta = clock.eta_s(self.plan.cell_duration_s, paused_now);
        let matrix = self.matrix.clone();
        let capacity = self.capacity.clone();
        // The slot first, then the status: whoever sees the new state finds the matrix.
        self.latest.set_running(matrix.clone());
        let elapsed = clock.started.elapsed().as_secs_f64();
        let paused = (clock.paused + paused_now).as_secs_f64();
        let paused_now_s = (!paused_now.is_zero()).then_some(paused_now.as_secs_f64());
        let done = clock.done;
        self.status.update(|status| {
            if status.state != SweepState::Cancelling || state != SweepState::Running {
                status.state = state;
            }
            status.progress.current = current;
            status.progress.measurements_done = done;
            status.progress.eta_s = Some(eta);
            status.progress.elapsed_s = elapsed;
            status.progress.paused_s = paused;
            status.progress.paused_now_s = paused_now_s;
            status.matrix = Some(matrix);
            status.capacity = capacity;
        });
    }

    /// Files a measured cell and publishes progress.
    fn finish_cell(&mut self, cell: DecodeCell) {
        self.set_cell(cell);
        self.clock.cells_left = self.clock.cells_left.saturating_sub(1);
        self.clock.done += 1;
        self.publish(SweepState::Running, None);
    }

    /// The capacity answer of the contexts searched so far, from the matrix: a miss on a cell
    /// that is not Valid (an error, off target) is the boundary too.
    fn update_capacity(&mut self, query: &CapacityQuery) {
        let Ok(mut report) = capacity(&self.matrix, query) else {
            return;
        };
        for context in &mut report.contexts {
            let first_miss = self
                .search_misses
                .iter()
                .filter(|(ctx, ..)| *ctx == context.context_tokens)
                .min_by_key(|(_, c, _)| *c);
            if let (false, Some((_, level, why))) = (context.boundary_seen, first_miss) {
                if context.capacity.is_none_or(|cap| cap < *level) {
                    context.boundary_seen = true;
                    context.capacity.get_or_insert(0);
                    context.limited_by = Some(format!("{why} at {level}"));
                }
            }
        }
        self.capacity = Some(report);
    }

    /// Marks every runnable cell of `context` as an error (its scout failed).
    fn fail_context(&mut self, context: u64, reason: &str) {
        for concurrency in self.plan.concurrency.clone() {
            if !self.plan.over_capacity(context, concurrency) {
                self.set_cell(DecodeCell::status_only(
                    context,
                    concurrency,
                    CellStatus::error(reason),
                ));
                self.clock.cells_left = self.clock.cells_left.saturating_sub(1);
                self.clock.done += 1;
            }
        }
        self.publish(SweepState::Running, None);
    }

    fn set_cell(&mut self, cell: DecodeCell) {
        if let Some(slot) =
            self.matrix.decode.iter_mut().find(|c| {
                c.context_tokens == cell.context_tokens && c.concurrency == cell.concurrency
            })
        {
            *slot = cell;
        }
    }

    fn set_prefill(&mut self, row: PrefillRow) {
        if let Some(slot) = self
            .matrix
            .prefill
            .iter_mut()
            .find(|r| r.context_tokens == row.context_tokens)
        {
            *slot = row;
        }
    }
}

#[cfg(test)]
mod fake;
#[cfg(test)]
mod tests;
