//! The exporter handles of each label set, registered once and cached: a cell's
//! ([`CellHandles`]), its SLO series ([`SloHandles`]), the per-model series ([`BaseHandles`])
//! and the budget's own ([`BudgetHandles`]).
//!
//! The budget decides, when a label set is first seen, which of its series are real; the
//! refused ones get no-op handles, so recording into them later costs nothing and shows
//! nothing.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use metrics::{Counter, Gauge, Histogram, Key, Label, Level, Metadata, Recorder};
use metrics_exporter_prometheus::PrometheusRecorder;

use crate::base::lock;
use crate::meter::buckets::Ladder;
use crate::meter::record::{Outcome, SloVerdict};
use crate::telemetry::names::*;

use super::budget::{histogram_series, Admitted, Dropped, SeriesBudget, CELL_CORE_HISTOGRAMS};
use super::histograms::HistogramRegistry;
use super::keys::{base_labels, cell_labels, BaseKey, CellKey};

/// What every series of the sink is registered with.
pub(super) static METADATA: Metadata<'static> =
    Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

pub(super) struct CellHandles {
    pub(super) ttft: Histogram,
    pub(super) ttft_answer: Histogram,
    pub(super) ttft_tool_call: Histogram,
    pub(super) reasoning_tokens: Histogram,
    pub(super) tbt: Histogram,
    pub(super) itl: Histogram,
    pub(super) duration: Histogram,
    pub(super) prefill: Histogram,
    pub(super) per_request: Histogram,
    pub(super) prompt: Histogram,
    pub(super) completion: Histogram,
    pub(super) tokens_per_event: Histogram,
    pub(super) prompt_tokens: Counter,
    pub(super) cached_tokens: Counter,
    pub(super) completion_tokens: Counter,
    pub(super) decode_seconds: Histogram,
    pub(super) average_active: Histogram,
    pub(super) prefill_overlap: Histogram,
    pub(super) overlapping_prefills: Histogram,
    pub(super) prefill_busy: Histogram,
    pub(super) outcomes: [Counter; Outcome::ALL.len()],
}

/// SLO series of one cell, registered only once a request with targets reaches it, so
/// deployments without SLOs export no such series.
pub(super) struct SloHandles {
    /// By [`SloVerdict::JUDGED`] order: met, missed.
    pub(super) requests: [Counter; SloVerdict::JUDGED.len()],
    pub(super) goodput_tokens: Counter,
}

pub(super) struct BaseHandles {
    pub(super) inflight: Gauge,
    pub(super) overhead_request: Histogram,
    pub(super) overhead_frame: Histogram,
    pub(super) slo_header_invalid: Counter,
}

/// The budget's own series, set at each render.
pub(super) struct BudgetHandles {
    pub(super) used: Gauge,
    pub(super) max: Gauge,
    pub(super) dropped: [Counter; Dropped::ALL.len()],
}

impl BudgetHandles {
    /// Registers the budget's series (`tokentap_metrics_series*`); the caller forces their
    /// cost into the budget.
    pub(super) fn register(recorder: &PrometheusRecorder) -> Self {
        Self {
            used: recorder.register_gauge(&Key::from_name(METRICS_SERIES), &METADATA),
            max: recorder.register_gauge(&Key::from_name(METRICS_SERIES_BUDGET), &METADATA),
            dropped: Dropped::ALL.map(|what| {
                recorder.register_counter(
                    &Key::from_parts(
                        METRICS_SERIES_DROPPED_TOTAL,
                        vec![Label::new("what", what.label())],
                    ),
                    &METADATA,
                )
            }),
        }
    }

    /// Series these handles put on the page.
    pub(super) const SERIES: u64 = 2 + Dropped::ALL.len() as u64;
}

/// The handles of every label set seen so far, and the ladders that name a cell's buckets.
pub(super) struct HandleCache {
    contexts: Ladder,
    concurrency: Ladder,
    cells: Mutex<HashMap<CellKey, Arc<CellHandles>>>,
    bases: Mutex<HashMap<BaseKey, Arc<BaseHandles>>>,
    slo_cells: Mutex<HashMap<CellKey, Arc<SloHandles>>>,
    /// The histograms of every handle above (tokentap's own bucket counters, not the
    /// exporter's: `histograms`).
    histograms: HistogramRegistry,
}

impl HandleCache {
    pub(super) fn new(contexts: Ladder, concurrency: Ladder) -> Self {
        Self {
            contexts,
            concurrency,
            cells: Mutex::new(HashMap::new()),
            bases: Mutex::new(HashMap::new()),
            slo_cells: Mutex::new(HashMap::new()),
            histograms: HistogramRegistry::default(),
        }
    }

    /// Appends every histogram series in the text format (see `histograms`).
    pub(super) fn render_histograms(&self, out: &mut String) {
        self.histograms.render_into(out);
    }

    /// The per-model handles of `key`, registered on first use if the budget has room.
    pub(super) fn base(
        &self,
        recorder: &PrometheusRecorder,
        budget: &SeriesBudget,
        key: BaseKey,
    ) -> Arc<BaseHandles> {
        let mut bases = lock::lock(&self.bases);
        if let Some(handles) = bases.get(&key) {
            return Arc::clone(handles);
        }
        let handles = if budget.admit(Dropped::Base, 2 + 2 * histogram_series(PROXY_OVERHEAD)) {
            let labels = base_labels(&key.0, &key.1, key.2, key.3);
            let with = |name: &'static str, extra: Option<Label>| {
                let mut labels = labels.clone();
                labels.extend(extra);
                Key::from_parts(name, labels)
            };
            Arc::new(BaseHandles {
                inflight: recorder.register_gauge(&with(INFLIGHT_REQUESTS, None), &METADATA),
                overhead_request: self
                    .histograms
                    .register(&with(PROXY_OVERHEAD, Some(Label::new("phase", "request")))),
                overhead_frame: self
                    .histograms
                    .register(&with(PROXY_OVERHEAD, Some(Label::new("phase", "frame")))),
                slo_header_invalid: recorder
                    .register_counter(&with(SLO_HEADER_INVALID_TOTAL, None), &METADATA),
            })
        } else {
            Arc::new(BaseHandles {
                inflight: Gauge::noop(),
                overhead_request: Histogram::noop(),
                overhead_frame: Histogram::noop(),
                slo_header_invalid: Counter::noop(),
            })
        };
        bases.insert(key, Arc::clone(&handles));
        handles
    }

    /// The handles of cell `key`, registered on first use as far as the budget admits.
    pub(super) fn cell(
        &self,
        recorder: &PrometheusRecorder,
        budget: &SeriesBudget,
        key: CellKey,
    ) -> Arc<CellHandles> {
        let mut cells = lock::lock(&self.cells);
        if let Some(handles) = cells.get(&key) {
            return Arc::clone(handles);
        }
        // The budget decides once, here, what this cell's series are; refused ones are no-ops.
        let admitted = budget.admit_cell();
        let labels = if admitted == Admitted::Nothing {
            Vec::new()
        } else {
            cell_labels(&key, &self.contexts, &self.concurrency)
        };
        let key_of = |name: &'static str, extra: Option<(&'static str, &'static str)>| {
            let mut labels = labels.clone();
            if let Some((k, v)) = extra {
                labels.push(Label::new(k, v));
            }
            Key::from_parts(name, labels)
        };
        let r = recorder;
        let histogram = |name: &'static str| {
            let kept = match admitted {
                Admitted::Full => true,
                Admitted::Core => CELL_CORE_HISTOGRAMS.contains(&name),
                Admitted::Nothing => false,
            };
            if kept {
                self.histograms.register(&key_of(name, None))
            } else {
                Histogram::noop()
            }
        };
        let counter = |name, extra| {
            if admitted == Admitted::Nothing {
                Counter::noop()
            } else {
                r.register_counter(&key_of(name, extra), &METADATA)
            }
        };
        let handles = Arc::new(CellHandles {
            ttft: histogram(TIME_TO_FIRST_TOKEN),
            ttft_answer: histogram(TIME_TO_FIRST_ANSWER_TOKEN),
            ttft_tool_call: histogram(TIME_TO_FIRST_TOOL_CALL),
            reasoning_tokens: histogram(REASONING_TOKENS),
            tbt: histogram(TIME_BETWEEN_TOKENS),
            itl: histogram(INTER_TOKEN_LATENCY),
            duration: histogram(REQUEST_DURATION),
            prefill: histogram(PREFILL_TOKENS_PER_SECOND),
            per_request: histogram(PER_REQUEST_TOKENS_PER_SECOND),
            prompt: histogram(PROMPT_TOKENS),
            completion: histogram(COMPLETION_TOKENS),
            tokens_per_event: histogram(TOKENS_PER_EVENT),
            prompt_tokens: counter(TOKENS_TOTAL, Some(("type", "prompt"))),
            cached_tokens: counter(TOKENS_TOTAL, Some(("type", "cached"))),
            completion_tokens: counter(TOKENS_TOTAL, Some(("type", "completion"))),
            decode_seconds: histogram(DECODE_SECONDS),
            average_active: histogram(AVERAGE_ACTIVE_REQUESTS),
            prefill_overlap: histogram(PREFILL_OVERLAP),
            overlapping_prefills: histogram(OVERLAPPING_PREFILLS),
            prefill_busy: histogram(PREFILL_BUSY_SECONDS),
            outcomes: Outcome::ALL.map(|o| counter(REQUESTS_TOTAL, Some(("outcome", o.label())))),
        });
        cells.insert(key, Arc::clone(&handles));
        handles
    }

    /// The SLO handles of cell `key`, registered on first use if the budget has room.
    pub(super) fn slo_cell(
        &self,
        recorder: &PrometheusRecorder,
        budget: &SeriesBudget,
        key: CellKey,
    ) -> Arc<SloHandles> {
        let mut cells = lock::lock(&self.slo_cells);
        if let Some(handles) = cells.get(&key) {
            return Arc::clone(handles);
        }
        let admitted = budget.admit(Dropped::Slo, SloVerdict::JUDGED.len() as u64 + 1);
        let labels = if admitted {
            cell_labels(&key, &self.contexts, &self.concurrency)
        } else {
            Vec::new()
        };
        let counter = |name: &'static str, extra: Option<Label>| {
            if !admitted {
                return Counter::noop();
            }
            let mut labels = labels.clone();
            labels.extend(extra);
            recorder.register_counter(&Key::from_parts(name, labels), &METADATA)
        };
        let handles = Arc::new(SloHandles {
            requests: SloVerdict::JUDGED
                .map(|v| counter(SLO_REQUESTS_TOTAL, Some(Label::new("slo", v.label())))),
            goodput_tokens: counter(SLO_GOODPUT_TOKENS_TOTAL, None),
        });
        cells.insert(key, Arc::clone(&handles));
        handles
    }
}

#[cfg(test)]
mod tests {
    use metrics_exporter_prometheus::PrometheusBuilder;

    use super::*;
    use crate::meter::record::RequestRecord;

    fn cache() -> HandleCache {
        HandleCache::new(
            Ladder::contexts(&[1024, 4096]).unwrap(),
            Ladder::concurrency(&[1, 8]).unwrap(),
        )
    }

    fn key(concurrency: usize) -> CellKey {
        CellKey::of_record(&RequestRecord::for_test(), concurrency)
    }

    /// A budget with room for one whole cell under its half.
    fn roomy_budget() -> SeriesBudget {
        SeriesBudget::new(1_000_000)
    }

    /// The page's lines that start with `name{` or `name ` (no `_sum`, `_count`, `_bucket`).
    fn lines<'a>(page: &'a str, name: &str) -> Vec<&'a str> {
        page.lines()
            .filter(|l| {
                l.strip_prefix(name)
                    .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
            })
            .collect()
    }

    #[test]
    fn a_cell_registers_its_counters_at_zero_once_and_is_cached() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let budget = roomy_budget();
        let cache = cache();
        let first = cache.cell(&recorder, &budget, key(1));
        let used = budget.used();
        let again = cache.cell(&recorder, &budget, key(1));
        assert!(Arc::ptr_eq(&first, &again));
        assert_eq!(budget.used(), used, "a cached cell costs nothing more");
        let page = recorder.handle().render();
        let outcomes = lines(&page, REQUESTS_TOTAL);
        assert_eq!(outcomes.len(), Outcome::ALL.len(), "{page}");
        assert!(outcomes.iter().all(|l| l.ends_with(" 0")), "{outcomes:?}");
        assert!(
            outcomes
                .iter()
                .all(|l| l.contains("context_bucket=\"1K\"")
                    && l.contains("concurrency_bucket=\"8\"")),
            "{outcomes:?}"
        );
        assert_eq!(
            lines(&page, TOKENS_TOTAL).len(),
            3,
            "prompt, cached, completion"
        );
    }

    #[test]
    fn a_core_only_cell_keeps_the_matrix_histograms_and_drops_the_rest() {
        // A max of one whole cell: under its half no cell is whole, its core series fit.
        let probe = roomy_budget();
        let _ = cache().cell(&PrometheusBuilder::new().build_recorder(), &probe, key(0));
        let budget_core = SeriesBudget::new(probe.used() as usize);
        let recorder = PrometheusBuilder::new().build_recorder();
        let cache = cache();
        let cell = cache.cell(&recorder, &budget_core, key(0));
        cell.ttft.record(0.5);
        cell.duration.record(2.0);
        cell.outcomes[0].increment(1);
        let mut page = recorder.handle().render();
        cache.render_histograms(&mut page);
        let core_cell = |l: &&str| l.contains("concurrency_bucket=\"1\"");
        assert!(
            page.lines()
                .filter(core_cell)
                .any(|l| l.starts_with(TIME_TO_FIRST_TOKEN)),
            "{page}"
        );
        assert!(
            !page
                .lines()
                .filter(core_cell)
                .any(|l| l.starts_with(REQUEST_DURATION)),
            "{page}"
        );
        assert!(budget_core.dropped(Dropped::CellDetail) > 0);
        assert_eq!(budget_core.dropped(Dropped::Cell), 0);
    }

    #[test]
    fn a_refused_cell_and_base_show_nothing_and_are_counted_dropped() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let cache = cache();
        let budget = SeriesBudget::new(0);
        let cell = cache.cell(&recorder, &budget, key(0));
        cell.outcomes[0].increment(3);
        cell.ttft.record(0.1);
        let record = RequestRecord::for_test();
        let base = cache.base(
            &recorder,
            &budget,
            (
                record.labels.model,
                record.labels.upstream,
                record.labels.route,
                record.labels.source,
            ),
        );
        base.inflight.increment(1.0);
        base.slo_header_invalid.increment(1);
        let page = recorder.handle().render();
        assert!(lines(&page, REQUESTS_TOTAL).is_empty(), "{page}");
        assert!(lines(&page, INFLIGHT_REQUESTS).is_empty(), "{page}");
        assert!(lines(&page, SLO_HEADER_INVALID_TOTAL).is_empty(), "{page}");
        assert!(budget.dropped(Dropped::Cell) > 0);
        assert_eq!(
            budget.dropped(Dropped::Base),
            2 + 2 * histogram_series(PROXY_OVERHEAD)
        );
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn slo_series_carry_the_cell_labels_and_a_verdict() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let cache = cache();
        let budget = roomy_budget();
        let slo = cache.slo_cell(&recorder, &budget, key(1));
        assert!(Arc::ptr_eq(
            &slo,
            &cache.slo_cell(&recorder, &budget, key(1))
        ));
        slo.requests[0].increment(2);
        slo.goodput_tokens.increment(40);
        assert_eq!(budget.used(), SloVerdict::JUDGED.len() as u64 + 1);
        let page = recorder.handle().render();
        let requests = lines(&page, SLO_REQUESTS_TOTAL);
        assert_eq!(requests.len(), SloVerdict::JUDGED.len(), "{page}");
        assert!(
            requests
                .iter()
                .any(|l| l.contains("slo=\"met\"") && l.ends_with(" 2")),
            "{requests:?}"
        );
        let goodput = lines(&page, SLO_GOODPUT_TOKENS_TOTAL);
        assert_eq!(goodput.len(), 1, "{page}");
        assert!(goodput[0].contains("concurrency_bucket=\"8\"") && goodput[0].ends_with(" 40"));
    }

    #[test]
    fn the_budget_handles_cost_what_they_register() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handles = BudgetHandles::register(&recorder);
        handles.used.set(7.0);
        handles.dropped[Dropped::Slo as usize].absolute(3);
        let page = recorder.handle().render();
        let series = lines(&page, METRICS_SERIES).len()
            + lines(&page, METRICS_SERIES_BUDGET).len()
            + lines(&page, METRICS_SERIES_DROPPED_TOTAL).len();
        assert_eq!(series as u64, BudgetHandles::SERIES, "{page}");
        assert!(lines(&page, METRICS_SERIES).contains(&"tokentap_metrics_series 7"));
        assert!(lines(&page, METRICS_SERIES_DROPPED_TOTAL)
            .contains(&"tokentap_metrics_series_dropped_total{what=\"slo\"} 3"));
    }
}
