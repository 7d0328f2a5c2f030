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

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use crate::base::lock::lock;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{HeaderValue, Method};
use tokio::sync::{watch, Notify};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::cell::{decode_cell, off_target, prefill_row, CellMeasurement};
use super::client::call;
use super::driver::{drive, StreamEnd, StreamPhase, StreamRequest, StreamSignals};
use super::latest::LatestMatrix;
use super::plan::{EngineKind, Plan, PrefillTarget, PromptMode, ServerFacts};
use super::prompt::{
    calibrated_text_prompt, run_seed, token_id_pool, token_id_prompt, Prompt, PromptKind,
};
use super::search::CapacitySearch;
use super::server_load::{fresh_scraped, ServerLoad};
use super::status::{CurrentStep, StatusCell, StepPhase, SweepState};
use crate::base::json::push_json_string;
use crate::base::wallclock::format_rfc3339 as rfc3339;
use crate::base::Source;
use crate::matrix::capacity::{capacity, judge, CapacityQuery, CapacityReport};
use crate::matrix::units::context_label;
use crate::matrix::{
    CellStatus, DecodeCell, Engine, Hardware, MatrixDoc, Metadata, ModelInfo, PrefillRow, RunInfo,
    Source as MatrixSource,
};
use crate::meter::record::RequestRecord;
use crate::meter::RecordSink;
use crate::proxy::Proxy;

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
/// ETA: seconds a cell takes beyond its window, until one has been measured.
const DEFAULT_CELL_OVERHEAD_S: f64 = 1.5;
/// ETA: the prefill rate assumed until a scout has measured one.
const DEFAULT_PREFILL_TOK_S: f64 = 10_000.0;
/// ETA: seconds a scout takes beyond its prefill (request set-up, its one output token).
const SCOUT_OVERHEAD_S: f64 = 0.3;
/// Room in a request body for everything but the prompt (model, options, rid).
const BODY_FIELDS_BYTES: usize = 256;

/// Collects the records of one sweep's requests (their tags start with its prefix).
#[derive(Debug)]
pub struct RecordCollector {
    prefix: String,
    records: Mutex<HashMap<Arc<str>, Arc<RequestRecord>>>,
}

impl RecordCollector {
    pub fn new(prefix: String) -> Arc<Self> {
        Arc::new(Self {
            prefix,
            records: Mutex::new(HashMap::new()),
        })
    }

    /// Removes and returns the record of the request tagged `tag`.
    pub fn take(&self, tag: &str) -> Option<Arc<RequestRecord>> {
        lock(&self.records).remove(tag)
    }
}

impl RecordSink for RecordCollector {
    fn record(&self, record: &Arc<RequestRecord>) {
        if record.source != Source::Synthetic {
            return;
        }
        if let Some(tag) = &record.tag {
            if tag.starts_with(&self.prefix) {
                lock(&self.records).insert(Arc::clone(tag), Arc::clone(record));
            }
        }
    }
}

/// Removes the collector from the meter however the run ends.
struct SinkGuard {
    proxy: Arc<Proxy>,
    sink: Arc<dyn RecordSink>,
}

impl Drop for SinkGuard {
    fn drop(&mut self) {
        self.proxy.meter.remove_sink(&self.sink);
    }
}

/// Everything a run needs.
#[derive(Debug)]
pub struct RunnerInput {
    pub proxy: Arc<Proxy>,
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

/// How one attempt at a cell ended.
enum CellRun {
    /// Boxed: a cell is far larger than the other variants.
    Measured(Box<DecodeCell>),
    /// Production traffic rose above the guard during the cell.
    Interrupted(u64),
    Cancelled,
}

/// What the runner knows about its progress, for the ETA.
struct Clock {
    started: Instant,
    paused: Duration,
    /// Seconds each measured cell took beyond its window.
    cell_overheads: Vec<f64>,
    prefill_tok_s: Option<f64>,
    scouts_left: Vec<u64>,
    cells_left: usize,
    done: usize,
}

struct Runner {
    proxy: Arc<Proxy>,
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
    let sink: Arc<dyn RecordSink> = records.clone();
    input.proxy.meter.add_sink(Arc::clone(&sink));
    let _guard = SinkGuard {
        proxy: Arc::clone(&input.proxy),
        sink,
    };
    let mut model_json = String::new();
    push_json_string(&mut model_json, &input.plan.model);
    let matrix = initial_matrix(&input.id, &input.plan, &input.facts);
    let clock = Clock {
        started: Instant::now(),
        paused: Duration::ZERO,
        cell_overheads: Vec::new(),
        prefill_tok_s: None,
        scouts_left: input.plan.steps.iter().map(|s| s.prompt_tokens).collect(),
        cells_left: input.plan.runnable_cells(),
        done: 0,
    };
    let mut runner = Runner {
        seed: run_seed(&input.id),
        proxy: input.proxy,
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
    /// Learns which token ids the served model has (its `/tokenize`), so that token-id prompts
    /// are valid on any vocabulary, not only on the large ones where 1000–9999 are.
    async fn harvest_token_ids(&mut self) {
        match token_id_pool(&self.proxy, &self.plan.model, &self.id).await {
            Ok(pool) => {
                self.note(format!(
                    "Token-id prompts draw from {} ids the server's tokenizer produced ({}–{})",
                    pool.len(),
                    pool.first().copied().unwrap_or_default(),
                    pool.last().copied().unwrap_or_default()
                ));
                self.id_pool = Some(Arc::from(pool));
            }
            Err(error) => self.note(format!(
                "Token-id prompts use ids 1000–9999: no vocabulary from /tokenize or /extras/tokenize ({error})"
            )),
        }
    }

    fn cancelled(&self) -> bool {
        *self.cancel.borrow()
    }

    fn production(&self) -> u64 {
        self.proxy.meter.inflight(Source::Production)
    }

    fn note(&mut self, note: String) {
        tracing::info!(sweep = %self.id, "{note}");
        self.matrix.metadata.notes.push(note);
    }

    /// Publishes progress (state, current step, ETA) and the matrix so far.
    fn publish(&self, state: SweepState, current: Option<CurrentStep>) {
        let clock = &self.clock;
        let window = self.plan.cell_duration_s;
        let overhead = if clock.cell_overheads.is_empty() {
            DEFAULT_CELL_OVERHEAD_S
        } else {
            clock.cell_overheads.iter().sum::<f64>() / clock.cell_overheads.len() as f64
        };
        let rate = clock
            .prefill_tok_s
            .unwrap_or(DEFAULT_PREFILL_TOK_S)
            .max(1.0);
        let eta = clock.cells_left as f64 * (window + overhead)
            + clock
                .scouts_left
                .iter()
                .map(|&t| t as f64 / rate + SCOUT_OVERHEAD_S)
                .sum::<f64>();
        let matrix = self.matrix.clone();
        let capacity = self.capacity.clone();
        // The slot first, then the status: whoever sees the new state finds the matrix.
        self.latest.set(matrix.clone());
        let elapsed = clock.started.elapsed().as_secs_f64();
        let paused = clock.paused.as_secs_f64();
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
            status.matrix = Some(matrix);
            status.capacity = capacity;
        });
    }

    async fn run(&mut self) -> MatrixDoc {
        self.publish(SweepState::Running, None);
        let steps = self.plan.steps.clone();
        'steps: for step in steps {
            if self.cancelled() {
                break;
            }
            let current = CurrentStep::new(StepPhase::Prefill, step.context, None);
            if !self.wait_for_guard(&current).await {
                break;
            }
            self.publish(SweepState::Running, Some(current));
            let prompt = match self.scout_step(step).await {
                Ok(prompt) => prompt,
                Err(_) if self.cancelled() => break,
                Err(reason) => {
                    if step.decode {
                        self.fail_context(
                            step.context,
                            &format!("the scout request failed: {reason}"),
                        );
                    }
                    continue;
                }
            };
            if !step.decode {
                continue;
            }
            let levels: Vec<u32> = self
                .plan
                .concurrency
                .iter()
                .copied()
                .filter(|&c| !self.plan.over_capacity(step.context, c))
                .collect();
            match self.plan.capacity {
                None => {
                    for concurrency in levels {
                        let Some(cell) = self.measure_cell(step, concurrency, &prompt).await else {
                            break 'steps;
                        };
                        self.finish_cell(cell);
                    }
                }
                Some(query) => {
                    let total = levels.len();
                    let mut search = CapacitySearch::new(levels);
                    let mut misses = Vec::new();
                    while let Some(concurrency) = search.next() {
                        let Some(cell) = self.measure_cell(step, concurrency, &prompt).await else {
                            break 'steps;
                        };
                        let verdict = if cell.status.is_valid() {
                            judge(&cell, &query, Some(self.plan.max_output))
                        } else {
                            None
                        };
                        let meets = verdict.as_ref().is_some_and(|v| v.meets);
                        if !meets {
                            misses.push((
                                concurrency,
                                verdict.map_or_else(
                                    || format!("its cell is {}", cell.status),
                                    |v| v.limited_by.unwrap_or_default(),
                                ),
                            ));
                        }
                        search.record(concurrency, meets);
                        self.finish_cell(cell);
                    }
                    let skipped = search.skipped();
                    self.clock.cells_left = self.clock.cells_left.saturating_sub(skipped.len());
                    // The cells the search did not need are no longer measurements to come.
                    self.status.update(|s| {
                        s.progress.measurements_total =
                            s.progress.measurements_total.saturating_sub(skipped.len());
                    });
                    let measured: Vec<String> = search
                        .measured()
                        .iter()
                        .map(|(c, met)| format!("{c} {}", if *met { "✓" } else { "✗" }))
                        .collect();
                    self.note(format!(
                        "Capacity search at {}: measured {} ({} of {total} levels; the rest assumed to follow their measured neighbours){}",
                        context_label(step.context),
                        measured.join(", "),
                        search.measured().len(),
                        misses
                            .iter()
                            .min_by_key(|(c, _)| *c)
                            .map_or_else(String::new, |(c, why)| format!("; the first miss, {c}: {why}"))
                    ));
                    self.search_misses
                        .extend(misses.into_iter().map(|(c, why)| (step.context, c, why)));
                    self.update_capacity(&query);
                    self.publish(SweepState::Running, None);
                }
            }
        }
        let cancelled = self.cancelled();
        if cancelled {
            self.note("Cancelled: the cells not measured are Not run".to_owned());
        }
        self.matrix.metadata.run.ended_at = Some(rfc3339(SystemTime::now()));
        let state = if cancelled {
            SweepState::Cancelled
        } else {
            SweepState::Finished
        };
        self.clock.cells_left = 0;
        self.clock.scouts_left.clear();
        self.publish(state, None);
        self.status.update(|s| s.progress.eta_s = None);
        self.matrix.clone()
    }

    /// Measures one decode cell: waits for the guard, runs it, measures it again when
    /// production traffic interrupted it or moved it off target. `None` when cancelled.
    async fn measure_cell(
        &mut self,
        step: PrefillTarget,
        concurrency: u32,
        prompt: &Prompt,
    ) -> Option<DecodeCell> {
        let mut attempts = 0;
        let cell = loop {
            let current = CurrentStep::new(StepPhase::WarmUp, step.context, Some(concurrency));
            if !self.wait_for_guard(&current).await {
                return None;
            }
            attempts += 1;
            let began = Instant::now();
            match self.run_cell(step, concurrency, prompt).await {
                CellRun::Measured(cell) => {
                    let extra = began.elapsed().as_secs_f64()
                        - cell.measured_for_s.unwrap_or(self.plan.cell_duration_s);
                    self.clock.cell_overheads.push(extra.max(0.0));
                    let mut cell = *cell;
                    let Some(reason) = off_target(&cell) else {
                        break cell;
                    };
                    let label = current.label.clone();
                    let beside_production = cell.production_in_flight.is_some();
                    if beside_production && attempts < MAX_ATTEMPTS {
                        self.note(format!(
                            "{label} was off target ({reason}) and was measured again once production traffic settled"
                        ));
                        if !self.wait_for_production_to_settle(&current).await {
                            return None;
                        }
                        continue;
                    }
                    self.note(format!(
                        "{label} is Off target: {reason}{}; its figures measured another cell",
                        if beside_production {
                            format!(" (after {attempts} attempts)")
                        } else {
                            String::new()
                        }
                    ));
                    cell.status = CellStatus::OffTarget;
                    break cell;
                }
                CellRun::Cancelled => return None,
                CellRun::Interrupted(production) => {
                    let label = current.label.clone();
                    if attempts >= MAX_ATTEMPTS {
                        break DecodeCell::status_only(
                            step.context,
                            concurrency,
                            CellStatus::error(&format!(
                                "interrupted {MAX_ATTEMPTS} times by production traffic above the guard ({production} in flight > {})",
                                self.guard
                            )),
                        );
                    }
                    self.note(format!(
                        "{label} was interrupted by production traffic ({production} requests in flight > guard {}) and measured again",
                        self.guard
                    ));
                }
            }
        };
        Some(cell)
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

    /// Before measuring an off-target cell again: waits until no production request is in
    /// flight, at most one cell window (2–30 s: production may never stop; the attempt then
    /// runs beside it and is judged again). False when cancelled meanwhile.
    async fn wait_for_production_to_settle(&mut self, next: &CurrentStep) -> bool {
        let limit = self
            .plan
            .cell_duration()
            .clamp(SETTLE_LIMIT_MIN, SETTLE_LIMIT_MAX);
        let began = Instant::now();
        let paused = CurrentStep::new(StepPhase::Paused, next.context_tokens, next.concurrency);
        self.publish(SweepState::Paused, Some(paused));
        while self.production() > 0 && began.elapsed() < limit {
            if self.cancelled() {
                return false;
            }
            let mut cancel = self.cancel.clone();
            tokio::select! {
                () = tokio::time::sleep(GUARD_POLL) => {}
                _ = cancel.changed() => {}
            }
        }
        self.clock.paused += began.elapsed();
        self.publish(SweepState::Running, Some(next.clone()));
        !self.cancelled()
    }

    /// Waits while production in-flight is above the guard. False when cancelled meanwhile.
    async fn wait_for_guard(&mut self, next: &CurrentStep) -> bool {
        let production = self.production();
        if production <= self.guard {
            return !self.cancelled();
        }
        let began = Instant::now();
        let paused = CurrentStep::new(StepPhase::Paused, next.context_tokens, next.concurrency);
        self.publish(SweepState::Paused, Some(paused));
        let mut peak = production;
        while self.production() > self.guard {
            if self.cancelled() {
                return false;
            }
            peak = peak.max(self.production());
            let mut cancel = self.cancel.clone();
            tokio::select! {
                () = tokio::time::sleep(GUARD_POLL) => {}
                _ = cancel.changed() => {}
            }
        }
        let waited = began.elapsed();
        self.clock.paused += waited;
        self.note(format!(
            "Paused {:.1} s before {}: up to {peak} production requests in flight (guard {})",
            waited.as_secs_f64(),
            next.label,
            self.guard
        ));
        self.publish(SweepState::Running, Some(next.clone()));
        !self.cancelled()
    }

    fn rid(&self, what: &str) -> Arc<str> {
        Arc::from(format!("{}{what}", self.tag_prefix))
    }

    /// How the requests of this sweep look for `prompt`.
    fn template(&self, prompt: &Prompt, max_tokens: u64) -> RequestTemplate {
        RequestTemplate {
            slo_header: self
                .plan
                .slo_header
                .as_deref()
                .and_then(|text| HeaderValue::from_str(text).ok()),
            model_json: self.model_json.clone(),
            prompt: prompt.clone(),
            max_tokens,
            with_rid: self.plan.engine == EngineKind::Sglang,
        }
    }

    async fn make_prompt(&self, step: PrefillTarget) -> Result<Prompt, String> {
        match self.prompt_kind {
            PromptKind::TokenIds => Ok(token_id_prompt(
                self.seed,
                step.context,
                step.prompt_tokens,
                self.id_pool.as_deref(),
            )),
            PromptKind::Text => calibrated_text_prompt(
                &self.proxy,
                &self.plan.model,
                &self.id,
                step.context,
                step.prompt_tokens,
            )
            .await
            .map_err(|error| {
                let mut message = error.to_string();
                let mut source = std::error::Error::source(&error);
                while let Some(inner) = source {
                    message.push_str(": ");
                    message.push_str(&inner.to_string());
                    source = inner.source();
                }
                message
            }),
        }
    }

    /// The scout of one context: the prefill row, and the prompt the cells reuse (or why
    /// there is none: the scout failed or was cancelled).
    async fn scout_step(&mut self, step: PrefillTarget) -> Result<Prompt, String> {
        let mut tried_text = false;
        loop {
            let prompt = match self.make_prompt(step).await {
                Ok(prompt) => prompt,
                Err(reason) => {
                    self.finish_scout(step, prefill_row(step.context, None, Some(&reason)));
                    return Err(reason);
                }
            };
            let rid = self.rid(&format!("prefill-{}", step.context));
            let end = self
                .one_request(&prompt, SCOUT_MAX_TOKENS, Arc::clone(&rid))
                .await;
            let record = self.records.take(&rid);
            match end {
                StreamEnd::Stopped => return Err("cancelled".to_owned()),
                StreamEnd::Failed(reason) => {
                    // A refusal: any 4xx/5xx (llama-cpp-python answers token ids with 500), or
                    // (vLLM) a 200 whose stream is only an error event. Only the first token-id
                    // request gets here, so a server fault is retried once, with text.
                    let refused = reason.starts_with("HTTP 4")
                        || reason.starts_with("HTTP 5")
                        || reason.starts_with("error event in the stream");
                    if self.plan.prompt == PromptMode::Auto
                        && self.prompt_kind == PromptKind::TokenIds
                        && !self.token_ids_work
                        && refused
                        && !tried_text
                    {
                        tried_text = true;
                        self.prompt_kind = PromptKind::Text;
                        self.note(format!(
                            "The server refused a token-id prompt ({reason}); prompts are text calibrated with its tokenizer (/tokenize, /extras/tokenize, else a probe request's usage)"
                        ));
                        continue;
                    }
                    self.finish_scout(step, prefill_row(step.context, None, Some(&reason)));
                    return Err(reason);
                }
                StreamEnd::Completed { .. } => {
                    if prompt.kind == PromptKind::TokenIds {
                        self.token_ids_work = true;
                    }
                    let row = prefill_row(step.context, record.as_deref(), None);
                    if let Some(reported) = row.prompt_tokens {
                        if reported != prompt.tokens {
                            self.note(format!(
                                "{}: the server counted {reported} prompt tokens for a prompt of {} {}",
                                context_label(step.context),
                                prompt.tokens,
                                match prompt.kind {
                                    PromptKind::TokenIds => "token ids",
                                    PromptKind::Text => "tokens by its tokenizer",
                                }
                            ));
                        }
                    }
                    if let Some(rate) = row.prompt_tok_s {
                        self.clock.prefill_tok_s = Some(rate);
                    }
                    let failure = match &row.status {
                        CellStatus::Error(reason) => Some(reason.clone()),
                        _ => None,
                    };
                    self.finish_scout(step, row);
                    return match failure {
                        None => Ok(prompt),
                        Some(reason) => Err(reason),
                    };
                }
            }
        }
    }

    fn finish_scout(&mut self, step: PrefillTarget, row: PrefillRow) {
        self.set_prefill(row);
        if let Some(index) = self
            .clock
            .scouts_left
            .iter()
            .position(|&t| t == step.prompt_tokens)
        {
            self.clock.scouts_left.remove(index);
        }
        self.clock.done += 1;
        self.publish(SweepState::Running, None);
    }

    /// One request to its end (the scout), cancellable.
    async fn one_request(&self, prompt: &Prompt, max_tokens: u64, rid: Arc<str>) -> StreamEnd {
        let (phase_tx, phase_rx) = watch::channel(StreamPhase::Running);
        let template = self.template(prompt, max_tokens);
        let request = StreamRequest {
            path: COMPLETIONS_PATH,
            body: template.body(&rid),
            tag: Arc::clone(&rid),
            slo_header: template.slo_header,
        };
        let signals = Arc::new(StreamSignals::default());
        let stream = drive(Arc::clone(&self.proxy), request, phase_rx, signals);
        tokio::pin!(stream);
        let mut cancel = self.cancel.clone();
        let limit = SCOUT_LIMIT_BASE + Duration::from_secs(prompt.tokens / SLOWEST_PREFILL_TOK_S);
        let deadline = Instant::now() + limit;
        loop {
            tokio::select! {
                end = &mut stream => return end,
                () = tokio::time::sleep_until(deadline) => {
                    self.abort_rids(std::slice::from_ref(&rid)).await;
                    let _ = phase_tx.send(StreamPhase::Disconnect);
                    let _ = (&mut stream).await;
                    return StreamEnd::Failed(format!(
                        "no end of the request within {} s",
                        limit.as_secs()
                    ));
                }
                changed = cancel.changed() => {
                    if changed.is_err() || *cancel.borrow() {
                        self.abort_rids(std::slice::from_ref(&rid)).await;
                        let _ = phase_tx.send(StreamPhase::Disconnect);
                        return (&mut stream).await;
                    }
                }
            }
        }
    }

    /// sglang `/abort_request` for each rid (never `abort_all`), concurrently, bounded.
    async fn abort_rids(&self, rids: &[Arc<str>]) {
        if self.plan.engine != EngineKind::Sglang || rids.is_empty() {
            return;
        }
        let mut aborts = JoinSet::new();
        for rid in rids {
            let proxy = Arc::clone(&self.proxy);
            let mut body = String::from("{\"rid\":");
            push_json_string(&mut body, rid);
            body.push('}');
            aborts.spawn(async move {
                call(
                    &proxy,
                    Method::POST,
                    "/abort_request",
                    Some(Bytes::from(body)),
                    CONTROL_TIMEOUT,
                )
                .await
            });
        }
        while aborts.join_next().await.is_some() {}
    }

    /// How this sweep reads the server's running and queued gauges (`None` without them).
    fn server_load_reader(&self) -> Option<ServerLoad> {
        let running_gauge = self.plan.engine.running_gauge()?;
        self.facts.has_running_gauge.then(|| ServerLoad {
            proxy: Arc::clone(&self.proxy),
            model: Arc::from(self.plan.model.as_str()),
            running_gauge,
            queued_gauge: self.plan.engine.queued_gauge(),
            timeout: CONTROL_TIMEOUT,
        })
    }

    /// The server's running and queued gauges (None without metrics).
    async fn server_load(&self) -> Option<(f64, f64)> {
        self.server_load_reader()?.read().await
    }

    /// Has the upstream's scraper read the server's whole state now (running, queued, KV cache,
    /// prefix hits: the requests' "server state" figures are means of what it read), so the
    /// state before a phase change does not stand for what follows it (`server_load`).
    async fn refresh_server_state(&self) {
        let model: Arc<str> = Arc::from(self.plan.model.as_str());
        let _ = fresh_scraped(&self.proxy, &model).await;
    }

    /// One attempt at a decode cell, in three phases over one [`CellAttempt`]: warm-up (every
    /// stream streaming and the server showing C running), the window, and the finish (abort,
    /// drain barrier, the cell from the records). Cancel or production above the guard ends
    /// the attempt early in either of the first two.
    async fn run_cell(
        &mut self,
        step: PrefillTarget,
        concurrency: u32,
        prompt: &Prompt,
    ) -> CellRun {
        let attempt = self.start_streams(step.context, concurrency, prompt);
        if let Err(stop) = self.warm_up(&attempt).await {
            return self.end_early(attempt, stop).await;
        }
        if attempt.shared.has_failed() {
            return self.finish(attempt, None, prompt).await;
        }
        match self.window(&attempt).await {
            Ok(window) => self.finish(attempt, Some(window), prompt).await,
            Err(stop) => self.end_early(attempt, stop).await,
        }
    }

    /// Starts the cell's C streams (each restarted when it completes while the cell runs).
    fn start_streams(&self, context: u64, concurrency: u32, prompt: &Prompt) -> CellAttempt {
        let (phase_tx, phase_rx) = watch::channel(StreamPhase::Running);
        let shared = Arc::new(CellShared::default());
        let mut slots = JoinSet::new();
        for slot in 0..concurrency as usize {
            let proxy = Arc::clone(&self.proxy);
            let shared = Arc::clone(&shared);
            let phase = phase_rx.clone();
            let prefix = format!("{}{context}x{concurrency}-", self.tag_prefix);
            let template = self.template(prompt, self.plan.max_output);
            slots.spawn(async move {
                run_slot(proxy, shared, phase, slot, prefix, template).await;
            });
        }
        CellAttempt {
            context,
            concurrency,
            phase_tx,
            slots,
            shared,
        }
    }

    /// Warm-up: waits until every stream has produced output and the server reports C running
    /// (without a gauge, the first; with one that never gets there, [`GAUGE_GRACE`] more). A
    /// warm-up that takes too long fails the cell (a failure the finish reports).
    async fn warm_up(&mut self, attempt: &CellAttempt) -> Result<(), Stop> {
        let (context, concurrency) = (attempt.context, attempt.concurrency);
        let streams = concurrency as usize;
        let current = CurrentStep::new(StepPhase::WarmUp, context, Some(concurrency));
        self.publish(SweepState::Running, Some(current));
        let began = Instant::now();
        let scout_ttft_s = self
            .matrix
            .prefill_row(context)
            .and_then(|r| r.ttft_ms)
            .map_or(DEFAULT_SCOUT_TTFT.as_secs_f64(), |ms| ms / 1000.0);
        let start_limit = WARM_UP_LIMIT_BASE
            + Duration::from_secs_f64(
                (scout_ttft_s * streams as f64 * WARM_UP_PREFILL_FACTOR)
                    .min(WARM_UP_PREFILL_MAX.as_secs_f64()),
            );
        let mut all_streaming_since: Option<Instant> = None;
        let mut gauge_peak = 0.0f64;
        loop {
            if attempt.shared.has_failed() {
                return Ok(());
            }
            if let Some(stop) = self.check_interrupts() {
                return Err(stop);
            }
            let streaming = attempt.shared.signals.first_outputs.load(Ordering::Relaxed);
            // Read at every look, not only once all stream: each read through the scraper also
            // updates what the cell's first requests see of the server's ramp.
            let load = self.server_load().await;
            if streaming >= streams {
                let since = *all_streaming_since.get_or_insert_with(Instant::now);
                let Some((running, _)) = load else {
                    return Ok(());
                };
                gauge_peak = gauge_peak.max(running);
                if running >= f64::from(concurrency) {
                    return Ok(());
                }
                if since.elapsed() >= GAUGE_GRACE {
                    self.note(format!(
                        "{} × {concurrency}: every stream was streaming but the server reported at most {gauge_peak} running after {} s; measured anyway",
                        context_label(context),
                        GAUGE_GRACE.as_secs()
                    ));
                    return Ok(());
                }
            }
            if began.elapsed() > start_limit {
                attempt.shared.fail(format!(
                    "only {streaming} of {streams} streams produced output within {:.0} s",
                    start_limit.as_secs_f64()
                ));
                return Ok(());
            }
            tokio::time::sleep(TICK).await;
        }
    }

    /// The window: the plan's cell duration (cut short by a stream's failure), with the live
    /// synthetic token counter read at both ends and the running gauge sampled in between.
    async fn window(&mut self, attempt: &CellAttempt) -> Result<Window, Stop> {
        let length = self.plan.cell_duration();
        let current = CurrentStep::new(
            StepPhase::Window,
            attempt.context,
            Some(attempt.concurrency),
        );
        self.publish(SweepState::Running, Some(current));
        // Every stream runs now: the state held since the last read (the idle gap between
        // cells) must not stand for the window's first second.
        self.refresh_server_state().await;
        let tokens_at_start = self.proxy.meter.live_tokens(Source::Synthetic);
        let start = Instant::now();
        let end = start + length;
        let sampler = self.spawn_sampler(length);
        let mut stop = None;
        let mut production = ProductionSamples::default();
        loop {
            if attempt.shared.has_failed() {
                break;
            }
            production.add(self.production());
            if let Some(reason) = self.check_interrupts() {
                stop = Some(reason);
                break;
            }
            let now = Instant::now();
            if now >= end {
                break;
            }
            let mut cancel = self.cancel.clone();
            tokio::select! {
                () = tokio::time::sleep_until(end.min(now + TICK)) => {}
                _ = cancel.changed() => {}
                () = attempt.shared.failed.notified() => {}
            }
        }
        let tokens_at_end = self.proxy.meter.live_tokens(Source::Synthetic);
        let measured = start.elapsed();
        let samples = sampler.finish().await;
        if let Some(stop) = stop {
            return Err(stop);
        }
        Ok(Window {
            start,
            measured,
            tokens: tokens_at_end.saturating_sub(tokens_at_start),
            samples,
            production_in_flight: production.mean_if_any(),
        })
    }

    /// The finish: aborts the streams, waits for the drain barrier, and makes the cell from
    /// the records of the cell's streams and the window (`None`: the warm-up failed).
    async fn finish(
        &mut self,
        mut attempt: CellAttempt,
        window: Option<Window>,
        prompt: &Prompt,
    ) -> CellRun {
        let (context, concurrency) = (attempt.context, attempt.concurrency);
        if window.is_some() {
            let current = CurrentStep::new(StepPhase::Drain, context, Some(concurrency));
            self.publish(SweepState::Running, Some(current));
        }
        self.stop_streams(&mut attempt, ABORT_GRACE).await;
        self.drain(context, concurrency).await;
        // The server is idle now: the next cell's first requests must not inherit this
        // cell's state from the last periodic read.
        self.refresh_server_state().await;
        let ended = attempt.shared.ended();
        let records: Vec<Arc<RequestRecord>> = ended
            .tags
            .iter()
            .filter_map(|tag| self.records.take(tag))
            .collect();
        let Some(window) = window else {
            // The records were taken all the same, so the collector does not keep them.
            return CellRun::Measured(Box::new(decode_cell(&CellMeasurement {
                context,
                concurrency,
                window: Duration::ZERO,
                window_tokens: 0,
                running_samples: Vec::new(),
                completed_in_window: 0,
                records: Vec::new(),
                failures: ended.failures,
                streams: ended.tags.len(),
                production_in_flight: None,
            })));
        };
        let mut failures = ended.failures;
        if failures.is_empty() && records.is_empty() {
            failures.push(
                "the proxy metered none of the cell's requests (a request body over metering.max_parse_bytes is forwarded unmetered)".to_owned(),
            );
        }
        if failures.is_empty() && window.tokens == 0 {
            failures.push("no output tokens during the window".to_owned());
        }
        let in_window = |at: Instant| at >= window.start && at <= window.start + window.measured;
        let completed = ended
            .completions
            .into_iter()
            .filter(|&at| in_window(at))
            .count() as u64;
        let samples: Vec<f64> = window
            .samples
            .into_iter()
            .filter(|&(at, _)| in_window(at))
            .map(|(_, running)| running)
            .collect();
        let cell = decode_cell(&CellMeasurement {
            context,
            concurrency,
            window: window.measured,
            window_tokens: window.tokens,
            running_samples: samples,
            completed_in_window: completed,
            records,
            failures,
            streams: ended.tags.len(),
            production_in_flight: window.production_in_flight,
        });
        if let Some(reported) = cell.prompt_tokens.filter(|&p| p != prompt.tokens) {
            let note = format!(
                "{} × {concurrency}: the server counted {reported} prompt tokens per request for a prompt of {}",
                context_label(context),
                prompt.tokens
            );
            if !self.matrix.metadata.notes.contains(&note) {
                self.note(note);
            }
        }
        CellRun::Measured(Box::new(cell))
    }

    /// Cancel or production above the guard, checked at every tick.
    fn check_interrupts(&self) -> Option<Stop> {
        if self.cancelled() {
            return Some(Stop::Cancelled);
        }
        let production = self.production();
        (production > self.guard).then_some(Stop::Production(production))
    }

    /// Stops a cell that cannot be measured now (cancel or production traffic).
    async fn end_early(&mut self, mut attempt: CellAttempt, stop: Stop) -> CellRun {
        let grace = match stop {
            Stop::Cancelled => CANCEL_GRACE,
            Stop::Production(_) => ABORT_GRACE,
        };
        self.stop_streams(&mut attempt, grace).await;
        for tag in attempt.shared.ended().tags {
            self.records.take(&tag);
        }
        match stop {
            Stop::Cancelled => CellRun::Cancelled,
            Stop::Production(production) => {
                self.drain(attempt.context, attempt.concurrency).await;
                CellRun::Interrupted(production)
            }
        }
    }

    /// Aborts (sglang) or disconnects every stream of the cell and waits for their tasks.
    async fn stop_streams(&self, attempt: &mut CellAttempt, grace: Duration) {
        let _ = attempt.phase_tx.send(StreamPhase::Aborting);
        if self.plan.engine == EngineKind::Sglang {
            let live = attempt.shared.live();
            tokio::select! {
                () = self.abort_rids(&live) => {}
                () = tokio::time::sleep(grace) => {}
            }
            let deadline = Instant::now() + grace;
            while !attempt.slots.is_empty() {
                match tokio::time::timeout_at(deadline, attempt.slots.join_next()).await {
                    Ok(Some(_)) => {}
                    Ok(None) | Err(_) => break,
                }
            }
        }
        let _ = attempt.phase_tx.send(StreamPhase::Disconnect);
        let deadline = Instant::now() + DISCONNECT_LIMIT;
        while !attempt.slots.is_empty() {
            match tokio::time::timeout_at(deadline, attempt.slots.join_next()).await {
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(_) => {
                    attempt.slots.abort_all();
                    break;
                }
            }
        }
    }

    /// The drain barrier: the server shows nothing running or queued but production (bounded).
    async fn drain(&mut self, context: u64, concurrency: u32) {
        let began = Instant::now();
        let (running, queued) = loop {
            let Some((running, queued)) = self.server_load().await else {
                return; // no gauge: the streams' records are all in, which is the barrier
            };
            let production = self.production() as f64;
            if running + queued <= production {
                return;
            }
            if began.elapsed() > DRAIN_LIMIT {
                break (running, queued);
            }
            tokio::time::sleep(TICK).await;
        };
        {
            self.note(format!(
                "{} × {concurrency}: the server still reported {running} running and {queued} queued {} s after the abort; the next cell went ahead",
                context_label(context),
                DRAIN_LIMIT.as_secs()
            ));
        }
    }

    /// Samples the running gauge during the window (a task of its own, so a slow scrape never
    /// stretches the window).
    fn spawn_sampler(&self, window: Duration) -> Sampler {
        let every = (window / SAMPLES_PER_WINDOW).clamp(SAMPLE_EVERY_MIN, SAMPLE_EVERY_MAX);
        let (stop_tx, mut stop_rx) = watch::channel(false);
        let reader = self.server_load_reader();
        let task = tokio::spawn(async move {
            let mut samples = Vec::new();
            let Some(reader) = reader else {
                return samples;
            };
            // Half a period in, so the samples sit in the middle of equal slices of the window.
            let mut next = Instant::now() + every / 2;
            loop {
                tokio::select! {
                    () = tokio::time::sleep_until(next) => {}
                    _ = stop_rx.changed() => return samples,
                }
                next += every;
                let at = Instant::now();
                if let Some((running, _)) = reader.read().await {
                    samples.push((at, running));
                }
                if *stop_rx.borrow() {
                    return samples;
                }
            }
        });
        Sampler {
            stop: stop_tx,
            task,
        }
    }
}

enum Stop {
    Cancelled,
    Production(u64),
}

struct Sampler {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<Vec<(Instant, f64)>>,
}

impl Sampler {
    async fn finish(self) -> Vec<(Instant, f64)> {
        let _ = self.stop.send(true);
        self.task.await.unwrap_or_default()
    }
}

/// One attempt at a decode cell: its streams and what they share with the runner.
struct CellAttempt {
    context: u64,
    concurrency: u32,
    /// Tells the streams to keep going, read to the end after an abort, or disconnect.
    phase_tx: watch::Sender<StreamPhase>,
    /// The C slot tasks (each one stream at a time, restarted when it completes).
    slots: JoinSet<()>,
    shared: Arc<CellShared>,
}

/// What the window measured.
struct Window {
    start: Instant,
    /// From the window's start to when it ended (its length, unless a stream failed).
    measured: Duration,
    /// Synthetic output tokens the proxy counted during the window.
    tokens: u64,
    /// The server's running gauge, sampled during the window (empty without one).
    samples: Vec<(Instant, f64)>,
    /// Mean production requests in flight during the window, when any were seen.
    production_in_flight: Option<f64>,
}

/// Production in flight, sampled at every tick of a window.
#[derive(Default)]
struct ProductionSamples {
    sum: u64,
    count: u64,
    peak: u64,
}

impl ProductionSamples {
    fn add(&mut self, in_flight: u64) {
        self.sum = self.sum.saturating_add(in_flight);
        self.count += 1;
        self.peak = self.peak.max(in_flight);
    }

    /// The mean, or `None` when no production request was ever seen in flight.
    fn mean_if_any(&self) -> Option<f64> {
        (self.peak > 0 && self.count > 0).then(|| self.sum as f64 / self.count as f64)
    }
}

/// What the streams of one cell share with the runner. One lock: the slots take it when a
/// stream starts or ends (never per event), the runner when it polls for a failure.
#[derive(Default)]
struct CellShared {
    signals: Arc<StreamSignals>,
    book: Mutex<CellBook>,
    /// Woken when a stream fails, so the window stops at once.
    failed: Notify,
}

/// The cell's streams so far.
#[derive(Default)]
struct CellBook {
    /// Tags (rids) of every stream started, in order, and whether it is still running.
    streams: Vec<(Arc<str>, bool)>,
    /// When each stream that finished by itself did.
    completions: Vec<Instant>,
    /// Why streams failed.
    failures: Vec<String>,
}

/// What a cell's streams did, read once they have all ended.
struct EndedStreams {
    tags: Vec<Arc<str>>,
    completions: Vec<Instant>,
    failures: Vec<String>,
}

impl CellShared {
    fn book(&self) -> std::sync::MutexGuard<'_, CellBook> {
        lock(&self.book)
    }

    /// Registers a new stream of `slot` and returns its index and tag. The serial in the tag
    /// counts the cell's streams in the order they started.
    fn start_stream(&self, prefix: &str, slot: usize, restarts: usize) -> (usize, Arc<str>) {
        let mut book = self.book();
        let serial = book.streams.len();
        let tag: Arc<str> = Arc::from(format!("{prefix}{slot}-{restarts}-{serial}"));
        book.streams.push((Arc::clone(&tag), true));
        (serial, tag)
    }

    /// The stream `index` ended: completed at `completed` (by itself), or failed with a reason.
    fn end_stream(&self, index: usize, completed: Option<Instant>, failure: Option<String>) {
        let mut book = self.book();
        if let Some((_, running)) = book.streams.get_mut(index) {
            *running = false;
        }
        book.completions.extend(completed);
        if let Some(reason) = failure {
            book.failures.push(reason);
            drop(book);
            self.failed.notify_waiters();
        }
    }

    fn fail(&self, reason: String) {
        self.book().failures.push(reason);
        self.failed.notify_waiters();
    }

    fn has_failed(&self) -> bool {
        !self.book().failures.is_empty()
    }

    /// Tags of the streams still running (to abort them by rid).
    fn live(&self) -> Vec<Arc<str>> {
        self.book()
            .streams
            .iter()
            .filter(|(_, running)| *running)
            .map(|(tag, _)| Arc::clone(tag))
            .collect()
    }

    fn ended(&self) -> EndedStreams {
        let book = self.book();
        EndedStreams {
            tags: book
                .streams
                .iter()
                .map(|(tag, _)| Arc::clone(tag))
                .collect(),
            completions: book.completions.clone(),
            failures: book.failures.clone(),
        }
    }
}

/// How a slot builds its requests.
struct RequestTemplate {
    /// The `x-tokentap-slo` value every stream carries (the plan's), if any.
    slo_header: Option<HeaderValue>,
    model_json: String,
    prompt: Prompt,
    max_tokens: u64,
    with_rid: bool,
}

impl RequestTemplate {
    fn body(&self, rid: &str) -> Bytes {
        let mut body = String::with_capacity(self.prompt.json.len() + BODY_FIELDS_BYTES);
        body.push_str("{\"model\":");
        body.push_str(&self.model_json);
        body.push_str(&format!(
            ",\"max_tokens\":{},\"temperature\":0,\"ignore_eos\":true,\"stream\":true,\"stream_options\":{{\"include_usage\":true,\"continuous_usage_stats\":true}}",
            self.max_tokens
        ));
        if self.with_rid {
            body.push_str(",\"rid\":");
            push_json_string(&mut body, rid);
        }
        body.push_str(",\"prompt\":");
        body.push_str(&self.prompt.json);
        body.push('}');
        Bytes::from(body)
    }
}

/// One of a cell's C streams: sends, and while the cell runs, restarts a stream that completes.
async fn run_slot(
    proxy: Arc<Proxy>,
    shared: Arc<CellShared>,
    phase: watch::Receiver<StreamPhase>,
    slot: usize,
    prefix: String,
    template: RequestTemplate,
) {
    let mut restarts = 0usize;
    loop {
        if *phase.borrow() != StreamPhase::Running {
            return;
        }
        let (index, tag) = shared.start_stream(&prefix, slot, restarts);
        let request = StreamRequest {
            path: COMPLETIONS_PATH,
            body: template.body(&tag),
            tag,
            slo_header: template.slo_header.clone(),
        };
        let end = drive(
            Arc::clone(&proxy),
            request,
            phase.clone(),
            Arc::clone(&shared.signals),
        )
        .await;
        match end {
            StreamEnd::Completed { at } => {
                shared.end_stream(index, Some(at), None);
                restarts += 1;
            }
            StreamEnd::Stopped => {
                shared.end_stream(index, None, None);
                return;
            }
            StreamEnd::Failed(reason) => {
                shared.end_stream(index, None, Some(reason));
                return;
            }
        }
    }
}

/// The matrix before anything ran: every planned cell `Not run` (or `Over capacity`).
pub fn initial_matrix(id: &str, plan: &Plan, facts: &ServerFacts) -> MatrixDoc {
    let mut notes = vec![format!(
        "Prompts of exact length on /v1/completions with a unique per-run prefix; max output {} tokens with ignore_eos; KV budget {} ({})",
        plan.max_output,
        plan.kv_budget_tokens
            .map_or_else(|| "unknown".to_owned(), |b| format!("{b} tokens")),
        plan.kv_source
    )];
    for step in plan.steps.iter().filter(|s| s.prompt_tokens != s.context) {
        notes.push(format!(
            "The {} prefill row sends {} prompt tokens, the longest the server accepts (a prompt plus max_tokens must stay below the context length; sglang also refuses max_req_input_len tokens or more)",
            context_label(step.context),
            step.prompt_tokens
        ));
    }
    let metadata = Metadata {
        model: ModelInfo {
            display_name: None,
            served_model: Some(plan.model.clone()),
            model_path: facts.model_path.clone(),
            revision: None,
        },
        hardware: Hardware {
            label: facts.hardware.clone(),
            gpu_count: facts.gpu_count,
            ..Hardware::default()
        },
        engine: Engine {
            name: facts.engine.name().map(str::to_owned),
            version: facts.engine_version.clone(),
            quantization: facts.quantization.clone().filter(|q| !q.is_empty()),
            ..Engine::default()
        },
        run: RunInfo {
            source: Some(MatrixSource::Synthetic),
            benchmark_tool: Some(format!("tokentap v{}", env!("CARGO_PKG_VERSION"))),
            decode_test: Some("Fixed duration".to_owned()),
            prefill_mode: Some("Measured during decode warm-up".to_owned()),
            time_per_measurement_s: Some(plan.cell_duration_s),
            max_output_tokens: Some(plan.max_output),
            sweep_id: Some(id.to_owned()),
            window_s: None,
            started_at: Some(rfc3339(SystemTime::now())),
            ended_at: None,
        },
        launch_command: None,
        // The configuration it ran on (`aggregate::config`'s fact), so drift against a
        // reference pinned from it compares the same configuration's production.
        extra_facts: facts
            .fingerprint
            .iter()
            .map(|id| crate::matrix::doc::Fact {
                section: crate::aggregate::config::FINGERPRINT_SECTION.to_owned(),
                key: crate::aggregate::config::FINGERPRINT_KEY.to_owned(),
                value: id.clone(),
            })
            .collect(),
        notes,
    };
    let mut doc = MatrixDoc::new(metadata);
    for step in &plan.steps {
        doc.prefill.push(PrefillRow {
            context_tokens: step.context,
            requests_at_once: 1,
            status: CellStatus::NotRun,
            prompt_tok_s: None,
            ttft_ms: None,
            completed_requests: None,
            prompt_tokens: None,
        });
        if step.decode {
            for &concurrency in &plan.concurrency {
                let status = if plan.over_capacity(step.context, concurrency) {
                    CellStatus::OverCapacity
                } else {
                    CellStatus::NotRun
                };
                doc.decode
                    .push(DecodeCell::status_only(step.context, concurrency, status));
            }
        }
    }
    doc.sort();
    doc
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::SweepConfig;
    use crate::sweep::plan::SweepRequest;

    #[tokio::test]
    async fn a_cell_book_keeps_streams_in_start_order_and_wakes_the_window_on_a_failure() {
        let shared = CellShared::default();
        let (first, first_tag) = shared.start_stream("p-8192x2-", 0, 0);
        let (second, second_tag) = shared.start_stream("p-8192x2-", 1, 0);
        let (third, third_tag) = shared.start_stream("p-8192x2-", 0, 1);
        assert_eq!(&*first_tag, "p-8192x2-0-0-0");
        assert_eq!(&*second_tag, "p-8192x2-1-0-1");
        assert_eq!(&*third_tag, "p-8192x2-0-1-2");
        let at = Instant::now();
        shared.end_stream(first, Some(at), None);
        assert_eq!(
            shared.live(),
            [Arc::clone(&second_tag), Arc::clone(&third_tag)]
        );
        assert!(!shared.has_failed());

        let woken = shared.failed.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        shared.end_stream(second, None, Some("boom".to_owned()));
        assert!(shared.has_failed());
        tokio::time::timeout(Duration::from_secs(5), woken)
            .await
            .expect("a failure wakes the window");

        shared.end_stream(third, None, None);
        assert!(shared.live().is_empty());
        let ended = shared.ended();
        assert_eq!(ended.tags, [first_tag, second_tag, third_tag]);
        assert_eq!(ended.completions, [at]);
        assert_eq!(ended.failures, ["boom"]);
    }

    #[test]
    fn initial_matrix_validates_and_marks_over_capacity() {
        let facts = ServerFacts {
            engine: EngineKind::Sglang,
            served_model: Some("step3p7".into()),
            context_length: Some(262_144),
            kv_budget_tokens: Some(622_592),
            answered: true,
            ..ServerFacts::default()
        };
        let config = SweepConfig {
            production_guard: 4,
            cell_duration: Duration::from_secs(30),
            max_output: 4096,
            kv_budget_tokens: 0,
        };
        let plan = Plan::resolve(&SweepRequest::default(), &facts, &config).unwrap();
        let doc = initial_matrix("abc", &plan, &facts);
        doc.validate().unwrap();
        assert_eq!(doc.prefill.len(), 7);
        assert_eq!(doc.decode.len(), 6 * 8);
        assert_eq!(
            doc.cell(16 << 10, 32).unwrap().status,
            CellStatus::OverCapacity
        );
        assert_eq!(doc.cell(32 << 10, 16).unwrap().status, CellStatus::NotRun);
        assert_eq!(doc.metadata.notes.len(), 2);
    }
}
