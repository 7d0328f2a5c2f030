//! How long measurements take: the ETA arithmetic shared by the plan (the expected duration a
//! preview shows and the default plan's bound) and the running sweep (its ETA). Pure.

/// ETA: seconds a cell takes beyond its window, until one has been measured.
pub const DEFAULT_CELL_OVERHEAD_S: f64 = 1.5;
/// ETA: the prefill rate assumed until a scout has measured one.
pub const DEFAULT_PREFILL_TOK_S: f64 = 10_000.0;
/// ETA: seconds a scout takes beyond its prefill (request set-up, its one output token).
pub const SCOUT_OVERHEAD_S: f64 = 0.3;

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

/// Seconds left, counting pauses for production traffic: the work left, plus the pauses it
/// is expected to meet at the rate the work so far met them (seconds paused per second
/// worked, once a second of work gave a rate; at most 10), plus, while paused, as long again
/// as this pause has lasted (a pause that has lasted a minute is not expected to end in a
/// second).
pub fn eta_with_pauses_s(
    work_left_s: f64,
    worked_s: f64,
    paused_before_s: f64,
    paused_now_s: f64,
) -> f64 {
    let rate = if worked_s >= 1.0 {
        (paused_before_s.max(0.0) / worked_s).min(10.0)
    } else {
        0.0
    };
    work_left_s * (1.0 + rate) + paused_now_s.max(0.0)
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
    fn pauses_so_far_stretch_the_rest_and_a_pause_going_on_counts_again() {
        assert!(close(eta_with_pauses_s(60.0, 100.0, 0.0, 0.0), 60.0));
        // A second paused per second worked so far: the rest is expected to take twice its work.
        assert!(close(eta_with_pauses_s(60.0, 50.0, 50.0, 0.0), 120.0));
        // Never more than elevenfold.
        assert!(close(eta_with_pauses_s(60.0, 10.0, 1000.0, 0.0), 660.0));
        // Paused 12 s now, nothing worked yet: the work plus 12 s more.
        assert!(close(eta_with_pauses_s(60.0, 0.0, 0.0, 12.0), 72.0));
    }
}
