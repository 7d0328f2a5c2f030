//! How a model's requests ended, every one of them ([`OutcomeSum`]): the count per outcome,
//! placed in a cell or not (a request the upstream never answered has no prompt count, so no
//! cell, and is counted here all the same), and when the failures came — the first, the last
//! with its status, and where the failures since the last success began. What the verdict's
//! availability clause (`admin::view`) reads; docs/metrics.md.

use std::time::SystemTime;

use crate::meter::record::{Outcome, RequestRecord};

/// One failed request, as the verdict names it: when it ended, how, and with which status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failure {
    /// When it ended (head in + duration).
    pub at: SystemTime,
    pub outcome: Outcome,
    /// The status the client got (the upstream's, or tokentap's own 502/503/504).
    pub status: u16,
    /// The upstream sent a response head (else the status is tokentap's own answer).
    pub upstream_answered: bool,
}

/// Every request's outcome, and when the failures came. Two sums merge exactly but for
/// [`OutcomeSum::failing_since`] when they interleave in time (see there).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct OutcomeSum {
    /// Requests by outcome (index of [`Outcome::ALL`]).
    pub counts: [u64; Outcome::ALL.len()],
    /// When the first failure ([`Outcome::is_failure`]) ended.
    pub first_failure: Option<SystemTime>,
    /// The latest failure.
    pub last_failure: Option<Failure>,
    /// When the latest `ok` request ended.
    pub last_ok: Option<SystemTime>,
    /// When the first failure after [`OutcomeSum::last_ok`] ended (after the first failure at
    /// all, when nothing succeeded): where the run of failures going on now began. Exact over
    /// sums that do not interleave in time (the window's minute slices do not); where two
    /// overlap (two traffic slices of one minute), the run is taken to begin no earlier than
    /// the latest success, at the first failure either sum knows after it.
    pub failing_since: Option<SystemTime>,
}

fn later(a: Option<SystemTime>, b: Option<SystemTime>) -> Option<SystemTime> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

fn earlier(a: Option<SystemTime>, b: Option<SystemTime>) -> Option<SystemTime> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

impl OutcomeSum {
    /// Adds one finished request.
    pub fn add(&mut self, record: &RequestRecord) {
        let at = record
            .timing
            .started_at
            .checked_add(record.timing.duration)
            .unwrap_or(record.timing.started_at);
        let mut one = OutcomeSum::default();
        if let Some(i) = Outcome::ALL.iter().position(|o| *o == record.outcome) {
            if let Some(count) = one.counts.get_mut(i) {
                *count = 1;
            }
        }
        if record.outcome == Outcome::Ok {
            one.last_ok = Some(at);
        } else if record.outcome.is_failure() {
            one.first_failure = Some(at);
            one.failing_since = Some(at);
            one.last_failure = Some(Failure {
                at,
                outcome: record.outcome,
                status: record.status,
                upstream_answered: record.timing.to_headers.is_some(),
            });
        }
        self.merge(&one);
    }

    pub fn merge(&mut self, other: &OutcomeSum) {
        for (mine, theirs) in self.counts.iter_mut().zip(other.counts) {
            *mine += theirs;
        }
        let last_ok = later(self.last_ok, other.last_ok);
        // Each side's first failure after the latest success of both.
        let after = |part: &OutcomeSum| -> Option<SystemTime> {
            let Some(ok) = last_ok else {
                return part.first_failure;
            };
            let last = part.last_failure.map(|f| f.at)?;
            if last <= ok {
                None
            } else if part.first_failure.is_some_and(|first| first > ok) {
                part.first_failure
            } else if part.last_ok == Some(ok) {
                part.failing_since
            } else {
                // Its run began after its own last success, somewhere before `ok`: the
                // failures after `ok` are known to exist, not when the first came.
                Some(
                    part.failing_since
                        .map_or(last, |since| since.max(ok).min(last)),
                )
            }
        };
        self.failing_since = earlier(after(self), after(other));
        self.last_ok = last_ok;
        self.first_failure = earlier(self.first_failure, other.first_failure);
        self.last_failure = match (self.last_failure, other.last_failure) {
            (Some(a), Some(b)) => Some(if b.at > a.at { b } else { a }),
            (a, b) => a.or(b),
        };
    }

    /// Requests that ended `outcome`.
    pub fn count(&self, outcome: Outcome) -> u64 {
        Outcome::ALL
            .iter()
            .position(|o| *o == outcome)
            .and_then(|i| self.counts.get(i))
            .copied()
            .unwrap_or(0)
    }

    /// Every request.
    pub fn requests(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// The requests availability is judged over: all but client aborts (people press stop).
    pub fn judged(&self) -> u64 {
        self.requests()
            .saturating_sub(self.count(Outcome::ClientAborted))
    }

    /// The server's failures ([`Outcome::FAILURES`]).
    pub fn failed(&self) -> u64 {
        Outcome::FAILURES.iter().map(|o| self.count(*o)).sum()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::aggregate::cell::test_records::record;

    fn ended(outcome: Outcome, second: u64, status: u16) -> RequestRecord {
        let mut r = record(
            Some(100),
            &[(0, 2)],
            Duration::ZERO,
            Duration::ZERO,
            1.0,
            outcome,
        );
        r.timing.started_at = SystemTime::UNIX_EPOCH + Duration::from_secs(second);
        r.timing.duration = Duration::ZERO;
        r.status = status;
        r
    }

    fn at(second: u64) -> Option<SystemTime> {
        Some(SystemTime::UNIX_EPOCH + Duration::from_secs(second))
    }

    #[test]
    fn the_run_of_failures_begins_after_the_last_success() {
        let mut sum = OutcomeSum::default();
        sum.add(&ended(Outcome::UpstreamError, 5, 502));
        sum.add(&ended(Outcome::Ok, 10, 200));
        sum.add(&ended(Outcome::ClientAborted, 11, 200));
        sum.add(&ended(Outcome::UpstreamError, 12, 502));
        sum.add(&ended(Outcome::Timeout, 14, 504));
        assert_eq!((sum.requests(), sum.judged(), sum.failed()), (5, 4, 3));
        assert_eq!(sum.first_failure, at(5));
        assert_eq!(sum.last_ok, at(10));
        assert_eq!(sum.failing_since, at(12));
        let last = sum.last_failure.unwrap();
        assert_eq!((last.outcome, last.status), (Outcome::Timeout, 504));
        // A success ends the run.
        sum.add(&ended(Outcome::Ok, 15, 200));
        assert_eq!(sum.failing_since, None);
    }

    #[test]
    fn slices_merge_in_any_order_to_the_same_run() {
        let mut older = OutcomeSum::default();
        older.add(&ended(Outcome::Ok, 10, 200));
        older.add(&ended(Outcome::UpstreamError, 50, 502));
        let mut newer = OutcomeSum::default();
        newer.add(&ended(Outcome::UpstreamError, 70, 502));
        newer.add(&ended(Outcome::Shed, 80, 503));
        for (a, b) in [(older, newer), (newer, older)] {
            let mut merged = a;
            merged.merge(&b);
            assert_eq!(merged.failing_since, at(50));
            assert_eq!(merged.first_failure, at(50));
            assert_eq!(merged.last_failure.unwrap().at, at(80).unwrap());
            assert_eq!(merged.failed(), 3);
        }
        // A success in the newer slice ends the run the older one began.
        let mut recovered = OutcomeSum::default();
        recovered.add(&ended(Outcome::Ok, 90, 200));
        let mut merged = recovered;
        merged.merge(&older);
        merged.merge(&newer);
        assert_eq!(merged.failing_since, None);
    }
}
