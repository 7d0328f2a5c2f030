//! Live concurrency and prefill interference per (upstream, model): the in-flight count, the
//! count of requests in their prefill phase, and their exact time integrals.
//!
//! A request's *average active requests* is the time-weighted mean of the in-flight count
//! over its decode interval (first token → last token). Each tracker keeps the exact integral
//! ∫count·dt, updated under a short lock only when a request enters or leaves, so the mean
//! over any interval is (area(end) − area(start)) / (end − start) with no sampling error. The
//! per-event hot path only reads (no lock).
//!
//! *Prefill interference* works the same way. A request is in prefill from its head in to its
//! first token. The tracker keeps the number of requests in prefill, how many prefills ever
//! began, and ∫[prefilling ≥ 1]·dt. A request reads them at its first token (just after
//! leaving prefill itself, so its own prefill is never counted) and at each later token, and
//! gets, exactly and without per-event work: the share of its decode interval during which
//! another request was in prefill, and how many prefills overlapped that interval (those in
//! progress at its first token plus those begun before its last). Leaving prefill is a change
//! like entering: one short writer lock per request at its first token, never per event.

use std::collections::HashMap;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::time::Instant;

use crate::base::lock;

use super::buckets::MAX_LADDER;

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
    /// Requests between head in and first token.
    prefilling: AtomicU32,
    /// Prefills begun since creation (monotonic).
    prefill_starts: AtomicU64,
    /// ∫[prefilling ≥ 1]·dt up to `since_ns`, in seconds, as f64 bits.
    prefill_busy_bits: AtomicU64,
}

/// One consistent reading of a tracker's integrals at an instant.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TrackerReading {
    /// ∫inflight·dt, request-seconds.
    pub inflight_area: f64,
    /// ∫[prefilling ≥ 1]·dt, seconds.
    pub prefill_busy: f64,
    /// Requests in prefill now.
    pub prefilling: u32,
    /// Prefills begun so far.
    pub prefill_starts: u64,
}

/// The raw fields a seqlock read copies.
#[derive(Clone, Copy)]
struct Snapshot {
    count: u32,
    since: u64,
    area: f64,
    prefilling: u32,
    prefill_starts: u64,
    prefill_busy: f64,
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
            prefilling: AtomicU32::new(0),
            prefill_starts: AtomicU64::new(0),
            prefill_busy_bits: AtomicU64::new(0f64.to_bits()),
        }
    }

    fn load(&self) -> Snapshot {
        Snapshot {
            count: self.count.load(Ordering::Relaxed),
            since: self.since_ns.load(Ordering::Relaxed),
            area: f64::from_bits(self.area_bits.load(Ordering::Relaxed)),
            prefilling: self.prefilling.load(Ordering::Relaxed),
            prefill_starts: self.prefill_starts.load(Ordering::Relaxed),
            prefill_busy: f64::from_bits(self.prefill_busy_bits.load(Ordering::Relaxed)),
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
        self.reading(now).inflight_area
    }

    /// Every integral at `now` (which must not precede the last change), read consistently.
    /// Lock-free: retries a read that overlapped a writer.
    pub fn reading(&self, now: Instant) -> TrackerReading {
        let now_ns = self.nanos(now);
        let integrate = |s: Snapshot| {
            let elapsed = now_ns.saturating_sub(s.since) as f64 / 1e9;
            TrackerReading {
                inflight_area: s.area + f64::from(s.count) * elapsed,
                prefill_busy: s.prefill_busy + if s.prefilling > 0 { elapsed } else { 0.0 },
                prefilling: s.prefilling,
                prefill_starts: s.prefill_starts,
            }
        };
        for _ in 0..1024 {
            let before = self.sequence.load(Ordering::Acquire);
            if before % 2 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let snapshot = self.load();
            fence(Ordering::Acquire);
            if self.sequence.load(Ordering::Relaxed) == before {
                return integrate(snapshot);
            }
        }
        // A writer kept being preempted mid-publish: wait for it the slow way.
        let _writer = lock::lock(&self.writer);
        integrate(self.load())
    }

    /// Applies `inflight` and `prefill` deltas at `now` and returns the reading just after.
    fn change(&self, now: Instant, inflight: i32, prefill: i32) -> TrackerReading {
        let _writer = lock::lock(&self.writer);
        let now_ns = self.nanos(now);
        let old = self.load();
        let elapsed = now_ns.saturating_sub(old.since) as f64 / 1e9;
        let area = old.area + f64::from(old.count) * elapsed;
        let prefill_busy = old.prefill_busy + if old.prefilling > 0 { elapsed } else { 0.0 };
        let prefilling = old.prefilling.saturating_add_signed(prefill);
        let prefill_starts = old.prefill_starts + u64::from(prefill > 0);
        let sequence = self.sequence.load(Ordering::Relaxed);
        self.sequence
            .store(sequence.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        self.area_bits.store(area.to_bits(), Ordering::Relaxed);
        self.prefill_busy_bits
            .store(prefill_busy.to_bits(), Ordering::Relaxed);
        self.since_ns
            .store(old.since.max(now_ns), Ordering::Relaxed);
        self.count
            .store(old.count.saturating_add_signed(inflight), Ordering::Relaxed);
        self.prefilling.store(prefilling, Ordering::Relaxed);
        self.prefill_starts.store(prefill_starts, Ordering::Relaxed);
        self.sequence
            .store(sequence.wrapping_add(2), Ordering::Release);
        TrackerReading {
            inflight_area: area,
            prefill_busy,
            prefilling,
            prefill_starts,
        }
    }

    /// Counts a request in, in its prefill phase; it is counted out of prefill by
    /// [`InflightGuard::end_prefill`] and out of everything when the guard drops.
    pub fn enter(self: &Arc<Self>, now: Instant) -> InflightGuard {
        self.change(now, 1, 1);
        InflightGuard {
            tracker: Arc::clone(self),
            in_prefill: true,
        }
    }

    /// Requests in their prefill phase now.
    pub fn prefilling(&self) -> u32 {
        self.prefilling.load(Ordering::Relaxed)
    }
}

/// Holds one unit of the in-flight count (and, until the first token, of the prefill count);
/// every path out of a request drops it.
#[derive(Debug)]
pub struct InflightGuard {
    tracker: Arc<InflightTracker>,
    in_prefill: bool,
}

impl InflightGuard {
    pub fn tracker(&self) -> &Arc<InflightTracker> {
        &self.tracker
    }

    /// Whether this request is still in its prefill phase (no token yet).
    pub fn in_prefill(&self) -> bool {
        self.in_prefill
    }

    /// Ends this request's prefill phase at `now` (its first token) and returns the reading
    /// just after, so the request's own prefill is not among the ones it sees. Later calls
    /// only read.
    pub fn end_prefill(&mut self, now: Instant) -> TrackerReading {
        if std::mem::take(&mut self.in_prefill) {
            self.tracker.change(now, 0, -1)
        } else {
            self.tracker.reading(now)
        }
    }
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        let prefill = if self.in_prefill { -1 } else { 0 };
        self.tracker.change(Instant::now(), -1, prefill);
    }
}

/// What one request reads of the prefill integrals over its decode interval (declaration
/// order kept, `repr(C)`: the per-event fields first, beside the meter's).
#[derive(Debug, Clone, Copy, PartialEq)]
#[repr(C)]
pub struct InterferenceSpan {
    /// The reading at the first token (after leaving prefill), if there was one.
    first: Option<TrackerReading>,
    /// The reading at the latest token.
    last: TrackerReading,
    /// Seconds of each gap under another prefill, by the concurrency bucket of the event that
    /// ended the gap (the same split as the timeline's decode seconds).
    pub busy_by_bucket: [f64; MAX_LADDER],
}

impl Default for InterferenceSpan {
    fn default() -> Self {
        Self {
            first: None,
            last: TrackerReading::default(),
            busy_by_bucket: [0.0; MAX_LADDER],
        }
    }
}

impl InterferenceSpan {
    /// Notes the reading taken at a token event whose concurrency bucket is `bucket`.
    pub fn at_token(&mut self, reading: TrackerReading, bucket: usize) {
        if self.first.is_none() {
            self.first = Some(reading);
        } else if let Some(busy) = self.busy_by_bucket.get_mut(bucket) {
            *busy += (reading.prefill_busy - self.last.prefill_busy).max(0.0);
        }
        self.last = reading;
    }

    /// The share of a `decode_seconds` decode interval during which at least one other
    /// request was in prefill, and the number of prefills that overlapped it; `None` without
    /// a decode interval (fewer than two token events, or no time between them).
    pub fn result(&self, decode_seconds: f64) -> Option<(f64, u32)> {
        let first = self.first?;
        if decode_seconds <= 0.0 || !decode_seconds.is_finite() {
            return None;
        }
        let busy = (self.last.prefill_busy - first.prefill_busy).max(0.0);
        let share = (busy / decode_seconds).clamp(0.0, 1.0);
        let begun = self
            .last
            .prefill_starts
            .saturating_sub(first.prefill_starts);
        let overlapped = u64::from(first.prefilling).saturating_add(begun);
        Some((share, u32::try_from(overlapped).unwrap_or(u32::MAX)))
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
        let mut trackers = lock::lock(&self.trackers);
        Arc::clone(
            trackers
                .entry((Arc::clone(upstream), Arc::clone(model)))
                .or_insert_with(|| Arc::new(InflightTracker::new(Instant::now()))),
        )
    }

    /// In flight now on (`upstream`, `model`): 0 when no request of it was ever seen (no
    /// tracker is created for asking).
    pub fn current(&self, upstream: &str, model: &str) -> u32 {
        let trackers = lock::lock(&self.trackers);
        trackers
            .iter()
            .find(|((u, m), _)| &**u == upstream && &**m == model)
            .map_or(0, |(_, tracker)| tracker.current())
    }

    /// Total in flight across every upstream and model.
    pub fn total(&self) -> u32 {
        let trackers = lock::lock(&self.trackers);
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

    #[tokio::test(start_paused = true)]
    async fn prefill_interference_is_exact_and_excludes_the_request_itself() {
        let registry = InflightRegistry::default();
        let tracker = registry.tracker(&Arc::from("u"), &Arc::from("m"));
        let t0 = Instant::now();
        let at = |s: f64| t0 + Duration::from_secs_f64(s);
        // A: head in at 0, first token at 1, last token at 5.
        let mut a = tracker.enter(at(0.0));
        let mut a_span = InterferenceSpan::default();
        a_span.at_token(a.end_prefill(at(1.0)), 0);
        assert_eq!(tracker.prefilling(), 0);
        // B: head in at 2, first token at 3 (A sees 1 s of it), last token at 4.
        let mut b = tracker.enter(at(2.0));
        assert_eq!(tracker.prefilling(), 1);
        let mut b_span = InterferenceSpan::default();
        b_span.at_token(b.end_prefill(at(3.0)), 0);
        // C: head in at 3.5, never answers, gone at 4.5 (A sees 1 s, B sees 0.5 s).
        let c = tracker.enter(at(3.5));
        b_span.at_token(b.end_prefill(at(4.0)), 1);
        tokio::time::advance(Duration::from_secs_f64(4.5)).await;
        drop(c);
        assert_eq!(tracker.prefilling(), 0);
        a_span.at_token(tracker.reading(at(5.0)), 1);

        let (share, overlapped) = a_span.result(4.0).unwrap();
        assert!((share - 0.5).abs() < 1e-9, "{share}");
        assert_eq!(overlapped, 2);
        // A's one gap (1 → 5) ended at bucket 1: all 2 s of overlap go there.
        assert!((a_span.busy_by_bucket[1] - 2.0).abs() < 1e-9);
        assert_eq!(a_span.busy_by_bucket[0], 0.0);
        // B's own prefill (2 → 3) is not counted: only C's 0.5 s of its 1 s decode.
        let (share, overlapped) = b_span.result(1.0).unwrap();
        assert!((share - 0.5).abs() < 1e-9, "{share}");
        assert_eq!(overlapped, 1);
        // A single token: no decode interval, no figure.
        let mut single = InterferenceSpan::default();
        single.at_token(tracker.reading(at(5.0)), 0);
        assert_eq!(single.result(0.0), None);
        drop((a, b));
        assert_eq!(tracker.current(), 0);
    }
}
