//! Whether the demo's machine kept the simulator's timing: the sweep's per-request tok/s per
//! Valid cell against what the simulator's profile — calibrated from a seed page — gives for
//! that cell. On a loaded host the simulator's timers fire late and every figure after it is a
//! measurement of the host, not of tokentap; beyond [`TOO_BUSY`] the demo says so, by how much,
//! and does not present its comparisons as findings.

use crate::matrix::units::context_label;
use crate::matrix::MatrixDoc;
use crate::sim::model::PerformanceModel;
use crate::sim::Profile;

/// Relative miss of the sweep's median cell beyond which the machine was too busy.
pub const TOO_BUSY: f64 = 0.10;

/// The sweep against the profile it was simulated from.
#[derive(Debug, Clone, PartialEq)]
pub struct TimingCheck {
    /// Where the profile was calibrated from (the seed page).
    pub source: String,
    /// Valid cells compared.
    pub cells: usize,
    /// Median over the cells of measured ÷ expected per-request tok/s.
    pub median_ratio: f64,
    /// The cell furthest from its expected speed: label, measured, expected.
    pub worst: (String, f64, f64),
}

impl TimingCheck {
    /// Measures `sweep` against `profile`; `None` when no Valid cell has a per-request speed.
    pub fn of(profile: &Profile, sweep: &MatrixDoc) -> Option<TimingCheck> {
        let model = PerformanceModel::new(profile);
        let mut ratios: Vec<(f64, String, f64, f64)> = sweep
            .decode
            .iter()
            .filter(|cell| cell.status.is_valid())
            .filter_map(|cell| {
                let measured = cell
                    .per_request_tok_s
                    .filter(|v| v.is_finite() && *v > 0.0)?;
                let expected =
                    model.per_request_tok_s(cell.context_tokens as f64, cell.concurrency as usize);
                (expected.is_finite() && expected > 0.0).then(|| {
                    (
                        measured / expected,
                        format!(
                            "{} × {}",
                            context_label(cell.context_tokens),
                            cell.concurrency
                        ),
                        measured,
                        expected,
                    )
                })
            })
            .collect();
        if ratios.is_empty() {
            return None;
        }
        ratios.sort_by(|a, b| a.0.total_cmp(&b.0));
        let median_ratio = ratios[ratios.len() / 2].0;
        let worst = ratios
            .iter()
            .max_by(|a, b| (a.0 - 1.0).abs().total_cmp(&(b.0 - 1.0).abs()))
            .map(|(_, label, measured, expected)| (label.clone(), *measured, *expected))
            .unwrap_or_default();
        Some(TimingCheck {
            source: profile.labels.source.clone(),
            cells: ratios.len(),
            median_ratio,
            worst,
        })
    }

    /// Whether the machine was too busy for the figures to mean anything.
    pub fn too_busy(&self) -> bool {
        (self.median_ratio - 1.0).abs() > TOO_BUSY
    }

    /// The sentence that says so (`None` when the machine kept the timing).
    pub fn warning(&self) -> Option<String> {
        if !self.too_busy() {
            return None;
        }
        let off = (self.median_ratio - 1.0).abs() * 100.0;
        let way = if self.median_ratio < 1.0 {
            "slower"
        } else {
            "faster"
        };
        let (label, measured, expected) = &self.worst;
        Some(format!(
            "This machine was too busy for the simulator to keep its timing: its sweep ran {off:.0} % {way} than the seed page it was calibrated from ({}; median of {} cells, furthest {label}: {measured:.1} tok/s per stream against {expected:.1}). The comparisons below measure the machine, not tokentap, and are not findings: rerun `tokentap demo` when the machine is idle.",
            self.source, self.cells
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matrix::{CellStatus, DecodeCell, Metadata};

    fn sweep(profile: &Profile, factor: f64) -> MatrixDoc {
        let model = PerformanceModel::new(profile);
        let mut doc = MatrixDoc::new(Metadata::default());
        for (context, concurrency) in [(8192, 1), (8192, 2), (16384, 4)] {
            let mut cell = DecodeCell::status_only(context, concurrency, CellStatus::Valid);
            cell.per_request_tok_s =
                Some(model.per_request_tok_s(context as f64, concurrency as usize) * factor);
            doc.decode.push(cell);
        }
        doc
    }

    #[test]
    fn a_sweep_that_kept_the_seeds_timing_passes_and_a_slow_one_is_told() {
        let profile = Profile::builtin(super::super::args::DEMO_PROFILE).unwrap();
        let kept = TimingCheck::of(&profile, &sweep(&profile, 0.97)).unwrap();
        assert!(!kept.too_busy());
        assert_eq!(kept.warning(), None);
        let busy = TimingCheck::of(&profile, &sweep(&profile, 0.6)).unwrap();
        assert!(busy.too_busy());
        let text = busy.warning().unwrap();
        assert!(text.contains("40 % slower"), "{text}");
        assert!(text.contains("not findings"), "{text}");
        assert_eq!(busy.cells, 3);
    }
}
