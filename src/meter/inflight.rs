//! Live concurrency: the in-flight count per (upstream, model) and its time integral.
//!
//! A request's *average active requests* is the time-weighted mean of the in-flight count
//! over its decode interval (first token → last token). Each tracker keeps the exact integral
//! ∫count·dt, updated under a short lock only when a request enters or leaves, so the mean
//! over any interval is (area(end) − area(start)) / (end − start) with no sampling error. The
//! per-event hot path only reads the atomic count (no lock).

use std::collections::HashMap;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::time::Instant;

/// In-flight tracking for one (upstream, model).
///
/// Writers (a request entering or leaving) serialise on a mutex and publish the integral
/// through a sequence lock made of atomics; readers (the per-event path, first-token and
/// end-of-request sampling) never lock: they retry the rare read that overlapped a write.
#[derive(Debug)]
pub struct InflightTracker {
    /// Instant all `since_ns` values count from.
    epoch: Instant,
    writer: Mutex<()>,
    /// Odd while a writer is publishing.
    sequence: AtomicU64,
    count: AtomicU32,
    /// Nanoseconds since `epoch` of the last change.
    since_ns: AtomicU64,
    /// ∫count·dt up to `since_ns`, in request-seconds, as f64 bits.
    area_bits: AtomicU64,
}

impl InflightTracker {
    fn new(now: Instant) -> Self {
        Self {
            epoch: now,
            writer: Mutex::new(()),
            sequence: AtomicU64::new(0),
            count: AtomicU32::new(0),
            since_ns: AtomicU64::new(0),
            area_bits: AtomicU64::new(0f64.to_bits()),
        }
    }

    fn nanos(&self, now: Instant) -> u64 {
        u64::try_from(now.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX)
    }

    /// Current number of requests in flight.
    pub fn current(&self) -> u32 {
        self.count.load(Ordering::Relaxed)
    }

    /// ∫count·dt from creation up to `now` (which must not precede the last change), in
    /// request-seconds. Lock-free.
    pub fn area_at(&self, now: Instant) -> f64 {
        let now_ns = self.nanos(now);
        let integrate = |count: u32, since: u64, area: f64| {
            area + f64::from(count) * (now_ns.saturating_sub(since) as f64 / 1e9)
        };
        for _ in 0..1024 {
            let before = self.sequence.load(Ordering::Acquire);
            if before % 2 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let count = self.count.load(Ordering::Relaxed);
            let since = self.since_ns.load(Ordering::Relaxed);
            let area = f64::from_bits(self.area_bits.load(Ordering::Relaxed));
            fence(Ordering::Acquire);
            if self.sequence.load(Ordering::Relaxed) == before {
                return integrate(count, since, area);
            }
        }
        // A writer kept being preempted mid-publish: wait for it the slow way.
        let _writer = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        integrate(
            self.count.load(Ordering::Relaxed),
            self.since_ns.load(Ordering::Relaxed),
            f64::from_bits(self.area_bits.load(Ordering::Relaxed)),
        )
    }

    fn change(&self, now: Instant, delta: i32) {
        let _writer = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        let now_ns = self.nanos(now);
        let count = self.count.load(Ordering::Relaxed);
        let since = self.since_ns.load(Ordering::Relaxed);
        let area = f64::from_bits(self.area_bits.load(Ordering::Relaxed));
        let elapsed = now_ns.saturating_sub(since) as f64 / 1e9;
        let sequence = self.sequence.load(Ordering::Relaxed);
        self.sequence
            .store(sequence.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        self.area_bits.store(
            (area + f64::from(count) * elapsed).to_bits(),
            Ordering::Relaxed,
        );
        self.since_ns.store(since.max(now_ns), Ordering::Relaxed);
        self.count
            .store(count.saturating_add_signed(delta), Ordering::Relaxed);
        self.sequence
            .store(sequence.wrapping_add(2), Ordering::Release);
    }

    /// Counts a request in; it is counted out when the guard drops.
    pub fn enter(self: &Arc<Self>, now: Instant) -> InflightGuard {
        self.change(now, 1);
        InflightGuard {
            tracker: Arc::clone(self),
        }
    }
}

/// Holds one unit of the in-flight count; every path out of a request drops it.
#[derive(Debug)]
pub struct InflightGuard {
    tracker: Arc<InflightTracker>,
}

impl InflightGuard {
    pub fn tracker(&self) -> &Arc<InflightTracker> {
        &self.tracker
    }
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        self.tracker.change(Instant::now(), -1);
    }
}

/// (upstream, model).
type TrackerKey = (Arc<str>, Arc<str>);

/// All trackers, keyed by (upstream, model). Looked up once per request.
#[derive(Debug, Default)]
pub struct InflightRegistry {
    trackers: Mutex<HashMap<TrackerKey, Arc<InflightTracker>>>,
}

impl InflightRegistry {
    /// The tracker for (upstream, model), created on first use.
    pub fn tracker(&self, upstream: &Arc<str>, model: &Arc<str>) -> Arc<InflightTracker> {
        let mut trackers = self.trackers.lock().unwrap_or_else(PoisonError::into_inner);
        Arc::clone(
            trackers
                .entry((Arc::clone(upstream), Arc::clone(model)))
                .or_insert_with(|| Arc::new(InflightTracker::new(Instant::now()))),
        )
    }

    /// Total in flight across every upstream and model.
    pub fn total(&self) -> u32 {
        let trackers = self.trackers.lock().unwrap_or_else(PoisonError::into_inner);
        trackers.values().map(|t| t.current()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn time_weighted_area_is_exact() {
        let registry = InflightRegistry::default();
        let tracker = registry.tracker(&Arc::from("u"), &Arc::from("m"));
        let t0 = Instant::now();
        let a = tracker.enter(t0);
        let area_at_t0 = tracker.area_at(t0);
        tokio::time::advance(Duration::from_secs(1)).await;
        let b = tracker.enter(Instant::now());
        assert_eq!(tracker.current(), 2);
        tokio::time::advance(Duration::from_secs(1)).await;
        drop(b);
        tokio::time::advance(Duration::from_secs(2)).await;
        let area = tracker.area_at(Instant::now()) - area_at_t0;
        // 1 s at 1, 1 s at 2, 2 s at 1 → 5 request-seconds over 4 s.
        assert!((area - 5.0).abs() < 1e-6, "{area}");
        drop(a);
        assert_eq!(tracker.current(), 0);
        assert_eq!(registry.total(), 0);
    }
}
