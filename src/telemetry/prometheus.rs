//! Prometheus exposition through `metrics-exporter-prometheus`.
//!
//! Each proxy instance owns its own recorder (not the process-global one), so several
//! instances — tests, the demo — can live in one process. Metric handles are resolved once per
//! label set and cached; a finished request costs a few hash lookups and atomic updates, and
//! its per-request histograms are flushed bucket by bucket (`record_many`).
//!
//! **Series budget** (`telemetry.max_series`, [`SeriesBudget`]): a cell (model × upstream ×
//! route × source × context × concurrency) costs up to ~330 series and ~1,300 cells are
//! reachable, so the series this sink registers are counted (a histogram costs its buckets +
//! 3) and new ones are admitted by priority, decided once when a label set is first seen:
//! the process-wide series (faults, lost rows, clamped counts, logins, the budget's own)
//! always; a cell every series while the budget is under half spent, its core series
//! ([`CELL_CORE_HISTOGRAMS`], requests by outcome, tokens by type) until it is spent, then
//! none; per-model series (in flight, overhead) and a cell's SLO series while there is room.
//! What is refused gets no-op handles (cheaper than real ones) and is counted once in
//! `tokentap_metrics_series_dropped_total{what}`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use metrics::{Counter, Gauge, Histogram, Key, Label, Level, Metadata, Recorder, Unit};
use metrics_exporter_prometheus::{
    BuildError, Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder,
};

use crate::base::lock;
use crate::base::Route;
use crate::base::Source;
use crate::meter::buckets::Ladder;
use crate::meter::identity::{FingerprintId, IdentityRegistry};
use crate::meter::priority::PriorityBand;
use crate::meter::record::SloVerdict;
use crate::meter::record::{Outcome, RequestRecord};
use crate::meter::server_state::{ScrapeOutcome, ServerStateRegistry};
use crate::meter::timeline::LocalHistogram;
use crate::meter::Meter;
use crate::meter::{ExpectedCell, RecordSink, RequestLabels};
use crate::net::faults::{Fault, FaultCounters};

use super::names::*;

static METADATA: Metadata<'static> =
    Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

/// One cell's series: who (model, upstream, route, source, tenant, priority band), where
/// (context and concurrency buckets) and on what configuration (fingerprint).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct CellKey {
    model: Arc<str>,
    upstream: Arc<str>,
    route: Route,
    source: Source,
    context: usize,
    concurrency: usize,
    fingerprint: FingerprintId,
    /// `None` when tenants are off: no `tenant` label.
    tenant: Option<Arc<str>>,
    /// `None` when the request sent no `priority`: no `priority` label.
    priority: Option<PriorityBand>,
}

impl CellKey {
    /// The cell a finished request's record lands in, at concurrency bucket `concurrency`
    /// (its tokens are split over the buckets they were emitted in).
    fn of_record(r: &RequestRecord, concurrency: usize) -> Self {
        Self {
            model: Arc::clone(&r.model),
            upstream: Arc::clone(&r.upstream),
            route: r.route,
            source: r.source,
            context: r.buckets.context,
            concurrency,
            fingerprint: r.fingerprint,
            tenant: r.tenant.clone(),
            priority: r.priority,
        }
    }
}
/// (model, upstream, route, source).
type BaseKey = (Arc<str>, Arc<str>, Route, Source);

struct CellHandles {
    ttft: Histogram,
    ttft_answer: Histogram,
    ttft_tool_call: Histogram,
    reasoning_tokens: Histogram,
    tbt: Histogram,
    itl: Histogram,
    duration: Histogram,
    prefill: Histogram,
    per_request: Histogram,
    prompt: Histogram,
    completion: Histogram,
    tokens_per_event: Histogram,
    prompt_tokens: Counter,
    cached_tokens: Counter,
    completion_tokens: Counter,
    decode_seconds: Histogram,
    average_active: Histogram,
    prefill_overlap: Histogram,
    overlapping_prefills: Histogram,
    prefill_busy: Histogram,
    outcomes: [Counter; Outcome::ALL.len()],
}

/// SLO series of one cell, registered only once a request with targets reaches it, so
/// deployments without SLOs export no such series.
struct SloHandles {
    /// By [`SloVerdict::JUDGED`] order: met, missed.
    requests: [Counter; SloVerdict::JUDGED.len()],
    goodput_tokens: Counter,
}

struct BaseHandles {
    inflight: Gauge,
    overhead_request: Histogram,
    overhead_frame: Histogram,
    slo_header_invalid: Counter,
}

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
enum Admitted {
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
    fn new(max: usize) -> Self {
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
    fn force(&self, series: u64) {
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
    fn admit(&self, what: Dropped, series: u64) -> bool {
        let admitted = self.take(series, self.max);
        if !admitted {
            self.drop_series(what, series);
        }
        admitted
    }

    fn admit_cell(&self) -> Admitted {
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

/// The budget's own series, set at each render.
struct BudgetHandles {
    used: Gauge,
    max: Gauge,
    dropped: [Counter; Dropped::ALL.len()],
}

/// The Prometheus sink and renderer of one proxy instance.
pub struct PrometheusMetrics {
    recorder: PrometheusRecorder,
    handle: PrometheusHandle,
    contexts: Ladder,
    concurrency: Ladder,
    cells: Mutex<HashMap<CellKey, Arc<CellHandles>>>,
    bases: Mutex<HashMap<BaseKey, Arc<BaseHandles>>>,
    /// Counts kept as atomics elsewhere (listeners, the meter), copied in at each render.
    watched: Mutex<Vec<Watched>>,
    slo_cells: Mutex<HashMap<CellKey, Arc<SloHandles>>>,
    /// Production ÷ reference per cell, set by the drift refresher, appended at each render.
    pub drift: super::drift::DriftGauges,
    /// Live headroom per model, set by the same refresher, appended at each render.
    pub capacity: super::capacity::CapacityGauges,
    /// What the series this sink registers may cost (`telemetry.max_series`).
    pub budget: SeriesBudget,
    budget_handles: BudgetHandles,
}

/// An outside count and the exporter counter showing it.
enum Watched {
    Faults {
        counters: Arc<FaultCounters>,
        // Boxed: one counter per fault makes this variant ten times the others.
        handles: Box<[Counter; Fault::ALL.len()]>,
    },
    Clamped {
        // Weak: the meter holds this sink, so a strong reference would keep both alive.
        meter: Weak<Meter>,
        handle: Counter,
    },
    /// A plain count kept elsewhere.
    Count {
        value: Arc<AtomicU64>,
        handle: Counter,
    },
    /// The upstreams' scraped state and scrape counts, written as text at each render (a
    /// state the server did not expose must have no sample, which the exporter's gauges
    /// cannot express).
    ServerState { meter: Weak<Meter> },
    /// The upstreams' configurations (`tokentap_upstream_config_*`), written as text.
    Identities { meter: Weak<Meter> },
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
        let budget_handles = BudgetHandles {
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
        };
        budget.force(2 + Dropped::ALL.len() as u64);
        Ok(Arc::new(Self {
            recorder,
            handle,
            contexts,
            concurrency,
            cells: Mutex::new(HashMap::new()),
            slo_cells: Mutex::new(HashMap::new()),
            bases: Mutex::new(HashMap::new()),
            watched: Mutex::new(Vec::new()),
            drift: super::drift::DriftGauges::default(),
            capacity: super::capacity::CapacityGauges::default(),
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

    fn watch(&self, watched: Watched) {
        lock::lock(&self.watched).push(watched);
    }

    /// The text exposition, for `/metrics`.
    pub fn render(&self) -> String {
        let mut extra = String::new();
        for watched in lock::lock(&self.watched).iter() {
            match watched {
                Watched::Faults { counters, handles } => {
                    for (fault, handle) in Fault::ALL.iter().zip(handles.iter()) {
                        handle.absolute(counters.get(*fault));
                    }
                }
                Watched::Clamped { meter, handle } => {
                    if let Some(meter) = meter.upgrade() {
                        handle.absolute(meter.clamped_counts());
                    }
                }
                Watched::ServerState { meter } => {
                    if let Some(meter) = meter.upgrade() {
                        render_server_state(meter.server_state(), &mut extra);
                    }
                }
                Watched::Identities { meter } => {
                    if let Some(meter) = meter.upgrade() {
                        render_identities(meter.identities(), &mut extra);
                    }
                }
                Watched::Count { value, handle } => {
                    handle.absolute(value.load(std::sync::atomic::Ordering::Relaxed));
                }
            }
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
        text.push_str(&extra);
        self.drift.render_into(&mut text);
        self.capacity.render_into(&mut text);
        text
    }

    /// Drains histogram samples into buckets; run it periodically so memory stays flat when
    /// nobody scrapes.
    pub fn upkeep(&self) {
        self.handle.run_upkeep();
    }

    /// Spawns the periodic upkeep task; it ends when the last reference to `self` is dropped.
    pub fn spawn_upkeep(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(5));
            loop {
                tick.tick().await;
                match weak.upgrade() {
                    Some(metrics) => metrics.upkeep(),
                    None => return,
                }
            }
        });
    }

    fn base_labels(
        &self,
        model: &Arc<str>,
        upstream: &Arc<str>,
        route: Route,
        source: Source,
    ) -> Vec<Label> {
        vec![
            Label::new("model", model.to_string()),
            Label::new("upstream", upstream.to_string()),
            Label::new("route", route.label()),
            Label::new("source", source.as_str()),
        ]
    }

    fn base(&self, key: BaseKey) -> Arc<BaseHandles> {
        let mut bases = lock::lock(&self.bases);
        if let Some(handles) = bases.get(&key) {
            return Arc::clone(handles);
        }
        let handles = if self
            .budget
            .admit(Dropped::Base, 2 + 2 * histogram_series(PROXY_OVERHEAD))
        {
            let labels = self.base_labels(&key.0, &key.1, key.2, key.3);
            let with = |name: &'static str, extra: Option<Label>| {
                let mut labels = labels.clone();
                labels.extend(extra);
                Key::from_parts(name, labels)
            };
            Arc::new(BaseHandles {
                inflight: self
                    .recorder
                    .register_gauge(&with(INFLIGHT_REQUESTS, None), &METADATA),
                overhead_request: self.recorder.register_histogram(
                    &with(PROXY_OVERHEAD, Some(Label::new("phase", "request"))),
                    &METADATA,
                ),
                overhead_frame: self.recorder.register_histogram(
                    &with(PROXY_OVERHEAD, Some(Label::new("phase", "frame"))),
                    &METADATA,
                ),
                slo_header_invalid: self
                    .recorder
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

    /// The labels of one cell: the base labels plus its context and concurrency buckets and
    /// the upstream's configuration (`fingerprint`: 12 hex, `unknown` or `flapping`).
    fn cell_labels(&self, key: &CellKey) -> Vec<Label> {
        let mut labels = self.base_labels(&key.model, &key.upstream, key.route, key.source);
        labels.push(Label::new(
            "context_bucket",
            self.contexts.label(key.context).to_string(),
        ));
        labels.push(Label::new(
            "concurrency_bucket",
            self.concurrency.label(key.concurrency).to_string(),
        ));
        labels.push(Label::new(
            "fingerprint",
            key.fingerprint.label().as_str().to_owned(),
        ));
        // Bounded: the allow list plus `other` (`proxy::tenants`), and four bands.
        if let Some(tenant) = &key.tenant {
            labels.push(Label::new("tenant", tenant.to_string()));
        }
        if let Some(priority) = key.priority {
            labels.push(Label::new("priority", priority.label()));
        }
        labels
    }

    fn cell(&self, key: CellKey) -> Arc<CellHandles> {
        let mut cells = lock::lock(&self.cells);
        if let Some(handles) = cells.get(&key) {
            return Arc::clone(handles);
        }
        // The budget decides once, here, what this cell's series are; refused ones are no-ops.
        let admitted = self.budget.admit_cell();
        let labels = if admitted == Admitted::Nothing {
            Vec::new()
        } else {
            self.cell_labels(&key)
        };
        let key_of = |name: &'static str, extra: Option<(&'static str, &'static str)>| {
            let mut labels = labels.clone();
            if let Some((k, v)) = extra {
                labels.push(Label::new(k, v));
            }
            Key::from_parts(name, labels)
        };
        let r = &self.recorder;
        let histogram = |name: &'static str| {
            let kept = match admitted {
                Admitted::Full => true,
                Admitted::Core => CELL_CORE_HISTOGRAMS.contains(&name),
                Admitted::Nothing => false,
            };
            if kept {
                r.register_histogram(&key_of(name, None), &METADATA)
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
}

/// Most samples one request's histogram adds to the exporter. `record_many` pushes one sample
/// per count (the exporter keeps raw samples until upkeep), so a count is never handed over
/// unbounded: above this, buckets are down-sampled in proportion (each non-empty bucket keeps
/// at least one sample). 16,384 covers every request up to that many tokens exactly and costs
/// well under a millisecond when an upstream reports an absurd count.
pub const MAX_SAMPLES_PER_FLUSH: u64 = 16_384;

impl PrometheusMetrics {
    fn slo_cell(&self, key: CellKey) -> Arc<SloHandles> {
        let mut cells = lock::lock(&self.slo_cells);
        if let Some(handles) = cells.get(&key) {
            return Arc::clone(handles);
        }
        let admitted = self
            .budget
            .admit(Dropped::Slo, SloVerdict::JUDGED.len() as u64 + 1);
        let labels = if admitted {
            self.cell_labels(&key)
        } else {
            Vec::new()
        };
        let counter = |name: &'static str, extra: Option<Label>| {
            if !admitted {
                return Counter::noop();
            }
            let mut labels = labels.clone();
            labels.extend(extra);
            self.recorder
                .register_counter(&Key::from_parts(name, labels), &METADATA)
        };
        let handles = Arc::new(SloHandles {
            requests: SloVerdict::JUDGED
                .map(|v| counter(SLO_REQUESTS_TOTAL, Some(Label::new("slo", v.label())))),
            goodput_tokens: counter(SLO_GOODPUT_TOKENS_TOTAL, None),
        });
        cells.insert(key, Arc::clone(&handles));
        handles
    }

    /// SLO counters: the verdict at the request's own cell, a met request's tokens split by
    /// concurrency bucket like the completion tokens.
    fn record_slo(&self, r: &RequestRecord) {
        let Some(verdict) = SloVerdict::JUDGED.iter().position(|v| *v == r.slo.verdict) else {
            return;
        };
        let key = |bucket: usize| CellKey::of_record(r, bucket);
        if let Some(counter) = self
            .slo_cell(key(r.buckets.concurrency))
            .requests
            .get(verdict)
        {
            counter.increment(1);
        }
        if r.slo.verdict != SloVerdict::Met {
            return;
        }
        if r.interference.split.total_tokens() == 0 {
            self.slo_cell(key(r.buckets.concurrency))
                .goodput_tokens
                .increment(r.tokens.completion);
            return;
        }
        for (bucket, &tokens) in r.interference.split.tokens.iter().enumerate() {
            if tokens > 0 {
                self.slo_cell(key(bucket)).goodput_tokens.increment(tokens);
            }
        }
    }
}

fn flush(histogram: &Histogram, local: &LocalHistogram) {
    let total = local.count();
    for (mean, count) in local.buckets() {
        histogram.record_many(mean, flushed_samples(count, total));
    }
}

/// Samples flushed for a bucket of `count` out of `total`: exact up to
/// [`MAX_SAMPLES_PER_FLUSH`], proportional above it. O(1), never more than the cap per bucket.
fn flushed_samples(count: u64, total: u64) -> usize {
    let samples = if total <= MAX_SAMPLES_PER_FLUSH {
        count
    } else {
        let scaled = u128::from(count) * u128::from(MAX_SAMPLES_PER_FLUSH) / u128::from(total);
        u64::try_from(scaled)
            .unwrap_or(MAX_SAMPLES_PER_FLUSH)
            .max(1)
    };
    usize::try_from(samples.min(MAX_SAMPLES_PER_FLUSH)).unwrap_or(0)
}

/// A label value as the text format wants it: backslash, double quote and newline escaped.
fn escape_label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Writes the upstream-state gauges and the scrape counters.
fn render_server_state(registry: &ServerStateRegistry, out: &mut String) {
    use std::fmt::Write as _;
    let mut rows = registry.current();
    rows.sort_by(|a, b| (&a.upstream, &a.model).cmp(&(&b.upstream, &b.model)));
    for (i, (name, help)) in UPSTREAM_STATE_GAUGES.iter().enumerate() {
        let samples: Vec<String> = rows
            .iter()
            .filter_map(|row| {
                let value = row.values.get(i).copied().flatten()?;
                Some(format!(
                    "{name}{{upstream=\"{}\",model=\"{}\"}} {value}\n",
                    escape_label(&row.upstream),
                    escape_label(&row.model)
                ))
            })
            .collect();
        if samples.is_empty() {
            continue;
        }
        let _ = write!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n");
        samples.iter().for_each(|sample| out.push_str(sample));
    }
    let mut upstreams = registry.upstreams();
    if upstreams.is_empty() {
        return;
    }
    upstreams.sort();
    let _ = write!(
        out,
        "# HELP {UPSTREAM_SCRAPES_TOTAL} {UPSTREAM_SCRAPES_HELP}\n# TYPE {UPSTREAM_SCRAPES_TOTAL} counter\n"
    );
    for upstream in &upstreams {
        for outcome in ScrapeOutcome::ALL {
            let _ = writeln!(
                out,
                "{UPSTREAM_SCRAPES_TOTAL}{{upstream=\"{}\",result=\"{}\"}} {}",
                escape_label(upstream),
                outcome.label(),
                registry.scrapes(upstream, outcome)
            );
        }
    }
}

/// Writes the upstreams' configurations: one info series per kept configuration (at most
/// `meter::identity::KEPT_CONFIGS` per upstream, so the label set stays bounded), the change
/// counter and the flapping gauge.
fn render_identities(registry: &IdentityRegistry, out: &mut String) {
    use std::fmt::Write as _;
    let upstreams = registry.all();
    if upstreams.is_empty() {
        return;
    }
    let mut info = String::new();
    for upstream in &upstreams {
        for config in upstream.configs() {
            let _ = writeln!(
                info,
                "{UPSTREAM_CONFIG_INFO}{{upstream=\"{}\",fingerprint=\"{}\",engine=\"{}\",version=\"{}\"}} 1",
                escape_label(&upstream.upstream),
                config.id.label().as_str(),
                escape_label(config.engine()),
                escape_label(config.version()),
            );
        }
    }
    if !info.is_empty() {
        let _ = write!(
            out,
            "# HELP {UPSTREAM_CONFIG_INFO} {UPSTREAM_CONFIG_INFO_HELP}\n# TYPE {UPSTREAM_CONFIG_INFO} gauge\n{info}"
        );
    }
    let _ = write!(
        out,
        "# HELP {UPSTREAM_CONFIG_CHANGES_TOTAL} {UPSTREAM_CONFIG_CHANGES_HELP}\n# TYPE {UPSTREAM_CONFIG_CHANGES_TOTAL} counter\n"
    );
    for upstream in &upstreams {
        let _ = writeln!(
            out,
            "{UPSTREAM_CONFIG_CHANGES_TOTAL}{{upstream=\"{}\"}} {}",
            escape_label(&upstream.upstream),
            upstream.changes_total()
        );
    }
    let _ = write!(
        out,
        "# HELP {UPSTREAM_CONFIG_FLAPPING} {UPSTREAM_CONFIG_FLAPPING_HELP}\n# TYPE {UPSTREAM_CONFIG_FLAPPING} gauge\n"
    );
    for upstream in &upstreams {
        let _ = writeln!(
            out,
            "{UPSTREAM_CONFIG_FLAPPING}{{upstream=\"{}\"}} {}",
            escape_label(&upstream.upstream),
            u8::from(upstream.is_flapping())
        );
    }
}

impl RecordSink for PrometheusMetrics {
    fn started(&self, labels: &RequestLabels) {
        let key = (
            Arc::clone(&labels.model),
            Arc::clone(&labels.upstream),
            labels.route,
            labels.source,
        );
        self.base(key).inflight.increment(1.0);
    }

    fn expected(&self, labels: &RequestLabels, cell: ExpectedCell) {
        // Creating the handles registers every series of the cell at 0.
        self.cell(CellKey {
            model: Arc::clone(&labels.model),
            upstream: Arc::clone(&labels.upstream),
            route: labels.route,
            source: labels.source,
            context: cell.context,
            concurrency: cell.concurrency,
            fingerprint: cell.fingerprint,
            tenant: labels.tenant.clone(),
            priority: labels.priority,
        });
    }

    fn record(&self, r: &Arc<RequestRecord>) {
        let base = self.base((
            Arc::clone(&r.model),
            Arc::clone(&r.upstream),
            r.route,
            r.source,
        ));
        base.inflight.decrement(1.0);
        if let Some(overhead) = r.overhead.request {
            base.overhead_request.record(overhead.as_secs_f64());
        }
        flush(&base.overhead_frame, &r.overhead.per_frame);
        if r.slo.header_invalid {
            base.slo_header_invalid.increment(1);
        }
        self.record_slo(r);

        let cell = self.cell(CellKey::of_record(r, r.buckets.concurrency));
        if let Some(i) = Outcome::ALL.iter().position(|o| *o == r.outcome) {
            if let Some(counter) = cell.outcomes.get(i) {
                counter.increment(1);
            }
        }
        cell.duration.record(r.timing.duration.as_secs_f64());
        if let Some(ttft) = r.timing.ttft {
            cell.ttft.record(ttft.as_secs_f64());
        }
        if let Some(tbt) = r.timing.tbt {
            cell.tbt.record(tbt.as_secs_f64());
        }
        if let Some(answer) = r.timing.ttft_answer {
            cell.ttft_answer.record(answer.as_secs_f64());
        }
        if let Some(tool_call) = r.timing.ttft_tool_call {
            cell.ttft_tool_call.record(tool_call.as_secs_f64());
        }
        if let Some(reasoning) = r.tokens.reasoning {
            cell.reasoning_tokens.record(reasoning as f64);
        }
        if let Some(rate) = r.tokens.per_second {
            cell.per_request.record(rate);
        }
        if let Some(rate) = r.tokens.prefill_per_second {
            cell.prefill.record(rate);
        }
        if let Some(prompt) = r.tokens.prompt {
            cell.prompt.record(prompt as f64);
            cell.prompt_tokens.increment(prompt);
        }
        if let Some(cached) = r.tokens.cached {
            cell.cached_tokens.increment(cached);
        }
        cell.completion.record(r.tokens.completion as f64);
        if let Some(per_event) = r.tokens.per_event() {
            cell.tokens_per_event.record(per_event);
        }
        flush(&cell.itl, &r.timing.itl);
        if r.timing.decode.is_some() {
            cell.average_active.record(r.interference.average_active);
        }
        if let Some(share) = r.interference.prefill_overlap_share {
            cell.prefill_overlap.record(share);
        }
        if let Some(overlapping) = r.interference.overlapping_prefills {
            cell.overlapping_prefills.record(f64::from(overlapping));
        }
        // Completion tokens and decode seconds by the concurrency in force when they were
        // emitted: the production matrix's cells, summable across replicas.
        for (bucket, (&tokens, &seconds)) in r
            .interference
            .split
            .tokens
            .iter()
            .zip(r.interference.split.seconds.iter())
            .enumerate()
        {
            if tokens == 0 && seconds == 0.0 {
                continue;
            }
            let split = if bucket == r.buckets.concurrency {
                Arc::clone(&cell)
            } else {
                self.cell(CellKey::of_record(r, bucket))
            };
            split.completion_tokens.increment(tokens);
            split.decode_seconds.record(seconds);
            if r.interference.prefill_overlap_share.is_some() {
                let busy = r
                    .interference
                    .prefill_busy
                    .get(bucket)
                    .copied()
                    .unwrap_or(0.0);
                split.prefill_busy.record(busy);
            }
        }
    }
}
