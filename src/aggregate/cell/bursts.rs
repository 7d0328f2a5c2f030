//! Streams delivered in bursts over a cell's own requests ([`BurstSum`]): whether the cell's
//! gaps measure the engine's decoding or only how the stream was handed over.

use crate::matrix::doc::CellStatus;
use crate::meter::record::RequestRecord;

/// Share of a cell's streams delivered in bursts above which its decode figures are not
/// trusted (as [`super::ERROR_SHARE`] is for failures): one stream in twenty may have met a
/// stalled read, more say the upstream (vLLM handing a finished stream over at once, a
/// buffering gateway) delivers whole answers, and their gaps (microseconds) would read as
/// hundreds of thousands of tok/s per request.
pub const BURST_SHARE: f64 = 0.05;

/// Streams with at least two gaps between output events, and those of them delivered in
/// bursts ([`crate::meter::record::Tokens::delivered_in_bursts`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BurstSum {
    pub streams: u64,
    pub bursts: u64,
}

impl BurstSum {
    pub fn add(&mut self, record: &RequestRecord) {
        if record.streaming && record.tokens.events >= 3 {
            self.streams = self.streams.saturating_add(1);
            if record.tokens.delivered_in_bursts() {
                self.bursts = self.bursts.saturating_add(1);
            }
        }
    }

    pub fn merge(&mut self, other: &BurstSum) {
        self.streams = self.streams.saturating_add(other.streams);
        self.bursts = self.bursts.saturating_add(other.bursts);
    }

    /// `Delivered in bursts` when more than [`BURST_SHARE`] of the streams were; `None` when
    /// the cell's gaps are decode steps.
    pub fn status(&self) -> Option<CellStatus> {
        (self.bursts > 0 && self.bursts as f64 > BURST_SHARE * self.streams as f64).then(|| {
            CellStatus::bursts(&format!(
                "{} of {} streams delivered in bursts",
                self.bursts, self.streams
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(events: u64, coalesced: u64) -> RequestRecord {
        let mut record = RequestRecord::for_test();
        record.streaming = true;
        record.tokens.events = events;
        record.tokens.coalesced_events = coalesced;
        record
    }

    #[test]
    fn a_cell_of_streams_handed_over_at_once_is_delivered_in_bursts() {
        let mut sum = BurstSum::default();
        // 19 decoded streams and one stalled read: still decode figures.
        for _ in 0..19 {
            sum.add(&stream(100, 3));
        }
        sum.add(&stream(100, 99));
        // Too short to have gaps to judge, and not streamed: not counted.
        sum.add(&stream(2, 1));
        let mut unary = stream(100, 99);
        unary.streaming = false;
        sum.add(&unary);
        assert_eq!((sum.streams, sum.bursts), (20, 1));
        assert_eq!(sum.status(), None);
        let mut other = BurstSum::default();
        other.add(&stream(40, 39));
        sum.merge(&other);
        assert_eq!(
            sum.status(),
            Some(CellStatus::Bursts(
                "2 of 21 streams delivered in bursts".into()
            ))
        );
    }
}
