//! The evidence rule: how much a production (or fleet) cell must rest on before its figures are
//! trusted. A cell below it keeps its figures but becomes [`CellStatus::LowEvidence`], so it is
//! drawn grey with its counts and never enters a ratio, a colour scale, a drift comparison or a
//! capacity answer (all of which take `Valid` cells only).
//!
//! One rule, configured once (`[evidence]`), applied where production documents are made and
//! read by drift. Pure: no I/O, no clock.
//!
//! Each figure rests on its own samples. The decode figures (total and per-request tok/s, TBT)
//! rest on output tokens and measured time: a steady window of long streams is good evidence
//! though none of them ended in it (the seed tool calls a 30 s window with 0 completed
//! requests valid). The TTFT rests on the requests that ended in the cell: below
//! `min_requests` it is shown with its n and never compared.
use super::doc::{CellStatus, DecodeCell, MatrixDoc};
use super::units::{format_count, format_seconds_tenths};

/// The minimum a production cell must rest on: measured time and output tokens for the cell
/// (its decode figures), completed requests for its TTFT.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EvidenceRule {
    /// Requests whose own cell it is that completed (`completed_requests`): what the cell's
    /// TTFT rests on.
    pub min_requests: u64,
    /// Wall-clock seconds the cell's conditions held (`measured_for_s`).
    pub min_measured_s: f64,
    /// Output tokens produced in the cell (`output_tokens`).
    pub min_output_tokens: u64,
}

impl Default for EvidenceRule {
    /// 20 completed requests, 10 s measured and 500 output tokens: a p99 needs far more, but a
    /// median and a tok/s figure are steady by then on sglang- and vLLM-like pacing.
    fn default() -> Self {
        EvidenceRule {
            min_requests: 20,
            min_measured_s: 10.0,
            min_output_tokens: 500,
        }
    }
}

impl EvidenceRule {
    /// A rule that every cell passes (for tests and tools that want raw figures).
    pub const NONE: EvidenceRule = EvidenceRule {
        min_requests: 0,
        min_measured_s: 0.0,
        min_output_tokens: 0,
    };

    /// What `cell`'s decode figures lack, as page text (`0.3 s of 10.0 s, 11 of 500 output
    /// tokens`), or `None` when they meet the rule. A missing figure counts as zero.
    pub fn shortfall(&self, cell: &DecodeCell) -> Option<String> {
        let seconds = cell.measured_for_s.filter(|s| s.is_finite()).unwrap_or(0.0);
        let tokens = cell.output_tokens.unwrap_or(0);
        let mut missing = Vec::new();
        if seconds < self.min_measured_s {
            missing.push(format!(
                "{} of {}",
                format_seconds_tenths(seconds),
                format_seconds_tenths(self.min_measured_s)
            ));
        }
        if tokens < self.min_output_tokens {
            missing.push(format!(
                "{} of {} output tokens",
                format_count(tokens),
                format_count(self.min_output_tokens)
            ));
        }
        (!missing.is_empty()).then(|| missing.join(", "))
    }

    /// Whether `cell`'s decode figures meet the rule.
    pub fn holds(&self, cell: &DecodeCell) -> bool {
        self.shortfall(cell).is_none()
    }

    /// Whether `cell`'s TTFT rests on enough requests (`min_requests` completed).
    pub fn ttft_holds(&self, cell: &DecodeCell) -> bool {
        cell.completed_requests.unwrap_or(0) >= self.min_requests
    }

    /// The cells whose decode figures hold but whose TTFT rests on fewer than `min_requests`
    /// requests, as `8K × 4 (n = 0)`, for a note.
    pub fn thin_ttft(&self, doc: &MatrixDoc) -> Vec<String> {
        doc.decode
            .iter()
            .filter(|cell| cell.status.is_valid() && !self.ttft_holds(cell))
            .map(|cell| {
                format!(
                    "{} × {} (n = {})",
                    super::units::context_label(cell.context_tokens),
                    cell.concurrency,
                    format_count(cell.completed_requests.unwrap_or(0))
                )
            })
            .collect()
    }

    /// Marks every `Valid` decode cell of `doc` below the rule `Low evidence` (figures kept).
    /// Returns how many it marked.
    pub fn apply(&self, doc: &mut MatrixDoc) -> usize {
        let mut marked = 0;
        for cell in &mut doc.decode {
            if cell.status == CellStatus::Valid && !self.holds(cell) {
                cell.status = CellStatus::LowEvidence;
                marked += 1;
            }
        }
        marked
    }

    /// The rule as one line for a legend or a note.
    pub fn describe(&self) -> String {
        format!(
            "decode figures: at least {} measured and {} output tokens; TTFT: at least {} completed requests",
            format_seconds_tenths(self.min_measured_s),
            format_count(self.min_output_tokens),
            format_count(self.min_requests)
        )
    }
}

/// A short evidence label for a caveated cell: `n=3 · 11 tok · 0.3 s`.
pub fn evidence_label(cell: &DecodeCell) -> String {
    format!(
        "n={} · {} tok · {}",
        format_count(cell.completed_requests.unwrap_or(0)),
        format_count(cell.output_tokens.unwrap_or(0)),
        format_seconds_tenths(cell.measured_for_s.filter(|s| s.is_finite()).unwrap_or(0.0))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(requests: u64, seconds: f64, tokens: u64) -> DecodeCell {
        let mut cell = DecodeCell::status_only(8192, 2, CellStatus::Valid);
        cell.total_tok_s = Some(367.8);
        cell.completed_requests = Some(requests);
        cell.measured_for_s = Some(seconds);
        cell.output_tokens = Some(tokens);
        cell
    }

    #[test]
    fn a_cell_below_any_minimum_is_low_evidence_and_keeps_its_figures() {
        let rule = EvidenceRule::default();
        assert!(rule.holds(&cell(20, 10.0, 500)));
        // The cell: 11 output tokens, 0.0 s measured, 0 completed.
        let thin = cell(0, 0.0, 11);
        assert_eq!(
            rule.shortfall(&thin).as_deref(),
            Some("0.0 s of 10.0 s, 11 of 500 output tokens")
        );
        // Four steady streams for 40 s, none ended in the window: the decode figures hold,
        // the TTFT rests on no request.
        let steady = cell(0, 40.0, 12_688);
        assert!(rule.holds(&steady));
        assert!(!rule.ttft_holds(&steady));
        let mut doc = MatrixDoc::new(Default::default());
        doc.decode = vec![thin, cell(50, 60.0, 9000), cell(19, 60.0, 400)];
        doc.decode
            .push(DecodeCell::status_only(16384, 1, CellStatus::error("boom")));
        assert_eq!(rule.apply(&mut doc), 2);
        let statuses: Vec<_> = doc.decode.iter().map(|c| c.status.clone()).collect();
        assert_eq!(
            statuses,
            [
                CellStatus::LowEvidence,
                CellStatus::Valid,
                CellStatus::LowEvidence,
                CellStatus::error("boom")
            ]
        );
        assert_eq!(doc.decode[0].total_tok_s, Some(367.8));
        assert!(EvidenceRule::NONE.holds(&DecodeCell::status_only(1, 1, CellStatus::Valid)));
    }

    #[test]
    fn the_label_names_the_counts() {
        assert_eq!(evidence_label(&cell(3, 0.34, 63)), "n=3 · 63 tok · 0.3 s");
    }
}
