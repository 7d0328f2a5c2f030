//! The runner's state and bookkeeping: what a run is given ([`RunnerInput`]), what it holds
//! ([`Runner`]: the door, the plan, the scouts' [`ScoutState`], the [`RunProgress`] so far), its
//! limits and pacing constants, how it files a measured cell or prefill row and publishes its
//! progress, and [`run`], which starts the steps.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::base::json::push_json_string;
use crate::matrix::capacity::{capacity, CapacityQuery, CapacityReport};
use crate::matrix::{CellStatus, DecodeCell, MatrixDoc, PrefillRow};
use crate::sweep::latest::LatestMatrix;
use crate::sweep::plan::{Plan, PromptMode, ServerFacts};
use crate::sweep::status::{CurrentStep, StatusCell, SweepState};
use crate::synthetic::prompt::{run_seed, Prompt, PromptKind};
use crate::synthetic::{DataPath, RecordCollector};

use super::eta::Clock;
use super::skeleton::initial_matrix;

/// How long a `/metrics` scrape or an abort may take.
pub(super) const CONTROL_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the runner looks at its streams, the guard and the cancel flag.
pub(super) const TICK: Duration = Duration::from_millis(50);
/// After an abort, how long streams get to end by themselves before they are dropped.
pub(super) const ABORT_GRACE: Duration = Duration::from_secs(2);
/// The same when cancelling (the issue asks for "within a second").
pub(super) const CANCEL_GRACE: Duration = Duration::from_millis(500);
/// Longest drain barrier before the next cell goes ahead anyway (noted in the matrix).
pub(super) const DRAIN_LIMIT: Duration = Duration::from_secs(30);
/// When every stream streams but the gauge never shows C running, go ahead after this long.
pub(super) const GAUGE_GRACE: Duration = Duration::from_secs(10);
/// How often a cell interrupted by production traffic is tried again.
pub(super) const MAX_ATTEMPTS: usize = 3;
/// How often the guard is looked at while the sweep is paused for production traffic.
pub(super) const GUARD_POLL: Duration = Duration::from_millis(100);

/// While paused, how often the status is published again (how long it has waited, the ETA).
pub(super) const PAUSE_SHOWN_EVERY: Duration = Duration::from_secs(1);
/// Longest wait for production traffic to settle before an off-target cell is measured again:
/// the cell's window, within these bounds.
pub(super) const SETTLE_LIMIT_MIN: Duration = Duration::from_secs(2);
pub(super) const SETTLE_LIMIT_MAX: Duration = Duration::from_secs(30);
/// After the last stream is stopped, how long a slot task may take to end before it is
/// dropped.
pub(super) const DISCONNECT_LIMIT: Duration = Duration::from_secs(10);
/// The one path every synthetic request goes to.
pub(super) const COMPLETIONS_PATH: &str = "/v1/completions";
/// A scout asks for one output token: its time to first token is the prefill.
pub(super) const SCOUT_MAX_TOKENS: u64 = 1;
/// A scout's request may take this long, plus its prompt at [`SLOWEST_PREFILL_TOK_S`]…
pub(super) const SCOUT_LIMIT_BASE: Duration = Duration::from_secs(60);
/// …a prefill rate even a slow CPU server reaches.
pub(super) const SLOWEST_PREFILL_TOK_S: u64 = 500;
/// The warm-up may take this long, plus [`WARM_UP_PREFILL_FACTOR`] × C × the scout's TTFT
/// (capped at [`WARM_UP_PREFILL_MAX`])…
pub(super) const WARM_UP_LIMIT_BASE: Duration = Duration::from_secs(60);
/// …twice every stream's prefill one after another: the streams start together, and a server
/// may prefill them in turn…
pub(super) const WARM_UP_PREFILL_FACTOR: f64 = 2.0;
/// …bounded (a day), so an absurd scout TTFT cannot overflow the limit.
pub(super) const WARM_UP_PREFILL_MAX: Duration = Duration::from_secs(24 * 3600);
/// The scout TTFT the warm-up limit assumes when the scout gave none.
pub(super) const DEFAULT_SCOUT_TTFT: Duration = Duration::from_secs(1);
/// The running gauge is sampled about this many times per window…
pub(super) const SAMPLES_PER_WINDOW: u32 = 30;
/// …but not more often than this…
pub(super) const SAMPLE_EVERY_MIN: Duration = Duration::from_millis(100);
/// …nor less often than this.
pub(super) const SAMPLE_EVERY_MAX: Duration = Duration::from_secs(1);
/// Room in a request body for everything but the prompt (model, options, rid).
pub(super) const BODY_FIELDS_BYTES: usize = 256;

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

pub(super) struct Runner {
    pub(super) path: Arc<dyn DataPath>,
    pub(super) id: String,
    pub(super) plan: Plan,
    pub(super) facts: ServerFacts,
    pub(super) guard: u64,
    pub(super) status: Arc<StatusCell>,
    pub(super) latest: LatestMatrix,
    pub(super) cancel: watch::Receiver<bool>,
    pub(super) records: Arc<RecordCollector>,
    pub(super) tag_prefix: String,
    /// How prompts are made (the scouts learn it).
    pub(super) scout: ScoutState,
    /// What the run has measured so far, and how far it is.
    pub(super) progress: RunProgress,
}

/// How this run's prompts are made: what the scouts learn and the cells reuse.
pub(super) struct ScoutState {
    pub(super) seed: u64,
    pub(super) model_json: String,
    pub(super) kind: PromptKind,
    /// A token-id request has succeeded, so a later refusal is about something else (length).
    pub(super) token_ids_work: bool,
    /// Token ids of the served vocabulary (from `/tokenize`), drawn for token-id prompts.
    pub(super) id_pool: Option<Arc<[u64]>>,
}

/// What the run has measured so far: the matrix, a capacity search's answer and misses, and
/// the clock behind the ETA.
pub(super) struct RunProgress {
    pub(super) matrix: MatrixDoc,
    /// A capacity search's answer so far.
    pub(super) capacity: Option<CapacityReport>,
    /// A capacity search's misses so far: (context, level, why).
    pub(super) search_misses: Vec<(u64, u32, String)>,
    pub(super) clock: Clock,
}

/// How a scout ended.
pub(super) enum ScoutOutcome {
    /// The prefill row is measured; the cells reuse this prompt.
    Ready(Prompt),
    /// The sweep was cancelled meanwhile.
    Cancelled,
    /// The scout failed (its row says why): the context's cells cannot run.
    Failed(String),
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
        scout: ScoutState {
            seed: run_seed(&input.id),
            model_json,
            kind: match input.plan.prompt {
                PromptMode::Text => PromptKind::Text,
                PromptMode::Auto | PromptMode::TokenIds => PromptKind::TokenIds,
            },
            token_ids_work: false,
            id_pool: None,
        },
        progress: RunProgress {
            matrix,
            capacity: None,
            search_misses: Vec::new(),
            clock,
        },
        path: input.path,
        id: input.id,
        plan: input.plan,
        facts: input.facts,
        guard: input.production_guard,
        status: input.status,
        latest: input.latest,
        cancel: input.cancel,
        records,
        tag_prefix,
    };
    if runner.scout.kind == PromptKind::TokenIds {
        runner.harvest_token_ids().await;
    }
    runner.run().await
}

impl Runner {
    pub(super) fn cancelled(&self) -> bool {
        *self.cancel.borrow()
    }

    pub(super) fn production(&self) -> u64 {
        self.path.production_in_flight()
    }

    pub(super) fn note(&mut self, note: String) {
        tracing::info!(sweep = %self.id, "{note}");
        self.progress.matrix.metadata.notes.push(note);
    }

    /// Publishes progress (state, current step, ETA) and the matrix so far.
    pub(super) fn publish(&self, state: SweepState, current: Option<CurrentStep>) {
        let clock = &self.progress.clock;
        let paused_now = clock.paused_now();
        let eta = clock.eta_s(self.plan.cell_duration_s, paused_now);
        let matrix = self.progress.matrix.clone();
        let capacity = self.progress.capacity.clone();
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
    pub(super) fn finish_cell(&mut self, cell: DecodeCell) {
        self.set_cell(cell);
        self.progress.clock.cells_left = self.progress.clock.cells_left.saturating_sub(1);
        self.progress.clock.done += 1;
        self.publish(SweepState::Running, None);
    }

    /// The capacity answer of the contexts searched so far, from the matrix: a miss on a cell
    /// that is not Valid (an error, off target) is the boundary too.
    pub(super) fn update_capacity(&mut self, query: &CapacityQuery) {
        let Ok(mut report) = capacity(&self.progress.matrix, query) else {
            return;
        };
        for context in &mut report.contexts {
            let first_miss = self
                .progress
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
        // The capacity holds for the traffic it was judged on: say which.
        if let Some(shape) = &self.plan.like_production {
            report.shape = Some(shape.describe());
        }
        self.progress.capacity = Some(report);
    }

    /// Marks every runnable cell of `context` as an error (its scout failed).
    pub(super) fn fail_context(&mut self, context: u64, reason: &str) {
        for concurrency in self.plan.concurrency.clone() {
            if !self.plan.over_capacity(context, concurrency) {
                self.set_cell(DecodeCell::status_only(
                    context,
                    concurrency,
                    CellStatus::error(reason),
                ));
                self.progress.clock.cells_left = self.progress.clock.cells_left.saturating_sub(1);
                self.progress.clock.done += 1;
            }
        }
        self.publish(SweepState::Running, None);
    }

    pub(super) fn set_cell(&mut self, cell: DecodeCell) {
        if let Some(slot) =
            self.progress.matrix.decode.iter_mut().find(|c| {
                c.context_tokens == cell.context_tokens && c.concurrency == cell.concurrency
            })
        {
            *slot = cell;
        }
    }

    pub(super) fn set_prefill(&mut self, row: PrefillRow) {
        if let Some(slot) = self
            .progress
            .matrix
            .prefill
            .iter_mut()
            .find(|r| r.context_tokens == row.context_tokens)
        {
            *slot = row;
        }
    }
}
