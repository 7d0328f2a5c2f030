//! The sweep's progress clock and its ETA: seconds left, from what is left to measure and what
//! the measured cells and scouts took so far. Pure arithmetic (the clock's start is the one
//! instant it holds), unit-tested.

use std::time::Duration;

use tokio::time::Instant;

/// ETA: seconds a cell takes beyond its window, until one has been measured.
pub const DEFAULT_CELL_OVERHEAD_S: f64 = 1.5;
/// ETA: the prefill rate assumed until a scout has measured one.
pub const DEFAULT_PREFILL_TOK_S: f64 = 10_000.0;
/// ETA: seconds a scout takes beyond its prefill (request set-up, its one output token).
pub const SCOUT_OVERHEAD_S: f64 = 0.3;

/// What the runner knows about its progress, for the ETA.
pub(super) struct Clock {
    pub(super) started: Instant,
    pub(super) paused: Duration,
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
            cell_overheads: Vec::new(),
            prefill_tok_s: None,
            scouts_left,
            cells_left,
            done: 0,
        }
    }

    /// Seconds left with `window_s` per cell (see [`eta_s`]).
    pub(super) fn eta_s(&self, window_s: f64) -> f64 {
        eta_s(
            window_s,
            &self.cell_overheads,
            self.prefill_tok_s,
            &self.scouts_left,
            self.cells_left,
        )
    }
}

/// Seconds left: each cell to come takes its window plus the mean of the overheads measured so
/// far ([`DEFAULT_CELL_OVERHEAD_S`] before any), each scout to come its prompt at the prefill
/// rate measured so far ([`DEFAULT_PREFILL_TOK_S`] before any; at least 1 tok/s) plus
/// [`SCOUT_OVERHEAD_S`].
pub fn eta_s(
    window_s: f64,
    cell_overheads: &[f64],
    prefill_tok_s: Option<f64>,
    scouts_left: &[u64],
    cells_left: usize,
) -> f64 {
    let overhead = if cell_overheads.is_empty() {
        DEFAULT_CELL_OVERHEAD_S
    } else {
        cell_overheads.iter().sum::<f64>() / cell_overheads.len() as f64
    };
    let rate = prefill_tok_s.unwrap_or(DEFAULT_PREFILL_TOK_S).max(1.0);
    cells_left as f64 * (window_s + overhead)
        + scouts_left
            .iter()
            .map(|&t| t as f64 / rate + SCOUT_OVERHEAD_S)
            .sum::<f64>()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn the_eta_uses_defaults_until_something_was_measured() {
        // Two cells of 30 s + 1.5 s, two scouts of 8K and 16K tokens at 10,000 tok/s + 0.3 s.
        let eta = eta_s(30.0, &[], None, &[8192, 16384], 2);
        assert!(close(eta, 63.0 + 0.8192 + 0.3 + 1.6384 + 0.3), "{eta}");
        // Measured: overheads 1 s and 3 s (mean 2), prefill 1,000 tok/s.
        let eta = eta_s(30.0, &[1.0, 3.0], Some(1000.0), &[2000], 3);
        assert!(close(eta, 3.0 * 32.0 + 2.0 + 0.3), "{eta}");
        // Nothing left is no time left; a nonsense rate is floored at 1 tok/s.
        assert_eq!(eta_s(30.0, &[5.0], Some(50.0), &[], 0), 0.0);
        assert!(close(eta_s(10.0, &[], Some(0.0), &[4], 0), 4.3));
    }

    #[test]
    fn a_clock_reads_its_own_progress() {
        let mut clock = Clock::new(vec![1000], 1);
        assert!(close(clock.eta_s(10.0), 11.5 + 0.1 + 0.3));
        clock.cell_overheads.push(0.5);
        clock.prefill_tok_s = Some(500.0);
        assert!(close(clock.eta_s(10.0), 10.5 + 2.0 + 0.3));
    }
}
