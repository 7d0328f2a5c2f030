//! Every decode cell and prefill row of one model ([`MatrixAccumulator`]): production records
//! split over the concurrency levels they lived through, and the matrix document made of them.

use std::collections::BTreeMap;

use crate::meter::buckets::Ladder;
use crate::meter::record::{Outcome, RequestRecord};

use super::decode::CellAccumulator;
use super::fragment::fragments;
use super::outcomes::OutcomeSum;
use super::prefill::PrefillAccumulator;

/// Every decode cell and prefill row of one model, keyed by ladder bucket indexes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MatrixAccumulator {
    /// (context bucket, concurrency bucket) → cell.
    pub cells: BTreeMap<(usize, usize), CellAccumulator>,
    /// context bucket → prefill row.
    pub prefill: BTreeMap<usize, PrefillAccumulator>,
    /// Records added.
    pub requests: u64,
    /// Completion tokens of every record added (the conservation check's right side).
    pub output_tokens: u64,
    /// Records without a prompt token count: no context, so no cell.
    pub unplaced_requests: u64,
    pub unplaced_tokens: u64,
    /// How every record added ended, placed in a cell or not, and when the failures came.
    pub outcomes: OutcomeSum,
}

impl MatrixAccumulator {
    /// Adds a production record: its tokens and decode time to the cells of the concurrency
    /// levels it lived through, its TTFT and outcome to its own cell, and maybe a prefill
    /// sample. Records that reported no prompt token count are counted but placed nowhere,
    /// but for shed ones, placed in the cell their prompt's size gave at admission.
    pub fn add_record(&mut self, record: &RequestRecord, concurrency: &Ladder) {
        self.requests += 1;
        self.output_tokens += record.tokens.completion;
        self.outcomes.add(record);
        if record.tokens.prompt.is_none() && record.outcome == Outcome::Shed {
            // Refused for load before any prefill, so never counted by the server: its cell is
            // the one its prompt's size gave at admission, where the shed load belongs.
            self.cells
                .entry((record.buckets.context, record.buckets.concurrency))
                .or_default()
                .add_request_end(record);
            return;
        }
        if record.tokens.prompt.is_none() {
            self.unplaced_requests += 1;
            self.unplaced_tokens += record.tokens.completion;
            return;
        }
        let context = record.buckets.context;
        for (bucket, fragment) in fragments(record, concurrency) {
            self.cells
                .entry((context, bucket))
                .or_default()
                .add_fragment(&fragment);
        }
        self.cells
            .entry((context, record.buckets.concurrency))
            .or_default()
            .add_request_end(record);
        let mut row = PrefillAccumulator::default();
        if row.add_record(record) {
            self.prefill.entry(context).or_default().merge(&row);
        }
    }

    pub fn merge(&mut self, other: &MatrixAccumulator) {
        for (key, cell) in &other.cells {
            self.cells.entry(*key).or_default().merge(cell);
        }
        for (key, row) in &other.prefill {
            self.prefill.entry(*key).or_default().merge(row);
        }
        self.requests += other.requests;
        self.output_tokens += other.output_tokens;
        self.unplaced_requests += other.unplaced_requests;
        self.unplaced_tokens += other.unplaced_tokens;
        self.outcomes.merge(&other.outcomes);
    }

    /// Sketch bins in use (memory accounting: each bin is 16 bytes).
    pub fn sketch_bins(&self) -> usize {
        self.cells
            .values()
            .map(|c| {
                c.ttft.bins()
                    + c.tbt.bins()
                    + c.itl.bins()
                    + c.first_tokens.bins()
                    + c.prompt_cache.bins()
            })
            .sum::<usize>()
            + self
                .prefill
                .values()
                .map(|p| {
                    p.known_cache.rate.bins()
                        + p.known_cache.ttft.bins()
                        + p.unknown_cache.rate.bins()
                        + p.unknown_cache.ttft.bins()
                })
                .sum::<usize>()
    }
}

impl MatrixAccumulator {
    /// The matrix document: every non-empty cell and qualifying prefill row, with notes on
    /// what could not be placed. `metadata` is taken as given (notes are appended).
    pub fn to_doc(
        &self,
        contexts: &Ladder,
        concurrency: &Ladder,
        metadata: crate::matrix::doc::Metadata,
    ) -> crate::matrix::doc::MatrixDoc {
        let mut doc = crate::matrix::doc::MatrixDoc::new(metadata);
        let mut beyond_ladders = 0u64;
        for (&(context, level), cell) in &self.cells {
            if cell.is_empty() {
                continue;
            }
            let (Some(context_tokens), Some(requests)) = (
                contexts.value(context),
                concurrency.value(level).and_then(|v| u32::try_from(v).ok()),
            ) else {
                beyond_ladders += cell.output_tokens;
                continue;
            };
            doc.decode.push(cell.to_cell(context_tokens, requests));
        }
        let mut assumed = Vec::new();
        for (&context, row) in &self.prefill {
            let Some(context_tokens) = contexts.value(context) else {
                continue;
            };
            if let Some((row, without_cache_counts)) = row.to_row(context_tokens) {
                if without_cache_counts {
                    assumed.push(contexts.label(context).to_owned());
                }
                doc.prefill.push(row);
            }
        }
        doc.sort();
        let notes = &mut doc.metadata.notes;
        if self.unplaced_requests > 0 {
            notes.push(format!(
                "{} requests ({} output tokens) reported no prompt token count and are in no cell.",
                self.unplaced_requests, self.unplaced_tokens
            ));
        }
        if beyond_ladders > 0 {
            notes.push(format!(
                "{beyond_ladders} output tokens were emitted beyond the ladders (context above {} or more than {} requests in flight) and are in no cell.",
                contexts.label(contexts.overflow().saturating_sub(1)),
                concurrency.label(concurrency.overflow().saturating_sub(1)),
            ));
        }
        if !assumed.is_empty() {
            notes.push(format!(
                "Prefill rows {} assume no prompt-cache hits: the server reported no cached-token counts for them.",
                assumed.join(", ")
            ));
        }
        doc
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::aggregate::cell::test_records::{close, ladders, record};
    use crate::matrix::doc::CellStatus;
    use crate::meter::record::Outcome;

    #[test]
    fn steady_streams_give_the_analytic_cell() {
        let (contexts, concurrency) = ladders();
        let mut matrix = MatrixAccumulator::default();
        let tbt = Duration::from_millis(20);
        let ttft = Duration::from_millis(150);
        // Four streams at 8K, 101 tokens each, all at the "4" level (bucket 2).
        for _ in 0..4 {
            let r = record(Some(8000), &[(2, 101)], ttft, tbt, 4.0, Outcome::Ok);
            matrix.add_record(&r, &concurrency);
        }
        let doc = matrix.to_doc(&contexts, &concurrency, Default::default());
        doc.validate().unwrap();
        assert_eq!(doc.decode.len(), 1);
        let cell = &doc.decode[0];
        assert_eq!((cell.context_tokens, cell.concurrency), (8192, 4));
        assert_eq!(cell.status, CellStatus::Valid);
        assert!(close(cell.total_tok_s.unwrap(), 200.0, 1e-9), "{cell:?}");
        assert!(
            close(cell.per_request_tok_s.unwrap(), 50.0, 0.01),
            "{cell:?}"
        );
        assert!(close(cell.tbt_ms.unwrap(), 20.0, 0.01), "{cell:?}");
        assert!(close(cell.ttft_ms.unwrap(), 150.0, 0.01), "{cell:?}");
        assert!(close(cell.average_active_requests.unwrap(), 4.0, 1e-9));
        assert!(close(cell.measured_for_s.unwrap(), 2.0, 1e-9), "{cell:?}");
        assert_eq!(cell.completed_requests, Some(4));
        assert_eq!(cell.output_tokens, Some(404));
        assert_eq!(cell.prompt_tokens, Some(8000));
        // No cached-token count: the prefill row rests on an assumption, and says so.
        assert_eq!(doc.prefill.len(), 1);
        assert!(doc.metadata.notes.iter().any(|n| n.contains("8K")));
    }

    #[test]
    fn a_request_spanning_levels_splits_its_tokens_and_time() {
        let (contexts, concurrency) = ladders();
        let mut matrix = MatrixAccumulator::default();
        let tbt = Duration::from_millis(10);
        // 51 tokens alone (bucket 0), then 100 tokens with a second request (bucket 1).
        let r = record(
            Some(20_000),
            &[(0, 51), (1, 100)],
            tbt,
            tbt,
            1.66,
            Outcome::Ok,
        );
        matrix.add_record(&r, &concurrency);
        let doc = matrix.to_doc(&contexts, &concurrency, Default::default());
        let alone = doc.cell(32768, 1).unwrap();
        let paired = doc.cell(32768, 2).unwrap();
        assert_eq!(
            alone.output_tokens.unwrap() + paired.output_tokens.unwrap(),
            151
        );
        assert!(close(
            alone.tbt_ms.unwrap(),
            10.0 * 50.0 / 51.0 * 151.0 / 150.0,
            0.011
        ));
        assert!(close(paired.tbt_ms.unwrap(), 10.0 * 151.0 / 150.0, 0.011));
        // The level's mean in-flight is clamped into the level's range.
        assert!(alone.average_active_requests.unwrap() <= 2f64.sqrt() + 1e-9);
        assert!(close(paired.average_active_requests.unwrap(), 1.66, 1e-9));
        // The request's own cell (its mean 1.66 is nearest 2) gets its end.
        assert_eq!(paired.completed_requests, Some(1));
        assert_eq!(alone.completed_requests, Some(0));
    }

    #[test]
    fn failures_beyond_the_share_mark_the_cell_error_and_unplaced_records_are_noted() {
        let (contexts, concurrency) = ladders();
        let mut matrix = MatrixAccumulator::default();
        let ms = Duration::from_millis;
        for i in 0..10 {
            let outcome = if i < 2 {
                Outcome::UpstreamAborted
            } else {
                Outcome::Ok
            };
            matrix.add_record(
                &record(Some(100), &[(0, 20)], ms(50), ms(10), 1.0, outcome),
                &concurrency,
            );
        }
        matrix.add_record(
            &record(None, &[(0, 7)], ms(50), ms(10), 1.0, Outcome::Ok),
            &concurrency,
        );
        let doc = matrix.to_doc(&contexts, &concurrency, Default::default());
        doc.validate().unwrap();
        let cell = doc.cell(8192, 1).unwrap();
        assert_eq!(
            cell.status,
            CellStatus::Error("2 of 10 requests failed (mostly upstream_aborted)".into())
        );
        assert_eq!(cell.output_tokens, Some(200));
        assert_eq!(matrix.output_tokens, 207);
        assert!(doc
            .metadata
            .notes
            .iter()
            .any(|n| n.contains("7 output tokens")));
        // Failed requests feed no prefill sample.
        assert_eq!(doc.prefill[0].completed_requests, Some(8));
    }
}
