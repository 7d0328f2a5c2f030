//! The Prometheus sink and renderer of one proxy instance ([`PrometheusMetrics`]): its own
//! recorder, what it watches, and the text exposition.
//!
//! Each proxy instance owns its own recorder (not the process-global one), so several
//! instances — tests, the demo — can live in one process. Metric handles are resolved once per
//! label set and cached (`handles`); a finished request costs a few hash lookups and atomic
//! updates (`record`), within the series budget (`budget`). Histograms are tokentap's own
//! bucket counters (`histograms`), so nothing is kept per sample and nothing needs draining.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use metrics::{Counter, Key, Label, Recorder, Unit};
use metrics_exporter_prometheus::{
    BuildError, Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder,
};

use crate::base::lock;
use crate::meter::buckets::Ladder;
use crate::meter::Meter;
use crate::net::faults::{Fault, FaultCounters};
use crate::telemetry::capacity::CapacityGauges;
use crate::telemetry::drift::DriftGauges;
use crate::telemetry::names::*;

use super::budget::{Dropped, SeriesBudget, DEFAULT_MAX_SERIES};
use super::handles::{BaseHandles, BudgetHandles, CellHandles, HandleCache, SloHandles, METADATA};
use super::keys::{BaseKey, CellKey};
use super::watched::Watched;

/// The Prometheus sink and renderer of one proxy instance.
pub struct PrometheusMetrics {
    recorder: PrometheusRecorder,
    handle: PrometheusHandle,
    handles: HandleCache,
    /// Counts kept as atomics elsewhere (listeners, the meter), copied in at each render.
    watched: Mutex<Vec<Watched>>,
    /// Production ÷ reference per cell, set by the drift refresher, appended at each render.
    pub drift: DriftGauges,
    /// Live headroom per model, set by the same refresher, appended at each render.
    pub capacity: CapacityGauges,
    /// What the series this sink registers may cost (`telemetry.max_series`).
    pub budget: SeriesBudget,
    budget_handles: BudgetHandles,
}

impl std::fmt::Debug for PrometheusMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PrometheusMetrics")
    }
}

impl PrometheusMetrics {
    /// A sink with the default series budget ([`DEFAULT_MAX_SERIES`]).
    pub fn new(contexts: Ladder, concurrency: Ladder) -> Result<Arc<Self>, BuildError> {
        Self::with_budget(contexts, concurrency, DEFAULT_MAX_SERIES)
    }

    /// A sink whose own series stay within `max_series` (`telemetry.max_series`).
    pub fn with_budget(
        contexts: Ladder,
        concurrency: Ladder,
        max_series: usize,
    ) -> Result<Arc<Self>, BuildError> {
        let mut builder = PrometheusBuilder::new();
        for (name, buckets) in HISTOGRAM_BUCKETS {
            builder =
                builder.set_buckets_for_metric(Matcher::Full((*name).to_string()), buckets)?;
        }
        let recorder = builder.build_recorder();
        let handle = recorder.handle();
        for (name, help) in DESCRIPTIONS {
            let unit = if name.ends_with("_seconds") {
                Some(Unit::Seconds)
            } else {
                None
            };
            recorder.describe_histogram((*name).into(), unit, (*help).into());
            recorder.describe_counter((*name).into(), unit, (*help).into());
            recorder.describe_gauge((*name).into(), unit, (*help).into());
        }
        let budget = SeriesBudget::new(max_series);
        let budget_handles = BudgetHandles::register(&recorder);
        budget.force(BudgetHandles::SERIES);
        Ok(Arc::new(Self {
            recorder,
            handle,
            handles: HandleCache::new(contexts, concurrency),
            watched: Mutex::new(Vec::new()),
            drift: DriftGauges::default(),
            capacity: CapacityGauges::default(),
            budget,
            budget_handles,
        }))
    }

    /// Shows a listener's fault counters as `tokentap_faults_total{listener, fault}`.
    pub fn watch_faults(&self, listener: &'static str, counters: Arc<FaultCounters>) {
        let handles = Fault::ALL.map(|fault| {
            let key = Key::from_parts(
                FAULTS_TOTAL,
                vec![
                    Label::new("listener", listener),
                    Label::new("fault", fault.label()),
                ],
            );
            self.recorder.register_counter(&key, &METADATA)
        });
        self.budget.force(handles.len() as u64);
        self.watch(Watched::Faults {
            counters,
            handles: Box::new(handles),
        });
    }

    /// Registers `tokentap_admin_login_failures_total{reason}` for each reason, so each series
    /// exists at 0 before the first failure.
    pub fn register_login_failures(&self, reasons: &[&'static str]) {
        for reason in reasons {
            let _ = self.login_failure(reason);
        }
        self.budget.force(reasons.len() as u64);
    }

    /// Counts one failed admin login (not the request path: a handful per minute at most).
    pub fn count_login_failure(&self, reason: &'static str) {
        self.login_failure(reason).increment(1);
    }

    fn login_failure(&self, reason: &'static str) -> Counter {
        let key = Key::from_parts(
            ADMIN_LOGIN_FAILURES_TOTAL,
            vec![Label::new("reason", reason)],
        );
        self.recorder.register_counter(&key, &METADATA)
    }

    /// Shows the meter's clamped token counts as `tokentap_clamped_token_counts_total`.
    pub fn watch_clamped_counts(&self, meter: &Arc<Meter>) {
        let handle = self
            .recorder
            .register_counter(&Key::from_name(CLAMPED_COUNTS_TOTAL), &METADATA);
        self.budget.force(1);
        self.watch(Watched::Clamped {
            meter: Arc::downgrade(meter),
            handle,
        });
    }

    /// Shows `value` as the counter `name{labels}` (a name of `telemetry::names`).
    pub fn watch_count(
        &self,
        name: &'static str,
        labels: &[(&'static str, &'static str)],
        value: Arc<AtomicU64>,
    ) {
        let key = Key::from_parts(
            name,
            labels
                .iter()
                .map(|(k, v)| Label::new(*k, *v))
                .collect::<Vec<_>>(),
        );
        let handle = self.recorder.register_counter(&key, &METADATA);
        self.budget.force(1);
        self.watch(Watched::Count { value, handle });
    }

    /// Shows the upstreams' scraped state (`tokentap_upstream_*`) and scrape counts.
    pub fn watch_server_state(&self, meter: &Arc<Meter>) {
        self.watch(Watched::ServerState {
            meter: Arc::downgrade(meter),
        });
    }

    /// Shows the upstreams' configurations: `tokentap_upstream_config_info` (the kept ones),
    /// `tokentap_upstream_config_changes_total` and `tokentap_upstream_config_flapping`.
    pub fn watch_identities(&self, meter: &Arc<Meter>) {
        self.watch(Watched::Identities {
            meter: Arc::downgrade(meter),
        });
    }

    /// Shows the session table's size and the session figures (`tokentap_session*`).
    pub fn watch_sessions(
        &self,
        table: &Arc<crate::meter::conversation::Conversations>,
        stats: &Arc<crate::meter::turn_stats::TurnStats>,
    ) {
        self.watch(Watched::Sessions {
            table: Arc::downgrade(table),
            stats: Arc::downgrade(stats),
        });
    }

    fn watch(&self, watched: Watched) {
        lock::lock(&self.watched).push(watched);
    }

    /// The text exposition, for `/metrics`.
    pub fn render(&self) -> String {
        let mut extra = String::new();
        for watched in lock::lock(&self.watched).iter() {
            watched.show(&mut extra);
        }
        let handles = &self.budget_handles;
        handles.used.set(self.budget.used() as f64);
        handles.max.set(self.budget.max() as f64);
        for (what, handle) in Dropped::ALL.iter().zip(&handles.dropped) {
            handle.absolute(self.budget.dropped(*what));
        }
        let mut out = Vec::with_capacity(64 * 1024);
        if self.handle.render_to_write(&mut out).is_err() {
            return String::new();
        }
        let mut text = String::from_utf8(out).unwrap_or_default();
        self.handles.render_histograms(&mut text);
        text.push_str(&extra);
        self.drift.render_into(&mut text);
        self.capacity.render_into(&mut text);
        text
    }

    /// The per-model handles of `key` (see [`HandleCache::base`]).
    pub(super) fn base(&self, key: BaseKey) -> Arc<BaseHandles> {
        self.handles.base(&self.recorder, &self.budget, key)
    }

    /// The handles of cell `key` (see [`HandleCache::cell`]).
    pub(super) fn cell(&self, key: CellKey) -> Arc<CellHandles> {
        self.handles.cell(&self.recorder, &self.budget, key)
    }

    /// The SLO handles of cell `key` (see [`HandleCache::slo_cell`]).
    pub(super) fn slo_cell(&self, key: CellKey) -> Arc<SloHandles> {
        self.handles.slo_cell(&self.recorder, &self.budget, key)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::*;

    fn sink(max_series: usize) -> Arc<PrometheusMetrics> {
        PrometheusMetrics::with_budget(
            Ladder::contexts(&[1024]).unwrap(),
            Ladder::concurrency(&[1]).unwrap(),
            max_series,
        )
        .unwrap()
    }

    fn has_line(page: &str, line: &str) -> bool {
        page.lines().any(|l| l == line)
    }

    #[test]
    fn a_new_sink_shows_its_budget_and_counts_the_budget_series_as_used() {
        let sink = sink(1_234);
        let page = sink.render();
        assert!(
            has_line(&page, "tokentap_metrics_series_budget 1234"),
            "{page}"
        );
        assert!(
            has_line(
                &page,
                &format!("{METRICS_SERIES} {}", BudgetHandles::SERIES)
            ),
            "{page}"
        );
        for what in Dropped::ALL {
            let line = format!(
                "{METRICS_SERIES_DROPPED_TOTAL}{{what=\"{}\"}} 0",
                what.label()
            );
            assert!(has_line(&page, &line), "{page}");
        }
    }

    #[test]
    fn login_failure_reasons_exist_at_zero_and_count_up() {
        let sink = sink(100);
        sink.register_login_failures(&["bad_token", "expired"]);
        sink.count_login_failure("expired");
        let page = sink.render();
        let line = |reason: &str, n: u32| {
            format!("{ADMIN_LOGIN_FAILURES_TOTAL}{{reason=\"{reason}\"}} {n}")
        };
        assert!(has_line(&page, &line("bad_token", 0)), "{page}");
        assert!(has_line(&page, &line("expired", 1)), "{page}");
        assert_eq!(sink.budget.used(), BudgetHandles::SERIES + 2);
    }

    #[test]
    fn watched_counts_are_copied_in_at_render_and_always_kept() {
        // A budget smaller than what is watched: process-wide series are never refused.
        let sink = sink(1);
        let faults = Arc::new(FaultCounters::default());
        faults.add(Fault::IdleClosed);
        sink.watch_faults("data", Arc::clone(&faults));
        let lost = Arc::new(AtomicU64::new(0));
        sink.watch_count(
            WORKLOAD_ROWS_LOST_TOTAL,
            &[("reason", "writer_behind")],
            Arc::clone(&lost),
        );
        lost.store(12, Ordering::Relaxed);
        faults.add(Fault::IdleClosed);
        let page = sink.render();
        assert!(
            has_line(
                &page,
                &format!("{FAULTS_TOTAL}{{listener=\"data\",fault=\"idle_closed\"}} 2")
            ),
            "{page}"
        );
        assert!(
            has_line(
                &page,
                &format!("{WORKLOAD_ROWS_LOST_TOTAL}{{reason=\"writer_behind\"}} 12")
            ),
            "{page}"
        );
        assert_eq!(
            sink.budget.used(),
            BudgetHandles::SERIES + Fault::ALL.len() as u64 + 1
        );
    }
}
