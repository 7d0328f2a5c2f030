//! The loop over the plan's steps: a context's scout, then its cells — the whole concurrency
//! ladder, or a capacity search's levels — each measured in attempts (again when production
//! traffic interrupted it or moved it off target), each behind the production guard.

use std::time::SystemTime;

use tokio::time::Instant;

use super::attempt::CellRun;
use super::state::{
    Runner, ScoutOutcome, GUARD_POLL, MAX_ATTEMPTS, PAUSE_SHOWN_EVERY, SETTLE_LIMIT_MAX,
    SETTLE_LIMIT_MIN,
};
use crate::base::wallclock::format_rfc3339 as rfc3339;
use crate::matrix::capacity::judge;
use crate::matrix::units::context_label;
use crate::matrix::{CellStatus, DecodeCell, MatrixDoc};
use crate::sweep::cell::off_target;
use crate::sweep::plan::PrefillTarget;
use crate::sweep::search::CapacitySearch;
use crate::sweep::status::{CurrentStep, StepPhase, SweepState};
use crate::synthetic::prompt::Prompt;

impl Runner {
    pub(super) async fn run(&mut self) -> MatrixDoc {
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
                ScoutOutcome::Ready(prompt) => prompt,
                ScoutOutcome::Cancelled => break,
                ScoutOutcome::Failed(_) if self.cancelled() => break,
                ScoutOutcome::Failed(reason) => {
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
                    self.progress.clock.cells_left =
                        self.progress.clock.cells_left.saturating_sub(skipped.len());
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
                    self.progress
                        .search_misses
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
        self.progress.matrix.metadata.run.ended_at = Some(rfc3339(SystemTime::now()));
        let state = if cancelled {
            SweepState::Cancelled
        } else {
            SweepState::Finished
        };
        self.progress.clock.cells_left = 0;
        self.progress.clock.scouts_left.clear();
        self.publish(state, None);
        self.status.update(|s| s.progress.eta_s = None);
        self.progress.matrix.clone()
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
                    self.progress.clock.cell_overheads.push(extra.max(0.0));
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
        self.progress.clock.pause();
        self.publish(SweepState::Paused, Some(paused.clone()));
        let mut shown = Instant::now();
        while self.production() > 0 && began.elapsed() < limit {
            if self.cancelled() {
                self.progress.clock.resume();
                return false;
            }
            let mut cancel = self.cancel.clone();
            tokio::select! {
                () = tokio::time::sleep(GUARD_POLL) => {}
                _ = cancel.changed() => {}
            }
            if shown.elapsed() >= PAUSE_SHOWN_EVERY {
                // How long it has waited, and the ETA that grows with it.
                self.publish(SweepState::Paused, Some(paused.clone()));
                shown = Instant::now();
            }
        }
        self.progress.clock.resume();
        self.publish(SweepState::Running, Some(next.clone()));
        !self.cancelled()
    }

    /// Waits while production in-flight is above the guard. False when cancelled meanwhile.
    async fn wait_for_guard(&mut self, next: &CurrentStep) -> bool {
        let production = self.production();
        if production <= self.guard {
            return !self.cancelled();
        }
        let paused = CurrentStep::new(StepPhase::Paused, next.context_tokens, next.concurrency);
        self.progress.clock.pause();
        self.publish(SweepState::Paused, Some(paused.clone()));
        let mut peak = production;
        let mut shown = Instant::now();
        while self.production() > self.guard {
            if self.cancelled() {
                self.progress.clock.resume();
                return false;
            }
            peak = peak.max(self.production());
            let mut cancel = self.cancel.clone();
            tokio::select! {
                () = tokio::time::sleep(GUARD_POLL) => {}
                _ = cancel.changed() => {}
            }
            if shown.elapsed() >= PAUSE_SHOWN_EVERY {
                self.publish(SweepState::Paused, Some(paused.clone()));
                shown = Instant::now();
            }
        }
        let waited = self.progress.clock.resume();
        self.note(format!(
            "Paused {:.1} s before {}: up to {peak} production requests in flight (guard {})",
            waited.as_secs_f64(),
            next.label,
            self.guard
        ));
        self.publish(SweepState::Running, Some(next.clone()));
        !self.cancelled()
    }
}
