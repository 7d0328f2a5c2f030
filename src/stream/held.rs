//! One memory budget for the answers tokentap holds (`metering.max_held_bytes`): a
//! non-streamed answer on a metered route (and a stream not labelled `text/event-stream`) is
//! copied as it passes so that its usage can be read at its end, and, when its client asked for
//! its timing, that same copy is what the client gets after the `Server-Timing` head. Request
//! bodies have a budget of their own (`metering.max_buffered_bytes`); without this one, 50
//! clients with 8 MB answers made a sidecar hold 400 MB.
//!
//! Every byte of capacity a [`HeldBuffer`] allocates is reserved from the [`HeldBudget`]
//! first, and handed back when the buffer (or the `Bytes` made of it) is dropped. When the
//! budget cannot cover the next frame, the answer passes through unheld (counted as
//! `tokentap_faults_total{fault="answer_unheld"}`) and its buffer is released at once. Per
//! frame of a held answer: one atomic update when the buffer grows (capacity doubles), none
//! otherwise.
//!
//! The same budget covers the one thing an SSE stream holds: the copy of an event that
//! straddles frames ([`EventBytes`], the scanner's and the edit queue's), past a small free
//! part per copy, freed when the event ends (`fault="event_unheld"` when it cannot be covered).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;

use crate::net::faults::{Fault, FaultCounters};

/// The bytes every held answer may take together.
#[derive(Debug)]
pub struct HeldBudget {
    limit: usize,
    held: AtomicUsize,
    faults: Arc<FaultCounters>,
}

impl HeldBudget {
    pub fn new(limit: usize, faults: Arc<FaultCounters>) -> Arc<Self> {
        Arc::new(Self {
            limit,
            held: AtomicUsize::new(0),
            faults,
        })
    }

    /// Bytes held now, over all answers.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    /// The budget (`metering.max_held_bytes`).
    pub fn limit(&self) -> usize {
        self.limit
    }

    fn reserve(&self, bytes: usize) -> bool {
        self.held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                held.checked_add(bytes).filter(|total| *total <= self.limit)
            })
            .is_ok()
    }

    fn release(&self, bytes: usize) {
        self.held.fetch_sub(bytes, Ordering::AcqRel);
    }
}

/// What [`HeldBuffer::push`] did with a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Push {
    /// Appended.
    Held,
    /// The answer is longer than the buffer's own limit (`metering.max_parse_bytes`).
    OverLimit,
    /// The shared budget cannot cover it (counted once per answer).
    OverBudget,
}

/// The copy of one answer, its capacity reserved from the budget (none: unbounded, for the
/// benches and the pure tests).
#[derive(Debug)]
pub struct HeldBuffer {
    bytes: Vec<u8>,
    reserved: usize,
    budget: Option<Arc<HeldBudget>>,
    /// The answer's declared length: growth stops there (an honest answer reserves exactly
    /// its length), but it is reserved only as its bytes arrive.
    declared: Option<usize>,
}

/// What a [`HeldBuffer::for_length`] reserves before a byte of the answer has arrived: a
/// declared length is the upstream's word, and one that declares the whole budget and then
/// stalls must not keep every other answer from being held (issue 62).
pub const FIRST_RESERVE: usize = 64 << 10;

impl HeldBuffer {
    pub fn new(budget: Option<Arc<HeldBudget>>) -> Self {
        Self {
            bytes: Vec::new(),
            reserved: 0,
            budget,
            declared: None,
        }
    }

    /// A buffer for an answer whose length its head declares (its `Content-Length`), at most
    /// [`FIRST_RESERVE`] of it reserved now and the rest as it arrives (doubling, never past
    /// the declared length); else why not (over the limit, or not even the first reservation:
    /// the copy is never begun, and nothing is held for it). An answer whose bytes then find
    /// the budget spent stops being held half-way, as one without a length does: the proxy
    /// forwards what was held, then the rest.
    pub fn for_length(
        budget: Option<Arc<HeldBudget>>,
        length: usize,
        limit: usize,
    ) -> Result<Self, Push> {
        if length > limit {
            return Err(Push::OverLimit);
        }
        let mut buffer = Self::new(budget);
        let first = length.min(FIRST_RESERVE);
        if !buffer.take(first) {
            if let Some(budget) = &buffer.budget {
                budget.faults.add(Fault::AnswerUnheld);
            }
            return Err(Push::OverBudget);
        }
        buffer.bytes.reserve_exact(first);
        buffer.reserved = first;
        buffer.declared = Some(length);
        Ok(buffer)
    }

    pub fn as_slice(&self) -> &[u8] {
        &self.bytes
    }

    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// Appends `data` if the answer stays within `limit` and the budget covers the capacity
    /// it needs; else leaves the buffer as it was.
    pub fn push(&mut self, data: &[u8], limit: usize) -> Push {
        let needed = match self.bytes.len().checked_add(data.len()) {
            Some(needed) if needed <= limit => needed,
            _ => return Push::OverLimit,
        };
        if needed > self.reserved {
            // Double as `Vec` would, within the limit; the exact size when the budget cannot
            // cover the doubling.
            let most = self.declared.map_or(limit, |declared| declared.min(limit));
            let doubled = self
                .reserved
                .saturating_mul(2)
                .clamp(needed, most.max(needed));
            let grown = [doubled, needed]
                .into_iter()
                .find(|capacity| self.take(capacity - self.reserved));
            let Some(capacity) = grown else {
                if let Some(budget) = &self.budget {
                    budget.faults.add(Fault::AnswerUnheld);
                }
                return Push::OverBudget;
            };
            self.bytes.reserve_exact(capacity - self.bytes.len());
            self.reserved = capacity;
        }
        self.bytes.extend_from_slice(data);
        Push::Held
    }

    fn take(&self, bytes: usize) -> bool {
        self.budget
            .as_ref()
            .is_none_or(|budget| budget.reserve(bytes))
    }

    /// Frees the copy and hands its reservation back now (an answer that will pass unheld).
    pub fn release(&mut self) {
        self.bytes = Vec::new();
        if let Some(budget) = &self.budget {
            budget.release(self.reserved);
        }
        self.reserved = 0;
    }

    /// The copy as `Bytes` for the client; its reservation is handed back when the last of
    /// them is dropped (once the connection has written it).
    pub fn into_bytes(self) -> Bytes {
        if self.bytes.is_empty() {
            return Bytes::new();
        }
        Bytes::from_owner(self)
    }
}

impl AsRef<[u8]> for HeldBuffer {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

impl Drop for HeldBuffer {
    fn drop(&mut self) {
        self.release();
    }
}

/// Capacity an open event's copy may keep without drawing on the budget: engines' events are
/// a few hundred bytes (a usage chunk, a delta with its logprobs), so a stream's ordinary
/// events never touch the shared counter; only one that grows past this does.
pub const FREE_EVENT_BYTES: usize = 8 * 1024;

/// The copy of one SSE event that straddles frames (the scanner's, and the edit queue's when
/// it rewrites the stream): its capacity past [`FREE_EVENT_BYTES`] is reserved from the
/// [`HeldBudget`], and freed, reservation and all, as soon as the event ends. 50 streams with
/// one open 1 MB event each held 109 MiB outside the budget before (capacity kept after every
/// event); now they hold what the budget allows, and an event it cannot cover is not kept
/// (the caller reads it as too large: it passes through untouched, its figures unread).
#[derive(Debug, Default)]
pub struct EventBytes {
    bytes: Vec<u8>,
    /// Bytes of capacity reserved from the budget (at most the event limit, which is a `u32`
    /// in every configuration: `metering.max_event_bytes`).
    reserved: u32,
    budget: Option<Arc<HeldBudget>>,
}

impl EventBytes {
    /// A copy whose growth past [`FREE_EVENT_BYTES`] is charged to `budget` (`None`: never
    /// charged, for benches and pure tests).
    pub fn new(budget: Option<Arc<HeldBudget>>) -> Self {
        Self {
            bytes: Vec::new(),
            reserved: 0,
            budget,
        }
    }

    pub fn as_slice(&self) -> &[u8] {
        &self.bytes
    }

    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// Appends `data` if the budget covers the capacity it needs past the free part (and
    /// counts `fault="event_unheld"` when it does not); `false` leaves the copy as it was.
    pub fn extend(&mut self, data: &[u8]) -> bool {
        let Some(needed) = self.bytes.len().checked_add(data.len()) else {
            return false;
        };
        if needed > self.bytes.capacity() && !self.grow(needed) {
            return false;
        }
        self.bytes.extend_from_slice(data);
        true
    }

    /// Makes room for `needed` bytes: doubled as `Vec` would, else exactly, whichever the
    /// budget covers.
    fn grow(&mut self, needed: usize) -> bool {
        let doubled = self.bytes.capacity().saturating_mul(2).max(needed);
        for capacity in [doubled, needed] {
            let charged = capacity.saturating_sub(FREE_EVENT_BYTES);
            let Ok(charged_u32) = u32::try_from(charged) else {
                continue;
            };
            let more = charged.saturating_sub(self.reserved as usize);
            let covered = more == 0
                || self
                    .budget
                    .as_ref()
                    .is_none_or(|budget| budget.reserve(more));
            if covered {
                self.bytes.reserve_exact(capacity - self.bytes.len());
                self.reserved = self.reserved.max(charged_u32);
                return true;
            }
        }
        if let Some(budget) = &self.budget {
            budget.faults.add(Fault::EventUnheld);
        }
        false
    }

    /// Empties the copy. Capacity past the free part is freed and its reservation handed back
    /// at once: an event that was large does not keep its room for the rest of the stream.
    pub fn clear(&mut self) {
        if self.bytes.capacity() > FREE_EVENT_BYTES {
            self.bytes = Vec::new();
            self.release();
        } else {
            self.bytes.clear();
        }
    }

    fn release(&mut self) {
        let reserved = std::mem::take(&mut self.reserved) as usize;
        if let (Some(budget), true) = (&self.budget, reserved > 0) {
            budget.release(reserved);
        }
    }

    /// The copy as `Bytes` for the client, leaving an empty copy on the same budget; the
    /// reservation is handed back when the last of them is dropped.
    pub fn take_bytes(&mut self) -> Bytes {
        let taken = std::mem::replace(self, Self::new(self.budget.clone()));
        if taken.bytes.is_empty() {
            return Bytes::new();
        }
        Bytes::from_owner(taken)
    }
}

impl AsRef<[u8]> for EventBytes {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

impl Drop for EventBytes {
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(limit: usize) -> Arc<HeldBudget> {
        HeldBudget::new(limit, Arc::new(FaultCounters::default()))
    }

    #[test]
    fn capacity_is_reserved_before_it_is_allocated_and_handed_back_at_the_end() {
        let budget = budget(1000);
        let mut a = HeldBuffer::new(Some(Arc::clone(&budget)));
        assert_eq!(a.push(&[1; 100], 10_000), Push::Held);
        assert_eq!(budget.held(), 100);
        assert_eq!(a.push(&[2; 50], 10_000), Push::Held);
        assert_eq!(budget.held(), 200, "doubled");
        assert!(a.bytes.capacity() >= 150);
        let mut b = HeldBuffer::new(Some(Arc::clone(&budget)));
        assert_eq!(b.push(&[3; 700], 10_000), Push::Held);
        assert_eq!(budget.held(), 900);
        // 150 + 300 needs 250 more than a's 200: doubling to 400 and the exact 450 both miss.
        assert_eq!(a.push(&[4; 300], 10_000), Push::OverBudget);
        assert_eq!(a.len(), 150, "left as it was");
        assert_eq!(budget.faults.get(Fault::AnswerUnheld), 1);
        a.release();
        assert_eq!(budget.held(), 700);
        let bytes = b.into_bytes();
        assert_eq!(bytes.len(), 700);
        assert_eq!(budget.held(), 700, "held while the client's copy lives");
        let clone = bytes.slice(10..20);
        drop(bytes);
        assert_eq!(budget.held(), 700);
        drop(clone);
        assert_eq!(budget.held(), 0);
        drop(a);
        assert_eq!(budget.held(), 0);
    }

    #[test]
    fn a_declared_length_is_reserved_as_its_bytes_arrive() {
        // A head that declares nearly the whole budget and sends nothing reserves one first
        // piece: the other answers are still held.
        let budget = budget(1 << 20);
        let liar = HeldBuffer::for_length(Some(Arc::clone(&budget)), 1_000_000, 8 << 20).unwrap();
        assert_eq!(budget.held(), FIRST_RESERVE);
        let mut honest =
            HeldBuffer::for_length(Some(Arc::clone(&budget)), 300_000, 8 << 20).unwrap();
        for _ in 0..3 {
            assert_eq!(honest.push(&[1; 100_000], 8 << 20), Push::Held);
        }
        assert_eq!(
            budget.held(),
            FIRST_RESERVE + 300_000,
            "grown by doubling, never past the declared length"
        );
        drop((liar, honest));
        assert_eq!(budget.held(), 0);
        assert_eq!(budget.faults.get(Fault::AnswerUnheld), 0);
    }

    #[test]
    fn a_known_length_is_reserved_whole_or_not_at_all() {
        let budget = budget(1000);
        let mut a = HeldBuffer::for_length(Some(Arc::clone(&budget)), 600, 10_000).unwrap();
        assert_eq!(budget.held(), 600);
        assert_eq!(a.push(&[1; 600], 10_000), Push::Held);
        assert_eq!(budget.held(), 600, "no growth past the reservation");
        assert_eq!(
            HeldBuffer::for_length(Some(Arc::clone(&budget)), 500, 10_000).unwrap_err(),
            Push::OverBudget
        );
        assert_eq!(budget.faults.get(Fault::AnswerUnheld), 1);
        assert_eq!(
            HeldBuffer::for_length(Some(Arc::clone(&budget)), 20_000, 10_000).unwrap_err(),
            Push::OverLimit
        );
        drop(a);
        assert_eq!(budget.held(), 0);
    }

    #[test]
    fn the_buffer_s_own_limit_comes_first() {
        let budget = budget(1 << 20);
        let mut a = HeldBuffer::new(Some(Arc::clone(&budget)));
        assert_eq!(a.push(&[1; 60], 100), Push::Held);
        assert_eq!(a.push(&[1; 60], 100), Push::OverLimit);
        assert_eq!(a.push(&[1; 40], 100), Push::Held);
        assert_eq!(budget.held(), 100, "never past the limit");
        assert_eq!(budget.faults.get(Fault::AnswerUnheld), 0);
        let mut unbounded = HeldBuffer::new(None);
        assert_eq!(unbounded.push(&[1; 5000], 1 << 20), Push::Held);
    }

    #[test]
    fn an_open_event_is_free_to_a_point_then_charged_and_freed_when_it_ends() {
        let budget = budget(64 * 1024);
        let mut a = EventBytes::new(Some(Arc::clone(&budget)));
        // An ordinary event: the free part, no reservation.
        assert!(a.extend(&[1; 4000]));
        assert_eq!(budget.held(), 0);
        a.clear();
        assert!(a.bytes.capacity() <= FREE_EVENT_BYTES, "small room is kept");
        // A large one: charged past the free part.
        assert!(a.extend(&[2; 40_000]));
        assert!(budget.held() >= 40_000 - FREE_EVENT_BYTES);
        assert!(a.bytes.capacity() <= FREE_EVENT_BYTES + budget.held());
        // A second stream's large event finds the budget short: not kept, counted.
        let mut b = EventBytes::new(Some(Arc::clone(&budget)));
        assert!(!b.extend(&[3; 70_000]));
        assert!(b.is_empty());
        assert_eq!(budget.faults.get(Fault::EventUnheld), 1);
        // The first event ends: its room and its reservation go at once.
        a.clear();
        assert_eq!(budget.held(), 0);
        assert_eq!(a.bytes.capacity(), 0);
        assert!(b.extend(&[3; 50_000]));
        // Handed to the client as `Bytes`: held until the last of them is dropped.
        let bytes = b.take_bytes();
        assert_eq!(bytes.len(), 50_000);
        assert!(budget.held() > 0);
        assert!(b.is_empty());
        drop(bytes);
        assert_eq!(budget.held(), 0);
        drop(a);
        drop(b);
        assert_eq!(budget.held(), 0);
    }
}
