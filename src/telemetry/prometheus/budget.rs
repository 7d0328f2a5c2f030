//! The series budget (`telemetry.max_series`): how many series the sink may register, and
//! which new label sets get theirs.
//!
//! A cell (model × upstream × route × source × context × concurrency) costs up to ~330 series
//! and ~1,300 cells are reachable, so the series the sink registers are counted (a histogram
//! costs its buckets + 3) and new ones are admitted by priority, decided once when a label set
//! is first seen: the process-wide series (faults, lost rows, clamped counts, logins, the
//! budget's own) always; a cell every series while the budget is under half spent, its core
//! series ([`CELL_CORE_HISTOGRAMS`], requests by outcome, tokens by type) until it is spent,
//! then none; per-model series (in flight, overhead) and a cell's SLO series while there is
//! room. What is refused gets no-op handles (cheaper than real ones) and is counted once in
//! `tokentap_metrics_series_dropped_total{what}`.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::meter::record::Outcome;
use crate::telemetry::names::*;

/// The default of `telemetry.max_series`.
pub const DEFAULT_MAX_SERIES: usize = 50_000;

/// The histograms a cell keeps while the budget has room for its core series only (with
/// `tokentap_requests_total{outcome}` and `tokentap_tokens_total{type}`): the matrix's
/// requests, throughput (tokens ÷ decode seconds), TTFT and TBT.
pub const CELL_CORE_HISTOGRAMS: [&str; 3] =
    [TIME_TO_FIRST_TOKEN, TIME_BETWEEN_TOKENS, DECODE_SECONDS];

/// A cell's other histograms, kept only while the budget is under half spent.
pub const CELL_DETAIL_HISTOGRAMS: [&str; 14] = [
    INTER_TOKEN_LATENCY,
    TIME_TO_FIRST_ANSWER_TOKEN,
    TIME_TO_FIRST_TOOL_CALL,
    REASONING_TOKENS,
    REQUEST_DURATION,
    PREFILL_TOKENS_PER_SECOND,
    PER_REQUEST_TOKENS_PER_SECOND,
    PROMPT_TOKENS,
    COMPLETION_TOKENS,
    TOKENS_PER_EVENT,
    AVERAGE_ACTIVE_REQUESTS,
    PREFILL_OVERLAP,
    OVERLAPPING_PREFILLS,
    PREFILL_BUSY_SECONDS,
];

/// Series one histogram puts on the page: one per bucket bound, `+Inf`, `_sum` and `_count`.
pub fn histogram_series(name: &str) -> u64 {
    HISTOGRAM_BUCKETS
        .iter()
        .find(|(n, _)| *n == name)
        .map_or(0, |(_, bounds)| bounds.len() as u64)
        + 3
}

/// What the budget refused, by what it was (`tokentap_metrics_series_dropped_total{what}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dropped {
    /// A cell's series past its core ones.
    CellDetail,
    /// A whole cell.
    Cell,
    /// Per model, upstream, route and source: in flight, overhead, bad SLO headers.
    Base,
    /// A cell's SLO verdicts and goodput.
    Slo,
}

impl Dropped {
    pub const ALL: [Dropped; 4] = [
        Dropped::CellDetail,
        Dropped::Cell,
        Dropped::Base,
        Dropped::Slo,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Dropped::CellDetail => "cell_detail",
            Dropped::Cell => "cell",
            Dropped::Base => "base",
            Dropped::Slo => "slo",
        }
    }
}

/// How much of a new cell the budget admits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Admitted {
    Full,
    Core,
    Nothing,
}

/// The series budget: series registered so far, the most allowed, and what was refused.
#[derive(Debug)]
pub struct SeriesBudget {
    max: u64,
    used: AtomicU64,
    dropped: [AtomicU64; Dropped::ALL.len()],
    /// A cell's series: every one, its core ones.
    cell_full: u64,
    cell_core: u64,
}

impl SeriesBudget {
    pub(super) fn new(max: usize) -> Self {
        let counters = (Outcome::ALL.len() + 3) as u64;
        let core: u64 = CELL_CORE_HISTOGRAMS
            .iter()
            .map(|n| histogram_series(n))
            .sum();
        let detail: u64 = CELL_DETAIL_HISTOGRAMS
            .iter()
            .map(|n| histogram_series(n))
            .sum();
        Self {
            max: max as u64,
            used: AtomicU64::new(0),
            dropped: Default::default(),
            cell_full: counters + core + detail,
            cell_core: counters + core,
        }
    }

    /// Series that are always kept.
    pub(super) fn force(&self, series: u64) {
        self.used.fetch_add(series, Ordering::Relaxed);
    }

    /// Takes `series` if the total stays within `limit`.
    fn take(&self, series: u64, limit: u64) -> bool {
        self.used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                (used + series <= limit).then_some(used + series)
            })
            .is_ok()
    }

    fn drop_series(&self, what: Dropped, series: u64) {
        if let Some(count) = self.dropped.get(what as usize) {
            count.fetch_add(series, Ordering::Relaxed);
        }
    }

    /// Admits `series` of kind `what` while there is room, or counts them dropped.
    pub(super) fn admit(&self, what: Dropped, series: u64) -> bool {
        let admitted = self.take(series, self.max);
        if !admitted {
            self.drop_series(what, series);
        }
        admitted
    }

    pub(super) fn admit_cell(&self) -> Admitted {
        if self.take(self.cell_full, self.max / 2) {
            Admitted::Full
        } else if self.take(self.cell_core, self.max) {
            self.drop_series(Dropped::CellDetail, self.cell_full - self.cell_core);
            Admitted::Core
        } else {
            self.drop_series(Dropped::Cell, self.cell_full);
            Admitted::Nothing
        }
    }

    /// Series registered (`tokentap_metrics_series`).
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// `telemetry.max_series`.
    pub fn max(&self) -> u64 {
        self.max
    }

    /// Series refused, of kind `what`.
    pub fn dropped(&self, what: Dropped) -> u64 {
        self.dropped
            .get(what as usize)
            .map_or(0, |count| count.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_histogram_costs_its_bounds_plus_three_series() {
        let (name, bounds) = HISTOGRAM_BUCKETS[0];
        assert_eq!(histogram_series(name), bounds.len() as u64 + 3);
        // A name without configured bounds still shows `+Inf`, `_sum` and `_count`.
        assert_eq!(histogram_series("tokentap_not_a_histogram"), 3);
    }

    #[test]
    fn every_cell_histogram_has_bounds_and_is_core_or_detail_once() {
        let all: Vec<&str> = CELL_CORE_HISTOGRAMS
            .iter()
            .chain(CELL_DETAIL_HISTOGRAMS.iter())
            .copied()
            .collect();
        for name in &all {
            assert!(histogram_series(name) > 3, "{name} has no bucket bounds");
            assert_eq!(all.iter().filter(|n| *n == name).count(), 1, "{name}");
        }
    }

    #[test]
    fn dropped_kinds_index_their_own_counter() {
        for (i, what) in Dropped::ALL.iter().enumerate() {
            assert_eq!(*what as usize, i, "{what:?} counts into another slot");
        }
        let labels: std::collections::BTreeSet<_> =
            Dropped::ALL.iter().map(|w| w.label()).collect();
        assert_eq!(labels.len(), Dropped::ALL.len());
    }

    #[test]
    fn cells_get_everything_under_half_then_their_core_then_nothing() {
        let probe = SeriesBudget::new(0);
        let (full, core) = (probe.cell_full, probe.cell_core);
        assert!(core < full);
        // Half the budget holds exactly two whole cells; core-only cells fill the rest.
        let max = 4 * full + 1;
        let budget = SeriesBudget::new(max as usize);
        assert_eq!(budget.admit_cell(), Admitted::Full);
        assert_eq!(budget.admit_cell(), Admitted::Full);
        let cores = (2 * full + 1) / core;
        for i in 0..cores {
            assert_eq!(budget.admit_cell(), Admitted::Core, "core cell {i}");
        }
        assert_eq!(budget.admit_cell(), Admitted::Nothing);
        assert_eq!(budget.admit_cell(), Admitted::Nothing);
        assert_eq!(budget.used(), 2 * full + cores * core);
        assert!(budget.used() <= budget.max());
        assert_eq!(budget.dropped(Dropped::CellDetail), cores * (full - core));
        assert_eq!(budget.dropped(Dropped::Cell), 2 * full);
    }

    #[test]
    fn admitted_series_stay_within_the_max_and_forced_ones_do_not_ask() {
        let budget = SeriesBudget::new(10);
        assert!(budget.admit(Dropped::Base, 6));
        assert!(!budget.admit(Dropped::Slo, 5), "6 + 5 is over 10");
        assert!(budget.admit(Dropped::Slo, 4), "6 + 4 is exactly 10");
        assert_eq!(budget.dropped(Dropped::Slo), 5);
        assert_eq!(budget.dropped(Dropped::Base), 0);
        budget.force(7);
        assert_eq!(
            budget.used(),
            17,
            "process-wide series are kept past the max"
        );
        assert!(!budget.admit(Dropped::Base, 1));
        assert_eq!(budget.dropped(Dropped::Base), 1);
    }
}
