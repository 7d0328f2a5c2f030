//! Prefill interference over a cell's requests ([`InterferenceSum`]): the share of decode time
//! spent while another request was in prefill, and the prefills that overlapped.

use crate::meter::record::RequestRecord;

/// Prefill interference summed over requests (docs/metrics.md): the production aggregator
/// and the sweep's cells both use it, so the column means the same in either matrix.
///
/// The share is weighted by decode time, not tokens: a stalled request emits fewer tokens per
/// second, so token weights would under-count exactly the time the stalls cost, and
/// (1 − share) would no longer predict the cell's decode speed.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct InterferenceSum {
    /// Σ decode seconds (request-seconds) of requests that carry the figure.
    pub decode_seconds: f64,
    /// Σ of those seconds during which another request was in prefill.
    pub busy_seconds: f64,
    /// Requests with a figure, and Σ their overlapping prefills.
    pub requests: u64,
    pub overlapping_prefills: u64,
}

impl InterferenceSum {
    /// Adds a whole record (a sweep's cell holds whole requests); records without a decode
    /// interval carry no figure.
    pub fn add(&mut self, record: &RequestRecord) {
        if let (Some(share), Some(decode)) = (
            record.interference.prefill_overlap_share,
            record.timing.decode,
        ) {
            let decode = decode.as_secs_f64();
            self.add_decode(decode, share * decode);
        }
        self.add_count(record);
    }

    /// Adds `decode_seconds` of decode, `busy_seconds` of them under another prefill.
    pub fn add_decode(&mut self, decode_seconds: f64, busy_seconds: f64) {
        if decode_seconds > 0.0 && busy_seconds.is_finite() {
            self.decode_seconds += decode_seconds;
            self.busy_seconds += busy_seconds.clamp(0.0, decode_seconds);
        }
    }

    /// Counts a record's overlapping prefills.
    pub fn add_count(&mut self, record: &RequestRecord) {
        if let Some(overlapping) = record.interference.overlapping_prefills {
            self.requests += 1;
            self.overlapping_prefills += u64::from(overlapping);
        }
    }

    pub fn merge(&mut self, other: &InterferenceSum) {
        self.decode_seconds += other.decode_seconds;
        self.busy_seconds += other.busy_seconds;
        self.requests += other.requests;
        self.overlapping_prefills += other.overlapping_prefills;
    }

    /// Share (0–1) of the decode time during which another request was in prefill.
    pub fn share(&self) -> Option<f64> {
        (self.decode_seconds > 0.0)
            .then(|| (self.busy_seconds / self.decode_seconds).clamp(0.0, 1.0))
    }

    /// Mean number of other requests' prefills overlapping a request's decode.
    pub fn mean_overlapping_prefills(&self) -> Option<f64> {
        (self.requests > 0).then(|| self.overlapping_prefills as f64 / self.requests as f64)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::aggregate::cell::test_records::{close, ladders, record};
    use crate::aggregate::cell::{CellAccumulator, MatrixAccumulator};
    use crate::meter::record::Outcome;

    #[test]
    fn the_share_is_over_decode_time_and_busy_time_never_exceeds_it() {
        let mut sum = InterferenceSum::default();
        assert_eq!(sum.share(), None);
        sum.add_decode(1.0, 0.25);
        sum.add_decode(1.0, 5.0);
        // No decode time, or a busy time that is not a number: nothing added.
        sum.add_decode(0.0, 0.5);
        sum.add_decode(1.0, f64::NAN);
        assert_eq!(sum.share(), Some(1.25 / 2.0));
        assert_eq!(sum.mean_overlapping_prefills(), None);
    }

    #[test]
    fn a_whole_record_brings_its_share_of_its_decode_and_its_prefills() {
        let mut r = RequestRecord::for_test();
        r.timing.decode = Some(Duration::from_secs(2));
        r.interference.prefill_overlap_share = Some(0.5);
        r.interference.overlapping_prefills = Some(4);
        let mut sum = InterferenceSum::default();
        sum.add(&r);
        let mut without = RequestRecord::for_test();
        without.interference.overlapping_prefills = Some(0);
        let mut other = InterferenceSum::default();
        other.add(&without);
        sum.merge(&other);
        assert_eq!((sum.decode_seconds, sum.busy_seconds), (2.0, 1.0));
        assert_eq!(sum.share(), Some(0.5));
        assert_eq!(sum.mean_overlapping_prefills(), Some(2.0));
    }

    #[test]
    fn prefill_overlap_follows_the_decode_time_it_stalled() {
        let (contexts, concurrency) = ladders();
        let mut matrix = MatrixAccumulator::default();
        let tbt = Duration::from_millis(10);
        // 51 tokens alone (bucket 0, 0.5 s, none of it under another prefill), then 100 tokens
        // at level 2 (bucket 1, 1 s, 0.4 s of it under another request's prefill).
        let mut r = record(
            Some(8000),
            &[(0, 51), (1, 100)],
            Duration::ZERO,
            tbt,
            1.5,
            Outcome::Ok,
        );
        r.interference.prefill_busy[1] = 0.4;
        r.interference.prefill_overlap_share = Some(0.4 / 1.5);
        r.interference.overlapping_prefills = Some(3);
        matrix.add_record(&r, &concurrency);
        // A request without the figure (one token event) changes no share.
        let mut single = record(Some(8000), &[(1, 1)], Duration::ZERO, tbt, 2.0, Outcome::Ok);
        single.interference.prefill_overlap_share = None;
        matrix.add_record(&single, &concurrency);
        let doc = matrix.to_doc(&contexts, &concurrency, Default::default());
        doc.validate().unwrap();
        let alone = doc.cell(8192, 1).unwrap();
        let paired = doc.cell(8192, 2).unwrap();
        assert_eq!(alone.prefill_overlap_share, Some(0.0));
        assert!(
            close(paired.prefill_overlap_share.unwrap(), 0.4, 1e-9),
            "{paired:?}"
        );
        // The overlapping prefills belong to the request's own cell (level 2: 1.5 rounds up).
        assert_eq!(paired.overlapping_prefills, Some(3.0));
        assert_eq!(alone.overlapping_prefills, None);
        // The sweep's way (whole requests): the share over the whole decode.
        let mut whole = CellAccumulator::default();
        whole.add_whole_request(&r);
        let cell = whole.to_cell(8192, 2);
        assert!(
            close(cell.prefill_overlap_share.unwrap(), 0.4 / 1.5, 1e-9),
            "{cell:?}"
        );
    }
}
