//! SLO attainment and goodput over a cell's requests ([`SloSum`]).

use crate::meter::record::SloVerdict;

/// SLO attainment and goodput summed over requests (docs/metrics.md); the production
/// aggregator and the sweep's cells both use it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SloSum {
    /// Requests that met every target set for them.
    pub met: u64,
    /// Requests that missed a target (or failed).
    pub missed: u64,
    /// Tokens of the requests that met their targets, counted like the cell's total tok/s
    /// counts its tokens (so goodput ÷ total tok/s is their share of the output).
    pub met_tokens: f64,
}

impl SloSum {
    /// Counts a request's verdict (requests without targets are not counted).
    pub fn add_verdict(&mut self, verdict: SloVerdict) {
        match verdict {
            SloVerdict::Met => self.met += 1,
            SloVerdict::Missed => self.missed += 1,
            SloVerdict::Unset => {}
        }
    }

    pub fn merge(&mut self, other: &SloSum) {
        self.met += other.met;
        self.missed += other.missed;
        self.met_tokens += other.met_tokens;
    }

    /// Share (0–1) of requests with targets that met all of them; `None` when none had any.
    pub fn attainment(&self) -> Option<f64> {
        let judged = self.met + self.missed;
        (judged > 0).then(|| self.met as f64 / judged as f64)
    }

    /// Goodput: `total_tok_s` scaled to the met requests' share of `tokens` (the tokens
    /// `total_tok_s` was computed from); `None` when no request had targets.
    pub fn goodput(&self, total_tok_s: Option<f64>, tokens: f64) -> Option<f64> {
        self.attainment()?;
        let total = total_tok_s?;
        if tokens > 0.0 {
            Some(total * (self.met_tokens / tokens).clamp(0.0, 1.0))
        } else {
            Some(0.0)
        }
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
    fn attainment_counts_judged_requests_and_goodput_the_met_share() {
        let mut sum = SloSum::default();
        sum.add_verdict(SloVerdict::Unset);
        assert_eq!(sum.attainment(), None);
        assert_eq!(
            sum.goodput(Some(100.0), 10.0),
            None,
            "no targets, no goodput"
        );
        sum.add_verdict(SloVerdict::Met);
        sum.add_verdict(SloVerdict::Missed);
        sum.add_verdict(SloVerdict::Missed);
        sum.met_tokens = 30.0;
        assert_eq!(sum.attainment(), Some(1.0 / 3.0));
        assert_eq!(sum.goodput(Some(200.0), 120.0), Some(50.0));
        assert_eq!(sum.goodput(None, 120.0), None);
        assert_eq!(sum.goodput(Some(200.0), 0.0), Some(0.0));
        // More met tokens than tokens (rounding) is all of it, no more.
        assert_eq!(sum.goodput(Some(200.0), 20.0), Some(200.0));
        let mut other = SloSum::default();
        other.add_verdict(SloVerdict::Met);
        sum.merge(&other);
        assert_eq!(sum.attainment(), Some(0.5));
    }

    #[test]
    fn slo_attainment_counts_own_cell_requests_and_goodput_their_tokens() {
        use crate::meter::record::SloVerdict;
        let (contexts, concurrency) = ladders();
        let tbt = Duration::from_millis(10);
        let single = |verdict: SloVerdict, tokens: u64| {
            let mut r = record(Some(8000), &[(0, tokens)], tbt, tbt, 1.0, Outcome::Ok);
            r.slo.verdict = verdict;
            r
        };
        // No targets anywhere: no figure, so the columns stay absent.
        let mut matrix = MatrixAccumulator::default();
        matrix.add_record(&single(SloVerdict::Unset, 101), &concurrency);
        let doc = matrix.to_doc(&contexts, &concurrency, Default::default());
        let cell = doc.cell(8192, 1).unwrap();
        assert_eq!((cell.slo_attainment, cell.goodput_tok_s), (None, None));
        // One met (101 tokens), three missed (101 each): attainment 1/4, goodput 1/4 of total.
        matrix.add_record(&single(SloVerdict::Met, 101), &concurrency);
        for _ in 0..3 {
            matrix.add_record(&single(SloVerdict::Missed, 101), &concurrency);
        }
        let doc = matrix.to_doc(&contexts, &concurrency, Default::default());
        doc.validate().unwrap();
        let cell = doc.cell(8192, 1).unwrap();
        assert_eq!(cell.slo_attainment, Some(0.25));
        let (goodput, total) = (cell.goodput_tok_s.unwrap(), cell.total_tok_s.unwrap());
        assert!(close(goodput, total / 5.0, 1e-9), "{cell:?}");
        // All met: goodput is the total; none met: zero.
        for (verdict, share) in [(SloVerdict::Met, 1.0), (SloVerdict::Missed, 0.0)] {
            let mut whole = CellAccumulator::default();
            for _ in 0..3 {
                whole.add_whole_request(&single(verdict, 101));
            }
            let cell = whole.to_cell(8192, 1);
            assert_eq!(cell.slo_attainment, Some(share));
            let total = cell.total_tok_s.unwrap();
            assert!(close(cell.goodput_tok_s.unwrap(), total * share, 1e-9));
        }
    }
}
