//! One attempt at a decode cell, in three phases: warm-up (every stream streaming and the
//! server showing C running), the window (the plan's cell duration, the live synthetic token
//! counter read at both ends, the running gauge sampled), and the finish (abort, drain barrier,
//! the cell from the records of its streams). Cancel or production above the guard ends the
//! attempt early in either of the first two.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::state::{
    Runner, ABORT_GRACE, CANCEL_GRACE, DEFAULT_SCOUT_TTFT, DISCONNECT_LIMIT, DRAIN_LIMIT,
    GAUGE_GRACE, TICK, WARM_UP_LIMIT_BASE, WARM_UP_PREFILL_FACTOR, WARM_UP_PREFILL_MAX,
};
use super::streams::{run_slot, CellShared, StreamShape};
use crate::matrix::units::context_label;
use crate::matrix::DecodeCell;
use crate::meter::record::RequestRecord;
use crate::sweep::cell::{decode_cell, CellMeasurement};
use crate::sweep::plan::PrefillTarget;
use crate::sweep::status::{CurrentStep, StepPhase, SweepState};
use crate::synthetic::prompt::Prompt;
use crate::synthetic::StreamPhase;

/// How one attempt at a cell ended.
pub(super) enum CellRun {
    /// Boxed: a cell is far larger than the other variants.
    Measured(Box<DecodeCell>),
    /// Production traffic rose above the guard during the cell.
    Interrupted(u64),
    Cancelled,
}

enum Stop {
    Cancelled,
    Production(u64),
}

/// One attempt at a decode cell: its streams and what they share with the runner.
pub(super) struct CellAttempt {
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

impl Runner {
    /// One attempt at a decode cell, in three phases over one [`CellAttempt`]: warm-up (every
    /// stream streaming and the server showing C running), the window, and the finish (abort,
    /// drain barrier, the cell from the records). Cancel or production above the guard ends
    /// the attempt early in either of the first two.
    pub(super) async fn run_cell(
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
            let path = Arc::clone(&self.path);
            let shared = Arc::clone(&shared);
            let phase = phase_rx.clone();
            let prefix = format!("{}{context}x{concurrency}-", self.tag_prefix);
            let mut template = self.template(prompt, self.plan.max_output);
            template.shape = self
                .plan
                .like_production
                .as_ref()
                .and_then(|shape| shape.for_context(context))
                .and_then(|production| {
                    StreamShape::new(
                        prompt,
                        context,
                        self.scout.seed,
                        self.scout.id_pool.clone(),
                        production,
                    )
                });
            slots.spawn(async move {
                run_slot(path, shared, phase, slot, prefix, template).await;
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
            .progress
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
        let tokens_at_start = self.path.synthetic_tokens();
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
        let tokens_at_end = self.path.synthetic_tokens();
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
            if !self.progress.matrix.metadata.notes.contains(&note) {
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

    /// Aborts (where the engine has a targeted abort) or disconnects every stream of the cell and
    /// waits for their tasks.
    async fn stop_streams(&self, attempt: &mut CellAttempt, grace: Duration) {
        let _ = attempt.phase_tx.send(StreamPhase::Aborting);
        if self.abort_route().is_some() {
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
}
