//! Whether the demo's machine kept the simulator's timing: each Valid cell of a matrix the demo
//! measured (the sweep, then the steady traffic) against what the simulator's profile —
//! calibrated from a seed page — gives for that cell, on three measures: per-request tok/s
//! (1 ÷ TBT), total tok/s (C × per-request tok/s) and the median TTFT of a warm prompt.
//!
//! A uniformly slow host slows every measure; a host that stalls in bursts (the process stopped
//! for hundreds of milliseconds at a time, then running) keeps most token gaps, so 1 ÷ TBT holds
//! while total tok/s falls and TTFT grows. Either way every figure after it measures the host,
//! not tokentap: beyond [`TOO_BUSY`] on any measure (TTFT with one decode step of slack, its
//! resolution: a request waits for the next scheduler step) the demo says what moved, by how
//! much, and does not present its comparisons as findings.

use crate::matrix::units::context_label;
use crate::matrix::{DecodeCell, MatrixDoc};
use crate::sim::model::PerformanceModel;
use crate::sim::Profile;

/// Relative miss of a measure's median cell beyond which the machine was too busy.
pub const TOO_BUSY: f64 = 0.10;

/// One measure the check compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Measure {
    PerRequest,
    Total,
    Ttft,
}

impl Measure {
    const ALL: [Measure; 3] = [Measure::PerRequest, Measure::Total, Measure::Ttft];

    fn name(self) -> &'static str {
        match self {
            Measure::PerRequest => "per-request tok/s (1 ÷ TBT)",
            Measure::Total => "total tok/s",
            Measure::Ttft => "TTFT",
        }
    }

    fn unit(self) -> &'static str {
        match self {
            Measure::PerRequest | Measure::Total => "tok/s",
            Measure::Ttft => "ms",
        }
    }

    /// Measured and expected for a cell, when the cell has the figure.
    fn of(self, model: &PerformanceModel, cell: &DecodeCell) -> Option<(f64, f64)> {
        let context = cell.context_tokens;
        let streams = cell.concurrency as usize;
        let per_request = model.per_request_tok_s(context as f64, streams);
        let (measured, expected) = match self {
            Measure::PerRequest => (cell.per_request_tok_s?, per_request),
            Measure::Total => (cell.total_tok_s?, per_request * streams as f64),
            Measure::Ttft => (
                cell.ttft_ms?,
                model.cached_ttft(context, streams).as_secs_f64() * 1000.0,
            ),
        };
        let usable = |v: f64| v.is_finite() && v > 0.0;
        (usable(measured) && usable(expected)).then_some((measured, expected))
    }

    /// Whether `measured` is off `expected` by more than [`TOO_BUSY`] (TTFT: or one decode
    /// step, whichever is larger).
    fn missed(self, measured: f64, expected: f64, step_ms: f64) -> bool {
        let slack = match self {
            Measure::Ttft => (TOO_BUSY * expected).max(step_ms),
            Measure::PerRequest | Measure::Total => TOO_BUSY * expected,
        };
        (measured - expected).abs() > slack
    }
}

/// One measure over a matrix's cells: the median cell, and the cell furthest off.
#[derive(Debug, Clone, PartialEq)]
pub struct MeasureCheck {
    pub measure: Measure,
    /// The median cell's measured, expected and decode step (ms).
    pub median: (f64, f64, f64),
    /// The cell furthest from its expected figure: label, measured, expected.
    pub worst: (String, f64, f64),
}

impl MeasureCheck {
    fn ratio(&self) -> f64 {
        self.median.0 / self.median.1
    }

    fn missed(&self) -> bool {
        let (measured, expected, step_ms) = self.median;
        self.measure.missed(measured, expected, step_ms)
    }
}

/// A matrix against the profile it was simulated from.
#[derive(Debug, Clone, PartialEq)]
pub struct TimingCheck {
    /// Where the profile was calibrated from (the seed page).
    pub source: String,
    /// Which of the demo's matrices this is ("its sweep", "its steady traffic").
    pub what: String,
    /// Valid cells compared.
    pub cells: usize,
    /// Each measure the cells had.
    pub measures: Vec<MeasureCheck>,
}

impl TimingCheck {
    /// Measures `matrix` against `profile`; `None` when no Valid cell has a figure to compare.
    pub fn of(profile: &Profile, matrix: &MatrixDoc, what: &str) -> Option<TimingCheck> {
        let model = PerformanceModel::new(profile);
        let valid: Vec<&DecodeCell> = matrix
            .decode
            .iter()
            .filter(|cell| cell.status.is_valid())
            .collect();
        let measures: Vec<MeasureCheck> = Measure::ALL
            .into_iter()
            .filter_map(|measure| {
                let mut rows: Vec<(f64, f64, f64, String)> = valid
                    .iter()
                    .filter_map(|cell| {
                        let (measured, expected) = measure.of(&model, cell)?;
                        let step_ms = model
                            .decode_step_time(cell.context_tokens as f64, cell.concurrency as usize)
                            .as_secs_f64()
                            * 1000.0;
                        let label = format!(
                            "{} × {}",
                            context_label(cell.context_tokens),
                            cell.concurrency
                        );
                        Some((measured, expected, step_ms, label))
                    })
                    .collect();
                if rows.is_empty() {
                    return None;
                }
                rows.sort_by(|a, b| (a.0 / a.1).total_cmp(&(b.0 / b.1)));
                let (m, e, s, _) = &rows[rows.len() / 2];
                let median = (*m, *e, *s);
                let worst = rows
                    .iter()
                    .max_by(|a, b| (a.0 / a.1 - 1.0).abs().total_cmp(&(b.0 / b.1 - 1.0).abs()))
                    .map(|(m, e, _, label)| (label.clone(), *m, *e))
                    .unwrap_or_default();
                Some(MeasureCheck {
                    measure,
                    median,
                    worst,
                })
            })
            .collect();
        if measures.is_empty() {
            return None;
        }
        Some(TimingCheck {
            source: profile.labels.source.clone(),
            what: what.to_owned(),
            cells: valid.len(),
            measures,
        })
    }

    /// Whether the machine was too busy for the figures to mean anything.
    pub fn too_busy(&self) -> bool {
        self.measures.iter().any(MeasureCheck::missed)
    }

    /// Whether the miss is a stall: total tok/s or TTFT moved while 1 ÷ TBT held.
    pub fn stalled(&self) -> bool {
        let moved = |m: Measure| self.measures.iter().any(|c| c.measure == m && c.missed());
        let per_request_held = self
            .measures
            .iter()
            .any(|c| c.measure == Measure::PerRequest && !c.missed());
        per_request_held && (moved(Measure::Total) || moved(Measure::Ttft))
    }

    /// The sentence that says so (`None` when the machine kept the timing): what moved, by
    /// how much, and that nothing below is a finding.
    pub fn warning(&self) -> Option<String> {
        if !self.too_busy() {
            return None;
        }
        let moved: Vec<String> = self
            .measures
            .iter()
            .filter(|c| c.missed())
            .map(|c| {
                let ratio = c.ratio();
                let (way, off) = if ratio < 1.0 {
                    ("lower", (1.0 - ratio) * 100.0)
                } else {
                    ("higher", (ratio - 1.0) * 100.0)
                };
                let (label, measured, expected) = &c.worst;
                let unit = c.measure.unit();
                format!(
                    "{} {off:.0} % {way} (median of {} cells; furthest {label}: {measured:.1} {unit} against {expected:.1})",
                    c.measure.name(),
                    self.cells
                )
            })
            .collect();
        let kind = if self.stalled() {
            "This machine stalled in bursts: 1 ÷ TBT held, but"
        } else {
            "This machine was too busy for the simulator to keep its timing:"
        };
        Some(format!(
            "{kind} in {} {} against the seed page the simulator was calibrated from ({}). The comparisons below measure the machine, not tokentap, and are not findings: rerun `tokentap demo` when the machine is idle.",
            self.what,
            moved.join("; "),
            self.source
        ))
    }
}

/// The first warning of the checks, in the order the demo measured them.
pub fn first_warning(checks: &[Option<TimingCheck>]) -> Option<String> {
    checks.iter().flatten().find_map(TimingCheck::warning)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matrix::{CellStatus, DecodeCell, Metadata};

    const CELLS: [(u64, u32); 3] = [(8192, 1), (8192, 2), (16384, 4)];

    /// A matrix of the profile's own figures, each measure scaled by its factor.
    fn measured(profile: &Profile, per_request: f64, total: f64, ttft: f64) -> MatrixDoc {
        let model = PerformanceModel::new(profile);
        let mut doc = MatrixDoc::new(Metadata::default());
        for (context, concurrency) in CELLS {
            let mut cell = DecodeCell::status_only(context, concurrency, CellStatus::Valid);
            let speed = model.per_request_tok_s(context as f64, concurrency as usize);
            cell.per_request_tok_s = Some(speed * per_request);
            cell.total_tok_s = Some(speed * f64::from(concurrency) * total);
            cell.ttft_ms = Some(
                model
                    .cached_ttft(context, concurrency as usize)
                    .as_secs_f64()
                    * 1000.0
                    * ttft,
            );
            doc.decode.push(cell);
        }
        doc
    }

    fn profile() -> Profile {
        Profile::builtin(super::super::args::DEMO_PROFILE).unwrap()
    }

    #[test]
    fn a_sweep_that_kept_the_seeds_timing_passes_and_a_slow_one_is_told() {
        let profile = profile();
        let kept =
            TimingCheck::of(&profile, &measured(&profile, 0.97, 0.96, 1.04), "its sweep").unwrap();
        assert!(!kept.too_busy(), "{kept:?}");
        assert_eq!(kept.warning(), None);
        let busy =
            TimingCheck::of(&profile, &measured(&profile, 0.6, 0.6, 1.7), "its sweep").unwrap();
        assert!(busy.too_busy());
        assert!(!busy.stalled());
        let text = busy.warning().unwrap();
        assert!(
            text.contains("per-request tok/s (1 ÷ TBT) 40 % lower"),
            "{text}"
        );
        assert!(text.contains("too busy"), "{text}");
        assert!(text.contains("not findings"), "{text}");
        assert_eq!(busy.cells, 3);
    }

    /// The stalled demo: stopped 0.4 s, running 0.04 s — 1 ÷ TBT within 2 % of the
    /// seed, total tok/s 12.5 % under it, TTFTs three to six times the warm figure.
    #[test]
    fn a_machine_that_stalls_in_bursts_is_told_while_one_over_tbt_holds() {
        let profile = profile();
        let stalled = TimingCheck::of(
            &profile,
            &measured(&profile, 0.99, 0.875, 3.5),
            "its steady traffic",
        )
        .unwrap();
        assert!(stalled.too_busy() && stalled.stalled(), "{stalled:?}");
        let text = stalled.warning().unwrap();
        assert!(text.contains("stalled in bursts"), "{text}");
        assert!(text.contains("total tok/s 12 % lower"), "{text}");
        assert!(text.contains("TTFT 250 % higher"), "{text}");
        assert!(!text.contains("per-request tok/s"), "{text}");
        assert!(text.contains("in its steady traffic"), "{text}");
        // Total tok/s alone, or TTFT alone, is enough.
        for (total, ttft) in [(0.85, 1.0), (1.0, 2.0)] {
            let one =
                TimingCheck::of(&profile, &measured(&profile, 1.0, total, ttft), "x").unwrap();
            assert!(one.stalled(), "total ×{total}, TTFT ×{ttft}");
        }
        // The first warning of the demo's checks is the one shown.
        let kept = TimingCheck::of(&profile, &measured(&profile, 1.0, 1.0, 1.0), "its sweep");
        let shown = first_warning(&[kept, Some(stalled)]).unwrap();
        assert!(shown.contains("its steady traffic"), "{shown}");
    }

    /// TTFT's resolution is a decode step: a warm request waits for the next one.
    #[test]
    fn a_ttft_within_one_decode_step_is_not_a_miss() {
        let profile = profile();
        let model = PerformanceModel::new(&profile);
        let step = model.decode_step_time(8192.0, 1).as_secs_f64() * 1000.0;
        let ttft = model.cached_ttft(8192, 1).as_secs_f64() * 1000.0;
        assert!(!Measure::Ttft.missed(ttft + step * 0.9, ttft, step));
        assert!(Measure::Ttft.missed(ttft + step.max(0.1 * ttft) * 1.5, ttft, step));
    }
}
