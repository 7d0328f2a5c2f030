//! The sweep's progress clock and its ETA: seconds left, from what is left to measure, what
//! the measured cells and scouts took so far, and the share of the time spent paused for
//! production traffic (`sweep::estimate` does the arithmetic). Unit-tested.

use std::time::Duration;

use tokio::time::Instant;

use crate::sweep::estimate::{eta_s, eta_with_pauses_s};

/// What the runner knows about its progress, for the ETA.
pub(super) struct Clock {
    pub(super) started: Instant,
    /// Time spent in pauses that ended.
    pub(super) paused: Duration,
    /// When the pause going on now began.
    pub(super) pausing_since: Option<Instant>,
    /// Seconds each measured cell took beyond its window.
    pub(super) cell_overheads: Vec<f64>,
    pub(super) prefill_tok_s: Option<f64>,
    pub(super) scouts_left: Vec<u64>,
    pub(super) cells_left: usize,
    pub(super) done: usize,
}

impl Clock {
    /// A clock started now, with `scouts_left` (each scout's prompt tokens) and `cells_left`
    /// still to measure.
    pub(super) fn new(scouts_left: Vec<u64>, cells_left: usize) -> Self {
        Self {
            started: Instant::now(),
            paused: Duration::ZERO,
            pausing_since: None,
            cell_overheads: Vec::new(),
            prefill_tok_s: None,
            scouts_left,
            cells_left,
            done: 0,
        }
    }

    /// How long the pause going on now has lasted (zero when none is).
    pub(super) fn paused_now(&self) -> Duration {
        self.pausing_since
            .map_or(Duration::ZERO, |since| since.elapsed())
    }

    /// A pause for production traffic begins.
    pub(super) fn pause(&mut self) {
        self.pausing_since.get_or_insert_with(Instant::now);
    }

    /// The pause ends: its time joins the pauses so far; how long it lasted.
    pub(super) fn resume(&mut self) -> Duration {
        let waited = self.paused_now();
        self.pausing_since = None;
        self.paused += waited;
        waited
    }

    /// Seconds left with `window_s` per cell (see [`eta_s`]), stretched by the pauses so far
    /// and by the pause going on now (`paused_now`).
    pub(super) fn eta_s(&self, window_s: f64, paused_now: Duration) -> f64 {
        let work = eta_s(
            window_s,
            &self.cell_overheads,
            self.prefill_tok_s,
            &self.scouts_left,
            self.cells_left,
        );
        let elapsed = self.started.elapsed();
        let worked = elapsed
            .saturating_sub(self.paused)
            .saturating_sub(paused_now);
        eta_with_pauses_s(
            work,
            worked.as_secs_f64(),
            self.paused.as_secs_f64(),
            paused_now.as_secs_f64(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn a_clock_reads_its_own_progress() {
        let mut clock = Clock::new(vec![1000], 1);
        assert!(close(clock.eta_s(10.0, Duration::ZERO), 11.5 + 0.1 + 0.3));
        clock.cell_overheads.push(0.5);
        clock.prefill_tok_s = Some(500.0);
        assert!(close(clock.eta_s(10.0, Duration::ZERO), 10.5 + 2.0 + 0.3));
    }
}
