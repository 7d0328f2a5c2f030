//! The upstream server's own state per (upstream, model), as its `/metrics` page last showed
//! it, and the exact time integral of each state, so a request learns the time-weighted mean
//! of each over its own interval.
//!
//! A background scraper publishes what it read (a handful of engine-neutral gauges: running
//! and queued requests, KV-cache usage, prefix-cache hit rate) every few seconds. Between
//! scrapes a value is held (a step function). Each tracker keeps, per gauge, ∫value·dt and
//! ∫\[known\]·dt (the time the value was known), so the mean over any interval is
//! Δarea ÷ Δknown, with no sampling error beyond the scrape itself. A request reads the
//! integrals at its head in and at its end, without a lock (a sequence lock of atomics, as
//! the in-flight tracker does); the scraper, the only writer, takes a short mutex per scrape.
//! A gauge the server does not expose, or a scrape that failed, leaves the value unknown:
//! time without a value is not counted, and a request that saw none gets no figure.

use std::collections::HashMap;
use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::base::lock::lock;

use tokio::sync::Notify;
use tokio::time::Instant;

/// An engine-neutral reading of an upstream's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ServerGauge {
    /// Requests the server is running (in its batch): sglang `num_running_reqs`, vLLM
    /// `num_requests_running`.
    RunningRequests,
    /// Requests waiting for a place in the batch: sglang `num_queue_reqs`, vLLM
    /// `num_requests_waiting`.
    QueuedRequests,
    /// Share (0–1) of the KV cache in use: sglang `token_usage`, vLLM `kv_cache_usage_perc`.
    KvCacheUsage,
    /// Share (0–1) of prompt tokens found in the prefix cache: sglang `cache_hit_rate`; vLLM
    /// Δ`prefix_cache_hits` ÷ Δ`prefix_cache_queries` between two scrapes.
    PrefixCacheHitRate,
}

/// How many gauges there are.
pub const GAUGES: usize = 4;

impl ServerGauge {
    pub const ALL: [ServerGauge; GAUGES] = [
        ServerGauge::RunningRequests,
        ServerGauge::QueuedRequests,
        ServerGauge::KvCacheUsage,
        ServerGauge::PrefixCacheHitRate,
    ];

    /// The name used in the matrix document and the CSV header.
    pub fn label(self) -> &'static str {
        match self {
            ServerGauge::RunningRequests => "running_requests",
            ServerGauge::QueuedRequests => "queued_requests",
            ServerGauge::KvCacheUsage => "kv_cache_usage",
            ServerGauge::PrefixCacheHitRate => "prefix_cache_hit_rate",
        }
    }

    pub fn index(self) -> usize {
        match self {
            ServerGauge::RunningRequests => 0,
            ServerGauge::QueuedRequests => 1,
            ServerGauge::KvCacheUsage => 2,
            ServerGauge::PrefixCacheHitRate => 3,
        }
    }
}

/// One value per gauge; `None` where the server did not say.
pub type GaugeValues = [Option<f64>; GAUGES];

/// The mean of one gauge over a request's interval, and how long the value was known in it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StateMean {
    pub mean: f64,
    /// Seconds of the interval during which a scrape had given a value (the weight of this
    /// mean when requests are combined).
    pub known_seconds: f64,
}

/// What one request saw of its server's state: per gauge, the time-weighted mean over the
/// request's interval (head in → end), or `None` when no scrape covered any of it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ServerStateMeans(pub [Option<StateMean>; GAUGES]);

impl ServerStateMeans {
    pub fn get(&self, gauge: ServerGauge) -> Option<StateMean> {
        self.0.get(gauge.index()).copied().flatten()
    }

    pub fn is_empty(&self) -> bool {
        self.0.iter().all(Option::is_none)
    }
}

/// The integrals of every gauge at an instant.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StateReading {
    /// ∫value·dt over the time the value was known.
    area: [f64; GAUGES],
    /// ∫[value known]·dt.
    known: [f64; GAUGES],
}

impl StateReading {
    /// The means between `start` (an earlier reading of the same tracker) and `self`.
    pub fn means_since(&self, start: &StateReading) -> ServerStateMeans {
        let mut means = [None; GAUGES];
        for (i, mean) in means.iter_mut().enumerate() {
            let known = self.known.get(i).copied().unwrap_or(0.0)
                - start.known.get(i).copied().unwrap_or(0.0);
            let area = self.area.get(i).copied().unwrap_or(0.0)
                - start.area.get(i).copied().unwrap_or(0.0);
            if known > 0.0 && known.is_finite() && area.is_finite() {
                *mean = Some(StateMean {
                    mean: (area / known).max(0.0),
                    known_seconds: known,
                });
            }
        }
        ServerStateMeans(means)
    }
}

/// The step-function integrals of one (upstream, model).
///
/// One writer at a time (the scraper) serialises on a mutex and publishes through a sequence
/// lock; readers (a request at its start and end) never lock.
#[derive(Debug)]
pub struct ServerStateTracker {
    epoch: Instant,
    writer: Mutex<()>,
    /// Odd while a writer is publishing.
    sequence: AtomicU64,
    /// Nanoseconds since `epoch` of the last publish.
    since_ns: AtomicU64,
    /// The value held since `since_ns`, as f64 bits; NaN when unknown.
    values: [AtomicU64; GAUGES],
    /// ∫value·dt up to `since_ns`, as f64 bits.
    areas: [AtomicU64; GAUGES],
    /// ∫[value known]·dt up to `since_ns`, in seconds, as f64 bits.
    known: [AtomicU64; GAUGES],
}

#[derive(Clone, Copy)]
struct Snapshot {
    since: u64,
    values: [f64; GAUGES],
    areas: [f64; GAUGES],
    known: [f64; GAUGES],
}

fn bits(value: f64) -> AtomicU64 {
    AtomicU64::new(value.to_bits())
}

impl ServerStateTracker {
    pub fn new(now: Instant) -> Self {
        Self {
            epoch: now,
            writer: Mutex::new(()),
            sequence: AtomicU64::new(0),
            since_ns: AtomicU64::new(0),
            values: std::array::from_fn(|_| bits(f64::NAN)),
            areas: std::array::from_fn(|_| bits(0.0)),
            known: std::array::from_fn(|_| bits(0.0)),
        }
    }

    fn nanos(&self, now: Instant) -> u64 {
        u64::try_from(now.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX)
    }

    fn load(&self) -> Snapshot {
        let read = |cells: &[AtomicU64; GAUGES]| {
            std::array::from_fn(|i| {
                cells
                    .get(i)
                    .map_or(f64::NAN, |c| f64::from_bits(c.load(Ordering::Relaxed)))
            })
        };
        Snapshot {
            since: self.since_ns.load(Ordering::Relaxed),
            values: read(&self.values),
            areas: read(&self.areas),
            known: read(&self.known),
        }
    }

    fn integrate(snapshot: &Snapshot, now_ns: u64) -> StateReading {
        let elapsed = now_ns.saturating_sub(snapshot.since) as f64 / 1e9;
        let mut reading = StateReading {
            area: snapshot.areas,
            known: snapshot.known,
        };
        for (i, value) in snapshot.values.iter().enumerate() {
            if value.is_nan() {
                continue;
            }
            if let (Some(area), Some(known)) = (reading.area.get_mut(i), reading.known.get_mut(i)) {
                *area += value * elapsed;
                *known += elapsed;
            }
        }
        reading
    }

    /// Every integral at `now`, read consistently. Lock-free: retries a read that overlapped
    /// the writer.
    pub fn reading(&self, now: Instant) -> StateReading {
        let now_ns = self.nanos(now);
        for _ in 0..1024 {
            let before = self.sequence.load(Ordering::Acquire);
            if before % 2 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let snapshot = self.load();
            fence(Ordering::Acquire);
            if self.sequence.load(Ordering::Relaxed) == before {
                return Self::integrate(&snapshot, now_ns);
            }
        }
        // The writer kept being preempted mid-publish: wait for it the slow way.
        let _writer = lock(&self.writer);
        Self::integrate(&self.load(), now_ns)
    }

    /// The values held now (`None` where unknown).
    pub fn current(&self) -> GaugeValues {
        let snapshot = self.load();
        snapshot.values.map(|v| (!v.is_nan()).then_some(v))
    }

    /// From `now` on, holds `values` (a value that is not a finite number ≥ 0 is unknown).
    pub fn publish(&self, now: Instant, values: GaugeValues) {
        let _writer = lock(&self.writer);
        let now_ns = self.nanos(now);
        let old = self.load();
        let reading = Self::integrate(&old, now_ns);
        let sequence = self.sequence.load(Ordering::Relaxed);
        self.sequence
            .store(sequence.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        for i in 0..GAUGES {
            let value = values
                .get(i)
                .copied()
                .flatten()
                .filter(|v| v.is_finite() && *v >= 0.0)
                .unwrap_or(f64::NAN);
            let store = |cells: &[AtomicU64; GAUGES], v: f64| {
                if let Some(cell) = cells.get(i) {
                    cell.store(v.to_bits(), Ordering::Relaxed);
                }
            };
            store(&self.values, value);
            store(&self.areas, reading.area.get(i).copied().unwrap_or(0.0));
            store(&self.known, reading.known.get(i).copied().unwrap_or(0.0));
        }
        self.since_ns
            .store(old.since.max(now_ns), Ordering::Relaxed);
        self.sequence
            .store(sequence.wrapping_add(2), Ordering::Release);
    }
}

/// What became of one scrape of an upstream's `/metrics` (a bounded label set).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScrapeOutcome {
    /// Read and parsed (whether or not it held a known metric).
    Ok,
    /// No connection, or the connection broke.
    Unreachable,
    /// An answer other than 200.
    Status,
    /// No whole answer within the scrape timeout.
    Timeout,
    /// The page was larger than the body bound; not read further.
    TooLarge,
    /// Not UTF-8 text, or text without one metric tokentap knows (not an engine's page).
    Unreadable,
}

impl ScrapeOutcome {
    pub const ALL: [ScrapeOutcome; 6] = [
        ScrapeOutcome::Ok,
        ScrapeOutcome::Unreachable,
        ScrapeOutcome::Status,
        ScrapeOutcome::Timeout,
        ScrapeOutcome::TooLarge,
        ScrapeOutcome::Unreadable,
    ];

    pub fn label(self) -> &'static str {
        match self {
            ScrapeOutcome::Ok => "ok",
            ScrapeOutcome::Unreachable => "unreachable",
            ScrapeOutcome::Status => "status",
            ScrapeOutcome::Timeout => "timeout",
            ScrapeOutcome::TooLarge => "too_large",
            ScrapeOutcome::Unreadable => "unreadable",
        }
    }

    fn index(self) -> usize {
        match self {
            ScrapeOutcome::Ok => 0,
            ScrapeOutcome::Unreachable => 1,
            ScrapeOutcome::Status => 2,
            ScrapeOutcome::Timeout => 3,
            ScrapeOutcome::TooLarge => 4,
            ScrapeOutcome::Unreadable => 5,
        }
    }
}

/// Most models tracked per upstream: the models requests name are already capped by
/// `metering.max_models`; this bounds what a server's page can add on top.
pub const MAX_MODELS_PER_UPSTREAM: usize = 64;

/// The trackers and scrape counts of one scraped upstream.
#[derive(Debug, Default)]
struct UpstreamState {
    models: HashMap<Arc<str>, Arc<ServerStateTracker>>,
    scrapes: Arc<[AtomicU64; ScrapeOutcome::ALL.len()]>,
    /// Wakes the upstream's scraper for a read now (see [`ServerStateRegistry::scrape_now`]).
    kick: Arc<Notify>,
}

impl UpstreamState {
    fn scrapes_done(&self) -> u64 {
        self.scrapes.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }
}

/// Every scraped upstream's trackers, keyed by upstream then model. Looked up once per request
/// (and not at all while no upstream is scraped).
#[derive(Debug, Default)]
pub struct ServerStateRegistry {
    any: AtomicBool,
    upstreams: Mutex<HashMap<Arc<str>, UpstreamState>>,
}

/// One row of [`ServerStateRegistry::current`].
#[derive(Debug, Clone)]
pub struct CurrentState {
    pub upstream: Arc<str>,
    pub model: Arc<str>,
    pub values: GaugeValues,
}

impl ServerStateRegistry {
    /// Marks `upstream` as scraped: requests to it from now on read its trackers.
    pub fn watch(&self, upstream: &Arc<str>) {
        self.any.store(true, Ordering::Relaxed);
        lock(&self.upstreams)
            .entry(Arc::clone(upstream))
            .or_default();
    }

    /// The tracker of (upstream, model), created on first use; `None` when the upstream is not
    /// scraped (or already tracks [`MAX_MODELS_PER_UPSTREAM`] other models).
    pub fn tracker(
        &self,
        upstream: &Arc<str>,
        model: &Arc<str>,
    ) -> Option<Arc<ServerStateTracker>> {
        if !self.any.load(Ordering::Relaxed) {
            return None;
        }
        let mut upstreams = lock(&self.upstreams);
        let state = upstreams.get_mut(upstream)?;
        if let Some(tracker) = state.models.get(model) {
            return Some(Arc::clone(tracker));
        }
        if state.models.len() >= MAX_MODELS_PER_UPSTREAM {
            return None;
        }
        let tracker = Arc::new(ServerStateTracker::new(Instant::now()));
        state.models.insert(Arc::clone(model), Arc::clone(&tracker));
        Some(tracker)
    }

    /// Every tracker of `upstream`, by model.
    pub fn trackers(&self, upstream: &str) -> Vec<(Arc<str>, Arc<ServerStateTracker>)> {
        let upstreams = lock(&self.upstreams);
        upstreams.get(upstream).map_or_else(Vec::new, |state| {
            state
                .models
                .iter()
                .map(|(model, tracker)| (Arc::clone(model), Arc::clone(tracker)))
                .collect()
        })
    }

    /// What wakes `upstream`'s scraper before its interval is up (`None`: not scraped).
    pub fn kick_signal(&self, upstream: &str) -> Option<Arc<Notify>> {
        let upstreams = lock(&self.upstreams);
        upstreams.get(upstream).map(|state| Arc::clone(&state.kick))
    }

    /// Asks `upstream`'s scraper for a read now, for a caller that knows the server's state has
    /// just changed (a sweep between cells: the value held from the last interval's read would
    /// stand for up to an interval). Returns the scrapes finished so far, to wait on with
    /// [`Self::scrapes_done`]; `None` when the upstream is not scraped.
    pub fn scrape_now(&self, upstream: &str) -> Option<u64> {
        let upstreams = lock(&self.upstreams);
        let state = upstreams.get(upstream)?;
        state.kick.notify_one();
        Some(state.scrapes_done())
    }

    /// Scrapes of `upstream` finished so far, whatever their outcome.
    pub fn scrapes_done(&self, upstream: &str) -> u64 {
        let upstreams = lock(&self.upstreams);
        upstreams
            .get(upstream)
            .map_or(0, UpstreamState::scrapes_done)
    }

    /// Counts one scrape of `upstream`.
    pub fn count_scrape(&self, upstream: &str, outcome: ScrapeOutcome) {
        let upstreams = lock(&self.upstreams);
        if let Some(count) = upstreams
            .get(upstream)
            .and_then(|state| state.scrapes.get(outcome.index()))
        {
            count.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Scrapes of `upstream` so far with `outcome`.
    pub fn scrapes(&self, upstream: &str, outcome: ScrapeOutcome) -> u64 {
        let upstreams = lock(&self.upstreams);
        upstreams
            .get(upstream)
            .and_then(|state| state.scrapes.get(outcome.index()))
            .map_or(0, |count| count.load(Ordering::Relaxed))
    }

    /// The scraped upstreams' names.
    pub fn upstreams(&self) -> Vec<Arc<str>> {
        let upstreams = lock(&self.upstreams);
        upstreams.keys().cloned().collect()
    }

    /// The values held now by every tracker (for `/metrics`).
    pub fn current(&self) -> Vec<CurrentState> {
        let upstreams = lock(&self.upstreams);
        let mut rows = Vec::new();
        for (upstream, state) in upstreams.iter() {
            for (model, tracker) in &state.models {
                rows.push(CurrentState {
                    upstream: Arc::clone(upstream),
                    model: Arc::clone(model),
                    values: tracker.current(),
                });
            }
        }
        rows
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[tokio::test(start_paused = true)]
    async fn means_are_exact_over_a_step_function_and_skip_unknown_time() {
        let t0 = Instant::now();
        let at = |s: f64| t0 + Duration::from_secs_f64(s);
        let tracker = ServerStateTracker::new(t0);
        // Nothing known before the first scrape.
        let before = tracker.reading(at(0.0));
        tracker.publish(at(1.0), [Some(2.0), Some(0.0), None, Some(0.5)]);
        tracker.publish(at(3.0), [Some(6.0), Some(1.0), None, None]);
        // A failed scrape: nothing known from 4 to 5.
        tracker.publish(at(4.0), [None; GAUGES]);
        tracker.publish(at(5.0), [Some(4.0), Some(1.0), None, None]);
        let after = tracker.reading(at(6.0));
        let means = after.means_since(&before);
        // Running: 2 for 2 s, 6 for 1 s, unknown for 1 s, 4 for 1 s → 14 / 4.
        let running = means.get(ServerGauge::RunningRequests).unwrap();
        assert!(close(running.mean, 3.5), "{running:?}");
        assert!(close(running.known_seconds, 4.0));
        let queued = means.get(ServerGauge::QueuedRequests).unwrap();
        assert!(close(queued.mean, 0.5), "{queued:?}");
        assert_eq!(means.get(ServerGauge::KvCacheUsage), None);
        let hit = means.get(ServerGauge::PrefixCacheHitRate).unwrap();
        assert!(close(hit.mean, 0.5) && close(hit.known_seconds, 2.0));
        // An interval inside one step sees that step's value.
        let inner = tracker
            .reading(at(5.75))
            .means_since(&tracker.reading(at(5.25)));
        assert!(close(
            inner.get(ServerGauge::RunningRequests).unwrap().mean,
            4.0
        ));
        assert_eq!(tracker.current()[0], Some(4.0));
        assert_eq!(tracker.current()[2], None);
    }

    #[test]
    fn garbage_values_are_unknown() {
        let t0 = Instant::now();
        let tracker = ServerStateTracker::new(t0);
        tracker.publish(
            t0,
            [Some(f64::NAN), Some(-1.0), Some(f64::INFINITY), Some(0.2)],
        );
        assert_eq!(tracker.current(), [None, None, None, Some(0.2)]);
    }

    #[test]
    fn only_watched_upstreams_get_trackers_and_models_are_bounded() {
        let registry = ServerStateRegistry::default();
        let upstream: Arc<str> = Arc::from("u");
        assert!(registry.tracker(&upstream, &Arc::from("m")).is_none());
        registry.watch(&upstream);
        let a = registry.tracker(&upstream, &Arc::from("m")).unwrap();
        let b = registry.tracker(&upstream, &Arc::from("m")).unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        assert!(registry
            .tracker(&Arc::from("other"), &Arc::from("m"))
            .is_none());
        for i in 0..2 * MAX_MODELS_PER_UPSTREAM {
            let _ = registry.tracker(&upstream, &Arc::from(format!("m{i}").as_str()));
        }
        assert_eq!(registry.trackers("u").len(), MAX_MODELS_PER_UPSTREAM);
        registry.count_scrape("u", ScrapeOutcome::Timeout);
        assert_eq!(registry.scrapes("u", ScrapeOutcome::Timeout), 1);
        assert_eq!(registry.scrapes("u", ScrapeOutcome::Ok), 0);
    }
}
